"""Reads of a light queue shared by all its readers on one node.

Every subscriber of a filter on a node reads the same light queue, usually from the same offset
at about the same time (they were woken by the same message). `SharedReads` makes that one pull:
a read of (queue, offset) while a pull of that same (queue, offset) is on its way waits for that
pull instead of sending its own, and the last batch pulled from each queue is kept for a moment,
so a reader that comes after it (or comes back for messages it read and could not send) is
served from memory. Offsets in a light queue never change, so a kept batch is never stale: a
message removed by retention since is still a valid message to deliver.

Kept batches are bounded in bytes (`max_kept_bytes`, payload and topic of each message), the
least recently used dropped first.

A message the broker confirmed (SEND_OK) reaches its light queues a moment later: the broker
dispatches asynchronously. `pull_dispatched` waits for such a message by pulling again after
short pauses, not with the broker's long poll. A held pull is woken by the message's arrival,
but the broker registers it only after its own read found nothing, so an arrival between the two
is missed, and the pull then waits for the broker's periodic check of held pulls: every 5 s with
long polling on, whatever the pull's own time-out. Under a flood, that held the tail of a
backlog for seconds: a CI run of the stalled-subscriber test acknowledged only 101 messages in
4 s.

`LightQueuePulls` is what a shared read pulls with: one pull of a part's light queue on its
broker group, its answer turned into the store's `Stored` messages (queue ends noted, a miscount
corrected, retention's losses counted).
"""

from __future__ import annotations

import asyncio
import contextlib
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from bridge.storage.base import ReadResult, Stored, StoreUnavailable
from bridge.storage.rocketmq.connection import RocketMQError
from bridge.storage.rocketmq.groups import BrokerGroups, group_seq, part_name, require_part
from bridge.storage.rocketmq.mapping import message_of
from bridge.storage.rocketmq.messages import StoredMessage
from bridge.storage.rocketmq.queues import LmqNames, QueueEnds
from bridge.storage.rocketmq.types import PullResult, PullStatus

__all__ = ["Batch", "LightQueuePulls", "SharedReads", "pull_dispatched"]

DISPATCH_PAUSE_FIRST = 0.001
"""Seconds before the first pull again for a confirmed message not yet in its queue; each pause
after doubles, up to `DISPATCH_PAUSE_MAX`."""
DISPATCH_PAUSE_MAX = 0.05
HOLD_ANSWER_GRACE = 10.0
"""Seconds a held pull's answer may come after its hold time (the broker checks held pulls
every 5 s) before the request is given up as lost."""

Pull = Callable[[str, int, int], Awaitable[ReadResult]]
"""Reads (queue, offset, limit) from the broker."""


