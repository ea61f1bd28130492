"""The cluster registry in Redis: who owns each ClientId, the sessions' durable records, retained
messages and node membership.

Keys (prefix `P` = config `cluster_name`):

* ``P:c:{ClientId}`` hash: ``node``, ``epoch``, ``clean``, ``who`` (the identity the session
  belongs to, `bridge.access.ownership`), ``online`` (the connection record with its will,
  absent while offline), ``subs`` and ``off`` (a persistent session's subscriptions and
  offsets), ``q2:{packet id}`` (inbound QoS 2 markers).
* ``P:owned:{node}`` set of the ClientIds a node owns (read when the node dies).
* ``P:epoch`` counter: every change of owner takes the next value, cluster-wide.
* ``P:retained`` hash: topic -> retained message.
* ``P:nodes`` sorted set: node -> time (Redis clock, ms) its heartbeat expires;
  ``P:nodeinfo`` hash: node -> JSON (peer address, boot id).
* ``P:cleanup:{node}`` lock held by the node cleaning up after a dead one.

Ownership changes only in Lua (`claim`, `adopt`), atomically with the epoch. Every later write
of session state names the epoch its writer owns, and a Lua script applies it only if that is
still the current epoch: a node that lost a client (took too long, was cut off) cannot overwrite
what the new owner wrote.

For the node, this is the keyed-record store of the session kinds (`bridge.state`): the RocketMQ
store hands those kinds here (`meta`, `put_meta`, `submit_meta`) and keeps its own.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis import asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeout

from bridge.cluster.redis_access import (
    RedisAccess,
    RedisSetupError,
    async_client,
    close_client,
    explain,
)
from bridge.state import KIND_OFFSETS, KIND_ONLINE, KIND_QOS2_IN, KIND_RETAINED, KIND_SESSION
from bridge.storage.base import MetaUpdate, SessionBound, StaleOwner, StoreUnavailable

log = logging.getLogger("bridge.cluster")

_FIELD_OF_KIND = {KIND_SESSION: "subs", KIND_OFFSETS: "off", KIND_ONLINE: "online"}
_KIND_OF_FIELD = {v: k for k, v in _FIELD_OF_KIND.items()}

# Owner change: the next cluster-wide epoch, the new owner, and everything the hash held.
_CLAIM = """
local prev = redis.call('HGET', KEYS[1], 'node')
if ARGV[4] ~= '' and prev ~= ARGV[4] then return false end
if ARGV[6] ~= '' then
  local who = redis.call('HGET', KEYS[1], 'who')
  if who and who ~= ARGV[6] then return {0, who} end
  if not who then redis.call('HSET', KEYS[1], 'who', ARGV[6]) end
end
local epoch = redis.call('INCR', KEYS[2])
local before = redis.call('HGETALL', KEYS[1])
redis.call('HSET', KEYS[1], 'node', ARGV[2], 'epoch', epoch)
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'clean', ARGV[3]) end
if prev and prev ~= ARGV[2] then redis.call('SREM', ARGV[1] .. prev, ARGV[5]) end
redis.call('SADD', ARGV[1] .. ARGV[2], ARGV[5])
return {epoch, before}
"""

# A write of session state by the owner of `epoch`: S field value | D field | X (end session).
_FENCED = """
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return 0 end
local i = 2
while i <= #ARGV do
  local op = ARGV[i]
  if op == 'S' then
    redis.call('HSET', KEYS[1], ARGV[i + 1], ARGV[i + 2]); i = i + 3
  elseif op == 'D' then
    redis.call('HDEL', KEYS[1], ARGV[i + 1]); i = i + 2
  else
    redis.call('DEL', KEYS[1]); redis.call('SREM', KEYS[2], ARGV[i + 1]); i = i + 2
  end
