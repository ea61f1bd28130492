"""Wire-format facts shared by the MQTT encoder and decoder (no I/O, no packet logic).

The size limit, the protocol versions spoken, the reason codes each 5.0 packet may carry and the
"malformed packet" / "protocol error" errors live here so the encoders and the decoding modules
agree on them without importing each other. Varints, UTF-8 strings and property blocks are in
`bridge.mqtt.properties`; which property may appear where in `bridge.mqtt.property_rules`.
"""

from __future__ import annotations

from typing import Final

from bridge.mqtt.errors import MQTTProtocolError
from bridge.mqtt.packets import SUBACK_FAILURE, PacketType
from bridge.mqtt.reasons import ReasonCode

MAX_PACKET_SIZE: Final = 268_435_460
"""The largest packet MQTT can frame: 1 type byte + 4 length bytes + 268,435,455."""

SUPPORTED_PROTOCOLS: Final = frozenset({("MQIsdp", 3), ("MQTT", 4), ("MQTT", 5)})
"""(protocol name, protocol level) pairs this codec speaks. A CONNECT with a known name but a
pair outside this set still decodes; the broker answers it with CONNACK 0x01 (MQTT-3.1.2-2)."""

SUBACK_CODES_311: Final = frozenset({0x00, 0x01, 0x02, SUBACK_FAILURE})
"""The SUBACK return codes MQTT 3.1.1 defines."""

SUBACK_CODES_5: Final = frozenset(
    {0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2}
)
"""The SUBACK reason codes MQTT 5.0 defines."""

UNSUBACK_CODES_5: Final = frozenset({0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91})
"""The UNSUBACK reason codes MQTT 5.0 defines (3.1.1 UNSUBACKs carry none)."""

CONNACK_CODES_5: Final = frozenset(
    {0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C, 0x90, 0x95}
    | {0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F}
)
"""The CONNACK reason codes MQTT 5.0 defines (section 3.2.2.2)."""

PUBLISH_ACK_CODES_5: Final = frozenset({0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99})
"""The PUBACK and PUBREC reason codes MQTT 5.0 defines (sections 3.4.2.1, 3.5.2.1)."""

RELEASE_ACK_CODES_5: Final = frozenset({0x00, 0x92})
"""The PUBREL and PUBCOMP reason codes MQTT 5.0 defines (sections 3.6.2.1, 3.7.2.1)."""

DISCONNECT_CODES_5: Final = frozenset(
    {0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90, 0x93, 0x94}
    | {0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F, 0xA0, 0xA1, 0xA2}
)
"""The DISCONNECT reason codes MQTT 5.0 defines (section 3.14.2.1)."""

AUTH_CODES_5: Final = frozenset({0x00, 0x18, 0x19})
"""The AUTH reason codes MQTT 5.0 defines (section 3.15.2.1)."""

REASON_CODES_5: Final[dict[int, frozenset[int]]] = {
    PacketType.CONNACK: CONNACK_CODES_5,
    PacketType.PUBACK: PUBLISH_ACK_CODES_5,
    PacketType.PUBREC: PUBLISH_ACK_CODES_5,
    PacketType.PUBREL: RELEASE_ACK_CODES_5,
    PacketType.PUBCOMP: RELEASE_ACK_CODES_5,
    PacketType.SUBACK: SUBACK_CODES_5,
    PacketType.UNSUBACK: UNSUBACK_CODES_5,
    PacketType.DISCONNECT: DISCONNECT_CODES_5,
    PacketType.AUTH: AUTH_CODES_5,
}
"""The reason codes each MQTT 5.0 packet type may carry, by packet type."""


def malformed(message: str) -> MQTTProtocolError:
    """The error for a packet whose bytes break the wire format (rule "malformed-packet")."""
    return MQTTProtocolError("malformed-packet", message)


def protocol_error(rule: str, message: str) -> MQTTProtocolError:
    """The error for a violation MQTT 5.0 calls a Protocol Error (reason code 0x82)."""
    return MQTTProtocolError(rule, message, reason_code=ReasonCode.PROTOCOL_ERROR)


def check_reason_code(packet_type: int, code: int, what: str) -> None:
    """Raise a Protocol Error unless `code` is a 5.0 reason code `packet_type` may carry."""
    if code not in REASON_CODES_5[packet_type]:
        raise protocol_error("invalid-reason-code", f"{what} reason code {code!r} is not defined")
