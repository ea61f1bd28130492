"""Reads held at the ends of the light queues this node's readers follow, answered by the broker
as it dispatches a message there.

Without them, a message published on another node reaches this node's subscriber in four hops
after the broker stored it: the broker's SEND_OK to the publishing node, that node's wake over
the peer link, this node's pull, the broker's answer. RocketMQ's own consumers do better: a pull
the broker holds at the end of a queue is answered when the broker dispatches a message into
it (under SYNC_FLUSH, once the message is on disk, the moment SEND_OK can go out), one hop. Measured
with tests/bench/path_steps.py (issue 43): the pull's answer came 1.8 ms after the send at the
median, against 1.1 ms for RocketMQ's Java push consumer on the same broker.

`HeldReads` keeps one such pull on each part readers follow (its end was fetched for them, or
a pull of it answered: `LightQueuePulls` reports where the broker said it ends). Its answer
becomes the part's kept batch in `SharedReads`, where the readers look first (the store's
`read_cached`), and the store tells the node (`on_arrival`), which wakes the part's readers;
then the pull is held again from after what it brought. A part nobody read for `IDLE` seconds
is let go, and at most `limit` parts are held at once (each is a request the broker keeps);
parts beyond that are read as before, when a wake says they grew.

The broker misses a held pull now and then: it registers the pull only after its own read
found nothing, so a message dispatched between the two wakes nobody, and the pull waits for
the broker's check of held pulls, every 5 s. So a peer's wake for a held part is checked a
moment later (`bridge.node.wakes.CHECK_AFTER`): if the held read has not brought the part to
the end the peer announced by then, the end is read from the broker (one GET_MAX_OFFSET) and
the readers behind it are woken.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from bridge.storage.base import StoreUnavailable
from bridge.storage.rocketmq.reads import Batch, LightQueuePulls, SharedReads

__all__ = ["HOLD_MS", "IDLE", "HeldReads"]

log = logging.getLogger(__name__)

HOLD_MS = 20_000
"""How long the broker holds one pull (ms) before it answers that nothing came."""
IDLE = 300.0
"""Seconds without a read of a part after which its held pull is not renewed."""
RETRY_AFTER = 1.0
"""Seconds before a held pull is sent again after the broker could not be reached."""
BATCH = 64
"""Messages a held pull asks for."""


class HeldReads:
    """One held pull per part readers follow (module docstring)."""

    def __init__(
        self,
        pulls: LightQueuePulls,
        reads: SharedReads,
        *,
        limit: int,
        on_arrival: Callable[[dict[str, int]], None],
    ) -> None:
        self._pulls = pulls
        self._reads = reads
        self.limit = limit
        """Parts held at once, at most (0: none)."""
        self._on_arrival = on_arrival
        self._held: dict[str, asyncio.Task[None]] = {}
        self._read_at: dict[str, float] = {}
        self._closed = False
        self.stats = {"held_answers": 0, "held_timeouts": 0}

    def __len__(self) -> int:
        return len(self._held)

    def holds(self, part: str) -> bool:
        """Whether a pull is held at the end of `part`."""
        return part in self._held

    def answered(self, part: str, end: int) -> None:
        """A reader's pull of `part` was answered, the queue ending at `end`: hold a pull
        there unless one is held already (it follows the end itself) or `limit` parts are."""
        if self._closed:
            return
        if part not in self._held:
            if len(self._held) >= self.limit:
                return  # nothing kept for it: only the held parts are remembered
            self._held[part] = asyncio.get_running_loop().create_task(self._hold(part, end))
        self._read_at[part] = time.monotonic()

    def read(self, part: str) -> None:
        """A reader read `part` (from a kept batch too): its held pull is still wanted."""
        if part in self._held:
            self._read_at[part] = time.monotonic()

    async def _hold(self, part: str, offset: int) -> None:
        try:
            while not self._closed:
                began = time.monotonic()
                try:
                    got = await self._pulls.hold(part, offset, HOLD_MS, BATCH)
                except StoreUnavailable as exc:
                    log.debug("held read of %s: %s", part, exc)
                    await asyncio.sleep(RETRY_AFTER)
                    got = None
                if (
                    got is not None
                    and not got.messages
                    and got.next_offset == offset
                    and time.monotonic() - began < RETRY_AFTER
                ):
                    # Answered at once with nothing and nowhere else to hold: a broker that
                    # does not hold this pull. Not again straight away.
                    await asyncio.sleep(RETRY_AFTER)
                if got is not None and got.messages:
                    self.stats["held_answers"] += 1
                    messages = tuple(got.messages)
                    start = messages[0].offset
                    self._reads.keep(part, Batch(start, messages, sum(m.size for m in messages)))
                    offset = got.next_offset
                    self._pulls.arrived(part)
                    self._on_arrival({part: offset})
                    # The readers it woke first: they are served from the kept batch in the
                    # next loop turn, before the pull held again is written.
                    await asyncio.sleep(0)
                elif got is not None:
                    self.stats["held_timeouts"] += 1
                    offset = got.next_offset
                if time.monotonic() - self._read_at.get(part, 0.0) > IDLE:
                    break
        except Exception:
            # Not the readers' loss: they read on wakes as before, and the next answer to one
            # of their pulls holds a read here again.
            log.warning("held read of %s stopped", part, exc_info=True)
        finally:
            self._held.pop(part, None)
            self._read_at.pop(part, None)
            self._pulls.arrived(part)  # a read waiting on it pulls itself now

    def close(self) -> None:
        """Hold nothing more; the broker answers the pulls it holds to a closed connection."""
        self._closed = True
        for task in list(self._held.values()):
            task.cancel()
        self._held.clear()
