"""Sans-IO MQTT codec: packets to bytes (`encode`, `encode_publish`) and bytes to packets
(`Decoder`).

MQTT 3.1.1 (protocol level 4) and 3.1 (level 3, same wire format) are validated strictly; every
violation raises `MQTTProtocolError` naming the rule. With ``protocol_level >= 5`` the MQTT 5.0
property blocks and reason codes are read and written where 5.0 places them; 5.0-specific
validation beyond the wire format is not done yet.

Nothing here does I/O. The broker feeds what it reads from a socket into a `Decoder` and calls
`Decoder.packets()` once per read; it writes what `encode` / `encode_publish` return.
"""

from __future__ import annotations

from collections.abc import Callable
from struct import Struct
from typing import Any, Final

from bridge.mqtt.errors import MQTTProtocolError, PacketTooLarge
from bridge.mqtt.packets import (
    SUBACK_FAILURE,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
)
from bridge.mqtt.properties import (
    MAX_VARINT,
    PropertyId,
    decode_properties,
    encode_binary,
    encode_properties,
    encode_utf8,
    encode_varint,
    read_binary,
    read_utf8,
)
from bridge.mqtt.topics import validate_topic_name

__all__ = [
    "MAX_PACKET_SIZE",
    "SUPPORTED_PROTOCOLS",
    "Decoder",
    "encode",
    "encode_puback",
    "encode_pubcomp",
    "encode_publish",
    "encode_pubrec",
    "encode_pubrel",
]

MAX_PACKET_SIZE: Final = 268_435_460
"""The largest packet MQTT can frame: 1 type byte + 4 length bytes + 268,435,455."""

SUPPORTED_PROTOCOLS: Final = frozenset({("MQIsdp", 3), ("MQTT", 4), ("MQTT", 5)})
"""(protocol name, protocol level) pairs this codec speaks. A CONNECT with a known name but a
pair outside this set still decodes; the broker answers it with CONNACK 0x01 (MQTT-3.1.2-2)."""

_SUBACK_CODES_311: Final = frozenset({0x00, 0x01, 0x02, SUBACK_FAILURE})
_SUBACK_CODES_5: Final = frozenset(
    {0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2}
)
_UNSUBACK_CODES_5: Final = frozenset({0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91})

_BBH = Struct(">BBH")
_BBHH = Struct(">BBHH")
_H = Struct(">H")
_HH = Struct(">HH")


def _malformed(message: str) -> MQTTProtocolError:
    return MQTTProtocolError("malformed-packet", message)


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
    "reserved type 15",
)


def _first_byte_problem(first: int) -> tuple[str, str] | None:
    """The rule a fixed header's first byte breaks, or None when it is valid."""
    kind, flags = first >> 4, first & 0x0F
    if kind == 0 or kind == 15:
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


_FIRST_BYTE_PROBLEMS: Final = tuple(_first_byte_problem(b) for b in range(256))
_FIRST_BYTE_BAD: Final = tuple(p is not None for p in _FIRST_BYTE_PROBLEMS)


def _first_byte_error(first: int) -> MQTTProtocolError:
    problem = _FIRST_BYTE_PROBLEMS[first]
    assert problem is not None
    return MQTTProtocolError(*problem)


def _header(first: int, remaining: int) -> bytes:
    if remaining < 0x80:
        return bytes((first, remaining))
    if remaining > MAX_VARINT:
        raise PacketTooLarge(1 + 4 + remaining, MAX_PACKET_SIZE)
    return bytes((first,)) + encode_varint(remaining)


def _frame(first: int, body: bytes) -> bytes:
    return _header(first, len(body)) + body


# --- decoding of packet bodies ---------------------------------------------------------------
# Each body decoder gets (buf, pos, end, flags, level): the packet body is buf[pos:end].


def _read_packet_id(buf: bytes, pos: int, end: int, what: str) -> int:
    if pos + 2 > end:
        raise _malformed(f"{what} is too short for a packet identifier")
    packet_id = (buf[pos] << 8) | buf[pos + 1]
    if packet_id == 0:
        raise MQTTProtocolError("MQTT-2.3.1-1", f"{what} packet identifier must be non-zero")
    return packet_id


