"""FileLogStore: the embedded message store, one append-only commit log for every topic.

See docs/storage-format.md for the on-disk format and the design. In short: every append becomes
one framed record at the end of the log (its byte position is its `seq`); queues are in-memory
indexes rebuilt from the log at `open`; a single flusher writes and fsyncs whatever accumulated
while the previous write was running (group commit); meta records live in memory and in a
snapshot file that makes old segments deletable.

This module holds the store's lifecycle, the store contract's write side (offsets, the records
of messages and meta updates, who waits for them) and the keyed records. The store is a
`GroupCommit` (commit.py): the group commit under it, which writes what accumulated and takes
back a failed write. Its other parts, each handed what it uses: the segments and positions
(`SegmentLog`, segments.py), the read path (`LogReader`, reading.py), snapshots and retention
(`LogMaintenance`, maintenance.py), the holds retention keeps (`LogHolds`, holds.py); file I/O
run in worker threads is in files.py, the in-memory indexes in index.py, what a failed write
takes back in undo.py.

Threading: every method runs on the event loop thread. Blocking I/O (batch write + fsync, reads
of records no longer cached, snapshot writes, file deletion) runs in the store's own executors.
Objects handed to a worker are not touched by the loop until the worker is done with them.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

from bridge.storage.base import (
    DurableCallback,
    Message,
    MetaUpdate,
    ReadResult,
    StoreTraits,
    StoreUnavailable,
)
from bridge.storage.filelog.commit import GroupCommit
from bridge.storage.filelog.files import Recovered, close_segments, recover
from bridge.storage.filelog.holds import LogHolds
from bridge.storage.filelog.index import QueueIndex, RecordCache
from bridge.storage.filelog.maintenance import SNAPSHOT_NAME, LogMaintenance
from bridge.storage.filelog.reading import LogReader
from bridge.storage.filelog.segments import SegmentLog
from bridge.storage.filelog.undo import apply_meta
from bridge.storage.records import encode_message, encode_meta

log = logging.getLogger("bridge.storage")

MiB = 1024 * 1024
GiB = 1024 * MiB
_COUNTERS = (
    "commits", "fsyncs", "committed_bytes", "last_commit_seconds", "last_commit_records",
    "snapshots", "segments_deleted", "write_errors", "disk_reads",
)  # fmt: skip
"""What `stats` reports, with "appends" (an attribute: it counts every message)."""
_NEW: Final = 0
_OPEN: Final = 1
_CLOSING: Final = 2
_CLOSED: Final = 3


class FileLogStore(GroupCommit):
    """A `MessageStore` keeping everything in one local append-only log. See the module doc.

    Owns the lifecycle, the executors, what a message or meta update becomes on its way to the
    group commit (offsets on its queues, its record, its undo entry, its waiter) and the meta
    records. The commit itself is `GroupCommit`'s; reads, snapshots and retention are done by
    its parts.
    """

    retention_check_interval = 1.0
    """Seconds between the cheap checks (after commits) whether retention has work to do."""

    traits = StoreTraits(
        atomic_meta=True,  # a message and its meta are one record
        local_ends=True,  # this store assigns every offset itself
        early_reads=True,
        cached_reads=True,  # the recent-record cache
        exact_backlog_bytes=True,
    )

    def __init__(
        self,
        data_dir: str | Path,
        *,
        segment_bytes: int = 64 * MiB,
        retention_bytes: int = 1 * GiB,
        retention_seconds: float = 7 * 24 * 3600.0,
        fsync: bool = True,
        cache_bytes: int = 64 * MiB,
        snapshot_every_bytes: int = 16 * MiB,
        inline_commit_seconds: float = 0.001,
        preallocate_bytes: int = 0,
        sync_interval: float = 0.0,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        if segment_bytes <= 0 or retention_bytes < 0 or retention_seconds < 0 or cache_bytes < 0:
            raise ValueError("sizes and durations must not be negative")
        self.data_dir = Path(data_dir)
        log_dir = self.data_dir / "log"
        super().__init__(
            SegmentLog(log_dir, segment_bytes),
            {},
            RecordCache(cache_bytes),
            dict.fromkeys(_COUNTERS, 0),
            log_dir=log_dir,
            fsync=fsync,
            segment_bytes=segment_bytes,
            inline_commit_seconds=inline_commit_seconds,
            preallocate_bytes=preallocate_bytes,
            sync_interval=sync_interval,
        )
        self.retention_bytes = retention_bytes
        self.retention_seconds = retention_seconds
        self.snapshot_every_bytes = snapshot_every_bytes
        self._loop_arg = loop
        self._rexec: ThreadPoolExecutor | None = None
        self._state = _NEW
        self._meta: dict[str, dict[str, bytes]] = {}
        self._appends = 0
        self._reader = LogReader(self._log, self._queues, self._cache, self._stats, self._run_io)
        self.holds = LogHolds(self._queues, self._meta, self._add_meta, self._check_usable)
        """Holds on queues that retention keeps (`HoldingStore`: the node's delayed ones)."""
        self._maintenance = LogMaintenance(
            self._log,
            self._queues,
            self._meta,
            self._cache,
            self._stats,
            data_dir=self.data_dir,
            fsync=fsync,
            retention_bytes=retention_bytes,
            retention_seconds=retention_seconds,
            snapshot_every_bytes=snapshot_every_bytes,
            barrier=self._barrier,
            run_io=self._run_io,
            keep_from=self.holds.keep_from,
        )

    # --- lifecycle -------------------------------------------------------------------------------

    async def open(self) -> None:
        if self._state != _NEW:
            raise RuntimeError("a FileLogStore can be opened once; make a new one to reopen")
        loop = self._loop = self._loop_arg or asyncio.get_running_loop()
        self._wexec = ThreadPoolExecutor(1, thread_name_prefix="filelog-write")
        self._rexec = ThreadPoolExecutor(2, thread_name_prefix="filelog-io")
        try:
            rec: Recovered = await loop.run_in_executor(
                self._wexec, recover, self.data_dir, self.log_dir, SNAPSHOT_NAME, self.fsync
            )
        except OSError as exc:
            self._shutdown_executors()
            self._state = _CLOSED
            raise StoreUnavailable(f"cannot open the log in {self.data_dir}: {exc}") from exc
        self._log.restore(rec.segments)
        # Filled in place: the parts were handed these very dicts.
        self._queues.update(rec.queues)
        self._meta.update(rec.meta)
        self._maintenance.start(loop, rec.snapshot_pos)
        self._state = _OPEN

    async def close(self) -> None:
        if self._state == _NEW:
            self._state = _CLOSED
        if self._state != _OPEN:
            return
        self._state = _CLOSING
        try:
            # A commit is due on the loop (let it run) or its slow steps run in a task (wait
            # for it, shielded: cancelling close must not cancel a commit).
            while self._flushing:
                task = self._flush_task
                if task is not None:
                    await asyncio.shield(task)
                else:
                    await asyncio.sleep(0)
            await self._maintenance.settle()
            if self._broken is None:
                await self._maintenance.snapshot()
        finally:
            self._stop_syncing()
            close_segments(self._log.segments, self.fsync)
            self._shutdown_executors()
            self._state = _CLOSED

    def _shutdown_executors(self) -> None:
        for executor in (self._wexec, self._rexec):
            if executor is not None:
                executor.shutdown(wait=False)

    def _run_io(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Run `fn(*args)` in the read executor (file reads, snapshots, deletions)."""
        return self._loop.run_in_executor(self._rexec, fn, *args)  # type: ignore[union-attr]

    def _after_commit(self) -> None:
        self._maintenance.after_commit(self.retention_check_interval)

    def _check_usable(self) -> None:
        if self._state != _OPEN:
            raise StoreUnavailable("the store is not open")
        if self._broken is not None:
            raise StoreUnavailable(f"the store failed and must be reopened: {self._broken}")

    # --- writing ---------------------------------------------------------------------------------

    async def append(
        self,
        message: Message,
        queues: Sequence[str],
        *,
        durable: bool = True,
        meta: Sequence[MetaUpdate] = (),
    ) -> int:
        if not durable:
            return self._enqueue(message, queues, meta, False)[0]
        loop = self._loop or asyncio.get_running_loop()
        waiter: asyncio.Future[int] = loop.create_future()
        try:
            seq = self._enqueue(message, queues, meta, False)[0]
        except StoreUnavailable as exc:
            waiter.set_exception(exc)
        else:
            self._waiters.append((waiter, seq))
        return await waiter

    def submit(
        self,
        message: Message,
        queues: Sequence[str],
        *,
        meta: Sequence[MetaUpdate] = (),
        callback: DurableCallback,
        early: bool = False,
    ) -> bool:
        """See `MessageStore.submit`; an unusable store calls `callback` with StoreUnavailable
        at once (invalid messages raise ValueError).

        `early`: readers may read the message before it is durable, once every message before
        it on each of its queues may be read (a QoS 0/1 message, which a crash may make its
        publisher send again). Returns whether it could be read at once."""
        try:
            seq, readable = self._enqueue(message, queues, meta, early)
        except StoreUnavailable as exc:
            callback(None, exc)
            return False
        self._waiters.append((callback, seq))
        return readable

    def append_unqueued(self, message: Message) -> None:
        """See `MessageStore.append_unqueued`: no queue entry, no cache entry, no waiter."""
        self._check_usable()
        try:
            header, body = encode_message(message, message.topic.encode(), (), ())
        except (struct.error, OverflowError) as exc:
            raise ValueError(f"message field out of range: {exc}") from None
        self._add_record(header, body)
        self._appends += 1

    def _enqueue(
        self,
        message: Message,
        queues: Sequence[str],
        meta: Sequence[MetaUpdate],
        early: bool,
    ) -> tuple[int, bool]:
        """Assign offsets, apply `meta` and queue the record for the next group commit. Returns
        its `seq` and whether readers may read it now (`early`, and everything before it on
        its queues readable: see `submit`).

        The store keeps a reference to `message` (for readers of the recent-record cache), so
        callers must not modify a message once they have handed it over.
        """
        if self._state != _OPEN or self._broken is not None:
            self._check_usable()
        names: tuple[str, ...] = tuple(dict.fromkeys(queues)) if len(queues) > 1 else tuple(queues)
        index = self._queues
        qlist = []
        offsets = []
        for name in names:
            q = index.get(name)
            if q is None:
                q = QueueIndex()
            qlist.append(q)
            offsets.append((name, q.end))
        topic = message.topic.encode()
        try:
            header, body = encode_message(message, topic, offsets, meta)
        except (struct.error, OverflowError) as exc:
            raise ValueError(f"message field out of range: {exc}") from None
        # Nothing has changed yet; from here on nothing can fail. (An index loop: compiled,
        # `zip(..., strict=True)` is a generic call with a keyword, per message.)
        for i in range(len(names)):
            index.setdefault(names[i], qlist[i])
        length = len(header) + len(body)
        size = len(message.payload) + len(topic)
        seq = self._add_record(header, body)
        readable = early
        for q in qlist:
            if q.visible != q.end:
                readable = False
            q.add(seq, length, size)
        if readable:
            for q in qlist:
                q.visible += 1
            self._early = True
        undo_meta = apply_meta(self._meta, meta) if meta else None
        self._cache.add(seq, length, (message, names, size), self._log.durable)
        self._undo.append((seq, qlist, undo_meta))
        self._appends += 1
        return seq, readable

    async def put_meta(self, updates: Sequence[MetaUpdate], *, durable: bool = True) -> None:
        if durable:
            await self.submit_meta(updates)
            return
        self._check_usable()
        if updates:
            self._add_meta(updates)

    def submit_meta(self, updates: Sequence[MetaUpdate]) -> asyncio.Future[None]:
        """Apply keyed-record updates in memory now; the future completes once they are durable
        (or fails with StoreUnavailable). The synchronous form of `put_meta`, for callers that
        must order the in-memory change with their own work."""
        self._check_usable()
        loop = self._loop or asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        if updates:
            self._add_meta(updates)
            self._waiters.append((waiter, None))
        else:
            waiter.set_result(None)
        return waiter

    def _add_meta(self, updates: Sequence[MetaUpdate]) -> None:
        try:
            header, body = encode_meta(updates)
        except struct.error as exc:
            raise ValueError(f"meta update out of range: {exc}") from None
        seq = self._add_record(header, body)
        self._undo.append((seq, [], apply_meta(self._meta, updates)))

    # --- reading ---------------------------------------------------------------------------------

    def parts(self, queue: str) -> tuple[str, ...]:
        """One log holds every queue: a queue is its only part."""
        return (queue,)

    def queue_of_part(self, part: str) -> str | None:
        return part

    def upgrade_part(self, queue: str) -> str:
        return queue

    def end_offset(self, queue: str) -> int:
        q = self._queues.get(queue)
        return q.visible if q is not None else 0

    async def track_queue(self, queue: str) -> int:
        """Every writer of this store's queues is this store: `end_offset` is the truth."""
        return self.end_offset(queue)

    def note_end(self, queue: str, end: int) -> None:
        """Nothing to learn: this store assigns every offset itself."""

    async def find_key(self, topic: str, key: str) -> bool:
        raise NotImplementedError("meta is atomic with messages here: nothing to settle")

    def backlog(self, queue: str, offset: int) -> tuple[int, int]:
        q = self._queues.get(queue)
        return q.backlog(offset) if q is not None else (0, 0)

    def meta(self, kind: str) -> dict[str, bytes]:
        records = self._meta.get(kind)
        if records is None:
            records = self._meta[kind] = {}
        return records

    async def read(self, queue: str, offset: int, limit: int) -> ReadResult:
        self._check_usable()
        return await self._reader.read(queue, offset, limit)

    def read_cached(self, queue: str, offset: int, limit: int) -> ReadResult | None:
        """`read` without awaiting while its first record is in the record cache (a reader that
        keeps up); None when it needs the disk."""
        self._check_usable()
        return self._reader.read_cached(queue, offset, limit)

    # --- snapshots and retention (LogMaintenance) ---------------------------------------------

    async def enforce_retention(self) -> int:
        """Delete the segments retention allows to delete now; returns how many were deleted.

        Runs by itself after commits (at most every `retention_check_interval` seconds); call it
        to apply retention to an idle store.
        """
        self._check_usable()
        return await self._maintenance.retention()

    # --- introspection ---------------------------------------------------------------------------

    def stats(self) -> dict[str, float]:
        """Counters and gauges: sizes in bytes, `last_commit_seconds` is write+fsync time."""
        out = dict(self._stats)
        out["appends"] = self._appends
        out.update(
            segments=len(self._log.segments),
            bytes_on_disk=self._log.bytes_on_disk,
            log_position=self._log.pos,
            durable_position=self._log.durable,
            snapshot_position=self._maintenance.snapshot_pos,
            pending_bytes=self._pending_bytes,
            queues=len(self._queues),
            cache_bytes=self._cache.bytes,
        )
        return out
