"""`Admin`: what the client asks about or changes in the cluster beyond one queue.

The topic list (all topics, and the application's own), topic creation on the masters, and
messages looked up by key in the brokers' index (QUERY_MESSAGE).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from bridge.storage.rocketmq.connection import BrokerUnavailable, RemotingError, require_success
from bridge.storage.rocketmq.messages import StoredMessage, decode_messages
from bridge.storage.rocketmq.pool import ConnectionPool
from bridge.storage.rocketmq.routing import NameServerRouting
from bridge.storage.rocketmq.types import DEFAULT_TOPIC, PERM_READ, PERM_WRITE
from bridge.storage.rocketmq.wire import (
    RemotingProtocolError,
    RequestCode,
    ResponseCode,
    loads_fastjson,
)

__all__ = ["SYSTEM_TOPICS", "SYSTEM_TOPIC_PREFIXES", "Admin"]

UNIQUE_KEY_QUERY_FLAG = "_UNIQUE_KEY_QUERY"
"""`MixAll.UNIQUE_MSG_QUERY_FLAG`: extFields flag of QUERY_MESSAGE; "true" looks up a UNIQ_KEY
(and makes the broker ignore maxNum), "false" a KEYS entry."""

QUERY_END_SLACK_MS = 24 * 3600 * 1000
"""Default end of a key query's time range: now plus one day (clock skew between hosts)."""

SYSTEM_TOPIC_PREFIXES = ("%RETRY%", "%DLQ%", "%LMQ%", "rmq_sys_", "RMQ_SYS_", "CID_RMQ_SYS_")
SYSTEM_TOPICS = frozenset(
    {
        "TBW102",
        "SCHEDULE_TOPIC_XXXX",
        "BenchmarkTest",
        "OFFSET_MOVED_EVENT",
        "SELF_TEST_TOPIC",
        "TRANS_CHECK_MAX_TIME_TOPIC",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRACE_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
    }
)
"""Topics that hold no application messages: the broker's own, retry and dead-letter topics of
consumer groups, and light message queues (`data_topics` leaves them out)."""


