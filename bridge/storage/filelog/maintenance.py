"""Background maintenance of the file-log store: meta snapshots and retention.

`LogMaintenance` owns what runs besides reads and group commits: after a commit it decides
whether a snapshot or a retention pass is due and runs it as a background task. A snapshot
records the meta records and queue ends as of a durable position, which is what lets retention
delete whole old segments without losing meta or offsets.

Threading: as for the store, every method runs on the event loop thread; file writes and
deletions run in the store's read executor (`run_io`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

from bridge.storage.base import StoreUnavailable
from bridge.storage.filelog.files import RunIO, Segment, remove_files, write_snapshot
from bridge.storage.filelog.index import QueueIndex, RecordCache
from bridge.storage.filelog.segments import SegmentLog

log = logging.getLogger("bridge.storage")

SNAPSHOT_NAME = "meta.snapshot"
"""File name of the meta snapshot in the store's data directory."""


class LogMaintenance:
    """Snapshot and retention scheduling of one `FileLogStore`.

    Handed the store's log, queue indexes, meta records, record cache and stats, its settings,
    `barrier` (a future done once everything appended so far is durable), `run_io` and
    `keep_from` (the oldest position a hold keeps, `LogHolds.keep_from`). Owns the
    snapshot position, the background tasks and the locks that keep one snapshot and one
    retention pass at a time.
    """

    def __init__(
        self,
        log: SegmentLog,
        queues: dict[str, QueueIndex],
        meta: dict[str, dict[str, bytes]],
        cache: RecordCache,
        stats: dict[str, float],
        *,
        data_dir: Path,
        fsync: bool,
        retention_bytes: int,
        retention_seconds: float,
        snapshot_every_bytes: int,
        barrier: Callable[[], Awaitable[Any]],
        run_io: RunIO,
        keep_from: Callable[[], int | None],
    ) -> None:
        self._log = log
        self._queues = queues
        self._meta = meta
        self._cache = cache
        self._stats = stats
        self._data_dir = data_dir
        self._fsync = fsync
        self._retention_bytes = retention_bytes
        self._retention_seconds = retention_seconds
        self._snapshot_every_bytes = snapshot_every_bytes
        self._barrier = barrier
        self._run_io = run_io
        self._keep_from = keep_from
        self._loop: asyncio.AbstractEventLoop | None = None
        self.snapshot_pos = 0
        """The position the meta snapshot on disk was taken at."""
        self._last_retention_check = 0.0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._snapshot_lock = asyncio.Lock()
        self._retention_lock = asyncio.Lock()

    def start(self, loop: asyncio.AbstractEventLoop, snapshot_pos: int) -> None:
        """Begin on `loop`, from the snapshot found at open."""
        self._loop = loop
        self.snapshot_pos = snapshot_pos
        self._last_retention_check = loop.time()

    def after_commit(self, retention_check_interval: float) -> None:
        """Start a snapshot or a retention pass in the background if one is due; whether
        retention has work is checked at most every `retention_check_interval` seconds."""
        loop = self._loop
        assert loop is not None
        if self._log.durable - self.snapshot_pos >= self._snapshot_every_bytes:
            self._spawn(self.snapshot(), "snapshot")
        now = loop.time()
        if now - self._last_retention_check >= retention_check_interval:
            self._last_retention_check = now
            if self._victims():
                self._spawn(self.retention(), "retention")

    async def settle(self) -> None:
        """Wait until no background task runs (their failures are logged, not raised)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        for task in self._tasks:
            if task.get_name() == name:
                coro.close()
                return
        assert self._loop is not None
        task = self._loop.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background %s failed", task.get_name(), exc_info=task.exception())

    async def snapshot(self) -> bool:
        """Write the meta snapshot as of now (once that position is durable). True on success."""
        async with self._snapshot_lock:
            position = self._log.pos
            if position == self.snapshot_pos:
                return True
            meta = {kind: dict(records) for kind, records in self._meta.items()}
            ends = {name: q.end for name, q in self._queues.items()}
            try:
                await self._barrier()
                await self._run_io(
                    write_snapshot,
                    self._data_dir,
                    SNAPSHOT_NAME,
                    position,
                    meta,
                    ends,
                    self._fsync,
                )
            except (StoreUnavailable, OSError) as exc:
                log.error("meta snapshot at position %d failed: %s", position, exc)
                return False
            self.snapshot_pos = max(self.snapshot_pos, position)
            self._stats["snapshots"] += 1
            return True

    def _victims(self) -> list[Segment]:
        """The oldest whole segments retention would delete now (never the active one, nor
        one a hold keeps)."""
        too_old = time.time() - self._retention_seconds
        return self._log.retention_victims(self._retention_bytes, too_old, self._keep_from())

    async def retention(self) -> int:
        """Delete the segments retention allows to delete now (after a snapshot that covers
        them); returns how many were deleted."""
        async with self._retention_lock:
            victims = self._victims()
            if not victims or not await self.snapshot():
                return 0
            count = len(victims)
            if self._victims()[:count] != victims:
                return 0  # the log or a hold changed while the snapshot was written
            boundary = self._log.drop_oldest(count)
            for q in self._queues.values():
                q.trim_below(boundary)
            self._cache.drop_below(boundary)
            to_close = []
            for seg in victims:
                seg.deleted = True
                if seg.pins == 0 and seg.fd is not None:
                    to_close.append(seg.fd)
                    seg.fd = None
            self._stats["segments_deleted"] += count
            log.info("retention deleted %d segment(s) below position %d", count, boundary)
            try:
                await self._run_io(
                    remove_files,
                    self._log.log_dir,
                    [seg.path for seg in victims],
                    to_close,
                    self._fsync,
                )
            except OSError as exc:
                log.error("deleting old segments failed: %s", exc)
            return count
