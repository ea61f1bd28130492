"""Metering: messages and payload bytes in and out, per ClientId and per user name, for billing.

What is counted: a PUBLISH a client sends that the node accepts (`in`: not those dropped by the
ACL or aimed at `$SYS`, and a QoS 2 resend of a packet id already stored only once), and a PUBLISH
the node sends to a client (`out`: each message once; a resend with DUP after a reconnect is not
counted again). Bytes are payload bytes.

Connections count in four plain ints (`Connection.msgs_in` ...), the cheapest thing on the hot
path. Every `metering_interval` seconds the meter takes those counts (and those of connections that
ended), resets them, and adds them to Redis in one MULTI/EXEC transaction of HINCRBYs:

    <cluster>:meter:client:<ClientId>   msgs_in bytes_in msgs_out bytes_out
    <cluster>:meter:user:<user name>    msgs_in bytes_in msgs_out bytes_out

Every node adds to the same keys, so they are cluster-wide totals. If Redis cannot be reached the
counts are kept and added with the next flush; a transaction whose reply was lost (a timeout after
Redis applied it) is counted twice, the one case where the totals can be too high. Without Redis
the node keeps its totals since start in memory (`totals`), which the admin API shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Mapping
from typing import Any, Protocol

from bridge.cluster.redis_errors import redis_errors

log = logging.getLogger("bridge.metering")

FIELDS = ("msgs_in", "bytes_in", "msgs_out", "bytes_out")
CLIENT = "client"
USER = "user"


def meter_key(cluster: str, kind: str, name: str) -> str:
    """The Redis hash of one client's (`kind` = "client") or user's ("user") counters."""
    return f"{cluster}:meter:{kind}:{name}"


Counts = dict[tuple[str, str], list[int]]
"""(kind, name) -> [msgs_in, bytes_in, msgs_out, bytes_out]"""


def _add(into: Counts, key: tuple[str, str], values: list[int]) -> None:
    row = into.get(key)
    if row is None:
        into[key] = list(values)
    else:
        for index, value in enumerate(values):
            row[index] += value


class Metered(Protocol):
    """A client connection as metering sees it: who it is and its four counters."""

    client_id: str
    username: str | None
    msgs_in: int
    payload_in: int
    msgs_out: int
    payload_out: int


class Meter:
    """Collects the per-connection counts and flushes them to Redis."""

    def __init__(
        self,
        connections: Mapping[str, Metered],
        *,
        cluster_name: str,
        interval: float,
        redis: Any = None,
    ) -> None:
        self.connections = connections
        self.redis = redis
        self.cluster = cluster_name
        self.interval = interval
        self.pending: Counts = {}
        """Taken from connections, not yet in Redis."""
        self.totals: Counts = defaultdict(lambda: [0, 0, 0, 0])
        """Everything this node metered since it started."""
        self._task: asyncio.Task[None] | None = None
        self._flushing = asyncio.Lock()
        self.flushes = 0
        self.failures = 0

    def start(self) -> None:
        if self.interval > 0:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop the timer and flush what is left (best effort, bounded by the Redis timeout)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.redis is not None:
            await self.flush()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.flush()

    def take(self, conn: Metered) -> None:
        """Move a connection's counts into `pending` and reset them."""
        values = [conn.msgs_in, conn.payload_in, conn.msgs_out, conn.payload_out]
        if not any(values):
            return
        conn.msgs_in = conn.payload_in = conn.msgs_out = conn.payload_out = 0
        _add(self.pending, (CLIENT, conn.client_id), values)
        _add(self.totals, (CLIENT, conn.client_id), values)
        if conn.username is not None:
            _add(self.pending, (USER, conn.username), values)
            _add(self.totals, (USER, conn.username), values)

    def collect(self) -> None:
        """Take the counts of every connected client."""
        for conn in self.connections.values():
            self.take(conn)

    async def flush(self) -> bool:
        """Add everything counted so far to Redis; True if Redis has it all."""
        async with self._flushing:
            self.collect()
            if self.redis is None:
                self.pending.clear()  # nowhere to send it: `totals` is the record
                return True
            if not self.pending:
                return True
            batch, self.pending = self.pending, {}
            try:
                async with self.redis.pipeline(transaction=True) as pipe:
                    for (kind, name), values in batch.items():
                        key = meter_key(self.cluster, kind, name)
                        for field, value in zip(FIELDS, values, strict=True):
                            if value:
                                pipe.hincrby(key, field, value)
                    await pipe.execute()
            except redis_errors(OSError) as exc:
                for key, values in batch.items():
                    _add(self.pending, key, values)
                self.failures += 1
                log.warning("metering not flushed to Redis, kept for the next try: %s", exc)
                return False
            self.flushes += 1
            return True

    async def read(self, kind: str, name: str) -> dict[str, Any]:
        """The counters of one client or user: from Redis (cluster-wide, flushed) plus what this
        node has not flushed yet; this node's totals since start without Redis."""
        self.collect()
        local = self.pending.get((kind, name), [0, 0, 0, 0])
        if self.redis is None:
            values = self.totals.get((kind, name))
            if values is None:
                return {"found": False}
            return {"found": True, "source": "node", **dict(zip(FIELDS, values, strict=True))}
        raw = await self.redis.hgetall(meter_key(self.cluster, kind, name))
        if not raw and not any(local):
            return {"found": False}
        stored = {k.decode(): int(v) for k, v in raw.items()}
        result: dict[str, Any] = {"found": True, "source": "redis"}
        for index, field in enumerate(FIELDS):
            result[field] = stored.get(field, 0) + local[index]
        result["unflushed"] = dict(zip(FIELDS, local, strict=True))
        return result