def _check_end(pos: int, end: int, what: str) -> None:
    if pos != end:
        raise _malformed(f"{what} has {end - pos} unexpected trailing bytes")


def _decode_connect(buf: bytes, pos: int, end: int, flags: int, level: int) -> Connect:
    name, pos = read_utf8(buf, pos, end)
    if name not in ("MQTT", "MQIsdp"):
        raise MQTTProtocolError("MQTT-3.1.2-1", f"unknown protocol name {name!r}")
    if pos >= end:
        raise _malformed("CONNECT ends before the protocol level")
    protocol_level = buf[pos]
    pos += 1
    if (name, protocol_level) in SUPPORTED_PROTOCOLS:
        return _decode_connect_rest(buf, pos, end, name, protocol_level, protocol_level)
    # Unsupported level: decode what we can, but never fail, so the broker can answer
    # CONNACK 0x01 (MQTT-3.1.2-2).
    try:
        layout = 5 if protocol_level >= 5 else 4
        return _decode_connect_rest(buf, pos, end, name, protocol_level, layout)
    except MQTTProtocolError:
        return Connect(client_id="", protocol_level=protocol_level, protocol_name=name)


def _decode_connect_rest(
    buf: bytes, pos: int, end: int, name: str, protocol_level: int, layout: int
) -> Connect:
    if pos + 3 > end:
        raise _malformed("CONNECT ends before the connect flags and keep alive")
    cflags = buf[pos]
    keepalive = (buf[pos + 1] << 8) | buf[pos + 2]
    pos += 3
    if cflags & 0x01:
        raise MQTTProtocolError("MQTT-3.1.2-3", "reserved flag in CONNECT must be 0")
    will_flag = cflags & 0x04
    will_qos = (cflags >> 3) & 0x03
    will_retain = bool(cflags & 0x20)
    has_password = cflags & 0x40
    has_username = cflags & 0x80
    if will_flag:
        if will_qos == 3:
            raise MQTTProtocolError("MQTT-3.1.2-14", "will QoS must not be 3")
    else:
        if will_qos:
            raise MQTTProtocolError("MQTT-3.1.2-13", "will QoS must be 0 when the will flag is 0")
        if will_retain:
            raise MQTTProtocolError(
                "MQTT-3.1.2-15", "will retain must be 0 when the will flag is 0"
            )
    if has_password and not has_username and layout < 5:
        raise MQTTProtocolError(
            "MQTT-3.1.2-22", "password flag must be 0 when the user name flag is 0"
        )
    properties: dict[int, Any] = {}
    if layout >= 5:
        properties, pos = decode_properties(buf, pos, end)
    client_id, pos = read_utf8(buf, pos, end)
    will = None
    if will_flag:
        will_properties: dict[int, Any] = {}
        if layout >= 5:
            will_properties, pos = decode_properties(buf, pos, end)
        will_topic, pos = read_utf8(buf, pos, end)
        validate_topic_name(will_topic)
        will_payload, pos = read_binary(buf, pos, end)
        will = Will(will_topic, will_payload, will_qos, will_retain, will_properties)
    username = None
    if has_username:
        username, pos = read_utf8(buf, pos, end)
    password = None
    if has_password:
        password, pos = read_binary(buf, pos, end)
    _check_end(pos, end, "CONNECT")
    return Connect(
        client_id,
        bool(cflags & 0x02),
        keepalive,
        username,
        password,
        will,
        protocol_level,
        name,
        properties,
    )


def _decode_connack(buf: bytes, pos: int, end: int, flags: int, level: int) -> Connack:
    if level < 5 and end - pos != 2:
        raise _malformed(f"CONNACK remaining length must be 2, got {end - pos}")
    if end - pos < 2:
        raise _malformed("CONNACK is too short")
    ack_flags, code = buf[pos], buf[pos + 1]
    if ack_flags & 0xFE:
        raise MQTTProtocolError("connack-reserved-flags", "CONNACK flag bits 7-1 must be 0")
    properties: dict[int, Any] = {}
    if level >= 5:
        if end - pos > 2:
            properties, stop = decode_properties(buf, pos + 2, end)
            _check_end(stop, end, "CONNACK")
    elif code > 5:
        raise MQTTProtocolError("connack-return-code", f"CONNACK return code {code} is reserved")
    if code and ack_flags:
        raise MQTTProtocolError(
            "MQTT-3.2.2-4", "session present must be 0 with a non-zero return code"
        )
    return Connack(code, bool(ack_flags), properties)


