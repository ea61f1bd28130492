"""Taking over the sessions of a dead node (or of this node's previous run), and what a session
handed to another node leaves behind: `take_over_node`, `handed_filters`.

A survivor holding the registry's clean-up lock adopts the dead node's persistent sessions
(their interest is re-advertised as they are adopted), publishes the wills of its connected
clients once, and deletes its clean sessions.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from redis.exceptions import RedisError

from bridge.cluster import wire
from bridge.state import session_filters, will_of
from bridge.storage.base import StoreUnavailable

if TYPE_CHECKING:
    from bridge.cluster.host import ClusterHost
    from bridge.cluster.registry import RedisRegistry
    from bridge.settings import Config

log = logging.getLogger("bridge.cluster")


class TakingOver(Protocol):
    """What taking over reads and does of the cluster membership (`Cluster`)."""

    node: ClusterHost
    node_id: str
    registry: RedisRegistry
    config: Config

    def peer_gone(self, peer: str) -> None: ...

    def broadcast(self, frame: wire.Frame) -> None: ...


async def try_take_over(cluster: TakingOver, dead: str) -> None:
    """`take_over_node`, its failure logged (the next membership round tries again)."""
    try:
        await take_over_node(cluster, dead)
    except (StoreUnavailable, RedisError, OSError) as exc:
        log.error("taking over the sessions of dead node %s failed: %s", dead, exc)
    except Exception:
        log.exception("taking over the sessions of dead node %s failed", dead)


async def take_over_node(cluster: TakingOver, dead: str) -> None:
    """Adopt the sessions a dead node (or this node's previous run) left: publish the wills
    of its connected clients once, keep persistent sessions, delete clean ones."""
    registry, node = cluster.registry, cluster.node
    if not await registry.lock_cleanup(dead, ttl=max(30.0, cluster.config.node_timeout * 3)):
        return
    clients = await registry.owned_by(dead)
    if dead != cluster.node_id:
        log.warning("node %s is dead: taking over its %d sessions", dead, len(clients))
    adopted = wills = 0
    for client_id in clients:
        if node.is_connected(client_id):
            continue  # reconnected here already
        claim = await registry.claim(client_id, None, only_from=dead)
        if claim is None:
            continue  # taken over by a client's new connection meanwhile
        if not claim.was_clean and "subs" in claim.records:
            node.adopt_session(client_id, claim)
            adopted += 1
        will = will_of(claim.online)
        if will is not None:
            wills += 1
            await node.publish_orphan_will(client_id, will, claim.online)
        elif claim.online is not None:
            await node.clear_online(client_id)
        if claim.was_clean or "subs" not in claim.records:
            await registry.end_session(client_id)
    if dead == cluster.node_id:
        await registry.unlock_cleanup(dead)
        return
    await registry.forget_node(dead)
    cluster.peer_gone(dead)
    cluster.broadcast(wire.NodeGone(dead))
    log.warning(
        "node %s: %d sessions taken over, %d adopted, %d wills published",
        dead,
        len(clients),
        adopted,
        wills,
    )


def handed_filters(state: bytes) -> set[str]:
    """The (non-shared) filters of a session in the state `release_session` hands over."""
    if not state:
        return set()
    return session_filters(json.loads(state)["subs"])


class HandedInterest:
    """Filters of sessions this node handed to a peer, counted as the peer's interest until it
    announces them itself.

    The session leaves this node's trie at once, and the new owner announces its filters only
    once it has adopted the session: a publish here in between would miss the session's queues.
    What the peer has not announced within `interest_grace` is withdrawn (it started the session
    afresh)."""

    def __init__(
        self,
        add: Callable[[str, tuple[str, ...]], object],
        remove: Callable[[str, set[str]], None],
        config: Config,
    ) -> None:
        self._add = add
        self._remove = remove
        self.grace = config.interest_grace
        self.pending: dict[str, dict[str, float]] = {}
        """Peer -> handed filter it has not announced yet -> when it is withdrawn (event-loop
        time). `Interest.add_filters` takes a filter out once the peer announces it."""

    def expect(self, peer: str, filters: set[str], known: set[str]) -> None:
        """A session subscribed to `filters` went to `peer` (whose interest: `known`). Each of
        them not announced by the peer itself counts for `interest_grace` from now, also when
        it was handed before (a session moving back and forth)."""
        pending = self.pending.setdefault(peer, {})
        fresh = tuple(sorted(f for f in filters if f not in known))
        if fresh:
            self._add(peer, fresh)
        loop = asyncio.get_running_loop()
        due = loop.time() + self.grace
        counted = [f for f in filters if f in pending or f in fresh]
        for topic_filter in counted:
            pending[topic_filter] = due
        if not pending:
            del self.pending[peer]
        elif counted:
            loop.call_at(due, self._withdraw, peer)

    def _withdraw(self, peer: str) -> None:
        pending = self.pending.get(peer)
        if not pending:
            return
        now = asyncio.get_running_loop().time()
        stale = {f for f, due in pending.items() if due <= now}
        for topic_filter in stale:
            del pending[topic_filter]
        if not pending:
            del self.pending[peer]
        if stale:
            self._remove(peer, stale)
