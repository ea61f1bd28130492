"""What the store keeps for records not yet durable: how to take them back if their write fails,
and who waits for them.

Every record not yet durable has an undo entry: its seq, the queue indexes it was added to, and
for each keyed-record (meta) update the record dict, the key and the value it replaced. A failed
group commit takes back every entry from the failed batch on, newest first (`take_back`). Pure
in-memory work: the files are cut back by `files.truncate_log`. A record's waiter (a future or a
callback) is told once its batch is written, or failed (`resolve`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from bridge.storage.base import DurableCallback, MetaUpdate
from bridge.storage.filelog.files import Segment
from bridge.storage.filelog.index import QueueIndex

log = logging.getLogger("bridge.storage")

MISSING: Any = object()
"""The previous value of a key that had none."""

MetaUndo = list[tuple[dict[str, bytes], str, Any]]
Undo = tuple[int, list[QueueIndex], MetaUndo | None]
Waiter = asyncio.Future[Any] | DurableCallback
Batch = tuple[list[tuple[Segment, bytes]], list[tuple[Waiter, int | None]], int, int, int, bool]
"""One group commit: each segment's joined records, the waiters, its start and end positions,
its count of records (of undo entries) and whether it must be synced (someone waits for one of
its records, or one is on a queue)."""


def resolve(waiters: list[tuple[Waiter, int | None]], error: BaseException | None) -> None:
    """Complete every waiter of a commit: futures get the seq or the error, callbacks are
    called at once (no scheduling round trip: this is every QoS 1 acknowledgement)."""
    future = asyncio.Future  # read once, not per waiter
    for waiter, result in waiters:
        if isinstance(waiter, future):
            if not waiter.done():
                if error is None:
                    waiter.set_result(result)
                else:
                    waiter.set_exception(error)
        else:
            try:
                if error is None:
                    waiter(result, None)
                else:
                    waiter(None, error)
            except Exception:
                log.exception("a durability callback failed")


def apply_meta(meta: dict[str, dict[str, bytes]], updates: Sequence[MetaUpdate]) -> MetaUndo:
    """Apply keyed-record updates to `meta` (kind -> key -> value; None deletes); returns how to
    take them back."""
    undo = []
    for update in updates:
        records = meta.get(update.kind)
        if records is None:
            records = meta[update.kind] = {}
        old = records.get(update.key, MISSING)
        if update.value is None:
            if old is not MISSING:
                del records[update.key]
        else:
            records[update.key] = bytes(update.value)
        undo.append((records, update.key, old))
    return undo


def made_durable(undo: list[Undo], records: int) -> None:
    """The first `records` entries of `undo` were written (and synced): count them in their
    queues' durable ends (a queue's readable end is never below that), and drop them."""
    for i in range(records):
        for q in undo[i][1]:
            q.durable += 1
            if q.visible < q.durable:
                q.visible = q.durable
    if records == len(undo):
        undo.clear()  # the usual case: nothing was appended while the batch was written
    else:
        del undo[:records]


def take_back(undo: list[Undo], queues: dict[str, QueueIndex]) -> dict[str, int]:
    """Take back every entry of `undo`, newest first, and clear it. Returns queue -> new end for
    the queues whose readers could read past that end (records read early): they must go back."""
    for _seq, qlist, undo_meta in reversed(undo):
        for q in qlist:
            q.pop()
        for records, key, old in reversed(undo_meta or ()):
            if old is MISSING:
                records.pop(key, None)
            else:
                records[key] = old
    undo.clear()
    rewound = {}
    for name, q in queues.items():
        if q.visible > q.end:
            q.visible = q.end
            rewound[name] = q.end
    return rewound