async def pull_dispatched(
    pull: Callable[[], Awaitable[PullResult]],
    offset: int,
    wait: float,
    pause: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> PullResult:
    """`pull` (of a light queue from `offset`), again after short pauses while the broker answers
    that nothing is there yet (NO_NEW_MSG, its end not past `offset`), for up to `wait` seconds:
    for a message the store knows was confirmed, not yet dispatched (see above). The last answer
    is returned; NO_NEW_MSG after `wait` means none came. With `wait` 0 it is one pull. `pause`
    waits between pulls (it may end early: a held read of the queue was answered)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    delay = DISPATCH_PAUSE_FIRST
    while True:
        result = await pull()
        if result.status is not PullStatus.NO_NEW_MSG or result.max_offset > offset:
            return result
        left = deadline - loop.time()
        if left <= 0:
            return result
        await pause(min(delay, left))
        delay = min(delay * 2, DISPATCH_PAUSE_MAX)


def _offset(stored: Stored) -> int:
    return stored.offset


@dataclass(slots=True, frozen=True)
class Batch:
    """Messages of one queue with consecutive offsets from `start`, as one pull returned them."""

    start: int
    messages: tuple[Stored, ...]
    size: int
    """Bytes of the messages (payload + topic)."""

    @property
    def end(self) -> int:
        """The offset after the batch's last message."""
        return self.messages[-1].offset + 1

    def from_offset(self, offset: int, limit: int) -> ReadResult | None:
        """Up to `limit` messages from `offset` on, if the batch holds `offset`."""
        if not self.start <= offset < self.end:
            return None
        skip = bisect_left(self.messages, offset, key=_offset)
        part = list(self.messages[skip : skip + limit])
        return ReadResult(part, part[-1].offset + 1)


class SharedReads:
    """One pull per (queue, offset) at a time; the last batch of each queue kept (see above)."""

    __slots__ = ("_inflight", "_kept", "_kept_bytes", "max_kept_bytes", "pull_size", "stats")

    def __init__(self, *, pull_size: int = 64, max_kept_bytes: int = 16 * 1024 * 1024) -> None:
        self.pull_size = pull_size
        """Messages asked for by a pull, at least: readers that join it may want more than the
        first one did."""
        self.max_kept_bytes = max_kept_bytes
        self._inflight: dict[tuple[str, int], asyncio.Future[ReadResult]] = {}
        self._kept: OrderedDict[str, Batch] = OrderedDict()
        self._kept_bytes = 0
        self.stats = {"pulls": 0, "joined": 0, "kept_hits": 0}

    @property
    def kept_bytes(self) -> int:
        """Bytes held in kept batches."""
        return self._kept_bytes

    def read_kept(self, queue: str, offset: int, limit: int) -> ReadResult | None:
        """Up to `limit` messages of `queue` from `offset` if the kept batch holds `offset`
        (without waiting: a reader that keeps up is served in the turn it was woken), else
        None."""
        kept = self._kept.get(queue)
        if kept is None:
            return None
        hit = kept.from_offset(offset, limit)
        if hit is not None:
            self._kept.move_to_end(queue)
            self.stats["kept_hits"] += 1
        return hit

    async def read(self, queue: str, offset: int, limit: int, pull: Pull) -> ReadResult:
        """Up to `limit` messages of `queue` from `offset`: from the kept batch, from a pull of
        the same place already on its way, or from a pull of its own (`pull`)."""
        key = (queue, offset)
        while True:
            kept = self._kept.get(queue)
            if kept is not None:
                hit = kept.from_offset(offset, limit)
                if hit is not None:
                    self._kept.move_to_end(queue)
                    self.stats["kept_hits"] += 1
                    return hit
            pending = self._inflight.get(key)
            if pending is None:
                break
            self.stats["joined"] += 1
            try:
                result = await asyncio.shield(pending)
            except asyncio.CancelledError:
                if pending.cancelled():
                    continue  # its reader was cancelled (disconnected), not this one: again
                raise
            return _first(result, limit)
        future: asyncio.Future[ReadResult] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            result = await pull(queue, offset, max(limit, self.pull_size))
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: the readers that joined get it, nobody else must
            raise
        else:
            future.set_result(result)
        finally:
            del self._inflight[key]
        self.stats["pulls"] += 1
        if result.messages and not result.lost:
            messages = tuple(result.messages)
            self._keep(queue, Batch(offset, messages, sum(m.size for m in messages)))
        return _first(result, limit)

    def keep(self, queue: str, batch: Batch) -> None:
        """Keep `batch` as the last batch of `queue` (a held read's answer, for the readers it
        wakes)."""
        self._keep(queue, batch)

    def _keep(self, queue: str, batch: Batch) -> None:
        old = self._kept.pop(queue, None)
        if old is not None:
            self._kept_bytes -= old.size
        self._kept[queue] = batch
        self._kept_bytes += batch.size
        while self._kept_bytes > self.max_kept_bytes and self._kept:
            _, old = self._kept.popitem(last=False)
            self._kept_bytes -= old.size


def _first(result: ReadResult, limit: int) -> ReadResult:
    """`result` cut to `limit` messages (a shared pull may have read more than one reader
    wants)."""
    if len(result.messages) <= limit:
        return result
    part = result.messages[:limit]
    return ReadResult(part, part[-1].offset + 1, result.lost)


class LightQueueReader(Protocol):
    """What pulls a light queue (the store's reader `RocketMQClient`)."""

    async def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_msgs: int = 32,
        *,
        suspend_timeout_ms: int = 0,
        broker_name: str | None = None,
        timeout: float | None = None,
    ) -> PullResult:
        """Up to `max_msgs` messages of one queue from `offset` (PULL_MESSAGE); with
        `suspend_timeout_ms`, held by the broker until one arrives or that time is up."""
        ...


