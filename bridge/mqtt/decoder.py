"""The incremental MQTT decoder: bytes from a connection to packets (`Decoder`).

`Decoder` owns framing: buffering partial reads, the fixed header (first-byte validity, remaining
length, size limit) and, for MQTT 3.x, an inlined PUBLISH decoder, the broker's hot path. Every
other body goes to its decoder in `bridge.mqtt.body_decoders`. The one MQTT 5.0 rule that
depends on which side sent the packet lives here too: a PUBLISH from a client must not carry a
Subscription Identifier (MQTT-3.3.4-6), so a server's decoder (the default) refuses it and a
client's (``Decoder(from_server=True)``) accepts it. Import it through
`bridge.mqtt.codec`, the public facade.
"""

from __future__ import annotations

from typing import Final

from bridge.mqtt.body_decoders import BODY_DECODERS, check_publish_topic
from bridge.mqtt.errors import MQTTProtocolError, PacketTooLarge
from bridge.mqtt.packets import Connect, Packet, Puback, Publish
from bridge.mqtt.properties import PropertyId
from bridge.mqtt.wire import MAX_PACKET_SIZE, SUPPORTED_PROTOCOLS, malformed, protocol_error

__all__ = ["Decoder"]


# --- fixed header ----------------------------------------------------------------------------

_TYPE_NAMES: Final = (
    "reserved type 0",
    "CONNECT",
    "CONNACK",
    "PUBLISH",
    "PUBACK",
    "PUBREC",
    "PUBREL",
    "PUBCOMP",
    "SUBSCRIBE",
    "SUBACK",
    "UNSUBSCRIBE",
    "UNSUBACK",
    "PINGREQ",
    "PINGRESP",
    "DISCONNECT",
    "AUTH",
)


def _first_byte_problem(first: int, level: int) -> tuple[str, str] | None:
    """The rule a fixed header's first byte breaks at protocol `level`, or None when it is valid
    (type 15 is AUTH from MQTT 5.0 on, reserved before)."""
    kind, flags = first >> 4, first & 0x0F
    if kind == 0 or (kind == 15 and level < 5):
        return "invalid-packet-type", f"packet type {kind} is reserved (first byte 0x{first:02X})"
    if kind == 3:
        qos = (flags >> 1) & 3
        if qos == 3:
            return "MQTT-3.3.1-4", "PUBLISH must not have QoS 3"
        if qos == 0 and flags & 0x08:
            return "MQTT-3.3.1-2", "DUP must be 0 in a QoS 0 PUBLISH"
        return None
    expected = 0b0010 if kind in (6, 8, 10) else 0
    if flags != expected:
        return (
            "MQTT-2.2.2-1",
            f"reserved flags of {_TYPE_NAMES[kind]} must be 0b{expected:04b}, got 0b{flags:04b}",
        )
    return None


_FIRST_BYTE_PROBLEMS: Final = tuple(_first_byte_problem(b, 4) for b in range(256))
_FIRST_BYTE_BAD: Final = tuple(p is not None for p in _FIRST_BYTE_PROBLEMS)
_FIRST_BYTE_PROBLEMS_5: Final = tuple(_first_byte_problem(b, 5) for b in range(256))
_FIRST_BYTE_BAD_5: Final = tuple(p is not None for p in _FIRST_BYTE_PROBLEMS_5)


def _first_byte_error(first: int, level: int) -> MQTTProtocolError:
    problem = (_FIRST_BYTE_PROBLEMS_5 if level >= 5 else _FIRST_BYTE_PROBLEMS)[first]
    assert problem is not None
    return MQTTProtocolError(*problem)


def _subscription_id_error() -> MQTTProtocolError:
    return protocol_error(
        "MQTT-3.3.4-6", "a PUBLISH from a client must not carry a Subscription Identifier"
    )


# --- the incremental decoder -----------------------------------------------------------------


