"""Byte-level unit tests of the MQTT 3.1.1 codec: PUBLISH and its acknowledgements.

Decoding PUBLISH (QoS, DUP, packet ids, topic names: wildcards, empty, ill-formed UTF-8, null
characters), the fast encode_publish against encode(Publish) and its checks, the constant
four-byte ack helpers, and PUBACK, PUBREC, PUBREL and PUBCOMP on the wire.

Test names state the behaviour and cite the normative statement (or the kebab-case rule name
the codec reports when the specification has no id). Hand-built bytes come from codec_bytes.py.
"""

from __future__ import annotations

import pytest

from bridge.mqtt.codec import (
    encode,
    encode_puback,
    encode_pubcomp,
    encode_publish,
    encode_pubrec,
    encode_pubrel,
)
from bridge.mqtt.errors import MQTTProtocolError
from bridge.mqtt.packets import Puback, Pubcomp, Publish, Pubrec, Pubrel

from .codec_bytes import decode_one, frame, rule_of, s, varint

# --- PUBLISH ---------------------------------------------------------------------------------


def test_publish_with_qos_3_is_rejected_MQTT_3_3_1_4() -> None:
    assert rule_of(b"\x36\x05\x00\x01a\x00\x01") == "MQTT-3.3.1-4"
    assert rule_of(b"\x37") == "MQTT-3.3.1-4"


def test_publish_qos0_with_dup_is_rejected_MQTT_3_3_1_2() -> None:
    assert rule_of(b"\x38\x03\x00\x01a") == "MQTT-3.3.1-2"


@pytest.mark.parametrize("first", [0x32, 0x34, 0x3A, 0x3C])
def test_publish_qos1_or_2_with_packet_id_0_is_rejected_MQTT_2_3_1_1(first: int) -> None:
    assert rule_of(bytes((first,)) + b"\x05\x00\x01a\x00\x00") == "MQTT-2.3.1-1"


@pytest.mark.parametrize("topic", ["a/+", "#", "a/#", "+", "a+b", "sport/tennis#"])
def test_publish_topic_with_wildcards_is_rejected_MQTT_3_3_2_2(topic: str) -> None:
    assert rule_of(frame(0x30, s(topic))) == "MQTT-3.3.2-2"


def test_publish_with_empty_topic_is_rejected_MQTT_4_7_3_1() -> None:
    assert rule_of(b"\x30\x02\x00\x00") == "MQTT-4.7.3-1"


def test_publish_topic_longer_than_the_packet_is_malformed() -> None:
    assert rule_of(b"\x30\x03\x00\x05a") == "malformed-packet"


def test_publish_shorter_than_its_topic_length_field_is_malformed() -> None:
    assert rule_of(b"\x30\x01\x00") == "malformed-packet"
    assert rule_of(b"\x30\x00") == "malformed-packet"


def test_publish_qos1_without_room_for_packet_id_is_malformed() -> None:
    assert rule_of(b"\x32\x04\x00\x01a\x00") == "malformed-packet"


def test_publish_payload_may_be_empty_or_contain_any_bytes() -> None:
    assert decode_one(frame(0x30, s("t"))) == Publish("t", b"")
    assert decode_one(frame(0x30, s("t") + b"\x00\xff\xfe")) == Publish("t", b"\x00\xff\xfe")


def test_publish_topic_with_ill_formed_utf8_is_rejected_MQTT_1_5_3_1() -> None:
    assert rule_of(frame(0x30, s(b"a\xff"))) == "MQTT-1.5.3-1"
    assert rule_of(frame(0x30, s(b"\xc0\xaf"))) == "MQTT-1.5.3-1"  # overlong '/'


def test_publish_topic_with_encoded_surrogate_is_rejected_MQTT_1_5_3_1() -> None:
    assert rule_of(frame(0x30, s(b"a\xed\xa0\x80"))) == "MQTT-1.5.3-1"  # U+D800
    assert rule_of(frame(0x30, s(b"\xed\xbf\xbf"))) == "MQTT-1.5.3-1"  # U+DFFF


def test_publish_topic_with_null_character_is_rejected_MQTT_1_5_3_2() -> None:
    assert rule_of(frame(0x30, s(b"a\x00b"))) == "MQTT-1.5.3-2"


def test_publish_topic_may_use_non_ascii_utf8() -> None:
    assert decode_one(frame(0x30, s("caf\u00e9/\U0001f600"))) == Publish("caf\u00e9/\U0001f600")


def test_publish_topic_may_start_with_dollar_and_contain_empty_levels() -> None:
    assert decode_one(frame(0x30, s("$SYS//x/"))) == Publish("$SYS//x/")


def test_large_publish_uses_multi_byte_remaining_length() -> None:
    payload = bytes(range(256)) * 100
    wire = encode_publish("big", payload, 1, packet_id=5)
    assert wire[:4] == b"\x32" + varint(2 + 3 + 2 + len(payload))
    assert decode_one(wire) == Publish("big", payload, 1, packet_id=5)


