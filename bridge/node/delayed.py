"""Delayed publishes (`$delayed/<seconds>/<topic>`): where they wait, and who delivers them.

A delayed publish is stored when it arrives (PUBACK/PUBREC only once it is durable, like any
QoS 1/2 message) and routed to the subscribers of its target topic at its due time, as if it
were published then: its timestamp is the due time (a Message Expiry Interval counts from it),
and a RETAIN flag makes it the topic's retained message then, not before. The topic form is read
by `bridge.mqtt.delayed`; the publisher calls `DelayedPublishes.submit` instead of routing.

Where it waits depends on the store:

* **a store with timers** (`TimerStore`: RocketMQ) holds it itself: a timer message, which the
  broker puts into the target's RocketMQ topic when due; notify, which reads each queue once per
  cluster, routes it then like a backend's message, to subscribers on every node;
* **the embedded store** has no timers, so the message waits in its log, on a queue of the
  node's own (`DELAYED_QUEUE`), as it arrived (under its `$delayed/...` topic: analytics see
  what arrived), and this module keeps a **due-time index** in the store's keyed records
  (kind `delayed`: message key -> a `DelayedEntry`: due time, offset on that queue,
  publisher, size; no payload). Both go in one fsynced append with the QoS 2 marker, if any.
  The store holds the queue from its oldest message not yet delivered (`QueueHolds`), so
  retention keeps the segments they are in. A timer on the event loop wakes at the earliest
  due time; the message is read back from the log and stored on its queues in one append that
  also deletes its index record, so after a crash either both happened or neither: it is
  delivered once, never twice, whatever the QoS. On start-up the index is read back and what
  is overdue is delivered at once. Memory per pending publish is its index record, a heap
  entry and its quota tally: independent of its payload.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from bridge.counters import Metrics
from bridge.mqtt.delayed import DelayedTopicError, parse_delayed
from bridge.node.quotas import Quota, Tally, kept_size
from bridge.node.retained import RetainedMessages
from bridge.router.queues import DELAYED_QUEUE
from bridge.state import KIND_DELAYED, DelayedEntry
from bridge.storage.base import (
    DurableCallback,
    HoldingStore,
    Message,
    MessageStore,
    MetaUpdate,
    QueueHolds,
    StoreUnavailable,
    TimerStore,
)

if TYPE_CHECKING:
    from bridge.settings import Config

log = logging.getLogger("bridge.node")

RouteSubmit = Callable[[Message, Sequence[MetaUpdate], DurableCallback], None]
"""`Publisher.route_submit`: store a message on its subscribers' queues, call back once durable."""

RETRY_SECONDS = 1.0
"""A delivery the store refused is tried again after this long."""
MAX_SLEEP_SECONDS = 60.0
"""The timer looks again at least this often (a wall-clock step cannot leave it asleep)."""


def delayed_quota(config: Config) -> Quota:
    """The limits of the embedded index the configuration sets (its messages wait in the log:
    the bytes bound the disk they hold, and the segments retention must keep for them)."""
    return Quota(
        config.delayed_max_pending,
        config.delayed_max_bytes,
        0,
        config.delayed_max_bytes_per_client,
        ("delayed_max_pending", "delayed_max_bytes", "", "delayed_max_bytes_per_client"),
    )


def _now_ms() -> int:
    return int(time.time() * 1000)


