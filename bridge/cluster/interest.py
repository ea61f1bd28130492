"""Replicated interest and the messages that follow it: what peers subscribe to, what this node
advertises, and the frames that carry messages to and from peers.

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
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import TYPE_CHECKING, Any, Protocol

from bridge.cluster import wire
from bridge.cluster.takeover import HandedInterest, handed_filters
from bridge.mqtt.topics import parse_shared
from bridge.router.queues import ANY_PEER, filter_queue, peer_subscriber

if TYPE_CHECKING:
    from bridge.cluster.announce import Announcer
    from bridge.cluster.host import ClusterHost
    from bridge.cluster.peers import PeerLink
    from bridge.settings import Config
    from bridge.storage.base import Message

log = logging.getLogger("bridge.cluster")

FRAMES = (
    wire.Forward,
    wire.ForwardMeta,
    wire.Wake,
    wire.Grew,
    wire.Deliver,
    wire.DeliverMeta,
    wire.AddFilters,
    wire.RemoveFilters,
    wire.SharedMember,
    wire.SharedMemberGone,
    wire.SyncBegin,
    wire.SyncEnd,
    wire.Retained,
)
"""The frames `Interest.on_frame` takes: interest changes, replays and messages."""


class PeerLinks(Protocol):
    """What interest replication uses of the cluster membership (`Cluster`)."""

    links: dict[str, PeerLink]
    """Peer node -> its up link."""
    members: dict[str, dict[str, Any]]
    """Alive nodes -> their registry info (replaced on every membership round)."""

    def broadcast(self, frame: wire.Frame) -> None:
        """Send `frame` on every up link."""
        ...


class Interest:
    """What peers subscribe to, what this node advertises, and messages to and from peers
    (module docstring)."""

    def __init__(
        self,
        membership: PeerLinks,
        node: ClusterHost,
        announcer: Announcer,
        config: Config,
    ) -> None:
        self.membership = membership
        self.node = node
        self.announcer = announcer
        self.grace = config.interest_grace
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
        self.handed = HandedInterest(self.add_filters, self.remove_filters, config)
        self.arriving: Counter[str] = Counter()
        """Filter -> sessions this node has claimed from another node and not adopted yet
        (`hold_arriving`)."""
        self.synced: set[str] = set()
        """Peers whose interest replay ended on their current link."""

    def stop(self) -> None:
        """The node leaves: withdrawals still waiting for `interest_grace` are not sent."""
        if self._removal_timer is not None:
            self._removal_timer.cancel()

    def on_frame(self, peer: str, frame: wire.Frame) -> None:
        """A frame of `FRAMES` from `peer`'s up link."""
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
            new = self.add_filters(peer, frame.filters)
            if new and peer not in self._replay_filters:
                self._tell_ends(peer, new)
        elif isinstance(frame, wire.RemoveFilters):
            self.remove_filters(peer, frame.filters)
        elif isinstance(frame, wire.SharedMember):
            self._shared_member(peer, frame)
        elif isinstance(frame, wire.SharedMemberGone):
            self._shared_member_gone(peer, frame.share_filter, frame.client_id)
        elif isinstance(frame, wire.SyncBegin):
            self._replay_filters[peer] = set()
            self._replay_members[peer] = set()
        elif isinstance(frame, wire.SyncEnd):
            self.end_replay(peer)
            self.synced.add(peer)
        elif isinstance(frame, wire.Retained):
            node.retained_from_peer(frame.topic, frame.record)

    def replay_to(self, link: PeerLink) -> None:
        """A link came up: send it all of this node's interest once (`SyncBegin` ...
        `SyncEnd`), withdrawals still in their grace included."""
        link.send(wire.SyncBegin())
        for frame in wire.chunked(sorted(set(self.local_counts) | self._removals), wire.AddFilters):
            link.send(frame)
        for share_filter, client_id, qos in self.node.local_shared_members():
            online = int(self.node.is_connected(client_id))
            link.send(wire.SharedMember(share_filter, client_id, qos, online))
        link.send(wire.SyncEnd())

    def link_lost(self, peer: str) -> None:
        """`peer`'s link went down: its interest stays, but it has to replay it again."""
        self.synced.discard(peer)

    # -- what peers subscribe to -----------------------------------------------------------------

    def add_filters(self, peer: str, filters: tuple[str, ...]) -> list[str]:
        """`peer` has subscribers for `filters` (announced, replayed or handed to it); returns
        those that were new."""
        known = self.peer_filters.setdefault(peer, set())
        replay = self._replay_filters.get(peer)
        handed = self.handed.pending.get(peer)
        subscriber = peer_subscriber(peer)
        new: list[str] = []
        for topic_filter in filters:
            if replay is not None:
                replay.add(topic_filter)
            if handed:
                handed.pop(topic_filter, None)  # announced by the peer itself now
            if topic_filter not in known:
                known.add(topic_filter)
                self.node.trie.subscribe(topic_filter, subscriber, 0)
                new.append(topic_filter)
        return new

    def _tell_ends(self, peer: str, filters: list[str]) -> None:
        """A live SUBSCRIBE on `peer` announced `filters`: tell it where their queues end as
        this node knows them. The subscriber started reading where the store said the queue
        ended when the SUBSCRIBE came; a message this node stored after that, and before it
        knew of the new reader, was announced to nobody on `peer`, so without this it would
        wait there for the next message on the queue. Sent before the `Confirmed` that
        answers the announcement (the link is ordered), so it arrives before the SUBACK."""
        ends = self.node.queue_ends_known([filter_queue(f) for f in filters])
        if ends:
            self.grew(peer, ends)

    def remove_filters(self, peer: str, filters: tuple[str, ...] | set[str]) -> None:
        """`peer` has no subscribers for `filters` any more."""
        known = self.peer_filters.get(peer)
        if not known:
            return
        subscriber = peer_subscriber(peer)
        for topic_filter in filters:
            if topic_filter in known:
                known.discard(topic_filter)
                if peer == ANY_PEER and topic_filter in self.arriving:
                    continue  # still held for a session on its way here
                self.node.trie.unsubscribe(topic_filter, subscriber)

    # -- sessions on their way here ---------------------------------------------------------------

    def hold_arriving(self, filters: set[str]) -> None:
        """This node has claimed a session subscribed to `filters` from another node and will
        adopt it once that node hands it over (or does not answer). Until then nothing here
        subscribes to them: the previous owner's interest is all that stores messages on their
        queues, and it goes when that node is known gone, which can happen first (a draining
        node is declared dead, and its interest forgotten, while the Release is under way). So
        the filters are held: in this node's trie under `ANY_PEER`'s pseudo id (a publish here
        stores on their queues; QoS 0 is not forwarded to it), and announced to the peers as
        this node's interest, before any of them can hear from here that the previous owner
        has gone."""
        subscriber = peer_subscriber(ANY_PEER)
        for topic_filter in filters:
            self.arriving[topic_filter] += 1
            self.node.trie.subscribe(topic_filter, subscriber, 0)
            self.local_filter_added(topic_filter)

    def release_arriving(self, filters: set[str]) -> None:
        """The session held by `hold_arriving(filters)` is adopted here, or will not be."""
        subscriber = peer_subscriber(ANY_PEER)
        for topic_filter in filters:
            count = self.arriving[topic_filter] - 1
            if count > 0:
                self.arriving[topic_filter] = count
            else:
                del self.arriving[topic_filter]
                if topic_filter not in self.peer_filters.get(ANY_PEER, ()):
                    self.node.trie.unsubscribe(topic_filter, subscriber)
            self.local_filter_removed(topic_filter)

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

    def end_replay(self, peer: str) -> None:
        """`peer`'s replay ended (`SyncEnd`): what it did not replay is its interest no more."""
        filters = self._replay_filters.pop(peer, set())
        members = self._replay_members.pop(peer, set())
        self.remove_filters(peer, self.peer_filters.get(peer, set()) - filters)
        for share_filter, client_id in set(self.peer_members.get(peer, {})) - members:
            self._shared_member_gone(peer, share_filter, client_id)
        log.info(
            "peer %s: %d filters and %d shared members after its replay",
            peer,
            len(filters),
            len(members),
        )

    def forget(self, peer: str) -> None:
        """Drop everything known of a peer's interest (it is dead and cleaned up)."""
        self.remove_filters(peer, set(self.peer_filters.get(peer, ())))
        self.peer_filters.pop(peer, None)
        for share_filter, client_id in list(self.peer_members.get(peer, {})):
            self._shared_member_gone(peer, share_filter, client_id)
        self.peer_members.pop(peer, None)
        self._replay_filters.pop(peer, None)
        self._replay_members.pop(peer, None)
        self.handed.pending.pop(peer, None)
        self.synced.discard(peer)

    def peers_with_interest(self) -> list[str]:
        """The peers (and `ANY_PEER`) this node holds filters or shared members of."""
        return list(self.peer_filters) + list(self.peer_members)

    # -- what this node advertises ---------------------------------------------------------------

    def local_filter_added(self, topic_filter: str) -> bool:
        """A session held here subscribed to `topic_filter`: announced if it is the first (True:
        the peers hear of it now; False: they know it already)."""
        self.local_counts[topic_filter] += 1
        if self.local_counts[topic_filter] != 1:
            return False
        if topic_filter in self._removals:
            self._removals.discard(topic_filter)  # never withdrawn: nothing to re-announce
            return False
        self.membership.broadcast(wire.AddFilters((topic_filter,)))
        return True

    def local_filter_removed(self, topic_filter: str) -> None:
        """A session held here left `topic_filter`: withdrawn after `interest_grace` if it was
        the last."""
        count = self.local_counts[topic_filter] - 1
        if count > 0:
            self.local_counts[topic_filter] = count
            return
        del self.local_counts[topic_filter]
        self._removals.add(topic_filter)
        if self._removal_timer is None:
            self._removal_timer = asyncio.get_running_loop().call_later(
                self.grace, self._send_removals
            )

    def _send_removals(self) -> None:
        self._removal_timer = None
        removed = sorted(f for f in self._removals if f not in self.local_counts)
        self._removals.clear()
        for frame in wire.chunked(removed, wire.RemoveFilters):
            self.membership.broadcast(frame)

    def shared_member_changed(self, share_filter: str, client_id: str, qos: int) -> None:
        """A session held here joined a shared group, or its QoS or connection changed."""
        online = int(self.node.is_connected(client_id))
        self.membership.broadcast(wire.SharedMember(share_filter, client_id, qos, online))

    def shared_member_removed(self, share_filter: str, client_id: str) -> None:
        """A session held here left a shared group."""
        self.membership.broadcast(wire.SharedMemberGone(share_filter, client_id))

    # -- messages to peers -----------------------------------------------------------------------

    def forward(self, peers: list[str], message: Message) -> None:
        """A QoS 0 message for these peers' subscribers, encoded once per frame kind (dropped,
        and counted, where a link is down or backed up: QoS 0 is at most once)."""
        encoded: dict[bool, bytes] = {}  # by whether the frame carries the MQTT 5 metadata
        links = self.membership.links
        for peer in peers:
            link = links.get(peer)
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
        link = self.membership.links.get(self.member_node.get(client_id, ""))
        metadata = link is not None and bool(message.properties) and self.speaks_metadata(link)
        data = wire.deliver_frame(client_id, message, metadata=metadata)
        if link is None or not link.send_droppable(data):
            self.node.metrics.inc("dropped_peer_link")

    def speaks_metadata(self, link: PeerLink) -> bool:
        """Whether the peer's node understands the frames carrying MQTT 5 metadata: its registry
        info says so, and is that of the boot at the other end of the link (a peer restarted
        with an earlier version must not be sent them on the strength of stale info)."""
        info = self.membership.members.get(link.peer_id)
        return (
            info is not None
            and info.get("boot") == link.peer_boot
            and wire.FEATURE_METADATA in info.get("features", ())
        )

    def wake(self, peer: str, ends: dict[str, int]) -> None:
        """Messages were stored on these queues for `peer`'s readers (see `Announcer.wake`)."""
        self.announcer.wake(peer, ends)

    def grew(self, peer: str, ends: dict[str, int]) -> None:
        """These queues grew to these ends: tell `peer` (`ANY_PEER`: every peer)."""
        known = self.membership.links
        links = known.values() if peer == ANY_PEER else [known.get(peer)]
        for link in links:
            if link is not None:
                link.send(wire.Grew(tuple(ends), tuple(ends.values())))

    def retained_changed(self, topic: str, record: bytes) -> None:
        """This node set or cleared a topic's retained message: tell every peer."""
        self.membership.broadcast(wire.Retained(topic, record))

    def is_reachable(self, client_id: str) -> bool:
        """A shared member that can take a message now: connected here or on a peer."""
        return self.node.is_connected(client_id) or client_id in self.remote_online

    def node_of(self, client_id: str) -> str | None:
        """The peer holding a remote shared member's session (None: local or unknown)."""
        return self.member_node.get(client_id)