def _decode_publish(buf: bytes, pos: int, end: int, flags: int, level: int) -> Publish:
    qos = (flags >> 1) & 3
    topic, pos = read_utf8(buf, pos, end)
    packet_id = None
    if qos:
        packet_id = _read_packet_id(buf, pos, end, "PUBLISH")
        pos += 2
    properties: dict[int, Any] = {}
    if level >= 5:
        properties, pos = decode_properties(buf, pos, end)
    if not topic:
        if level < 5 or PropertyId.TOPIC_ALIAS not in properties:
            raise MQTTProtocolError("MQTT-4.7.3-1", "PUBLISH topic name must not be empty")
    elif "+" in topic or "#" in topic:
        raise MQTTProtocolError("MQTT-3.3.2-2", "PUBLISH topic name must not contain wildcards")
    return Publish(
        topic,
        buf[pos:end],
        qos,
        bool(flags & 0x01),
        bool(flags & 0x08),
        packet_id,
        properties,
    )


_AckClass = type[Puback] | type[Pubrec] | type[Pubrel] | type[Pubcomp]


def _make_ack_decoder(
    cls: _AckClass, what: str
) -> Callable[[bytes, int, int, int, int], Puback | Pubrec | Pubrel | Pubcomp]:
    def decode(
        buf: bytes, pos: int, end: int, flags: int, level: int
    ) -> Puback | Pubrec | Pubrel | Pubcomp:
        size = end - pos
        if size != 2 and (level < 5 or size < 2):
            raise _malformed(f"{what} remaining length must be 2, got {size}")
        packet_id = _read_packet_id(buf, pos, end, what)
        if size == 2:
            return cls(packet_id)
        reason = buf[pos + 2]
        properties: dict[int, Any] = {}
        if size > 3:
            properties, stop = decode_properties(buf, pos + 3, end)
            _check_end(stop, end, what)
        return cls(packet_id, reason, properties)

    return decode


def _decode_subscribe(buf: bytes, pos: int, end: int, flags: int, level: int) -> Subscribe:
    packet_id = _read_packet_id(buf, pos, end, "SUBSCRIBE")
    pos += 2
    properties: dict[int, Any] = {}
    if level >= 5:
        properties, pos = decode_properties(buf, pos, end)
    if pos >= end:
        raise MQTTProtocolError("MQTT-3.8.3-3", "SUBSCRIBE must contain at least one filter")
    subscriptions = []
    while pos < end:
        topic_filter, pos = read_utf8(buf, pos, end)
        if not topic_filter:
            raise MQTTProtocolError("MQTT-4.7.3-1", "topic filter must not be empty")
        if pos >= end:
            raise _malformed("SUBSCRIBE filter without its requested QoS byte")
        options = buf[pos]
        pos += 1
        qos = options & 0x03
        if level >= 5:
            if options & 0xC0:
                raise MQTTProtocolError(
                    "MQTT-3.8.3-5", "reserved bits of subscription options must be 0"
                )
            if qos == 3:
                raise MQTTProtocolError("invalid-subscription-options", "maximum QoS must not be 3")
            retain_handling = (options >> 4) & 0x03
            if retain_handling == 3:
                raise MQTTProtocolError(
                    "invalid-subscription-options", "retain handling must not be 3"
                )
            subscriptions.append(
                Subscription(
                    topic_filter, qos, bool(options & 0x04), bool(options & 0x08), retain_handling
                )
            )
        else:
            if options & 0xFC or qos == 3:
                raise MQTTProtocolError(
                    "MQTT-3-8.3-4",
                    f"requested QoS byte 0x{options:02X} must have bits 7-2 zero and QoS <= 2",
                )
            subscriptions.append(Subscription(topic_filter, qos))
    return Subscribe(packet_id, subscriptions, properties)


