"""The RocketMQ message store: messages in a RocketMQ 5.x cluster, keyed records on local disk.

Messages. Each message is sent once (SEND_MESSAGE_V2) to the RocketMQ topic of its first MQTT
level, with the full topic as tag (the mapping is in `rocketmq_mapping` and docs/design.md). The
bridge queues it must reach (one per matching filter, shared-subscription member, private
queue) are light message queues named in its `INNER_MULTI_DISPATCH` property: the broker writes
the message once and indexes it into every LMQ, with dense offsets per LMQ. A reader pulls an
LMQ from its own offset and so reads only what matches its subscriptions.

Durability. A submitted message counts as stored only when the broker answers SEND_OK; with the
broker on `flushDiskType=SYNC_FLUSH` that means it is on the broker's disk. Any other answer, a
time-out (`send_timeout`) or a lost connection fails the submit with StoreUnavailable
(`maybe_stored` tells whether the request may have reached the broker).

Order. Submissions are sent in submission order over one connection per broker, pipelined
(without waiting for earlier answers), and the broker runs one send thread
(`sendMessageThreadPoolNums=1` in deploy/rocketmq/broker.conf), so LMQ offsets follow submission
order. Callbacks are called in submission order too, whatever order the answers take.

Keyed records ("meta": sessions, offsets, retained messages, QoS 2 markers) live in a small local
`FileLogStore` under the data directory (the cluster moves them to Redis). Meta passed with a
message is made durable before the message is sent (`atomic_meta` is False): a crash in between
leaves meta naming a message that may not exist, which `find_key` settles.

Queue ends. LMQ offsets are assigned by the broker and not returned by a send, so `end_offset`
is what this store knows: the end fetched by `queue_end` (GET_MAX_OFFSET), plus one for every
message of its own confirmed since, raised by `note_end` (notify) and by reads. With other
writers (other bridge nodes, notify's dispatch of backend messages) it may lag. It can run one
ahead in a race (a fetch that already counted a message whose SEND_OK arrives after it); a read
that waited for the missing offset and found none sets it back to the broker's end.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from bridge.storage.base import Message, MetaUpdate, ReadResult, Stored, StoreUnavailable
from bridge.storage.filelog import FileLogStore
from bridge.storage.rocketmq.client import RocketMQClient
from bridge.storage.rocketmq.connection import (
    BrokerUnavailable,
    RemotingConnection,
    RemotingError,
    RocketMQError,
)
from bridge.storage.rocketmq.mapping import (
    MULTI_DISPATCH,
    escape_name,
    lmq_name,
    message_of,
    rocketmq_topic,
    to_rocketmq,
    unescape_name,
)
from bridge.storage.rocketmq.messages import (
    KEY_SEPARATOR,
    LMQ_DISPATCH_SEPARATOR,
    LMQ_PREFIX,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    PROPERTY_WAIT_STORE_MSG_OK,
    StoredMessage,
    send_message_v2_fields,
)
from bridge.storage.rocketmq.types import PullStatus
from bridge.storage.rocketmq.wire import RemotingCommand, RequestCode, ResponseCode

log = logging.getLogger("bridge.storage.rocketmq")

DISPATCH_TOPIC = "mqtt|dispatch"
"""The RocketMQ topic through which notify dispatches backend messages into light queues. `|di`
is not an escape sequence, so no MQTT topic maps to it."""
PROP_ORIGIN = "mqtt.origin"
"""On a dispatched copy of a backend message: the original's message id."""

KIND_STATS = "~stats"
"""Meta kind of this store's own: the average message size (for backlog byte estimates)."""
DEFAULT_MESSAGE_SIZE = 512.0
"""The backlog estimate's message size until this store has seen messages of its own."""
KIND_LMQS = "~lmq"
"""Meta kind of this store's own: every bridge queue it has dispatched to or been asked about, so
a restarted store knows which queue ends to fetch."""

