"""Wire-format facts shared by the MQTT encoder and decoder (no I/O, no packet logic).

The size limit, the protocol versions spoken, the reason codes each acknowledgement may carry and
the "malformed packet" error live here so `bridge.mqtt.encoder` and the decoding modules agree
on them without importing each other. Varints and UTF-8 strings are in `bridge.mqtt.properties`.
"""

from __future__ import annotations

from typing import Final

from bridge.mqtt.errors import MQTTProtocolError
from bridge.mqtt.packets import SUBACK_FAILURE

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


def malformed(message: str) -> MQTTProtocolError:
    """The error for a packet whose bytes break the wire format (rule "malformed-packet")."""
    return MQTTProtocolError("malformed-packet", message)
