"""The console's static files as an allow-list (`ConsoleFiles`), built once at start-up.

A request names a file; that name is only ever a key in a dict of the files the console
directory held when the node started. Nothing from the request is joined to a path or handed
to the file system, so no encoding (`%2F`, `%2E%2E`, a backslash, a NUL) can reach another
file: a name that is not a key is simply unknown. The files are read at start-up (the console is
a few dozen KiB), so a file swapped for a symlink later is not followed either.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

CONTENT_TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".css": "text/css",
    ".svg": "image/svg+xml",
}
"""The kinds of file the console is made of; any other file in its directory stays private."""


@dataclass(frozen=True, slots=True)
class ConsoleFile:
    """One servable file: its bytes as read at start-up and its media type."""

    body: bytes
    content_type: str


class ConsoleFiles:
    """The console directory's servable files by name: regular files (not symlinks) directly in
    it, with a known suffix, whose names do not start with a dot."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._files: dict[str, ConsoleFile] = {}
        for entry in sorted(os.scandir(directory), key=lambda e: e.name):
            content_type = CONTENT_TYPES.get(Path(entry.name).suffix)
            if content_type is None or entry.name.startswith("."):
                continue
            # lstat, not stat: a symlink in the directory is not the console's own file.
            if not stat.S_ISREG(entry.stat(follow_symlinks=False).st_mode):
                continue
            self._files[entry.name] = ConsoleFile(Path(entry.path).read_bytes(), content_type)

    @property
    def names(self) -> frozenset[str]:
        """The names that are served."""
        return frozenset(self._files)

    def get(self, name: str) -> ConsoleFile | None:
        """The file called `name`, or None if the console has no such file."""
        return self._files.get(name)
