"""Filling a (tmpfs) disk for the full-disk faults: a file of zeros that leaves a given number of
bytes free."""

from __future__ import annotations

import os
from pathlib import Path


def fill(disk: Path, leave: int, name: str = "filler") -> Path:
    """Write `disk/name` so that `leave` bytes of `disk` stay free (none written if fewer are
    free already); return its path."""
    filler = disk / name
    stat = os.statvfs(disk)
    size = stat.f_bavail * stat.f_frsize - leave
    chunk = b"\0" * (1 << 20)
    with open(filler, "wb") as out:
        while size > 0:
            size -= out.write(chunk[: min(size, len(chunk))])
    return filler
