"""An asyncio client for Apache RocketMQ's TCP remoting protocol (NameServer + broker, 4.x/5.x).

`RemotingConnection` is one TCP connection: requests are matched to responses by `opaque`, one
future per request, each with its own timeout; a lost connection fails every pending request
with `BrokerUnavailable` at once. `RocketMQClient` adds topic routes from the NameServer (cached,
refreshed in the background and after errors), one connection per broker (reopened on demand
with bounded backoff), and the producer/consumer operations the gateway needs: send, pull (with
long polling), consumer offsets, queue min/max offsets and topic creation.

The frame and header codec lives in `bridge.storage.rocketmq_wire` (no I/O).
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
from dataclasses import dataclass, field
from enum import Enum
from types import TracebackType
from typing import Any, Final

from bridge.storage.rocketmq_wire import (
    DEFAULT_MAX_FRAME_SIZE,
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    KEY_SEPARATOR,
    LMQ_PREFIX,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    PROPERTY_WAIT_STORE_MSG_OK,
    FrameDecoder,
    PullSysFlag,
    RemotingCommand,
    RemotingProtocolError,
    RequestCode,
    ResponseCode,
    StoredMessage,
    decode_messages,
    encode_command,
    loads_fastjson,
    send_message_v2_fields,
)

__all__ = [
    "BrokerInfo",
    "BrokerUnavailable",
    "PullResult",
    "PullStatus",
    "QueueInfo",
    "RemotingConnection",
    "RemotingError",
    "RemotingTimeout",
    "RocketMQClient",
    "RocketMQError",
    "SendResult",
    "SendStatus",
    "StoredMessage",
    "TopicRoute",
]

log = logging.getLogger(__name__)

DEFAULT_TOPIC: Final = "TBW102"
"""The template topic brokers auto-create new topics from (autoCreateTopicEnable)."""
PERM_WRITE: Final = 0x2
PERM_READ: Final = 0x4
MASTER_ID: Final = "0"


# --- errors ------------------------------------------------------------------------------------


class RocketMQError(Exception):
    """Base class of this client's errors."""


class RemotingError(RocketMQError):
    """The server answered with an error code (`code`, a `ResponseCode` value) and `remark`."""

    def __init__(self, code: int, remark: str | None, *, addr: str = "", request: int = 0) -> None:
        self.code = code
        self.remark = remark or ""
        self.addr = addr
        self.request = request
        try:
            name = ResponseCode(code).name
        except ValueError:
            name = str(code)
        super().__init__(f"{addr} answered {name} ({code}) to request {request}: {self.remark}")


class RemotingTimeout(RocketMQError, TimeoutError):
    """No response within the request's timeout (the request may still take effect)."""


class BrokerUnavailable(RocketMQError, ConnectionError):
    """The connection could not be opened, or was lost while the request was pending.

    `maybe_delivered` is False only when the request certainly never reached the server (the
    connection could not be opened), so even a non-idempotent request may be retried.
    """

    def __init__(self, message: str, *, maybe_delivered: bool = True) -> None:
        super().__init__(message)
        self.maybe_delivered = maybe_delivered


# --- one connection ----------------------------------------------------------------------------


class _Protocol(asyncio.Protocol):
    """asyncio protocol feeding a `RemotingConnection`."""

    def __init__(self, conn: RemotingConnection) -> None:
        self.conn = conn

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.conn._transport = transport

    def data_received(self, data: bytes) -> None:
        self.conn._data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn._connection_lost(exc)

    def pause_writing(self) -> None:
        self.conn._pause_writing()

    def resume_writing(self) -> None:
        self.conn._resume_writing()


