"""File-level parts of the file-log store: segments, recovery at open, reads, snapshot writes.

Everything here runs in a worker thread of the store.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import zlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridge.private_files import FILE_MODE, make_private_dir
from bridge.storage.filelog.index import CacheEntry, QueueIndex
from bridge.storage.records import (
    HEADER,
    HEADER_SIZE,
    MAX_BODY,
    TYPE_MESSAGE,
    RecordError,
    decode_body,
    decode_snapshot,
    encode_snapshot,
)

log = logging.getLogger("bridge.storage")

_SCAN_CHUNK = 4 * 1024 * 1024

PREALLOCATED = "zeros written ahead"
"""Why a scan of a segment stopped at a header of zeros: the end of its records."""

_ZEROS = bytes(HEADER_SIZE)

RunIO = Callable[..., Awaitable[Any]]
"""How the store's parts run a function of this module: `await run_io(fn, *args)` calls
`fn(*args)` in a worker thread of the store and returns its result."""


class Segment:
    """One log file `{base:020d}.log`; `size` counts every byte appended, pending included."""

    __slots__ = (
        "allocated", "base", "deleted", "fd", "newest", "path", "pins", "size", "unsynced",
        "written",
    )  # fmt: skip

    def __init__(self, base: int, path: Path, fd: int | None, size: int, newest: float) -> None:
        self.base = base
        self.path = path
        self.fd = fd
        """Open descriptor, its file offset at `written`; None until the writer creates it."""
        self.size = size
        self.written = size
        """Bytes of records in the file (`size` without the pending ones)."""
        self.allocated = size
        """Length of the file: `written`, then zeros written ahead (see `write_batch`)."""
        self.newest = newest
        """Wall-clock time of the newest record (file mtime after a restart)."""
        self.pins = 0
        """Reads in flight; a deleted segment's descriptor is closed when this drops to 0."""
        self.deleted = False
        self.unsynced = False
        """Written without fsync (a batch nobody waited for); synced before any later segment."""


@dataclass
class Recovered:
    segments: list[Segment]
    queues: dict[str, QueueIndex] = field(default_factory=dict)
    meta: dict[str, dict[str, bytes]] = field(default_factory=dict)
    snapshot_pos: int = 0


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def sync_file(fd: int) -> None:
    fdatasync = getattr(os, "fdatasync", None)
    if fdatasync is not None:
        fdatasync(fd)
    else:  # pragma: no cover - macOS, Windows
        os.fsync(fd)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_batch(
    chunks: list[tuple[Segment, bytes]],
    log_dir: Path,
    fsync: bool,
    write: Callable[[int, bytes], None] = write_all,
    need_sync: bool = True,
    previous: Segment | None = None,
    preallocate: int = 0,
    segment_bytes: int = 0,
) -> tuple[float, int]:
    """Write (and fsync) one group commit, segment by segment, in order.

    With `need_sync` False (nothing in the batch is waited for: QoS 0 records, lazy offsets) the
    last segment is left unsynced; the next synced batch covers it. A segment is always synced
    before a later one is written, so a crash leaves a prefix of the log, never a hole; `previous`
    is the segment the last batch wrote, which may still be unsynced.
    Returns (seconds taken, fsyncs done). Creates the file of a new segment on first use.

    With `preallocate` > 0, a write that makes the file longer also writes that many zeros after
    it (real zeros, not a hole; never past `segment_bytes`): the commits after it overwrite them,
    and their fdatasync has no file length to record, only data. On ext4 here that is 0.2 ms
    instead of 0.3-0.5 ms (docs/performance/2026-11-26-one-node-passes-1-2.md, "Second pass").
    A closed segment is cut back to its records.
    """
    t0 = time.perf_counter()
    fsyncs = 0
    last = len(chunks) - 1
    for i, (seg, data) in enumerate(chunks):
        if previous is not None and previous is not seg:
            if previous.allocated > previous.written and previous.fd is not None:
                os.ftruncate(previous.fd, previous.written)  # closed: no zeros after its records
                previous.allocated = previous.written
            if fsync and previous.unsynced:
                if previous.fd is not None:
                    sync_file(previous.fd)
                    fsyncs += 1
                previous.unsynced = False
        if seg.fd is None:
            flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
            seg.fd = os.open(seg.path, flags, FILE_MODE)
            seg.written = seg.allocated = 0
            if fsync:
                fsync_dir(log_dir)
        write(seg.fd, data)
        seg.written += len(data)
        seg.newest = time.time()  # for retention by age; once per commit, not per record
        if seg.written > seg.allocated:
            seg.allocated = seg.written
            ahead = min(preallocate, segment_bytes - seg.written)
            if ahead > 0:
                os.pwrite(seg.fd, bytes(ahead), seg.written)
                seg.allocated += ahead
        if fsync:
            if need_sync or i < last:
                sync_file(seg.fd)
                fsyncs += 1
                seg.unsynced = False
            else:
                seg.unsynced = True
        previous = seg
    return time.perf_counter() - t0, fsyncs


