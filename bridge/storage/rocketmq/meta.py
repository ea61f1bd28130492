"""The RocketMQ store's keyed records ("meta"): where each kind is kept, and the store's own.

RocketMQ holds the messages; keyed records live in a small local `FileLogStore` under the data
directory, or, for the node's kinds, in `session_meta` when one is given (a cluster's Redis
registry). The store's own kinds (`~...`) stay local either way: the bridge queues it knows
(so a restarted store knows which queue ends to fetch) and its average message size.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any, Protocol

from bridge.storage.base import MetaUpdate
from bridge.storage.filelog import FileLogStore
from bridge.storage.rocketmq.queues import DEFAULT_MESSAGE_SIZE

__all__ = ["KIND_LMQS", "KIND_STATS", "KeyedRecords", "StoreMeta"]

KIND_STATS = "~stats"
"""Meta kind of this store's own: the average message size (for backlog byte estimates)."""
KIND_LMQS = "~lmq"
"""Meta kind of this store's own: every bridge queue it has dispatched to or been asked about, so
a restarted store knows which queue ends to fetch."""


class KeyedRecords(Protocol):
    """Where a store may keep the node's keyed records instead of its own log."""

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    def meta(self, kind: str) -> dict[str, bytes]: ...
    def submit_meta(self, updates: Sequence[MetaUpdate]) -> asyncio.Future[None]: ...


async def _none_after(future: Awaitable[Any]) -> None:
    await future


class StoreMeta:
    """The keyed records of one RocketMQ store: the local log, and `session_meta` if given."""

    def __init__(
        self,
        directory: Path,
        *,
        fsync: bool,
        segment_bytes: int,
        session_meta: KeyedRecords | None,
    ) -> None:
        self._local = FileLogStore(
            directory,
            fsync=fsync,
            segment_bytes=segment_bytes,
            retention_bytes=4 * segment_bytes,
            snapshot_every_bytes=segment_bytes // 2,
        )
        self._session_meta = session_meta
        """Where the node's records go instead of the local log (a cluster's Redis registry);
        the store's own kinds (`~...`) stay local either way."""

    async def open_local(self) -> None:
        """Open the local log (the store's first step: nothing to undo if it fails)."""
        await self._local.open()

    async def open_session(self) -> None:
        """Open `session_meta`, if given."""
        if self._session_meta is not None:
            await self._session_meta.open()

    async def close_local(self) -> None:
        """Close the local log only (a start that failed after `open_local`)."""
        await self._local.close()

    async def close(self) -> None:
        """Close the local log and `session_meta`."""
        await self._local.close()
        if self._session_meta is not None:
            await self._session_meta.close()

    def meta(self, kind: str) -> dict[str, bytes]:
        """All records of `kind` as they stand (a live view the caller must not modify)."""
        if self._session_meta is None or kind.startswith("~"):
            return self._local.meta(kind)
        return self._session_meta.meta(kind)

    async def put_meta(self, updates: Sequence[MetaUpdate], *, durable: bool = True) -> None:
        """Apply `updates`; with `durable` (always, with `session_meta`), once they are stable."""
        if self._session_meta is None:
            await self._local.put_meta(updates, durable=durable)
        else:
            await self.submit_meta(updates)

    def submit_meta(self, updates: Sequence[MetaUpdate]) -> asyncio.Future[None]:
        """Make updates durable: the store's own kinds locally, the node's in `session_meta`
        when there is one. Both are applied in submission order."""
        if self._session_meta is None:
            return self._local.submit_meta(updates)
        own = [u for u in updates if u.kind.startswith("~")]
        node = [u for u in updates if not u.kind.startswith("~")]
        if not own:
            return self._session_meta.submit_meta(node)
        if not node:
            return self._local.submit_meta(own)
        both = asyncio.gather(self._local.submit_meta(own), self._session_meta.submit_meta(node))
        return asyncio.ensure_future(_none_after(both))

    # -- the store's own records

    def known_queues(self) -> list[str]:
        """Every bridge queue recorded by `new_queues` updates so far."""
        return list(self._local.meta(KIND_LMQS))

    def new_queues(self, queues: Sequence[str]) -> list[MetaUpdate]:
        """Updates recording those of `queues` not recorded yet (nothing is applied here)."""
        known = self._local.meta(KIND_LMQS)
        return [MetaUpdate(KIND_LMQS, q, b"") for q in queues if q not in known]

    def saved_avg_size(self) -> float:
        """The average message size saved by `save_avg_size`, or the default."""
        saved = self._local.meta(KIND_STATS).get("avg_size")
        return float(saved) if saved else DEFAULT_MESSAGE_SIZE

    async def put_own(self, updates: Sequence[MetaUpdate]) -> None:
        """Apply updates of the store's own kinds (`~...`) to the local log, durably."""
        await self._local.put_meta(updates, durable=True)

    async def save_avg_size(self, avg_size: float) -> None:
        """Record the average message size (durably) for the next start."""
        await self.put_own([MetaUpdate(KIND_STATS, "avg_size", f"{avg_size:.1f}".encode())])