class RemotingConnection:
    """One TCP connection to a NameServer or broker; use `RemotingConnection.open(addr)`."""

    _opaques = itertools.count(random.randrange(1 << 20))

    def __init__(self, addr: str, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.addr = addr
        self._decoder = FrameDecoder(max_frame_size)
        self._pending: dict[int, asyncio.Future[RemotingCommand]] = {}
        self._transport: asyncio.Transport | None = None
        self._closed: BrokerUnavailable | None = None
        self._closed_event = asyncio.Event()
        self._can_write: asyncio.Future[None] | None = None

    @classmethod
    async def open(
        cls,
        addr: str,
        *,
        connect_timeout: float = 3.0,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    ) -> RemotingConnection:
        """Connect to `addr` ("host:port"); BrokerUnavailable if that fails or times out."""
        host, _, port = addr.rpartition(":")
        conn = cls(addr, max_frame_size=max_frame_size)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(connect_timeout):
                await loop.create_connection(lambda: _Protocol(conn), host.strip("[]"), int(port))
        except (OSError, TimeoutError, ValueError) as exc:
            raise BrokerUnavailable(
                f"cannot connect to {addr}: {exc!r}", maybe_delivered=False
            ) from exc
        return conn

    @property
    def closed(self) -> bool:
        """True once the connection is closed or lost."""
        return self._closed is not None

    @property
    def pending(self) -> int:
        """Requests waiting for a response."""
        return len(self._pending)

    async def wait_closed(self) -> None:
        """Return when the connection is closed or lost."""
        await self._closed_event.wait()

    async def request(
        self,
        code: int,
        ext_fields: Mapping[str, str] | None = None,
        body: bytes = b"",
        *,
        timeout: float = 3.0,
    ) -> RemotingCommand:
        """Send a request and return its response (whatever its code).

        Raises RemotingTimeout after `timeout` seconds, BrokerUnavailable if the connection is or
        gets closed first.
        """
        opaque = next(self._opaques) & 0x7FFFFFFF
        future: asyncio.Future[RemotingCommand] = asyncio.get_running_loop().create_future()
        self._pending[opaque] = future
        try:
            await self._write(
                RemotingCommand(
                    code=code, opaque=opaque, ext_fields=dict(ext_fields or {}), body=body
                )
            )
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError:
            raise RemotingTimeout(
                f"no response from {self.addr} to request {code} within {timeout:.3f}s"
            ) from None
        finally:
            self._pending.pop(opaque, None)

    async def oneway(
        self, code: int, ext_fields: Mapping[str, str] | None = None, body: bytes = b""
    ) -> None:
        """Send a request that gets no response (written, not acknowledged)."""
        opaque = next(self._opaques) & 0x7FFFFFFF
        await self._write(
            RemotingCommand(
                code=code,
                opaque=opaque,
                flag=FLAG_ONEWAY,
                ext_fields=dict(ext_fields or {}),
                body=body,
            )
        )

    async def close(self) -> None:
        """Close the connection; pending requests fail with BrokerUnavailable."""
        if self._transport is not None and not self.closed:
            self._transport.close()
        self._fail(BrokerUnavailable(f"connection to {self.addr} closed by the client"))
        await self._closed_event.wait()

    # -- internals

    async def _write(self, cmd: RemotingCommand) -> None:
        if self._closed is not None:
            raise BrokerUnavailable(
                f"connection to {self.addr} is closed: {self._closed}", maybe_delivered=False
            )
        if self._can_write is not None:
            await asyncio.shield(self._can_write)
            if self._closed is not None:
                raise BrokerUnavailable(f"connection to {self.addr} is closed: {self._closed}")
        assert self._transport is not None
        self._transport.write(encode_command(cmd))

    def _data_received(self, data: bytes) -> None:
        try:
            commands = self._decoder.feed(data)
        except RemotingProtocolError as exc:
            log.error("malformed frame from %s: %s", self.addr, exc)
            self._fail(BrokerUnavailable(f"malformed frame from {self.addr}: {exc}"))
            if self._transport is not None:
                self._transport.abort()
            return
        for cmd in commands:
            if cmd.flag & FLAG_RESPONSE:
                future = self._pending.pop(cmd.opaque, None)
                if future is not None and not future.done():
                    future.set_result(cmd)
            elif not cmd.flag & FLAG_ONEWAY and self._transport is not None:
                # A request from the server (e.g. a consumer-id change notice): not supported.
                reply = RemotingCommand(
                    code=ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                    opaque=cmd.opaque,
                    flag=FLAG_RESPONSE,
                    remark=f"request code {cmd.code} not supported by this client",
                )
                self._transport.write(encode_command(reply))

    def _connection_lost(self, exc: Exception | None) -> None:
        reason = f": {exc!r}" if exc else ""
        self._fail(BrokerUnavailable(f"connection to {self.addr} lost{reason}"))

    def _fail(self, error: BrokerUnavailable) -> None:
        if self._closed is None:
            self._closed = error
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(BrokerUnavailable(str(error)))
        self._resume_writing()
        self._closed_event.set()

    def _pause_writing(self) -> None:
        if self._can_write is None:
            self._can_write = asyncio.get_running_loop().create_future()

    def _resume_writing(self) -> None:
        if self._can_write is not None:
            if not self._can_write.done():
                self._can_write.set_result(None)
            self._can_write = None


# --- results and routes ------------------------------------------------------------------------


class SendStatus(Enum):
    """Outcome of a send. Only SEND_OK means durable when the broker uses SYNC_FLUSH."""

    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


_SEND_STATUS: Final[dict[int, SendStatus]] = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}


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


_PULL_STATUS: Final[dict[int, PullStatus]] = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}


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


def _parse_brokers(raw: Any) -> dict[str, BrokerInfo]:
    out: dict[str, BrokerInfo] = {}
    for item in raw or []:
        name = str(item["brokerName"])
        addrs = {str(k): str(v) for k, v in (item.get("brokerAddrs") or {}).items()}
        out[name] = BrokerInfo(name, str(item.get("cluster", "")), addrs)
    return out


