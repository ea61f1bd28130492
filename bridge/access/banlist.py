"""The ban list of a node: the bans in force (`bridge.access.bans.BanTable`), where they are kept,
and flapping detection.

Where bans are kept:

* in a cluster, the cluster's Redis: hash `<cluster>:banned` (`kind:value` -> the ban's JSON
  record). Whoever changes it publishes on `<cluster>:banned-changed`; every node listens,
  re-reads the hash, and kicks its connected clients that a new ban names. After the listening
  connection was lost (Redis restarted or failed over) a node re-reads the hash, since a change
  may have been missed; meanwhile it keeps enforcing the last list it read. A node that starts
  reads the hash before it takes clients.
* on a single node, `<data_dir>/banned.json`, rewritten whole (a temporary file, fsync, rename)
  on every change, read on start-up.

Lapsed bans never match; they are dropped from Redis (compare-and-delete, so a ban renewed
meanwhile stays) and from the file the next time the list is read or written.

Flapping: a ClientId that passes authentication more than `flapping_max_connects` times in
`flapping_window` seconds is banned for `flapping_ban_seconds` (and that CONNECT refused). With
`flapping_failed_logins` a CONNECT that fails authentication counts as well: a password guesser
that keeps its ClientId is banned as a flapping one. In a
cluster the connects are counted cluster-wide in Redis (sorted set `<cluster>:flapping:<ClientId>`,
one script call per CONNECT): behind the load balancer a flapping device's reconnects land on
any node, so per-node counts would let it flap `nodes` times faster. When Redis does not answer,
the node counts on its own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from bridge.access.bans import (
    BY_FLAPPING,
    Ban,
    BanError,
    BanTable,
    FlappingDetector,
    ban_key,
    matches,
    peer_ip,
)

if TYPE_CHECKING:
    from bridge.settings import Config

from bridge.access.watch import follow_changes, replace_file, stop_following
from bridge.cluster.redis_errors import redis_errors

log = logging.getLogger("bridge.access")

BANS_FILE = "banned.json"
SWEEP_INTERVAL = 60.0
"""Seconds between forgetting idle flapping counters and lapsed bans."""

# Drop the fields (ARGV: field, record, field, record...) still holding the lapsed record read.
_PURGE = """
local dropped = 0
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    dropped = dropped + redis.call('HDEL', KEYS[1], ARGV[i])
  end
end
return dropped
"""

# One connect of a client (ARGV: window ms, times kept, a unique member); its connects in the
# window. Redis's clock, so every node counts in the same window.
_COUNT_CONNECT = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[1]))
redis.call('ZADD', KEYS[1], now, ARGV[3])
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -tonumber(ARGV[2]) - 1)
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return redis.call('ZCARD', KEYS[1])
"""


def banned_key(cluster: str) -> str:
    """The Redis hash of ban identity -> ban record."""
    return f"{cluster}:banned"


def banned_channel(cluster: str) -> str:
    """The Redis channel on which changes to the bans are announced."""
    return f"{cluster}:banned-changed"


def flapping_key(cluster: str, client_id: str) -> str:
    """The Redis sorted set of a ClientId's recent connects."""
    return f"{cluster}:flapping:{client_id}"


class BanListUnavailable(Exception):
    """The ban could not be stored or removed (Redis or the file): nothing changed."""


class BannedLink(Protocol):
    """What matching a connected client against a ban reads of its connection."""

    client_id: str
    username: str | None
    peer: str