end
return 1
"""

# Heartbeat: the node is alive until Redis's clock passes now + ttl. Returns 1 if its previous
# heartbeat had lapsed (or was gone): others may have taken its sessions over meanwhile.
_HEARTBEAT = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local before = redis.call('ZSCORE', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
if before == false or tonumber(before) < now then return 1 end
return 0
"""

# Members: {now, alive node/info pairs..., '', dead nodes...}
_MEMBERS = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local out = {tostring(now)}
for _, node in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], now, '+inf')) do
  table.insert(out, node)
  table.insert(out, redis.call('HGET', KEYS[2], node) or '{}')
end
table.insert(out, '')
for _, node in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)) do
  table.insert(out, node)
end
return out
"""


@dataclass(slots=True)
class _Batch:
    writes: list[tuple[str, int | None, list[Any]]]
    retained: list[MetaUpdate]
    future: asyncio.Future[None]


def _unavailable(exc: RedisError) -> StoreUnavailable:
    """What a Redis failure means to the node: a time-out may have been applied."""
    if isinstance(exc, RedisTimeout):
        return StoreUnavailable(f"Redis timed out: {exc}", maybe_stored=True)
    return StoreUnavailable(f"Redis is unavailable: {exc}")


def _fail(future: asyncio.Future[None], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
        future.exception()  # a failure nobody awaits is still not "never retrieved"


@dataclass(slots=True)
class Claim:
    """What taking over a ClientId found: the new epoch, the previous owner and its records."""

    epoch: int
    previous_node: str
    records: dict[str, bytes] = field(default_factory=dict)
    was_clean: bool = False
    """The session's fields as they were (`subs`, `off`, `online`, `q2:{id}`)."""

    @property
    def online(self) -> bytes | None:
        return self.records.get("online")

    def meta(self, client_id: str) -> dict[str, dict[str, bytes]]:
        """The records as the node's meta kinds, keyed like `bridge.state` says."""
        out: dict[str, dict[str, bytes]] = {}
        for name, value in self.records.items():
            if name in _KIND_OF_FIELD:
                out.setdefault(_KIND_OF_FIELD[name], {})[client_id] = value
            elif name.startswith("q2:"):
                out.setdefault(KIND_QOS2_IN, {})[f"{client_id}\x00{name[3:]}"] = value
        return out


def redis_client(access: RedisAccess) -> aioredis.Redis:
    """The registry's redis-py asyncio client (`bridge.cluster.redis_access.async_client`: the
    credentials, TLS and Sentinel of the settings), retrying a command whose connection broke,
    and writing nothing to a master the Sentinels are deposing."""
    return async_client(access, watch_failovers=True, **_retrying())


def _retrying() -> dict[str, Any]:
    """Retry a command whose connection broke (a pooled connection to a Redis that restarted
    fails once before the pool reconnects). Safe for what the registry sends: a claim run twice
    only takes one more epoch, a fenced write or a heartbeat is the same when repeated."""
    return {
        "retry": Retry(ExponentialBackoff(cap=1.0, base=0.05), 3),
        "retry_on_error": [RedisConnectionError],
    }


