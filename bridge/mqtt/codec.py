"""Sans-IO MQTT codec: packets to bytes (`encode`, `encode_publish`) and bytes to packets
(`Decoder`).

MQTT 3.1.1 (protocol level 4) and 3.1 (level 3, same wire format) are validated strictly; every
violation raises `MQTTProtocolError` naming the rule. With ``protocol_level >= 5`` the MQTT 5.0
property blocks and reason codes are read and written where 5.0 places them; 5.0-specific
validation beyond the wire format is not done yet.

Nothing here does I/O. The broker feeds what it reads from a socket into a `Decoder` and calls
`Decoder.packets()` once per read; it writes what `encode` / `encode_publish` return.

The implementation is split by direction: `bridge.mqtt.decoder` (framing and the incremental
`Decoder`), `bridge.mqtt.body_decoders` (one decoder per packet body), `bridge.mqtt.encoder`
(`encode` and the fast paths) and `bridge.mqtt.wire` (limits and reason-code sets both share).
This module is the stable public interface: import from here, not from those modules.
"""

from __future__ import annotations

from bridge.mqtt.decoder import Decoder
from bridge.mqtt.encoder import (
    encode,
    encode_puback,
    encode_pubcomp,
    encode_publish,
    encode_pubrec,
    encode_pubrel,
)
from bridge.mqtt.wire import MAX_PACKET_SIZE, SUPPORTED_PROTOCOLS

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