DurableCallback = Callable[[int | None, BaseException | None], None]

_SEND_OK = ResponseCode.SUCCESS
_NOT_DURABLE = {
    ResponseCode.FLUSH_DISK_TIMEOUT: "the broker did not flush it to disk in time",
    ResponseCode.FLUSH_SLAVE_TIMEOUT: "the broker's slave did not confirm it in time",
    ResponseCode.SLAVE_NOT_AVAILABLE: "the broker's slave is not available",
}


@dataclass(slots=True)
class _Send:
    """One submitted message on its way to the broker."""

    topic: str
    tag: str
    keys: str
    properties: dict[str, str]
    body: bytes
    queues: tuple[str, ...]
    size: int
    callback: DurableCallback | None
    meta_durable: asyncio.Future[None] | None = None
    sent_at: float = 0.0
    conn: RemotingConnection | None = None
    opaque: int = -1
    done: bool = False
    seq: int | None = None
    error: BaseException | None = None


@dataclass(slots=True)
class _Target:
    """Where a RocketMQ topic's messages go: one broker's queues, round-robin."""

    addr: str
    broker: str
    queue_ids: list[int]
    counter: Any = field(default_factory=itertools.count)


def _seq_of(offset_msg_id: str) -> int:
    """The commit-log offset in a broker message id (store host + port + offset, hex)."""
    return int(offset_msg_id[-16:], 16)