class RedisRegistry:
    """Session ownership, session records, retained messages and membership in Redis."""

    def __init__(
        self,
        client: aioredis.Redis,
        prefix: str,
        node_id: str,
        *,
        wait_replicas: int = 0,
        wait_timeout: float = 1.0,
        access: RedisAccess | None = None,
    ) -> None:
        self.redis = client
        self.access = access
        """How `client` was built: `open` names the setting behind a refusal with it."""
        self.wait_replicas = wait_replicas
        """With replicas (Sentinel), a write counts only once this many replicas have it: a
        failover then cannot drop a write that was acknowledged (Redis replicates
        asynchronously; an old master may accept writes until it is demoted)."""
        self.wait_timeout = wait_timeout
        self.prefix = prefix
        self.node_id = node_id
        self.epochs: dict[str, int] = {}
        """ClientId -> epoch this node owns it at (every session write carries it)."""
        self._snapshot: dict[str, dict[str, bytes]] = {}
        self._claim = client.register_script(_CLAIM)
        self._fenced = client.register_script(_FENCED)
        self._heartbeat = client.register_script(_HEARTBEAT)
        self._members = client.register_script(_MEMBERS)
        self.rejected_writes = 0
        self._queue: list[_Batch] = []
        self._writer: asyncio.Task[None] | None = None

    # -- keys --------------------------------------------------------------------------------------

    def client_key(self, client_id: str) -> str:
        return f"{self.prefix}:c:{client_id}"

    def owned_key(self, node_id: str) -> str:
        return f"{self.prefix}:owned:{node_id}"

    # -- lifecycle ---------------------------------------------------------------------------------

    async def open(self) -> None:
        """Check Redis answers and load the retained messages. Sessions are not loaded here:
        the cluster takes over what a previous run of this node left (`Cluster.start`).
        Credentials or TLS that Redis refuses raise RedisSetupError naming the setting."""
        try:
            retained = await self.retained()
        except RedisError as exc:
            error = self.setup_error(exc)
            if error is not None:
                raise error from None
            raise StoreUnavailable(f"Redis is not usable: {exc}") from exc
        self._snapshot = {KIND_RETAINED: retained}
        log.info("registry: %d retained messages", len(retained))

    async def close(self) -> None:
        await close_client(self.redis)

    def setup_error(self, exc: RedisError) -> RedisSetupError | None:
        """The settings' fault behind a Redis error (refused credentials, a command the ACL
        user may not run, TLS), naming the setting; None for others (Redis down)."""
        reason = explain(exc, self.access) if self.access is not None else None
        return None if reason is None else RedisSetupError(reason)

    # -- the node's keyed records ------------------------------------------------------------------

    def meta(self, kind: str) -> dict[str, bytes]:
        """What `open` loaded (the retained messages), for the node's start-up restore."""
        return self._snapshot.get(kind, {})

    def submit_meta(self, updates: Sequence[MetaUpdate]) -> asyncio.Future[None]:
        """Queue the updates; the future completes when Redis has applied them (or fails as
        `put_meta` says). Writes reach Redis in the order they were submitted."""
        per_client: dict[str, list[Any]] = {}
        retained: list[MetaUpdate] = []
        for update in updates:
            if update.kind == KIND_RETAINED:
                retained.append(update)
                continue
            if update.kind == KIND_QOS2_IN:
                client_id, _, packet_id = update.key.rpartition("\x00")
                name = f"q2:{packet_id}"
            else:
                client_id, name = update.key, _FIELD_OF_KIND[update.kind]
            ops = per_client.setdefault(client_id, [])
            if update.value is None:
                ops += ["D", name]
            else:
                ops += ["S", name, update.value]
        return self._submit(per_client, retained)

    async def put_meta(self, updates: Sequence[MetaUpdate], *, durable: bool = True) -> None:
        """Apply updates: retained messages directly, session records only under the epoch
        this node owns each client at. Raises StaleOwner naming the clients whose writes were
        refused (the others are applied), StoreUnavailable if Redis cannot be reached."""
        await self.submit_meta(updates)

    async def end_session(self, client_id: str) -> None:
        """Delete everything of the client (clean session ended, session expired)."""
        await self._submit({client_id: ["X", client_id]}, [])
        self.epochs.pop(client_id, None)

    def _submit(
        self, per_client: dict[str, list[Any]], retained: list[MetaUpdate]
    ) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        writes = [(c, self.epochs.get(c), ops) for c, ops in per_client.items()]
        self._queue.append(_Batch(writes, retained, future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write_queued())
        return future

    async def _write_queued(self) -> None:
        """Send every queued write in one pipeline per round trip (one connection, in order)."""
        while self._queue:
            batches, self._queue = self._queue, []
            try:
                results = await self._execute(batches)
            except RedisError as exc:
                error = _unavailable(exc)
                for batch in batches:
                    _fail(batch.future, error)
                continue
            except Exception as exc:
                # Any other failure too: unanswered, these writes' waiters would wait forever.
                log.error("registry: writes failed: %r", exc)
                error = StoreUnavailable(f"registry writes failed: {exc!r}")
                for batch in batches:
                    _fail(batch.future, error)
                continue
            position = 0
            for batch in batches:
                refused = []
                for client_id, epoch, _ops in batch.writes:
                    if epoch is None:
                        refused.append(client_id)
                        continue
                    if not results[position]:
                        refused.append(client_id)
                        if self.epochs.get(client_id) == epoch:
                            del self.epochs[client_id]
                    position += 1
                position += len(batch.retained)
                if refused:
                    self.rejected_writes += len(refused)
                    _fail(batch.future, StaleOwner(refused))
                elif not batch.future.done():
                    batch.future.set_result(None)

    async def _execute(self, batches: list[_Batch]) -> list[Any]:
        key = f"{self.prefix}:retained"
        async with self.redis.pipeline(transaction=False) as pipe:
            for batch in batches:
                for client_id, epoch, ops in batch.writes:
                    if epoch is None:
                        continue
                    await self._fenced(
                        keys=[self.client_key(client_id), self.owned_key(self.node_id)],
                        args=[epoch, *ops],
                        client=pipe,
                    )
                for update in batch.retained:
                    if update.value is None:
                        pipe.hdel(key, update.key)
                    else:
                        pipe.hset(key, update.key, update.value)
            if self.wait_replicas:
                pipe.wait(self.wait_replicas, int(self.wait_timeout * 1000))
            results = list(await pipe.execute())
        if self.wait_replicas:
            self._check_replicated(results.pop())
        return results

    def _check_replicated(self, replicas: int) -> None:
        if replicas < self.wait_replicas:
            raise RedisTimeout(
                f"only {replicas} of {self.wait_replicas} Redis replicas confirmed the write"
            )

    # -- ownership ---------------------------------------------------------------------------------

    async def claim(
        self,
        client_id: str,
        clean: bool | None,
        *,
        only_from: str = "",
        identity: str | None = None,
    ) -> Claim | None:
        """Take the client over (atomically, at the next epoch), recording its clean-session
        flag (None: keep it). With `only_from`, only if that node owns it now (adopting a dead
        node's sessions); None if it does not. With `identity`, only if the session is
        unbound (then bound to it) or bound to it; raises SessionBound, changing nothing, if
        it belongs to another."""
        flag = "" if clean is None else "1" if clean else "0"
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                await self._claim(
                    keys=[self.client_key(client_id), f"{self.prefix}:epoch"],
                    args=[
                        f"{self.prefix}:owned:",
                        self.node_id,
                        flag,
                        only_from,
                        client_id,
                        identity or "",
                    ],
                    client=pipe,
                )
                if self.wait_replicas:
                    pipe.wait(self.wait_replicas, int(self.wait_timeout * 1000))
                replies = await pipe.execute()
            if self.wait_replicas:
                self._check_replicated(replies[1])
        except RedisError as exc:
            raise _unavailable(exc) from exc
        result = replies[0]
        if result is None:
            return None
        epoch, flat = int(result[0]), result[1]
        if epoch == 0:  # epochs count from 1: the claim was refused for the owner `flat`
            raise SessionBound(flat.decode())
        records = {flat[i].decode(): flat[i + 1] for i in range(0, len(flat), 2)}
        previous = records.pop("node", b"").decode()
        records.pop("epoch", None)
        records.pop("who", None)
        was_clean = records.pop("clean", b"0") == b"1"
        self.epochs[client_id] = epoch
        return Claim(epoch, previous, records, was_clean)

    def disown(self, client_id: str) -> None:
        """This node no longer owns the client (released to another node)."""
        self.epochs.pop(client_id, None)

    async def owned_by(self, node_id: str) -> list[str]:
        return [m.decode() for m in await self.redis.smembers(self.owned_key(node_id))]

    async def owner(self, client_id: str) -> str:
        value = await self.redis.hget(self.client_key(client_id), "node")
        return value.decode() if value else ""

    async def owner_epoch(self, client_id: str) -> tuple[str, int]:
        """The node that owns the client now and the epoch it took it at (("", 0): nobody)."""
        node, epoch = await self.redis.hmget(self.client_key(client_id), ["node", "epoch"])
        return (node.decode() if node else "", int(epoch) if epoch else 0)

    async def retained(self) -> dict[str, bytes]:
        """Every retained message (re-read after a partition heals)."""
        raw = await self.redis.hgetall(f"{self.prefix}:retained")
        return {k.decode(): v for k, v in raw.items()}

    # -- membership --------------------------------------------------------------------------------

    async def heartbeat(self, info: dict[str, Any], ttl: float) -> bool:
        """Announce this node alive for `ttl` seconds more (Redis's clock). True if the previous
        heartbeat had lapsed: this node may have been taken for dead."""
        lapsed = await self._heartbeat(
            keys=[f"{self.prefix}:nodes", f"{self.prefix}:nodeinfo"],
            args=[self.node_id, int(ttl * 1000), json.dumps(info, separators=(",", ":"))],
        )
        return bool(lapsed)

    async def lease_of(self, node_id: str) -> tuple[int | None, int]:
        """(when `node_id`'s heartbeat expires, Redis's clock now), in ms by Redis's clock;
        None if it has none (`bridge.cluster.lease`)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zscore(f"{self.prefix}:nodes", node_id)
            pipe.time()
            score, (seconds, micros) = await pipe.execute()
        return (None if score is None else int(score), seconds * 1000 + micros // 1000)

    async def lost_clients(self) -> list[str]:
        """Clients this node holds whose epoch in Redis is no longer its own (taken over while
        this node was thought dead); they are forgotten here."""
        clients = list(self.epochs)
        if not clients:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for client_id in clients:
                pipe.hget(self.client_key(client_id), "epoch")
            current = await pipe.execute()
        lost = []
        for client_id, epoch in zip(clients, current, strict=True):
            held = self.epochs.get(client_id)
            if held is not None and (epoch is None or int(epoch) != held):
                del self.epochs[client_id]
                lost.append(client_id)
        return lost

    async def members(self) -> tuple[dict[str, dict[str, Any]], list[str]]:
        """(alive node -> its info, dead nodes not yet cleaned up)."""
        flat = await self._members(keys=[f"{self.prefix}:nodes", f"{self.prefix}:nodeinfo"])
        items = [x.decode() for x in flat[1:]]
        split = items.index("")
        alive = {items[i]: json.loads(items[i + 1]) for i in range(0, split, 2)}
        return alive, items[split + 1 :]

    async def mark_dead(self) -> None:
        """This node stops: let the survivors take over its sessions now, not after a timeout."""
        await self.redis.zadd(f"{self.prefix}:nodes", {self.node_id: 0})

    async def lock_cleanup(self, dead: str, ttl: float) -> bool:
        """Whether this node got the right to clean up after `dead` (for `ttl` seconds)."""
        return bool(
            await self.redis.set(
                f"{self.prefix}:cleanup:{dead}", self.node_id, nx=True, px=int(ttl * 1000)
            )
        )

    async def unlock_cleanup(self, node_id: str) -> None:
        await self.redis.delete(f"{self.prefix}:cleanup:{node_id}")

    async def forget_node(self, dead: str) -> None:
        """The dead node's cleanup is done: drop it from membership."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.zrem(f"{self.prefix}:nodes", dead)
            pipe.hdel(f"{self.prefix}:nodeinfo", dead)
            pipe.delete(self.owned_key(dead))
            pipe.delete(f"{self.prefix}:cleanup:{dead}")
            await pipe.execute()