class BanList:
    """The bans a node enforces and where they are kept (see the module docstring). `kick`
    closes a connected client by ClientId; `count` adds one to a node counter."""

    def __init__(
        self,
        config: Config,
        *,
        connections: Mapping[str, BannedLink],
        kick: Callable[[str, str], bool],
        count: Callable[[str], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.connections = connections
        self.kick = kick
        self.count = count
        self.clock = clock
        self.table = BanTable()
        self.flapping = (
            FlappingDetector(config.flapping_max_connects, config.flapping_window)
            if config.flapping_max_connects
            else None
        )
        self.redis: Any = None
        self.path = Path(config.data_dir) / BANS_FILE
        self._unsaved: dict[str, Ban] = {}
        """Flapping bans made while Redis did not answer: written when it is back."""
        self._file_lock = asyncio.Lock()
        self._listener: asyncio.Task[None] | None = None
        self._next_sweep = 0.0
        self._stale = True
        """Whether changes in Redis may have been missed (not read yet, or cut off since)."""
        self._sequence = 0

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self, redis: Any) -> None:
        """Read the bans (from the cluster's `redis`, or the file when None) and, in a cluster,
        listen for changes."""
        self.redis = redis
        if redis is None:
            self.table.replace(self._read_file())
            log.info("banned clients: %d (file %s)", len(self.table), self.path)
            return
        try:
            await self._reload()
        except redis_errors(OSError) as exc:
            log.warning("bans not read from Redis yet (%s): read when it answers", exc)
        self._listener = asyncio.get_running_loop().create_task(self._listen())

    async def stop(self) -> None:
        await stop_following(self._listener)

    # -- questions ------------------------------------------------------------------------------

    def ban_of(self, client_id: str, username: str | None, peer: str) -> Ban | None:
        """The ban in force that names this client, or None."""
        if not len(self.table):
            return None
        return self.table.match(client_id, username, peer_ip(peer), self.clock())

    def active(self) -> list[Ban]:
        """The bans in force, by identity."""
        return self.table.active(self.clock())

    def get(self, kind: str, value: str) -> Ban | None:
        """The ban in force of `value` (canonical) by `kind`, or None."""
        return self.table.get(kind, value, self.clock())

    # -- changes --------------------------------------------------------------------------------

    async def ban(self, ban: Ban) -> bool:
        """Store `ban` (replacing one of the same identity), enforce it here at once (connected
        clients it names are kicked) and, through Redis, on every node. Whether it is new.
        BanListUnavailable if it could not be stored."""
        if self.redis is None:
            async with self._file_lock:
                await self._write_file([b for b in self.active() if b.key != ban.key] + [ban])
                new = self.table.put(ban)
        else:
            try:
                async with self.redis.pipeline(transaction=True) as pipe:
                    pipe.hexists(self._key, ban.key)
                    pipe.hset(self._key, ban.key, ban.record())
                    pipe.publish(self._channel, ban.key)
                    existed, _set, _published = await pipe.execute()
            except redis_errors(OSError) as exc:
                raise BanListUnavailable(f"the cluster's Redis is unavailable: {exc}") from None
            self.table.put(ban)
            new = not existed
        log.warning(
            "banned %s %r for %.0f s (%s)%s",
            ban.kind,
            ban.value,
            ban.until - ban.created,
            ban.by,
            f": {ban.reason}" if ban.reason else "",
        )
        self._kick_matching([ban])
        return new

    async def unban(self, kind: str, value: str) -> Ban | None:
        """Lift the ban of `value` (canonical) by `kind` everywhere; the ban lifted, or None if
        none was in force. BanListUnavailable if the change could not be stored."""
        now = self.clock()
        key = ban_key(kind, value)
        if self.redis is None:
            async with self._file_lock:
                await self._write_file([b for b in self.active() if b.key != key])
                removed = self.table.remove(kind, value)
        else:
            try:
                async with self.redis.pipeline(transaction=True) as pipe:
                    pipe.hget(self._key, key)
                    pipe.hdel(self._key, key)
                    pipe.publish(self._channel, key)
                    raw, _deleted, _published = await pipe.execute()
            except redis_errors(OSError) as exc:
                raise BanListUnavailable(f"the cluster's Redis is unavailable: {exc}") from None
            self.table.remove(kind, value)
            removed = _parse(raw) if raw is not None else None
        if removed is None or removed.expired(now):
            return None
        log.warning("ban of %s %r lifted", kind, value)
        return removed

    async def connected(self, client_id: str) -> Ban | None:
        """Count an authenticated CONNECT of `client_id` (or, with `flapping_failed_logins`, one
        that failed authentication); if that makes it a flapping client, ban it
        (`flapping_ban_seconds`) and return the ban, else None."""
        detector = self.flapping
        if detector is None:
            return None
        now = self.clock()
        if now >= self._next_sweep:
            self._next_sweep = now + SWEEP_INTERVAL
            detector.sweep(now)
            self.table.purge(now)
        count = await self._count_connect(detector, client_id, now)
        if not detector.is_flapping(count):
            return None
        cfg = self.config
        ban = Ban(
            "clientid",
            client_id,
            until=now + cfg.flapping_ban_seconds,
            created=now,
            reason=f"flapping: more than {cfg.flapping_max_connects} connects in "
            f"{cfg.flapping_window:g} s",
            by=BY_FLAPPING,
        )
        detector.forget(client_id)
        self.count("flapping_bans")
        try:
            await self.ban(ban)
        except BanListUnavailable as exc:
            log.warning("flapping ban of %r held by this node only for now: %s", client_id, exc)
            self.table.put(ban)
            if self.redis is not None:
                self._unsaved[ban.key] = ban
            self._kick_matching([ban])
        return ban

    async def _count_connect(self, detector: FlappingDetector, client_id: str, now: float) -> int:
        if self.redis is not None:
            self._sequence += 1
            member = f"{self.config.resolved_node_id()}:{self._sequence}"
            window_ms = max(1, int(detector.window * 1000))
            try:
                return int(
                    await self.redis.eval(
                        _COUNT_CONNECT,
                        1,
                        flapping_key(self.config.cluster_name, client_id),
                        window_ms,
                        detector.max_connects + 1,
                        member,
                    )
                )
            except redis_errors(OSError) as exc:
                log.debug("connects of %r counted by this node only: %s", client_id, exc)
        return detector.record_connect(client_id, now)

    def _kick_matching(self, bans: list[Ban]) -> None:
        """Close the connected clients these bans name."""
        for client_id, conn in list(self.connections.items()):
            ip = peer_ip(conn.peer)
            for ban in bans:
                if matches(ban, client_id, conn.username, ip):
                    if self.kick(client_id, f"banned by {ban.kind} {ban.value!r}"):
                        self.count("banned_kicks")
                        log.warning("client %s (%s) kicked: banned", client_id, conn.peer)
                    break

    # -- Redis ----------------------------------------------------------------------------------

    @property
    def _key(self) -> str:
        return banned_key(self.config.cluster_name)

    @property
    def _channel(self) -> str:
        return banned_channel(self.config.cluster_name)

    async def _reload(self) -> None:
        """Write the bans held back while Redis was away, read the hash, enforce what is new."""
        for key, held in list(self._unsaved.items()):
            if not held.expired(self.clock()):
                await self.redis.hset(self._key, key, held.record())
            del self._unsaved[key]
        raw = await self.redis.hgetall(self._key)
        now = self.clock()
        bans: list[Ban] = []
        lapsed: list[bytes] = []
        for field, record in raw.items():
            ban = _parse(record)
            if ban is None:
                continue
            if ban.expired(now):
                lapsed += [field, record]
            else:
                bans.append(ban)
        if lapsed:
            await self.redis.eval(_PURGE, 1, self._key, *lapsed)
        added = self.table.replace(bans)
        self._stale = False
        log.info("banned clients: %d (Redis %s)", len(bans), self._key)
        if added:
            self._kick_matching(added)

    async def _listen(self) -> None:
        async def subscribed(first: bool) -> None:
            if self._stale or self._unsaved or first:
                await self._reload()  # changes may have been missed: cut off, or not yet heard

        def failed() -> None:
            self._stale = True

        await follow_changes(self.redis, self._channel, "ban", subscribed, self._reload, failed)

    # -- the file (single node) -----------------------------------------------------------------

    def _read_file(self) -> list[Ban]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        except (OSError, UnicodeDecodeError) as exc:
            log.error("bans file %s not read, no bans in force: %s", self.path, exc)
            return []
        try:
            records = json.loads(text)
        except ValueError as exc:
            log.error("bans file %s is not JSON, no bans in force: %s", self.path, exc)
            return []
        now = self.clock()
        bans = [_parse(json.dumps(r)) for r in records] if isinstance(records, list) else []
        return [ban for ban in bans if ban is not None and not ban.expired(now)]

    async def _write_file(self, bans: list[Ban]) -> None:
        """Replace the file with `bans`, atomically; BanListUnavailable if not."""
        text = json.dumps([json.loads(b.record()) for b in bans], indent=1)
        try:
            await asyncio.to_thread(replace_file, self.path, text)
        except OSError as exc:
            raise BanListUnavailable(f"bans file {self.path} not written: {exc}") from None


def _parse(record: str | bytes) -> Ban | None:
    try:
        return Ban.from_record(record)
    except BanError as exc:
        log.error("a stored ban is unusable and ignored: %s", exc)
        return None