def _decode_suback(buf: bytes, pos: int, end: int, flags: int, level: int) -> Suback:
    packet_id = _read_packet_id(buf, pos, end, "SUBACK")
    pos += 2
    properties: dict[int, Any] = {}
    if level >= 5:
        properties, pos = decode_properties(buf, pos, end)
    codes = list(buf[pos:end])
    if not codes:
        raise _malformed("SUBACK must contain at least one return code")
    allowed = _SUBACK_CODES_5 if level >= 5 else _SUBACK_CODES_311
    for code in codes:
        if code not in allowed:
            raise MQTTProtocolError("MQTT-3.9.3-2", f"SUBACK return code 0x{code:02X} is reserved")
    return Suback(packet_id, codes, properties)


def _decode_unsubscribe(buf: bytes, pos: int, end: int, flags: int, level: int) -> Unsubscribe:
    packet_id = _read_packet_id(buf, pos, end, "UNSUBSCRIBE")
    pos += 2
    properties: dict[int, Any] = {}
    if level >= 5:
        properties, pos = decode_properties(buf, pos, end)
    if pos >= end:
        raise MQTTProtocolError("MQTT-3.10.3-2", "UNSUBSCRIBE must contain at least one filter")
    filters = []
    while pos < end:
        topic_filter, pos = read_utf8(buf, pos, end)
        if not topic_filter:
            raise MQTTProtocolError("MQTT-4.7.3-1", "topic filter must not be empty")
        filters.append(topic_filter)
    return Unsubscribe(packet_id, filters, properties)


def _decode_unsuback(buf: bytes, pos: int, end: int, flags: int, level: int) -> Unsuback:
    if level < 5 and end - pos != 2:
        raise _malformed(f"UNSUBACK remaining length must be 2, got {end - pos}")
    packet_id = _read_packet_id(buf, pos, end, "UNSUBACK")
    if level < 5:
        return Unsuback(packet_id)
    properties, pos = decode_properties(buf, pos + 2, end)
    codes = list(buf[pos:end])
    for code in codes:
        if code not in _UNSUBACK_CODES_5:
            raise MQTTProtocolError(
                "invalid-reason-code", f"UNSUBACK reason code 0x{code:02X} is not defined"
            )
    return Unsuback(packet_id, codes, properties)


def _decode_pingreq(buf: bytes, pos: int, end: int, flags: int, level: int) -> Pingreq:
    if end != pos:
        raise _malformed(f"PINGREQ remaining length must be 0, got {end - pos}")
    return Pingreq()


def _decode_pingresp(buf: bytes, pos: int, end: int, flags: int, level: int) -> Pingresp:
    if end != pos:
        raise _malformed(f"PINGRESP remaining length must be 0, got {end - pos}")
    return Pingresp()


def _decode_disconnect(buf: bytes, pos: int, end: int, flags: int, level: int) -> Disconnect:
    if end == pos:
        return Disconnect()
    if level < 5:
        raise _malformed(f"DISCONNECT remaining length must be 0, got {end - pos}")
    reason = buf[pos]
    properties: dict[int, Any] = {}
    if end - pos > 1:
        properties, stop = decode_properties(buf, pos + 1, end)
        _check_end(stop, end, "DISCONNECT")
    return Disconnect(reason, properties)


def _decode_reserved(buf: bytes, pos: int, end: int, flags: int, level: int) -> Packet:
    raise MQTTProtocolError("invalid-packet-type", "reserved packet type")  # pragma: no cover


_BODY_DECODERS: Final[tuple[Callable[[bytes, int, int, int, int], Packet], ...]] = (
    _decode_reserved,
    _decode_connect,
    _decode_connack,
    _decode_publish,
    _make_ack_decoder(Puback, "PUBACK"),
    _make_ack_decoder(Pubrec, "PUBREC"),
    _make_ack_decoder(Pubrel, "PUBREL"),
    _make_ack_decoder(Pubcomp, "PUBCOMP"),
    _decode_subscribe,
    _decode_suback,
    _decode_unsubscribe,
    _decode_unsuback,
    _decode_pingreq,
    _decode_pingresp,
    _decode_disconnect,
    _decode_reserved,
)


# --- the incremental decoder -----------------------------------------------------------------


