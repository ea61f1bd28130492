"""Value types of the RocketMQ client: send and pull results, topic routes and broker sets.

Also the parsers of the NameServer's route and cluster JSON, and the response code -> status maps
of sends and pulls. Used by `RocketMQClient` and its parts (client.py); the public names are
re-exported by `bridge.storage.rocketmq.remoting`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final

from bridge.storage.rocketmq.connection import BrokerUnavailable
from bridge.storage.rocketmq.messages import StoredMessage
from bridge.storage.rocketmq.wire import RemotingProtocolError, ResponseCode, loads_fastjson

__all__ = [
    "DEFAULT_TOPIC",
    "MASTER_ID",
    "PERM_READ",
    "PERM_WRITE",
    "PULL_STATUS_BY_CODE",
    "SEND_STATUS_BY_CODE",
    "BrokerInfo",
    "PullResult",
    "PullStatus",
    "QueueInfo",
    "SendResult",
    "SendStatus",
    "TopicRoute",
    "parse_brokers",
    "parse_route",
]

DEFAULT_TOPIC: Final = "TBW102"
"""The template topic brokers auto-create new topics from (autoCreateTopicEnable)."""
PERM_WRITE: Final = 0x2
PERM_READ: Final = 0x4
MASTER_ID: Final = "0"


class SendStatus(Enum):
    """Outcome of a send. Only SEND_OK means durable when the broker uses SYNC_FLUSH."""

    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


SEND_STATUS_BY_CODE: Final[dict[int, SendStatus]] = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}
"""Response code of a send -> its status; any other code is an error."""


@dataclass(slots=True, frozen=True)
class SendResult:
    """What the broker reports for a stored message."""

    status: SendStatus
    msg_id: str
    """The client-assigned unique id (UNIQ_KEY property)."""
    queue_id: int
    queue_offset: int
    """Offset in the topic's queue (not in any LMQ the message was dispatched to)."""
    offset_msg_id: str = ""
    """Broker id of the message: store host + commit-log offset (hex)."""
    broker_name: str = ""
    topic: str = ""


class PullStatus(Enum):
    """Outcome of a pull."""

    FOUND = "found"
    NO_NEW_MSG = "no_new_msg"
    NO_MATCHED_MSG = "no_matched_msg"
    """Messages were there but none matched the subscription; continue at `next_offset`."""
    OFFSET_ILLEGAL = "offset_illegal"


PULL_STATUS_BY_CODE: Final[dict[int, PullStatus]] = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}
"""Response code of a pull -> its status; any other code is an error."""


@dataclass(slots=True)
class PullResult:
    """What a pull returns."""

    status: PullStatus
    next_offset: int
    min_offset: int
    max_offset: int
    messages: list[StoredMessage] = field(default_factory=list)
    suggest_which_broker_id: int = 0


@dataclass(slots=True, frozen=True)
class QueueInfo:
    """A topic's queues on one broker (`QueueData`)."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0


@dataclass(slots=True, frozen=True)
class BrokerInfo:
    """One broker set (`BrokerData`): its name and brokerId -> address (0 is the master)."""

    broker_name: str
    cluster: str
    addrs: dict[str, str]

    @property
    def master_addr(self) -> str | None:
        """Address of the master (brokerId 0), if it is registered."""
        return self.addrs.get(MASTER_ID)

    @property
    def read_addr(self) -> str | None:
        """Where the set is read: its master, else its slave with the lowest id (a SYNC_MASTER's
        slave holds every message the master acknowledged), else None."""
        master = self.addrs.get(MASTER_ID)
        if master or not self.addrs:
            return master
        return self.addrs[min(self.addrs, key=lambda i: int(i) if i.isdigit() else 1 << 30)]


@dataclass(slots=True)
class TopicRoute:
    """A topic's route from the NameServer (`TopicRouteData`)."""

    topic: str
    queues: list[QueueInfo]
    brokers: dict[str, BrokerInfo]
    fetched_at: float = 0.0

    def write_queues(self) -> list[tuple[str, int]]:
        """(broker name, queue id) of every writable queue whose broker has a master."""
        out: list[tuple[str, int]] = []
        for queue in sorted(self.queues, key=lambda q: q.broker_name):
            broker = self.brokers.get(queue.broker_name)
            if queue.perm & PERM_WRITE and broker is not None and broker.master_addr:
                out.extend((queue.broker_name, i) for i in range(queue.write_queue_nums))
        return out

    def read_queues(self) -> list[tuple[str, int]]:
        """(broker name, queue id) of every readable queue whose broker is known, sorted."""
        return sorted(
            (queue.broker_name, i)
            for queue in self.queues
            if queue.perm & PERM_READ and queue.broker_name in self.brokers
            for i in range(queue.read_queue_nums)
        )

    def master_addr(self, broker_name: str | None = None) -> str:
        """The master address of `broker_name` (or of the first broker holding readable queues)."""
        names = [broker_name] if broker_name else [q.broker_name for q in self.queues]
        for name in names:
            broker = self.brokers.get(name)
            if broker is not None and broker.master_addr:
                return broker.master_addr
        raise BrokerUnavailable(
            f"no master broker for topic {self.topic!r}"
            + (f" on {broker_name!r}" if broker_name else ""),
            maybe_delivered=False,
        )


def parse_brokers(raw: Any) -> dict[str, BrokerInfo]:
    """Broker name -> `BrokerInfo` from a JSON list of `BrokerData` objects."""
    out: dict[str, BrokerInfo] = {}
    for item in raw or []:
        name = str(item["brokerName"])
        addrs = {str(k): str(v) for k, v in (item.get("brokerAddrs") or {}).items()}
        out[name] = BrokerInfo(name, str(item.get("cluster", "")), addrs)
    return out


def parse_route(topic: str, body: bytes) -> TopicRoute:
    """The topic's route from a GET_ROUTEINFO_BY_TOPIC response body (`TopicRouteData`).

    Raises RemotingProtocolError when the body is not a route.
    """
    try:
        data = loads_fastjson(body)
        queues = [
            QueueInfo(
                broker_name=str(q["brokerName"]),
                read_queue_nums=int(q["readQueueNums"]),
                write_queue_nums=int(q["writeQueueNums"]),
                perm=int(q["perm"]),
                topic_sys_flag=int(q.get("topicSysFlag", 0)),
            )
            for q in data.get("queueDatas") or []
        ]
        brokers = parse_brokers(data.get("brokerDatas"))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RemotingProtocolError(f"malformed route of topic {topic!r}: {exc!r}") from None
    return TopicRoute(topic, queues, brokers, time.monotonic())
