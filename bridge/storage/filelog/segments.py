"""`SegmentLog`: the file-log store's segments and positions, as bookkeeping (no I/O).

The log is a list of segments, each named by the position (`seq`) of its first byte. Here: where
the next record goes (rolling to a new segment when the active one is full), which segment
holds a seq, what is durable, and the bookkeeping of a rollback and of retention. The files
themselves are written, read and deleted by the store's workers (files.py).
"""

from __future__ import annotations

import bisect
from pathlib import Path

from bridge.storage.filelog.files import Segment, segment_path

__all__ = ["SegmentLog"]


class SegmentLog:
    """The segments of one log, oldest first, and its positions.

    `pos` is the seq of the next record, `durable` the position below which everything is
    written (and fsynced when the store fsyncs), `size` the bytes of every segment, records not
    yet written included.
    """

    def __init__(self, log_dir: Path, segment_bytes: int) -> None:
        self.log_dir = log_dir
        self.segment_bytes = segment_bytes
        self.segments: list[Segment] = []
        self.bases: list[int] = []
        self.pos = 0
        self.durable = 0
        self.size = 0

    def restore(self, segments: list[Segment]) -> None:
        """Take over the segments found at open (at least one); all of them are durable."""
        self.segments = segments
        self.bases = [seg.base for seg in segments]
        last = segments[-1]
        self.pos = self.durable = last.base + last.size
        self.size = sum(seg.size for seg in segments)

    @property
    def bytes_on_disk(self) -> int:
        """Bytes of the segment files: `size` without the records not yet written."""
        return self.size - (self.pos - self.durable)

    def place(self, length: int) -> tuple[Segment, int]:
        """Take the next `length` bytes for a record: (its segment, its seq).

        A record goes into a new segment when it does not fit into the active one (unless that
        one is empty: a record larger than `segment_bytes` gets a segment of its own).
        """
        seg = self.segments[-1]
        if seg.size and seg.size + length > self.segment_bytes:
            seg = Segment(self.pos, segment_path(self.log_dir, self.pos), None, 0, 0.0)
            self.segments.append(seg)
            self.bases.append(seg.base)
        seq = self.pos
        seg.size += length
        self.pos += length
        self.size += length
        return seg, seq

    def segment_of(self, seq: int) -> Segment:
        """The segment holding the record at `seq`."""
        return self.segments[bisect.bisect_right(self.bases, seq) - 1]

    def truncate(self, start: int) -> tuple[list[Segment], Segment, int]:
        """Forget everything from `start` on (a failed write): (the segments dropped, the new
        last segment, the bytes it keeps). The files are cut by `files.truncate_log`."""
        removed = []
        while len(self.segments) > 1 and self.segments[-1].base >= start:
            removed.append(self.segments.pop())
            self.bases.pop()
        last = self.segments[-1]
        keep = start - last.base
        self.size -= sum(seg.size for seg in removed) + last.size - keep
        last.size = keep
        self.pos = start
        return removed, last, keep

    def retention_victims(
        self, retention_bytes: int, too_old: float, keep_from: int | None = None
    ) -> list[Segment]:
        """The oldest whole durable segments beyond `retention_bytes`, or with no record newer
        than `too_old` (wall-clock time); never the active one, nor one holding the record at
        `keep_from` or a later one (a hold's, `LogHolds.keep_from`)."""
        total = self.size
        victims = []
        for seg in self.segments[:-1]:
            end = seg.base + seg.size
            if end > self.durable or (keep_from is not None and end > keep_from):
                break
            if total > retention_bytes or seg.newest < too_old:
                victims.append(seg)
                total -= seg.size
            else:
                break
        return victims

    def drop_oldest(self, count: int) -> int:
        """Forget the `count` oldest segments (retention); returns the first seq kept."""
        dropped = self.segments[:count]
        boundary = self.segments[count].base
        del self.segments[:count]
        del self.bases[:count]
        self.size -= sum(seg.size for seg in dropped)
        return boundary
