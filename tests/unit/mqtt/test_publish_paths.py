"""A PUBLISH is decoded one of two ways: inline by `Decoder` (3.1.1, and 5.0 without
properties: the hot path) or by the full body decoder (5.0 with properties). Both check the topic
with the same function (`check_publish_topic`); the inline path reads the string as `read_utf8`
does, in code of its own (a call costs it 4% of a QoS 0 message). A client gets the same answer
for the same topic whichever way its PUBLISH went, and these tests hold both paths to that."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.mqtt.codec import Decoder
from bridge.mqtt.decoder import _plain_v5_publish
from bridge.mqtt.errors import MQTTProtocolError
from bridge.mqtt.packets import Publish

from .codec_bytes import answer_of, frame, s

PAYLOAD_FORMAT_UTF8 = b"\x02\x01\x01"
"""A 5.0 property block (Payload Format Indicator 1): it sends a PUBLISH to the full decoder."""


def outcome(data: bytes, level: int) -> str:
    """The topic a PUBLISH was decoded with, or the reason code and text it was refused with."""
    decoder = Decoder()
    decoder.protocol_level = level
    decoder.feed(data)
    try:
        (packet,) = decoder.packets()
    except MQTTProtocolError as refused:
        return answer_of(refused)
    assert isinstance(packet, Publish)
    return f"topic {packet.topic!r}"


def three_ways(topic: bytes, qos: int = 0) -> tuple[str, str, str]:
    """The outcome for `topic` on the inline path (3.1.1 and 5.0) and on the full 5.0 path."""
    first = 0x30 | qos << 1
    packet_id = b"\x00\x07" if qos else b""
    head = s(topic) + packet_id
    return (
        outcome(frame(first, head + b"x"), 4),
        outcome(frame(first, head + b"\x00x"), 5),
        outcome(frame(first, head + PAYLOAD_FORMAT_UTF8 + b"x"), 5),
    )


@pytest.mark.parametrize(
    ("topic", "answer"),
    [
        (b"\xff", "0x81 MQTT-1.5.3-1: ill-formed UTF-8 string"),
        (b"\xed\xa0\x80", "0x81 MQTT-1.5.3-1: ill-formed UTF-8 string"),  # a surrogate
        (b"a\x00", "0x81 MQTT-1.5.3-2: UTF-8 string contains U+0000"),
        (b"a/+", "0x81 MQTT-3.3.2-2: PUBLISH topic name must not contain wildcards"),
        (b"#", "0x81 MQTT-3.3.2-2: PUBLISH topic name must not contain wildcards"),
        (b"a/b", "topic 'a/b'"),
    ],
)
def test_each_way_of_decoding_a_publish_gives_the_same_answer_for_its_topic(
    topic: bytes, answer: str
) -> None:
    assert three_ways(topic) == (answer, answer, answer)
    assert three_ways(topic, qos=1) == (answer, answer, answer)


@given(topic=st.binary(min_size=1, max_size=12))
def test_any_topic_gets_one_answer_whichever_way_its_publish_is_decoded(topic: bytes) -> None:
    inline_311, inline_5, full_5 = three_ways(topic)
    assert inline_311 == inline_5 == full_5


def test_the_inline_path_takes_the_5_0_publishes_without_properties_and_only_those() -> None:
    # The equalities above prove something only if both paths run: the 5.0 PUBLISH without
    # properties is decoded inline (as every 3.1.1 one is), the one with properties is not.
    for qos, packet_id in ((0, b""), (1, b"\x00\x07")):
        first = 0x30 | qos << 1
        plain = frame(first, s("a/b") + packet_id + b"\x00x")
        with_props = frame(first, s("a/b") + packet_id + PAYLOAD_FORMAT_UTF8 + b"x")
        assert _plain_v5_publish(plain, 2, len(plain), first)
        assert not _plain_v5_publish(with_props, 2, len(with_props), first)
