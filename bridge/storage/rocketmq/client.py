"""`RocketMQClient`: the producer and pull-consumer side of the RocketMQ remoting client.

It adds topic routes from the NameServer (cached, refreshed in the background and after errors),
one `RemotingConnection` per broker (reopened on demand with bounded backoff), and the
producer/consumer operations the gateway needs: send, pull (with long polling), consumer
offsets, queue min/max offsets, queries by message key, the topic list, topic creation and
consumer-group membership (heartbeats with consumer data, member lists, unregistration).

Connections and errors are in bridge/storage/rocketmq_connection.py, the NameServer lookups (the
`NameServerRouting` mixin) in rocketmq_routing.py, results and routes in rocketmq_types.py;
`bridge.storage.rocketmq.remoting` re-exports the public names.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import random
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType

from bridge.storage.rocketmq.connection import (
    BrokerUnavailable,
    RemotingConnection,
    RemotingError,
    RocketMQError,
)
from bridge.storage.rocketmq.messages import (
    KEY_SEPARATOR,
    LMQ_PREFIX,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    PROPERTY_WAIT_STORE_MSG_OK,
    StoredMessage,
    decode_messages,
    send_message_v2_fields,
)
from bridge.storage.rocketmq.routing import NameServerRouting
from bridge.storage.rocketmq.types import (
    DEFAULT_TOPIC,
    PERM_READ,
    PERM_WRITE,
    PULL_STATUS_BY_CODE,
    SEND_STATUS_BY_CODE,
    BrokerInfo,
    PullResult,
    PullStatus,
    SendResult,
    TopicRoute,
)
from bridge.storage.rocketmq.wire import (
    DEFAULT_MAX_FRAME_SIZE,
    PullSysFlag,
    RemotingCommand,
    RemotingProtocolError,
    RequestCode,
    ResponseCode,
    loads_fastjson,
)

__all__ = ["RocketMQClient"]

# Named after the module this code was split from, so logging configuration keeps applying.
log = logging.getLogger("bridge.storage.rocketmq_remoting")

LONG_POLL_CHECK_SLACK = 6.0
"""Seconds a held pull may outlive its suspend time before the broker answers it."""

UNIQUE_KEY_QUERY_FLAG = "_UNIQUE_KEY_QUERY"
"""`MixAll.UNIQUE_MSG_QUERY_FLAG`: extFields flag of QUERY_MESSAGE; "true" looks up a UNIQ_KEY
(and makes the broker ignore maxNum), "false" a KEYS entry."""

QUERY_END_SLACK_MS = 24 * 3600 * 1000
"""Default end of a key query's time range: now plus one day (clock skew between hosts)."""

NO_CONSUMER_REMARK = "no consumer for this group"
"""Start of the SYSTEM_ERROR remark of GET_CONSUMER_LIST_BY_GROUP for a group without members
(`ConsumerManageProcessor.getConsumerListByGroup`)."""


def _parse_tags(subscription: str) -> frozenset[str] | None:
    """Tags of a TAG expression ("a || b"), or None for "*" (everything)."""
    expression = subscription.strip()
    if not expression or expression == "*":
        return None
    return frozenset(tag.strip() for tag in expression.split("||") if tag.strip())


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


# --- the client --------------------------------------------------------------------------------


