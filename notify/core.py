"""notify: reads every message stored in RocketMQ once per cluster and says which queues grew.

A `Notifier` consumes every first-level RocketMQ topic in clustering mode: the members of its
consumer group split the topics' queues among themselves (sorted member ids, queues dealt out
evenly, re-dealt every `refresh_interval`), so each stored message is read by one notifier in
the whole cluster. For each message it reads:

* a message a bridge dispatched into light queues (`INNER_MULTI_DISPATCH`) yields "queue X now
  ends at N" for each of them; these events are merged for `merge_window` seconds (the highest end
  per queue wins) and handed to the sink, which wakes the pull tasks of the clients reading them;
* a message a backend produced straight into RocketMQ (no `mqtt.node` property) is routed like an
  MQTT publish: the sink says which queues match its tag (the MQTT topic), and the notifier sends a
  copy into those queues through the dispatch topic (`dispatch_topic`, which device topics can
  never map to). Its offset is committed only after the copy is stored, so a backend message is
  delivered at least once;
* bridge messages without queues (QoS 0 kept for analytics, messages nobody subscribed to) are
  skipped. A bridge's delayed publish (`mqtt.delayed`, a RocketMQ timer message) carries no
  `mqtt.node`: when the broker puts it into its topic at its due time it is routed as a backend
  message is, once per cluster.

With `skip_filter` (`NOTIFY_FILTER`, as a bridge runs it), pulls carry that SQL92 filter and the
broker keeps back what notify has no work for: every message a bridge stored, whose readers that
bridge wakes itself (locally, and on its peers over the peer links). What is left is the backends'
messages and notify's dispatched copies of them. A broker without `enablePropertyFilter=true`
refuses such pulls; the notifier then says so once and reads everything, unfiltered.

Offsets are committed to the broker (the group's consumer offsets) every `commit_interval`. A
queue the group has no offset for starts at its end if its topic existed when this notifier
started (so a first start does not replay history) and at 0 if the topic appeared later.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from bridge.storage.base import Message
from bridge.storage.rocketmq import (
    DISPATCH_TOPIC,
    PROP_DELAYED,
    PROP_NODE,
    PROPERTY_INNER_MULTI_DISPATCH,
    PullStatus,
    RemotingError,
    ResponseCode,
    RocketMQClient,
    RocketMQError,
    StoredMessage,
    message_of,
)

log = logging.getLogger("notify")


class Sink(Protocol):
    """Where a notifier's findings go (a bridge node, or a link to remote bridges)."""

    def queues_grew(self, ends: dict[str, int], group: str) -> None:
        """LMQ name -> the end its queue has reached on broker group `group` (offset of its
        newest message there + 1)."""

    def route(self, message: Message) -> Sequence[str]:
        """The LMQ names a backend message must be dispatched to (none: nobody subscribes)."""


@dataclass(slots=True)
class _QueueReader:
    topic: str
    broker: str
    queue_id: int
    task: asyncio.Task[None] | None = None
    offset: int = -1
    committed: int = -1


@dataclass
class NotifyStats:
    messages: int = 0
    events: int = 0
    event_batches: int = 0
    dispatched: int = 0
    delayed: int = 0
    """Delayed publishes read when the broker's timer put them into their topic."""
    topics: int = 0
    queues: int = 0
    unfiltered: bool = False
    """The broker refused the skip filter: every message is read."""


def _refuses_filters(error: RocketMQError) -> bool:
    """Whether a pull failed because the broker does not filter on properties (5.3.3 answers
    SYSTEM_ERROR "The broker does not support consumer to filter message by SQL92"), rather than
    for a passing fault."""
    return (
        isinstance(error, RemotingError)
        and error.code == ResponseCode.SYSTEM_ERROR
        and "SQL92" in error.remark
    )


Dispatcher = Callable[[Message, Sequence[str], str], "asyncio.Future[int]"]
"""Sends a copy of a backend message into the given LMQs (message, LMQ names, origin id)."""


