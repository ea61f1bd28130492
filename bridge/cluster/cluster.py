"""A node's membership in the cluster: the registry, the peer links, and the replicated
interest it owns (`bridge.cluster.interest.Interest`, which holds what peers subscribe to and
carries messages to and from them; the node's calls for it go through `Cluster`).

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
from bridge.cluster.confirm import Confirmations
from bridge.cluster.interest import FRAMES as INTEREST_FRAMES
from bridge.cluster.interest import Interest
from bridge.cluster.lease import Lease, wait_for_holder
from bridge.cluster.peer_auth import peer_auth
from bridge.cluster.peers import PING_INTERVAL, PeerLink, advertise_address, dial, listen
from bridge.cluster.registry import RedisRegistry
from bridge.cluster.releases import Releases
from bridge.cluster.takeover import take_over_node, try_take_over
from bridge.cluster.trust import admit_link
from bridge.router.queues import ANY_PEER
from bridge.settings import Config, parse_listen

if TYPE_CHECKING:
    from bridge.cluster.host import ClusterHost
    from bridge.storage.base import Message

log = logging.getLogger("bridge.cluster")

LINK_QUIET = 1.5 * PING_INTERVAL
"""A link silent this long counts as cut for the lease (`bridge.cluster.lease`): the peer
may be claiming this node's clients without being heard."""


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
        self.announcer = Announcer(self.links, node.refresh_queue_ends, node.spawn)
        """Tells peers what this node stored for their readers (and covers for their silence)."""
        self.interest = Interest(self, node, self.announcer, config)
        """What peers subscribe to, what this node advertises, messages to and from peers."""
        self.releases = Releases(
            self.links, registry, node, self.interest.handed_to, config.takeover_timeout
        )
        """ClientIds moving between this node and its peers (`Release`, `Released`)."""
        self.confirmations = Confirmations(
            self.links, config.interest_confirm_timeout, node.metrics.inc
        )
        """SUBSCRIBEs waiting for the peers to confirm their new interest."""
        self._server: asyncio.base_events.Server | None = None
        self._membership: asyncio.Task[None] | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._judge_after = 0.0
        self.lease = Lease(config.node_timeout)
        """This node's lease on its clients (`bridge.cluster.lease`)."""
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
        # The keeper ticks every half second. A pause shorter than the margin cannot carry the
        # lease past its lapse in Redis (that is what the margin is for).
        self.node.stalls.watch(loop.time(), max(1.0, self.lease.margin), self.after_stall)

    async def wait_synced(self, timeout: float) -> bool:
        """Until every alive member has replayed its interest to this node over a link (True)
        or `timeout` passed (False, logged). A node takes clients only after this: a publish
        it routed before knowing its peers' subscribers would be stored on no queue."""
        deadline = time.monotonic() + timeout
        while True:
            missing = sorted(
                node_id
                for node_id, info in self.members.items()
                if node_id != self.node_id
                and info.get("peer")
                and node_id not in self.interest.synced
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
        self.interest.stop()
        self.confirmations.stop()
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
        sent = time.monotonic()
        lapsed = await self.registry.heartbeat(info, self.config.node_timeout)
        if self.lease.renewed(sent):
            log.warning("heartbeat through to Redis again: this node serves clients again")
        cut_off = self._cut_off()
        if (lapsed or cut_off) and self._started:
            # Others may have judged this node dead and taken its sessions, or claimed them
            # without being able to ask it over a link: let go of those.
            lost = await self.registry.lost_clients()
            if lost:
                log.warning(
                    "%s %d of its sessions were taken over by other nodes; closing them here",
                    "this node's heartbeat lapsed and"
                    if lapsed
                    else "this node has no link to every member, and",
                    len(lost),
                )
                self.node.lost_ownership(lost)

    def _cut_off(self) -> bool:
        """Whether some live member may not reach this node (it could not ask it to let a
        client go): it has no link, or its link has been silent for `LINK_QUIET` (each side
        pings every `PING_INTERVAL`; a cut link is closed only after `DEAD_AFTER`)."""
        now = time.monotonic()
        for peer in self.members:
            if peer == self.node_id:
                continue
            link = self.links.get(peer)
            if link is None or now - link.last_heard > LINK_QUIET:
                return True
        return False

    async def wait_for_holder(self, holder: str, client_id: str) -> bool:
        """A Release `holder` did not answer: wait until it cannot be serving the client
        (`bridge.cluster.lease.wait_for_holder`)."""
        return await wait_for_holder(self.registry, holder, client_id, self.config.node_timeout)

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
            for node_id in self.interest.peers_with_interest():
                if node_id == ANY_PEER:
                    continue  # not a node: what a session handed over left (`HandedInterest`)
                if node_id not in alive and node_id not in dead and node_id not in self.links:
                    self.peer_gone(node_id)  # cleaned up elsewhere; its NodeGone was lost

    async def _keep_links(self) -> None:
        """Ping and check the links every half second, apart from the membership loop (whose
        Redis calls may each take `redis_timeout` while Redis is away)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(0.5)
            self.node.stalls.turned(loop.time())  # unless a connection noticed a pause first
            now = time.monotonic()
            for link in list(self.links.values()):
                link.check_alive(now)
            cut_off = self._cut_off()
            self._fence_if_lapsing(now, cut_off, "a member may not reach this node")
            if cut_off and not self.leaving and self.announcer.refresh_due(now):
                # A live peer we have no link to cannot tell us what it stores for our readers.
                self.announcer.refresh_soon()

    def after_stall(self, gap: float) -> bool:
        """This process did not run for `gap` seconds (`bridge.node.stalls`): nobody could ask
        it to let a client go meanwhile. True if its lease may have lapsed then, and it stopped
        serving."""
        now = time.monotonic()
        if not self._serving() or not self.lease.lapsed_meanwhile(now):
            return False
        self._fence(now, f"this process did not run for {gap:.1f} s")
        return True

    def _fence_if_lapsing(self, now: float, cut_off: bool, why: str) -> None:
        """Stop serving if the lease may lapse while a taker could not ask this node
        (`bridge.cluster.lease`)."""
        if self._serving() and self.lease.must_fence(now, cut_off):
            self._fence(now, why)

    def _serving(self) -> bool:
        return self.holds_sessions and self._started and not self.leaving

    def _fence(self, now: float, why: str) -> None:
        log.error(
            "no heartbeat through to Redis for %.1f s, and %s: it stops serving its clients "
            "until a heartbeat goes through (another node may be taking them over)",
            now - self.lease.renewed_from,
            why,
        )
        self.node.metrics.inc("lease_fences")
        self.node.fence_clients()

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
            self.confirmations.link_lost(old)
        self.links[link.peer_id] = link
        log.info("peer link to %s up (boot %s)", link.peer_id, link.peer_boot)
        self.stats["links_up"] += 1
        self.interest.replay_to(link)
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
        self.confirmations.link_lost(link)
        if self.links.get(link.peer_id) is link:
            del self.links[link.peer_id]
            self.interest.link_lost(link.peer_id)
            self.stats["links_down"] += 1
            if not self.leaving:
                self.announcer.refresh_soon()  # it may have stored messages it did not announce
        self.releases.link_lost(link.peer_id)

    def on_frame(self, link: PeerLink, frame: wire.Frame) -> None:
        """A frame from an up link: interest and messages go to `interest`, the rest is
        membership's."""
        peer = link.peer_id
        if isinstance(frame, INTEREST_FRAMES):
            self.interest.on_frame(peer, frame)
        elif isinstance(frame, wire.Confirm):
            link.send(wire.Confirmed(frame.token))  # every frame before it is applied
        elif isinstance(frame, wire.Confirmed):
            self.confirmations.confirmed(link, frame.token)
        elif isinstance(frame, wire.Release):
            self.node.spawn(self.releases.answer(link, frame))
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
        """Send `frame` on every up link."""
        for link in self.links.values():
            link.send(frame)

    # -- peers leaving ----------------------------------------------------------------------------

    def forget_peer(self, peer: str) -> None:
        """Drop everything known of a peer's interest (it is dead and cleaned up)."""
        self.interest.forget(peer)
        self._leaving.discard(peer)

    def peer_gone(self, peer: str) -> None:
        """A peer is dead: forget its interest, and re-read what it may not have announced."""
        self.forget_peer(peer)
        if not self.leaving:
            self.announcer.refresh_soon()

    # -- the node's calls for interest and messages (`Interest`) -------------------------------

    def local_filter_added(self, topic_filter: str) -> bool:
        """A session held here subscribed to `topic_filter` (`Interest.local_filter_added`)."""
        return self.interest.local_filter_added(topic_filter)

    def local_filter_removed(self, topic_filter: str) -> None:
        """A session held here left `topic_filter` (`Interest.local_filter_removed`)."""
        self.interest.local_filter_removed(topic_filter)

    def shared_member_changed(self, share_filter: str, client_id: str, qos: int) -> None:
        """A shared membership held here changed (`Interest.shared_member_changed`)."""
        self.interest.shared_member_changed(share_filter, client_id, qos)

    def shared_member_removed(self, share_filter: str, client_id: str) -> None:
        """A shared membership held here ended (`Interest.shared_member_removed`)."""
        self.interest.shared_member_removed(share_filter, client_id)

    def confirm_interest(self) -> asyncio.Future[None] | None:
        """Until every peer confirmed the interest announced so far (`Confirmations.confirm`;
        None: nothing to wait for)."""
        return self.confirmations.confirm()

    def handed_to(self, peer: str, state: bytes) -> None:
        """A session went to `peer` (`Interest.handed_to`)."""
        self.interest.handed_to(peer, state)

    def hold_arriving(self, filters: set[str]) -> None:
        """A session claimed from another node is on its way here (`Interest.hold_arriving`)."""
        self.interest.hold_arriving(filters)

    def release_arriving(self, filters: set[str]) -> None:
        """The session of `hold_arriving(filters)` is adopted, or will not be."""
        self.interest.release_arriving(filters)

    def forward(self, peers: list[str], message: Message) -> None:
        """A QoS 0 message for these peers' subscribers (`Interest.forward`)."""
        self.interest.forward(peers, message)

    def deliver(self, client_id: str, message: Message) -> None:
        """A QoS 0 message for a shared member a peer holds (`Interest.deliver`)."""
        self.interest.deliver(client_id, message)

    def wake(self, peer: str, ends: dict[str, int]) -> None:
        """Messages were stored for `peer`'s readers (`Interest.wake`)."""
        self.interest.wake(peer, ends)

    def grew(self, peer: str, ends: dict[str, int]) -> None:
        """These queues grew: tell `peer` (`Interest.grew`)."""
        self.interest.grew(peer, ends)

    def retained_changed(self, topic: str, record: bytes) -> None:
        """This node changed a retained message (`Interest.retained_changed`)."""
        self.interest.retained_changed(topic, record)

    def is_reachable(self, client_id: str) -> bool:
        """A shared member that can take a message now (`Interest.is_reachable`)."""
        return self.interest.is_reachable(client_id)

    def node_of(self, client_id: str) -> str | None:
        """The peer holding a remote shared member's session (`Interest.node_of`)."""
        return self.interest.node_of(client_id)

    def link_states(self) -> dict[str, bool]:
        """Peer node -> whether its link is up, for every live member and every link."""
        states = {peer: False for peer in self.members if peer != self.node_id}
        for peer, link in self.links.items():
            states[peer] = link.up
        return states

    # -- takeover --------------------------------------------------------------------------------

    async def request_release(self, peer: str, client_id: str, epoch: int) -> bytes | None:
        """Ask the node that held the client to let it go (`Releases.request`)."""
        return await self.releases.request(peer, client_id, epoch)
