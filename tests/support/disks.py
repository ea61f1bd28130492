"""Filling a (tmpfs) disk for the full-disk faults: a file of zeros that leaves a given number of
bytes free."""

from __future__ import annotations

import errno
import os
from pathlib import Path


def fill(disk: Path, leave: int, name: str = "filler") -> Path:
    """Write `disk/name` so that `leave` bytes of `disk` stay free (none written if fewer are
    free already); return its path. A process writing to the disk meanwhile may fill it first:
    then the filler ends where the disk did (the disk is full, as asked, with less left)."""
    filler = disk / name
    stat = os.statvfs(disk)
    size = stat.f_bavail * stat.f_frsize - leave
    chunk = b"\0" * (1 << 20)
    with open(filler, "wb", buffering=0) as out:
        while size > 0:
            try:
                written = out.write(chunk[: min(size, len(chunk))])
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
            if not written:
                break  # nothing more goes in: the disk is full whatever statvfs said
            size -= written
    return filler