class Decoder:
    """Incremental MQTT decoder for one connection.

    `feed` bytes as they arrive, then call `packets` (all complete packets) or `next_packet`
    (one). `protocol_level` selects the 3.1.1 or 5.0 wire format; decoding a CONNECT with a
    supported (name, level) pair sets it. Any violation raises `MQTTProtocolError`; afterwards the
    decoder is dead and raises the same error again.

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
        "max_packet_size",
        "protocol_level",
    )

    def __init__(self, max_packet_size: int = MAX_PACKET_SIZE) -> None:
        self.max_packet_size = max_packet_size
        self.protocol_level: int = 4
        self._buf = b""
        self._pos = 0
        self._need = 0  # total size of the incomplete packet at _pos, if its header was read
        self._pending: list[bytes] = []
        self._pending_len = 0
        self._error: MQTTProtocolError | None = None

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Buffer `data` (bytes read from the connection). Never raises."""
        if type(data) is not bytes:
            data = bytes(data)
        if not data:
            return
        if self._need:
            self._pending.append(data)
            self._pending_len += len(data)
            if len(self._buf) - self._pos + self._pending_len < self._need:
                return
            data = b"".join(self._pending)
            self._pending = []
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
        bad = _FIRST_BYTE_BAD
        append = out.append
        try:
            while pos < n and limit:
                first = buf[pos]
                if bad[first]:
                    raise _first_byte_error(first)
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
                if first >> 4 == 3 and level < 5:
                    # PUBLISH, 3.1.1: the hot path, decoded inline.
                    if remaining < 2:
                        raise _malformed("PUBLISH too short for its topic length")
                    topic_end = start + 2 + ((buf[start] << 8) | buf[start + 1])
                    if topic_end > end:
                        raise _malformed("UTF-8 string runs past the end of the packet")
                    try:
                        topic = buf[start + 2 : topic_end].decode()
                    except UnicodeDecodeError:
                        raise MQTTProtocolError("MQTT-1.5.3-1", "ill-formed UTF-8 string") from None
                    if not topic:
                        raise MQTTProtocolError(
                            "MQTT-4.7.3-1", "PUBLISH topic name must not be empty"
                        )
                    if "\x00" in topic:
                        raise MQTTProtocolError("MQTT-1.5.3-2", "UTF-8 string contains U+0000")
                    if "+" in topic or "#" in topic:
                        raise MQTTProtocolError(
                            "MQTT-3.3.2-2", "PUBLISH topic name must not contain wildcards"
                        )
                    if first & 0x06:
                        if topic_end + 2 > end:
                            raise _malformed("PUBLISH is too short for a packet identifier")
                        packet_id = (buf[topic_end] << 8) | buf[topic_end + 1]
                        if not packet_id:
                            raise MQTTProtocolError(
                                "MQTT-2.3.1-1", "PUBLISH packet identifier must be non-zero"
                            )
                        append(
                            Publish(
                                topic,
                                buf[topic_end + 2 : end],
                                (first >> 1) & 3,
                                first & 1 == 1,
                                first & 8 == 8,
                                packet_id,
                                {},
                            )
                        )
                    else:
                        append(
                            Publish(topic, buf[topic_end:end], 0, first & 1 == 1, False, None, {})
                        )
                else:
                    packet = _BODY_DECODERS[first >> 4](buf, start, end, first & 0x0F, level)
                    if type(packet) is Connect and (
                        (packet.protocol_name, packet.protocol_level) in SUPPORTED_PROTOCOLS
                    ):
                        level = self.protocol_level = packet.protocol_level
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


# --- encoding --------------------------------------------------------------------------------


def _packet_id_bytes(packet_id: int | None, what: str) -> bytes:
    if packet_id is None or not 0 < packet_id <= 0xFFFF:
        raise MQTTProtocolError(
            "MQTT-2.3.1-1", f"{what} needs a packet identifier in 1..65535, got {packet_id!r}"
        )
    return _H.pack(packet_id)