def _parse_route(topic: str, body: bytes) -> TopicRoute:
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
        brokers = _parse_brokers(data.get("brokerDatas"))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RemotingProtocolError(f"malformed route of topic {topic!r}: {exc!r}") from None
    return TopicRoute(topic, queues, brokers, time.monotonic())


def _parse_tags(subscription: str) -> frozenset[str] | None:
    """Tags of a TAG expression ("a || b"), or None for "*" (everything)."""
    expression = subscription.strip()
    if not expression or expression == "*":
        return None
    return frozenset(tag.strip() for tag in expression.split("||") if tag.strip())


# --- the client --------------------------------------------------------------------------------


class RocketMQClient:
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

    # -- NameServer

    async def _namesrv_call(
        self, code: int, ext_fields: Mapping[str, str] | None = None
    ) -> RemotingCommand:
        """A request to the NameServers, trying each in turn (bounded)."""
        deadline = time.monotonic() + self.retry_deadline
        last: Exception | None = None
        for attempt in range(1, self.max_attempts + len(self.namesrv_addrs)):
            addr = self.namesrv_addrs[self._namesrv_index % len(self.namesrv_addrs)]
            try:
                conn = await self.connection(addr)
                return await conn.request(code, ext_fields, timeout=self.request_timeout)
            except (BrokerUnavailable, RemotingTimeout) as exc:
                last = exc
                self._namesrv_index += 1
                if not await self._backoff(attempt, deadline):
                    break
        assert last is not None
        raise last

    async def get_route(self, topic: str, *, refresh: bool = False) -> TopicRoute:
        """The topic's route (cached; fetched when missing, stale or `refresh`).

        Raises RemotingError(TOPIC_NOT_EXIST) when the NameServer knows no such topic.
        """
        route = self._routes.get(topic)
        if (
            route is not None
            and not refresh
            and time.monotonic() - route.fetched_at < self.route_refresh_interval * 2
        ):
            return route
        lock = self._route_locks.setdefault(topic, asyncio.Lock())
        async with lock:
            current = self._routes.get(topic)
            if current is not None and current is not route:
                return current  # refreshed while we waited
            response = await self._namesrv_call(
                RequestCode.GET_ROUTEINFO_BY_TOPIC,
                {"topic": topic, "acceptStandardJsonOnly": "true"},
            )
            if response.code != ResponseCode.SUCCESS:
                raise RemotingError(
                    response.code,
                    response.remark,
                    addr="NameServer",
                    request=RequestCode.GET_ROUTEINFO_BY_TOPIC,
                )
            route = _parse_route(topic, response.body)
            self._routes[topic] = route
            return route

    def invalidate_route(self, topic: str) -> None:
        """Forget the cached route of `topic` (it is fetched again on next use)."""
        self._routes.pop(topic, None)

    async def cluster_brokers(self, *, refresh: bool = False) -> dict[str, BrokerInfo]:
        """Every broker set registered with the NameServer (GET_BROKER_CLUSTER_INFO)."""
        if self._cluster_brokers and not refresh:
            return self._cluster_brokers
        response = await self._namesrv_call(RequestCode.GET_BROKER_CLUSTER_INFO)
        if response.code != ResponseCode.SUCCESS:
            raise RemotingError(
                response.code,
                response.remark,
                addr="NameServer",
                request=RequestCode.GET_BROKER_CLUSTER_INFO,
            )
        try:
            table = loads_fastjson(response.body).get("brokerAddrTable") or {}
            self._cluster_brokers = _parse_brokers(table.values())
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RemotingProtocolError(f"malformed cluster info: {exc!r}") from None
        return self._cluster_brokers

    async def broker_addr(self, topic: str, broker_name: str | None = None) -> str:
        """The master address serving `topic` (or `broker_name`).

        LMQ queues ("%LMQ%...") have no route of their own: they live on every broker with
        enableLmq, so any master (or the named one) serves them.
        """
        if topic.startswith(LMQ_PREFIX):
            brokers = await self.cluster_brokers()
            names = [broker_name] if broker_name else sorted(brokers)
            for name in names:
                info = brokers.get(name)
                if info is not None and info.master_addr:
                    return info.master_addr
            raise BrokerUnavailable(f"no master broker for {topic!r}", maybe_delivered=False)
        route = await self.get_route(topic)
        return route.master_addr(broker_name)

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
            status = _SEND_STATUS.get(response.code)
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
        response = await self._broker_call(
            topic, broker_name, RequestCode.PULL_MESSAGE, fields, wait
        )
        status = _PULL_STATUS.get(response.code)
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
