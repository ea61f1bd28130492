"""One client connection: bytes in -> codec -> node; node -> bytes out, and flow control.

`Connection` is an `asyncio.Protocol`; the MQTT rules live in the codec (`bridge.mqtt`), the
session (`bridge.session`) and the node (`bridge.node`). This module owns what is specific to a
socket: reading it (no more than a read's worth per loop turn), writing to it (one write per
loop turn, of a `bridge.listeners.outbox.Outbox`), telling its flow control
(`bridge.node.flow.ConnectionFlow`) what happened, pausing deliveries when the client reads
slower than we write, holding a client's packets while something they depend on runs, and
closing with a log line that names the client and the fault. How a client gets in and stays in
(its CONNECT, the CONNACK's and the keepalive's deadlines, DISCONNECT) is
`bridge.listeners.connecting`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Final, cast

from bridge.access.reads import may_read
from bridge.counters import Metrics
from bridge.listeners import connecting, delivery_acks
from bridge.listeners.closing import end_socket
from bridge.listeners.control import HANDLERS
from bridge.listeners.enhanced_auth import Authentication
from bridge.listeners.faults import close_for_fault, close_for_protocol_error
from bridge.listeners.inbound import Inbound
from bridge.listeners.outbox import WRITE_AT, Outbox
from bridge.listeners.preauth import PreAuth
from bridge.listeners.tls import peer_cert_cn
from bridge.listeners.v5 import NO_LIMIT, Version5, disconnect_saying
from bridge.mqtt import codec
from bridge.mqtt.codec import Decoder
from bridge.mqtt.errors import MQTTProtocolError
from bridge.mqtt.packets import (
    TYPE_NUMBERS,
    Auth,
    Connect,
    Disconnect,
    Puback,
    Publish,
    Will,
)
from bridge.mqtt.reasons import ReasonCode
from bridge.node.deadlines import NONE
from bridge.node.flow import PAUSED_BY_RATE, PAUSED_FOR_TURN, ConnectionFlow
from bridge.node.qos0_flow import DROP
from bridge.node.roles import Drain
from bridge.node.stalls import StallWatch
from bridge.storage.base import Message

if TYPE_CHECKING:
    from bridge.node import Node
    from bridge.session import Session

log = logging.getLogger("bridge.connection")

SOCKET_HIGH_WATER: Final = 256 * 1024
READ_TURN: Final = 64 * 1024
"""A read this large is the client's last this loop turn (libuv reads up to 32 x 256 KiB):
docs/design.md, "How a PUBLISH travels"."""


class Connection(asyncio.Protocol):
    """The protocol instance of one TCP connection."""

    # Slots, not a __dict__: a node holds tens of thousands of idle connections.
    # fmt: off
    __slots__ = (
        "_flush_handle", "_held", "_holds", "_inbound", "_outbox", "_paused_writing", "_stalls",
        "auth", "cert_cn", "client_id", "close_reason", "closed", "connected_at", "connecting",
        "deadline", "decoder", "delivery", "detached", "flow", "graceful", "keepalive",
        "keepalive_limit", "last_rx", "level", "listener", "loop", "max_packet_out", "metrics",
        "msgs_in", "msgs_out", "node", "payload_in", "payload_out", "peer", "preauth",
        "receive_maximum", "session", "shared_encoding", "transport", "username", "v5", "will",
        "will_key",
    )
    # fmt: on

    def __init__(self, node: Node) -> None:
        self.node = node
        self.metrics: Metrics = node.metrics  # per packet, not looked up on the (interpreted) node
        self._stalls: StallWatch = node.stalls  # asked at every read and write, the same way
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.client_id = ""
        self.username: str | None = None
        """The user name the client acts as (authenticated, or its certificate's CN)."""
        self.cert_cn: str | None = None
        """The CN of the client certificate TLS verified (None: plain TCP or no certificate)."""
        self.session: Session | None = None
        self.delivery: Drain | None = None
        """The task sending the session's stored messages, set by the node once connected."""
        self.will: Will | None = None
        self.will_key = ""
        """The key the will is published under (the one the client's online record names)."""
        self.decoder = Decoder(max_packet_size=node.config.max_packet_size)
        self.closed = False
        self.detached = False
        self.graceful = False
        """True once the client ended its session's connection with DISCONNECT (no will)."""
        self.connecting = False
        """True while the login of its CONNECT runs: later packets are held meanwhile."""
        self._held: list[Any] | None = None
        self._holds = 0
        self._outbox: bytes | Outbox | None = None
        """What this loop turn queued for the socket (None: nothing), written as one write
        (`bridge.listeners.outbox`)."""
        self._flush_handle: asyncio.Handle | None = None
        """The end-of-turn write, once something is queued."""
        self._paused_writing = False
        """True while the socket's buffer is over its high-water mark (the client reads slower
        than it is written to): deliveries wait, QoS 0 messages go through `Qos0Flow`."""
        self.level = 4
        """The protocol level the client speaks (3, 4 or 5; 4 until its CONNECT is read)."""
        self.shared_encoding = 4
        """Which QoS 0 PUBLISH encoded once per fan-out the client takes (see `ClientLink`)."""
        self.max_packet_out = NO_LIMIT
        """The largest packet the client accepts (its v5 Maximum Packet Size; no limit for a
        3.1.1 client)."""
        self._inbound: Inbound | None = None
        self.flow = ConnectionFlow()
        """Why the socket is not read, the publish pacing, the acknowledgements held back."""
        self.v5: Version5 | None = None
        """The MQTT 5.0 state once a v5 CONNECT is accepted (None: 3.1.1 / 3.1)."""
        self.receive_maximum = min(node.config.receive_maximum, node.config.max_awaiting_rel)
        """QoS 1/2 messages a v5 client may have unacknowledged towards us: never more than the
        QoS 2 messages it may leave awaiting PUBREL, so a client that keeps to the Receive
        Maximum it was told is never refused for that quota (one beyond it is disconnected with
        0x93, as MQTT-3.3.4-9 says)."""
        self.auth: Authentication | None = None
        """The MQTT 5.0 enhanced authentication of the connection (None: none)."""
        self.keepalive_limit = 0.0
        """Seconds without a packet after which the client is gone (0: no keepalive yet)."""
        self.last_rx = 0.0
        """Loop time of the last read (or of reading again after a pause)."""
        self.deadline = NONE
        """Its bucket in the node's `Deadlines`: the CONNACK's, then the keepalive's."""
        self.preauth: PreAuth | None = None
        """What the client may make us hold until its CONNACK (None: logged in, or refused)."""
        self.close_reason = ""
        self.listener = "tcp"
        """The kind of listener the client came through: tcp, tls, ws or wss."""
        self.keepalive = 0
        """The keepalive granted, in seconds (0: none)."""
        self.connected_at = 0.0
        # Metering (`bridge.operations.metering` collects and resets these): PUBLISHes, payload.
        self.msgs_in = 0
        self.payload_in = 0
        self.msgs_out = 0
        self.payload_out = 0

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        tcp = cast("asyncio.Transport", transport)  # uvloop's transports are not subclasses
        self.transport = tcp
        self.flow.socket = tcp
        peer = tcp.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"
        self.cert_cn = peer_cert_cn(tcp)
        tcp.set_write_buffer_limits(high=min(SOCKET_HIGH_WATER, self.node.config.write_buffer_high))
        self.node.connection_count += 1
        self.last_rx = now = self.loop.time()
        self.deadline = self.node.deadlines.add(self, now + self.node.config.connect_timeout)
        self.preauth = PreAuth.arrive(self)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.last_rx = now = self.loop.time()
        stalls = self._stalls
        if now - stalls.ticked > stalls.limit and stalls.stalled(now):
            return  # this process was paused, and this node stopped serving meanwhile
        self.metrics.bytes_in += len(data)
        if len(data) >= READ_TURN and not self.flow.pauses:
            self.hold_reading(PAUSED_FOR_TURN)
            self.loop.call_soon(self.release_reading, PAUSED_FOR_TURN)
        decoder = self.decoder
        error: MQTTProtocolError | None = None
        try:
            decoder.feed(data)
            packets = decoder.packets()
        except MQTTProtocolError as exc:
            # Packets that arrived whole before the fault are still handled, then we close.
            error = exc
            packets = exc.packets
        if self.preauth is not None and not self.preauth.take(len(data), packets):
            return
        flow = self.flow
        if flow.paced:
            flow.charge(packets, len(data))
        packets_in = self.metrics.packets_in
        for packet in packets:
            if self.closed:
                return
            packets_in[TYPE_NUMBERS.get(type(packet), 0)] += 1
            if type(packet) is Auth and self.auth is not None and self.auth.waiting:
                self.auth.on_auth(packet)  # the answer an exchange waits for, never held
                continue
            if self.connecting or self._holds:
                if self._held is None:
                    self._held = []
                self._held.append(packet)
                continue
            self._handle(packet)
        if error is not None:
            close_for_protocol_error(self, error, self.decoder.protocol_level)

    def connection_lost(self, exc: Exception | None) -> None:
        self.deadline = self.node.deadlines.remove(self, self.deadline)
        if self.preauth is not None:
            self.preauth.leave()
            self.preauth = None
        if self._flush_handle is not None:
            # The socket is gone: what was queued for it this loop turn cannot be written.
            self._flush_handle.cancel()
            self._flush_handle = None
            self._outbox = None
        self.flow.closed()
        if not self.closed:
            self.closed = True
            if self.session is not None and not self.graceful:
                reason = f"connection lost: {exc}" if exc else "connection closed by client"
                self.close_reason = reason
                log.info("client %s (%s): %s", self.client_id, self.peer, reason)
        self.node.connection_count -= 1
        self.node.qos0_flow.gone(self)
        self.node.lifecycle.disconnected(self, graceful=self.graceful)

    def pause_writing(self) -> None:
        self._paused_writing = True

    def resume_writing(self) -> None:
        self._paused_writing = False
        self.node.qos0_flow.drained(self)
        delivery = self.delivery
        if delivery is not None:
            delivery.wake()

    # -- reading slower --------------------------------------------------------------------------

    def hold_reading(self, reason: int) -> None:
        """Stop reading the socket until `release_reading(reason)` (`bridge.node.flow`)."""
        self.flow.hold(reason)

    def release_reading(self, reason: int) -> None:
        """End one reason to stop reading; with none left, read on."""
        if self.flow.release(reason):
            self.last_rx = self.loop.time()  # a client that was not read was not silent

    def limit_publishes(self, messages_per_second: float, bytes_per_second: float) -> None:
        """Pace what the client sends to these rates (0: unlimited) by reading it later."""
        self.flow.limit_publishes(
            messages_per_second, bytes_per_second, self.loop, self.metrics, self.release_reading
        )
        self.release_reading(PAUSED_BY_RATE)  # a new pacer starts with full buckets

    # -- output ----------------------------------------------------------------------------------

    @property
    def writable(self) -> bool:
        """False while the socket's buffer is over its high-water mark."""
        return not self._paused_writing and not self.closed

    def send(self, data: bytes) -> None:
        """Queue bytes; everything queued in one loop iteration goes out in one write."""
        if self.closed:
            return
        self.metrics.packets_out[data[0] >> 4] += 1
        self._queue(data)

    def send_message(self, data: bytes, payload_size: int, *, metered: bool = True) -> None:
        """Queue an encoded PUBLISH and meter it (`metered=False`: a resend after a reconnect)."""
        if metered:
            self.msgs_out += 1
            self.payload_out += payload_size
        self.send(data)

    def send_droppable(self, data: bytes, payload_size: int, publisher: str) -> bool:
        """Send a QoS 0 PUBLISH of `publisher` (a ClientId), metering `payload_size`; past the
        socket's high-water mark its publisher waits or it drops (`bridge.node.qos0_flow`). True
        if sent: the caller counts it in the node's metrics, once per fan-out."""
        transport = self.transport
        if self.closed or transport is None:
            return False
        if (
            self._paused_writing
            and self.node.qos0_flow.when_full(self, publisher, transport.get_write_buffer_size())
            == DROP
        ):
            return False
        self.msgs_out += 1
        self.payload_out += payload_size
        self._queue(data)
        return True

    def _queue(self, data: bytes) -> None:
        """Queue bytes for the end of this loop turn's write (`bridge.listeners.outbox`): a turn's
        first packet is held as it is, its second makes an `Outbox`.

        Every packet sent passes here (ten times per message in a fan-out to ten), so the
        choice is spelled out in place rather than called: two calls per packet measured 0.3-0.5%
        more instructions per message than the choice itself."""
        held = self._outbox
        if held is None:
            self._outbox = data
        elif isinstance(held, bytes):
            self._outbox = Outbox(held, data)
        elif held.add(data) >= WRITE_AT:
            # A large turn is written as it goes; the end-of-turn write, due since the turn's
            # first packet, takes what follows.
            self._write_out()
            return
        if self._flush_handle is None:
            self._flush_handle = self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        self._write_out()

    def _write_out(self) -> None:
        held = self._outbox
        if held is None or self.transport is None:
            return
        stalls = self._stalls
        now = self.loop.time()
        if now - stalls.ticked > stalls.limit and stalls.stalled(now):
            return  # this process was paused, and this node stopped serving meanwhile
        self._outbox = None
        data = held if isinstance(held, bytes) else held.joined()
        self.transport.write(data)
        self.metrics.bytes_out += len(data)

    @property
    def inbound(self) -> Inbound:
        """What the client publishes (made at its first PUBLISH: idle clients need none)."""
        inbound = self._inbound
        if inbound is None:
            inbound = self._inbound = Inbound(self)
        return inbound

    @property
    def auth_method(self) -> str | None:
        """The enhanced authentication method the client completed (None: none)."""
        auth = self.auth
        return auth.method if auth is not None and auth.final else None

    @property
    def receive_window(self) -> int:
        """QoS 1/2 messages the client takes unacknowledged (its v5 Receive Maximum)."""
        return self.v5.receive_maximum if self.v5 is not None else 65535

    def start_v5(
        self, connect_props: dict[int, Any], chosen: dict[int, Any], session_present: bool
    ) -> None:
        """Accept a v5 CONNECT and answer CONNACK (`bridge.listeners.connecting.accept_v5`)."""
        connecting.accept_v5(self, connect_props, chosen, session_present)

    def encode_message(
        self,
        message: Message,
        qos: int,
        retain: bool,
        dup: bool = False,
        packet_id: int | None = None,
        sub_ids: tuple[int, ...] = (),
    ) -> bytes | None:
        """The PUBLISH of `message` for this client, in its protocol version; None if larger
        than a v5 client's Maximum Packet Size (counted: it is not sent)."""
        v5 = self.v5
        if v5 is None:
            return codec.encode_publish(message.topic, message.payload, qos, retain, dup, packet_id)
        data = v5.encode_publish(message, qos, retain, dup, packet_id, sub_ids)
        if data is None:
            self.node.metrics.inc("dropped_too_large_for_client")
            log.debug(
                "client %s: message on %r larger than its Maximum Packet Size, not sent",
                self.client_id,
                message.topic,
            )
        return data

    def screen_delivery(self, topic: str) -> bool:
        """Whether a message on `topic` may be delivered to this client under the ACL's rules
        on reading (`bridge.access.reads`: checked topic by topic only for a client a deny rule
        applies to or whose filters the rules no longer all grant; decisions are cached). A
        message held back is counted (`acl_filtered_deliveries`)."""
        if may_read(self.node.access.acl, self.session, self.username, topic):
            return True
        self.node.metrics.inc("acl_filtered_deliveries")
        return False

    def close(
        self,
        reason: str,
        *,
        taken_over: bool = False,
        log_it: bool = True,
        reason_code: int | None = None,
        server_reference: str = "",
        discard_queued: bool = False,
    ) -> None:
        """Close the connection after flushing what is queued; log why, naming the client. A v5
        client is first sent DISCONNECT with `reason_code`, the reason as Reason String and
        the `server_reference` to use instead, if any. With `discard_queued` what this loop turn
        queued is dropped instead (it was decided before this node stopped serving)."""
        if self.closed:
            return
        if discard_queued:
            self._outbox = None
        if reason_code is not None and self.v5 is not None:
            self.send(disconnect_saying(reason_code, reason, server_reference))
        self.closed = True
        self.flow.closed()  # the socket lingers below: no pause or resume of it any more
        self.close_reason = reason
        if log_it:
            level = logging.INFO if taken_over else logging.WARNING
            log.log(level, "client %s (%s): closing: %s", self.client_id or "-", self.peer, reason)
        self.deadline = self.node.deadlines.remove(self, self.deadline)
        transport = self.transport
        if transport is not None:
            if self._flush_handle is not None:
                self._flush_handle.cancel()
            told = self._outbox is not None
            self._flush()  # what is queued (a CONNACK with a refusal code) still goes out
            end_socket(transport, self.loop, told)  # lingering, so that the client reads it

    # -- input -----------------------------------------------------------------------------------

    def _handle(self, packet: Any) -> None:
        try:
            if self.session is None:
                if isinstance(packet, Connect):
                    connecting.start(self, packet)
                else:
                    first = type(packet).__name__
                    fault = f"first packet is {first}, not CONNECT (MQTT-3.1.0-1)"
                    close_for_fault(self, fault, ReasonCode.PROTOCOL_ERROR)
                return
            kind = type(packet)
            if kind is Publish:  # the two packets of every QoS 1 message: called directly
                if self.inbound.on_publish(packet):
                    self.msgs_in += 1
                    self.payload_in += len(packet.payload)
                return
            if kind is Puback:
                delivery_acks.on_puback(self, packet)
                return
            handler = HANDLERS.get(kind)
            if handler is None:
                fault = (
                    "second CONNECT on one connection (MQTT-3.1.0-2)"
                    if isinstance(packet, Connect)
                    else f"{type(packet).__name__} is not a packet a client may send"
                )
                close_for_fault(self, fault, ReasonCode.PROTOCOL_ERROR)
                return
            handler(self, packet)
        except Exception:
            log.exception(
                "client %s (%s): internal error handling %s",
                self.client_id,
                self.peer,
                type(packet).__name__,
            )
            self.close("internal error", reason_code=ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR)

    def hold(self) -> None:
        """Keep further packets of this client unhandled until `release` (while the node
        finishes something later packets depend on, e.g. the start offsets of a SUBSCRIBE)."""
        self._holds += 1

    def release(self) -> None:
        """End one `hold`; handle the packets held meanwhile, in order."""
        self._holds -= 1
        self.handle_held()

    def handle_held(self) -> None:
        held = self._held
        while held and not self._holds and not self.connecting and not self.closed:
            self._handle(held.pop(0))
        if held is self._held and not held:
            self._held = None  # (an idle client keeps no list)

    def deadline_due(self) -> None:
        """The CONNACK's or the keepalive's deadline (`bridge.listeners.connecting`)."""
        connecting.deadline_due(self)

    def hold_acks(self, reason: str) -> None:
        """Hold this client's PUBACKs/PUBRECs, in order (see `Inbound.hold_acks`)."""
        self.inbound.hold_acks(reason)

    def release_acks(self, reason: str) -> None:
        """One reason to hold acknowledgements is gone (see `Inbound.release_acks`)."""
        self.inbound.release_acks(reason)

    def disconnect_received(self, packet: Disconnect) -> None:
        """The client said DISCONNECT (`bridge.listeners.connecting.disconnect_received`)."""
        connecting.disconnect_received(self, packet)