class RocketMQStore:
    """A `MessageStore` over RocketMQ (see the module docstring)."""

    atomic_meta = False
    exact_backlog_bytes = False

    def __init__(
        self,
        namesrv_addr: str,
        data_dir: str | Path,
        *,
        node_id: str = "bridge",
        namespace: str = "",
        producer_group: str = "mqtt-bridge",
        send_timeout: float = 5.0,
        read_wait: float = 1.0,
        max_pending: int = 20_000,
        send_window: int = 256,
        fsync: bool = True,
        meta_segment_bytes: int = 16 * 1024 * 1024,
        session_meta: KeyedRecords | None = None,
    ) -> None:
        self.namesrv_addr = namesrv_addr
        self.data_dir = Path(data_dir)
        self.node_id = node_id
        self.namespace = namespace
        self.dispatch_topic = (
            f"{escape_name(namespace)}{DISPATCH_TOPIC}" if namespace else DISPATCH_TOPIC
        )
        self.send_timeout = send_timeout
        self.read_wait = read_wait
        self.max_pending = max_pending
        self.send_window = send_window
        self._window_open: asyncio.Event | None = None
        self._meta = FileLogStore(
            self.data_dir / "meta",
            fsync=fsync,
            segment_bytes=meta_segment_bytes,
            retention_bytes=4 * meta_segment_bytes,
            snapshot_every_bytes=meta_segment_bytes // 2,
        )
        self._session_meta = session_meta
        """Where the node's records go instead of the local log (a cluster's Redis registry);
        the store's own kinds (`~...`) stay local either way."""
        self._client = RocketMQClient(
            namesrv_addr,
            client_id=f"{node_id}@{os.getpid()}",
            producer_group=producer_group,
            request_timeout=send_timeout,
        )
        # Reads (and notify's long polls) on connections of their own: pull answers are large,
        # and a broker whose writes to a connection back up stops reading it, which would hold
        # the sends (and so the PUBACKs) behind the reads.
        self._reader = RocketMQClient(
            namesrv_addr,
            client_id=f"{node_id}@{os.getpid()}-reader",
            producer_group=producer_group,
            # LMQ reads need an LMQ-named group: the broker keeps no group config for those.
            consumer_group=f"{LMQ_PREFIX}{producer_group}-{namespace or 'reader'}",
            request_timeout=send_timeout,
        )
        self._open = False
        self._closing = False
        self._sendq: deque[_Send] = deque()
        self._inflight: deque[_Send] = deque()
        self._pump_task: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._targets: dict[str, _Target] = {}
        self._ends: dict[str, int] = {}
        self._lmqs: dict[str, str] = {}
        """LMQ name -> bridge queue, for every queue this store has named."""
        self._lmq_names: dict[str, str] = {}
        """The same map the other way (escaping a name is not free on the publish path)."""

        self._avg_size = DEFAULT_MESSAGE_SIZE
        self.stats = dict.fromkeys(
            ("sent", "send_failures", "send_timeouts", "unqueued_dropped", "reads"), 0
        )

    @property
    def reader_client(self) -> RocketMQClient:
        """The remoting client that reads (notify shares it)."""
        return self._reader

    # --- lifecycle -------------------------------------------------------------------------------

    async def open(self) -> None:
        await self._meta.open()
        try:
            if self._session_meta is not None:
                await self._session_meta.open()
            await self._client.start()
            await self._reader.start()
            brokers = await self._client.cluster_brokers(refresh=True)
            if not any(b.master_addr for b in brokers.values()):
                raise BrokerUnavailable("no master broker is registered", maybe_delivered=False)
            saved = self._meta.meta(KIND_STATS).get("avg_size")
            self._avg_size = float(saved) if saved else DEFAULT_MESSAGE_SIZE
            known = list(self._meta.meta(KIND_LMQS))
            limit = asyncio.Semaphore(64)

            async def fetch(queue: str) -> None:
                async with limit:
                    await self.queue_end(queue)

            await asyncio.gather(*(fetch(q) for q in known))
        except (RocketMQError, OSError, StoreUnavailable) as exc:
            await self._client.close()
            await self._reader.close()
            await self._meta.close()
            if isinstance(exc, StoreUnavailable):
                raise
            raise StoreUnavailable(f"RocketMQ at {self.namesrv_addr} is not usable: {exc}") from exc
        self._open = True
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def close(self) -> None:
        if not self._open:
            return
        self._closing = True
        deadline = time.monotonic() + self.send_timeout + 1.0
        while (self._sendq or self._inflight) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self._open = False
        for task in (self._pump_task, self._sweeper):
            if task is not None:
                task.cancel()
        self._fail_all(StoreUnavailable("the store was closed", maybe_stored=True))
        await self._meta.put_meta(
            [MetaUpdate(KIND_STATS, "avg_size", f"{self._avg_size:.1f}".encode())]
        )
        await self._client.close()
        await self._reader.close()
        await self._meta.close()
        if self._session_meta is not None:
            await self._session_meta.close()

    # --- writing ---------------------------------------------------------------------------------

    def _lmq(self, queue: str) -> str:
        name = self._lmq_names.get(queue)
        if name is None:
            name = lmq_name(self.namespace + queue)
            self._lmq_names[queue] = name
            self._lmqs[name] = queue
        return name

    def _queue_of(self, name: str) -> str | None:
        queue = self._lmqs.get(name)
        if queue is not None:
            return queue
        if not name.startswith(LMQ_PREFIX) or "|H" in name:
            return None
        queue = unescape_name(name[len(LMQ_PREFIX) :])
        if self.namespace:
            if not queue.startswith(self.namespace):
                return None
            queue = queue[len(self.namespace) :]
        return queue

    def _register(self, queues: Sequence[str]) -> list[MetaUpdate]:
        """Meta updates recording queues this store has not named before."""
        known = self._meta.meta(KIND_LMQS)
        return [MetaUpdate(KIND_LMQS, q, b"") for q in queues if q not in known]

    async def append(
        self,
        message: Message,
        queues: Sequence[str],
        *,
        durable: bool = True,
        meta: Sequence[MetaUpdate] = (),
    ) -> int:
        future = self.submit(message, queues, meta=meta)
        assert future is not None
        return await future

    def submit(
        self,
        message: Message,
        queues: Sequence[str],
        *,
        meta: Sequence[MetaUpdate] = (),
        callback: DurableCallback | None = None,
    ) -> asyncio.Future[int] | None:
        future: asyncio.Future[int] | None = None
        if callback is None:
            future = asyncio.get_running_loop().create_future()
            callback = _future_callback(future)
        if not self._open or self._closing:
            callback(None, StoreUnavailable("the RocketMQ store is not open"))
            return future
        if len(self._sendq) + len(self._inflight) >= self.max_pending:
            callback(
                None,
                StoreUnavailable(f"{self.max_pending} messages already wait for the broker"),
            )
            return future
        names = tuple(dict.fromkeys(queues)) if len(queues) > 1 else tuple(queues)
        updates = [*meta, *self._register(names)] if names else list(meta)
        send = self._make_send(message, names, callback)
        if updates:
            send.meta_durable = self._submit_meta(updates)
        self._enqueue(send)
        return future

    def append_unqueued(self, message: Message) -> None:
        if not self._open or self._closing:
            raise StoreUnavailable("the RocketMQ store is not open")
        if len(self._sendq) + len(self._inflight) >= self.max_pending:
            self.stats["unqueued_dropped"] += 1
            raise StoreUnavailable(f"{self.max_pending} messages already wait for the broker")
        self._enqueue(self._make_send(message, (), None))

    def _enqueue(self, send: _Send) -> None:
        """Queue a send behind the others; start the pump if it is not running."""
        self._sendq.append(send)
        if self._pump_task is None:
            self._pump_task = asyncio.get_running_loop().create_task(self._pump())

    def _make_send(
        self, message: Message, queues: tuple[str, ...], callback: DurableCallback | None
    ) -> _Send:
        topic, tag, keys, properties, body = to_rocketmq(message, ())
        if queues:
            properties[MULTI_DISPATCH] = LMQ_DISPATCH_SEPARATOR.join(self._lmq(q) for q in queues)
        properties[PROPERTY_TAGS] = tag
        if keys:
            properties[PROPERTY_KEYS] = keys
        properties[PROPERTY_UNIQ_KEY] = os.urandom(16).hex().upper()
        properties[PROPERTY_WAIT_STORE_MSG_OK] = "true"
        size = len(message.payload) + len(message.topic.encode())
        return _Send(topic, tag, keys, properties, body, queues, size, callback)

    def dispatch(self, message: Message, lmqs: Sequence[str], origin: str) -> asyncio.Future[int]:
        """Send a copy of a message produced outside the bridge into the light queues `lmqs`,
        through notify's dispatch topic (so readers of the message's own topic do not see it
        twice). Resolves to the copy's seq once stored, like `submit`."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        callback = _future_callback(future)
        if not self._open or self._closing:
            callback(None, StoreUnavailable("the RocketMQ store is not open"))
            return future
        send = self._make_send(message, (), callback)
        send.topic = self.dispatch_topic
        send.properties[MULTI_DISPATCH] = LMQ_DISPATCH_SEPARATOR.join(lmqs)
        send.properties[PROP_ORIGIN] = origin
        send.queues = tuple(q for q in (self._queue_of(name) for name in lmqs) if q is not None)
        self._enqueue(send)
        return future

    def lmq_of(self, queue: str) -> str:
        """The light queue (LMQ name) holding a bridge queue."""
        return self._lmq(queue)

    def queue_of(self, lmq: str) -> str | None:
        """The bridge queue an LMQ holds, if it is one of this store's (namespace)."""
        return self._queue_of(lmq)

    async def put_meta(self, updates: Sequence[MetaUpdate], *, durable: bool = True) -> None:
        if self._session_meta is None:
            await self._meta.put_meta(updates, durable=durable)
        else:
            await self._submit_meta(updates)

    def meta(self, kind: str) -> dict[str, bytes]:
        if self._session_meta is None or kind.startswith("~"):
            return self._meta.meta(kind)
        return self._session_meta.meta(kind)

    def _submit_meta(self, updates: Sequence[MetaUpdate]) -> asyncio.Future[None]:
        """Make updates durable: the store's own kinds locally, the node's in `session_meta`
        when there is one. Both are applied in submission order."""
        if self._session_meta is None:
            return self._meta.submit_meta(updates)
        own = [u for u in updates if u.kind.startswith("~")]
        node = [u for u in updates if not u.kind.startswith("~")]
        if not own:
            return self._session_meta.submit_meta(node)
        if not node:
            return self._meta.submit_meta(own)
        both = asyncio.gather(self._meta.submit_meta(own), self._session_meta.submit_meta(node))
        return asyncio.ensure_future(_none_after(both))

    # --- the send pipeline -----------------------------------------------------------------------

    async def _pump(self) -> None:
        """Send queued messages in order; a message whose meta is not yet durable holds back
        the ones after it (so the broker sees them in submission order)."""
        try:
            while self._sendq:
                if len(self._inflight) >= self.send_window:
                    # Bounded pipeline: a burst queues here rather than in the broker's send
                    # queue, which refuses requests that wait there too long.
                    self._window_open = asyncio.Event()
                    await self._window_open.wait()
                    continue
                send = self._sendq[0]
                if send.meta_durable is not None and not send.meta_durable.done():
                    await asyncio.wait([send.meta_durable])
                self._sendq.popleft()
                if send.meta_durable is not None and send.meta_durable.exception() is not None:
                    self._finish(send, None, StoreUnavailable(str(send.meta_durable.exception())))
                    self._complete_in_order()
                    continue
                try:
                    target = self._targets.get(send.topic) or await self._target(send.topic)
                    conn = await self._client.connection(target.addr)
                    fields = send_message_v2_fields(
                        producer_group=self._client.producer_group,
                        topic=send.topic,
                        queue_id=target.queue_ids[next(target.counter) % len(target.queue_ids)],
                        properties=send.properties,
                        born_timestamp=int(time.time() * 1000),
                    )
                    send.sent_at = time.monotonic()
                    send.conn = conn
                    self._inflight.append(send)
                    send.opaque = conn.request_nowait(
                        RequestCode.SEND_MESSAGE_V2,
                        fields,
                        send.body,
                        lambda response, error, send=send: self._answered(send, response, error),
                    )
                except (RocketMQError, OSError, ValueError) as exc:
                    self._targets.pop(send.topic, None)
                    maybe = isinstance(exc, BrokerUnavailable) and exc.maybe_delivered
                    error = StoreUnavailable(f"RocketMQ send failed: {exc}", maybe_stored=maybe)
                    if send not in self._inflight:
                        self._inflight.append(send)
                    self._finish(send, None, error)
                    # The broker is unreachable: everything queued behind fails now too (the
                    # publishers resend) instead of each waiting for its own reconnect attempts.
                    if not isinstance(exc, ValueError):
                        while self._sendq:
                            behind = self._sendq.popleft()
                            self._inflight.append(behind)
                            self._finish(behind, None, StoreUnavailable(str(error)))
                    self._complete_in_order()
                    continue
                if not conn.writable:
                    await conn.drained()
        finally:
            self._pump_task = None
            if self._sendq and self._open:
                self._pump_task = asyncio.get_running_loop().create_task(self._pump())

    async def _target(self, topic: str) -> _Target:
        """Route a RocketMQ topic (unknown topics go through the default topic's route, so a
        broker with autoCreateTopicEnable creates them)."""
        broker, _queue_id, addr = await self._client.choose_queue(topic)
        try:
            route = await self._client.get_route(topic)
            queue_ids = sorted(qid for name, qid in route.write_queues() if name == broker)
        except RocketMQError:
            queue_ids = []
        target = _Target(addr, broker, queue_ids or [_queue_id])
        if queue_ids:
            self._targets[topic] = target
        return target

    def _answered(
        self, send: _Send, response: RemotingCommand | None, error: BaseException | None
    ) -> None:
        if send.done:
            return
        if response is None:
            self._targets.pop(send.topic, None)
            self._finish(
                send,
                None,
                StoreUnavailable(f"RocketMQ connection lost: {error}", maybe_stored=True),
            )
        elif response.code == _SEND_OK:
            try:
                seq = _seq_of(response.ext_fields["msgId"])
            except (KeyError, ValueError):
                self._finish(send, None, StoreUnavailable("SEND_OK without a message id"))
            else:
                self._finish(send, seq, None)
        else:
            reason = _NOT_DURABLE.get(response.code)
            if response.code in (ResponseCode.TOPIC_NOT_EXIST, ResponseCode.NO_PERMISSION):
                self._targets.pop(send.topic, None)
                self._client.invalidate_route(send.topic)
            self._finish(
                send,
                None,
                StoreUnavailable(
                    f"RocketMQ did not store the message: {reason or response.remark} "
                    f"(code {response.code})",
                    maybe_stored=reason is not None,
                ),
            )
        self._complete_in_order()

    def _finish(self, send: _Send, seq: int | None, error: BaseException | None) -> None:
        send.done = True
        send.seq = seq
        send.error = error
        if error is None:
            self.stats["sent"] += 1
            ends = self._ends
            for queue in send.queues:
                ends[queue] = ends.get(queue, 0) + 1
            self._avg_size += (send.size - self._avg_size) / 64
        else:
            self.stats["send_failures"] += 1

    def _complete_in_order(self) -> None:
        inflight = self._inflight
        while inflight and inflight[0].done:
            send = inflight.popleft()
            if send.callback is None:
                if send.error is not None:
                    log.debug("QoS 0 message not stored: %s", send.error)
                continue
            try:
                send.callback(send.seq, send.error)
            except Exception:
                log.exception("a durability callback failed")
        if self._window_open is not None and len(inflight) <= self.send_window // 2:
            self._window_open.set()
            self._window_open = None

    async def _sweep(self) -> None:
        """Fail sends the broker has not answered within `send_timeout`."""
        interval = min(0.25, self.send_timeout / 4)
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            expired = False
            for send in self._inflight:
                if send.done or not send.sent_at:
                    continue
                if now - send.sent_at < self.send_timeout:
                    break
                if send.conn is not None:
                    send.conn.forget(send.opaque)
                self.stats["send_timeouts"] += 1
                self._finish(
                    send,
                    None,
                    StoreUnavailable(
                        f"RocketMQ did not answer a send within {self.send_timeout:.1f} s",
                        maybe_stored=True,
                    ),
                )
                expired = True
            if expired:
                self._targets.clear()
                self._complete_in_order()

    def _fail_all(self, error: StoreUnavailable) -> None:
        while self._sendq:
            self._inflight.append(self._sendq.popleft())
        for send in self._inflight:
            if not send.done:
                self._finish(send, None, error)
        self._complete_in_order()

    # --- reading ---------------------------------------------------------------------------------

    def end_offset(self, queue: str) -> int:
        return self._ends.get(queue, 0)

    def note_end(self, queue: str, end: int) -> None:
        if end > self._ends.get(queue, 0):
            self._ends[queue] = end

    async def queue_end(self, queue: str) -> int:
        name = self._lmq(queue)
        updates = self._register((queue,))
        if updates:
            await self._meta.put_meta(updates, durable=True)
        try:
            end = await self._reader.max_offset(name, 0)
        except RocketMQError as exc:
            raise StoreUnavailable(f"cannot read the end of {queue!r}: {exc}") from exc
        self.note_end(queue, end)
        return self._ends.get(queue, 0)

    def backlog(self, queue: str, offset: int) -> tuple[int, int]:
        count = max(0, self._ends.get(queue, 0) - offset)
        return count, int(count * self._avg_size)

    async def read(self, queue: str, offset: int, limit: int) -> ReadResult:
        if limit <= 0:
            return ReadResult([], offset)
        name = self._lmq(queue)
        known_end = self._ends.get(queue, 0)
        # A message confirmed by SEND_OK reaches its LMQs a moment later (the broker dispatches
        # asynchronously): if we know it is there, wait for it briefly instead of missing it.
        wait_ms = int(self.read_wait * 1000) if offset < known_end else 0
        self.stats["reads"] += 1
        try:
            result = await self._reader.pull(name, 0, offset, limit, suspend_timeout_ms=wait_ms)
        except RocketMQError as exc:
            raise StoreUnavailable(f"cannot read {queue!r}: {exc}") from exc
        if result.max_offset > 0:
            self.note_end(queue, result.max_offset)
        if result.status is PullStatus.FOUND:
            messages = []
            for raw in result.messages:
                stored = self._stored(raw, name)
                if stored is not None and stored.offset >= offset:
                    messages.append(stored)
            messages = messages[:limit]
            if messages:
                return ReadResult(messages, messages[-1].offset + 1)
            return ReadResult([], max(offset, result.next_offset))
        if wait_ms and result.status is PullStatus.NO_NEW_MSG and result.max_offset <= offset:
            # Waited for a message this store counted and none came: the count was one ahead
            # (a SEND_OK that arrived after a fetch had already counted its message).
            self._ends[queue] = max(result.max_offset, 0)
        if result.min_offset > offset:
            # Retention removed [offset, min_offset).
            return ReadResult([], result.min_offset, lost=result.min_offset - offset)
        if result.status is PullStatus.NO_MATCHED_MSG and result.next_offset > offset:
            return ReadResult([], result.next_offset)
        return ReadResult([], offset)

    def _stored(self, raw: StoredMessage, lmq: str) -> Stored | None:
        offsets = raw.lmq_offsets()
        offset = offsets.get(lmq)
        if offset is None:
            return None
        message = message_of(raw)
        if message is None:
            return None
        queues = []
        for name in offsets:
            queue = self._queue_of(name)
            if queue is not None:
                queues.append(queue)
        return Stored(
            offset=offset,
            seq=raw.commit_log_offset,
            message=message,
            queues=tuple(queues),
            size=len(message.payload) + len(message.topic.encode()),
        )

    async def find_key(self, topic: str, key: str) -> bool:
        """Whether the broker holds a message with this key in the topic's RocketMQ topic. The
        broker indexes keys a few milliseconds after storing, so a miss is checked again."""
        target = rocketmq_topic(topic)
        for attempt in range(3):
            try:
                found = await self._reader.query_messages_by_key(target, key)
            except RemotingError as exc:
                if exc.code == ResponseCode.TOPIC_NOT_EXIST:
                    return False  # nothing was ever stored in that topic
                raise StoreUnavailable(f"cannot look up message {key!r}: {exc}") from exc
            except RocketMQError as exc:
                raise StoreUnavailable(f"cannot look up message {key!r}: {exc}") from exc
            if any(key in m.properties.get(PROPERTY_KEYS, "").split(KEY_SEPARATOR) for m in found):
                return True
            if attempt < 2:
                await asyncio.sleep(0.2)
        return False


async def _none_after(future: Awaitable[Any]) -> None:
    await future


class KeyedRecords(Protocol):
    """Where a store may keep the node's keyed records instead of its own log."""

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    def meta(self, kind: str) -> dict[str, bytes]: ...
    def submit_meta(self, updates: Sequence[MetaUpdate]) -> asyncio.Future[None]: ...


def _future_callback(future: asyncio.Future[int]) -> DurableCallback:
    def done(seq: int | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            assert seq is not None
            future.set_result(seq)

    return done
