"""A client's PUBLISHes into the node: checks, the answer (PUBACK/PUBREC/PUBCOMP), and the flow
control that slows a publisher instead of losing its messages.

`Inbound` belongs to one `Connection`. It checks a PUBLISH (limits, `$SYS`, the ACL, the quotas
on what the node keeps for it: retained and delayed messages, QoS 2 awaiting PUBREL,
`bridge.node.quotas`; and for MQTT 5.0 the topic alias, the payload format and the Receive
Maximum), hands it to the node's publisher and acknowledges it once it is durable, in packet
order. What slows the client (its messages waiting for the store, acknowledgements held while a
subscriber of them is far behind) is decided by the connection's
`bridge.node.flow.ConnectionFlow`; this module tells it what happened.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from bridge.access.acl import PUBLISH, VERDICTS_KEPT
from bridge.listeners.faults import close_for_fault
from bridge.listeners.v5 import ProtocolFault, Version5
from bridge.logtext import client_text
from bridge.mqtt import codec
from bridge.mqtt.codec import encode_puback, encode_pubrec
from bridge.mqtt.delayed import DelayedTopic, DelayedTopicError, is_delayed, parse_delayed
from bridge.mqtt.packets import PacketType, Publish, Pubrel
from bridge.mqtt.properties import PropertyId
from bridge.mqtt.reasons import ReasonCode
from bridge.mqtt.topics import topic_limit_error
from bridge.node.flow import PAUSED_BY_STORE
from bridge.node.qos2_in import publish_again, release
from bridge.node.quotas import awaiting_rel_fault
from bridge.storage.base import StoreUnavailable
from bridge.storage.metadata import metadata_size

if TYPE_CHECKING:
    from bridge.listeners.link import Link
    from bridge.node.flow import ConnectionFlow
    from bridge.session import Session

log = logging.getLogger("bridge.connection")


class Inbound:
    """The inbound message flow of one connection."""

    __slots__ = (
        "_denied_topics", "_published", "_published_as", "_published_under", "acl", "config",
        "conn", "flow", "max_pending", "max_topic_length", "max_topic_levels", "publisher",
        "unreleased",
    )  # fmt: skip

    def __init__(self, conn: Link) -> None:
        self.conn = conn
        node = conn.node
        self.publisher = node.publisher
        self.acl = node.access.acl
        self.config = node.config
        """The node's publisher, ACL and settings, read once: each lasts as long as the node."""
        self.max_topic_length = self.config.max_topic_length
        self.max_topic_levels = self.config.max_topic_levels
        self.max_pending = self.config.max_inbound_pending
        """The settings read per PUBLISH, as native ints (the settings are an interpreted
        dataclass, fixed once the node runs)."""
        self.flow: ConnectionFlow = conn.flow
        """The connection's flow control, read once (a native object: its calls are direct)."""
        self.unreleased = 0
        """QoS 2 messages PUBRECed and not yet PUBCOMPed (they count against the v5 Receive
        Maximum until PUBCOMP, MQTT-4.9.0-1)."""
        self._denied_topics: set[str] | None = None
        self._published: dict[str, bool] | None = None
        """Topic -> whether the ACL lets this client publish to it, under the rules'
        generation `_published_under` and the user name `_published_as`."""
        self._published_under = -1
        self._published_as: str | None = None

    # -- PUBLISH ---------------------------------------------------------------------------------

    def on_publish(self, packet: Publish) -> bool:
        """Check a PUBLISH and hand it to the node; True if the node took it. The connection
        counts a taken PUBLISH itself: the counters are its own attributes, read and written
        natively there, where this module would reach them through the `Link` protocol."""
        conn = self.conn
        session = conn.session
        assert session is not None
        v5 = conn.v5
        if v5 is not None:
            if packet.properties and not self._check_v5_properties(v5, packet):
                return False
            if (
                packet.qos
                and self.flow.pending + self.unreleased >= conn.receive_maximum
                and not (packet.qos == 2 and packet.packet_id in session.inbound_qos2)
            ):
                close_for_fault(
                    conn,
                    f"more than Receive Maximum={conn.receive_maximum} QoS 1/2 messages "
                    "unacknowledged (MQTT-3.3.4-9)",
                    ReasonCode.RECEIVE_MAXIMUM_EXCEEDED,
                )
                return False
        # Node.check_topic_limits, without a call into interpreted code
        error = topic_limit_error(packet.topic, self.max_topic_length, self.max_topic_levels)
        if error:
            close_for_fault(
                conn, f"PUBLISH to {packet.topic[:64]!r}: {error}", ReasonCode.TOPIC_NAME_INVALID
            )
            return False
        topic = packet.topic  # for a delayed publish: its target, which the checks apply to
        delayed = None
        if topic.startswith("$"):
            if is_delayed(topic):
                delayed = self._delayed_target(packet)
                if delayed is None:
                    return False
                topic = delayed.topic
            if topic.startswith("$SYS"):
                self._refuse(
                    packet,
                    ReasonCode.NOT_AUTHORIZED,
                    "dropped_sys_publish",
                    "$SYS topics are the broker's",
                )
                return False
        if self.acl.rules is not None and not self._may_publish(topic):
            self._refuse(
                packet, ReasonCode.NOT_AUTHORIZED, "acl_denied_publish", "denied by the ACL"
            )
            return False
        if packet.retain and packet.payload and delayed is None and not self._retained_fits(packet):
            return False
        if packet.qos == 0:
            self.publisher.publish_qos0(session, packet, delayed)
            return True
        packet_id = packet.packet_id
        assert packet_id is not None
        if packet.qos == 2:
            if packet_id in session.inbound_qos2:
                self._publish_again(session, packet, packet_id)
                return False
            fault = awaiting_rel_fault(len(session.inbound_qos2), self.config.max_awaiting_rel)
            if fault:
                self._refuse_or_close(
                    packet, ReasonCode.QUOTA_EXCEEDED, "quota_refused_awaiting_rel", fault
                )
                return False
        qos = packet.qos
        # Counted before publish: a failing store may call back at once.
        self.flow.publish_taken(self.max_pending)
        self.publisher.publish(session, packet, Acknowledgement(self, qos, packet_id), delayed)
        return True

    def _publish_again(self, session: Session, packet: Publish, packet_id: int) -> None:
        """A resend of a QoS 2 PUBLISH already stored (or being stored): acknowledge it once
        that store is durable, and never store it twice (a failed store removes the id).

        A method of its own rather than a lambda in `on_publish`: compiled, a nested function
        makes its closure on every call of the function that holds it, so every PUBLISH would
        pay for what only a resend uses."""
        publish_again(
            self.publisher, session, packet, lambda error: self.acknowledge(error, 2, packet_id)
        )

    def _may_publish(self, topic: str) -> bool:
        """Whether the ACL lets this client publish to `topic`: each topic's answer is kept for
        the connection until the rules (or its user name, re-authenticated) change, so a
        PUBLISH costs one dictionary lookup."""
        acl = self.acl
        conn = self.conn
        username = conn.username
        kept = self._published
        generation = acl.generation
        if kept is None or self._published_under != generation or self._published_as != username:
            kept = self._published = {}
            self._published_under = generation
            self._published_as = username
        verdict = kept.get(topic)
        if verdict is None:
            verdict = acl.allows(PUBLISH, conn.client_id, username, topic)
            if len(kept) >= VERDICTS_KEPT:
                kept.clear()
            kept[topic] = verdict
        return verdict

    def _check_v5_properties(self, v5: Version5, packet: Publish) -> bool:
        """Resolve the PUBLISH's Topic Alias and check its payload against its Payload Format
        Indicator; False once the client was answered (DISCONNECT 0x94/0x82, PUBACK 0x99)."""
        try:
            packet.topic = v5.resolve_topic(packet)
        except ProtocolFault as fault:
            close_for_fault(self.conn, f"PUBLISH: {fault}", fault.reason)
            return False
        limit = self.config.max_message_properties
        if metadata_size(packet.properties) > limit:
            self._refuse(
                packet,
                ReasonCode.QUOTA_EXCEEDED,
                "properties_too_large",
                f"its properties exceed max_message_properties={limit} bytes",
            )
            return False
        if packet.properties.get(PropertyId.PAYLOAD_FORMAT_INDICATOR) == 1:
            try:
                packet.payload.decode("utf-8")
            except UnicodeDecodeError:
                self._refuse(
                    packet,
                    ReasonCode.PAYLOAD_FORMAT_INVALID,
                    "payload_format_invalid",
                    "payload is not UTF-8 but its Payload Format Indicator says so",
                )
                return False
        return True

    def _delayed_target(self, packet: Publish) -> DelayedTopic | None:
        """The delay and target of a `$delayed/<seconds>/<topic>` PUBLISH, or None once the client
        was answered: a bad form (0x90), a delay over `delayed_max_seconds` (0x83) or a full
        index (0x97) gets PUBACK/PUBREC with that reason (v5 QoS 1/2) or DISCONNECT with it
        (v5 QoS 0); a 3.1.1 client, which has no negative PUBACK, is disconnected, as for a
        topic over the limits. Counted (`delayed_refused`) and logged."""
        conn = self.conn
        node = conn.node
        try:
            delayed = parse_delayed(packet.topic, self.config.delayed_max_seconds)
        except DelayedTopicError as exc:
            reason, why = exc.reason, exc.why
        else:
            assert delayed is not None
            fault = None
            if not self._resent(packet):
                index = self.publisher.delayed
                fault = index.refusal(delayed.topic, conn.client_id, packet.payload)
            if fault is None:
                return delayed
            node.metrics.inc("quota_refused_delayed")
            reason, why = ReasonCode.QUOTA_EXCEEDED, fault
        self._refuse_or_close(packet, reason, "delayed_refused", why)
        return None

    def _resent(self, packet: Publish) -> bool:
        """Whether `packet` is a resend of a QoS 2 message held already (never refused again:
        it was accepted once)."""
        session = self.conn.session
        return packet.qos == 2 and session is not None and packet.packet_id in session.inbound_qos2

    def _retained_fits(self, packet: Publish) -> bool:
        """Whether a retained PUBLISH with a payload may set its topic's retained message within
        the `retained_max_*` quotas; if not the client was answered (`_refuse_or_close`)."""
        if self._resent(packet):
            return True
        client_id = self.conn.client_id
        fault = self.publisher.retained.fault_setting(packet.topic, client_id, packet.payload)
        if fault is None:
            return True
        self._refuse_or_close(packet, ReasonCode.QUOTA_EXCEEDED, "quota_refused_retained", fault)
        return False

    def _refuse_or_close(self, packet: Publish, reason: int, counter: str, why: str) -> None:
        """Refuse a PUBLISH the node will not keep, without acknowledging it as accepted: a v5
        QoS 1/2 one gets PUBACK/PUBREC with `reason` (`_refuse`); a v5 QoS 0 one, which has no
        answer, and any 3.1.1 one, which has no negative answer, get DISCONNECT (3.1.1: the
        connection closed) naming the fault in the log. Counted under `counter`."""
        conn = self.conn
        if conn.v5 is not None and packet.qos:
            self._refuse(packet, reason, counter, why)
            return
        conn.node.metrics.inc(counter)
        conn.close(f"PUBLISH to {packet.topic[:64]!r}: {why}", reason_code=reason)

    def _refuse(self, packet: Publish, reason: int, counter: str, why: str) -> None:
        """Drop a PUBLISH the client may not send. A v5 client gets PUBACK/PUBREC with the
        reason (QoS 0: nothing, or DISCONNECT for a malformed payload); MQTT 3.1.1 has no way to
        say so: a QoS 1/2 message is acknowledged (else the client would resend it forever).
        Counted and logged: the first drop per topic of a connection at WARNING, repeats at
        DEBUG."""
        conn = self.conn
        conn.node.metrics.inc(counter)
        denied = self._denied_topics
        if denied is None:
            denied = self._denied_topics = set()
        first = packet.topic not in denied
        if first and len(denied) < 100:
            denied.add(packet.topic)
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "client %s (user %s): PUBLISH to '%s' dropped: %s (0x%02X)",
            client_text(conn.client_id),
            "None" if conn.username is None else f"'{client_text(conn.username)}'",
            client_text(packet.topic),
            why,
            reason,
        )
        packet_id = packet.packet_id or 0
        if conn.v5 is None:
            if packet.qos == 1:
                self.send_ack(encode_puback(packet_id))
            elif packet.qos == 2:
                self.send_ack(encode_pubrec(packet_id))
            return
        if packet.qos == 0:
            if reason == ReasonCode.PAYLOAD_FORMAT_INVALID:
                close_for_fault(conn, f"PUBLISH to {packet.topic[:64]!r}: {why}", reason)
            return
        kind = PacketType.PUBACK if packet.qos == 1 else PacketType.PUBREC
        # The reason code alone: some clients cannot read properties in PUBACK/PUBREC, and the
        # log line says why.
        self.send_ack(codec.encode_ack5(kind, packet_id, reason))

    def acknowledge(
        self, error: BaseException | None, qos: int, packet_id: int, counted: bool = False
    ) -> None:
        """The PUBLISH is durable (or failed): PUBACK/PUBREC it (or close so the client resends).
        While acknowledgements are held (`hold_acks`) it waits behind the others, in order.
        The store's answer reaches it through a `DurableCallback` (`Acknowledgement`, or the
        resend's callback); `counted`: the PUBLISH was counted in `pending`."""
        conn = self.conn
        if error is not None:
            if counted:
                self._answered()
            conn.close(
                f"message not stored, so not acknowledged ({error}); the client will resend",
                reason_code=ReasonCode.UNSPECIFIED_ERROR,
            )
            return
        if qos == 2 and counted:
            self.unreleased += 1
        # The success PUBACK/PUBREC of 5.0 is the 3.1.1 one (reason 0 may be left out).
        self.send_ack(encode_puback(packet_id) if qos == 1 else encode_pubrec(packet_id), counted)

    def send_ack(self, data: bytes, counted: bool = False) -> None:
        """Send a PUBACK/PUBREC now, or after the ones held before it (`hold_acks`)."""
        if self.flow.ack_waits(data, counted):
            return
        if counted:
            self._answered()
        self.conn.send(data)

    def _answered(self) -> None:
        """One counted publish is answered: the flow reads the socket on once half the pending
        ones are (and the connection's keepalive counts from then)."""
        if self.flow.publish_answered(self.max_pending):
            self.conn.release_reading(PAUSED_BY_STORE)

    def hold_acks(self, reason: str) -> None:
        """Hold this client's PUBACKs/PUBRECs, in order, until every reason is released (a
        subscriber of its messages is too far behind: `bridge.node.congestion`)."""
        self.flow.hold_acks(reason)

    def release_acks(self, reason: str) -> None:
        """One reason to hold acknowledgements is gone; with none left, send what waited."""
        for data, counted in self.flow.release_acks(reason):
            if counted:
                self._answered()
            self.conn.send(data)

    # -- PUBREL ----------------------------------------------------------------------------------

    def on_pubrel(self, packet: Pubrel) -> None:
        conn = self.conn
        session = conn.session
        assert session is not None
        packet_id = packet.packet_id
        if conn.v5 is not None and packet_id not in session.inbound_qos2:
            conn.send(
                codec.encode_ack5(
                    PacketType.PUBCOMP, packet_id, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND
                )
            )
            return
        if not session.persistent:
            session.drop_qos2_in(packet_id)
            self._completed()
            conn.send(codec.encode_pubcomp(packet_id))
            return
        conn.node.spawn(self._release(packet_id))

    async def _release(self, packet_id: int) -> None:
        conn = self.conn
        session = conn.session
        assert session is not None
        try:
            await release(conn.node.store, session, packet_id)
        except StoreUnavailable as exc:
            conn.close(
                f"store unavailable, PUBREL not completed: {exc}",
                reason_code=ReasonCode.UNSPECIFIED_ERROR,
            )
            return
        self._completed()
        conn.send(codec.encode_pubcomp(packet_id))

    def _completed(self) -> None:
        if self.unreleased > 0:
            self.unreleased -= 1


class Acknowledgement:
    """The `DurableCallback` a stored QoS 1/2 PUBLISH calls once durable (or failed): it
    acknowledges the packet through `Inbound.acknowledge`. One object per message (a closure
    would be two)."""

    def __init__(self, inbound: Inbound, qos: int, packet_id: int) -> None:
        self.inbound = inbound
        self.qos = qos
        self.packet_id = packet_id

    def __call__(self, seq: int | None, error: BaseException | None) -> None:
        self.inbound.acknowledge(error, self.qos, self.packet_id, True)
