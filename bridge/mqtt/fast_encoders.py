"""Encoders that build the packets the broker sends most without a packet object: the hot path.

MQTT 3.1.1: `encode_publish` and the acknowledgements `encode_puback`, `encode_pubrec`,
`encode_pubrel`, `encode_pubcomp` (the 2-byte body every version accepts). MQTT 5.0:
`encode_publish5`, which takes its property block already encoded (`encode_property_block_content`)
so a message going to many subscribers encodes its properties once; `encode_ack5` and
`encode_disconnect5`, which use the short forms the specification allows (no reason code when it
is 0 and there are no properties, no property length when there are no properties).

They validate what the wire format needs (QoS, DUP, packet identifiers, reason codes, the
properties an ack or DISCONNECT may carry) and raise `MQTTProtocolError` otherwise; topics are
not validated (the broker only forwards topics it decoded or validated). `bridge.mqtt.encoder`
routes `encode` of the same packets here, so each form is written once. Import them through
`bridge.mqtt.codec`, the public facade.
"""

from __future__ import annotations

from struct import Struct
from typing import Any, Final

from bridge.mqtt.errors import MQTTProtocolError, PacketTooLarge
from bridge.mqtt.packets import PacketType
from bridge.mqtt.properties import MAX_VARINT, encode_properties, encode_varint
from bridge.mqtt.property_rules import check_properties
from bridge.mqtt.wire import MAX_PACKET_SIZE, check_reason_code

__all__ = [
    "PACKET_FIRST_BYTES",
    "encode_ack5",
    "encode_disconnect5",
    "encode_puback",
    "encode_pubcomp",
    "encode_publish",
    "encode_publish5",
    "encode_pubrec",
    "encode_pubrel",
    "fixed_header",
    "frame",
    "packet_id_bytes",
]

_BBH = Struct(">BBH")
_BBHB = Struct(">BBHB")
_H = Struct(">H")
_ONE_BYTE: Final = tuple(bytes((value,)) for value in range(0x80))


def _bbh(first: int, remaining: int, topic_len: int) -> bytes:
    """A PUBLISH's first 4 bytes when its remaining length fits one byte: first byte,
    remaining length, topic length (`int.to_bytes` needs no call into `struct` once compiled)."""
    return ((first << 24) | (remaining << 16) | topic_len).to_bytes(4, "big")


# --- fixed header and packet identifier -------------------------------------------------------


def fixed_header(first: int, remaining: int) -> bytes:
    """The fixed header: `first` byte, then the remaining length as a Variable Byte Integer."""
    if remaining < 0x80:
        return bytes((first, remaining))
    if remaining > MAX_VARINT:
        raise PacketTooLarge(1 + 4 + remaining, MAX_PACKET_SIZE)
    return bytes((first,)) + encode_varint(remaining)


def frame(first: int, body: bytes) -> bytes:
    """A whole packet: fixed header, then `body`."""
    return fixed_header(first, len(body)) + body


def packet_id_bytes(packet_id: int | None, what: str) -> bytes:
    """A packet identifier as 2 bytes; raises MQTT-2.3.1-1 unless it is in 1..65535."""
    if packet_id is None or not 0 < packet_id <= 0xFFFF:
        raise MQTTProtocolError(
            "MQTT-2.3.1-1", f"{what} needs a packet identifier in 1..65535, got {packet_id!r}"
        )
    return packet_id.to_bytes(2, "big")


