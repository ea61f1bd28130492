"""Reading MQTT messages out of the embedded store's log for the Spark source.

A bridge running on the embedded store (`make run`) writes every message into one commit log
of segment files (docs/storage-format.md). This module reads those files directly, while the
bridge keeps writing: an offset is a record's byte position in the log, so a range
[start, end) is every record between two positions. The newest segment's tail may hold a record
still being written: a scan stops before the first record that is incomplete or fails its CRC,
and only whole records ever fall inside a range.
"""

from __future__ import annotations

import logging
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from bridge.mqtt.topics import topic_matches
from bridge.storage.filelog import list_segments
from bridge.storage.records import (
    HEADER,
    HEADER_SIZE,
    MAX_BODY,
    TYPE_MESSAGE,
    RecordError,
    decode_body,
)
from spark.options import SourceOptions
from spark.rocketmq_reader import DataLossError
from spark.rows import RowBatcher

log = logging.getLogger("spark.embedded")

EMBEDDED = "embedded"
"""The offsets key of the embedded log, and the `broker` column of its rows."""

CHUNK = 4 * 1024 * 1024


def log_directory(path: str) -> Path:
    """The log directory of a bridge data directory (raises FileNotFoundError if none)."""
    directory = Path(path) / "log"
    if not directory.is_dir():
        raise FileNotFoundError(
            f"no embedded store log at {directory} (is {path} a bridge's data_dir?)"
        )
    return directory


@dataclass(frozen=True, slots=True)
class Record:
    position: int
    type: int
    body: memoryview


def _records(path: Path, base: int, start: int, limit: int | None) -> Iterator[Record]:
    """The whole, CRC-checked records of one segment from `start` (a position), stopping at
    the first incomplete or damaged one, or at position `limit`."""
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        rel = start - base
        buf = b""
        buf_at = rel
        while rel + HEADER_SIZE <= size and (limit is None or base + rel < limit):
            if rel + HEADER_SIZE > buf_at + len(buf):
                buf, buf_at = os.pread(f.fileno(), CHUNK, rel), rel
            length, crc = HEADER.unpack_from(buf, rel - buf_at)
            total = HEADER_SIZE + length
            if length < 2 or length > MAX_BODY or rel + total > size:
                return
            if rel + total > buf_at + len(buf):
                buf, buf_at = os.pread(f.fileno(), max(CHUNK, total), rel), rel
                if len(buf) < total:
                    return
            body = memoryview(buf)[rel - buf_at + HEADER_SIZE : rel - buf_at + total]
            if zlib.crc32(body) != crc:
                return
            yield Record(base + rel, body[0], body)
            rel += total


def _segment_ends(segments: list[tuple[int, Path]]) -> list[tuple[int, Path, int | None]]:
    """(base, path, base of the next segment or None for the newest)."""
    nexts: list[int | None] = [b for b, _ in segments[1:]]
    return [(b, p, n) for (b, p), n in zip(segments, [*nexts, None], strict=True)]


def first_position(path: str) -> int:
    segments = list_segments(log_directory(path))
    return segments[0][0] if segments else 0


def scan_end(path: str, start: int, max_messages: int | None = None) -> int:
    """The position after the last whole record from `start` on (across segments), or after
    `max_messages` MESSAGE records if that comes first."""
    position = start
    counted = 0
    for base, seg, next_base in _segment_ends(list_segments(log_directory(path))):
        if next_base is not None and next_base <= position:
            continue
        for record in _records(seg, base, max(position, base), None):
            if max_messages is not None and counted >= max_messages:
                return position
            counted += record.type == TYPE_MESSAGE
            position = record.position + HEADER_SIZE + len(record.body)
    return position


def position_at(path: str, timestamp_ms: int) -> int:
    """The position of the first message published at or after `timestamp_ms` (the end of the
    log if there is none)."""
    position = first_position(path)
    for base, seg, _ in _segment_ends(list_segments(log_directory(path))):
        for record in _records(seg, base, base, None):
            if record.type == TYPE_MESSAGE:
                decoded = decode_body(record.body, payload=False)
                assert decoded.message is not None
                if decoded.message.timestamp_ms >= timestamp_ms:
                    return record.position
            position = record.position + HEADER_SIZE + len(record.body)
    return position


@dataclass(frozen=True, slots=True)
class LogRange:
    """What one Spark task reads: the records between two positions."""

    start: int
    end: int


def split(path: str, start: int, end: int) -> list[LogRange]:
    """[start, end) cut at segment boundaries: one task per segment."""
    pieces = []
    for base, _, next_base in _segment_ends(list_segments(log_directory(path))):
        lo = max(start, base)
        hi = min(end, next_base if next_base is not None else end)
        if lo < hi:
            pieces.append(LogRange(lo, hi))
    if not pieces and start < end:
        pieces.append(LogRange(start, end))
    return pieces


def read_range(options: SourceOptions, part: LogRange) -> Iterator[pa.RecordBatch]:
    """The rows of the messages in [part.start, part.end), in log order, as Arrow batches."""
    assert options.path is not None
    segments = list_segments(log_directory(options.path))
    if not segments or segments[0][0] > part.start:
        first = segments[0][0] if segments else part.end
        _lost(options, part.start, min(first, part.end))
    batcher = RowBatcher()
    for base, seg, next_base in _segment_ends(segments):
        if (next_base is not None and next_base <= part.start) or base >= part.end:
            continue
        try:
            for record in _records(seg, base, max(part.start, base), part.end):
                _add_message(options, batcher, record)
                yield from batcher.full_batches()
        except FileNotFoundError:
            _lost(options, max(part.start, base), min(part.end, next_base or part.end))
    yield from batcher.rest()


def _add_message(options: SourceOptions, batcher: RowBatcher, record: Record) -> None:
    if record.type != TYPE_MESSAGE:
        return
    try:
        message = decode_body(record.body).message
    except RecordError as exc:
        log.warning("skipping undecodable record at %d: %s", record.position, exc)
        return
    assert message is not None
    if not options.matches_all and not topic_matches(options.topic_filter, message.topic):
        return
    ts = message.timestamp_ms
    if options.starting_timestamp is not None and ts < options.starting_timestamp:
        return
    if options.ending_timestamp is not None and ts >= options.ending_timestamp:
        return
    batcher.add(
        message,
        store_time_ms=ts,
        rocketmq_topic=None,
        broker=EMBEDDED,
        queue=0,
        offset=record.position,
    )


def _lost(options: SourceOptions, start: int, end: int) -> None:
    what = f"embedded log positions {start}..{end} were deleted by retention before being read"
    if options.fail_on_data_loss:
        raise DataLossError(what + " (set failOnDataLoss=false to skip lost messages)")
    log.warning("%s; skipped (failOnDataLoss=false)", what)