def encode_publish(
    topic: str,
    payload: bytes,
    qos: int,
    retain: bool = False,
    dup: bool = False,
    packet_id: int | None = None,
    *,
    protocol_level: int = 4,
) -> bytes:
    """Encode a PUBLISH without building a `Publish`: the broker's hot path.

    The topic is not validated here (the broker only forwards topics it decoded or validated).
    With ``protocol_level >= 5`` an empty property block is written; use `encode` for properties.
    """
    encoded_topic = topic.encode()
    topic_len = len(encoded_topic)
    if topic_len > 0xFFFF:
        raise MQTTProtocolError(
            "MQTT-4.7.3-3", f"topic name of {topic_len} bytes exceeds 65535 bytes"
        )
    if qos == 0:
        if dup:
            raise MQTTProtocolError("MQTT-3.3.1-2", "DUP must be 0 in a QoS 0 PUBLISH")
        if packet_id is not None:
            raise MQTTProtocolError("MQTT-2.3.1-5", "a QoS 0 PUBLISH has no packet identifier")
        first = 0x31 if retain else 0x30
        if protocol_level < 5:
            remaining = topic_len + 2 + len(payload)
            if remaining < 0x80:
                return b"".join((_BBH.pack(first, remaining, topic_len), encoded_topic, payload))
            return b"".join((_header(first, remaining), _H.pack(topic_len), encoded_topic, payload))
        remaining = topic_len + 3 + len(payload)
        return b"".join(
            (_header(first, remaining), _H.pack(topic_len), encoded_topic, b"\x00", payload)
        )
    if qos != 1 and qos != 2:
        raise MQTTProtocolError("MQTT-3.3.1-4", f"PUBLISH QoS must be 0, 1 or 2, got {qos}")
    if packet_id is None or not 0 < packet_id <= 0xFFFF:
        raise MQTTProtocolError(
            "MQTT-2.3.1-1", f"PUBLISH needs a packet identifier in 1..65535, got {packet_id!r}"
        )
    first = 0x30 | (qos << 1) | (0x01 if retain else 0) | (0x08 if dup else 0)
    if protocol_level < 5:
        remaining = topic_len + 4 + len(payload)
        if remaining < 0x80:
            return b"".join(
                (_BBH.pack(first, remaining, topic_len), encoded_topic, _H.pack(packet_id), payload)
            )
        return b"".join(
            (
                _header(first, remaining),
                _H.pack(topic_len),
                encoded_topic,
                _H.pack(packet_id),
                payload,
            )
        )
    remaining = topic_len + 5 + len(payload)
    return b"".join(
        (
            _header(first, remaining),
            _H.pack(topic_len),
            encoded_topic,
            _H.pack(packet_id),
            b"\x00",
            payload,
        )
    )


def _ack_encoder(first: int, what: str) -> Callable[[int], bytes]:
    prefix = bytes((first, 2))

    def encode_ack(packet_id: int) -> bytes:
        if not 0 < packet_id <= 0xFFFF:
            raise MQTTProtocolError(
                "MQTT-2.3.1-1", f"{what} needs a packet identifier in 1..65535, got {packet_id!r}"
            )
        return prefix + _H.pack(packet_id)

    encode_ack.__name__ = f"encode_{what.lower()}"
    encode_ack.__qualname__ = encode_ack.__name__
    encode_ack.__doc__ = f"Encode a {what} (3.1.1 form, also valid 5.0 with reason code 0)."
    return encode_ack


encode_puback: Final = _ack_encoder(0x40, "PUBACK")
encode_pubrec: Final = _ack_encoder(0x50, "PUBREC")
encode_pubrel: Final = _ack_encoder(0x62, "PUBREL")
encode_pubcomp: Final = _ack_encoder(0x70, "PUBCOMP")


def _encode_connect(packet: Connect, level: int) -> bytes:
    layout = packet.protocol_level
    if not 0 <= layout <= 0xFF:
        raise MQTTProtocolError("invalid-protocol-level", f"protocol level {layout} not a byte")
    if not 0 <= packet.keepalive <= 0xFFFF:
        raise MQTTProtocolError("invalid-keepalive", f"keep alive {packet.keepalive} not 16-bit")
    cflags = 0x02 if packet.clean_session else 0
    will = packet.will
    if will is not None:
        if not 0 <= will.qos <= 2:
            raise MQTTProtocolError("MQTT-3.1.2-14", f"will QoS must be 0, 1 or 2, got {will.qos}")
        validate_topic_name(will.topic)
        cflags |= 0x04 | (will.qos << 3) | (0x20 if will.retain else 0)
    if packet.username is not None:
        cflags |= 0x80
    if packet.password is not None:
        if packet.username is None and layout < 5:
            raise MQTTProtocolError("MQTT-3.1.2-22", "a password needs a user name before MQTT 5.0")
        cflags |= 0x40
    parts = [
        encode_utf8(packet.protocol_name),
        bytes((layout, cflags)),
        _H.pack(packet.keepalive),
    ]
    if layout >= 5:
        parts.append(encode_properties(packet.properties))
    parts.append(encode_utf8(packet.client_id))
    if will is not None:
        if layout >= 5:
            parts.append(encode_properties(will.properties))
        parts.append(encode_utf8(will.topic))
        parts.append(encode_binary(will.payload))
    if packet.username is not None:
        parts.append(encode_utf8(packet.username))
    if packet.password is not None:
        parts.append(encode_binary(packet.password))
    return _frame(0x10, b"".join(parts))


