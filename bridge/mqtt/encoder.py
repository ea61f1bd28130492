"""The MQTT encoder: packet objects to bytes (`encode`).

Encoding validates what the wire format needs (packet identifiers, QoS, topic names) and, for
MQTT 5.0, the reason codes each packet defines and the properties it allows (the same rules the
decoder applies, from `bridge.mqtt.property_rules`), and raises `MQTTProtocolError` otherwise, so
the server never writes what it would refuse to read. PUBLISH, the acknowledgements and
DISCONNECT go through the fast paths of `bridge.mqtt.fast_encoders`, which this module re-exports.
Import it through `bridge.mqtt.codec`, the public facade.
"""

from __future__ import annotations

from collections.abc import Callable
from struct import Struct
from typing import Any, Final

from bridge.mqtt.errors import MQTTProtocolError
from bridge.mqtt.fast_encoders import (
    PACKET_FIRST_BYTES,
    encode_ack5,
    encode_disconnect5,
    encode_puback,
    encode_pubcomp,
    encode_publish,
    encode_publish5,
    encode_pubrec,
    encode_pubrel,
    frame,
    packet_id_bytes,
)
from bridge.mqtt.packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    PacketType,
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
    PropertyId,
    encode_binary,
    encode_properties,
    encode_property_block_content,
    encode_utf8,
)
from bridge.mqtt.property_rules import WILL, check_properties
from bridge.mqtt.topics import SHARE_PREFIX, validate_topic_name
from bridge.mqtt.wire import (
    SUBACK_CODES_5,
    SUBACK_CODES_311,
    check_reason_code,
    malformed,
    protocol_error,
)

__all__ = [
    "encode",
    "encode_ack5",
    "encode_disconnect5",
    "encode_puback",
    "encode_pubcomp",
    "encode_publish",
    "encode_publish5",
    "encode_pubrec",
    "encode_pubrel",
]

_T = PacketType

_H = Struct(">H")


# --- packets ---------------------------------------------------------------------------------


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
        check_properties(packet.properties, _T.CONNECT)
        parts.append(encode_properties(packet.properties))
    parts.append(encode_utf8(packet.client_id))
    if will is not None:
        if layout >= 5:
            check_properties(will.properties, WILL)
            parts.append(encode_properties(will.properties))
        parts.append(encode_utf8(will.topic))
        parts.append(encode_binary(will.payload))
    if packet.username is not None:
        parts.append(encode_utf8(packet.username))
    if packet.password is not None:
        parts.append(encode_binary(packet.password))
    return frame(0x10, b"".join(parts))


def _encode_connack(packet: Connack, level: int) -> bytes:
    code = packet.return_code
    if level >= 5:
        check_reason_code(_T.CONNACK, code, "CONNACK")
    elif not 0 <= code <= 5:
        raise MQTTProtocolError("connack-return-code", f"CONNACK return code {code} is reserved")
    if code and packet.session_present:
        raise MQTTProtocolError(
            "MQTT-3.2.2-4", "session present must be 0 with a non-zero return code"
        )
    body = bytes((1 if packet.session_present else 0, code))
    if level >= 5:
        check_properties(packet.properties, _T.CONNACK)
        body += encode_properties(packet.properties)
    return frame(0x20, body)


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
    check_properties(packet.properties, _T.PUBLISH)
    return encode_publish5(
        topic,
        packet.payload,
        packet.qos,
        packet.retain,
        packet.dup,
        packet.packet_id,
        encode_property_block_content(packet.properties),
    )


def _encode_ack(packet_type: int, what: str) -> Callable[[Any, int], bytes]:
    first = bytes((PACKET_FIRST_BYTES[packet_type], 2))

    def encode_ack(packet: Any, level: int) -> bytes:
        if level >= 5:
            return encode_ack5(packet_type, packet.packet_id, packet.reason_code, packet.properties)
        return first + packet_id_bytes(packet.packet_id, what)

    return encode_ack


def _encode_subscribe(packet: Subscribe, level: int) -> bytes:
    if not packet.subscriptions:
        raise protocol_error("MQTT-3.8.3-3", "SUBSCRIBE must contain at least one filter")
    parts = [packet_id_bytes(packet.packet_id, "SUBSCRIBE")]
    if level >= 5:
        check_properties(packet.properties, _T.SUBSCRIBE)
        parts.append(encode_properties(packet.properties))
    for sub in packet.subscriptions:
        if not sub.topic_filter:
            raise MQTTProtocolError("MQTT-4.7.3-1", "topic filter must not be empty")
        if not 0 <= sub.qos <= 2:
            raise MQTTProtocolError("MQTT-3-8.3-4", f"requested QoS must be 0..2, got {sub.qos}")
        options = sub.qos
        if level >= 5:
            if not 0 <= sub.retain_handling <= 2:
                raise protocol_error(
                    "invalid-subscription-options",
                    f"retain handling must be 0..2, got {sub.retain_handling}",
                )
            if sub.no_local and sub.topic_filter.startswith(SHARE_PREFIX):
                raise protocol_error(
                    "MQTT-3.8.3-4", "No Local must not be set on a shared subscription"
                )
            options |= (
                (0x04 if sub.no_local else 0)
                | (0x08 if sub.retain_as_published else 0)
                | (sub.retain_handling << 4)
            )
        parts.append(encode_utf8(sub.topic_filter))
        parts.append(bytes((options,)))
    return frame(0x82, b"".join(parts))