# --- MQTT 3.1.1 ------------------------------------------------------------------------------


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
    With ``protocol_level >= 5`` an empty property block is written; `encode_publish5` takes
    properties.
    """
    if protocol_level >= 5:
        return encode_publish5(topic, payload, qos, retain, dup, packet_id)
    encoded_topic, first = _publish_head(topic, qos, retain, dup, packet_id)
    topic_len = len(encoded_topic)
    if qos == 0:
        remaining = topic_len + 2 + len(payload)
        if remaining < 0x80:
            return b"".join((_bbh(first, remaining, topic_len), encoded_topic, payload))
        return b"".join(
            (fixed_header(first, remaining), topic_len.to_bytes(2, "big"), encoded_topic, payload)
        )
    assert packet_id is not None  # checked by _publish_head
    remaining = topic_len + 4 + len(payload)
    if remaining < 0x80:
        return b"".join(
            (
                _bbh(first, remaining, topic_len),
                encoded_topic,
                packet_id.to_bytes(2, "big"),
                payload,
            )
        )
    return b"".join(
        (
            fixed_header(first, remaining),
            topic_len.to_bytes(2, "big"),
            encoded_topic,
            packet_id.to_bytes(2, "big"),
            payload,
        )
    )


def _publish_head(
    topic: str, qos: int, retain: bool, dup: bool, packet_id: int | None
) -> tuple[bytes, int]:
    """The encoded topic and the first byte of a PUBLISH, once its fields are checked."""
    encoded_topic = topic.encode()
    if len(encoded_topic) > 0xFFFF:
        raise MQTTProtocolError(
            "MQTT-4.7.3-3", f"topic name of {len(encoded_topic)} bytes exceeds 65535 bytes"
        )
    if qos == 0:
        if dup:
            raise MQTTProtocolError("MQTT-3.3.1-2", "DUP must be 0 in a QoS 0 PUBLISH")
        if packet_id is not None:
            raise MQTTProtocolError("MQTT-2.3.1-5", "a QoS 0 PUBLISH has no packet identifier")
        return encoded_topic, 0x31 if retain else 0x30
    if qos != 1 and qos != 2:
        raise MQTTProtocolError("MQTT-3.3.1-4", f"PUBLISH QoS must be 0, 1 or 2, got {qos}")
    if packet_id is None or not 0 < packet_id <= 0xFFFF:
        raise MQTTProtocolError(
            "MQTT-2.3.1-1", f"PUBLISH needs a packet identifier in 1..65535, got {packet_id!r}"
        )
    return encoded_topic, 0x30 | (qos << 1) | (0x01 if retain else 0) | (0x08 if dup else 0)


def _ack(first: int, packet_id: int, what: str) -> bytes:
    """An acknowledgement with a 2-byte body: `first`, remaining length 2, the packet id."""
    if not 0 < packet_id <= 0xFFFF:
        raise MQTTProtocolError(
            "MQTT-2.3.1-1", f"{what} needs a packet identifier in 1..65535, got {packet_id!r}"
        )
    return ((first << 24) | 0x020000 | packet_id).to_bytes(4, "big")


def encode_puback(packet_id: int) -> bytes:
    """Encode a PUBACK (3.1.1 form, also valid 5.0 with reason code 0)."""
    return _ack(0x40, packet_id, "PUBACK")


def encode_pubrec(packet_id: int) -> bytes:
    """Encode a PUBREC (3.1.1 form, also valid 5.0 with reason code 0)."""
    return _ack(0x50, packet_id, "PUBREC")


def encode_pubrel(packet_id: int) -> bytes:
    """Encode a PUBREL (3.1.1 form, also valid 5.0 with reason code 0)."""
    return _ack(0x62, packet_id, "PUBREL")


def encode_pubcomp(packet_id: int) -> bytes:
    """Encode a PUBCOMP (3.1.1 form, also valid 5.0 with reason code 0)."""
    return _ack(0x70, packet_id, "PUBCOMP")


# --- MQTT 5.0 --------------------------------------------------------------------------------


def encode_publish5(
    topic: str,
    payload: bytes,
    qos: int,
    retain: bool,
    dup: bool,
    packet_id: int | None,
    properties: bytes = b"",
) -> bytes:
    """Encode an MQTT 5.0 PUBLISH without building a `Publish`: the broker's 5.0 hot path.

    `properties` is the content of the property block, without its length (what
    `encode_property_block_content` returns; b"" for none), encoded once by the caller and not
    checked here. The topic is not validated and may be empty when the properties carry a Topic
    Alias.
    """
    encoded_topic, first = _publish_head(topic, qos, retain, dup, packet_id)
    topic_len = len(encoded_topic)
    props_len = len(properties)
    props_header = _ONE_BYTE[props_len] if props_len < 0x80 else encode_varint(props_len)
    if qos == 0:
        remaining = topic_len + 2 + len(props_header) + props_len + len(payload)
        if remaining < 0x80:
            start = _bbh(first, remaining, topic_len)
        else:
            start = fixed_header(first, remaining) + topic_len.to_bytes(2, "big")
        return b"".join((start, encoded_topic, props_header, properties, payload))
    assert packet_id is not None  # checked by _publish_head
    remaining = topic_len + 4 + len(props_header) + props_len + len(payload)
    if remaining < 0x80:
        start = _bbh(first, remaining, topic_len)
    else:
        start = fixed_header(first, remaining) + topic_len.to_bytes(2, "big")
    return b"".join(
        (start, encoded_topic, packet_id.to_bytes(2, "big"), props_header, properties, payload)
    )


PACKET_FIRST_BYTES: Final[dict[int, int]] = {
    PacketType.PUBACK: 0x40,
    PacketType.PUBREC: 0x50,
    PacketType.PUBREL: 0x62,
    PacketType.PUBCOMP: 0x70,
}
"""The first byte of each acknowledgement (type and its fixed flags), by packet type."""


def encode_ack5(
    packet_type: int,
    packet_id: int,
    reason_code: int = 0,
    properties: dict[int, Any] | None = None,
) -> bytes:
    """Encode an MQTT 5.0 PUBACK, PUBREC, PUBREL or PUBCOMP (`packet_type` 4..7) in its shortest
    form: a 2-byte body for reason code 0 without properties, 3 bytes for a reason code alone.

    The reason code must be one the packet type defines and the properties ones it allows
    (Reason String, User Property); `ValueError` if `packet_type` is not an acknowledgement.
    """
    first = PACKET_FIRST_BYTES.get(packet_type)
    if first is None:
        raise ValueError(f"packet type {packet_type!r} is not PUBACK, PUBREC, PUBREL or PUBCOMP")
    if not 0 < packet_id <= 0xFFFF:
        what = PacketType(packet_type).name
        raise MQTTProtocolError(
            "MQTT-2.3.1-1", f"{what} needs a packet identifier in 1..65535, got {packet_id!r}"
        )
    if not properties:
        if reason_code == 0:
            return _BBH.pack(first, 2, packet_id)
        check_reason_code(packet_type, reason_code, PacketType(packet_type).name)
        return _BBHB.pack(first, 3, packet_id, reason_code)
    check_reason_code(packet_type, reason_code, PacketType(packet_type).name)
    check_properties(properties, packet_type)
    body = b"".join((_H.pack(packet_id), bytes((reason_code,)), encode_properties(properties)))
    return frame(first, body)


def encode_disconnect5(reason_code: int = 0, properties: dict[int, Any] | None = None) -> bytes:
    """Encode an MQTT 5.0 DISCONNECT in its shortest form: an empty body for reason code 0 without
    properties, the reason code alone without properties."""
    if not properties:
        if reason_code == 0:
            return b"\xe0\x00"
        check_reason_code(PacketType.DISCONNECT, reason_code, "DISCONNECT")
        return bytes((0xE0, 1, reason_code))
    check_reason_code(PacketType.DISCONNECT, reason_code, "DISCONNECT")
    check_properties(properties, PacketType.DISCONNECT)
    return frame(0xE0, bytes((reason_code,)) + encode_properties(properties))
