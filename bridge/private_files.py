"""Files the bridge writes are its own: data directories 0700, files 0600, whatever the umask.

Segments, snapshots, offsets, ban lists, limits and the admin token hold what devices sent and
who they are; nobody else on the machine needs to read them. The modes are set where each file
is created (the process umask can only remove permissions, and a test or an embedding process
keeps its own); `python -m bridge` also sets umask 0o077 for files written by libraries
(docs/decisions.md, "Across the rooms")."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

FILE_MODE = 0o600
DIR_MODE = 0o700
PROCESS_UMASK = 0o077

log = logging.getLogger("bridge.files")


def make_private_dir(path: Path) -> None:
    """Create `path` and any missing parent with mode 0700 (an existing one is left as it is)."""
    missing = []
    current = path
    while not current.exists():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, DIR_MODE)
        except FileExistsError:
            continue
        os.chmod(directory, DIR_MODE)  # mkdir's mode passes through the umask


def secure_data_dir(path: Path) -> None:
    """Create the data directory 0700, or take group and other permissions away from an existing
    one this user owns; say so when it cannot."""
    make_private_dir(path)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        try:
            os.chmod(path, mode & ~0o077)
        except OSError as exc:
            log.warning(
                "data_dir %s is readable by other users (mode %o) and cannot be changed: %s",
                path,
                mode,
                exc.strerror,
            )


def open_private(path: Path | str, flags: int) -> int:
    """`os.open(path, flags | O_CREAT, 0600)`, also 0600 when the file already existed."""
    fd = os.open(path, flags | os.O_CREAT, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    except OSError:
        os.close(fd)
        raise
    return fd