class Notifier:
    """One member of the notify consumer group (see the module docstring)."""

    def __init__(
        self,
        client: RocketMQClient,
        sink: Sink,
        dispatch: Dispatcher,
        *,
        group: str = "mqtt-bridge-notify",
        dispatch_topic: str = DISPATCH_TOPIC,
        refresh_interval: float = 2.0,
        merge_window: float = 0.002,
        commit_interval: float = 1.0,
        poll_seconds: float = 10.0,
        batch: int = 64,
        skip_filter: str | None = None,
    ) -> None:
        self.client = client
        self.sink = sink
        self.dispatch = dispatch
        self.group = group
        self.dispatch_topic = dispatch_topic
        self.refresh_interval = refresh_interval
        self.merge_window = merge_window
        self.commit_interval = commit_interval
        self.poll_ms = int(poll_seconds * 1000)
        self.batch = batch
        self.skip_filter = skip_filter
        """The SQL92 filter of every pull (None: read everything); dropped if the broker
        cannot filter on properties."""
        self.stats = NotifyStats()
        self._readers: dict[tuple[str, str, int], _QueueReader] = {}
        self._initial_topics: set[str] | None = None
        self._pending: dict[str, dict[str, int]] = {}
        """Broker group -> LMQ name -> end, not yet told to the sink."""
        self._flush: asyncio.TimerHandle | None = None
        self._main: asyncio.Task[None] | None = None
        self._committer: asyncio.Task[None] | None = None
        self._stopped = False
        self.ready = asyncio.Event()
        """Set after the first rebalance (every queue then has a reader)."""

    # --- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._main = loop.create_task(self._run())
        self._committer = loop.create_task(self._commit_loop())

    async def stop(self) -> None:
        self._stopped = True
        tasks = [t for t in (self._main, self._committer) if t is not None]
        tasks += [r.task for r in self._readers.values() if r.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._flush_events()
        await self._commit()
        try:
            await self.client.unregister_client(self.group)
        except RocketMQError as exc:
            log.debug("notify: leaving group %s: %s", self.group, exc)

    # --- membership and queue assignment --------------------------------------------------------

    async def _run(self) -> None:
        while not self._stopped:
            try:
                await self._rebalance()
                self.ready.set()
            except RocketMQError as exc:
                log.warning("notify: rebalance failed (retrying): %s", exc)
            except Exception:
                log.exception("notify: rebalance failed")
            await asyncio.sleep(self.refresh_interval)

    async def _rebalance(self) -> None:
        topics = await self.client.data_topics()
        if self._initial_topics is None:
            self._initial_topics = set(topics)
        self.client.register_consumer(self.group, topics)
        await self.client.heartbeat()
        mine: set[tuple[str, str, int]] = set()
        for topic in topics:
            try:
                route = await self.client.fetch_route(topic)
            except RemotingError as exc:
                if exc.code == ResponseCode.TOPIC_NOT_EXIST:
                    continue
                raise
            queues = route.read_queues()
            members = await self.client.consumer_ids(self.group, topic) or [self.client.client_id]
            if self.client.client_id not in members:
                members = sorted([*members, self.client.client_id])
            index = members.index(self.client.client_id)
            for i, (broker, qid) in enumerate(queues):
                if i % len(members) == index:
                    mine.add((topic, broker, qid))
        for key in list(self._readers):
            if key not in mine:
                reader = self._readers.pop(key)
                if reader.task is not None:
                    reader.task.cancel()
                await self._commit_reader(reader)
        loop = asyncio.get_running_loop()
        for key in mine:
            if key not in self._readers:
                reader = _QueueReader(*key)
                self._readers[key] = reader
                reader.task = loop.create_task(self._read(reader))
        self.stats.topics = len(topics)
        self.stats.queues = len(self._readers)

    # --- reading ---------------------------------------------------------------------------------

    async def _start_offset(self, reader: _QueueReader) -> int:
        committed = await self.client.query_consumer_offset(
            reader.topic, reader.queue_id, consumer_group=self.group, broker_name=reader.broker
        )
        if committed is not None and committed >= 0:
            return committed
        initial = self._initial_topics or set()
        if reader.topic in initial and reader.topic != self.dispatch_topic:
            return await self.client.max_offset(
                reader.topic, reader.queue_id, broker_name=reader.broker
            )
        return 0

    async def _read(self, reader: _QueueReader) -> None:
        backoff = 0.1
        while not self._stopped:
            try:
                if reader.offset < 0:
                    reader.offset = await self._start_offset(reader)
                    reader.committed = reader.offset
                skip_filter = self.skip_filter
                result = await self.client.pull(
                    reader.topic,
                    reader.queue_id,
                    reader.offset,
                    self.batch,
                    consumer_group=self.group,
                    subscription=skip_filter or "*",
                    expression_type="SQL92" if skip_filter else "TAG",
                    suspend_timeout_ms=self.poll_ms,
                    broker_name=reader.broker,
                )
                backoff = 0.1
            except asyncio.CancelledError:
                raise
            except RocketMQError as exc:
                if skip_filter is not None and _refuses_filters(exc):
                    self._filter_refused(exc)
                    continue
                log.debug("notify: pulling %s/%d failed: %s", reader.topic, reader.queue_id, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            if result.status is PullStatus.FOUND:
                for raw in result.messages:
                    await self._handle(raw, reader.broker)
            if result.status is PullStatus.OFFSET_ILLEGAL:
                log.warning(
                    "notify: %s/%d offset %d out of range, moving to %d",
                    reader.topic,
                    reader.queue_id,
                    reader.offset,
                    result.next_offset,
                )
            reader.offset = max(reader.offset, result.next_offset)

    def _filter_refused(self, error: RocketMQError) -> None:
        """The broker cannot filter on properties: read everything from now on."""
        if self.skip_filter is None:
            return
        self.skip_filter = None
        self.stats.unfiltered = True
        log.warning(
            "notify: the broker refused a property filter (%s); reading every message, the "
            "bridges' own too. Set enablePropertyFilter=true in broker.conf to spare the broker "
            "and the bridges that work",
            error,
        )

    async def _handle(self, raw: StoredMessage, group: str) -> None:
        self.stats.messages += 1
        offsets = raw.lmq_offsets()
        if offsets:
            pending = self._pending.setdefault(group, {})
            for name, offset in offsets.items():
                if offset + 1 > pending.get(name, -1):
                    pending[name] = offset + 1
            if self._flush is None:
                self._flush = asyncio.get_running_loop().call_later(
                    self.merge_window, self._flush_events
                )
            return
        if PROP_NODE in raw.properties or PROPERTY_INNER_MULTI_DISPATCH in raw.properties:
            return  # a bridge's message that no queue needed
        message = message_of(raw)
        if message is None:
            return  # no tag: no MQTT topic, nobody can subscribe to it
        if PROP_DELAYED in raw.properties:
            self.stats.delayed += 1  # a bridge's delayed publish, due now: routed like a backend's
        lmqs = self.sink.route(message)
        if not lmqs:
            return
        # Retried until stored: the offset must not pass a backend message not yet dispatched.
        delay = 0.1
        while True:
            try:
                await self.dispatch(message, lmqs, raw.msg_id)
                self.stats.dispatched += 1
                return
            except Exception as exc:  # StoreUnavailable and the like
                log.warning("notify: dispatching %s failed (retrying): %s", raw.msg_id, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _flush_events(self) -> None:
        self._flush = None
        if not self._pending:
            return
        by_group, self._pending = self._pending, {}
        self.stats.event_batches += 1
        for group, ends in by_group.items():
            self.stats.events += len(ends)
            try:
                self.sink.queues_grew(ends, group)
            except Exception:
                log.exception("notify: the sink failed to take events")

    # --- offsets ---------------------------------------------------------------------------------

    async def _commit_loop(self) -> None:
        while not self._stopped:
            await asyncio.sleep(self.commit_interval)
            await self._commit()

    async def _commit(self) -> None:
        for reader in list(self._readers.values()):
            await self._commit_reader(reader)

    async def _commit_reader(self, reader: _QueueReader) -> None:
        if reader.offset < 0 or reader.offset == reader.committed:
            return
        offset = reader.offset
        try:
            await self.client.update_consumer_offset(
                reader.topic,
                reader.queue_id,
                offset,
                consumer_group=self.group,
                broker_name=reader.broker,
            )
            reader.committed = offset
        except RocketMQError as exc:
            log.debug("notify: committing %s/%d failed: %s", reader.topic, reader.queue_id, exc)
