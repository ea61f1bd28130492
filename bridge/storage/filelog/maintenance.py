"""Background maintenance of the file-log store: meta snapshots and retention.

`LogMaintenance` is mixed into `FileLogStore` (bridge/storage/filelog.py) and owns what runs
besides reads and group commits: after a commit it decides whether a snapshot or a retention pass
is due and runs it as a background task; a snapshot records the meta records and queue ends as
of a durable position, which is what lets retention delete whole old segments without losing
meta or offsets. The store's state (segments, queues, positions, locks, executors) is created and
owned by `FileLogStore.__init__`/`open`; the annotations below only name the part used here.

Threading: as for the store, every method runs on the event loop thread; file writes and
deletions run in the store's read executor.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bridge.storage.base import StoreUnavailable
from bridge.storage.filelog.files import Segment, remove_files, write_snapshot
from bridge.storage.filelog.index import QueueIndex, RecordCache

log = logging.getLogger("bridge.storage")

SNAPSHOT_NAME = "meta.snapshot"
"""File name of the meta snapshot in the store's data directory."""


class LogMaintenance:
    """Snapshot and retention scheduling for `FileLogStore`; not usable on its own."""

    if TYPE_CHECKING:
        # Owned and initialised by FileLogStore; declared here for the type checker only.
        data_dir: Path
        log_dir: Path
        fsync: bool
        retention_bytes: int
        retention_seconds: float
        retention_check_interval: float
        snapshot_every_bytes: int
        _loop: asyncio.AbstractEventLoop | None
        _rexec: ThreadPoolExecutor | None
        _segments: list[Segment]
        _bases: list[int]
        _pos: int
        _durable: int
        _log_bytes: int
        _queues: dict[str, QueueIndex]
        _meta: dict[str, dict[str, bytes]]
        _cache: RecordCache
        _tasks: set[asyncio.Task[Any]]
        _snapshot_lock: asyncio.Lock
        _retention_lock: asyncio.Lock
        _snapshot_pos: int
        _last_retention_check: float
        _stats: dict[str, float]

        def _check_usable(self) -> None: ...

        def _barrier(self) -> asyncio.Future[Any]: ...

    def _after_commit(self) -> None:
        if self._durable - self._snapshot_pos >= self.snapshot_every_bytes:
            self._spawn(self._snapshot(), "snapshot")
        now = self._loop.time()  # type: ignore[union-attr]
        if now - self._last_retention_check >= self.retention_check_interval:
            self._last_retention_check = now
            if self._retention_victims():
                self._spawn(self._retention(), "retention")

    def _spawn(self, coro: Any, name: str) -> None:
        for task in self._tasks:
            if task.get_name() == name:
                coro.close()
                return
        task = self._loop.create_task(coro, name=name)  # type: ignore[union-attr]
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background %s failed", task.get_name(), exc_info=task.exception())

    async def _snapshot(self) -> bool:
        """Write the meta snapshot as of now (once that position is durable). True on success."""
        async with self._snapshot_lock:
            position = self._pos
            if position == self._snapshot_pos:
                return True
            meta = {kind: dict(records) for kind, records in self._meta.items()}
            ends = {name: q.end for name, q in self._queues.items()}
            try:
                await self._barrier()
                await self._loop.run_in_executor(  # type: ignore[union-attr]
                    self._rexec,
                    write_snapshot,
                    self.data_dir,
                    SNAPSHOT_NAME,
                    position,
                    meta,
                    ends,
                    self.fsync,
                )
            except (StoreUnavailable, OSError) as exc:
                log.error("meta snapshot at position %d failed: %s", position, exc)
                return False
            self._snapshot_pos = max(self._snapshot_pos, position)
            self._stats["snapshots"] += 1
            return True

    def _retention_victims(self) -> list[Segment]:
        """The oldest whole segments retention would delete now (never the active one)."""
        too_old = time.time() - self.retention_seconds
        total = self._log_bytes
        victims = []
        for seg in self._segments[:-1]:
            if seg.base + seg.size > self._durable:
                break
            if total > self.retention_bytes or seg.newest < too_old:
                victims.append(seg)
                total -= seg.size
            else:
                break
        return victims

    async def enforce_retention(self) -> int:
        """Delete the segments retention allows to delete now; returns how many were deleted.

        Runs by itself after commits (at most every `retention_check_interval` seconds); call it
        to apply retention to an idle store.
        """
        self._check_usable()
        return await self._retention()

    async def _retention(self) -> int:
        async with self._retention_lock:
            victims = self._retention_victims()
            if not victims or not await self._snapshot():
                return 0
            count = len(victims)
            if self._segments[:count] != victims:
                return 0
            boundary = self._segments[count].base
            del self._segments[:count]
            del self._bases[:count]
            for q in self._queues.values():
                q.trim_below(boundary)
            self._cache.drop_below(boundary)
            self._log_bytes -= sum(seg.size for seg in victims)
            to_close = []
            for seg in victims:
                seg.deleted = True
                if seg.pins == 0 and seg.fd is not None:
                    to_close.append(seg.fd)
                    seg.fd = None
            self._stats["segments_deleted"] += count
            log.info("retention deleted %d segment(s) below position %d", count, boundary)
            try:
                await self._loop.run_in_executor(  # type: ignore[union-attr]
                    self._rexec,
                    remove_files,
                    self.log_dir,
                    [seg.path for seg in victims],
                    to_close,
                    self.fsync,
                )
            except OSError as exc:
                log.error("deleting old segments failed: %s", exc)
            return count
