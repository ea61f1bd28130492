"""The ClientId across the cluster: which node owns a client, and how its session moves there.

`ClusterOwnership` makes this node a ClientId's owner cluster-wide when the client connects here
(a claim in the Redis registry, then a `Release` asked of the node that held it), adopts a session
handed over by that node or kept in the registry, lets a client go when another node takes it
over (or when the registry refuses this node's writes for it), and removes the ClientId's
registry entry when its session ends here. It exists only on a cluster member
(`SessionLifecycle.join`); the session tables it reads and the steps of a session's life it
takes (restore, detach, discard) are handed to it by the node's `SessionLifecycle`.

Taking over the sessions of a dead node is `bridge.cluster.takeover`'s; the peer-link exchange of
`Release` and `Released` is `bridge.cluster.releases`'s.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Protocol

from bridge.counters import Metrics
from bridge.mqtt.reasons import ReasonCode
from bridge.node.let_go import LetGo
from bridge.node.registry_entries import RegistryEntries
from bridge.node.roles import ClientLink, Spawner
from bridge.node.wills import delay_of, publication_begun
from bridge.router.queues import ANY_PEER
from bridge.session import Session
from bridge.state import Unsettled, session_filters, will_of
from bridge.storage.base import MetaUpdate, SessionBound, StoreUnavailable

if TYPE_CHECKING:
    from bridge.cluster.registry import Claim, RedisRegistry
    from bridge.node.admission import Admission
    from bridge.node.wills import Wills
    from bridge.settings import Config

log = logging.getLogger("bridge.node")


class Membership(Protocol):
    """What the ClientId's ownership uses of the cluster membership
    (`bridge.cluster.cluster.Cluster`)."""

    registry: RedisRegistry

    async def request_release(self, peer: str, client_id: str, epoch: int) -> bytes | None:
        """Ask the node that held the client to let it go; its last session state, b"" if it
        had none, None if it could not be asked."""
        ...

    async def wait_for_holder(self, holder: str, client_id: str) -> bool:
        """An unanswered Release: wait until `holder` cannot be serving the client
        (`bridge.cluster.lease`)."""
        ...

    def handed_to(self, peer: str, state: bytes) -> None:
        """A session went to `peer` (`ANY_PEER` if which one is not known)."""
        ...

    def hold_arriving(self, filters: set[str]) -> None:
        """A session subscribed to `filters`, claimed from another node, is on its way here:
        messages published meanwhile still go to its queues."""
        ...

    def release_arriving(self, filters: set[str]) -> None:
        """The session of `hold_arriving(filters)` is adopted here, or will not be."""
        ...


class SessionsHere(Protocol):
    """The steps of a session's life on this node that moving a ClientId takes
    (`bridge.node.lifecycle.SessionLifecycle`)."""

    def restore(
        self, client_id: str, subs: bytes, offsets: bytes | None, was_online: bool
    ) -> Session:
        """A persistent session from its records, offline, in the tables."""
        ...

    def restore_qos2_marker(self, session: Session, packet_id: int, value: bytes) -> None:
        """Hold a stored "QoS 2 packet id received" marker in the session again."""
        ...

    def detach(self, conn: ClientLink) -> bool:
        """Unhook a connection from its session; False if it no longer was the session's."""
        ...

    def discard(self, session: Session, updates: list[MetaUpdate]) -> None:
        """Forget a session entirely; the records that delete a persistent one are added to
        `updates`."""
        ...


