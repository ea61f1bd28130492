"""What the store keeps to take back records whose write failed, and the taking back.

Every record not yet durable has an undo entry: its seq, the queue indexes it was added to, and
for each keyed-record (meta) update the record dict, the key and the value it replaced. A failed
group commit takes back every entry from the failed batch on, newest first (`take_back`). Pure
in-memory work: the files are cut back by `files.truncate_log`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bridge.storage.base import MetaUpdate
from bridge.storage.filelog.index import QueueIndex

MISSING: Any = object()
"""The previous value of a key that had none."""

MetaUndo = list[tuple[dict[str, bytes], str, Any]]
Undo = tuple[int, list[QueueIndex], MetaUndo | None]


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