def truncate_log(
    removed: list[Segment], last: Segment, keep: int, log_dir: Path, fsync: bool
) -> None:
    """Undo a failed write: delete segments created for it, cut the last one to `keep` bytes."""
    for seg in removed:
        if seg.fd is not None:
            os.close(seg.fd)
            seg.fd = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(seg.path)
    if last.fd is not None:
        _cut(last, keep, fsync)
        os.lseek(last.fd, keep, os.SEEK_SET)
    if removed and fsync:
        fsync_dir(log_dir)


def _cut(seg: Segment, size: int, fsync: bool) -> None:
    """Cut a segment's file to its first `size` bytes (the records that stay)."""
    assert seg.fd is not None
    os.ftruncate(seg.fd, size)
    if fsync:
        sync_file(seg.fd)
    seg.size = seg.written = seg.allocated = size


def close_segments(segments: list[Segment], fsync: bool) -> None:
    """The store closes: sync what is unsynced, close every descriptor no read holds (a read
    in flight closes its own when it is done: every segment is marked deleted)."""
    for seg in segments:
        seg.deleted = True
        if seg.unsynced and seg.fd is not None and fsync:
            sync_file(seg.fd)
            seg.unsynced = False
        if seg.pins == 0 and seg.fd is not None:
            os.close(seg.fd)
            seg.fd = None


def segment_path(log_dir: Path, base: int) -> Path:
    return log_dir / f"{base:020d}.log"


def list_segments(log_dir: Path) -> list[tuple[int, Path]]:
    """(base, path) of every segment file in `log_dir`, oldest first."""
    found = []
    for name in os.listdir(log_dir):
        stem, dot, ext = name.partition(".")
        if ext == "log" and dot and len(stem) == 20 and stem.isdigit():
            found.append((int(stem), log_dir / name))
    found.sort()
    return found


def _load_snapshot(
    data_dir: Path, name: str
) -> tuple[int, dict[str, dict[str, bytes]], dict[str, int]] | None:
    path = data_dir / name
    tmp = data_dir / (name + ".tmp")
    if tmp.exists():
        tmp.unlink()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return decode_snapshot(data)
    except RecordError as exc:
        log.error(
            "ignoring corrupt meta snapshot %s (%s): replaying meta from the start of the log; "
            "meta records in segments already deleted by retention are lost",
            path,
            exc,
        )
        return None


class _Replayer:
    """Rebuilds queue indexes and meta from the records of the segments, in log order."""

    def __init__(
        self, queues: dict[str, QueueIndex], meta: dict[str, dict[str, bytes]], snapshot_pos: int
    ) -> None:
        self.queues = queues
        self.meta = meta
        self.snapshot_pos = snapshot_pos

    def scan(self, fd: int, base: int, limit: int) -> tuple[int, str]:
        """Replay the records in the first `limit` bytes; returns (good bytes, why it stopped)."""
        pos = 0
        buf = b""
        bstart = 0
        while pos < limit:
            rel = pos - bstart
            if rel + HEADER_SIZE > len(buf):
                buf = os.pread(fd, min(_SCAN_CHUNK, limit - pos), pos)
                bstart, rel = pos, 0
                if len(buf) < HEADER_SIZE:
                    return pos, "incomplete record header"
            length, crc = HEADER.unpack_from(buf, rel)
            total = HEADER_SIZE + length
            if length == 0 and crc == 0:
                return pos, PREALLOCATED
            if length < 2 or length > MAX_BODY:
                return pos, f"invalid record length {length}"
            if pos + total > limit:
                return pos, f"record of {total} bytes cut off by the end of the file"
            if rel + total > len(buf):
                buf = os.pread(fd, max(total, min(_SCAN_CHUNK, limit - pos)), pos)
                bstart, rel = pos, 0
                if len(buf) < total:
                    return pos, "short read"
            body = memoryview(buf)[rel + HEADER_SIZE : rel + total]
            if zlib.crc32(body) != crc:
                return pos, "CRC mismatch"
            try:
                record = decode_body(body, payload=False)
            except RecordError as exc:
                return pos, f"undecodable record: {exc}"
            seq = base + pos
            if record.type == TYPE_MESSAGE:
                for name, offset in record.queues:
                    self._index(name, offset, seq, total, record.size)
            if record.meta and seq >= self.snapshot_pos:
                meta = self.meta
                for update in record.meta:
                    if update.value is None:
                        meta.get(update.kind, {}).pop(update.key, None)
                    else:
                        meta.setdefault(update.kind, {})[update.key] = update.value
            pos += total
        return pos, ""

    def _index(self, name: str, offset: int, seq: int, length: int, size: int) -> None:
        q = self.queues.get(name)
        if q is None:
            q = self.queues[name] = QueueIndex(offset)
        end = q.end
        if offset > end:
            if len(q.seqs) == q.head:
                q.reset(offset)
            else:
                log.warning(
                    "queue %r: offsets %d..%d missing before position %d (lost to corruption)",
                    name,
                    end,
                    offset - 1,
                    seq,
                )
                q.add_holes(offset - end)
        elif offset < end:
            log.error("queue %r: record at position %d repeats offset %d", name, seq, offset)
            return
        q.add(seq, length, size)