def _encode_connack(packet: Connack, level: int) -> bytes:
    code = packet.return_code
    if not 0 <= code <= 0xFF or (level < 5 and code > 5):
        raise MQTTProtocolError("connack-return-code", f"CONNACK return code {code} is reserved")
    if code and packet.session_present:
        raise MQTTProtocolError(
            "MQTT-3.2.2-4", "session present must be 0 with a non-zero return code"
        )
    body = bytes((1 if packet.session_present else 0, code))
    if level >= 5:
        body += encode_properties(packet.properties)
    return _frame(0x20, body)


def _encode_publish_packet(packet: Publish, level: int) -> bytes:
    topic = packet.topic
    if level >= 5:
        if topic or PropertyId.TOPIC_ALIAS not in packet.properties:
            validate_topic_name(topic)
    else:
        validate_topic_name(topic)
    if level < 5 or not packet.properties:
        return encode_publish(
            topic,
            packet.payload,
            packet.qos,
            packet.retain,
            packet.dup,
            packet.packet_id,
            protocol_level=level,
        )
    qos = packet.qos
    if qos == 0:
        if packet.dup:
            raise MQTTProtocolError("MQTT-3.3.1-2", "DUP must be 0 in a QoS 0 PUBLISH")
        if packet.packet_id is not None:
            raise MQTTProtocolError("MQTT-2.3.1-5", "a QoS 0 PUBLISH has no packet identifier")
        packet_id = b""
    elif qos in (1, 2):
        packet_id = _packet_id_bytes(packet.packet_id, "PUBLISH")
    else:
        raise MQTTProtocolError("MQTT-3.3.1-4", f"PUBLISH QoS must be 0, 1 or 2, got {qos}")
    first = 0x30 | (qos << 1) | (0x01 if packet.retain else 0) | (0x08 if packet.dup else 0)
    body = b"".join(
        (encode_utf8(topic), packet_id, encode_properties(packet.properties), packet.payload)
    )
    return _frame(first, body)


def _encode_ack(first: int, what: str) -> Callable[[Any, int], bytes]:
    def encode_ack(packet: Any, level: int) -> bytes:
        packet_id = _packet_id_bytes(packet.packet_id, what)
        if level < 5 or (packet.reason_code == 0 and not packet.properties):
            return bytes((first, 2)) + packet_id
        if not 0 <= packet.reason_code <= 0xFF:
            raise MQTTProtocolError("invalid-reason-code", f"reason code {packet.reason_code}")
        body = packet_id + bytes((packet.reason_code,))
        if packet.properties:
            body += encode_properties(packet.properties)
        return _frame(first, body)

    return encode_ack


def _encode_subscribe(packet: Subscribe, level: int) -> bytes:
    if not packet.subscriptions:
        raise MQTTProtocolError("MQTT-3.8.3-3", "SUBSCRIBE must contain at least one filter")
    parts = [_packet_id_bytes(packet.packet_id, "SUBSCRIBE")]
    if level >= 5:
        parts.append(encode_properties(packet.properties))
    for sub in packet.subscriptions:
        if not sub.topic_filter:
            raise MQTTProtocolError("MQTT-4.7.3-1", "topic filter must not be empty")
        if not 0 <= sub.qos <= 2:
            raise MQTTProtocolError("MQTT-3-8.3-4", f"requested QoS must be 0..2, got {sub.qos}")
        options = sub.qos
        if level >= 5:
            if not 0 <= sub.retain_handling <= 2:
                raise MQTTProtocolError(
                    "invalid-subscription-options",
                    f"retain handling must be 0..2, got {sub.retain_handling}",
                )
            options |= (
                (0x04 if sub.no_local else 0)
                | (0x08 if sub.retain_as_published else 0)
                | (sub.retain_handling << 4)
            )
        parts.append(encode_utf8(sub.topic_filter))
        parts.append(bytes((options,)))
    return _frame(0x82, b"".join(parts))


