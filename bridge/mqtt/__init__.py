"""The MQTT protocol layer: packets, the sans-IO codec, topic rules and errors (no I/O)."""

from bridge.mqtt.codec import (
    MAX_PACKET_SIZE,
    SUPPORTED_PROTOCOLS,
    Decoder,
    encode,
    encode_ack5,
    encode_disconnect5,
    encode_property_block_content,
    encode_puback,
    encode_pubcomp,
    encode_publish,
    encode_publish5,
    encode_pubrec,
    encode_pubrel,
)
from bridge.mqtt.errors import MQTTProtocolError, PacketTooLarge
from bridge.mqtt.topics import (
    parse_shared,
    topic_matches,
    validate_topic_filter,
    validate_topic_name,
)

__all__ = [
    "MAX_PACKET_SIZE",
    "SUPPORTED_PROTOCOLS",
    "Decoder",
    "MQTTProtocolError",
    "PacketTooLarge",
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
    "parse_shared",
    "topic_matches",
    "validate_topic_filter",
    "validate_topic_name",
]
