"""Holds on the file log's queues (`QueueHolds`): retention keeps a held queue's messages.

A hold is a keyed record of the store's own kind, `HOLDS_KIND` (queue -> the offset it is held
from, a u64): written, rolled back, snapshotted and replayed like the node's records, so it
outlives a restart with no format of its own. Moving a hold is a lazy write (no fsync of its
own): a crash may lose the latest moves, which leaves an earlier hold, one that keeps more. A
hold set before a message is submitted goes into the same group commit as the message or an
earlier one, and a crash leaves a prefix of the log: it is durable once the message is.

Retention asks `keep_from`: the position of the oldest record a hold keeps. Whole segments are
deleted oldest first, so the segment holding that record and every later one stay.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Final

from bridge.storage.base import MetaUpdate, StoreUnavailable
from bridge.storage.filelog.index import HOLE, QueueIndex

__all__ = ["HOLDS_KIND", "LogHolds"]

HOLDS_KIND: Final = "\x00holds"
"""The keyed-record kind of holds: queue -> offset. No kind of the node's starts with NUL."""

_OFFSET = struct.Struct(">Q")


class LogHolds:
    """The holds of one `FileLogStore` (its `holds`; see `bridge.storage.base.QueueHolds`).

    Handed the store's queue indexes and keyed records, `write` (queue keyed-record updates for
    the next group commit, no waiter) and `check_usable` (raises StoreUnavailable when the store
    takes no writes: a hold is then left where it was, which keeps more)."""

    def __init__(
        self,
        queues: dict[str, QueueIndex],
        meta: dict[str, dict[str, bytes]],
        write: Callable[[Sequence[MetaUpdate]], None],
        check_usable: Callable[[], None],
    ) -> None:
        self._queues = queues
        self._meta = meta
        self._write = write
        self._check_usable = check_usable

    def next_offset(self, queue: str) -> int:
        q = self._queues.get(queue)
        return q.end if q is not None else 0

    def hold(self, queue: str, offset: int) -> None:
        if offset < 0:
            raise ValueError(f"a hold on {queue!r} at a negative offset ({offset})")
        value = _OFFSET.pack(offset)
        records = self._meta.get(HOLDS_KIND)
        if records is not None and records.get(queue) == value:
            return
        try:
            self._check_usable()
        except StoreUnavailable:
            return  # the hold stays where it was (keeps more); a write after this fails too
        self._write([MetaUpdate(HOLDS_KIND, queue, value)])

    def held(self, queue: str) -> int | None:
        records = self._meta.get(HOLDS_KIND)
        value = records.get(queue) if records is not None else None
        return _OFFSET.unpack(value)[0] if value is not None else None

    def keep_from(self) -> int | None:
        """The position of the oldest record a hold keeps (None: no hold keeps any)."""
        records = self._meta.get(HOLDS_KIND)
        if not records:
            return None
        keep: int | None = None
        for queue, value in records.items():
            q = self._queues.get(queue)
            if q is None:
                continue
            seq = q.seq_from(_OFFSET.unpack(value)[0])
            if seq != HOLE and (keep is None or seq < keep):
                keep = seq
        return keep