def _encode_suback(packet: Suback, level: int) -> bytes:
    if not packet.return_codes:
        raise _malformed("SUBACK must contain at least one return code")
    allowed = _SUBACK_CODES_5 if level >= 5 else _SUBACK_CODES_311
    for code in packet.return_codes:
        if code not in allowed:
            raise MQTTProtocolError("MQTT-3.9.3-2", f"SUBACK return code {code!r} is reserved")
    parts = [_packet_id_bytes(packet.packet_id, "SUBACK")]
    if level >= 5:
        parts.append(encode_properties(packet.properties))
    parts.append(bytes(packet.return_codes))
    return _frame(0x90, b"".join(parts))


def _encode_unsubscribe(packet: Unsubscribe, level: int) -> bytes:
    if not packet.topic_filters:
        raise MQTTProtocolError("MQTT-3.10.3-2", "UNSUBSCRIBE must contain at least one filter")
    parts = [_packet_id_bytes(packet.packet_id, "UNSUBSCRIBE")]
    if level >= 5:
        parts.append(encode_properties(packet.properties))
    for topic_filter in packet.topic_filters:
        if not topic_filter:
            raise MQTTProtocolError("MQTT-4.7.3-1", "topic filter must not be empty")
        parts.append(encode_utf8(topic_filter))
    return _frame(0xA2, b"".join(parts))


def _encode_unsuback(packet: Unsuback, level: int) -> bytes:
    packet_id = _packet_id_bytes(packet.packet_id, "UNSUBACK")
    if level < 5:
        return b"\xb0\x02" + packet_id
    for code in packet.reason_codes:
        if code not in _UNSUBACK_CODES_5:
            raise MQTTProtocolError(
                "invalid-reason-code", f"UNSUBACK reason code {code!r} is not defined"
            )
    body = packet_id + encode_properties(packet.properties) + bytes(packet.reason_codes)
    return _frame(0xB0, body)


def _encode_pingreq(packet: Pingreq, level: int) -> bytes:
    return b"\xc0\x00"


def _encode_pingresp(packet: Pingresp, level: int) -> bytes:
    return b"\xd0\x00"


def _encode_disconnect(packet: Disconnect, level: int) -> bytes:
    if level < 5 or (packet.reason_code == 0 and not packet.properties):
        return b"\xe0\x00"
    if not 0 <= packet.reason_code <= 0xFF:
        raise MQTTProtocolError("invalid-reason-code", f"reason code {packet.reason_code}")
    body = bytes((packet.reason_code,))
    if packet.properties:
        body += encode_properties(packet.properties)
    return _frame(0xE0, body)


_ENCODERS: Final[dict[type, Callable[[Any, int], bytes]]] = {
    Connect: _encode_connect,
    Connack: _encode_connack,
    Publish: _encode_publish_packet,
    Puback: _encode_ack(0x40, "PUBACK"),
    Pubrec: _encode_ack(0x50, "PUBREC"),
    Pubrel: _encode_ack(0x62, "PUBREL"),
    Pubcomp: _encode_ack(0x70, "PUBCOMP"),
    Subscribe: _encode_subscribe,
    Suback: _encode_suback,
    Unsubscribe: _encode_unsubscribe,
    Unsuback: _encode_unsuback,
    Pingreq: _encode_pingreq,
    Pingresp: _encode_pingresp,
    Disconnect: _encode_disconnect,
}


def encode(packet: Packet, protocol_level: int = 4) -> bytes:
    """Encode any packet for a connection speaking `protocol_level` (3/4: MQTT 3.x, 5: MQTT 5.0).

    A `Connect` is encoded for its own ``protocol_level`` field. Below level 5 the 5.0-only fields
    (properties, non-CONNACK reason codes) are not written. Packets that cannot be encoded
    validly raise `MQTTProtocolError`.
    """
    encoder = _ENCODERS.get(type(packet))
    if encoder is None:
        raise TypeError(f"not an MQTT packet: {packet!r}")
    return encoder(packet, protocol_level)
