"""The file log's group commit: records queued while one write runs are written, and synced,
together by the next.

`GroupCommit` is the write path under `FileLogStore` (store.py), which is this class with the
store contract on top: the store frames a message or a meta update and queues it here
(`_add_record`, with an undo entry and, if someone waits, a waiter), and this class writes
whatever has accumulated as one batch. A fast disk's write and fsync run on the event loop's
thread (a round trip to a worker thread costs more); a slow disk's run on the store's writer
thread until commits are fast again. A batch whose write fails is taken back, in memory and on
disk, before its waiters learn of it; everything after it is taken back too.

When a waited-for batch is synced is the sync policy's (`sync_interval`): with `sync = commit`
each one is, before its waiters learn it is durable; with `sync = interval` its waiters learn it
once it is written to the OS (which a kill -9 of the process cannot take back), and the log is
synced by the first batch taken once the interval since the last sync has passed, or by a timer
when no batch comes (`_sync_due`).

Threading: every method runs on the event loop thread; the write and fsync of a slow batch and
a rollback's file truncation run on the writer thread, which the loop does not touch meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

from bridge.storage.base import StoreUnavailable
from bridge.storage.filelog.files import (
    Segment,
    sync_file,
    truncate_log,
    write_all,
    write_batch,
)
from bridge.storage.filelog.index import QueueIndex, RecordCache
from bridge.storage.filelog.segments import SegmentLog
from bridge.storage.filelog.undo import Undo, Waiter, made_durable, resolve, take_back

log = logging.getLogger("bridge.storage")

COMMIT_AVERAGE_WEIGHT: Final = 0.2
"""Weight of the latest group commit in the running average of their durations."""

SYNC_RETRY_SECONDS: Final = 0.001
"""With `sync = interval`, how soon a sync that found a commit due or running looks again (that
commit may sync nothing: a batch of QoS 0 records only)."""


def _write_all(fd: int, data: bytes | bytearray) -> None:
    """Write all of `data` to `fd` (module level so tests can make it fail)."""
    write_all(fd, data)


def _timed_sync(fd: int) -> float:
    """Sync `fd`'s data; returns the seconds it took (module level so tests can make it fail)."""
    t0 = time.perf_counter()
    sync_file(fd)
    return time.perf_counter() - t0


class Batch:
    """One group commit: what it writes, who waits for it, and where it ends."""

    __slots__ = ("chunks", "deferred", "end", "need_sync", "records", "start", "waiters")

    def __init__(
        self,
        chunks: list[tuple[Segment, bytes]],
        waiters: list[tuple[Waiter, int | None]],
        start: int,
        end: int,
        records: int,
        need_sync: bool,
        deferred: bool,
    ) -> None:
        self.chunks = chunks
        """Each segment's records of this batch, joined into one write."""
        self.waiters = waiters
        """Who waits for a record of this batch (a future or a callback), with its seq."""
        self.start = start
        """The log position durable before this batch: where a failed write is cut back to."""
        self.end = end
        """The log position after this batch: durable once it is written."""
        self.records = records
        """How many undo entries this batch made durable (the oldest ones)."""
        self.need_sync = need_sync
        """Whether it must be synced: someone waits for one of its records, or one is on a
        queue. A batch of QoS 0 messages kept for analytics only is written without a sync."""
        self.deferred = deferred
        """Whether it would need a sync that `sync = interval` put off: the sync is owed within
        the interval (`GroupCommit._sync_due`)."""


