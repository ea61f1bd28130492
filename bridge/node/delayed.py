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
* **the embedded store** has no timers, so this module keeps a **due-time index** in the store's
  keyed records (kind `delayed`: message key -> the message, its timestamp the due time),
  written in the same fsynced append as the publish (with the QoS 2 marker, if any). A timer on
  the event loop wakes at the earliest due time; the message is then stored on its queues in
  one append that also deletes its index record, so after a crash either both happened or
  neither: it is delivered once, never twice, whatever the QoS. On start-up the index is read
  back and what is overdue is delivered at once.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from bridge.node.quotas import Quota, Tally, kept_size
from bridge.node.retained import RetainedMessages
from bridge.node.roles import DurableCallback
from bridge.operations.metrics import Metrics
from bridge.state import KIND_DELAYED, decode_message, encode_message
from bridge.storage.base import Message, MessageStore, MetaUpdate, TimerStore

if TYPE_CHECKING:
    from bridge.config import Config

log = logging.getLogger("bridge.node")

RouteSubmit = Callable[[Message, Sequence[MetaUpdate], DurableCallback], None]
"""`Publisher.route_submit`: store a message on its subscribers' queues, call back once durable."""

RETRY_SECONDS = 1.0
"""A delivery the store refused is tried again after this long."""
MAX_SLEEP_SECONDS = 60.0
"""The timer looks again at least this often (a wall-clock step cannot leave it asleep)."""


def delayed_quota(config: Config) -> Quota:
    """The limits of the embedded index the configuration sets (the payloads it holds live in
    memory, so bytes are bounded as well as the count)."""
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
        self._metrics = metrics
        self._retained = retained
        self._route_submit = route_submit
        self.quota = quota
        """The index's limits (`delayed_quota`): count, bytes, bytes per publisher."""
        self.tally = Tally()
        """Count and bytes of the publishes in the index, in total and per publisher."""
        self._records: dict[str, bytes] | None = None
        self._heap: list[tuple[int, str]] = []
        self._firing: set[str] = set()
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
        `Publisher.route_submit`. Synchronous up to the store's submit (keeps packet order)."""
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

        def durable(seq: int | None, error: BaseException | None) -> None:
            if error is None:
                metrics.counters["delayed_scheduled"] += 1
                if self._timers is None:
                    self._count(message)
                    self._push(message.timestamp_ms, message.key)
            on_durable(seq, error)

        if self._timers is not None:
            self._timers.submit_delayed(message, seconds, meta=meta, callback=durable)
            return
        record = MetaUpdate(KIND_DELAYED, message.key, encode_message(message))
        # The publish as received goes into the log (unqueued, like QoS 0 kept for analytics):
        # it carries the index record into the same fsynced append, acknowledged in order.
        self._store.submit(received, (), meta=[record, *meta], callback=durable)

    # -- the embedded index: start, stop, the timer ---------------------------------------------

    def start(self) -> None:
        """Read the index back (embedded store) and arm the timer; overdue publishes go at once.
        Called once the node has restored its sessions, so their subscriptions are routed."""
        if self._timers is not None or self._running:
            return
        self._running = True
        records = self._records = self._store.meta(KIND_DELAYED)
        self.tally.clear()
        for key, data in list(records.items()):
            try:
                message = decode_message(data)
            except (ValueError, KeyError, TypeError) as exc:
                log.error("delayed publish %s: unreadable index record skipped: %s", key, exc)
                continue
            self._count(message)
            self._heap.append((message.timestamp_ms, key))
        heapq.heapify(self._heap)
        if self._heap:
            now = _now_ms()
            log.info(
                "%d delayed publishes pending, %d of them overdue (delivered now)",
                len(self._heap),
                sum(1 for due, _ in self._heap if due <= now),
            )
        self._arm()

    def stop(self) -> None:
        """Stop the timer (what is pending stays in the index for the next start)."""
        self._running = False
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _count(self, message: Message) -> None:
        """`message` waits in the index from now on: count it against the quota."""
        self.tally.add(message.key, message.publisher, kept_size(message.topic, message.payload))

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
        self._handle = None
        records = self._records
        if records is None:
            return
        now = _now_ms()
        heap = self._heap
        while heap and heap[0][0] <= now:
            _due, key = heapq.heappop(heap)
            data = records.get(key)
            if data is None or key in self._firing:
                continue  # delivered already, or on its way
            self._deliver(key, decode_message(data))
        self._arm()

    def _deliver(self, key: str, message: Message) -> None:
        """Store the due message on its subscribers' queues and delete its index record, in one
        append (so a crash cannot deliver it twice); retry later if the store refuses."""
        self._firing.add(key)
        meta = [MetaUpdate(KIND_DELAYED, key, None)]
        if message.retain:
            meta.extend(self._retained.updates(message))
        metrics = self._metrics

        def done(_seq: int | None, error: BaseException | None) -> None:
            self._firing.discard(key)
            if error is None:
                metrics.counters["delayed_delivered"] += 1
                self.tally.remove(key)
                return
            log.warning(
                "delayed publish to %r not delivered yet (retrying in %.0f s): %s",
                message.topic,
                RETRY_SECONDS,
                error,
            )
            self._push(_now_ms() + int(RETRY_SECONDS * 1000), key)

        self._route_submit(message, meta, done)