class Admin:
    """Topic administration and key queries of one client (no state of its own)."""

    def __init__(self, pool: ConnectionPool, routing: NameServerRouting) -> None:
        self._pool = pool
        self._routing = routing

    async def topic_list(self) -> list[str]:
        """Every topic the NameServer knows (GET_ALL_TOPIC_LIST_FROM_NAMESERVER), sorted.

        System topics (TBW102, retry topics, the cluster and broker names...) are included.
        Raises RemotingError when the NameServer refuses (SYSTEM_ERROR "disable" when its
        enableAllTopicList is off).
        """
        response = await self._routing.namesrv_call(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        if not response.body:
            return []
        try:
            topics = loads_fastjson(response.body).get("topicList") or []
            return sorted(str(topic) for topic in topics)
        except (AttributeError, TypeError) as exc:
            raise RemotingProtocolError(f"malformed topic list: {exc!r}") from None

    async def data_topics(self) -> list[str]:
        """The topics holding application messages: `topic_list` without system topics, retry,
        dead-letter and light-message-queue topics, and the cluster's and brokers' own names."""
        brokers = await self._routing.fetch_cluster_brokers()
        names = set(brokers) | {b.cluster for b in brokers.values()}
        return [
            topic
            for topic in await self.topic_list()
            if topic not in names
            and topic not in SYSTEM_TOPICS
            and not topic.startswith(SYSTEM_TOPIC_PREFIXES)
        ]

    async def create_topic(
        self,
        topic: str,
        *,
        read_queue_nums: int = 4,
        write_queue_nums: int = 4,
        perm: int = PERM_READ | PERM_WRITE,
        broker_names: Sequence[str] | None = None,
    ) -> None:
        """Create or update a topic on every master (or the named ones): UPDATE_AND_CREATE_TOPIC.

        The broker registers it with the NameServer; the cached route is dropped.
        """
        brokers = await self._routing.fetch_cluster_brokers()
        names = list(broker_names) if broker_names else sorted(brokers)
        fields = {
            "topic": topic,
            "defaultTopic": DEFAULT_TOPIC,
            "readQueueNums": str(read_queue_nums),
            "writeQueueNums": str(write_queue_nums),
            "perm": str(perm),
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": "0",
            "order": "false",
        }
        for name in names:
            info = brokers.get(name)
            if info is None or not info.master_addr:
                raise BrokerUnavailable(f"no master for broker {name!r}", maybe_delivered=False)
            response = await self._pool.call(
                info.master_addr, RequestCode.UPDATE_AND_CREATE_TOPIC, fields
            )
            require_success(response, RequestCode.UPDATE_AND_CREATE_TOPIC)
        self._routing.invalidate_route(topic)

    async def query_messages_by_key(
        self,
        topic: str,
        key: str,
        *,
        max_num: int = 32,
        begin_ms: int = 0,
        end_ms: int | None = None,
    ) -> list[StoredMessage]:
        """Messages of `topic` whose KEYS contain `key`, stored between `begin_ms` and `end_ms`.

        Asks every broker group serving the topic (QUERY_MESSAGE; its master, else its slave)
        for up to `max_num` messages each (a broker caps it at its maxMsgsNumBatch, 64 by
        default); a broker without a match answers
        QUERY_NOT_FOUND. The broker's index is a hash of "topic#key" and keeps store times in
        whole seconds (relative to the index file's start), so what it returns is re-checked
        here: only messages of `topic` with `key` among their KEYS and a store timestamp within
        [`begin_ms`, `end_ms`] are kept, ordered by store time. `end_ms` defaults to now plus one
        day.

        The broker indexes keys asynchronously, a few milliseconds after it acknowledged the send
        (SEND_OK), so a query right after a send may not find the message yet. Raises
        RemotingError(TOPIC_NOT_EXIST) for an unknown topic, RemotingError for a refusal,
        BrokerUnavailable, RemotingTimeout.
        """
        if not key:
            raise ValueError("query_messages_by_key needs a non-empty key")
        if max_num < 1:
            raise ValueError(f"max_num must be at least 1, not {max_num}")
        if end_ms is None:
            end_ms = int(time.time() * 1000) + QUERY_END_SLACK_MS
        fields = {
            "topic": topic,
            "key": key,
            "maxNum": str(max_num),
            # The index rounds store times down to the second: widen, then filter exactly.
            "beginTimestamp": str(max(0, begin_ms - 1000)),
            "endTimestamp": str(end_ms),
            UNIQUE_KEY_QUERY_FLAG: "false",
        }
        # A fresh route: the topic may have been created on another broker group since. Each
        # group is asked on its master, or on its slave while the master is gone; a group of
        # the topic with neither cannot say, so neither can this.
        route = await self._routing.fetch_route(topic)
        addrs = []
        for name in sorted({q.broker_name for q in route.queues}):
            info = route.brokers.get(name)
            addr = info.read_addr if info is not None else None
            if addr is None:
                raise BrokerUnavailable(
                    f"no broker of group {name!r} of topic {topic!r} answers", maybe_delivered=False
                )
            addrs.append(addr)
        if not addrs:
            raise BrokerUnavailable(f"no master broker for topic {topic!r}", maybe_delivered=False)

        async def query(addr: str) -> list[StoredMessage]:
            try:
                response = await self._pool.call(addr, RequestCode.QUERY_MESSAGE, fields)
            except BrokerUnavailable:
                self._routing.invalidate_route(topic)
                raise
            if response.code == ResponseCode.QUERY_NOT_FOUND:
                return []
            if response.code != ResponseCode.SUCCESS:
                raise RemotingError(
                    response.code, response.remark, addr=addr, request=RequestCode.QUERY_MESSAGE
                )
            return decode_messages(response.body)

        found = await asyncio.gather(*(query(addr) for addr in addrs))
        messages = [
            m
            for batch in found
            for m in batch
            if m.topic == topic and key in m.keys and begin_ms <= m.store_timestamp <= end_ms
        ]
        messages.sort(key=lambda m: (m.store_timestamp, m.store_host, m.commit_log_offset))
        return messages
