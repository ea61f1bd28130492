"""A ClientId's entry in the cluster registry, removed when its session ends here.

The entry carries the identity the ClientId is bound to (`who`), so one left behind would keep a
ClientId bound after its session is gone. Removing it is therefore not a best effort: while
Redis cannot be reached it is tried again later, the wait doubling up to a minute, until the
entry is gone, the client has reconnected here, or another node owns the ClientId.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Container
from typing import Protocol

from bridge.node.roles import Spawner
from bridge.storage.base import StaleOwner, StoreUnavailable

log = logging.getLogger("bridge.node")

RETRY_FIRST = 1.0
"""Seconds before the first retry of a removal Redis did not take."""
RETRY_MAX = 60.0
"""The longest wait between two retries."""


class SessionEnds(Protocol):
    """What removing an entry uses of the registry (`bridge.cluster.registry.RedisRegistry`)."""

    async def end_session(self, client_id: str) -> None:
        """Delete the ClientId's entry; StaleOwner if another node owns it now."""
        ...


class RegistryEntries:
    """Removes the registry entries of sessions that ended on this node, retrying while Redis
    is away. `sessions`: the node's live sessions (a ClientId there has reconnected)."""

    def __init__(self, sessions: Container[str], spawn: Spawner) -> None:
        self.sessions = sessions
        self.spawn = spawn

    async def end(
        self, registry: SessionEnds, client_id: str, retry_in: float = RETRY_FIRST
    ) -> None:
        """Remove `client_id`'s entry now, or schedule a retry in `retry_in` seconds."""
        if client_id in self.sessions:
            return  # reconnected meanwhile
        try:
            await registry.end_session(client_id)
        except StaleOwner:
            return  # another node owns the ClientId now: the entry is its own
        except StoreUnavailable as exc:
            log.info("client %s: registry entry not deleted yet: %s", client_id, exc)
            self.spawn(self._later(registry, client_id, retry_in))

    async def _later(self, registry: SessionEnds, client_id: str, wait: float) -> None:
        await asyncio.sleep(wait)
        await self.end(registry, client_id, min(wait * 2, RETRY_MAX))