class Decoder:
    """Incremental MQTT decoder for one connection.

    `feed` bytes as they arrive, then call `packets` (all complete packets) or `next_packet`
    (one). `protocol_level` selects the 3.1.1 or 5.0 wire format; decoding a CONNECT with a
    supported (name, level) pair sets it. Any violation raises `MQTTProtocolError`; afterwards the
    decoder is dead and raises the same error again.

    `from_server` says which side this decoder reads: False (the default) for a server reading
    a client, True for a client reading a server. It matters only at 5.0, where a client's
    PUBLISH must not carry a Subscription Identifier (MQTT-3.3.4-6) but a server's may.

    Buffering: the unread bytes are held as one ``bytes`` object plus a read index, so a read
    holding many packets is sliced without copying the rest. While the next packet is known to be
    incomplete, further chunks are only collected and joined once the packet is complete, so a
    large packet arriving in many reads is copied O(1) times. Call `packets` after each `feed`.
    """

    __slots__ = (
        "_buf",
        "_error",
        "_need",
        "_pending",
        "_pending_len",
        "_pos",
        "from_server",
        "max_packet_size",
        "protocol_level",
    )

    def __init__(
        self, max_packet_size: int = MAX_PACKET_SIZE, *, from_server: bool = False
    ) -> None:
        self.max_packet_size = max_packet_size
        self.from_server = from_server
        self.protocol_level: int = 4
        self._buf = b""
        self._pos = 0
        self._need = 0  # total size of the incomplete packet at _pos, if its header was read
        self._pending: list[bytes] | None = None
        self._pending_len = 0
        self._error: MQTTProtocolError | None = None

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Buffer `data` (bytes read from the connection). Never raises."""
        if type(data) is not bytes:
            data = bytes(data)
        if not data:
            return
        if self._need:
            pending = self._pending
            if pending is None:
                pending = self._pending = []  # (an idle client keeps no list)
            pending.append(data)
            self._pending_len += len(data)
            if len(self._buf) - self._pos + self._pending_len < self._need:
                return
            data = b"".join(pending)
            self._pending = None
            self._pending_len = 0
            self._need = 0
        if self._pos < len(self._buf):
            self._buf = b"".join((memoryview(self._buf)[self._pos :], data))
        else:
            self._buf = data
        self._pos = 0

    @property
    def buffered(self) -> int:
        """How many bytes are buffered but not yet decoded."""
        return len(self._buf) - self._pos + self._pending_len

    def next_packet(self) -> Packet | None:
        """The next complete packet, or None when more data is needed."""
        decoded = self._decode(1)
        return decoded[0] if decoded else None

    def packets(self) -> list[Packet]:
        """All complete packets buffered so far, in order (possibly none).

        On a violation the error's ``packets`` attribute holds those decoded before it.
        """
        return self._decode(-1)

    def _decode(self, limit: int) -> list[Packet]:
        if self._error is not None:
            raise self._error
        out: list[Packet] = []
        buf = self._buf
        pos = self._pos
        n = len(buf)
        level = self.protocol_level
        max_size = self.max_packet_size
        bad = _FIRST_BYTE_BAD_5 if level >= 5 else _FIRST_BYTE_BAD
        append = out.append
        try:
            while pos < n and limit:
                first = buf[pos]
                if bad[first]:
                    raise _first_byte_error(first, level)
                if pos + 1 >= n:
                    break
                remaining = buf[pos + 1]
                if remaining < 0x80:
                    start = pos + 2
                else:
                    remaining, start = _long_remaining_length(buf, pos, n)
                    if start < 0:
                        break
                if start - pos + remaining > max_size:
                    raise PacketTooLarge(start - pos + remaining, max_size)
                end = start + remaining
                if end > n:
                    self._need = end - pos
                    break
                if first >> 4 == 3 and (level < 5 or _plain_v5_publish(buf, start, end, first)):
                    # PUBLISH, 3.1.1 or 5.0 without properties: the hot path, decoded inline.
                    # The string read as `read_utf8` reads it (same faults, same texts; its
                    # call on a `bytes | bytearray` buffer costs ~1,500 instructions more per
                    # PUBLISH compiled), the topic checked by the full decoder's own rules.
                    if remaining < 2:
                        raise malformed("UTF-8 string length runs past the end of the packet")
                    topic_end = start + 2 + ((buf[start] << 8) | buf[start + 1])
                    if topic_end > end:
                        raise malformed("UTF-8 string runs past the end of the packet")
                    try:
                        topic = buf[start + 2 : topic_end].decode()
                    except UnicodeDecodeError:
                        raise MQTTProtocolError("MQTT-1.5.3-1", "ill-formed UTF-8 string") from None
                    if "\x00" in topic:
                        raise MQTTProtocolError("MQTT-1.5.3-2", "UTF-8 string contains U+0000")
                    check_publish_topic(topic, level, False)
                    if first & 0x06:
                        if topic_end + 2 > end:
                            raise malformed("PUBLISH is too short for a packet identifier")
                        packet_id = (buf[topic_end] << 8) | buf[topic_end + 1]
                        if not packet_id:
                            raise MQTTProtocolError(
                                "MQTT-2.3.1-1", "PUBLISH packet identifier must be non-zero"
                            )
                        append(
                            Publish(
                                topic,
                                buf[topic_end + 2 + (level >= 5) : end],
                                (first >> 1) & 3,
                                first & 1 == 1,
                                first & 8 == 8,
                                packet_id,
                                {},
                            )
                        )
                    else:
                        append(
                            Publish(
                                topic,
                                buf[topic_end + (level >= 5) : end],
                                0,
                                first & 1 == 1,
                                False,
                                None,
                                {},
                            )
                        )
                elif first == 0x40 and remaining == 2 and (buf[start] or buf[start + 1]):
                    # PUBACK with a non-zero id and no reason code: every QoS 1 delivery's.
                    append(Puback((buf[start] << 8) | buf[start + 1]))
                else:
                    packet = BODY_DECODERS[first >> 4](buf, start, end, first & 0x0F, level)
                    if type(packet) is Connect:
                        if (packet.protocol_name, packet.protocol_level) in SUPPORTED_PROTOCOLS:
                            level = self.protocol_level = packet.protocol_level
                            bad = _FIRST_BYTE_BAD_5 if level >= 5 else _FIRST_BYTE_BAD
                    elif (
                        type(packet) is Publish
                        and packet.properties
                        and _SUBSCRIPTION_IDENTIFIER in packet.properties
                        and not self.from_server
                    ):
                        raise _subscription_id_error()
                    append(packet)
                pos = end
                limit -= 1
        except MQTTProtocolError as error:
            error.packets = out
            self._error = error
            raise
        if pos >= n:
            self._buf = b""
            self._pos = 0
        else:
            self._pos = pos
        return out


_SUBSCRIPTION_IDENTIFIER: Final = PropertyId.SUBSCRIPTION_IDENTIFIER


def _plain_v5_publish(buf: bytes, start: int, end: int, first: int) -> bool:
    """Whether the 5.0 PUBLISH in buf[start:end] has a non-empty topic and an empty property
    block (the common case, decoded inline like 3.1.1); anything else takes the full decoder,
    which also finds every fault."""
    if end - start < 3:
        return False
    topic_len = (buf[start] << 8) | buf[start + 1]
    props_at = start + 2 + topic_len + (2 if first & 0x06 else 0)
    return topic_len > 0 and props_at < end and buf[props_at] == 0


def _long_remaining_length(buf: bytes, pos: int, n: int) -> tuple[int, int]:
    """Remaining length of 2..4 bytes at buf[pos + 1:]; (-1, -1) when not all bytes are here."""
    value = 0
    shift = 0
    index = pos + 1
    for _ in range(4):
        if index >= n:
            return -1, -1
        byte = buf[index]
        value |= (byte & 0x7F) << shift
        index += 1
        if byte < 0x80:
            return value, index
        shift += 7
    raise MQTTProtocolError("malformed-remaining-length", "remaining length is longer than 4 bytes")
