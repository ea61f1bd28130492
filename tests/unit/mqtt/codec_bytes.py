"""Hand-built MQTT bytes for the codec tests (test_codec*.py, test_codec_mqtt5.py).

Builders of the wire format written independently of bridge.mqtt.codec (length-prefixed
strings, variable-length remaining lengths, frames, CONNECT variable headers), so the tests
compare the codec with bytes it did not produce, and decoding shorthands: all packets, exactly
one packet, or the rule named by the MQTTProtocolError a decoder raises.
"""

from __future__ import annotations

import pytest

from bridge.mqtt.codec import MAX_PACKET_SIZE, Decoder
from bridge.mqtt.errors import MQTTProtocolError, PacketTooLarge
from bridge.mqtt.packets import Packet, PacketType, Puback, Pubcomp, Pubrec, Pubrel

ACKS = [
    (Puback, PacketType.PUBACK, "PUBACK"),
    (Pubrec, PacketType.PUBREC, "PUBREC"),
    (Pubrel, PacketType.PUBREL, "PUBREL"),
    (Pubcomp, PacketType.PUBCOMP, "PUBCOMP"),
]
"""The four acknowledgements: their class, packet type and name in error texts."""


def s(text: str | bytes) -> bytes:
    """A length-prefixed MQTT string from text (or raw bytes, to build ill-formed ones)."""
    raw = text.encode() if isinstance(text, str) else text
    return len(raw).to_bytes(2, "big") + raw


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        value, digit = divmod(value, 128)
        out.append(digit | (0x80 if value else 0))
        if not value:
            return bytes(out)


def frame(first: int, body: bytes) -> bytes:
    """A packet: first byte, remaining length, body."""
    return bytes((first,)) + varint(len(body)) + body


def decode_all(data: bytes, level: int = 4, max_packet_size: int = MAX_PACKET_SIZE) -> list[Packet]:
    decoder = Decoder(max_packet_size)
    decoder.protocol_level = level
    decoder.feed(data)
    return decoder.packets()


def decode_one(data: bytes, level: int = 4) -> Packet:
    packets = decode_all(data, level)
    assert len(packets) == 1, packets
    return packets[0]


def rule_of(data: bytes, level: int = 4) -> str:
    with pytest.raises(MQTTProtocolError) as info:
        decode_all(data, level)
    return info.value.rule


def connect_body(
    flags: int, payload: bytes, name: str = "MQTT", level: int = 4, keepalive: int = 60
) -> bytes:
    return s(name) + bytes((level, flags)) + keepalive.to_bytes(2, "big") + payload


def answer_of(error: MQTTProtocolError) -> str:
    """The reason code a 5.0 peer receives, then the log text: "0x81 rule: message"."""
    if isinstance(error, PacketTooLarge):
        assert error.args == (error.size, error.limit)
    else:
        assert error.args == (error.rule, error.message)
    return f"0x{error.reason_code:02X} {error}"