# --- encode_publish and the ack helpers ------------------------------------------------------


@pytest.mark.parametrize(
    "packet",
    [
        Publish("a/b", b"hello"),
        Publish("a/b", b"", retain=True),
        Publish("x", b"y" * 200, qos=1, packet_id=1),
        Publish("x", b"y", qos=2, dup=True, retain=True, packet_id=65535),
        Publish("\u00e9" * 100, b"z" * 20000, qos=1, dup=True, packet_id=300),
    ],
)
def test_encode_publish_matches_encode_of_a_publish(packet: Publish) -> None:
    fast = encode_publish(
        packet.topic, packet.payload, packet.qos, packet.retain, packet.dup, packet.packet_id
    )
    assert fast == encode(packet)
    assert decode_one(fast) == packet


def test_encode_publish_rejects_qos_3_MQTT_3_3_1_4() -> None:
    with pytest.raises(MQTTProtocolError) as info:
        encode_publish("t", b"", 3, packet_id=1)
    assert info.value.rule == "MQTT-3.3.1-4"


def test_encode_publish_qos1_needs_a_nonzero_packet_id_MQTT_2_3_1_1() -> None:
    for packet_id in (None, 0, 65536):
        with pytest.raises(MQTTProtocolError) as info:
            encode_publish("t", b"", 1, packet_id=packet_id)
        assert info.value.rule == "MQTT-2.3.1-1"


def test_encode_publish_qos0_must_not_carry_a_packet_id_MQTT_2_3_1_5() -> None:
    with pytest.raises(MQTTProtocolError) as info:
        encode_publish("t", b"", 0, packet_id=1)
    assert info.value.rule == "MQTT-2.3.1-5"


def test_encode_publish_qos0_must_not_set_dup_MQTT_3_3_1_2() -> None:
    with pytest.raises(MQTTProtocolError) as info:
        encode_publish("t", b"", 0, dup=True)
    assert info.value.rule == "MQTT-3.3.1-2"


def test_encode_publish_topic_over_65535_bytes_is_rejected_MQTT_4_7_3_3() -> None:
    with pytest.raises(MQTTProtocolError) as info:
        encode_publish("a" * 65536, b"", 0)
    assert info.value.rule == "MQTT-4.7.3-3"


def test_encode_of_publish_validates_the_topic_name_MQTT_4_7_1_1() -> None:
    with pytest.raises(MQTTProtocolError) as info:
        encode(Publish("a/#"))
    assert info.value.rule == "MQTT-4.7.1-1"
    with pytest.raises(MQTTProtocolError) as info:
        encode(Publish(""))
    assert info.value.rule == "MQTT-4.7.3-1"


def test_ack_helpers_build_the_constant_four_byte_packets() -> None:
    assert encode_puback(1) == b"\x40\x02\x00\x01" == encode(Puback(1))
    assert encode_pubrec(0x1234) == b"\x50\x02\x12\x34" == encode(Pubrec(0x1234))
    assert encode_pubrel(65535) == b"\x62\x02\xff\xff" == encode(Pubrel(65535))
    assert encode_pubcomp(2) == b"\x70\x02\x00\x02" == encode(Pubcomp(2))


@pytest.mark.parametrize("helper", [encode_puback, encode_pubrec, encode_pubrel, encode_pubcomp])
def test_ack_helpers_reject_packet_id_0_MQTT_2_3_1_1(helper: object) -> None:
    with pytest.raises(MQTTProtocolError) as info:
        helper(0)  # type: ignore[operator]
    assert info.value.rule == "MQTT-2.3.1-1"


# --- PUBACK, PUBREC, PUBREL, PUBCOMP ---------------------------------------------------------

ACK_FIRST_BYTES = [0x40, 0x50, 0x62, 0x70]


@pytest.mark.parametrize("first", ACK_FIRST_BYTES)
def test_ack_with_packet_id_0_is_rejected_MQTT_2_3_1_1(first: int) -> None:
    assert rule_of(bytes((first, 2, 0, 0))) == "MQTT-2.3.1-1"


@pytest.mark.parametrize("first", ACK_FIRST_BYTES)
@pytest.mark.parametrize("body", [b"", b"\x00", b"\x00\x01\x00", b"\x00\x01\x00\x00"])
def test_ack_remaining_length_must_be_2_in_mqtt_3_1_1(first: int, body: bytes) -> None:
    assert rule_of(frame(first, body)) == "malformed-packet"


@pytest.mark.parametrize("cls", [Puback, Pubrec, Pubrel, Pubcomp])
def test_encode_ack_rejects_packet_id_0_MQTT_2_3_1_1(cls: type[Puback]) -> None:
    with pytest.raises(MQTTProtocolError) as info:
        encode(cls(0))
    assert info.value.rule == "MQTT-2.3.1-1"


def test_ack_reason_code_is_not_written_in_mqtt_3_1_1() -> None:
    assert encode(Puback(1, reason_code=0x10, properties={0x1F: "x"})) == b"\x40\x02\x00\x01"