class LightQueuePulls:
    """Pulls of the parts of bridge queues, as `Stored` messages (module docstring)."""

    def __init__(
        self,
        reader: LightQueueReader,
        names: LmqNames,
        ends: QueueEnds,
        groups: BrokerGroups,
        stats: dict[str, int],
        *,
        read_wait: float,
    ) -> None:
        self.reader = reader
        self.names = names
        self.ends = ends
        self.groups = groups
        self.stats = stats
        """The store's counters: `reads` counts the pulls."""
        self.read_wait = read_wait
        """Seconds a pull waits for a message the store knows was confirmed (see above)."""
        self._arrivals: dict[str, asyncio.Future[None]] = {}
        """Part -> what reads waiting for a dispatch wait on between pulls (`arrived`), for
        the parts `holding` says a read is held at."""
        self.holding: Callable[[str], bool] | None = None
        """Whether a read is held at the end of a part (its answer ends those waits)."""
        self.on_answer: Callable[[str, int], None] | None = None
        """Called with a part and its end in the broker's answer to each pull of it (the store
        holds a read there: `bridge.storage.rocketmq.held`)."""

    async def pull(self, queue: str, offset: int, limit: int) -> ReadResult:
        """One pull of a part's light queue from `offset` (`SharedReads.read` shares it between
        readers)."""
        group, bridge_queue = require_part(queue)
        name = self.names.remember(bridge_queue)
        known_end = self.ends.end(queue)
        # A message confirmed by SEND_OK reaches its LMQs a moment later (the broker dispatches
        # asynchronously): if we know it is there, wait for it briefly (see above) instead of
        # missing it.
        waits = offset < known_end
        self.stats["reads"] += 1
        try:
            result = await pull_dispatched(
                lambda: self.reader.pull(name, 0, offset, limit, broker_name=group),
                offset,
                self.read_wait if waits else 0.0,
                lambda seconds: self._pause(queue, seconds),
            )
        except RocketMQError as exc:
            raise StoreUnavailable(f"cannot read {bridge_queue!r} on {group}: {exc}") from exc
        if self.on_answer is not None:
            self.on_answer(queue, result.max_offset)
        if result.max_offset > 0:
            self.ends.note(queue, result.max_offset)
        if result.status is PullStatus.FOUND:
            messages = self._found(result, name, group, offset)[:limit]
            if not messages:
                return ReadResult([], max(offset, result.next_offset))
            after = messages[-1].offset + 1
            if after < known_end and len(messages) < limit and waits:
                # Found some, but not every one this store knows it sent: the rest is being
                # dispatched. One more pull (waiting as above) returns them with these.
                rest = await self.pull(queue, after, limit - len(messages))
                if rest.messages and rest.messages[0].offset == after:
                    return ReadResult(messages + rest.messages, rest.next_offset)
            return ReadResult(messages, after)
        if waits and result.status is PullStatus.NO_NEW_MSG and result.max_offset <= offset:
            # Waited for a message this store counted and none came: the count was one ahead
            # (a SEND_OK that arrived after a fetch had already counted its message).
            self.ends.correct(queue, result.max_offset, known_end)
        if result.min_offset > offset:
            # Retention removed [offset, min_offset).
            return ReadResult([], result.min_offset, lost=result.min_offset - offset)
        if result.status is PullStatus.NO_MATCHED_MSG and result.next_offset > offset:
            return ReadResult([], result.next_offset)
        return ReadResult([], offset)

    async def _pause(self, queue: str, seconds: float) -> None:
        """Wait `seconds` between the pulls of a read waiting for a dispatch, or until a held
        read of `queue` was answered (the broker has dispatched: pull now)."""
        if self.holding is None or not self.holding(queue):
            await asyncio.sleep(seconds)
            return
        arrival = self._arrivals.get(queue)
        if arrival is None:
            arrival = self._arrivals[queue] = asyncio.get_running_loop().create_future()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(arrival), seconds)

    def arrived(self, queue: str) -> None:
        """A held read of `queue` was answered: the reads waiting for a dispatch pull now."""
        arrival = self._arrivals.pop(queue, None)
        if arrival is not None and not arrival.done():
            arrival.set_result(None)

    async def hold(self, queue: str, offset: int, hold_ms: int, limit: int) -> ReadResult:
        """A pull of a part's light queue from `offset` that the broker holds until a message
        arrives there (answered as it dispatches the message) or `hold_ms` is up: the messages
        from `offset` (none at the time-out), and where to hold next."""
        group, bridge_queue = require_part(queue)
        name = self.names.remember(bridge_queue)
        self.stats["reads"] += 1
        try:
            result = await self.reader.pull(
                name,
                0,
                offset,
                limit,
                suspend_timeout_ms=hold_ms,
                broker_name=group,
                timeout=hold_ms / 1000 + HOLD_ANSWER_GRACE,
            )
        except RocketMQError as exc:
            raise StoreUnavailable(f"cannot read {bridge_queue!r} on {group}: {exc}") from exc
        # Only what it brought is noted (with the keys: this store's own messages among them
        # may have their SEND_OK still to come, QueueEnds.seen), not the broker's end.
        if result.status is PullStatus.FOUND:
            messages = self._found(result, name, group, offset)
            if messages:
                after = messages[-1].offset + 1
                self.ends.seen(queue, [m.message.key for m in messages], after)
                return ReadResult(messages, after)
        if result.max_offset < offset:
            return ReadResult([], result.max_offset)  # asked past the end: hold at the end
        return ReadResult([], max(offset, result.next_offset, result.min_offset))

    def _found(self, result: PullResult, lmq: str, group: str, offset: int) -> list[Stored]:
        """The messages of a FOUND answer from `offset` on, as the store's `Stored`."""
        messages = []
        tag = self.groups.tag(group)
        for raw in result.messages:
            stored = self._stored(raw, lmq, group, tag)
            if stored is not None and stored.offset >= offset:
                messages.append(stored)
        return messages

    def _stored(self, raw: StoredMessage, lmq: str, group: str, tag: int) -> Stored | None:
        offsets = raw.lmq_offsets()
        offset = offsets.get(lmq)
        if offset is None:
            return None
        message = message_of(raw)
        if message is None:
            return None
        queues = []
        for name in offsets:
            queue = self.names.queue_of(name)
            if queue is not None:
                queues.append(part_name(group, queue))
        return Stored(
            offset=offset,
            seq=group_seq(raw.commit_log_offset, tag),
            message=message,
            queues=tuple(queues),
            size=len(message.payload) + len(message.topic.encode()),
        )
