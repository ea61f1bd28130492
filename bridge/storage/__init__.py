"""Storage backends of the bridge: the `MessageStore` contract and its implementations."""

from bridge.storage.base import (
    Message,
    MessageStore,
    MetaUpdate,
    ReadResult,
    Stored,
    StoreUnavailable,
)
from bridge.storage.filelog import FileLogStore

__all__ = [
    "FileLogStore",
    "Message",
    "MessageStore",
    "MetaUpdate",
    "ReadResult",
    "StoreUnavailable",
    "Stored",
]