def recover(data_dir: Path, log_dir: Path, snapshot_name: str, fsync: bool) -> Recovered:
    """Load the snapshot, replay every segment, cut a torn tail; make the log ready to append."""
    make_private_dir(log_dir)
    snapshot = _load_snapshot(data_dir, snapshot_name)
    snapshot_pos, meta, ends = snapshot if snapshot is not None else (0, {}, {})
    result = Recovered([], meta=meta, snapshot_pos=snapshot_pos)
    replayer = _Replayer(result.queues, meta, snapshot_pos)
    files = list_segments(log_dir)
    try:
        for i, (base, path) in enumerate(files):
            is_last = i == len(files) - 1
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            seg = Segment(base, path, fd, 0, 0.0)
            result.segments.append(seg)
            st = os.fstat(fd)
            seg.newest = st.st_mtime
            seg.size = seg.written = seg.allocated = st.st_size
            limit = st.st_size
            capped = not is_last and base + limit > files[i + 1][0]
            if capped:
                limit = files[i + 1][0] - base
            good, why = replayer.scan(fd, base, limit)
            if not why and good < st.st_size and os.pread(fd, HEADER_SIZE, good) == _ZEROS:
                why = PREALLOCATED  # a closed segment's zeros run past the next one's base
            if why == PREALLOCATED:
                # Zeros written ahead of the records (`write_batch`): the clean end. Cut them
                # off: what a crash left inside them (an unacknowledged batch's bytes) must never
                # follow the records written from here on.
                _cut(seg, good, fsync)
                continue
            if capped:
                log.error("segment %s overlaps the next one; ignoring its excess", path)
            if good == st.st_size:
                continue
            if is_last:
                log.warning(
                    "torn tail in %s: %s at byte %d; keeping %d bytes, truncating %d bytes",
                    path,
                    why,
                    good,
                    good,
                    st.st_size - good,
                )
                _cut(seg, good, fsync)
            else:
                log.error(
                    "corrupt segment %s: %s at byte %d; %d bytes after it are not replayed",
                    path,
                    why,
                    good,
                    st.st_size - good,
                )
        end = result.segments[-1].base + result.segments[-1].size if result.segments else 0
        if snapshot_pos > end or not result.segments:
            if result.segments:
                log.warning(
                    "the log ends at %d but the meta snapshot covers up to %d; continuing at %d",
                    end,
                    snapshot_pos,
                    snapshot_pos,
                )
            base = max(end, snapshot_pos)
            path = segment_path(log_dir, base)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
            result.segments.append(Segment(base, path, fd, os.fstat(fd).st_size, 0.0))
            if fsync:
                fsync_dir(log_dir)
        active = result.segments[-1]
        assert active.fd is not None
        os.lseek(active.fd, active.written, os.SEEK_SET)  # the writer goes on after its records
    except BaseException:
        for seg in result.segments:
            if seg.fd is not None:
                os.close(seg.fd)
        raise
    for name, end_offset in ends.items():
        q = result.queues.get(name)
        if q is None:
            result.queues[name] = QueueIndex(end_offset)
        elif q.end < end_offset:
            log.warning("queue %r ends at %d below the snapshot's %d", name, q.end, end_offset)
            q.add_holes(end_offset - q.end)
    for q in result.queues.values():
        q.visible = q.durable = q.end
    return result


def read_records(runs: list[tuple[int, int, list[tuple[int, int]]]]) -> dict[int, CacheEntry]:
    """Read and decode runs of adjacent records: (fd, file position, [(seq, frame length)])."""
    out: dict[int, CacheEntry] = {}
    for fd, start, records in runs:
        total = sum(length for _, length in records)
        data = os.pread(fd, total, start)
        if len(data) != total:
            raise RecordError(f"short read at {start}: {len(data)} of {total} bytes")
        view = memoryview(data)
        at = 0
        for seq, length in records:
            body_length, crc = HEADER.unpack_from(view, at)
            body = view[at + HEADER_SIZE : at + length]
            if body_length != len(body) or zlib.crc32(body) != crc:
                raise RecordError(f"record at position {seq} fails its CRC check")
            record = decode_body(body)
            assert record.message is not None
            out[seq] = (record.message, tuple(name for name, _ in record.queues), record.size)
            at += length
    return out


def write_snapshot(
    data_dir: Path,
    name: str,
    position: int,
    meta: Mapping[str, Mapping[str, bytes]],
    ends: Mapping[str, int],
    fsync: bool,
) -> None:
    """Write the snapshot to `name`.tmp, fsync it, rename it over `name`, fsync the directory."""
    data = encode_snapshot(position, meta, ends)
    path = data_dir / name
    tmp = data_dir / (name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
    try:
        write_all(fd, data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if fsync:
        fsync_dir(data_dir)


def remove_files(log_dir: Path, paths: list[Path], fds: list[int], fsync: bool) -> None:
    for fd in fds:
        os.close(fd)
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    if fsync:
        fsync_dir(log_dir)