def _encode_suback(packet: Suback, level: int) -> bytes:
    if not packet.return_codes:
        raise malformed("SUBACK must contain at least one return code")
    allowed = SUBACK_CODES_5 if level >= 5 else SUBACK_CODES_311
    for code in packet.return_codes:
        if code not in allowed:
            raise protocol_error("MQTT-3.9.3-2", f"SUBACK return code {code!r} is reserved")
    parts = [packet_id_bytes(packet.packet_id, "SUBACK")]
    if level >= 5:
        check_properties(packet.properties, _T.SUBACK)
        parts.append(encode_properties(packet.properties))
    parts.append(bytes(packet.return_codes))
    return frame(0x90, b"".join(parts))


def _encode_unsubscribe(packet: Unsubscribe, level: int) -> bytes:
    if not packet.topic_filters:
        raise protocol_error("MQTT-3.10.3-2", "UNSUBSCRIBE must contain at least one filter")
    parts = [packet_id_bytes(packet.packet_id, "UNSUBSCRIBE")]
    if level >= 5:
        check_properties(packet.properties, _T.UNSUBSCRIBE)
        parts.append(encode_properties(packet.properties))
    for topic_filter in packet.topic_filters:
        if not topic_filter:
            raise MQTTProtocolError("MQTT-4.7.3-1", "topic filter must not be empty")
        parts.append(encode_utf8(topic_filter))
    return frame(0xA2, b"".join(parts))


def _encode_unsuback(packet: Unsuback, level: int) -> bytes:
    packet_id = packet_id_bytes(packet.packet_id, "UNSUBACK")
    if level < 5:
        return b"\xb0\x02" + packet_id
    for code in packet.reason_codes:
        check_reason_code(_T.UNSUBACK, code, "UNSUBACK")
    check_properties(packet.properties, _T.UNSUBACK)
    body = packet_id + encode_properties(packet.properties) + bytes(packet.reason_codes)
    return frame(0xB0, body)


def _encode_pingreq(packet: Pingreq, level: int) -> bytes:
    return b"\xc0\x00"


def _encode_pingresp(packet: Pingresp, level: int) -> bytes:
    return b"\xd0\x00"


def _encode_disconnect(packet: Disconnect, level: int) -> bytes:
    if level < 5:
        return b"\xe0\x00"
    return encode_disconnect5(packet.reason_code, packet.properties)


def _encode_auth(packet: Auth, level: int) -> bytes:
    if level < 5:
        raise MQTTProtocolError("invalid-packet-type", "AUTH exists only in MQTT 5.0")
    if packet.reason_code == 0 and not packet.properties:
        return b"\xf0\x00"  # the short form
    check_reason_code(_T.AUTH, packet.reason_code, "AUTH")
    check_properties(packet.properties, _T.AUTH)
    return frame(0xF0, bytes((packet.reason_code,)) + encode_properties(packet.properties))


_ENCODERS: Final[dict[type, Callable[[Any, int], bytes]]] = {
    Connect: _encode_connect,
    Connack: _encode_connack,
    Publish: _encode_publish_packet,
    Puback: _encode_ack(_T.PUBACK, "PUBACK"),
    Pubrec: _encode_ack(_T.PUBREC, "PUBREC"),
    Pubrel: _encode_ack(_T.PUBREL, "PUBREL"),
    Pubcomp: _encode_ack(_T.PUBCOMP, "PUBCOMP"),
    Subscribe: _encode_subscribe,
    Suback: _encode_suback,
    Unsubscribe: _encode_unsubscribe,
    Unsuback: _encode_unsuback,
    Pingreq: _encode_pingreq,
    Pingresp: _encode_pingresp,
    Disconnect: _encode_disconnect,
    Auth: _encode_auth,
}


def encode(packet: Packet, protocol_level: int = 4) -> bytes:
    """Encode any packet for a connection speaking `protocol_level` (3/4: MQTT 3.x, 5: MQTT 5.0).

    A `Connect` is encoded for its own ``protocol_level`` field. Below level 5 the 5.0-only fields
    (properties, non-CONNACK reason codes) are not written and `Auth` cannot be encoded. At 5.0
    the shortest form is written (an ack or DISCONNECT without reason code when it is 0 and
    there are no properties, an AUTH of Success without properties as an empty body). Packets
    that cannot be encoded validly raise `MQTTProtocolError`.
    """
    encoder = _ENCODERS.get(type(packet))
    if encoder is None:
        raise TypeError(f"not an MQTT packet: {packet!r}")
    return encoder(packet, protocol_level)