class DelayedPublishes:
    """This node's delayed publishes: stored on arrival, routed when due (module docstring)."""

    def __init__(
        self,
        *,
        store: MessageStore,
        metrics: Metrics,
        retained: RetainedMessages,
        route_submit: RouteSubmit,
        quota: Quota,
    ) -> None:
        self._store = store
        self._timers: TimerStore | None = store if isinstance(store, TimerStore) else None
        self._holds: QueueHolds | None = None
        if self._timers is None and isinstance(store, HoldingStore):
            self._holds = store.holds
        self._metrics = metrics
        self._retained = retained
        self._route_submit = route_submit
        self.quota = quota
        """The index's limits (`delayed_quota`): count, bytes, bytes per publisher."""
        self.tally = Tally()
        """Count and bytes of the publishes in the index, in total and per publisher."""
        self._records: dict[str, bytes] | None = None
        self._heap: list[tuple[int, str]] = []
        """(due time, key) of the publishes waiting, earliest first (stale entries skipped)."""
        self._unread: set[int] = set()
        """Offsets on the delayed queue of the messages not yet delivered (or being stored)."""
        self._oldest: list[int] = []
        """The same offsets as a heap (stale ones skipped): where the queue is held from."""
        self._firing: set[str] = set()
        """Keys taken off the heap and not yet delivered (read from the log, or being stored)."""
        self._due: deque[str] = deque()
        """Keys due, waiting to be read from the log (by `_reader`), in due order."""
        self._reader: asyncio.Task[None] | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._wake_ms = 0
        self._running = False

    # -- questions ----------------------------------------------------------------------------

    @property
    def broker_timers(self) -> bool:
        """Whether the store's backend holds delayed messages (no index here)."""
        return self._timers is not None

    def pending(self) -> int | None:
        """Delayed publishes waiting in this node's index (None: the broker holds them)."""
        if self._timers is not None:
            return None
        return len(self._records) if self._records is not None else 0

    def refusal(self, topic: str, publisher: str, payload: bytes) -> str | None:
        """Whether a new delayed publish to `topic` from `publisher` is refused: a sentence
        naming the limit the index would pass, or None (always None where the broker holds
        them). The key of a new publish is never in the index: it is counted as one more."""
        if self._timers is not None:
            return None
        if self._holds is None:
            return "this store can neither time nor hold delayed publishes"
        return self.tally.fault_adding("", publisher, kept_size(topic, payload), self.quota)

    # -- storing ------------------------------------------------------------------------------

    def submit(
        self,
        message: Message,
        received_topic: str,
        seconds: int,
        meta: Sequence[MetaUpdate],
        on_durable: DurableCallback,
    ) -> None:
        """Store a delayed publish: `message` is stamped with its target topic and the time it
        arrived (moved here to its due time), `received_topic` the `$delayed/...` topic it came
        on, `meta` what must be durable with it (a QoS 2 marker). `on_durable` as for
        `Publisher.route_submit`. Synchronous up to the store's submit (keeps packet order).
        A store with neither timers nor holds is refused before (`refusal`)."""
        received = Message(
            received_topic,
            message.payload,
            message.qos,
            message.retain,
            message.publisher,
            message.key,
            message.timestamp_ms,
            message.node,
            message.properties,
        )
        message.timestamp_ms += seconds * 1000
        metrics = self._metrics
        if self._timers is not None:

            def scheduled(seq: int | None, error: BaseException | None) -> None:
                if error is None:
                    metrics.inc("delayed_scheduled")
                on_durable(seq, error)

            self._timers.submit_delayed(message, seconds, meta=meta, callback=scheduled)
            return
        holds = self._holds
        assert holds is not None, "refused by `refusal`"
        offset = holds.next_offset(DELAYED_QUEUE)
        key = message.key
        size = kept_size(message.topic, message.payload)
        due = message.timestamp_ms
        self._hold(offset)  # before the append: the hold is durable once the message is

        def durable(seq: int | None, error: BaseException | None) -> None:
            if error is None:
                metrics.inc("delayed_scheduled")
                self.tally.add(key, received.publisher, size)
                self._push(due, key)
            else:
                self._release(offset)
            on_durable(seq, error)

        entry = DelayedEntry(due, offset, received.publisher, size)
        record = MetaUpdate(KIND_DELAYED, key, entry.encode())
        try:
            self._store.submit(received, (DELAYED_QUEUE,), meta=[record, *meta], callback=durable)
        except BaseException:
            self._release(offset)  # an invalid message (ValueError): nothing was stored
            raise

    def _hold(self, offset: int) -> None:
        """The message at `offset` on the delayed queue is not delivered yet: keep it."""
        self._unread.add(offset)
        heapq.heappush(self._oldest, offset)
        self._move_hold()

    def _release(self, offset: int) -> None:
        """The message at `offset` is delivered (or was never stored): retention may take it."""
        self._unread.discard(offset)
        self._move_hold()

    def _move_hold(self) -> None:
        """Hold the delayed queue from its oldest message not yet delivered: at most the
        queue's next offset (a failed write gives back the offsets after its end)."""
        holds = self._holds
        if holds is None:
            return
        oldest, unread = self._oldest, self._unread
        if len(oldest) > 2 * len(unread) + 64:
            # Delivered ones behind an older pending one (a long delay) are dropped here,
            # not only when they reach the top: the heap stays within twice what is pending.
            oldest[:] = unread
            heapq.heapify(oldest)
        while oldest and oldest[0] not in unread:
            heapq.heappop(oldest)
        end = holds.next_offset(DELAYED_QUEUE)
        holds.hold(DELAYED_QUEUE, min(oldest[0], end) if oldest else end)

    # -- the embedded index: start, stop, the timer ---------------------------------------------

    def start(self) -> None:
        """Read the index back (embedded store) and arm the timer; overdue publishes go at once.
        Called once the node has restored its sessions, so their subscriptions are routed."""
        if self._holds is None or self._running:
            return
        self._running = True
        records = self._records = self._store.meta(KIND_DELAYED)
        self.tally.clear()
        for key, data in list(records.items()):
            try:
                entry = DelayedEntry.decode(data)
            except (ValueError, KeyError, TypeError) as exc:
                log.error("delayed publish %s: unreadable index record skipped: %s", key, exc)
                continue
            if isinstance(entry, Message):  # an earlier version's record: the whole message
                self.tally.add(key, entry.publisher, kept_size(entry.topic, entry.payload))
                self._heap.append((entry.timestamp_ms, key))
                continue
            self.tally.add(key, entry.publisher, entry.size)
            self._heap.append((entry.due_ms, key))
            self._unread.add(entry.offset)
            self._oldest.append(entry.offset)
        heapq.heapify(self._heap)
        heapq.heapify(self._oldest)
        self._move_hold()
        if self._heap:
            now = _now_ms()
            log.info(
                "%d delayed publishes pending, %d of them overdue (delivered now)",
                len(self._heap),
                sum(1 for due, _ in self._heap if due <= now),
            )
        self._arm()

    def stop(self) -> None:
        """Stop the timer and the reads (what is pending stays in the index for the next
        start)."""
        self._running = False
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None
        while self._due:
            self._firing.discard(self._due.popleft())

    def _push(self, due: int, key: str) -> None:
        heapq.heappush(self._heap, (due, key))
        if self._running:
            self._arm()

    def _arm(self) -> None:
        """Make the timer wake at the earliest due time (or within MAX_SLEEP_SECONDS)."""
        if not self._heap or not self._running:
            return
        due = self._heap[0][0]
        if self._handle is not None:
            if self._wake_ms <= due:
                return
            self._handle.cancel()
        now = _now_ms()
        sleep_ms = min(max(0, due - now), int(MAX_SLEEP_SECONDS * 1000))
        self._wake_ms = now + sleep_ms
        self._handle = asyncio.get_running_loop().call_later(sleep_ms / 1000, self._fire)

    def _fire(self) -> None:
        """Take what is due off the heap; `_read_due` reads it from the log and delivers it."""
        self._handle = None
        records = self._records
        if records is None:
            return
        now = _now_ms()
        heap = self._heap
        while heap and heap[0][0] <= now:
            _due, key = heapq.heappop(heap)
            if key not in records or key in self._firing:
                continue  # delivered already, or on its way
            self._firing.add(key)
            self._due.append(key)
        if self._due and self._reader is None:
            self._reader = asyncio.get_running_loop().create_task(self._read_due())
        self._arm()

    # -- delivering ---------------------------------------------------------------------------

    async def _read_due(self) -> None:
        """Read the due messages from the log, one by one in due order, and deliver each."""
        try:
            while self._due:
                key = self._due[0]
                data = self._records.get(key) if self._records is not None else None
                message: Message | None = None
                offset = -1
                if data is not None:
                    message, offset = await self._load(key, data)
                self._due.popleft()
                if message is None:
                    self._firing.discard(key)
                else:
                    self._deliver(key, message, offset)
        finally:
            self._reader = None

    async def _load(self, key: str, data: bytes) -> tuple[Message | None, int]:
        """The due message of index record `data`, as routed now (its target topic, stamped
        with its due time), and its offset on the delayed queue (-1: an earlier version's
        record, which holds the message). None if it cannot be delivered now: a read the store
        refused is tried again later, a message lost from the log is dropped with its record."""
        try:
            entry = DelayedEntry.decode(data)
        except (ValueError, KeyError, TypeError) as exc:
            await self._drop(key, -1, f"unreadable index record: {exc}")
            return None, -1
        if isinstance(entry, Message):
            return entry, -1
        try:
            result = await self._store.read(DELAYED_QUEUE, entry.offset, 1)
        except StoreUnavailable as exc:
            self._retry(key, f"reading it from the log failed: {exc}")
            return None, -1
        stored = result.messages[0] if result.messages else None
        if stored is None or stored.offset != entry.offset or stored.message.key != key:
            await self._drop(key, entry.offset, f"not in the log at offset {entry.offset}")
            return None, -1
        received = stored.message
        why = f"{received.topic!r} is not a delayed topic"
        try:
            target = parse_delayed(received.topic)
        except DelayedTopicError as exc:
            target, why = None, exc.why
        if target is None:
            await self._drop(key, entry.offset, why)
            return None, -1
        message = Message(
            target.topic,
            received.payload,
            received.qos,
            received.retain,
            received.publisher,
            received.key,
            entry.due_ms,
            received.node,
            received.properties,
        )
        return message, entry.offset

    async def _drop(self, key: str, offset: int, why: str) -> None:
        """A due publish that can never be delivered: say so, delete its index record."""
        log.error("delayed publish %s dropped: %s", key, why)
        try:
            await self._store.put_meta([MetaUpdate(KIND_DELAYED, key, None)])
        except StoreUnavailable as exc:
            self._retry(key, f"deleting its index record failed: {exc}")
            return
        self.tally.remove(key)
        if offset >= 0:
            self._release(offset)

    def _retry(self, key: str, why: str) -> None:
        log.warning("delayed publish %s not delivered yet (retrying in %.0f s): %s",
                    key, RETRY_SECONDS, why)  # fmt: skip
        self._firing.discard(key)
        self._push(_now_ms() + int(RETRY_SECONDS * 1000), key)

    def _deliver(self, key: str, message: Message, offset: int) -> None:
        """Store the due message on its subscribers' queues and delete its index record, in one
        append (so a crash cannot deliver it twice); retry later if the store refuses. Its
        place on the delayed queue is released once that append is durable."""
        meta = [MetaUpdate(KIND_DELAYED, key, None)]
        if message.retain:
            meta.extend(self._retained.updates(message))
        metrics = self._metrics

        def done(_seq: int | None, error: BaseException | None) -> None:
            if error is None:
                self._firing.discard(key)
                metrics.inc("delayed_delivered")
                self.tally.remove(key)
                if offset >= 0:
                    self._release(offset)
                return
            self._retry(key, f"storing it on its queues failed: {error} ({message.topic!r})")

        self._route_submit(message, meta, done)
