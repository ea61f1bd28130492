"""The RocketMQ message store: messages in a RocketMQ 5.x cluster, keyed records on local disk.

Messages. Each message is sent once (SEND_MESSAGE_V2) to the RocketMQ topic of its first MQTT
level, with the full topic as tag (the mapping is in mapping.py and docs/design.md). The
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
message is made durable before the message is sent (`traits.atomic_meta` is False): a crash in
between leaves meta naming a message that may not exist, which `find_key` settles.

notify. Whoever stores a message through this store wakes its readers once it is durable (the
node does: local ones at SEND_OK, peers with a wake; see docs/design.md), so every message sent
here carries `mqtt_notify_skip` = the node id and notify's filtered pulls leave it on the broker
(`NOTIFY_FILTER`). Only `dispatch` (notify's copies of backends' messages) sends unmarked copies,
which notify reads to wake their readers.

Queue ends. LMQ offsets are assigned by the broker and not returned by a send, so `end_offset`
is what this store knows: the end fetched by `track_queue` (GET_MAX_OFFSET), plus one for every
message of its own confirmed since, raised by `note_end` (notify) and by reads. With other
writers (other bridge nodes, notify's dispatch of backend messages) it may lag. It can run one
ahead in a race (a fetch that already counted a message whose SEND_OK arrives after it); a read
that waited for the missing offset and found none sets it back to the broker's end.

Reads. All readers of a light queue on this node share its pulls (reads.py): one pull per
(queue, offset) at a time, and the last batch of each queue kept in memory (16 MiB in all), so
ten subscribers of one filter cost one pull and one decode per batch, not ten.

Parts. This module holds the lifecycle, the admission of writes and the store contract's reads
and look-ups; the send pipeline is in sending.py, the keyed records in meta.py, LMQ names and
queue ends in queues.py, the broker groups, their parts of each queue and the learning of them
in groups.py, the shared reads and the pulls of light queues in reads.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bridge.storage.base import (
    DurableCallback,
    Message,
    MetaUpdate,
    ReadResult,
    StoreTraits,
    StoreUnavailable,
    future_callback,
)
from bridge.storage.rocketmq.acl import Credentials
from bridge.storage.rocketmq.client import RocketMQClient
from bridge.storage.rocketmq.connection import BrokerUnavailable, RemotingError, RocketMQError
from bridge.storage.rocketmq.groups import BrokerGroups, GroupLearning, require_part, split_part
from bridge.storage.rocketmq.held import HeldReads
from bridge.storage.rocketmq.mapping import (
    MULTI_DISPATCH,
    PROP_DELAYED,
    PROP_NODE,
    TIMER_DELIVER_MS,
    TIMER_TOPIC,
    escape_name,
    rocketmq_topic,
    timer_deliver_ms,
)
from bridge.storage.rocketmq.messages import (
    KEY_SEPARATOR,
    LMQ_DISPATCH_SEPARATOR,
    LMQ_PREFIX,
    PROPERTY_KEYS,
)
from bridge.storage.rocketmq.meta import KIND_LMQS, KIND_STATS, KeyedRecords, StoreMeta
from bridge.storage.rocketmq.queues import DEFAULT_MESSAGE_SIZE, LmqNames, QueueEnds
from bridge.storage.rocketmq.reads import LightQueuePulls, SharedReads
from bridge.storage.rocketmq.sending import Send, SendPipeline, new_send
from bridge.storage.rocketmq.tls import TlsOptions
from bridge.storage.rocketmq.wire import ResponseCode

__all__ = [
    "DEFAULT_MESSAGE_SIZE",
    "DISPATCH_TOPIC",
    "KIND_LMQS",
    "KIND_STATS",
    "PROP_ORIGIN",
    "DurableCallback",
    "KeyedRecords",
    "RocketMQStore",
]

DISPATCH_TOPIC = "mqtt|dispatch"
"""The RocketMQ topic through which notify dispatches backend messages into light queues. `|di`
is not an escape sequence, so no MQTT topic maps to it."""
log = logging.getLogger("bridge.storage.rocketmq")

PROP_ORIGIN = "mqtt.origin"
"""On a dispatched copy of a backend message: the original's message id."""