class GroupCommit:
    """Records queued for the next commit, the commit itself, and taking back a failed one.

    The state of the write path: the framed records not yet written (`_pending`, by segment),
    who waits for them (`_waiters`; `_inflight` while their batch is written), each record's
    undo entry until it is durable (`_undo`), and whether a commit is due or running
    (`_flushing`). A store that has failed to take back a write, or (`sync = interval`) to
    sync records it acknowledged, is broken (`_broken`) and refuses everything after.
    """

    def __init__(
        self,
        log: SegmentLog,
        queues: dict[str, QueueIndex],
        cache: RecordCache,
        stats: dict[str, float],
        *,
        log_dir: Path,
        fsync: bool,
        segment_bytes: int,
        inline_commit_seconds: float,
        preallocate_bytes: int,
        sync_interval: float = 0.0,
    ) -> None:
        self._log = log
        self._queues = queues
        self._cache = cache
        self._stats = stats
        self.log_dir = log_dir
        self.fsync = fsync
        self.segment_bytes = segment_bytes
        self.inline_commit_seconds = inline_commit_seconds
        """A group commit runs on the event loop's thread while commits take at most this long
        on average (0: always on the writer thread); see `_flush_soon`."""
        self.preallocate_bytes = preallocate_bytes
        """Zeros written after the records whenever the active segment's file grows (never past
        `segment_bytes`), so that the commits after it overwrite them (`files.write_batch`);
        0: none."""
        self.sync_interval = sync_interval if fsync else 0.0
        """`sync = interval`: the most seconds written data waits for its sync (0: `sync =
        commit`, each waited-for batch is synced before its waiters are told)."""
        self._synced_at = 0.0
        """Loop time of the last sync under `sync = interval`."""
        self._sync_timer: asyncio.TimerHandle | None = None
        self._commit_average = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wexec: ThreadPoolExecutor | None = None
        self._broken: BaseException | None = None
        self._pending: list[tuple[Segment, list[bytes]]] = []
        """Each segment's framed records of the next commit (joined once as it is written)."""
        self._pending_bytes = 0
        self._waiters: list[tuple[Waiter, int | None]] = []
        self._inflight: list[tuple[Waiter, int | None]] | None = None
        self._early = False
        """Whether a record was made readable before its commit since the flusher last looked."""
        self.on_rewind: Callable[[dict[str, int]], None] | None = None
        """Called, on the loop and before any other work, with queue -> new end for the queues
        a failed write rolled back below what readers could already read (`submit`'s `early`):
        their readers must go back to that end, since the offsets from it on will be given to
        other messages."""
        self.commit_pass = 0
        """See `MessageStore.commit_pass`: moves before each commit's durability callbacks."""
        self._undo: list[Undo] = []
        self._last_written: Segment | None = None
        self._flushing = False  # a commit is due or running (`_flush_soon`, `_flush_task`)
        self._flush_task: asyncio.Task[None] | None = None

    def _after_commit(self) -> None:
        """Called after each commit's waiters are told (the store checks whether retention has
        work)."""

    def _add_record(self, header: bytes, body: bytes) -> int:
        """Queue a framed record for the next group commit; returns its seq."""
        n = len(header) + len(body)
        seg, seq = self._log.place(n)
        pending = self._pending
        if pending and pending[-1][0] is seg:
            parts = pending[-1][1]
        else:
            parts = []
            pending.append((seg, parts))
        parts.append(header)
        parts.append(body)
        self._pending_bytes += n
        if not self._flushing:
            self._flushing = True
            self._loop.call_soon(self._flush_soon, 2)  # type: ignore[union-attr]
        return seq

    def _barrier(self) -> asyncio.Future[Any]:
        """A future done once everything appended so far is durable (or failed)."""
        fut: asyncio.Future[Any] = self._loop.create_future()  # type: ignore[union-attr]
        if self._pending:
            self._waiters.append((fut, None))
        elif self._inflight is not None:
            self._inflight.append((fut, None))
        else:
            fut.set_result(None)
        return fut

    def _flush_soon(self, yields: int) -> None:
        """The group commit: a loop callback, not a task per commit (a task would cost a fifth
        of a commit's round).

        While records read early wait (`_early`), it first lets `yields` loop turns go, so that
        the readers those records woke send them meanwhile. A fast disk's write and fsync are
        quicker than a round trip to the writer thread, so they run here; a slow disk's go to
        that thread (`_slow_steps`) until the average of synced commits is low again. A batch
        with no sync (QoS 0 messages kept for analytics) stays on the loop."""
        try:
            while self._pending and self._broken is None:
                if self._early and yields > 0:
                    self._loop.call_soon(self._flush_soon, yields - 1)  # type: ignore[union-attr]
                    return
                self._early, yields = False, 2
                batch = self._take_batch()  # what is appended from here on is the next batch
                inline = self.inline_commit_seconds
                if inline <= 0 or (batch.need_sync and self._commit_average > inline):
                    self._slow_commit(batch, None)
                    return
                try:
                    seconds, fsyncs = write_batch(*self._write_args(batch))
                except Exception as exc:
                    self._slow_commit(batch, exc)
                    return
                self._committed(batch, seconds, fsyncs)
        except BaseException:
            self._flushing = False  # a bug's exception: the next append commits again, no hang
            raise
        if self._broken is not None:
            waiters, self._waiters, self._pending = self._waiters, [], []
            resolve(waiters, StoreUnavailable(f"the store failed: {self._broken}"))
        self._flushing = False

    def _slow_commit(self, batch: Batch, error: BaseException | None) -> None:
        """Hand `batch` to `_slow_steps` in a task (`_flush_task`, which `close` waits for)."""
        slow = self._off_the_loop(self._slow_steps(batch, error))
        self._flush_task = self._loop.create_task(slow)  # type: ignore[union-attr]

    async def _off_the_loop(self, step: Coroutine[Any, Any, None]) -> None:
        """Run a step that waits for the writer thread (a commit, its rollback, a sync) while
        commits wait (`_flushing`); then the batches queued meanwhile."""
        try:
            await step
        except BaseException:
            self._flushing = False
            raise
        finally:
            self._flush_task = None
        self._flush_soon(2)

    async def _slow_steps(self, batch: Batch, error: BaseException | None) -> None:
        """A batch's commit on the writer thread, or the rollback of its failed write (`error`)."""
        if error is None:
            try:
                seconds, fsyncs = await self._loop.run_in_executor(  # type: ignore[union-attr]
                    self._wexec, write_batch, *self._write_args(batch)
                )
            except Exception as exc:
                error = exc
            else:
                self._committed(batch, seconds, fsyncs)
        if error is not None:
            await self._write_failed(batch.start, error)

    def _write_args(self, batch: Batch) -> tuple[Any, ...]:
        """`files.write_batch`'s arguments for `batch`, taken on the loop: on the writer thread
        too, the batch is written as the loop saw the log when it took the batch."""
        return (
            batch.chunks,
            self.log_dir,
            self.fsync,
            _write_all,
            batch.need_sync,
            self._last_written,
            self.preallocate_bytes,
            self.segment_bytes,
        )

    def _take_batch(self) -> Batch:
        need_sync = bool(self._waiters) or any(u[1] for u in self._undo)
        deferred = False
        if need_sync and self.sync_interval > 0.0:
            # `sync = interval`: synced only once the interval since the last sync has passed
            # (everything written before it reaches the disk with it); else written only.
            need_sync = self._loop.time() - self._synced_at >= self.sync_interval  # type: ignore[union-attr]
            deferred = not need_sync
        chunks = [(seg, b"".join(parts)) for seg, parts in self._pending]
        waiters = self._inflight = self._waiters
        self._pending, self._waiters, self._pending_bytes = [], [], 0
        log_ = self._log
        return Batch(chunks, waiters, log_.durable, log_.pos, len(self._undo), need_sync, deferred)

    def _committed(self, batch: Batch, seconds: float, fsyncs: int) -> None:
        """A batch is written (and synced): its records become durable, its waiters are told."""
        end = batch.end
        records = batch.records
        if batch.need_sync:
            self._commit_average += (seconds - self._commit_average) * COMMIT_AVERAGE_WEIGHT
        if self.sync_interval > 0.0:
            if batch.need_sync:
                self._synced_at = self._loop.time()  # type: ignore[union-attr]
            elif batch.deferred and self._sync_timer is None:
                self._sync_timer = self._loop.call_at(  # type: ignore[union-attr]
                    self._synced_at + self.sync_interval, self._sync_due
                )
        self._inflight = None
        self._last_written = batch.chunks[-1][0]
        self._log.durable = end
        made_durable(self._undo, records)
        self._cache.evict(end)
        stats = self._stats
        stats["commits"] += 1
        stats["fsyncs"] += fsyncs
        stats["committed_bytes"] += end - batch.start
        stats["last_commit_seconds"] = seconds
        stats["last_commit_records"] = records
        self.commit_pass += 1
        resolve(batch.waiters, None)
        self._after_commit()

    # -- sync = interval --------------------------------------------------------------------------

    def _sync_due(self) -> None:
        """`sync = interval`: the interval since the last sync has passed, and no batch taken
        since synced what was written: sync the log now (the last segment written; each earlier
        one was synced before a later one was written). On the loop while commits are fast, as
        they run, else on the writer thread; commits wait meanwhile."""
        self._sync_timer = None
        seg = self._last_written
        if seg is None or not seg.unsynced or seg.fd is None or self._broken is not None:
            return
        loop = self._loop
        assert loop is not None
        if self._flushing:
            # A commit is due or running; it may sync nothing (QoS 0 records only): look again.
            self._sync_timer = loop.call_later(SYNC_RETRY_SECONDS, self._sync_due)
            return
        inline = self.inline_commit_seconds
        if inline <= 0 or self._commit_average > inline:
            self._flushing = True
            self._flush_task = loop.create_task(self._off_the_loop(self._slow_sync(seg, seg.fd)))
            return
        sync = _timed_sync  # looked up as the module holds it: tests replace it to fail
        try:
            seconds = sync(seg.fd)
        except OSError as exc:
            self._sync_failed(exc)
            return
        self._synced(seg, seconds)

    async def _slow_sync(self, seg: Segment, fd: int) -> None:
        """`_sync_due`'s sync of `seg` (its descriptor `fd`) on the writer thread."""
        try:
            seconds = await self._loop.run_in_executor(  # type: ignore[union-attr]
                self._wexec, _timed_sync, fd
            )
        except OSError as exc:
            self._sync_failed(exc)
        else:
            self._synced(seg, seconds)

    def _synced(self, seg: Segment, seconds: float) -> None:
        seg.unsynced = False
        self._synced_at = self._loop.time()  # type: ignore[union-attr]
        self._commit_average += (seconds - self._commit_average) * COMMIT_AVERAGE_WEIGHT
        self._stats["fsyncs"] += 1

    def _sync_failed(self, exc: OSError) -> None:
        """A sync of written, acknowledged records failed: they may never reach the disk, and
        after a failed fdatasync the kernel may have dropped the pages it could not write while
        reporting the next sync clean. Nothing more is acknowledged on this log: every later
        write fails, and the node must be restarted (recovery reads what the disk holds)."""
        self._stats["write_errors"] += 1
        log.critical(
            "syncing the log failed (%s): acknowledged messages written since the last sync may "
            "not be on the disk; the store refuses every write from now on, restart the node",
            exc,
        )
        self._broken = exc

    def _stop_syncing(self) -> None:
        """The store closes (and syncs whatever is unsynced as it closes its segments)."""
        if self._sync_timer is not None:
            self._sync_timer.cancel()
            self._sync_timer = None

    async def _write_failed(self, start: int, exc: BaseException) -> None:
        """Undo everything from `start` on, in memory and on disk, and fail its waiters."""
        self._stats["write_errors"] += 1
        log.error("log write at position %d failed: %s; rolling back", start, exc)
        waiters = (self._inflight or []) + self._waiters
        self._inflight, self._pending, self._waiters, self._pending_bytes = None, [], [], 0
        rewound = take_back(self._undo, self._queues)
        if rewound:
            log.warning(
                "%d queues held messages readable before this failed write; readers go back",
                len(rewound),
            )
            if self.on_rewind is not None:
                try:
                    self.on_rewind(rewound)
                except Exception:
                    log.exception("rewinding the readers of rolled back messages failed")
        self._cache.drop_from(start)
        removed, last, keep = self._log.truncate(start)
        self._last_written = None
        try:
            await self._loop.run_in_executor(  # type: ignore[union-attr]
                self._wexec, truncate_log, removed, last, keep, self.log_dir, self.fsync
            )
        except OSError as exc2:
            log.critical("cannot roll the log back after a failed write: %s", exc2)
            self._broken = exc2
        # Waiters learn of the failure only once the rollback is done.
        resolve(waiters, StoreUnavailable(f"writing the log failed: {exc}"))