class ClusterOwnership:
    """Claims, adopts, releases and ends the ClientIds of this cluster member (module
    docstring)."""

    def __init__(
        self,
        *,
        cluster: Membership,
        here: SessionsHere,
        sessions: Mapping[str, Session],
        connections: Mapping[str, ClientLink],
        wills: Wills,
        admission: Admission,
        metrics: Metrics,
        config: Config,
        node_id: str,
        refresh_queue_ends: Callable[[str], Awaitable[None]],
        queue_end: Callable[[str], int],
        spawn: Spawner,
    ) -> None:
        self.cluster = cluster
        self.here = here
        self.sessions = sessions
        self.connections = connections
        self.wills = wills
        self.admission = admission
        self.metrics = metrics
        self.config = config
        self.node_id = node_id
        self.refresh_queue_ends = refresh_queue_ends
        """Re-read the ends of the queues a client reads, then wake it
        (`bridge.node.wakes.Wakes.refresh_queue_ends`)."""
        self.queue_end = queue_end
        """The end of a queue's part as the store knows it (`MessageStore.end_offset`)."""
        self.spawn = spawn
        self.registry_entries = RegistryEntries(sessions, spawn)
        self.let_go = LetGo()
        """The state of sessions let go when the registry refused this node's writes for them
        (`bridge.node.let_go`)."""

    async def take_over(
        self, conn: ClientLink, client_id: str, clean: bool, persistent: bool, identity: str | None
    ) -> bool | None:
        """Own the ClientId cluster-wide: claim it in the registry (the atomic step, recording
        whether the session outlives the connection and checking and recording the `identity`
        it belongs to), have the node that held it close the old connection and hand over the
        session, publish the old connection's will. `clean`: the client starts afresh. True if
        a session came from another node, None if refused."""
        cluster = self.cluster
        try:
            claim = await cluster.registry.claim(client_id, not persistent, identity=identity)
        except SessionBound as exc:
            assert identity is not None  # only a claim naming an identity is refused for one
            self.admission.refuse_not_owner(conn, client_id, exc.owner, identity, conn.level)
            return None
        except StoreUnavailable as exc:
            self.admission.refuse(
                conn, ReasonCode.SERVER_UNAVAILABLE, f"registry unavailable: {exc}", conn.level
            )
            return None
        assert claim is not None
        previous = claim.previous_node
        if not previous:
            return False
        if previous == self.node_id:
            return self._recover_own_claim(client_id, claim)
        self.let_go.pop(client_id)  # the registry names a later owner: what it kept is older
        # From the claim on, the previous owner may be declared gone and its interest forgotten
        # before the session is adopted here: hold its filters meanwhile.
        arriving: set[str] = set()
        if "subs" in claim.records and not claim.was_clean:
            arriving = session_filters(claim.records["subs"])
        cluster.hold_arriving(arriving)
        try:
            received = await self._receive(client_id, claim, previous, clean)
        finally:
            cluster.release_arriving(arriving)
        if received is None:
            log.info(
                "client %s: a newer claim took the ClientId while this connection waited for "
                "its previous node; closing this one",
                client_id,
            )
            self.metrics.inc("claims_superseded")
            self.admission.refuse(
                conn, ReasonCode.SERVER_UNAVAILABLE, "superseded by a newer claim", conn.level
            )
        return received

    async def _receive(
        self, client_id: str, claim: Claim, previous: str, clean: bool
    ) -> bool | None:
        """Have `previous`, which held the client, close its connection and hand over the
        session; publish the old connection's will; adopt the session (True) unless there is
        none to resume (False). None if, while `previous` was asked, a newer claim took the
        ClientId (the client connected again, here or elsewhere): the session is that claim's
        now, and this one must not touch it."""
        cluster = self.cluster
        state = await cluster.request_release(previous, client_id, claim.epoch)
        if state is None:
            # Unanswered: serve the client only once the old node cannot be serving it too.
            await cluster.wait_for_holder(previous, client_id)
        will = will_of(claim.online)
        if will is not None and (clean or not delay_of(claim.online)):
            # The old connection ends without DISCONNECT: its will is due, and only the node
            # that took the online record (atomically, in the claim) publishes it. A delayed
            # will whose session this connection resumes is not published (MQTT-3.1.3-9).
            self.spawn(
                self.wills.publish(
                    client_id,
                    will,
                    clear_online=False,
                    maybe_sent=publication_begun(claim.online),
                )
            )
        if cluster.registry.epochs.get(client_id) != claim.epoch:
            # Its answer (or the registry's copy, when there is none) is older than what the
            # newer claim adopted: taking it would replace the session that claim serves.
            return None
        session = self.sessions.get(client_id)
        if session is not None:
            self.here.discard(session, [])  # a stale copy from before
        if claim.was_clean:
            return False
        if state:
            self._adopt_handed(client_id, claim, state)
            return True
        if "subs" not in claim.records:
            return False
        session = self.adopt(client_id, claim, sent_unknown=False)
        # The old node did not answer, or had no session to hand over (its claim was applied
        # while it was told it failed: `_recover_own_claim`): the registry's copy was written by
        # whichever node held the session last, and may predate what that node sent.
        await self.refresh_queue_ends(client_id)
        self.assume_sent(session)
        return True

    def _recover_own_claim(self, client_id: str, claim: Claim) -> bool:
        """The registry says this node owned the client before this claim. If its session is
        here, the connection resumes it (False: nothing came from elsewhere). If it is not, an
        earlier claim of this node was applied by Redis while the node was told it failed: the
        replicas did not confirm it (WAIT) because a Sentinel failover had just left the new
        master without any. The node refused that CONNECT, but the owner had moved, so the
        node that served the session let it go when its next write was refused. The
        registry's copy is then the session: adopt it (True), its sends unknown, as from a
        node that did not answer. Starting afresh here would drop a persistent session and
        everything published to it meanwhile.

        Where this node let the session go itself (its claim was lost in a failover after it
        had served the session under it), what it kept of it is resumed instead."""
        kept = self.let_go.pop(client_id)
        if client_id in self.sessions or claim.was_clean:
            return False
        if kept:
            return self._resume_let_go(client_id, claim, kept)
        if "subs" not in claim.records:
            return False
        log.warning(
            "client %s: the registry names this node its owner but its session is not here "
            "(a claim applied while refused); resuming the registry's copy",
            client_id,
        )
        session = self.adopt(client_id, claim)
        self.metrics.inc("sessions_recovered_from_registry")
        self.spawn(self._learn_ends_after_move(session, sent_unknown=True))
        return True

    def _resume_let_go(self, client_id: str, claim: Claim, kept: bytes) -> bool:
        """The registry names this node the client's owner under an epoch older than the one
        it served the session under since, and the session was let go when its writes were
        refused: a Redis failover lost that claim (`bridge.node.let_go`). Resume the session as
        this node last served it (True)."""
        log.warning(
            "client %s: this node's claim of it was lost in a Redis failover; resuming the "
            "session as this node last served it",
            client_id,
        )
        session = self._adopt_handed(client_id, claim, kept)
        self.metrics.inc("sessions_recovered_after_rollback")
        self.spawn(self._learn_ends_after_move(session, sent_unknown=False))
        return True

    def _adopt_handed(self, client_id: str, claim: Claim, state: bytes) -> Session:
        """Adopt a session from a state `release` encoded (a Release's answer, or one kept)."""
        handed = json.loads(state)
        records = dict(claim.records)
        records["subs"], records["off"] = handed["subs"].encode(), handed["off"].encode()
        claim.records = records
        session = self.adopt(client_id, claim, sent_unknown=False)
        # Which QoS 2 messages the old node sent (a node of an older version says nothing).
        session.remember_qos2_copies(
            ((str(k), int(v)) for k, v in handed.get("q2", ())), self.config.qos2_copy_window
        )
        # The QoS 2 packet ids it received and holds until PUBREL, as it knew them: the
        # registry's markers can be older (a failover that lost this node's writes).
        for packet_id, marker in handed.get("in", {}).items():
            self.here.restore_qos2_marker(session, int(packet_id), marker.encode())
        return session

    def adopt(self, client_id: str, claim: Claim, *, sent_unknown: bool = True) -> Session:
        """Hold a persistent session taken over from another node (offline until it connects).

        `sent_unknown`: the session comes from the registry's copy (its node died or did not
        answer), written up to `offset_flush_interval` before that node last sent anything, so
        what it sent since is unknown: once the queues' ends are read, everything up to them
        counts as possibly sent (`assume_sent`)."""
        records = claim.records
        session = self.here.restore(
            client_id, records["subs"], records.get("off"), records.get("online") is not None
        )
        for name, value in records.items():
            if name.startswith("q2:"):
                self.here.restore_qos2_marker(session, int(name[3:]), value)
        if claim.previous_node and claim.previous_node != self.node_id:
            self.spawn(self._learn_ends_after_move(session, sent_unknown))
        return session

    async def _learn_ends_after_move(self, session: Session, sent_unknown: bool) -> None:
        """Read the ends of an adopted session's queues now and once more `interest_grace`
        later: until the other nodes have heard that its filters are read here, they announce
        what they store on them to the node that held it, and this node's readers would wait
        for the next message."""
        await self.refresh_queue_ends(session.client_id)
        if sent_unknown:
            self.assume_sent(session)
        await asyncio.sleep(self.config.interest_grace)
        await self.refresh_queue_ends(session.client_id)

    def assume_sent(self, session: Session) -> None:
        """Count every message of the session's queues up to their known ends as possibly sent
        by the node that held it, so that each comes again with DUP=1 (MQTT-3.3.1-1: a
        redelivery is marked; one never sent before but marked only tells the client to check
        for a duplicate, which QoS 1 and 2 receivers do anyway)."""
        for part, cursor in session.cursors.items():
            end = self.queue_end(part)
            if end > max(cursor, session.resend_below.get(part, -1)):
                session.set_resend_below(part, end)

    def release(self, client_id: str, epoch: int | None = None) -> bytes:
        """Another node took the client over (at `epoch`, if known): close its connection here
        (its will is the new owner's to publish), drop the session from the tables, hand over
        its state."""
        own = self.cluster.registry.epochs.get(client_id)
        if own is not None and epoch is not None and own > epoch:
            return b""  # taken back by this node since: the request is stale
        session = self.sessions.get(client_id)
        state = b""
        if session is None:
            # The registry sent the taker here: what this node kept of a session it let go is
            # the latest there is (`bridge.node.let_go`).
            state = self.let_go.pop(client_id)
            if state:
                log.warning(
                    "client %s: handing on the session this node let go when the registry "
                    "refused its writes (a Redis failover may have rolled its claim back)",
                    client_id,
                )
        elif session.persistent:
            state = json.dumps(
                {
                    "subs": session.encode_subscriptions().decode(),
                    "off": session.encode_offsets().decode(),
                    "q2": session.qos2_copies_sent(),
                    "in": inbound_markers(session),
                },
                separators=(",", ":"),
            ).encode()
        conn = self.connections.get(client_id)
        self.wills.cancel(client_id)  # the new owner publishes it, or not (see take_over)
        if conn is not None:
            conn.will = None
            self.here.detach(conn)
            conn.close(
                "session taken over by a connection on another node",
                taken_over=True,
                reason_code=ReasonCode.SESSION_TAKEN_OVER,
            )
        if session is not None:
            self.here.discard(session, [])
        self.cluster.registry.disown(client_id)
        self.metrics.inc("sessions_released")
        return state

    def lost_ownership(self, client_ids: list[str]) -> None:
        """Writes for these clients were refused: another node owns them now. Let go."""
        for client_id in client_ids:
            if client_id not in self.cluster.registry.epochs:
                log.warning("client %s: owned by another node now; dropped here", client_id)
                state = self.release(client_id)
                self.let_go.keep(client_id, state)
                self.cluster.handed_to(ANY_PEER, state)

    async def end_in_registry(self, client_id: str) -> None:
        """The session is gone here: remove the ClientId's entry from the registry (retried
        while Redis cannot be reached: `RegistryEntries`)."""
        await self.registry_entries.end(self.cluster.registry, client_id)


def inbound_markers(session: Session) -> dict[str, str]:
    """The QoS 2 packet ids the session holds until PUBREL, as handed to the next node: the
    marker of a message whose store is unsettled, "" for one stored (`Unsettled.decode` reads
    it as stored). One whose store is still running here is left out: the next node's
    registry marker stands for it."""
    markers: dict[str, str] = {}
    for packet_id, held in session.inbound_qos2.items():
        if held is None:
            markers[str(packet_id)] = ""
        elif isinstance(held, Unsettled):
            markers[str(packet_id)] = held.encode().decode()
    return markers
