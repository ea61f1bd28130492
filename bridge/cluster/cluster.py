"""A node's membership in the cluster: the registry, the peer links and the replicated interest.

Every node keeps the full subscription picture. Its own clients are in the node's trie under
their ClientIds; what a peer has subscribers for is in the same trie under the peer's pseudo id
(`PEER_PREFIX` + node id, which no ClientId can be). A publish is matched once: a QoS 0 message
is forwarded to each peer that appears among the matches, a QoS 1/2 message is stored on every
matching filter's queue (whoever reads it) and those peers are told the queues grew.

Interest travels as changes (`AddFilters`, `RemoveFilters`, `SharedMember`...); when a link
comes up each side replays all of its interest once (`SyncBegin` ... `SyncEnd`). A removal is
sent only after `interest_grace`: when a session moves from node A to node B, B's interest must
reach the other nodes before A's removal does, or a publish in between would miss the session's
queue. A peer whose link is down keeps its interest until it is known dead and cleaned up.

Membership: each node heartbeats into Redis; a node whose heartbeat lapsed for `node_timeout` is
dead. One survivor (holding a lock) takes over its sessions: persistent ones are adopted (their
interest re-advertised), wills of its connected clients published once, clean ones deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from bridge.cluster import wire
from bridge.cluster.announce import Announcer
from bridge.cluster.peer_auth import peer_auth
from bridge.cluster.peers import PeerLink, advertise_address, dial, listen
from bridge.cluster.registry import RedisRegistry
from bridge.cluster.releases import Releases
from bridge.cluster.takeover import (
    HandedInterest,
    handed_filters,
    take_over_node,
    try_take_over,
)
from bridge.cluster.trust import admit_link
from bridge.config import Config, parse_listen
from bridge.mqtt.topics import parse_shared
from bridge.router.queues import ANY_PEER, peer_subscriber
from bridge.storage.base import Message

if TYPE_CHECKING:
    from bridge.cluster.host import ClusterHost

log = logging.getLogger("bridge.cluster")


class Cluster:
    """Registry, peer links and interest of one node (see the module docstring)."""

    def __init__(
        self,
        node: ClusterHost,
        registry: RedisRegistry,
        config: Config,
        *,
        holds_sessions: bool = True,
    ) -> None:
        self.node = node
        self.holds_sessions = holds_sessions
        """False for a member that serves no clients (standalone notify): it never takes over
        a dead node's sessions."""
        self.registry = registry
        self.config = config
        self.node_id = node.node_id
        self.boot_id = uuid.uuid4().hex[:12]
        self.auth = peer_auth(config)
        """The keys and TLS contexts peer links authenticate with (`bridge.cluster.peer_auth`)."""
        self.accept_tls: Callable[[Callable[[], Any]], Callable[[], Any]] | None = None
        """Set by the server with peer TLS: wraps the peer listener's protocol factory so that
        failed TLS handshakes are counted and logged (`bridge.listeners.tls.TLSAcceptor`)."""
        self.links: dict[str, PeerLink] = {}
        self.members: dict[str, dict[str, Any]] = {}
        self.started_at = time.time()
        """Alive nodes (this one included) -> their registry info."""
        self._dialers: dict[str, asyncio.Task[None]] = {}
        self.peer_filters: dict[str, set[str]] = {}
        self._replay_filters: dict[str, set[str]] = {}
        self.peer_members: dict[str, dict[tuple[str, str], tuple[int, int]]] = {}
        self._replay_members: dict[str, set[tuple[str, str]]] = {}
        self.member_node: dict[str, str] = {}
        """Remote shared-subscription member -> the node holding its session."""
        self.remote_online: set[str] = set()
        self.local_counts: Counter[str] = Counter()
        """Filter -> local sessions subscribed to it (what this node advertises)."""
        self._removals: set[str] = set()
        self._removal_timer: asyncio.TimerHandle | None = None
        self.handed = HandedInterest(self._add_filters, self._remove_filters, config)
        self._synced: set[str] = set()
        """Peers whose interest replay ended on their current link."""
        self.releases = Releases(
            self.links, registry, node, self.handed_to, config.takeover_timeout
        )
        """ClientIds moving between this node and its peers (`Release`, `Released`)."""
        self.announcer = Announcer(self.links, node.refresh_queue_ends, node.spawn)
        """Tells peers what this node stored for their readers (and covers for their silence)."""
        self._server: asyncio.base_events.Server | None = None
        self._membership: asyncio.Task[None] | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._judge_after = 0.0
        self.advertise = ""
        self._started = False
        self.leaving = False
        self._leaving: set[str] = set()
        """Peers that announced they are stopping (their sessions are to be taken over)."""
        self.stats: Counter[str] = Counter()

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen for peers, join the membership, take back what a previous run of this node
        id left in the registry, then keep membership and links up."""
        loop = asyncio.get_running_loop()
        host, port = parse_listen(self.config.peer_listen)
        self._server = await listen(self, host, port, self.accept_tls)
        bound = self._server.sockets[0].getsockname()
        self.advertise = self.config.peer_advertise or advertise_address(host, bound[1])
        log.info("peer links on %s:%s, advertised as %s", bound[0], bound[1], self.advertise)
        try:
            await self._heartbeat()  # the first script run: an ACL too narrow shows here
        except RedisError as exc:
            error = self.registry.setup_error(exc)
            if error is not None:
                raise error from None
            raise
        self._judge_after = time.monotonic() + self.config.node_timeout
        if self.holds_sessions:
            await self.take_over_node(self.node_id)
        with contextlib.suppress(RedisError, OSError):
            self._update_members((await self.registry.members())[0])  # dial without waiting
        self._started = True
        self._membership = loop.create_task(self._membership_loop())
        self._keeper = loop.create_task(self._keep_links())

    async def wait_synced(self, timeout: float) -> bool:
        """Until every alive member has replayed its interest to this node over a link (True)
        or `timeout` passed (False, logged). A node takes clients only after this: a publish
        it routed before knowing its peers' subscribers would be stored on no queue."""
        deadline = time.monotonic() + timeout
        while True:
            missing = sorted(
                node_id
                for node_id, info in self.members.items()
                if node_id != self.node_id and info.get("peer") and node_id not in self._synced
            )
            if not missing:
                return True
            if time.monotonic() >= deadline:
                log.warning(
                    "no interest from %s after %.0f s: taking clients anyway", missing, timeout
                )
                return False
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        """Leave: the survivors take over this node's remaining sessions at once."""
        self.leaving = True
        for task in (self._membership, self._keeper):
            if task is not None:
                task.cancel()
        for task in self._dialers.values():
            task.cancel()
        with contextlib.suppress(RedisError, OSError):
            await self.registry.mark_dead()
        self.broadcast(wire.NodeGone(self.node_id))  # "take over my sessions now"
        # Answer Release requests while the survivors adopt (bounded).
        deadline = time.monotonic() + self.config.drain_timeout
        while time.monotonic() < deadline and self.links:
            try:
                if not await self.registry.owned_by(self.node_id):
                    break
            except (RedisError, OSError):
                break  # Redis gone: nothing more to wait for
            await asyncio.sleep(0.1)
        for link in list(self.links.values()):
            link.close("node stopping")
        if self._server is not None:
            self._server.close()
        if self._removal_timer is not None:
            self._removal_timer.cancel()
        self.announcer.stop()

    # -- membership ------------------------------------------------------------------------------

    async def _heartbeat(self) -> None:
        admin = ""
        if self.config.admin_listen:
            # Where the admin API forwards requests for this node's clients
            # (bridge.operations.admin).
            admin_host, admin_port = parse_listen(self.config.admin_listen)
            admin = advertise_address(admin_host, admin_port)
        info = {
            "peer": self.advertise,
            "boot": self.boot_id,
            "role": "bridge" if self.holds_sessions else "notify",
            "admin": admin,
            "mqtt": advertise_address(*parse_listen(self.config.listen[0]))
            if self.config.listen
            else "",
            "connections": self.node.connected_count(),
            "started": self.started_at,
            "features": list(wire.FEATURES),
        }
        lapsed = await self.registry.heartbeat(info, self.config.node_timeout)
        if lapsed and self._started:
            # Others may have judged this node dead and taken its sessions: let go of those.
            lost = await self.registry.lost_clients()
            if lost:
                log.warning(
                    "this node's heartbeat lapsed and %d of its sessions were taken over by "
                    "other nodes; closing them here",
                    len(lost),
                )
                self.node.lost_ownership(lost)

    async def _membership_loop(self) -> None:
        interval = max(0.2, self.config.node_timeout / 6)
        beats = 0
        while True:
            await asyncio.sleep(interval)
            try:
                beats += 1
                if beats % 2 == 0:
                    await self._heartbeat()
                alive, dead = await self.registry.members()
            except (RedisError, OSError) as exc:
                self._redis_trouble(exc)
                continue
            self._update_members(alive)
            now = time.monotonic()
            if now >= self._judge_after and self.holds_sessions:
                for node_id in dead:
                    # A node still talking on its link is alive, whatever Redis says (its
                    # heartbeats may have been lost in a Redis failover).
                    talking = node_id in self.links and node_id not in self._leaving
                    if node_id != self.node_id and not talking:
                        await try_take_over(self, node_id)
            for node_id in list(self.peer_filters) + list(self.peer_members):
                if node_id == ANY_PEER:
                    continue  # not a node: what a session handed over left (`HandedInterest`)
                if node_id not in alive and node_id not in dead and node_id not in self.links:
                    self.peer_gone(node_id)  # cleaned up elsewhere; its NodeGone was lost

    async def _keep_links(self) -> None:
        """Ping and check the links every half second, apart from the membership loop (whose
        Redis calls may each take `redis_timeout` while Redis is away)."""
        while True:
            await asyncio.sleep(0.5)
            now = time.monotonic()
            for link in list(self.links.values()):
                link.check_alive(now)
            cut_off = any(peer not in self.links for peer in self.members if peer != self.node_id)
            if cut_off and not self.leaving and self.announcer.refresh_due(now):
                # A live peer we have no link to cannot tell us what it stores for our readers.
                self.announcer.refresh_soon()

    def _redis_trouble(self, exc: BaseException) -> None:
        # Others' heartbeats failed too: judge nobody dead until everyone had time to beat.
        self._judge_after = time.monotonic() + self.config.node_timeout
        self.stats["membership_errors"] += 1
        if self.stats["membership_errors"] % 10 == 1:
            log.warning("cluster membership: Redis unavailable: %s", exc)

    def _update_members(self, alive: dict[str, dict[str, Any]]) -> None:
        self.members = alive
        for node_id in alive:
            if node_id > self.node_id and node_id not in self._dialers:
                self._dialers[node_id] = self.node.spawn(
                    dial(self, node_id, alive[node_id].get("peer", ""))
                )
        for node_id, task in list(self._dialers.items()):
            if task.done():
                del self._dialers[node_id]

    async def refresh_members(self) -> dict[str, dict[str, Any]]:
        """Re-read the live members now (a peer dialing in may be newer than `members`)."""
        alive = (await self.registry.members())[0]
        self._update_members(alive)
        return alive

    def should_dial(self, node_id: str) -> bool:
        return not self.leaving and node_id in self.members

    def peer_address(self, node_id: str) -> str:
        return str(self.members.get(node_id, {}).get("peer", ""))

    def another_node(self) -> str:
        """The MQTT address of another live bridge node ("" if none is known): what a v5
        client is told to use instead when this node shuts down."""
        for node_id, info in sorted(self.members.items()):
            if node_id != self.node_id and info.get("role") == "bridge" and info.get("mqtt"):
                return str(info["mqtt"])
        return ""

    async def take_over_node(self, dead: str) -> None:
        """Adopt the sessions a dead node (or this node's previous run) left (`takeover`)."""
        await take_over_node(self, dead)

    # -- links -----------------------------------------------------------------------------------

    async def admit(self, link: PeerLink) -> str:
        """Whether an authenticated peer may hold `link` ("" if so; `bridge.cluster.trust`)."""
        return await admit_link(self, link, time.monotonic())

    def link_refused(self, address: str, reason: str) -> None:
        """A link from `address` was refused before it came up: counted and logged (throttled)."""
        self.auth.refusals.refuse(address, reason)
        self.node.metrics.inc("peer_links_refused")

    def link_up(self, link: PeerLink) -> None:
        """A link was authenticated and admitted: replace an older link to that peer (of its
        previous boot, `admit_link` saw to that) and replay interest."""
        old = self.links.get(link.peer_id)
        if old is not None and old is not link:
            old.up = False  # its loss must not unregister the new link
            old.close("replaced by a newer link")
        self.links[link.peer_id] = link
        log.info("peer link to %s up (boot %s)", link.peer_id, link.peer_boot)
        self.stats["links_up"] += 1
        link.send(wire.SyncBegin())
        for frame in wire.chunked(sorted(set(self.local_counts) | self._removals), wire.AddFilters):
            link.send(frame)
        for share_filter, client_id, qos in self.node.local_shared_members():
            online = int(self.node.is_connected(client_id))
            link.send(wire.SharedMember(share_filter, client_id, qos, online))
        link.send(wire.SyncEnd())
        self.node.spawn(self._after_link_up())

    async def _after_link_up(self) -> None:
        """What may have been missed while the link was down: retained changes and queue
        growth announcements. Re-read both."""
        try:
            retained = await self.registry.retained()
        except (RedisError, OSError) as exc:
            log.warning("cannot re-read retained messages: %s", exc)
        else:
            self.node.replace_retained(retained)
        await self.node.refresh_queue_ends()

    def link_down(self, link: PeerLink) -> None:
        if self.links.get(link.peer_id) is link:
            del self.links[link.peer_id]
            self._synced.discard(link.peer_id)
            self.stats["links_down"] += 1
            if not self.leaving:
                self.announcer.refresh_soon()  # it may have stored messages it did not announce
        self.releases.link_lost(link.peer_id)

    def on_frame(self, link: PeerLink, frame: wire.Frame) -> None:
        """A frame from an up link."""
        peer = link.peer_id
        node = self.node
        if isinstance(frame, wire.Forward | wire.ForwardMeta):
            node.deliver_forwarded(wire.message_of(frame))
        elif isinstance(frame, wire.Wake):
            node.queues_woken(frame.queues)
        elif isinstance(frame, wire.Grew):
            node.queues_grew(dict(zip(frame.queues, frame.ends, strict=True)), forward=False)
        elif isinstance(frame, wire.Deliver | wire.DeliverMeta):
            node.deliver_to(frame.client_id, wire.message_of(frame))
        elif isinstance(frame, wire.AddFilters):
            self._add_filters(peer, frame.filters)
        elif isinstance(frame, wire.RemoveFilters):
            self._remove_filters(peer, frame.filters)
        elif isinstance(frame, wire.SharedMember):
            self._shared_member(peer, frame)
        elif isinstance(frame, wire.SharedMemberGone):
            self._shared_member_gone(peer, frame.share_filter, frame.client_id)
        elif isinstance(frame, wire.SyncBegin):
            self._replay_filters[peer] = set()
            self._replay_members[peer] = set()
        elif isinstance(frame, wire.SyncEnd):
            self._end_replay(peer)
            self._synced.add(peer)
        elif isinstance(frame, wire.Retained):
            node.retained_from_peer(frame.topic, frame.record)
        elif isinstance(frame, wire.Release):
            node.spawn(self.releases.answer(link, frame))
        elif isinstance(frame, wire.Released):
            self.releases.answered(frame)
        elif isinstance(frame, wire.NodeGone):
            if frame.node_id == peer:
                self._leaving.add(peer)  # it drains: take over its sessions without waiting
            elif frame.node_id != self.node_id and frame.node_id not in self.links:
                self.peer_gone(frame.node_id)
        else:
            link.close(f"unexpected {type(frame).__name__} frame")

    def broadcast(self, frame: wire.Frame) -> None:
        for link in self.links.values():
            link.send(frame)

    # -- interest: what peers subscribe to -------------------------------------------------------

    def _add_filters(self, peer: str, filters: tuple[str, ...]) -> None:
        known = self.peer_filters.setdefault(peer, set())
        replay = self._replay_filters.get(peer)
        handed = self.handed.pending.get(peer)
        subscriber = peer_subscriber(peer)
        for topic_filter in filters:
            if replay is not None:
                replay.add(topic_filter)
            if handed:
                handed.pop(topic_filter, None)  # announced by the peer itself now
            if topic_filter not in known:
                known.add(topic_filter)
                self.node.trie.subscribe(topic_filter, subscriber, 0)

    def _remove_filters(self, peer: str, filters: tuple[str, ...] | set[str]) -> None:
        known = self.peer_filters.get(peer)
        if not known:
            return
        subscriber = peer_subscriber(peer)
        for topic_filter in filters:
            if topic_filter in known:
                known.discard(topic_filter)
                self.node.trie.unsubscribe(topic_filter, subscriber)

    def handed_to(self, peer: str, state: bytes) -> None:
        """The session in `state` (`release_session`'s answer) went to `peer` (`ANY_PEER`: to a
        node not known here yet): keep its filters as that peer's interest until it announces
        them (`HandedInterest`)."""
        self.handed.expect(peer, handed_filters(state), self.peer_filters.get(peer, set()))

    def _shared_member(self, peer: str, frame: wire.SharedMember) -> None:
        key = (frame.share_filter, frame.client_id)
        replay = self._replay_members.get(peer)
        if replay is not None:
            replay.add(key)
        if self.node.holds_session(frame.client_id):
            return  # the session lives here now: this is an old announcement
        parsed = parse_shared(frame.share_filter)
        if parsed is None:
            return
        self.peer_members.setdefault(peer, {})[key] = (frame.qos, frame.online)
        self.member_node[frame.client_id] = peer
        if frame.online:
            self.remote_online.add(frame.client_id)
        else:
            self.remote_online.discard(frame.client_id)
        group, inner = parsed
        self.node.shared.subscribe(frame.share_filter, group, inner, frame.client_id, frame.qos)

    def _shared_member_gone(self, peer: str, share_filter: str, client_id: str) -> None:
        members = self.peer_members.get(peer, {})
        if members.pop((share_filter, client_id), None) is None:
            return
        if not self.node.holds_session(client_id):
            self.node.shared.unsubscribe(share_filter, client_id)
        still_member = any(c == client_id for _f, c in members)
        if not still_member and self.member_node.get(client_id) == peer:
            del self.member_node[client_id]
            self.remote_online.discard(client_id)

    def _end_replay(self, peer: str) -> None:
        filters = self._replay_filters.pop(peer, set())
        members = self._replay_members.pop(peer, set())
        self._remove_filters(peer, self.peer_filters.get(peer, set()) - filters)
        for share_filter, client_id in set(self.peer_members.get(peer, {})) - members:
            self._shared_member_gone(peer, share_filter, client_id)
        log.info(
            "peer %s: %d filters and %d shared members after its replay",
            peer,
            len(filters),
            len(members),
        )

    def forget_peer(self, peer: str) -> None:
        """Drop everything known of a peer's interest (it is dead and cleaned up)."""
        self._remove_filters(peer, set(self.peer_filters.get(peer, ())))
        self.peer_filters.pop(peer, None)
        for share_filter, client_id in list(self.peer_members.get(peer, {})):
            self._shared_member_gone(peer, share_filter, client_id)
        self.peer_members.pop(peer, None)
        self._replay_filters.pop(peer, None)
        self._replay_members.pop(peer, None)
        self.handed.pending.pop(peer, None)
        self._synced.discard(peer)
        self._leaving.discard(peer)

    def peer_gone(self, peer: str) -> None:
        """A peer is dead: forget its interest, and re-read what it may not have announced."""
        self.forget_peer(peer)
        if not self.leaving:
            self.announcer.refresh_soon()

    # -- interest: what this node advertises -----------------------------------------------------

    def local_filter_added(self, topic_filter: str) -> None:
        self.local_counts[topic_filter] += 1
        if self.local_counts[topic_filter] == 1:
            if topic_filter in self._removals:
                self._removals.discard(topic_filter)  # never withdrawn: nothing to re-announce
            else:
                self.broadcast(wire.AddFilters((topic_filter,)))

    def local_filter_removed(self, topic_filter: str) -> None:
        count = self.local_counts[topic_filter] - 1
        if count > 0:
            self.local_counts[topic_filter] = count
            return
        del self.local_counts[topic_filter]
        self._removals.add(topic_filter)
        if self._removal_timer is None:
            self._removal_timer = asyncio.get_running_loop().call_later(
                self.config.interest_grace, self._send_removals
            )

    def _send_removals(self) -> None:
        self._removal_timer = None
        removed = sorted(f for f in self._removals if f not in self.local_counts)
        self._removals.clear()
        for frame in wire.chunked(removed, wire.RemoveFilters):
            self.broadcast(frame)

    def shared_member_changed(self, share_filter: str, client_id: str, qos: int) -> None:
        online = int(self.node.is_connected(client_id))
        self.broadcast(wire.SharedMember(share_filter, client_id, qos, online))

    def shared_member_removed(self, share_filter: str, client_id: str) -> None:
        self.broadcast(wire.SharedMemberGone(share_filter, client_id))

    # -- messages to peers -----------------------------------------------------------------------

    def forward(self, peers: list[str], message: Message) -> None:
        """A QoS 0 message for these peers' subscribers, encoded once per frame kind (dropped,
        and counted, where a link is down or backed up: QoS 0 is at most once)."""
        encoded: dict[bool, bytes] = {}  # by whether the frame carries the MQTT 5 metadata
        for peer in peers:
            link = self.links.get(peer)
            if link is None:
                if peer == ANY_PEER:
                    continue  # a session on its way to another node: it reads its queues

                self.node.metrics.inc("dropped_peer_link")
                continue
            metadata = bool(message.properties) and self.speaks_metadata(link)
            data = encoded.get(metadata)
            if data is None:
                data = encoded[metadata] = wire.forward_frame(message, metadata=metadata)
            if not link.send_droppable(data):
                self.node.metrics.inc("dropped_peer_link")

    def deliver(self, client_id: str, message: Message) -> None:
        """A QoS 0 message for a shared member whose session a peer holds."""
        link = self.links.get(self.member_node.get(client_id, ""))
        metadata = link is not None and bool(message.properties) and self.speaks_metadata(link)
        data = wire.deliver_frame(client_id, message, metadata=metadata)
        if link is None or not link.send_droppable(data):
            self.node.metrics.inc("dropped_peer_link")

    def speaks_metadata(self, link: PeerLink) -> bool:
        """Whether the peer's node understands the frames carrying MQTT 5 metadata: its registry
        info says so, and is that of the boot at the other end of the link (a peer restarted
        with an earlier version must not be sent them on the strength of stale info)."""
        info = self.members.get(link.peer_id)
        return (
            info is not None
            and info.get("boot") == link.peer_boot
            and wire.FEATURE_METADATA in info.get("features", ())
        )

    def wake(self, peer: str, ends: dict[str, int]) -> None:
        """Messages were stored on these queues for `peer`'s readers (see `Announcer.wake`)."""
        self.announcer.wake(peer, ends)

    def grew(self, peer: str, ends: dict[str, int]) -> None:
        links = self.links.values() if peer == ANY_PEER else [self.links.get(peer)]
        for link in links:
            if link is not None:
                link.send(wire.Grew(tuple(ends), tuple(ends.values())))

    def retained_changed(self, topic: str, record: bytes) -> None:
        self.broadcast(wire.Retained(topic, record))

    def link_states(self) -> dict[str, bool]:
        """Peer node -> whether its link is up, for every live member and every link."""
        states = {peer: False for peer in self.members if peer != self.node_id}
        for peer, link in self.links.items():
            states[peer] = link.up
        return states

    def is_reachable(self, client_id: str) -> bool:
        """A shared member that can take a message now: connected here or on a peer."""
        return self.node.is_connected(client_id) or client_id in self.remote_online

    def node_of(self, client_id: str) -> str | None:
        """The peer holding a remote shared member's session (None: local or unknown)."""
        return self.member_node.get(client_id)

    # -- takeover --------------------------------------------------------------------------------

    async def request_release(self, peer: str, client_id: str, epoch: int) -> bytes | None:
        """Ask the node that held the client to let it go (`Releases.request`)."""
        return await self.releases.request(peer, client_id, epoch)