FIND_KEY_ATTEMPTS = 6
"""Look-ups of a key before it counts as not stored (0.25 s apart): only a QoS 2 resend whose
first store is unsettled waits for them, and storing it twice is what they prevent."""


class RocketMQStore:
    """A `MessageStore` over RocketMQ (see the module docstring).

    Owns its lifecycle, the admission of writes and the store contract's reads; its parts are
    the send pipeline (`SendPipeline`, the write path), the keyed records (`StoreMeta`), what it
    knows of its bridge queues (`LmqNames`, `QueueEnds`), of the broker groups (`BrokerGroups`,
    learnt by `GroupLearning`), and the read path (`SharedReads` over `LightQueuePulls`).
    """

    traits = StoreTraits(
        atomic_meta=False,  # meta is made durable before its message is sent
        local_ends=False,  # other nodes and notify write to the same light queues
        early_reads=False,  # a message is read from the broker once the broker has it
        cached_reads=True,  # the last batch pulled of each queue (`SharedReads`)
        exact_backlog_bytes=False,  # bytes are estimated from the average message size
        held_reads=True,
    )
    on_rewind: Callable[[dict[str, int]], None] | None = None
    on_arrival: Callable[[dict[str, int]], None] | None = None
    commit_pass = -1  # each send's callback comes on its own

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
        held_reads: int = 1000,
        max_pending: int = 20_000,
        send_window: int = 256,
        fsync: bool = True,
        meta_segment_bytes: int = 16 * 1024 * 1024,
        session_meta: KeyedRecords | None = None,
        group_refresh: float = 5.0,
        credentials: Credentials | None = None,
        tls: TlsOptions | None = None,
    ) -> None:
        self.namesrv_addr = namesrv_addr
        self.data_dir = Path(data_dir)
        self.node_id = node_id
        self.namespace = namespace
        self.dispatch_topic = (
            f"{escape_name(namespace)}{DISPATCH_TOPIC}" if namespace else DISPATCH_TOPIC
        )
        self._notify_skip = escape_name(node_id) or "bridge"
        """`mqtt_notify_skip` of every message sent here (see "notify" above)."""
        self.send_timeout = send_timeout
        self.max_pending = max_pending
        self.send_window = send_window
        self._meta = StoreMeta(
            self.data_dir / "meta",
            fsync=fsync,
            segment_bytes=meta_segment_bytes,
            session_meta=session_meta,
        )
        self._client = RocketMQClient(
            namesrv_addr,
            client_id=f"{node_id}@{os.getpid()}",
            producer_group=producer_group,
            request_timeout=send_timeout,
            credentials=credentials,
            tls=tls,
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
            credentials=credentials,
            tls=tls,
        )
        self._open = False
        self._closing = False
        self._groups = BrokerGroups()
        self.group_refresh = group_refresh
        self.on_new_groups: Callable[[list[str]], None] | None = None
        """Called with the groups seen for the first time after `open` (the node starts
        reading their parts)."""
        self._refresher: asyncio.Task[None] | None = None
        self._names = LmqNames(namespace)
        self._ends = QueueEnds()
        self._reads = SharedReads()
        self.stats = dict.fromkeys(
            ("sent", "send_failures", "send_timeouts", "unqueued_dropped", "reads"), 0
        )
        self._pipeline = SendPipeline(
            self._client,
            self._groups,
            self._ends,
            self.stats,
            send_timeout=send_timeout,
            send_window=send_window,
        )
        self._learning = GroupLearning(
            self._groups, self._reader, self._client, self._pipeline.forget_targets
        )
        self._pulls = LightQueuePulls(
            self._reader, self._names, self._ends, self._groups, self.stats, read_wait=read_wait
        )
        self._held = HeldReads(self._pulls, self._reads, limit=held_reads, on_arrival=self._arrived)
        self._pulls.on_answer = self._held.answered
        self._pulls.holding = self._held.holds

    @property
    def read_wait(self) -> float:
        """Seconds a read waits for a message this store knows was confirmed (reads.py)."""
        return self._pulls.read_wait

    @property
    def reader_client(self) -> RocketMQClient:
        """The remoting client that reads (notify shares it)."""
        return self._reader

    # --- lifecycle -------------------------------------------------------------------------------

    async def open(self) -> None:
        await self._meta.open_local()
        try:
            await self._meta.open_session()
            await self._client.start()
            await self._reader.start()
            brokers = await self._reader.fetch_cluster_brokers()
            if not any(b.master_addr for b in brokers.values()):
                raise BrokerUnavailable("no master broker is registered", maybe_delivered=False)
            self._learning.learn(brokers)
            await self._client.check_access()
            await self._learning.learn_write_permissions()
            self._ends.avg_size = self._meta.saved_avg_size()
            known = self._meta.known_queues()
            limit = asyncio.Semaphore(64)

            async def fetch(part: str) -> None:
                async with limit:
                    await self._fetch_end(part)

            await asyncio.gather(*(fetch(p) for q in known for p in self.parts(q)))
        except (RocketMQError, OSError, StoreUnavailable) as exc:
            await self._client.close()
            await self._reader.close()
            await self._meta.close_local()
            if isinstance(exc, StoreUnavailable):
                raise
            if isinstance(exc, RemotingError) and exc.authentication_refused:
                raise StoreUnavailable(str(exc)) from exc  # starts with the setting to fix
            raise StoreUnavailable(f"RocketMQ at {self.namesrv_addr} is not usable: {exc}") from exc
        self._open = True
        self._pipeline.start()
        self._refresher = asyncio.get_running_loop().create_task(self._refresh_groups())

    async def close(self) -> None:
        if not self._open:
            return
        self._closing = True
        if self._refresher is not None:
            self._refresher.cancel()
            self._refresher = None
        deadline = time.monotonic() + self.send_timeout + 1.0
        while self._pipeline.pending and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self._open = False
        self._held.close()
        self._pipeline.stop(StoreUnavailable("the store was closed", maybe_stored=True))
        await self._meta.save_avg_size(self._ends.avg_size)
        await self._client.close()
        await self._reader.close()
        await self._meta.close()

    # --- writing ---------------------------------------------------------------------------------

    async def append(
        self,
        message: Message,
        queues: Sequence[str],
        *,
        durable: bool = True,
        meta: Sequence[MetaUpdate] = (),
    ) -> int:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.submit(message, queues, meta=meta, callback=future_callback(future))
        return await future

    def submit(
        self,
        message: Message,
        queues: Sequence[str],
        *,
        meta: Sequence[MetaUpdate] = (),
        callback: DurableCallback,
        early: bool = False,
    ) -> bool:
        """See `MessageStore.submit`: never readable early (`early` is ignored, False is
        returned); a message is read from the broker once it has it."""
        if not self._open or self._closing:
            callback(None, StoreUnavailable("the RocketMQ store is not open"))
            return False
        if self._pipeline.pending >= self.max_pending:
            callback(
                None,
                StoreUnavailable(f"{self.max_pending} messages already wait for the broker"),
            )
            return False
        names = tuple(dict.fromkeys(queues)) if len(queues) > 1 else tuple(queues)
        updates = [*meta, *self._meta.new_queues(names)] if names else list(meta)
        send = self._new_send(message, names, callback)
        if updates:
            send.meta_durable = self._meta.submit_meta(updates)
        self._pipeline.enqueue(send)
        return False

    def submit_delayed(
        self,
        message: Message,
        delay_seconds: int,
        *,
        meta: Sequence[MetaUpdate] = (),
        callback: DurableCallback,
    ) -> None:
        """Store a delayed publish as a RocketMQ timer message (`TimerStore`): the broker holds
        it until its due time, `message.timestamp_ms` (rounded up to the broker's precision),
        then puts it into its topic, where
        notify routes it like a backend's message (no `mqtt.node`, no `mqtt_notify_skip`;
        `mqtt.delayed` says what it is). `callback` as for `submit`, at SEND_OK."""
        if not self._open or self._closing:
            callback(None, StoreUnavailable("the RocketMQ store is not open"))
            return
        if self._pipeline.pending >= self.max_pending:
            callback(
                None, StoreUnavailable(f"{self.max_pending} messages already wait for the broker")
            )
            return
        send = new_send(message, (), "", callback)
        send.properties.pop(PROP_NODE, None)
        send.properties[PROP_DELAYED] = str(delay_seconds)
        send.properties[TIMER_DELIVER_MS] = str(timer_deliver_ms(message.timestamp_ms))
        if meta:
            send.meta_durable = self._meta.submit_meta(list(meta))
        self._pipeline.enqueue(send)

    def append_unqueued(self, message: Message) -> None:
        if not self._open or self._closing:
            raise StoreUnavailable("the RocketMQ store is not open")
        if self._pipeline.pending >= self.max_pending:
            self.stats["unqueued_dropped"] += 1
            raise StoreUnavailable(f"{self.max_pending} messages already wait for the broker")
        self._pipeline.enqueue(self._new_send(message, (), None))

    def _new_send(
        self, message: Message, queues: tuple[str, ...], callback: DurableCallback | None
    ) -> Send:
        remember = self._names.remember
        dispatch = LMQ_DISPATCH_SEPARATOR.join(remember(q) for q in queues) if queues else ""
        return new_send(message, queues, dispatch, callback, self._notify_skip)

    def dispatch(self, message: Message, lmqs: Sequence[str], origin: str) -> asyncio.Future[int]:
        """Send a copy of a message produced outside the bridge into the light queues `lmqs`,
        through notify's dispatch topic (so readers of the message's own topic do not see it
        twice). Resolves to the copy's seq once stored, like `submit`."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        callback = future_callback(future)
        if not self._open or self._closing:
            callback(None, StoreUnavailable("the RocketMQ store is not open"))
            return future
        send = new_send(message, (), "", callback)
        send.topic = self.dispatch_topic
        send.properties[MULTI_DISPATCH] = LMQ_DISPATCH_SEPARATOR.join(lmqs)
        send.properties[PROP_ORIGIN] = origin
        queue_of = self._names.queue_of
        send.queues = tuple(q for q in (queue_of(name) for name in lmqs) if q is not None)
        self._pipeline.enqueue(send)
        return future

    def register_lmq(self, queue: str) -> str:
        """Register the light queue (LMQ name) holding a bridge queue and return its name:
        remembered from now on, so that `queue_of` and `dispatch` map it back."""
        return self._names.remember(queue)

    def queue_of(self, lmq: str) -> str | None:
        """The bridge queue an LMQ holds, if it is one of this store's (namespace)."""
        return self._names.queue_of(lmq)

    async def put_meta(self, updates: Sequence[MetaUpdate], *, durable: bool = True) -> None:
        await self._meta.put_meta(updates, durable=durable)

    def meta(self, kind: str) -> dict[str, bytes]:
        return self._meta.meta(kind)

    # --- broker groups ---------------------------------------------------------------------------

    def parts(self, queue: str) -> tuple[str, ...]:
        """The parts of a bridge queue: one per broker group known (see groups.py)."""
        return self._groups.parts(queue)

    def queue_of_part(self, part: str) -> str | None:
        """The bridge queue a part belongs to; None for a name that is not a part."""
        split = split_part(part)
        return split[1] if split is not None else None

    def upgrade_part(self, queue: str) -> str:
        """The part a position kept under a bridge queue's own name (by a version that read one
        broker group only: the first by name) now belongs to."""
        return self._groups.upgrade_part(queue)

    async def _refresh_groups(self) -> None:
        """Learn broker groups added to (or gone from) the NameServer, every `group_refresh`
        seconds; tell the node about new ones."""
        while True:
            await asyncio.sleep(self.group_refresh)
            new = await self._learning.refresh()
            if new:
                log.info("new broker group(s) %s: reading their parts of every queue", new)
                if self.on_new_groups is not None:
                    try:
                        self.on_new_groups(new)
                    except Exception:
                        log.exception("starting the parts of new broker groups failed")

    # --- reading ---------------------------------------------------------------------------------

    def end_offset(self, queue: str) -> int:
        return self._ends.end(queue)

    def note_end(self, queue: str, end: int) -> None:
        self._ends.note(queue, end)

    async def track_queue(self, queue: str) -> int:
        """Record the queue of part `queue` (a part name, see `parts`) if it is new, and fetch
        the part's end from its broker group. A group no longer registered answers with the
        last end known. A reader follows the part from there (a subscription, a session that
        came back): a read is held at its end (`bridge.storage.rocketmq.held`)."""
        end = await self._fetch_end(queue)
        self._held.answered(queue, end)
        return end

    async def _fetch_end(self, queue: str) -> int:
        """`track_queue` without holding a read: the ends of every queue known when the store
        opens, most of them read by nobody connected."""
        group, bridge_queue = require_part(queue)
        name = self._names.remember(bridge_queue)
        updates = self._meta.new_queues((bridge_queue,))
        if updates:
            await self._meta.put_own(updates)
        if not self._groups.registered(group):
            return self._ends.end(queue)
        try:
            end = await self._reader.max_offset(name, 0, broker_name=group)
        except RocketMQError as exc:
            raise StoreUnavailable(
                f"cannot read the end of {bridge_queue!r} on {group}: {exc}"
            ) from exc
        self._ends.note(queue, end)
        return self._ends.end(queue)

    def backlog(self, queue: str, offset: int) -> tuple[int, int]:
        return self._ends.backlog(queue, offset)

    async def read(self, queue: str, offset: int, limit: int) -> ReadResult:
        if limit <= 0:
            return ReadResult([], offset)
        self._held.read(queue)
        return await self._reads.read(queue, offset, limit, self._pulls.pull)

    def reads_held(self, queue: str) -> bool:
        """Whether a pull is held at the end of part `queue` (`bridge.storage.rocketmq.held`):
        its next message reaches the readers without a wake."""
        return self._held.holds(queue)

    def _arrived(self, ends: dict[str, int]) -> None:
        if self.on_arrival is not None:
            self.on_arrival(ends)

    def read_cached(self, queue: str, offset: int, limit: int) -> ReadResult | None:
        """See `MessageStore.read_cached`: from the last batch pulled of the queue (a held
        read's answer, or another reader's pull), else None."""
        if limit <= 0:
            return ReadResult([], offset)
        self._held.read(queue)
        return self._reads.read_kept(queue, offset, limit)

    async def find_key(self, topic: str, key: str) -> bool:
        """Whether the broker holds a message with this key in the topic's RocketMQ topic, or
        in its timer topic (a delayed publish not yet due is indexed there). The broker indexes
        keys a few milliseconds after storing (a slave that just lost its master may take
        longer), so a miss is checked again for about a second and a half."""
        targets = (rocketmq_topic(topic), TIMER_TOPIC)
        for attempt in range(FIND_KEY_ATTEMPTS):
            exists = False
            for target in targets:
                try:
                    found = await self._reader.query_messages_by_key(target, key)
                except RemotingError as exc:
                    if exc.code == ResponseCode.TOPIC_NOT_EXIST:
                        continue  # nothing was ever stored in that topic
                    raise StoreUnavailable(f"cannot look up message {key!r}: {exc}") from exc
                except RocketMQError as exc:
                    raise StoreUnavailable(f"cannot look up message {key!r}: {exc}") from exc
                exists = True
                keys = (m.properties.get(PROPERTY_KEYS, "").split(KEY_SEPARATOR) for m in found)
                if any(key in k for k in keys):
                    return True
            if not exists:
                return False
            if attempt < FIND_KEY_ATTEMPTS - 1:
                await asyncio.sleep(0.25)
        return False
