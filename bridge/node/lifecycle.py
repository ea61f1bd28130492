"""A client's session from CONNECT to its end: checks, take-over, wills, discard.

`SessionLifecycle` decides whether a CONNECT is accepted (protocol, ClientId, limits,
authentication, the will's topic), makes this node the ClientId's owner (locally, and in a cluster
through the registry and the node that held it), creates or resumes the session, and undoes it
all when the connection ends. It owns the node's `sessions`, `connections` and `deliveries`
tables; everything else it uses is handed to it.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bridge.access.acl import PUBLISH
from bridge.access.auth import AuthResult
from bridge.mqtt import codec
from bridge.mqtt.packets import Connack, ConnackCode, Connect, Will
from bridge.node.positions import start_new_parts, start_reading
from bridge.node.presubscribe import Presubscription
from bridge.node.publish import Publisher, Unsettled
from bridge.node.roles import ClientLink, Spawner
from bridge.node.subscriptions import Subscriptions
from bridge.operations.metrics import Metrics
from bridge.router.queues import client_queue, filter_queue
from bridge.session import Session
from bridge.state import (
    KIND_OFFSETS,
    KIND_ONLINE,
    KIND_QOS2_IN,
    KIND_SESSION,
    encode_message,
    will_of,
)
from bridge.storage.base import Message, MessageStore, MetaUpdate, StaleOwner, StoreUnavailable

if TYPE_CHECKING:
    from bridge.access import AccessControl
    from bridge.cluster.cluster import Cluster
    from bridge.cluster.registry import Claim
    from bridge.config import Config
    from bridge.node.delivery import Delivery
    from bridge.node.housekeeping import Housekeeper
    from bridge.operations.metering import Meter
    from bridge.operations.systopics import SysTopics

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
        admitting: Callable[[], bool],
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
        self.admitting = admitting
        """Whether the node takes new clients now (not draining, under max_connections)."""
        self.topic_fault = topic_fault
        """What is wrong with a topic or filter under the configured limits (None: nothing)."""
        self.spawn = spawn
        self.node_id = publisher.stamper.node_id
        self.sessions = sessions
        self.connections = connections
        self.deliveries = deliveries
        self.cluster: Cluster | None = None

    # -- restore and adopt -------------------------------------------------------------------

    def restore(
        self, client_id: str, subs: bytes, offsets: bytes | None, was_online: bool
    ) -> Session:
        """A persistent session from its records, offline, in the tables."""
        session = Session.restore(client_id, subs, offsets)
        start_new_parts(self.store, session)
        if not session.disconnected_at or was_online:
            # Connected when its node stopped (or never recorded): offline from now on.
            session.disconnected_at = time.time()
        self.sessions[client_id] = session
        self.subscriptions.enter(session)
        return session

    def restore_qos2_marker(self, session: Session, packet_id: int, value: bytes) -> None:
        """Hold a stored "QoS 2 packet id received" marker in the session again."""
        if self.store.atomic_meta:
            session.inbound_qos2[packet_id] = None
        else:
            # Written before the message was sent: whether that send stored it is settled
            # by asking the store when the client resends the id (if it ever does).
            session.inbound_qos2[packet_id] = Unsettled.decode(value)

    def adopt(self, client_id: str, claim: Claim) -> Session:
        """Hold a persistent session taken over from another node (offline until it connects)."""
        records = claim.records
        session = self.restore(
            client_id, records["subs"], records.get("off"), records.get("online") is not None
        )
        for name, value in records.items():
            if name.startswith("q2:"):
                self.restore_qos2_marker(session, int(name[3:]), value)
        return session

    # -- CONNECT -------------------------------------------------------------------------------

    def _check_connect(self, conn: ClientLink, packet: Connect) -> str | None:
        """The ClientId this CONNECT may use (assigned if empty), or None once refused."""
        cfg = self.config
        if (packet.protocol_name, packet.protocol_level) not in (("MQIsdp", 3), ("MQTT", 4)):
            self.refuse(
                conn,
                ConnackCode.UNACCEPTABLE_PROTOCOL_VERSION,
                f"protocol level {packet.protocol_level} not supported (MQTT-3.1.2-2)",
            )
            return None
        client_id = packet.client_id
        if not client_id:
            if not packet.clean_session:
                self.refuse(
                    conn,
                    ConnackCode.IDENTIFIER_REJECTED,
                    "empty ClientId with clean session 0 (MQTT-3.1.3-8)",
                )
                return None
            if not cfg.allow_zero_length_clientid:
                self.refuse(
                    conn,
                    ConnackCode.IDENTIFIER_REJECTED,
                    "empty ClientId not allowed by configuration",
                )
                return None
            client_id = f"auto-{uuid.uuid4().hex}"
        elif packet.protocol_level == 3 and len(client_id) > 23:
            self.refuse(
                conn, ConnackCode.IDENTIFIER_REJECTED, "MQTT 3.1 ClientId longer than 23 characters"
            )
            return None
        if "\x00" in client_id or len(client_id.encode()) > cfg.max_topic_length:
            self.refuse(conn, ConnackCode.IDENTIFIER_REJECTED, "ClientId too long")
            return None
        if not self.admitting():
            self.refuse(
                conn, ConnackCode.SERVER_UNAVAILABLE, "node is draining or at max_connections"
            )
            return None
        return client_id

    async def _admit(
        self, conn: ClientLink, packet: Connect, client_id: str
    ) -> tuple[bool, str | None]:
        """Authenticate and check the will against the ACL: whether the client is admitted, and
        the user name it acts as (None: anonymous). Refused clients are answered here."""
        result, username = await self.access.authenticate(
            client_id, packet.username, packet.password, conn.cert_cn
        )
        if conn.closed:
            return False, None
        if result is not AuthResult.ACCEPTED:
            self.metrics.inc("auth_failures")
            self.refuse(
                conn,
                result.connack_code,
                f"authentication failed ({result.name}) for user {packet.username!r}",
            )
            return False, None
        if packet.will is not None and not self.access.acl.allows(
            PUBLISH, client_id, username, packet.will.topic
        ):
            self.metrics.inc("acl_denied_will")
            self.refuse(
                conn,
                ConnackCode.NOT_AUTHORIZED,
                f"ACL denies publishing the will topic {packet.will.topic!r}",
            )
            return False, None
        return True, username

    async def connect(self, conn: ClientLink, packet: Connect) -> Session | None:
        """Validate CONNECT, take over or create the session, answer CONNACK. None if refused."""
        client_id = self._check_connect(conn, packet)
        if client_id is None:
            return None
        if packet.will is not None:
            error = self.topic_fault(packet.will.topic)
            if error:
                conn.close(f"will topic rejected: {error}")
                return None
        admitted, username = await self._admit(conn, packet, client_id)
        if not admitted:
            return None
        conn.username = username
        conn.client_id = client_id
        handed_over = False
        if self.cluster is not None:
            outcome = await self._take_over_in_cluster(conn, client_id, packet.clean_session)
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
            old.close("session taken over by a new connection", taken_over=True)
            self.disconnected(old, graceful=False)

        session, session_present, updates = self._open_session(
            client_id, packet.clean_session, handed_over
        )
        self.sessions[client_id] = session
        session.connected = True
        conn.session = session
        conn.will = packet.will
        self.connections[client_id] = conn
        self.metrics.inc("connections_accepted")
        updates.append(MetaUpdate(KIND_ONLINE, client_id, self._online_record(conn, packet.will)))
        own_queue = client_queue(client_id)
        try:
            await start_reading(self.store, session, own_queue)
            if self.presubscriptions and await self._presubscribe(session, username):
                updates.append(MetaUpdate(KIND_SESSION, client_id, session.encode_subscriptions()))
            await self.store.put_meta(updates, durable=True)
        except StoreUnavailable as exc:
            log.error("client %s: store unavailable during CONNECT: %s", client_id, exc)
            self.refuse(conn, ConnackCode.SERVER_UNAVAILABLE, "store unavailable")
            self.disconnected(conn, graceful=True)
            return None
        if conn.closed or conn.session is not session:
            return None
        conn.send(codec.encode(Connack(ConnackCode.ACCEPTED, session_present)))
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
        delivery.resend_inflight()
        delivery.wake()
        if self.cluster is not None:
            for share_filter, qos in session.shared.items():
                self.cluster.shared_member_changed(share_filter, client_id, qos)
        return session

    def _open_session(
        self, client_id: str, clean: bool, handed_over: bool
    ) -> tuple[Session, bool, list[MetaUpdate]]:
        """The session a CONNECT gets, whether it was present, and the records to write."""
        session = self.sessions.get(client_id)
        updates: list[MetaUpdate] = []
        if clean:
            if session is not None:
                self.discard(session, updates)
            return Session(client_id=client_id, persistent=False), False, updates
        if session is not None and session.persistent:
            if handed_over:
                # Its state came from the node that held it: durable under our ownership now.
                updates.append(MetaUpdate(KIND_SESSION, client_id, session.encode_subscriptions()))
                updates.append(MetaUpdate(KIND_OFFSETS, client_id, session.encode_offsets()))
            return session, True, updates
        if session is not None:
            self.discard(session, updates)
        session = Session(client_id=client_id, persistent=True)
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
            session.subscriptions[topic_filter] = presub.qos
            self.metrics.inc("presubscriptions")
            changed = session.persistent
        return changed

    def refuse(self, conn: ClientLink, code: int, reason: str) -> None:
        """Answer CONNACK with a refusal code, log and count it, close."""
        log.warning("client %r from %s refused: %s", conn.client_id or "", conn.peer, reason)
        self.metrics.inc("connections_refused")
        conn.send(codec.encode(Connack(code, False)))
        conn.close(reason, log_it=False)

    # -- the ClientId across the cluster -----------------------------------------------------

    async def _take_over_in_cluster(
        self, conn: ClientLink, client_id: str, clean: bool
    ) -> bool | None:
        """Own the ClientId cluster-wide: claim it in the registry (the atomic step), have the
        node that held it close the old connection and hand over the session, publish the old
        connection's will. True if a session came from another node, None if refused."""
        assert self.cluster is not None
        cluster = self.cluster
        try:
            claim = await cluster.registry.claim(client_id, clean)
        except StoreUnavailable as exc:
            self.refuse(conn, ConnackCode.SERVER_UNAVAILABLE, f"registry unavailable: {exc}")
            return None
        assert claim is not None
        previous = claim.previous_node
        if not previous or previous == self.node_id:
            return False
        state = await cluster.request_release(previous, client_id, claim.epoch)
        will = will_of(claim.online)
        if will is not None:
            # The old connection ends without DISCONNECT: its will is due, and only the node
            # that took the online record (atomically, in the claim) publishes it.
            self.spawn(self.publish_will(client_id, will, clear_online=False))
        records = dict(claim.records)
        if state:
            handed = json.loads(state)
            records["subs"], records["off"] = handed["subs"].encode(), handed["off"].encode()
        session = self.sessions.get(client_id)
        if session is not None:
            self.discard(session, [])  # a stale copy from before
        if "subs" in records and not claim.was_clean:
            claim.records = records
            self.adopt(client_id, claim)
            return True
        return False

    def release(self, client_id: str, epoch: int | None = None) -> bytes:
        """Another node took the client over (at `epoch`, if known): close its connection here
        (its will is the new owner's to publish), drop the session from the tables, hand over
        its state."""
        assert self.cluster is not None
        own = self.cluster.registry.epochs.get(client_id)
        if own is not None and epoch is not None and own > epoch:
            return b""  # taken back by this node since: the request is stale
        session = self.sessions.get(client_id)
        state = b""
        if session is not None and session.persistent:
            state = json.dumps(
                {
                    "subs": session.encode_subscriptions().decode(),
                    "off": session.encode_offsets().decode(),
                },
                separators=(",", ":"),
            ).encode()
        conn = self.connections.get(client_id)
        if conn is not None:
            conn.will = None
            self._detach(conn)
            conn.close("session taken over by a connection on another node", taken_over=True)
        if session is not None:
            self.discard(session, [])
        self.cluster.registry.disown(client_id)
        self.metrics.inc("sessions_released")
        return state

    def lost_ownership(self, client_ids: list[str]) -> None:
        """Writes for these clients were refused: another node owns them now. Let go."""
        assert self.cluster is not None
        for client_id in client_ids:
            if client_id not in self.cluster.registry.epochs:
                log.warning("client %s: owned by another node now; dropped here", client_id)
                self.release(client_id)

    async def end_in_registry(self, client_id: str) -> None:
        """The session is gone here: remove the ClientId's entry from the registry."""
        assert self.cluster is not None
        if client_id in self.sessions:
            return  # reconnected meanwhile
        try:
            await self.cluster.registry.end_session(client_id)
        except StoreUnavailable as exc:
            log.debug("client %s: registry entry not deleted: %s", client_id, exc)

    # -- the end of a connection ---------------------------------------------------------------

    def disconnected(self, conn: ClientLink, graceful: bool) -> None:
        """The connection ended: DISCONNECT received (`graceful`) or the network/peer failed."""
        session = conn.session
        if session is None or conn.detached:
            return
        self.meter.take(conn)
        if not self._detach(conn):
            return  # taken over: the new connection owns the session now
        self.events.disconnected(
            conn, "disconnect" if graceful else conn.close_reason or "connection lost"
        )
        client_id = session.client_id
        will = conn.will
        if not graceful and will is not None:
            self.spawn(self.publish_will(client_id, self.will_message(client_id, will)))
        else:
            self.spawn(self.persist_quietly([MetaUpdate(KIND_ONLINE, client_id, None)]))
        self.subscriptions.redispatch_shared(session)
        if not session.persistent:
            self.discard(session, [])  # nothing of a clean session is stored
            if self.cluster is not None:
                self.spawn(self.end_in_registry(client_id))
        else:
            self.housekeeper.mark_offsets_dirty(session)
            if self.cluster is not None:
                for share_filter, qos in session.shared.items():
                    self.cluster.shared_member_changed(share_filter, client_id, qos)

    def _detach(self, conn: ClientLink) -> bool:
        """Unhook a connection from its session; False if it no longer was the session's."""
        conn.detached = True
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
        session.disconnected_at = time.time()
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
        """Discard offline sessions whose expiry passed, durably and in the registry."""
        updates: list[MetaUpdate] = []
        for session in sessions:
            self.discard(session, updates)
        await self.store.put_meta(updates, durable=True)
        if self.cluster is not None:
            for session in sessions:
                await self.end_in_registry(session.client_id)

    async def persist_quietly(self, updates: list[MetaUpdate]) -> None:
        """Write records in the background: a refusal or outage is logged, not raised."""
        try:
            await self.store.put_meta(updates)
        except StaleOwner as exc:
            log.debug("records not written: %s", exc)
        except StoreUnavailable as exc:
            log.warning("records not written, store unavailable: %s", exc)

    # -- wills ---------------------------------------------------------------------------------

    def _online_record(self, conn: ClientLink, will: Will | None) -> bytes:
        record: dict[str, Any] = {"peer": conn.peer, "at": time.time(), "node": self.node_id}
        if will is not None:
            record["will"] = encode_message(self.will_message(conn.client_id, will)).decode()
        return json.dumps(record, separators=(",", ":")).encode()

    def will_message(self, client_id: str, will: Will) -> Message:
        """The message a will becomes when it is published."""
        return self.publisher.stamper.stamp(
            will.topic, will.payload, will.qos, will.retain, client_id
        )

    async def publish_will(
        self, client_id: str, message: Message, *, clear_online: bool = True
    ) -> None:
        """Publish a will once: the online record is deleted in the same atomic append."""
        self.metrics.inc("wills_published")
        log.info("client %s: publishing will to %r", client_id, message.topic)
        meta = [MetaUpdate(KIND_ONLINE, client_id, None)] if clear_online else []
        if message.retain:
            meta.extend(self.publisher.retained.updates(message))
        try:
            await self.publisher.route(message, meta=meta)
        except StoreUnavailable as exc:
            log.error("client %s: will not stored, store unavailable: %s", client_id, exc)
