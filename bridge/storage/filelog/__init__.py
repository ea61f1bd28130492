"""The embedded store: an append-only segmented log with group-committed fsync.

Front door of the room: `FileLogStore`, and `list_segments` for readers of a log directory
(the Spark source). Format: docs/storage-format.md.
"""

from bridge.storage.filelog.files import list_segments
from bridge.storage.filelog.store import FileLogStore

__all__ = ["FileLogStore", "list_segments"]