class RocketMQClient(NameServerRouting):
    """Producer and pull-consumer client of a RocketMQ cluster, found through its NameServer(s).

    Every operation is bounded: at most `max_attempts` tries within `retry_deadline` seconds,
    with exponential backoff between reconnects. Use `async with RocketMQClient(...)` or call
    `start()` and `close()`.
    """

    def __init__(
        self,
        namesrv_addr: str | Sequence[str],
        *,
        client_id: str,
        producer_group: str,
        consumer_group: str | None = None,
        request_timeout: float = 3.0,
        connect_timeout: float = 3.0,
        route_refresh_interval: float = 30.0,
        heartbeat_interval: float = 30.0,
        max_attempts: int = 3,
        retry_deadline: float = 10.0,
        backoff_initial: float = 0.05,
        backoff_max: float = 1.0,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    ) -> None:
        addrs = namesrv_addr.split(";") if isinstance(namesrv_addr, str) else list(namesrv_addr)
        self.namesrv_addrs = [a.strip() for a in addrs if a.strip()]
        if not self.namesrv_addrs:
            raise ValueError("no NameServer address")
        self.client_id = client_id
        self.producer_group = producer_group
        self.consumer_group = consumer_group
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout
        self.route_refresh_interval = route_refresh_interval
        self.heartbeat_interval = heartbeat_interval
        self.max_attempts = max(1, max_attempts)
        self.retry_deadline = retry_deadline
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.max_frame_size = max_frame_size
        self._routes: dict[str, TopicRoute] = {}
        self._route_locks: dict[str, asyncio.Lock] = {}
        self._conns: dict[str, RemotingConnection] = {}
        self._conn_locks: dict[str, asyncio.Lock] = {}
        self._namesrv_index = 0
        self._queue_counter = itertools.count(random.randrange(1024))
        self._cluster_brokers: dict[str, BrokerInfo] = {}
        self._consumer_groups: dict[str, tuple[tuple[str, ...], int]] = {}
        """Consumer group -> (subscribed topics, subVersion) announced by `heartbeat`."""
        self._membership_lock = asyncio.Lock()
        self._maintenance: asyncio.Task[None] | None = None
        self._closed = False

    # -- lifecycle

    async def start(self) -> None:
        """Start the background route refresh and heartbeat task."""
        if self._maintenance is None:
            self._maintenance = asyncio.create_task(
                self._maintain(), name=f"rocketmq-maintenance-{self.client_id}"
            )

    async def close(self) -> None:
        """Stop background work and close every connection."""
        self._closed = True
        if self._maintenance is not None:
            self._maintenance.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._maintenance
            self._maintenance = None
        conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            await conn.close()

    async def __aenter__(self) -> RocketMQClient:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- connections and retries

    async def connection(self, addr: str) -> RemotingConnection:
        """The open connection to `addr`, opened now if needed (one attempt)."""
        conn = self._conns.get(addr)
        if conn is not None and not conn.closed:
            return conn
        lock = self._conn_locks.setdefault(addr, asyncio.Lock())
        async with lock:
            conn = self._conns.get(addr)
            if conn is None or conn.closed:
                if self._closed:
                    raise BrokerUnavailable("client is closed", maybe_delivered=False)
                conn = await RemotingConnection.open(
                    addr,
                    connect_timeout=self.connect_timeout,
                    max_frame_size=self.max_frame_size,
                )
                self._conns[addr] = conn
            return conn

    async def _backoff(self, attempt: int, deadline: float) -> bool:
        """Sleep before retry `attempt` (1-based); False when out of attempts or time."""
        if attempt >= self.max_attempts:
            return False
        delay = min(self.backoff_max, self.backoff_initial * (2 ** (attempt - 1)))
        delay *= 0.5 + random.random() / 2
        if time.monotonic() + delay >= deadline:
            return False
        await asyncio.sleep(delay)
        return True

    async def call(
        self,
        addr: str,
        code: int,
        ext_fields: Mapping[str, str] | None = None,
        body: bytes = b"",
        *,
        timeout: float | None = None,
        idempotent: bool = True,
    ) -> RemotingCommand:
        """Send one request to `addr` with bounded retries; return the response.

        Connection failures are retried (at most `max_attempts` tries within `retry_deadline`);
        a request that may have reached the server is retried only if `idempotent`. Timeouts
        are not retried.
        """
        deadline = time.monotonic() + self.retry_deadline
        attempt = 0
        while True:
            attempt += 1
            try:
                conn = await self.connection(addr)
                return await conn.request(
                    code, ext_fields, body, timeout=timeout or self.request_timeout
                )
            except BrokerUnavailable as exc:
                if (exc.maybe_delivered and not idempotent) or not await self._backoff(
                    attempt, deadline
                ):
                    raise

    # -- producer

    async def send(
        self,
        topic: str,
        body: bytes,
        *,
        tags: str | None = None,
        keys: Sequence[str] | str | None = None,
        properties: Mapping[str, str] | None = None,
        queue_id: int | None = None,
        broker_name: str | None = None,
        timeout: float | None = None,
        wait_store_msg_ok: bool = True,
    ) -> SendResult:
        """Send one message (SEND_MESSAGE_V2) and return where it was stored.

        The queue is chosen round-robin among the topic's writable queues unless `queue_id` (and
        `broker_name`) are given. A topic unknown to the NameServer is sent through the route of
        the default topic, so a broker with autoCreateTopicEnable creates it. Raises
        RemotingError for a refusal (e.g. TOPIC_NOT_EXIST, MESSAGE_ILLEGAL), BrokerUnavailable,
        RemotingTimeout (the message may or may not be stored).
        """
        props: dict[str, str] = {}
        if properties:
            props.update(properties)
        if tags:
            props[PROPERTY_TAGS] = tags
        if keys:
            props[PROPERTY_KEYS] = keys if isinstance(keys, str) else KEY_SEPARATOR.join(keys)
        msg_id = props.get(PROPERTY_UNIQ_KEY) or uuid.uuid4().hex.upper()
        props[PROPERTY_UNIQ_KEY] = msg_id
        props[PROPERTY_WAIT_STORE_MSG_OK] = "true" if wait_store_msg_ok else "false"

        deadline = time.monotonic() + self.retry_deadline
        attempt = 0
        while True:
            attempt += 1
            target_broker, target_queue, addr = await self._choose_queue(
                topic, queue_id, broker_name
            )
            fields = send_message_v2_fields(
                producer_group=self.producer_group,
                topic=topic,
                queue_id=target_queue,
                properties=props,
                born_timestamp=int(time.time() * 1000),
            )
            try:
                conn = await self.connection(addr)
                response = await conn.request(
                    RequestCode.SEND_MESSAGE_V2,
                    fields,
                    body,
                    timeout=timeout or self.request_timeout,
                )
            except BrokerUnavailable as exc:
                self.invalidate_route(topic)
                if exc.maybe_delivered or not await self._backoff(attempt, deadline):
                    raise
                continue
            status = SEND_STATUS_BY_CODE.get(response.code)
            if status is not None:
                ext = response.ext_fields
                return SendResult(
                    status=status,
                    msg_id=msg_id,
                    queue_id=int(ext.get("queueId", target_queue)),
                    queue_offset=int(ext.get("queueOffset", -1)),
                    offset_msg_id=ext.get("msgId", ""),
                    broker_name=target_broker,
                    topic=topic,
                )
            if response.code in (ResponseCode.TOPIC_NOT_EXIST, ResponseCode.NO_PERMISSION):
                self.invalidate_route(topic)
            retryable = response.code in (ResponseCode.SYSTEM_BUSY, ResponseCode.SYSTEM_ERROR)
            if not retryable or not await self._backoff(attempt, deadline):
                raise RemotingError(
                    response.code, response.remark, addr=addr, request=RequestCode.SEND_MESSAGE_V2
                )

    async def _choose_queue(
        self, topic: str, queue_id: int | None, broker_name: str | None
    ) -> tuple[str, int, str]:
        """(broker name, queue id, master address) for a send."""
        if topic.startswith(LMQ_PREFIX):
            raise ValueError(
                "LMQ queues are written through a normal topic with the INNER_MULTI_DISPATCH "
                "property, not sent to directly"
            )
        try:
            route = await self.get_route(topic)
            queues = route.write_queues()
        except RemotingError as exc:
            if exc.code != ResponseCode.TOPIC_NOT_EXIST:
                raise
            try:
                route = await self.get_route(DEFAULT_TOPIC)
            except RemotingError as default_exc:
                if default_exc.code != ResponseCode.TOPIC_NOT_EXIST:
                    raise
                # Neither the topic nor the template is routed: no broker is registered.
                raise BrokerUnavailable(
                    f"no broker serves topic {topic!r} (nor {DEFAULT_TOPIC})", maybe_delivered=False
                ) from exc
            queues = route.write_queues()
            self.invalidate_route(topic)
        if broker_name is not None:
            queues = [q for q in queues if q[0] == broker_name]
        if queue_id is not None:
            queues = [q for q in queues if q[1] == queue_id] or (
                [(queues[0][0], queue_id)] if queues else []
            )
        if not queues:
            raise BrokerUnavailable(f"no writable queue for topic {topic!r}", maybe_delivered=False)
        name, qid = queues[next(self._queue_counter) % len(queues)]
        return name, qid, route.master_addr(name)

    # -- consumer

    async def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_msgs: int = 32,
        *,
        consumer_group: str | None = None,
        subscription: str = "*",
        suspend_timeout_ms: int = 0,
        broker_name: str | None = None,
        timeout: float | None = None,
    ) -> PullResult:
        """Pull up to `max_msgs` messages of one queue from `offset` (PULL_MESSAGE).

        With `suspend_timeout_ms` > 0 the broker holds the request (long polling) until a message
        arrives or the time is up, then answers NO_NEW_MSG. `subscription` is a TAG expression
        ("*" or "a || b"); the broker filters by tag hash and this client re-checks the tag.
        """
        group = consumer_group or self.consumer_group
        if not group:
            raise ValueError("pull needs a consumer group")
        sys_flag = PullSysFlag.SUBSCRIPTION
        if suspend_timeout_ms > 0:
            sys_flag |= PullSysFlag.SUSPEND
        fields = {
            "consumerGroup": group,
            "topic": topic,
            "queueId": str(queue_id),
            "queueOffset": str(offset),
            "maxMsgNums": str(max_msgs),
            "sysFlag": str(sys_flag),
            "commitOffset": "0",
            "suspendTimeoutMillis": str(suspend_timeout_ms),
            "subscription": subscription,
            "subVersion": "0",
            "expressionType": "TAG",
        }
        wait = (timeout or self.request_timeout) + suspend_timeout_ms / 1000
        if suspend_timeout_ms > 0:
            # The broker checks held pulls on a timer (every 5 s with long polling on), so an
            # idle long poll is answered up to ~5 s after its suspend time: allow for that.
            wait += LONG_POLL_CHECK_SLACK
        response = await self._broker_call(
            topic, broker_name, RequestCode.PULL_MESSAGE, fields, wait
        )
        status = PULL_STATUS_BY_CODE.get(response.code)
        if status is None:
            raise RemotingError(response.code, response.remark, request=RequestCode.PULL_MESSAGE)
        ext = response.ext_fields
        messages = decode_messages(response.body) if status is PullStatus.FOUND else []
        wanted = _parse_tags(subscription)
        if wanted is not None:
            messages = [m for m in messages if m.tags in wanted]
        return PullResult(
            status=status,
            next_offset=int(ext.get("nextBeginOffset", offset)),
            min_offset=int(ext.get("minOffset", 0)),
            max_offset=int(ext.get("maxOffset", 0)),
            messages=messages,
            suggest_which_broker_id=int(ext.get("suggestWhichBrokerId", 0)),
        )

    async def _broker_call(
        self,
        topic: str,
        broker_name: str | None,
        code: int,
        fields: Mapping[str, str],
        timeout: float | None = None,
        *,
        body: bytes = b"",
        idempotent: bool = True,
    ) -> RemotingCommand:
        """An idempotent request to the master serving `topic`; route refreshed on failure."""
        addr = await self.broker_addr(topic, broker_name)
        try:
            return await self.call(addr, code, fields, body, timeout=timeout, idempotent=idempotent)
        except BrokerUnavailable:
            self.invalidate_route(topic)
            raise

    async def query_consumer_offset(
        self,
        topic: str,
        queue_id: int,
        *,
        consumer_group: str | None = None,
        broker_name: str | None = None,
    ) -> int | None:
        """The group's committed offset in the queue, or None if it has none."""
        group = consumer_group or self.consumer_group
        if not group:
            raise ValueError("query_consumer_offset needs a consumer group")
        fields = {
            "consumerGroup": group,
            "topic": topic,
            "queueId": str(queue_id),
            "setZeroIfNotFound": "false",
        }
        response = await self._broker_call(
            topic, broker_name, RequestCode.QUERY_CONSUMER_OFFSET, fields
        )
        if response.code == ResponseCode.QUERY_NOT_FOUND:
            return None
        self._check(response, RequestCode.QUERY_CONSUMER_OFFSET)
        return int(response.ext_fields["offset"])

    async def update_consumer_offset(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        *,
        consumer_group: str | None = None,
        broker_name: str | None = None,
        oneway: bool = False,
    ) -> None:
        """Commit the group's offset in the queue (the broker persists it every few seconds).

        The broker refuses (SUBSCRIPTION_GROUP_NOT_EXIST) a group it has never seen; a pull by
        the group creates it when autoCreateSubscriptionGroup is on.
        """
        group = consumer_group or self.consumer_group
        if not group:
            raise ValueError("update_consumer_offset needs a consumer group")
        fields = {
            "consumerGroup": group,
            "topic": topic,
            "queueId": str(queue_id),
            "commitOffset": str(offset),
        }
        if oneway:
            addr = await self.broker_addr(topic, broker_name)
            conn = await self.connection(addr)
            await conn.oneway(RequestCode.UPDATE_CONSUMER_OFFSET, fields)
            return
        response = await self._broker_call(
            topic, broker_name, RequestCode.UPDATE_CONSUMER_OFFSET, fields
        )
        self._check(response, RequestCode.UPDATE_CONSUMER_OFFSET)

    async def max_offset(self, topic: str, queue_id: int, *, broker_name: str | None = None) -> int:
        """The queue's max offset: the offset the next message will get."""
        response = await self._broker_call(
            topic,
            broker_name,
            RequestCode.GET_MAX_OFFSET,
            {"topic": topic, "queueId": str(queue_id), "committed": "true"},
        )
        self._check(response, RequestCode.GET_MAX_OFFSET)
        return int(response.ext_fields["offset"])

    async def min_offset(self, topic: str, queue_id: int, *, broker_name: str | None = None) -> int:
        """The queue's min offset: the oldest message still retained."""
        response = await self._broker_call(
            topic,
            broker_name,
            RequestCode.GET_MIN_OFFSET,
            {"topic": topic, "queueId": str(queue_id)},
        )
        self._check(response, RequestCode.GET_MIN_OFFSET)
        return int(response.ext_fields["offset"])

    async def offset_at(
        self, topic: str, queue_id: int, timestamp_ms: int, *, broker_name: str | None = None
    ) -> int:
        """The offset of the queue's first message stored at or after `timestamp_ms`
        (SEARCH_OFFSET_BY_TIMESTAMP, lower boundary); the max offset if there is none."""
        response = await self._broker_call(
            topic,
            broker_name,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
            {
                "topic": topic,
                "queueId": str(queue_id),
                "timestamp": str(timestamp_ms),
                "boundaryType": "LOWER",
            },
        )
        self._check(response, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP)
        return int(response.ext_fields["offset"])

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

        Asks every master serving the topic (QUERY_MESSAGE) for up to `max_num` messages each (a
        broker caps it at its maxMsgsNumBatch, 64 by default); a broker without a match answers
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
        route = await self.get_route(topic)
        addrs = sorted(
            {info.master_addr for info in route.brokers.values() if info.master_addr is not None}
        )
        if not addrs:
            raise BrokerUnavailable(f"no master broker for topic {topic!r}", maybe_delivered=False)

        async def query(addr: str) -> list[StoredMessage]:
            try:
                response = await self.call(addr, RequestCode.QUERY_MESSAGE, fields)
            except BrokerUnavailable:
                self.invalidate_route(topic)
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

    # -- admin

    async def topic_list(self) -> list[str]:
        """Every topic the NameServer knows (GET_ALL_TOPIC_LIST_FROM_NAMESERVER), sorted.

        System topics (TBW102, retry topics, the cluster and broker names...) are included.
        Raises RemotingError when the NameServer refuses (SYSTEM_ERROR "disable" when its
        enableAllTopicList is off).
        """
        response = await self._namesrv_call(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
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
        brokers = await self.cluster_brokers(refresh=True)
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
        brokers = await self.cluster_brokers(refresh=True)
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
            response = await self.call(
                info.master_addr, RequestCode.UPDATE_AND_CREATE_TOPIC, fields
            )
            self._check(response, RequestCode.UPDATE_AND_CREATE_TOPIC)
        self.invalidate_route(topic)

    # -- consumer-group membership

    def register_consumer(self, group: str, topics: Iterable[str]) -> None:
        """Announce this client as a member of consumer `group` (clustering mode) from now on.

        Every `heartbeat` (periodic, or called now to announce at once) then carries the group
        as a passive (push-style) clustering consumer of `topics`, consuming from the last
        offset, subscribed to every tag; the brokers list this client among the group's members
        (`consumer_ids`). The broker keeps one subscription per group: every member should
        register the same topics. Registering again replaces the topics.
        """
        if not group:
            raise ValueError("register_consumer needs a consumer group")
        wanted = tuple(sorted(set(topics)))
        if any(not topic for topic in wanted):
            raise ValueError("topic names must be non-empty")
        current = self._consumer_groups.get(group)
        if current is not None and current[0] == wanted:
            return
        # The broker replaces a subscription only by a higher subVersion.
        version = int(time.time() * 1000)
        if current is not None:
            version = max(version, current[1] + 1)
        self._consumer_groups[group] = (wanted, version)

    def unregister_consumer(self, group: str) -> None:
        """Stop announcing `group` in heartbeats.

        The brokers drop this member once its last group heartbeat expires (channelExpiredTimeout,
        120 s by default); `unregister_client` drops it at once.
        """
        self._consumer_groups.pop(group, None)

    @property
    def consumer_groups(self) -> dict[str, tuple[str, ...]]:
        """The registered consumer groups and their topics."""
        return {group: topics for group, (topics, _) in self._consumer_groups.items()}

    async def consumer_ids(self, group: str, topic: str) -> list[str]:
        """Client ids of the members of `group`, as the broker serving `topic` knows them, sorted.

        GET_CONSUMER_LIST_BY_GROUP; a group without members (never registered, or every member
        left or expired) is answered SYSTEM_ERROR "no consumer for this group, ...", returned as
        an empty list.
        """
        response = await self._broker_call(
            topic, None, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group}
        )
        if response.code == ResponseCode.SYSTEM_ERROR and (response.remark or "").startswith(
            NO_CONSUMER_REMARK
        ):
            return []
        self._check(response, RequestCode.GET_CONSUMER_LIST_BY_GROUP)
        if not response.body:
            return []
        try:
            ids = loads_fastjson(response.body).get("consumerIdList") or []
            return sorted(str(client_id) for client_id in ids)
        except (AttributeError, TypeError) as exc:
            raise RemotingProtocolError(f"malformed consumer list: {exc!r}") from None

    async def unregister_client(self, group: str) -> None:
        """Leave consumer `group` now: UNREGISTER_CLIENT to every master of the cluster.

        The group is first dropped from the heartbeats (`unregister_consumer`), so that no later
        heartbeat registers it again. A broker removes the member registered over the same
        connection, so this goes over the connections the heartbeats used. Every master is
        asked; the first failure (RemotingError, BrokerUnavailable, RemotingTimeout) is raised
        after all were tried.
        """
        self.unregister_consumer(group)
        fields = {"clientID": self.client_id, "consumerGroup": group}
        async with self._membership_lock:
            addrs = await self._master_addrs(include_cluster=True)
            errors: list[RocketMQError] = []
            for addr in addrs:
                try:
                    response = await self.call(addr, RequestCode.UNREGISTER_CLIENT, fields)
                    if response.code != ResponseCode.SUCCESS:
                        raise RemotingError(
                            response.code,
                            response.remark,
                            addr=addr,
                            request=RequestCode.UNREGISTER_CLIENT,
                        )
                except RocketMQError as exc:
                    log.warning(
                        "unregistering %s of %s at %s failed: %s", self.client_id, group, addr, exc
                    )
                    errors.append(exc)
            if errors:
                raise errors[0]

    async def _master_addrs(self, *, include_cluster: bool) -> list[str]:
        """Master addresses of the cached routes, plus every master of the cluster if asked.

        The cluster's brokers are fetched again from the NameServer (brokers may have joined);
        when that fails, the last known ones are used.
        """
        addrs = {
            broker.master_addr
            for route in list(self._routes.values())
            for broker in route.brokers.values()
            if broker.master_addr
        }
        if include_cluster:
            try:
                brokers = await self.cluster_brokers(refresh=True)
            except (RocketMQError, RemotingProtocolError) as exc:
                log.warning("cluster broker lookup failed, using the last known: %s", exc)
                brokers = self._cluster_brokers
            addrs.update(info.master_addr for info in brokers.values() if info.master_addr)
        return sorted(addrs)

    def _heartbeat_data(self) -> bytes:
        """The HEART_BEAT body: `HeartbeatData` as JSON.

        Field names and enum values are those the broker's fastjson maps onto HeartbeatData,
        ProducerData, ConsumerData and SubscriptionData (remoting/protocol/heartbeat, 5.3.3).
        """
        consumers = [
            {
                "groupName": group,
                "consumeType": "CONSUME_PASSIVELY",
                "messageModel": "CLUSTERING",
                "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                "subscriptionDataSet": [
                    {
                        "classFilterMode": False,
                        "topic": topic,
                        "subString": "*",
                        "tagsSet": [],
                        "codeSet": [],
                        "subVersion": version,
                        "expressionType": "TAG",
                    }
                    for topic in topics
                ],
                "unitMode": False,
            }
            for group, (topics, version) in sorted(self._consumer_groups.items())
        ]
        return json.dumps(
            {
                "clientID": self.client_id,
                "producerDataSet": [{"groupName": self.producer_group}],
                "consumerDataSet": consumers,
                # 0: the classic heartbeat, which always carries the full subscriptions.
                "heartbeatFingerprint": 0,
                "withoutSub": False,
            }
        ).encode()

    # -- background

    async def heartbeat(self) -> None:
        """Register this client with the brokers (HEART_BEAT) and refresh its registration.

        The heartbeat carries the producer group and the consumer groups of `register_consumer`.
        It goes to the masters of the cached routes; with consumer groups registered, to every
        master of the cluster too (a group's members must be known wherever its topics' queues
        are). Failures are logged, not raised (the next heartbeat retries).
        """
        async with self._membership_lock:
            body = self._heartbeat_data()
            addrs = await self._master_addrs(include_cluster=bool(self._consumer_groups))
            for addr in addrs:
                try:
                    conn = await self.connection(addr)
                    response = await conn.request(
                        RequestCode.HEART_BEAT, {}, body, timeout=self.request_timeout
                    )
                except RocketMQError as exc:
                    log.warning("heartbeat to %s failed: %s", addr, exc)
                    continue
                if response.code != ResponseCode.SUCCESS:
                    log.warning(
                        "heartbeat to %s refused: code %s, %s", addr, response.code, response.remark
                    )

    async def _maintain(self) -> None:
        """Refresh cached routes and send heartbeats periodically."""
        interval = min(self.route_refresh_interval, self.heartbeat_interval)
        while True:
            await asyncio.sleep(interval)
            for topic in list(self._routes):
                try:
                    await self.get_route(topic, refresh=True)
                except RemotingError as exc:
                    if exc.code == ResponseCode.TOPIC_NOT_EXIST:
                        self.invalidate_route(topic)
                except RocketMQError as exc:
                    log.warning("route refresh of %s failed: %s", topic, exc)
            await self.heartbeat()

    @staticmethod
    def _check(response: RemotingCommand, request: int) -> None:
        if response.code != ResponseCode.SUCCESS:
            raise RemotingError(response.code, response.remark, request=request)
