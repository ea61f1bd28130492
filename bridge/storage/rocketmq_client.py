"""`RocketMQClient`: the producer and pull-consumer side of the RocketMQ remoting client.

It adds topic routes from the NameServer (cached, refreshed in the background and after errors),
one `RemotingConnection` per broker (reopened on demand with bounded backoff), and the
producer/consumer operations the gateway needs: send, pull (with long polling), consumer
offsets, queue min/max offsets and topic creation.

Connections and errors are in bridge/storage/rocketmq_connection.py, the NameServer lookups (the
`NameServerRouting` mixin) in rocketmq_routing.py, results and routes in rocketmq_types.py;
`bridge.storage.rocketmq_remoting` re-exports the public names.
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
from collections.abc import Mapping, Sequence
from types import TracebackType

from bridge.storage.rocketmq_connection import (
    BrokerUnavailable,
    RemotingConnection,
    RemotingError,
    RocketMQError,
)
from bridge.storage.rocketmq_messages import (
    KEY_SEPARATOR,
    LMQ_PREFIX,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    PROPERTY_WAIT_STORE_MSG_OK,
    decode_messages,
    send_message_v2_fields,
)
from bridge.storage.rocketmq_routing import NameServerRouting
from bridge.storage.rocketmq_types import (
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
from bridge.storage.rocketmq_wire import (
    DEFAULT_MAX_FRAME_SIZE,
    PullSysFlag,
    RemotingCommand,
    RequestCode,
    ResponseCode,
)

__all__ = ["RocketMQClient"]

# Named after the module this code was split from, so logging configuration keeps applying.
log = logging.getLogger("bridge.storage.rocketmq_remoting")

LONG_POLL_CHECK_SLACK = 6.0
"""Seconds a held pull may outlive its suspend time before the broker answers it."""


def _parse_tags(subscription: str) -> frozenset[str] | None:
    """Tags of a TAG expression ("a || b"), or None for "*" (everything)."""
    expression = subscription.strip()
    if not expression or expression == "*":
        return None
    return frozenset(tag.strip() for tag in expression.split("||") if tag.strip())


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

    # -- admin

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

    # -- background

    async def heartbeat(self) -> None:
        """Register this client and its producer group with every known broker (HEART_BEAT)."""
        body = json.dumps(
            {
                "clientID": self.client_id,
                "producerDataSet": [{"groupName": self.producer_group}],
                "consumerDataSet": [],
            }
        ).encode()
        addrs = {
            broker.master_addr
            for route in list(self._routes.values())
            for broker in route.brokers.values()
            if broker.master_addr
        }
        for addr in sorted(addrs):
            try:
                conn = await self.connection(addr)
                await conn.request(RequestCode.HEART_BEAT, {}, body, timeout=self.request_timeout)
            except RocketMQError as exc:
                log.warning("heartbeat to %s failed: %s", addr, exc)

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
