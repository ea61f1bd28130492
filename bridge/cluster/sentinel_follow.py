"""Connections to a Sentinel-managed master that let go of a master without replicas.

redis-py's Sentinel connection asks the Sentinels for the master when it connects, and drops its
connection when a write is refused with READONLY (its master was demoted). A master that was
deposed while paused or cut off answers neither way at first: it still believes it is the
master, and until a Sentinel demotes it (up to its 10 s INFO period later) a server configured
with `min-replicas-to-write` (deploy/redis/start.sh `REDIS_MIN_REPLICAS`) refuses each write
with NOREPLICAS, having no replica any more. The connections here treat that refusal as READONLY
is treated: they disconnect and raise ConnectionError, and the clients' retry reconnects after
a fresh question to the Sentinels (every reconnect asks them, not only a new connection's), so
writes go to the new master at once instead of failing until the old one is demoted. A refused
write changed nothing (NOREPLICAS is answered before the first write of a command or a script),
so sending it again is safe. Where the Sentinels still
name the same master (its replicas are really gone), the retries meet the same refusal and the
error reaches the caller as Redis being unavailable. A pipeline of scripts retried on the new
master can meet NOSCRIPT once (a script cache is not replicated): that call fails, and the
next one loads the scripts there.

Imported only when a Sentinel client is built (`bridge.cluster.redis_access.async_client`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from redis.asyncio.connection import SSLConnection
from redis.asyncio.sentinel import SentinelManagedConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

if TYPE_CHECKING:
    from bridge.cluster.failover_watch import FailoverWatch

NO_REPLICAS = "NOREPLICAS"


def refused_for_replicas(error: BaseException) -> bool:
    """Whether a Redis error reply is the min-replicas-to-write refusal."""
    return isinstance(error, ResponseError) and str(error).startswith(NO_REPLICAS)


class FollowingConnection(SentinelManagedConnection):
    """A connection to the master that asks the Sentinels again after a NOREPLICAS refusal,
    and whenever it connects again."""

    def __init__(self, **kwargs: Any) -> None:
        self.failover_watch: FailoverWatch | None = kwargs.pop("failover_watch", None)
        """The registry's: no write while the Sentinels depose the master
        (`bridge.cluster.failover_watch`)."""
        super().__init__(**kwargs)
        self._addressed = False
        """`connect_to` has just asked the Sentinels: the address is fresh."""
        self._sent_in = 0
        """The watch's generation when the last command was sent."""

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        watch = self.failover_watch
        if watch is not None and self.connection_pool.is_master:
            watch.start()
            if watch.suspected:
                raise RedisConnectionError(
                    "the Sentinels are deposing the master: no write until the failover ends"
                )
            self._sent_in = watch.generation
        await super().send_packed_command(command, check_health)

    async def connect_to(self, address: Any) -> None:
        self._addressed = True
        try:
            await super().connect_to(address)
        finally:
            self._addressed = False

    async def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        # A command retried after its connection broke reconnects here, to the address the
        # connection had (redis-py 8: the send path does not go through `connect`, which asks
        # the Sentinels): that is the old master after a failover. Ask them first.
        if not self.is_connected and not self._addressed and self.connection_pool.is_master:
            self.host, self.port = await self.connection_pool.get_master_address()
        await super().connect_check_health(*args, **kwargs)

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            response = await super().read_response(*args, **kwargs)
        except ResponseError as exc:
            if not (self.connection_pool.is_master and refused_for_replicas(exc)):
                raise
            await self.disconnect()
            raise RedisConnectionError(
                "the master has no replica to confirm writes (NOREPLICAS); asking the "
                "Sentinels for the master again"
            ) from exc
        watch = self.failover_watch
        if watch is not None and watch.generation != self._sent_in:
            # Sent before the Sentinels judged the master down, answered after: the master may
            # have taken it while being deposed, and the failover may roll it back.
            self._sent_in = watch.generation
            await self.disconnect()
            raise RedisConnectionError("the Sentinels judged the master down while it answered")
        return response


class FollowingSSLConnection(FollowingConnection, SSLConnection):
    """`FollowingConnection` over TLS."""
