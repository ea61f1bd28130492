"""One client connection: bytes in -> codec -> node; node -> bytes out. Keepalive, flow control.

`Connection` is an `asyncio.Protocol`; the MQTT rules live in the codec (`bridge.mqtt`), the
session (`bridge.session`) and the node (`bridge.node`). This module owns what is specific to a
socket: buffering outgoing packets into one write per loop iteration, pausing reads when a client
publishes faster than the store commits, pausing deliveries when the client reads slower than we
write, and closing with a log line that names the client and the fault.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bridge.access.acl import PUBLISH
from bridge.listeners.tls import peer_cert_cn
from bridge.mqtt import codec
from bridge.mqtt.codec import Decoder, encode_puback, encode_pubrec
from bridge.mqtt.errors import MQTTProtocolError, PacketTooLarge
from bridge.mqtt.packets import (
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Subscribe,
    Unsubscribe,
    Will,
)
from bridge.state import KIND_OFFSETS
from bridge.storage.base import MetaUpdate, StoreUnavailable

if TYPE_CHECKING:
    from bridge.node import Node
    from bridge.session import Session

log = logging.getLogger("bridge.connection")

PINGRESP = codec.encode(Pingresp())
SOCKET_HIGH_WATER = 256 * 1024


class Connection(asyncio.Protocol):
    """The protocol instance of one TCP connection."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.client_id = ""
        self.username: str | None = None
        """The user name the client acts as (authenticated, or its certificate's CN)."""
        self.cert_cn: str | None = None
        """The CN of the client certificate TLS verified (None: plain TCP or no certificate)."""
        self.session: Session | None = None
        self.will: Will | None = None
        self.decoder = Decoder(max_packet_size=node.config.max_packet_size)
        self.closed = False
        self.detached = False
        self._graceful = False
        self._connecting = False
        self._held: list[Any] = []
        self._holds = 0
        self._out: list[bytes] = []
        self._flush_handle: asyncio.Handle | None = None
        self._paused_writing = False
        self._paused_reading = False
        self._pending_in = 0
        self._ack_gate: _AckGate | None = None
        self._keepalive_limit = 0.0
        self._last_rx = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._slow_since = 0.0
        self._denied_topics: set[str] | None = None
        self.close_reason = ""
        self.listener = "tcp"
        self.keepalive = 0
        """The keepalive granted, in seconds (0: none)."""
        """The kind of listener the client came through: tcp, tls, ws or wss."""
        self.connected_at = 0.0
        # Metering (bridge.operations.metering collects and resets these): PUBLISH messages and
        # payload bytes.
        self.msgs_in = 0
        self.payload_in = 0
        self.msgs_out = 0
        self.payload_out = 0

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"
        self.cert_cn = peer_cert_cn(transport)
        transport.set_write_buffer_limits(high=SOCKET_HIGH_WATER)
        self.node.connection_count += 1
        self._last_rx = self.loop.time()
        self._timer = self.loop.call_later(self.node.config.connect_timeout, self._connect_timeout)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self._last_rx = self.loop.time()
        self.node.metrics.bytes_in += len(data)
        decoder = self.decoder
        error: MQTTProtocolError | None = None
        try:
            decoder.feed(data)
            packets = decoder.packets()
        except MQTTProtocolError as exc:
            # Packets that arrived whole before the fault are still handled, then we close.
            error = exc
            packets = exc.packets
        packets_in = self.node.metrics.packets_in
        for packet in packets:
            if self.closed:
                return
            packets_in[_TYPE_NUMBERS.get(type(packet), 0)] += 1
            if self._connecting or self._holds:
                self._held.append(packet)
                continue
            self._handle(packet)
        if error is not None:
            self._protocol_fault(error)

    def _protocol_fault(self, error: MQTTProtocolError) -> None:
        if isinstance(error, PacketTooLarge):
            self.node.metrics.inc("packets_too_large")
            self.close(f"packet of {error.size} bytes exceeds max_packet_size={error.limit}")
        else:
            self.node.metrics.inc("protocol_errors")
            self.close(f"protocol violation {error}")

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._flush_handle is not None:
            # The socket is gone: what was queued for it this loop turn cannot be written.
            self._flush_handle.cancel()
            self._flush_handle = None
            self._out = []
        if not self.closed:
            self.closed = True
            if self.session is not None and not self._graceful:
                reason = f"connection lost: {exc}" if exc else "connection closed by client"
                self.close_reason = reason
                log.info("client %s (%s): %s", self.client_id, self.peer, reason)
        self.node.connection_count -= 1
        self.node.lifecycle.disconnected(self, graceful=self._graceful)

    def pause_writing(self) -> None:
        self._paused_writing = True

    def resume_writing(self) -> None:
        self._paused_writing = False
        self._slow_since = 0.0
        delivery = self.node.deliveries.get(self.client_id)
        if delivery is not None and delivery.conn is self:
            delivery.wake()

    # -- output ----------------------------------------------------------------------------------

    @property
    def writable(self) -> bool:
        """False while the socket's buffer is over its high-water mark."""
        return not self._paused_writing and not self.closed

    def send(self, data: bytes) -> None:
        """Queue bytes; everything queued in one loop iteration goes out in one write."""
        if self.closed:
            return
        self.node.metrics.packets_out[data[0] >> 4] += 1
        self._queue(data)

    def send_message(self, data: bytes, payload_size: int, *, metered: bool = True) -> None:
        """Queue an encoded PUBLISH and meter it (`metered=False` for a resend after a
        reconnect, which is not metered twice)."""
        if metered:
            self.msgs_out += 1
            self.payload_out += payload_size
        self.send(data)

    def _queue(self, data: bytes) -> None:
        self._out.append(data)
        if self._flush_handle is None:
            self._flush_handle = self.loop.call_soon(self._flush)

    def send_droppable(self, data: bytes, payload_size: int) -> bool:
        """Send a QoS 0 PUBLISH unless the client is too slow to take it (then count the drop);
        `payload_size` is metered. True if sent: the caller counts sent messages in the node's
        metrics (`Publisher._send_direct`), once per fan-out rather than once per subscriber."""
        transport = self.transport
        if self.closed or transport is None:
            return False
        if transport.get_write_buffer_size() > self.node.config.write_buffer_high:
            self.node.metrics.inc("dropped_slow_consumer")
            now = self.loop.time()
            if not self._slow_since:
                self._slow_since = now
                log.warning(
                    "client %s (%s): not reading; dropping QoS 0 messages to it",
                    self.client_id,
                    self.peer,
                )
            elif now - self._slow_since > self.node.config.slow_consumer_timeout:
                self.close(
                    f"slow consumer: socket buffer over {self.node.config.write_buffer_high} "
                    f"bytes for {self.node.config.slow_consumer_timeout:.0f} s"
                )
            return False
        self.msgs_out += 1
        self.payload_out += payload_size
        self._queue(data)
        return True

    def _flush(self) -> None:
        self._flush_handle = None
        out = self._out
        if not out or self.transport is None:
            return
        self._out = []
        data = out[0] if len(out) == 1 else b"".join(out)
        self.transport.write(data)
        self.node.metrics.inc("bytes_out", len(data))

    def close(self, reason: str, *, taken_over: bool = False, log_it: bool = True) -> None:
        """Close the connection after flushing what is queued; log why, naming the client."""
        if self.closed:
            return
        self.closed = True
        self.close_reason = reason
        if log_it:
            level = logging.INFO if taken_over else logging.WARNING
            log.log(level, "client %s (%s): closing: %s", self.client_id or "-", self.peer, reason)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport is not None:
            if self._flush_handle is not None:
                self._flush_handle.cancel()
            self._flush()  # what is queued (a CONNACK with a refusal code) still goes out
            self.transport.close()

    # -- input -----------------------------------------------------------------------------------

    def _handle(self, packet: Any) -> None:
        try:
            if self.session is None:
                if isinstance(packet, Connect):
                    self._start_connect(packet)
                else:
                    self.close(
                        f"first packet is {type(packet).__name__}, not CONNECT (MQTT-3.1.0-1)"
                    )
                return
            handler = _HANDLERS.get(type(packet))
            if handler is None:
                if isinstance(packet, Connect):
                    self.close("second CONNECT on one connection (MQTT-3.1.0-2)")
                else:
                    self.close(f"{type(packet).__name__} is not a packet a client may send")
                return
            handler(self, packet)
        except Exception:
            log.exception(
                "client %s (%s): internal error handling %s",
                self.client_id,
                self.peer,
                type(packet).__name__,
            )
            self.close("internal error")

    def _start_connect(self, packet: Connect) -> None:
        self._connecting = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.node.spawn(self._connect(packet))

    async def _connect(self, packet: Connect) -> None:
        try:
            session = await self.node.lifecycle.connect(self, packet)
        finally:
            self._connecting = False
        if session is None or self.closed:
            return
        keepalive = packet.keepalive
        if self.node.config.max_keepalive and (
            keepalive == 0 or keepalive > self.node.config.max_keepalive
        ):
            keepalive = self.node.config.max_keepalive
        self.keepalive = keepalive
        if keepalive:
            self._keepalive_limit = keepalive * 1.5
            self._timer = self.loop.call_later(self._keepalive_limit, self._keepalive_check)
        self._handle_held()

    def hold(self) -> None:
        """Keep further packets of this client unhandled until `release` (while the node
        finishes something later packets depend on, e.g. the start offsets of a SUBSCRIBE)."""
        self._holds += 1

    def release(self) -> None:
        """End one `hold`; handle the packets held meanwhile, in order."""
        self._holds -= 1
        self._handle_held()

    def _handle_held(self) -> None:
        held = self._held
        while held and not self._holds and not self._connecting and not self.closed:
            self._handle(held.pop(0))

    def _connect_timeout(self) -> None:
        self._timer = None
        if self.session is None and not self._connecting:
            self.close(f"no CONNECT within connect_timeout={self.node.config.connect_timeout} s")

    def _keepalive_check(self) -> None:
        self._timer = None
        if self.closed:
            return
        idle = self.loop.time() - self._last_rx
        if idle >= self._keepalive_limit:
            self.node.metrics.inc("keepalive_timeouts")
            self.close(f"keepalive timeout: nothing received for {idle:.1f} s (MQTT-3.1.2-24)")
            return
        self._timer = self.loop.call_later(self._keepalive_limit - idle, self._keepalive_check)

    def _on_publish(self, packet: Publish) -> None:
        session = self.session
        assert session is not None
        node = self.node
        error = node.check_topic_limits(packet.topic)
        if error:
            self.close(f"PUBLISH to {packet.topic[:64]!r}: {error}")
            return
        if packet.topic.startswith("$SYS"):
            self._drop_publish(packet, "dropped_sys_publish", "$SYS topics are the broker's")
            return
        acl = node.access.acl
        if acl.rules is not None and not acl.allows(
            PUBLISH, self.client_id, self.username, packet.topic
        ):
            self._drop_publish(packet, "acl_denied_publish", "denied by the ACL")
            return
        if packet.qos == 0:
            self.msgs_in += 1
            self.payload_in += len(packet.payload)
            node.publisher.publish_qos0(session, packet)
            return
        packet_id = packet.packet_id
        assert packet_id is not None
        if packet.qos == 2 and packet_id in session.inbound_qos2:
            # A resend of a QoS 2 PUBLISH already stored (or being stored): acknowledge it once
            # that store is durable, never store it twice. (A failed store removes the id.)
            node.publisher.publish_qos2_again(
                session, packet, lambda error: self._acknowledge(error, 2, packet_id)
            )
            return
        qos = packet.qos
        self.msgs_in += 1
        self.payload_in += len(packet.payload)
        self._pending_in += 1  # before publish: a failing store may call back at once
        node.publisher.publish(
            session, packet, lambda _s, error: self._acknowledge(error, qos, packet_id, True)
        )
        if self._pending_in >= node.config.max_inbound_pending and not self._paused_reading:
            self._paused_reading = True
            if self.transport is not None:
                self.transport.pause_reading()

    def _drop_publish(self, packet: Publish, counter: str, reason: str) -> None:
        """Drop a PUBLISH the client may not send. MQTT 3.1.1 has no way to say so: a QoS 1/2
        message is acknowledged (else the client would resend it forever), counted and logged;
        the first drop per topic of a connection at WARNING, repeats at DEBUG."""
        self.node.metrics.inc(counter)
        denied = self._denied_topics
        if denied is None:
            denied = self._denied_topics = set()
        first = packet.topic not in denied
        if first and len(denied) < 100:
            denied.add(packet.topic)
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "client %s (user %r): PUBLISH to %r dropped: %s",
            self.client_id,
            self.username,
            packet.topic,
            reason,
        )
        if packet.qos == 1:
            self._send_ack(codec.encode(Puback(packet.packet_id or 0)))
        elif packet.qos == 2:
            self._send_ack(codec.encode(Pubrec(packet.packet_id or 0)))

    def _acknowledge(
        self, error: BaseException | None, qos: int, packet_id: int, counted: bool = False
    ) -> None:
        """The PUBLISH is durable (or failed): PUBACK/PUBREC it (or close so the client resends).
        While acknowledgements are held (`hold_acks`) it waits behind the others, in order."""
        if error is not None:
            if counted:
                self._stored_in()
            self.close(f"message not stored, so not acknowledged ({error}); the client will resend")
            return
        self._send_ack(encode_puback(packet_id) if qos == 1 else encode_pubrec(packet_id), counted)

    def _send_ack(self, data: bytes, counted: bool = False) -> None:
        """Send a PUBACK/PUBREC now, or after the ones held before it (`hold_acks`)."""
        gate = self._ack_gate
        if gate is not None:
            gate.waiting.append((data, counted))
            return
        if counted:
            self._stored_in()
        self.send(data)

    def _stored_in(self) -> None:
        """One counted publish is answered: resume reading once half the pending ones are."""
        self._pending_in -= 1
        if self._paused_reading and self._pending_in <= self.node.config.max_inbound_pending // 2:
            self._paused_reading = False
            if self.transport is not None and not self.closed:
                self.transport.resume_reading()

    def hold_acks(self, reason: str) -> None:
        """Hold this client's PUBACKs/PUBRECs, in order, until every reason is released (a
        subscriber of its messages is too far behind: `bridge.node.congestion`)."""
        gate = self._ack_gate
        if gate is None:
            gate = self._ack_gate = _AckGate()
        gate.reasons.add(reason)

    def release_acks(self, reason: str) -> None:
        """One reason to hold acknowledgements is gone; with none left, send what waited."""
        gate = self._ack_gate
        if gate is None:
            return
        gate.reasons.discard(reason)
        if gate.reasons:
            return
        self._ack_gate = None
        for data, counted in gate.waiting:
            if counted:
                self._stored_in()
            self.send(data)

    def _on_pubrel(self, packet: Pubrel) -> None:
        session = self.session
        assert session is not None
        if not session.persistent:
            session.inbound_qos2.pop(packet.packet_id, None)
            self.send(codec.encode(Pubcomp(packet.packet_id)))
            return
        self.node.spawn(self._release(session, packet.packet_id))

    async def _release(self, session: Session, packet_id: int) -> None:
        try:
            await self.node.publisher.release_qos2(session, packet_id)
        except StoreUnavailable as exc:
            self.close(f"store unavailable, PUBREL not completed: {exc}")
            return
        self.send(codec.encode(Pubcomp(packet_id)))

    def _on_puback(self, packet: Puback) -> None:
        session = self.session
        assert session is not None
        if session.on_puback(packet.packet_id) is None:
            log.debug(
                "client %s: PUBACK for unknown packet id %d", self.client_id, packet.packet_id
            )
            return
        self._after_ack(session)

    def _on_pubrec(self, packet: Pubrec) -> None:
        session = self.session
        assert session is not None
        out = session.on_pubrec(packet.packet_id)
        if out is None or not session.persistent:
            # Unknown id: answer PUBREL anyway so the client can finish its side.
            self.send(codec.encode(Pubrel(packet.packet_id)))
            return
        # The client may forget the id once it has PUBCOMPed: the PUBREL phase must be durable
        # before PUBREL goes out, so a restart never resends this PUBLISH.
        self.node.spawn(self._persist_then_pubrel(session, packet.packet_id))

    async def _persist_then_pubrel(self, session: Session, packet_id: int) -> None:
        try:
            await self.node.store.put_meta(
                [MetaUpdate(KIND_OFFSETS, session.client_id, session.encode_offsets())],
                durable=True,
            )
        except StoreUnavailable as exc:
            self.close(f"store unavailable, PUBREC not recorded: {exc}")
            return
        self.send(codec.encode(Pubrel(packet_id)))

    def _on_pubcomp(self, packet: Pubcomp) -> None:
        session = self.session
        assert session is not None
        if session.on_pubcomp(packet.packet_id) is None:
            log.debug(
                "client %s: PUBCOMP for unknown packet id %d", self.client_id, packet.packet_id
            )
            return
        self._after_ack(session)

    def _after_ack(self, session: Session) -> None:
        self.node.housekeeper.mark_offsets_dirty(session)
        delivery = self.node.deliveries.get(session.client_id)
        if delivery is not None and delivery.blocked_on_window:
            # Refill the window in batches, not one message per acknowledgement.
            max_inflight = self.node.config.max_inflight
            if max_inflight - len(session.inflight) >= max(1, max_inflight // 4):
                delivery.wake()

    def _on_subscribe(self, packet: Subscribe) -> None:
        assert self.session is not None
        self.node.subscriptions.subscribe(self, self.session, packet)

    def _on_unsubscribe(self, packet: Unsubscribe) -> None:
        assert self.session is not None
        self.node.subscriptions.unsubscribe(self, self.session, packet)

    def _on_pingreq(self, packet: Pingreq) -> None:
        self.send(PINGRESP)

    def _on_disconnect(self, packet: Disconnect) -> None:
        self._graceful = True
        log.debug("client %s: DISCONNECT", self.client_id)
        self.node.lifecycle.disconnected(self, graceful=True)
        self.close("DISCONNECT", log_it=False)


class _AckGate:
    """Acknowledgements held back, in order, and why (`Connection.hold_acks`)."""

    __slots__ = ("reasons", "waiting")

    def __init__(self) -> None:
        self.reasons: set[str] = set()
        self.waiting: list[tuple[bytes, bool]] = []


_TYPE_NUMBERS: dict[type, int] = {
    Connect: 1,
    Publish: 3,
    Puback: 4,
    Pubrec: 5,
    Pubrel: 6,
    Pubcomp: 7,
    Subscribe: 8,
    Unsubscribe: 10,
    Pingreq: 12,
    Disconnect: 14,
}

_HANDLERS: dict[type, Callable[[Connection, Any], None]] = {
    Publish: Connection._on_publish,
    Puback: Connection._on_puback,
    Pubrec: Connection._on_pubrec,
    Pubrel: Connection._on_pubrel,
    Pubcomp: Connection._on_pubcomp,
    Subscribe: Connection._on_subscribe,
    Unsubscribe: Connection._on_unsubscribe,
    Pingreq: Connection._on_pingreq,
    Disconnect: Connection._on_disconnect,
}
"""Packet type -> handler, once for the class (a table per connection cost ~0.9 KiB of each
connection's memory: docs/performance.md, connection capacity)."""
