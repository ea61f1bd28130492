"""The rate and connection limits in force on a node, and where changes to them are kept.

The configuration gives the defaults (`max_connections`, `connection_rate`,
`connection_rate_wait`, `client_publish_rate`, `client_publish_bytes_rate`); the admin API
overrides them at run time (`PUT /api/v1/limits`, `bridge.operations.admin_limits`).

* In a cluster the overrides live in the Redis hash `<cluster>:limits` (limit name -> JSON
  number); whoever changes it publishes on `<cluster>:limits-changed`, and every node re-reads
  the hash at once. A node re-reads it too whenever its listening connection comes back (Redis
  restarted or failed over: a change may have been missed), and at start-up, so a node that
  joins later applies the cluster's limits before it takes its first client.
* On a single node they live in `limits.json` in `data_dir` (written whole, then renamed).

The rules of each limit are `bridge.access.ratelimit.check_limit`; a stored value that breaks
them (written by hand) is logged and skipped, never applied.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bridge.access.ratelimit import Limits, TokenBucket, bucket_for, parse_overrides

if TYPE_CHECKING:
    from bridge.settings import Config

from bridge.access.watch import follow_changes, replace_file, stop_following
from bridge.cluster.redis_errors import redis_errors

log = logging.getLogger("bridge.access")

LIMITS_FILE = "limits.json"


def limits_key(cluster: str) -> str:
    """The Redis hash of limit name -> JSON number (the cluster's overrides)."""
    return f"{cluster}:limits"


def limits_channel(cluster: str) -> str:
    """The Redis channel on which changes to the cluster's limits are announced."""
    return f"{cluster}:limits-changed"


def defaults_of(config: Config) -> Limits:
    """The limits the configuration sets."""
    return Limits(
        max_connections=config.max_connections,
        connection_rate=config.connection_rate,
        connection_rate_wait=config.connection_rate_wait,
        client_publish_rate=config.client_publish_rate,
        client_publish_bytes_rate=config.client_publish_bytes_rate,
    )


class LimitsUnavailable(Exception):
    """The overrides could not be written (Redis unreachable, data_dir not writable)."""


class LimitControl:
    """The limits in force (`current`: the defaults with the overrides on top), the node's
    connection-rate bucket, and the storage of the overrides. `changed` is called with the new
    limits whenever they change."""

    def __init__(self, config: Config) -> None:
        self.defaults = defaults_of(config)
        self.overrides: dict[str, int | float] = {}
        self.current = self.defaults
        self.clustered = config.clustered
        self.path = Path(config.data_dir) / LIMITS_FILE
        self.key = limits_key(config.cluster_name)
        self.channel = limits_channel(config.cluster_name)
        self.redis: Any = None
        self.changed: Callable[[Limits], None] | None = None
        self._connections: TokenBucket | None = None
        self._listener: asyncio.Task[None] | None = None

    @property
    def scope(self) -> str:
        """Where an override applies: "cluster" (every node) or "node" (this one)."""
        return "cluster" if self.clustered else "node"

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self, redis: Any) -> None:
        """Read the overrides (from the cluster's `redis`, else the file) and, in a cluster,
        listen for changes."""
        self._connections = bucket_for(self.current.connection_rate, _now())
        if redis is None:
            self._apply(self._read_file(), "from " + str(self.path))
            return
        self.redis = redis
        try:
            await self._reload()
        except redis_errors(OSError) as exc:
            log.warning("limits not read from Redis yet (%s): the configured ones apply", exc)
        self._listener = asyncio.get_running_loop().create_task(self._listen())

    async def stop(self) -> None:
        await stop_following(self._listener)
        self._listener = None

    # -- the connection rate -------------------------------------------------------------------

    def connection_slot(self) -> float | None:
        """A new connection's turn: seconds it waits before it is taken (0: at once), or None
        when it would wait longer than `connection_rate_wait` (refuse it)."""
        bucket = self._connections
        if bucket is None:
            return 0.0
        return bucket.reserve(1, _now(), self.current.connection_rate_wait)

    # -- changes -------------------------------------------------------------------------------

    async def change(self, changes: Mapping[str, int | float | None]) -> None:
        """Override the named limits (None: back to the configured default), on every node of a
        cluster. Raises LimitsUnavailable if the change could not be stored."""
        if self.redis is not None:
            try:
                async with self.redis.pipeline(transaction=True) as pipe:
                    for name, value in changes.items():
                        if value is None:
                            pipe.hdel(self.key, name)
                        else:
                            pipe.hset(self.key, name, json.dumps(value))
                    pipe.hgetall(self.key)
                    pipe.publish(self.channel, "changed")
                    results = await pipe.execute()
            except redis_errors(OSError) as exc:
                raise LimitsUnavailable(f"the cluster's Redis is unavailable: {exc}") from None
            self._apply(_decode_hash(results[-2]), "through the admin API")
            return
        overrides = dict(self.overrides)
        for name, value in changes.items():
            if value is None:
                overrides.pop(name, None)
            else:
                overrides[name] = value
        try:
            await asyncio.to_thread(_write_file, self.path, overrides)
        except OSError as exc:
            raise LimitsUnavailable(f"cannot write {self.path}: {exc.strerror}") from None
        self._apply(overrides, "through the admin API")

    async def reset(self) -> None:
        """Drop every override: the configured limits apply again (on every node)."""
        if self.redis is None:
            await self.change(dict.fromkeys(self.overrides))
            return
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.delete(self.key)
                pipe.publish(self.channel, "changed")
                await pipe.execute()
        except redis_errors(OSError) as exc:
            raise LimitsUnavailable(f"the cluster's Redis is unavailable: {exc}") from None
        self._apply({}, "through the admin API")

    def _apply(self, stored: Mapping[str, Any], origin: str) -> None:
        overrides, faults = parse_overrides(stored)
        for fault in faults:
            log.error("limit override %s not applied: %s", origin, fault)
        self.overrides = overrides
        new = self.defaults.overridden(overrides)
        old = self.current
        if new == old:
            return
        self.current = new
        if new.connection_rate != old.connection_rate:
            self._connections = bucket_for(new.connection_rate, _now())
        now = new.as_dict()
        log.info(
            "limits changed %s: %s",
            origin,
            ", ".join(f"{k}={v:g}" for k, v in now.items() if v != old.as_dict()[k]),
        )
        if self.changed is not None:
            self.changed(new)

    # -- storage -------------------------------------------------------------------------------

    def _read_file(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.error("limits file %s not read, the configured limits apply: %s", self.path, exc)
            return {}
        if not isinstance(data, dict):
            log.error("limits file %s is not a JSON object; the configured limits apply", self.path)
            return {}
        return data

    async def _reload(self) -> None:
        raw = await self.redis.hgetall(self.key)
        self._apply(_decode_hash(raw), "in Redis")

    async def _listen(self) -> None:
        async def subscribed(_first: bool) -> None:
            await self._reload()  # changes may have been missed while not listening

        await follow_changes(self.redis, self.channel, "limit", subscribed, self._reload)


def _now() -> float:
    return asyncio.get_running_loop().time()


def _decode_hash(raw: Mapping[Any, Any]) -> dict[str, Any]:
    """A Redis hash of limit name -> JSON number as a dict (undecodable values kept as text, so
    the check names them)."""
    decoded: dict[str, Any] = {}
    for key, value in raw.items():
        name = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
        try:
            decoded[name] = json.loads(text)
        except ValueError:
            decoded[name] = text
    return decoded


def _write_file(path: Path, overrides: Mapping[str, int | float]) -> None:
    """Write the overrides whole (`replace_file`)."""
    replace_file(path, json.dumps(dict(overrides), indent=2, sort_keys=True) + "\n")
