"""Sans-IO MQTT codec: packets to bytes (`encode` and the fast paths) and bytes to packets
(`Decoder`).

MQTT 3.1.1 (protocol level 4) and 3.1 (level 3, same wire format) are validated strictly; every
violation raises `MQTTProtocolError` naming the rule. With ``protocol_level >= 5`` MQTT 5.0 is
validated as strictly, in both directions: property blocks (which property each packet allows,
table 2-4, and the rules on their values), the reason codes each packet defines, the subscription
options and the AUTH packet (type 15, which stays reserved below 5.0). Each error carries the
`reason_code` a 5.0 server reports it with: 0x81 Malformed Packet, 0x82 Protocol Error or 0x95
Packet Too Large. Rules that need connection state (topic alias maximums, receive maximum, a
second CONNECT) are the connection's, not the codec's.

Nothing here does I/O. The broker feeds what it reads from a socket into a `Decoder` and calls
`Decoder.packets()` once per read; it writes what `encode` / `encode_publish` return. A client
reading a server passes ``Decoder(from_server=True)`` so 5.0 PUBLISHes may carry Subscription
Identifiers.

The implementation is split by direction: `bridge.mqtt.decoder` (framing and the incremental
`Decoder`), `bridge.mqtt.body_decoders` (one decoder per packet body), `bridge.mqtt.encoder`
(`encode`), `bridge.mqtt.fast_encoders` (the hot paths without packet objects),
`bridge.mqtt.property_rules` (which property goes where) and `bridge.mqtt.wire` (limits and
reason-code sets they share). This module is the stable public interface: import from here, not
from those modules.
"""

from __future__ import annotations

from bridge.mqtt.decoder import Decoder
from bridge.mqtt.encoder import (
    encode,
    encode_ack5,
    encode_disconnect5,
    encode_puback,
    encode_pubcomp,
    encode_publish,
    encode_publish5,
    encode_pubrec,
    encode_pubrel,
)
from bridge.mqtt.properties import encode_property_block_content
from bridge.mqtt.wire import MAX_PACKET_SIZE, SUPPORTED_PROTOCOLS

__all__ = [
    "MAX_PACKET_SIZE",
    "SUPPORTED_PROTOCOLS",
    "Decoder",
    "encode",
    "encode_ack5",
    "encode_disconnect5",
    "encode_property_block_content",
    "encode_puback",
    "encode_pubcomp",
    "encode_publish",
    "encode_publish5",
    "encode_pubrec",
    "encode_pubrel",
]
