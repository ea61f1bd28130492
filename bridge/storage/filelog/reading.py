"""The file-log store's read path: a queue's messages from the record cache or the segments.

A reader that keeps up finds what it reads in the cache of recent records (no I/O, no copy).
Older records are read from their segment files in a worker thread, in runs of adjacent records
(at most `_MAX_READ_RUN` bytes each); the segments read are pinned meanwhile, so retention may
delete them but closes their descriptors only once the read is done.
"""

from __future__ import annotations

import os

from bridge.storage.base import ReadResult, Stored, StoreUnavailable
from bridge.storage.filelog.files import RunIO, Segment, read_records
from bridge.storage.filelog.index import HOLE, CacheEntry, QueueIndex, RecordCache
from bridge.storage.filelog.segments import SegmentLog

__all__ = ["LogReader"]

_MAX_READ_RUN = 4 * 1024 * 1024


class LogReader:
    """Reads of one `FileLogStore`'s queues.

    Handed the store's log, queue indexes, record cache and stats (it counts "disk_reads"), and
    `run_io`, which runs file reads in the store's read executor.
    """

    def __init__(
        self,
        log: SegmentLog,
        queues: dict[str, QueueIndex],
        cache: RecordCache,
        stats: dict[str, float],
        run_io: RunIO,
    ) -> None:
        self._log = log
        self._queues = queues
        self._cache = cache
        self._stats = stats
        self._run_io = run_io

    def read_cached(self, queue: str, offset: int, limit: int) -> ReadResult | None:
        """`read` when what it returns first is in the record cache (a reader that keeps up),
        without awaiting; None when the first record must come from the disk."""
        start = self._start(queue, offset, limit)
        if isinstance(start, ReadResult):
            return start
        return self._from_cache(*start)

    def _from_cache(self, q: QueueIndex, offset: int, lost: int, stop: int) -> ReadResult | None:
        """The records from `offset` on that the cache holds, up to the first it does not; None
        when it does not hold the first one."""
        messages: list[Stored] = []
        entries = self._cache.entries
        seqs = q.seqs
        base = q.base
        o = offset
        while o < stop:
            seq = seqs[o - base]
            if seq == HOLE:
                return ReadResult(messages, o, lost)
            entry = entries.get(seq)
            if entry is None:
                break
            messages.append(Stored(o, seq, entry[0], entry[1], entry[2]))
            o += 1
        if messages or o >= stop:
            return ReadResult(messages, o, lost)  # the rest comes with the next read
        return None

    def _start(
        self, queue: str, offset: int, limit: int
    ) -> ReadResult | tuple[QueueIndex, int, int, int]:
        """Where a read begins: the queue's index, the first offset still held, how many before
        it retention removed, and where the read stops; or the whole (empty) result."""
        if offset < 0 or limit < 0:
            raise ValueError("offset and limit must not be negative")
        q = self._queues.get(queue)
        if q is None or limit == 0:
            return ReadResult([], offset)
        lost = 0
        if offset < q.first:
            lost = q.first - offset
            offset = q.first
        end = q.visible
        while offset < end and q.seqs[offset - q.base] == HOLE:
            lost += 1
            offset += 1
        return q, offset, lost, min(end, offset + limit)

    async def read(self, queue: str, offset: int, limit: int) -> ReadResult:
        """Up to `limit` durable messages of `queue` from `offset` on (see `MessageStore.read`)."""
        start = self._start(queue, offset, limit)
        if isinstance(start, ReadResult):
            return start
        cached = self._from_cache(*start)
        if cached is not None:
            return cached
        q, o, lost, stop = start
        messages: list[Stored] = []
        wanted: list[tuple[int, int, int, int]] = []
        while o < stop:
            seq, length, size = q.entry(o)
            if seq == HOLE:
                break
            wanted.append((o, seq, length, size))
            o += 1
        cache = self._cache
        found: dict[int, CacheEntry] = {}
        misses = []
        for _, seq, length, size in wanted:
            entry = cache.get(seq)
            if entry is None:
                misses.append((seq, length, size))
            else:
                found[seq] = entry
        if misses:
            # Only durable records go past this await: a failed write rolls back the records
            # read early (`FileLogStore.submit`), and this read must not return them after it.
            durable = q.durable
            if o > durable:
                wanted = [w for w in wanted if w[0] < durable]
                o = durable
            found.update(await self._read_disk(misses))
        for off, seq, _, size in wanted:
            message, queues, _ = found[seq]
            messages.append(Stored(off, seq, message, queues, size))
        return ReadResult(messages, o, lost)

    async def _read_disk(self, misses: list[tuple[int, int, int]]) -> dict[int, CacheEntry]:
        """Read records below the durable position from their segment files (worker thread)."""
        runs: list[tuple[int, int, list[tuple[int, int]]]] = []
        pinned: list[Segment] = []
        run_seg = None
        run_end = -1
        for seq, length, _ in misses:
            seg = self._log.segment_of(seq)
            if seg.fd is None:
                raise StoreUnavailable(f"segment of record {seq} is not readable")
            fd_pos = seq - seg.base
            if seg is run_seg and seq == run_end and fd_pos + length - runs[-1][1] <= _MAX_READ_RUN:
                runs[-1][2].append((seq, length))
            else:
                if seg is not run_seg:
                    seg.pins += 1
                    pinned.append(seg)
                runs.append((seg.fd, fd_pos, [(seq, length)]))
                run_seg = seg
            run_end = seq + length
        self._stats["disk_reads"] += len(runs)
        try:
            found: dict[int, CacheEntry] = await self._run_io(read_records, runs)
            return found
        except (OSError, ValueError) as exc:
            raise StoreUnavailable(f"reading the log failed: {exc}") from exc
        finally:
            for seg in pinned:
                seg.pins -= 1
                if seg.pins == 0 and seg.deleted and seg.fd is not None:
                    os.close(seg.fd)
                    seg.fd = None
