"""A client's session from CONNECT to its end: checks, take-over, wills, discard.

`SessionLifecycle` decides whether a CONNECT is accepted (protocol, ClientId, limits,
authentication, the will's topic), makes this node the ClientId's owner (locally, and in a cluster
through the registry and the node that held it: `bridge.node.cluster_ownership`), creates or
resumes the session, and undoes it all when the connection ends. It owns the node's `sessions`,
`connections` and `deliveries` tables; everything else it uses is handed to it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from bridge.access.ownership import identity_of, refusal
from bridge.counters import Metrics
from bridge.logtext import client_text
from bridge.mqtt import codec
from bridge.mqtt.packets import Connack, Connect, Disconnect
from bridge.mqtt.properties import PropertyId
from bridge.mqtt.reasons import ReasonCode
from bridge.node.admission import Admission
from bridge.node.cluster_ownership import ClusterOwnership
from bridge.node.positions import start_new_parts, start_reading
from bridge.node.presubscribe import Presubscription
from bridge.node.publish import Publisher
from bridge.node.roles import ClientLink, Spawner
from bridge.node.subscriptions import Subscriptions
from bridge.node.wills import Wills
from bridge.router.queues import client_queue, filter_queue
from bridge.session import Session
from bridge.state import (
    KIND_OFFSETS,
    KIND_ONLINE,
    KIND_QOS2_IN,
    KIND_SESSION,
    Unsettled,
)
from bridge.storage.base import (
    Message,
    MessageStore,
    MetaUpdate,
    StaleOwner,
    StoreUnavailable,
)

if TYPE_CHECKING:
    from bridge.access import AccessControl
    from bridge.access.banlist import BanList
    from bridge.access.limits import LimitControl
    from bridge.cluster.cluster import Cluster
    from bridge.node.delivery import Delivery
    from bridge.node.housekeeping import Housekeeper
    from bridge.operations.metering import Meter
    from bridge.operations.systopics import SysTopics
    from bridge.settings import Config

log = logging.getLogger("bridge.node")


class SessionLifecycle:
    """CONNECT, take-over, disconnect and wills of the clients of one node."""

    def __init__(
        self,
        *,
        config: Config,
        store: MessageStore,
        metrics: Metrics,
        access: AccessControl,
        bans: BanList,
        limits: LimitControl,
        presubscriptions: list[Presubscription],
        subscriptions: Subscriptions,
        publisher: Publisher,
        housekeeper: Housekeeper,
        events: SysTopics,
        meter: Meter,
        sessions: dict[str, Session],
        connections: dict[str, ClientLink],
        deliveries: dict[str, Delivery],
        make_delivery: Callable[[Session, ClientLink], Delivery],
        refusing: Callable[[], int | None],
        topic_fault: Callable[[str], str | None],
        spawn: Spawner,
    ) -> None:
        self.config = config
        self.store = store
        self.metrics = metrics
        self.access = access
        self.presubscriptions = presubscriptions
        self.subscriptions = subscriptions
        self.publisher = publisher
        self.housekeeper = housekeeper
        self.events = events
        self.meter = meter
        self.make_delivery = make_delivery
        self.refusing = refusing
        """Why the node takes no new clients now (a reason code: draining, at
        max_connections), or None when it does."""
        self.topic_fault = topic_fault
        """What is wrong with a topic or filter under the configured limits (None: nothing)."""
        self.spawn = spawn
        self.node_id = publisher.stamper.node_id
        self.sessions = sessions
        self.connections = connections
        self.deliveries = deliveries
        self.cluster: Cluster | None = None
        self.ownership: ClusterOwnership | None = None
        """The ClientIds across the cluster, once this node is a member (`join`)."""
        self.wills = Wills(publisher=publisher, metrics=metrics, spawn=spawn)
        self.admission = Admission(
            config=config,
            access=access,
            bans=bans,
            limits=limits,
            metrics=metrics,
            refusing=refusing,
            topic_fault=topic_fault,
        )

    def join(self, cluster: Cluster) -> ClusterOwnership:
        """This node is a member of `cluster` (before it starts): the ClientIds its clients
        connect with are claimed across the cluster, by the `ClusterOwnership` returned."""
        self.cluster = cluster
        self.ownership = ClusterOwnership(
            cluster=cluster,
            here=self,
            sessions=self.sessions,
            connections=self.connections,
            wills=self.wills,
            admission=self.admission,
            metrics=self.metrics,
            config=self.config,
            node_id=self.node_id,
            refresh_queue_ends=self.publisher.wakes.refresh_queue_ends,
            queue_end=self.store.end_offset,
            spawn=self.spawn,
        )
        return self.ownership

    # -- restore -------------------------------------------------------------------------------

    def restore(
        self, client_id: str, subs: bytes, offsets: bytes | None, was_online: bool
    ) -> Session:
        """A persistent session from its records, offline, in the tables."""
        session = Session.restore(client_id, subs, offsets)
        start_new_parts(self.store, session)
        if not session.disconnected_at or was_online:
            # Connected when its node stopped (or never recorded): offline from now on.
            session.went_offline()
        else:
            # Its age so far comes from the wall clocks (its records'); from here on, this
            # node's monotonic clock counts it.
            session.went_offline(max(0.0, time.time() - session.disconnected_at))
        self.sessions[client_id] = session
        self.subscriptions.enter(session)
        return session

    def restore_qos2_marker(self, session: Session, packet_id: int, value: bytes) -> None:
        """Hold a stored "QoS 2 packet id received" marker in the session again."""
        if self.store.traits.atomic_meta:
            session.hold_qos2_in(packet_id, None)
        else:
            # Written before the message was sent: whether that send stored it is settled
            # by asking the store when the client resends the id (if it ever does).
            session.hold_qos2_in(packet_id, Unsettled.decode(value))

    # -- CONNECT -------------------------------------------------------------------------------

    async def connect(self, conn: ClientLink, packet: Connect) -> Session | None:
        """Validate CONNECT, take over or create the session, answer CONNACK. None if refused."""
        client_id = self.admission.check(conn, packet)
        if client_id is None:
            return None
        level = packet.protocol_level
        if packet.will is not None:
            error = self.topic_fault(packet.will.topic)
            if error:
                self.admission.refuse(
                    conn, ReasonCode.TOPIC_NAME_INVALID, f"will topic rejected: {error}", level
                )
                return None
        admitted, username, client_id = await self.admission.admit(conn, packet, client_id)
        if not admitted:
            return None
        identity = identity_of(username, self.access.authenticating)
        # In a cluster the registry's claim decides, atomically; the tables here may hold a copy
        # that another node has taken since. On one node nothing awaits between here and the
        # tables' update, so two CONNECTs cannot both pass.
        here = self.sessions.get(client_id) if self.cluster is None else None
        owner = (
            None
            if here is None or here.expired(time.time(), self.config.session_expiry_seconds)
            else here.owner
        )
        if refusal(owner, identity) is not None:
            assert owner is not None and identity is not None
            self.admission.refuse_not_owner(conn, client_id, owner, identity, level)
            return None
        expiry, keepalive, said = self.admission.negotiate(packet)
        # 3.1.1: clean session 1 = nothing kept; 5.0: the session lives `expiry` seconds.
        persistent = not packet.clean_session if expiry is None else expiry > 0
        conn.username = username
        conn.client_id = client_id
        conn.keepalive = keepalive
        handed_over = False
        if self.cluster is not None and self.cluster.lease.fenced:
            # Its lease may have lapsed: another node may be serving this client already.
            self.admission.refuse(
                conn, ReasonCode.SERVER_UNAVAILABLE, "this node is cut off from the cluster", level
            )
            return None
        if self.ownership is not None:
            outcome = await self.ownership.take_over(
                conn, client_id, packet.clean_session, persistent, identity
            )
            if outcome is None:
                return None
            handed_over = outcome

        old = self.connections.get(client_id)
        if old is not None and old is not conn:
            log.info(
                "client %s: taken over by a new connection from %s (MQTT-3.1.4-2)",
                client_id,
                conn.peer,
            )
            old.close(
                "session taken over by a new connection",
                taken_over=True,
                reason_code=ReasonCode.SESSION_TAKEN_OVER,
            )
            self.disconnected(old, graceful=False)
        if packet.clean_session:
            self.wills.publish_now(client_id)  # its session ends here, before the will's delay
        else:
            self.wills.cancel(client_id)

        session, session_present, updates = self._open_session(
            client_id, packet.clean_session, persistent, handed_over, level >= 5, identity
        )
        session.expiry = expiry
        session.reads_judged = -1  # its filters are judged anew for this login's user name
        self.sessions[client_id] = session
        session.connected = True
        conn.session = session
        conn.will = packet.will
        self.connections[client_id] = conn
        self.metrics.inc("connections_accepted")
        online, conn.will_key = self.wills.online_record(client_id, conn.peer, packet.will)
        updates.append(MetaUpdate(KIND_ONLINE, client_id, online))
        if persistent and expiry is not None:
            updates.append(MetaUpdate(KIND_SESSION, client_id, session.encode_subscriptions()))
        own_queue = client_queue(client_id)
        try:
            await start_reading(self.store, session, own_queue)
            if self.presubscriptions and await self._presubscribe(session, username):
                updates.append(MetaUpdate(KIND_SESSION, client_id, session.encode_subscriptions()))
            await self.store.put_meta(updates, durable=True)
        except StoreUnavailable as exc:
            log.error("client %s: store unavailable during CONNECT: %s", client_id, exc)
            self.admission.refuse(conn, ReasonCode.SERVER_UNAVAILABLE, "store unavailable", level)
            self.disconnected(conn, graceful=True)
            return None
        if conn.closed or conn.session is not session:
            return None
        if level >= 5:
            if client_id != packet.client_id:  # assigned, or the user name (MQTT-3.2.2-16)
                said[PropertyId.ASSIGNED_CLIENT_IDENTIFIER] = client_id
            conn.start_v5(packet.properties, said, session_present)
        else:
            conn.send(codec.encode(Connack(ReasonCode.SUCCESS, session_present)))
        conn.connected_at = time.time()
        self.events.connected(conn, packet.clean_session, packet.keepalive)
        log.debug(
            "client %s connected from %s (clean=%s, present=%s)",
            client_id,
            conn.peer,
            packet.clean_session,
            session_present,
        )
        delivery = self.make_delivery(session, conn)
        self.deliveries[client_id] = delivery
        conn.delivery = delivery
        delivery.resend_inflight()
        delivery.wake()
        if self.cluster is not None:
            for share_filter, qos in session.shared.items():
                self.cluster.shared_member_changed(share_filter, client_id, qos)
        return session

    def disconnect_v5(self, conn: ClientLink, session: Session, packet: Disconnect) -> bool:
        """What a v5 DISCONNECT says beyond goodbye: a new Session Expiry Interval, a reason.
        False if it broke a rule (the connection is closed)."""
        expiry = packet.properties.get(PropertyId.SESSION_EXPIRY_INTERVAL)
        if expiry is not None:
            if expiry and not session.persistent:
                conn.close(
                    "DISCONNECT sets a Session Expiry Interval on a session that had 0 "
                    "(MQTT-3.14.2-2)",
                    reason_code=ReasonCode.PROTOCOL_ERROR,
                )
                return False
            self.set_expiry(session, expiry)
        if packet.reason_code >= 0x80:
            log.info(
                "client %s: DISCONNECT with reason 0x%02X %s",
                client_text(session.client_id),
                packet.reason_code,
                client_text(packet.properties.get(PropertyId.REASON_STRING, "")),
            )
        return True

    def set_expiry(self, session: Session, expiry: int) -> None:
        """A v5 client changed its Session Expiry Interval on DISCONNECT (MQTT-3.14.2.2.2)."""
        limit = int(self.config.session_expiry_seconds)
        session.expiry = float(min(expiry, limit))
        if not expiry and session.persistent:
            session.persistent = False  # ends with this connection: discarded on disconnect
            self.spawn(
                self.persist_quietly(
                    [
                        MetaUpdate(KIND_SESSION, session.client_id, None),
                        MetaUpdate(KIND_OFFSETS, session.client_id, None),
                    ]
                )
            )
        elif session.persistent:
            self.spawn(
                self.persist_quietly(
                    [MetaUpdate(KIND_SESSION, session.client_id, session.encode_subscriptions())]
                )
            )

    def _open_session(
        self,
        client_id: str,
        clean: bool,
        persistent: bool,
        handed_over: bool,
        v5: bool,
        owner: str | None,
    ) -> tuple[Session, bool, list[MetaUpdate]]:
        """The session a CONNECT by `owner` (an identity, `bridge.access.ownership`) gets,
        whether it was present, and the records to write."""
        session = self.sessions.get(client_id)
        updates: list[MetaUpdate] = []
        if session is not None and session.expired(time.time(), self.config.session_expiry_seconds):
            # Expired, though housekeeping has not discarded it yet: not present.
            self.wills.publish_now(client_id)
            self.discard(session, updates)
            session = None
        if clean:
            if session is not None:
                self.discard(session, updates)
            session = Session(client_id=client_id, persistent=persistent, owner=owner)
            if persistent:
                updates.append(MetaUpdate(KIND_SESSION, client_id, session.encode_subscriptions()))
            return session, False, updates
        if session is not None and (session.persistent or v5):
            # 5.0 resumes a session that is still there, whatever its expiry (MQTT-3.1.2-4).
            bound_now = session.owner is None and owner is not None
            session.owner = session.owner or owner  # an unbound session is its resumer's
            if persistent and (handed_over or not session.persistent or bound_now):
                # Durable under our ownership now (from another node, or newly persistent).
                session.persistent = True
                updates.append(MetaUpdate(KIND_SESSION, client_id, session.encode_subscriptions()))
                updates.append(MetaUpdate(KIND_OFFSETS, client_id, session.encode_offsets()))
            elif not persistent and session.persistent:
                updates.append(MetaUpdate(KIND_SESSION, client_id, None))
                updates.append(MetaUpdate(KIND_OFFSETS, client_id, None))
                session.persistent = False
            return session, True, updates
        if session is not None:
            self.discard(session, updates)
        session = Session(client_id=client_id, persistent=persistent, owner=owner)
        if persistent:
            updates.append(MetaUpdate(KIND_SESSION, client_id, session.encode_subscriptions()))
        return session, False, updates

    async def _presubscribe(self, session: Session, username: str | None) -> bool:
        """Subscribe the session to the configured pre-subscriptions it lacks (`%c`/`%u`
        expanded); True if a persistent session's subscriptions changed. Raises
        StoreUnavailable (the CONNECT is refused then)."""
        client_id = session.client_id
        changed = False
        for presub in self.presubscriptions:
            topic_filter = presub.expand(client_id, username)
            if topic_filter is None or topic_filter in session.subscriptions:
                continue
            if self.topic_fault(topic_filter):
                continue
            await start_reading(self.store, session, filter_queue(topic_filter))
            self.subscriptions.add_subscription(client_id, topic_filter, presub.qos)
            session.set_subscription(topic_filter, presub.qos)
            self.metrics.inc("presubscriptions")
            changed = session.persistent
        return changed

    # -- the end of a connection ---------------------------------------------------------------

    def disconnected(self, conn: ClientLink, graceful: bool) -> None:
        """The connection ended: DISCONNECT received (`graceful`) or the network/peer failed."""
        session = conn.session
        if session is None or conn.detached:
            return
        self.meter.take(conn)
        if not self.detach(conn):
            return  # taken over: the new connection owns the session now
        self.events.disconnected(
            conn, "disconnect" if graceful else conn.close_reason or "connection lost"
        )
        client_id = session.client_id
        will = conn.will
        if not graceful and will is not None:
            expiry = 0.0 if not session.persistent else session.expiry
            self.wills.due(client_id, will, expiry, conn.will_key)
        else:
            self.spawn(self.persist_quietly([MetaUpdate(KIND_ONLINE, client_id, None)]))
        self.subscriptions.redispatch_shared(session)
        if not session.persistent:
            self.discard(session, [])  # nothing of a clean session is stored
            if self.ownership is not None:
                self.spawn(self.ownership.end_in_registry(client_id))
        else:
            self.housekeeper.mark_offsets_dirty(session)
            self.housekeeper.expire_later(session)
            if self.cluster is not None:
                for share_filter, qos in session.shared.items():
                    self.cluster.shared_member_changed(share_filter, client_id, qos)

    def detach(self, conn: ClientLink) -> bool:
        """Unhook a connection from its session; False if it no longer was the session's."""
        conn.detached = True
        conn.delivery = None
        session = conn.session
        assert session is not None
        client_id = session.client_id
        delivery = self.deliveries.get(client_id)
        if delivery is not None and delivery.conn is conn:
            delivery.stop()
            del self.deliveries[client_id]
        if self.connections.get(client_id) is not conn:
            return False
        del self.connections[client_id]
        session.connected = False
        session.went_offline()
        return True

    def discard(self, session: Session, updates: list[MetaUpdate]) -> None:
        """Forget a session entirely (clean session, expiry, replaced by a clean one); the
        records that delete a persistent one are added to `updates`."""
        client_id = session.client_id
        self.subscriptions.leave(session)
        if self.sessions.get(client_id) is session:
            del self.sessions[client_id]
        self.housekeeper.forget(client_id)
        if session.persistent:
            updates.append(MetaUpdate(KIND_SESSION, client_id, None))
            updates.append(MetaUpdate(KIND_OFFSETS, client_id, None))
            for packet_id in session.inbound_qos2:
                updates.append(MetaUpdate(KIND_QOS2_IN, f"{client_id}\x00{packet_id}", None))

    async def expire(self, sessions: list[Session]) -> None:
        """Discard offline sessions whose expiry passed, durably and in the registry (a will
        still waiting for its delay is published now: its session ended first)."""
        updates: list[MetaUpdate] = []
        for session in sessions:
            self.wills.publish_now(session.client_id)
            self.discard(session, updates)
        await self.store.put_meta(updates, durable=True)
        if self.ownership is not None:
            for session in sessions:
                await self.ownership.end_in_registry(session.client_id)

    async def persist_quietly(self, updates: list[MetaUpdate]) -> None:
        """Write records in the background: a refusal or outage is logged, not raised."""
        try:
            await self.store.put_meta(updates)
        except StaleOwner as exc:
            log.debug("records not written: %s", exc)
        except StoreUnavailable as exc:
            log.warning("records not written, store unavailable: %s", exc)

    # -- wills ---------------------------------------------------------------------------------

    async def publish_will(
        self, client_id: str, message: Message, *, maybe_sent: bool = False
    ) -> None:
        """Publish a will once, and end its client's online record (`Wills.publish`)."""
        await self.wills.publish(client_id, message, maybe_sent=maybe_sent)
