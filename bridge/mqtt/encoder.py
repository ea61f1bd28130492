"""The MQTT encoder: packets to bytes (`encode`) and the allocation-free fast paths the broker
uses for the packets it sends most (`encode_publish`, `encode_puback` and the other QoS acks).

Encoding validates what the wire format needs (packet identifiers, QoS, reason codes, topic
names in `encode`) and raises `MQTTProtocolError` otherwise. Import it through
`bridge.mqtt.codec`, the public facade.
"""

from __future__ import annotations

from collections.abc import Callable
from struct import Struct
from typing import Any, Final

from bridge.mqtt.errors import MQTTProtocolError, PacketTooLarge
from bridge.mqtt.packets import (
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
    Unsuback,
    Unsubscribe,
)
from bridge.mqtt.properties import (
    MAX_VARINT,
    PropertyId,
    encode_binary,
    encode_properties,
    encode_utf8,
    encode_varint,
)
from bridge.mqtt.topics import validate_topic_name
from bridge.mqtt.wire import (
    MAX_PACKET_SIZE,
    SUBACK_CODES_5,
    SUBACK_CODES_311,
    UNSUBACK_CODES_5,
    malformed,
)

__all__ = [
    "encode",
    "encode_puback",
    "encode_pubcomp",
    "encode_publish",
    "encode_pubrec",
    "encode_pubrel",
]

_BBH = Struct(">BBH")
_H = Struct(">H")


# --- fixed header ----------------------------------------------------------------------------


def _header(first: int, remaining: int) -> bytes:
    if remaining < 0x80:
        return bytes((first, remaining))
    if remaining > MAX_VARINT:
        raise PacketTooLarge(1 + 4 + remaining, MAX_PACKET_SIZE)
    return bytes((first,)) + encode_varint(remaining)


def _frame(first: int, body: bytes) -> bytes:
    return _header(first, len(body)) + body


# --- packets ---------------------------------------------------------------------------------


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
        raise malformed("SUBACK must contain at least one return code")
    allowed = SUBACK_CODES_5 if level >= 5 else SUBACK_CODES_311
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
        if code not in UNSUBACK_CODES_5:
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
