"""Unit tests of the MQTT 5.0 wire format parts of the codec and of bridge.mqtt.properties."""

from __future__ import annotations

import pytest

from bridge.mqtt.codec import Decoder, encode, encode_publish
from bridge.mqtt.errors import MQTTProtocolError
from bridge.mqtt.packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
)
from bridge.mqtt.properties import (
    PROPERTY_TYPES,
    PropertyId,
    PropertyType,
    decode_properties,
    encode_properties,
    encode_varint,
    read_utf8,
    read_varint,
)

from .codec_bytes import frame, s


def decode5(data: bytes) -> list[Packet]:
    decoder = Decoder()
    decoder.protocol_level = 5
    decoder.feed(data)
    return decoder.packets()


def rule5(data: bytes) -> str:
    with pytest.raises(MQTTProtocolError) as info:
        decode5(data)
    return info.value.rule


# --- primitives and property blocks ----------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, b"\x00"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (16_383, b"\xff\x7f"),
        (16_384, b"\x80\x80\x01"),
        (2_097_151, b"\xff\xff\x7f"),
        (2_097_152, b"\x80\x80\x80\x01"),
        (268_435_455, b"\xff\xff\xff\x7f"),
    ],
)
def test_variable_byte_integer_round_trips(value: int, encoded: bytes) -> None:
    assert encode_varint(value) == encoded
    assert read_varint(encoded, 0, len(encoded)) == (value, len(encoded))


@pytest.mark.parametrize("value", [-1, 268_435_456])
def test_variable_byte_integer_out_of_range_cannot_be_encoded(value: int) -> None:
    with pytest.raises(MQTTProtocolError):
        encode_varint(value)


def test_variable_byte_integer_longer_than_4_bytes_is_malformed() -> None:
    with pytest.raises(MQTTProtocolError) as info:
        read_varint(b"\x80\x80\x80\x80\x01", 0, 5)
    assert info.value.rule == "malformed-variable-byte-integer"


def test_read_utf8_respects_the_end_bound() -> None:
    with pytest.raises(MQTTProtocolError) as info:
        read_utf8(b"\x00\x03abc", 0, 4)
    assert info.value.rule == "malformed-packet"


def test_every_property_identifier_has_a_data_type() -> None:
    assert set(PROPERTY_TYPES) == set(PropertyId)
    assert PROPERTY_TYPES[PropertyId.USER_PROPERTY] is PropertyType.UTF8_PAIR
    assert PROPERTY_TYPES[PropertyId.SUBSCRIPTION_IDENTIFIER] is PropertyType.VARINT


def test_property_block_of_each_data_type_round_trips() -> None:
    props = {
        0x01: 1,  # byte
        0x21: 0x1234,  # two-byte int
        0x11: 0xFFFF_FFFF,  # four-byte int
        0x0B: [1, 268_435_455],  # varint, repeatable
        0x03: "text/plain",  # UTF-8 string
        0x09: b"\x00\x01",  # binary
        0x26: [("k", "v"), ("k", "w")],  # UTF-8 pairs, repeatable
    }
    block = encode_properties(props)
    assert decode_properties(b"xx" + block, 2) == (props, 2 + len(block))


def test_property_block_bytes_are_as_specified() -> None:
    block = encode_properties({0x11: 10, 0x26: [("a", "b")]})
    assert block == b"\x0c" + b"\x11\x00\x00\x00\x0a" + b"\x26\x00\x01a\x00\x01b"
    assert encode_properties({}) == b"\x00"


def test_unknown_property_identifier_is_rejected() -> None:
    with pytest.raises(MQTTProtocolError) as info:
        decode_properties(b"\x02\x04\x00", 0)
    assert info.value.rule == "invalid-property"


def test_duplicate_non_repeatable_property_is_rejected() -> None:
    with pytest.raises(MQTTProtocolError) as info:
        decode_properties(b"\x04\x01\x00\x01\x01", 0)
    assert info.value.rule == "duplicate-property"


@pytest.mark.parametrize(
    "block",
    [
        b"\x05\x01\x00",  # length beyond the buffer
        b"\x02\x21\x00",  # two-byte int cut short
        b"\x03\x03\x00\x05",  # string cut short
    ],
)
def test_truncated_property_block_is_malformed(block: bytes) -> None:
    with pytest.raises(MQTTProtocolError) as info:
        decode_properties(block, 0)
    assert info.value.rule == "malformed-packet"


def test_encode_properties_rejects_values_of_the_wrong_type() -> None:
    for props in ({0x01: 256}, {0x03: b"x"}, {0x09: "x"}, {0x26: ("a", "b")}, {0x7F: 1}):
        with pytest.raises(MQTTProtocolError):
            encode_properties(props)


# --- MQTT 5.0 packets ------------------------------------------------------------------------

CONNECT5 = frame(
    0x10,
    s("MQTT")
    + b"\x05\x46\x00\x0a"  # level 5, password, will (QoS 0), clean start, keep alive 10
    + b"\x05\x11\x00\x00\x0e\x10"  # session expiry 3600
    + s("cid")
    + b"\x05\x18\x00\x00\x00\x05"  # will delay 5
    + s("will/t")
    + s(b"gone")
    + s(b"pw"),
)


def test_connect_level_5_with_properties_decodes_and_switches_the_decoder_to_5() -> None:
    decoder = Decoder()
    decoder.feed(CONNECT5)
    [packet] = decoder.packets()
    assert packet == Connect(
        "cid",
        keepalive=10,
        password=b"pw",  # 5.0 allows a password without a user name
        will=Will("will/t", b"gone", properties={0x18: 5}),
        protocol_level=5,
        properties={0x11: 3600},
    )
    assert decoder.protocol_level == 5
    assert encode(packet) == CONNECT5


def test_connect_level_5_with_truncated_properties_is_malformed() -> None:
    body = s("MQTT") + b"\x05\x02\x00\x0a" + b"\x05\x11\x00" + s("c")
    assert rule5(frame(0x10, body)) == "malformed-packet"


TABLE_5: list[tuple[str, Packet, bytes]] = [
    ("connack", Connack(0, True, {0x22: 10}), b"\x20\x06\x01\x00\x03\x22\x00\x0a"),
    ("connack-refused", Connack(0x87), b"\x20\x03\x00\x87\x00"),
    (
        "publish-props",
        Publish("a", b"x", 1, packet_id=1, properties={0x01: 1}),
        b"\x32\x09\x00\x01a\x00\x01\x02\x01\x01x",
    ),
    ("publish-no-props", Publish("a", b"x"), b"\x30\x05\x00\x01a\x00x"),
    (
        "publish-alias-only",
        Publish("", b"", properties={0x23: 3}),
        b"\x30\x06\x00\x00\x03\x23\x00\x03",
    ),
    ("puback-short", Puback(1), b"\x40\x02\x00\x01"),
    ("pubrec-reason", Pubrec(1, 0x10), b"\x50\x03\x00\x01\x10"),
    ("pubrel-props", Pubrel(1, 0x92, {0x1F: "r"}), b"\x62\x08\x00\x01\x92\x04\x1f\x00\x01r"),
    ("pubcomp-reason-0-props", Pubcomp(1, 0, {0x1F: ""}), b"\x70\x07\x00\x01\x00\x03\x1f\x00\x00"),
    (
        "subscribe-options",
        Subscribe(2, [Subscription("a", 2, True, True, 2)], {0x0B: [5]}),
        b"\x82\x09\x00\x02\x02\x0b\x05" + s("a") + b"\x2e",
    ),
    ("suback", Suback(2, [0x00, 0x97]), b"\x90\x05\x00\x02\x00\x00\x97"),
    ("unsubscribe", Unsubscribe(3, ["a"]), b"\xa2\x06\x00\x03\x00" + s("a")),
    ("unsuback", Unsuback(3, [0x00, 0x11]), b"\xb0\x05\x00\x03\x00\x00\x11"),
    ("disconnect-short", Disconnect(), b"\xe0\x00"),
    ("disconnect-reason", Disconnect(0x04), b"\xe0\x01\x04"),
    ("disconnect-props", Disconnect(0x8E, {0x1F: "x"}), b"\xe0\x06\x8e\x04\x1f\x00\x01x"),
]


@pytest.mark.parametrize(
    ("packet", "wire"), [(p, w) for _, p, w in TABLE_5], ids=[n for n, _, _ in TABLE_5]
)
def test_mqtt5_packets_encode_and_decode_with_properties_and_reason_codes(
    packet: Packet, wire: bytes
) -> None:
    assert encode(packet, 5) == wire
    assert decode5(wire) == [packet]


def test_mqtt5_connack_without_property_block_is_accepted() -> None:
    assert decode5(b"\x20\x02\x00\x00") == [Connack()]


def test_mqtt5_encode_publish_writes_an_empty_property_block() -> None:
    wire = encode_publish("a", b"x", 1, packet_id=4, protocol_level=5)
    assert wire == b"\x32\x07\x00\x01a\x00\x04\x00x"
    assert encode_publish("a", b"x", 0, protocol_level=5) == b"\x30\x05\x00\x01a\x00x"
    assert decode5(wire) == [Publish("a", b"x", 1, packet_id=4)]


def test_mqtt5_publish_with_empty_topic_needs_a_topic_alias() -> None:
    assert rule5(b"\x30\x03\x00\x00\x00") == "MQTT-4.7.3-1"


def test_mqtt5_publish_topic_must_not_contain_wildcards_MQTT_3_3_2_2() -> None:
    assert rule5(b"\x30\x04\x00\x01#\x00") == "MQTT-3.3.2-2"


def test_mqtt5_subscription_options_reserved_bits_must_be_0_MQTT_3_8_3_5() -> None:
    assert rule5(b"\x82\x07\x00\x01\x00" + s("a") + b"\x40") == "MQTT-3.8.3-5"


def test_mqtt5_subscription_options_reject_qos_3_and_retain_handling_3() -> None:
    assert rule5(b"\x82\x07\x00\x01\x00" + s("a") + b"\x03") == "invalid-subscription-options"
    assert rule5(b"\x82\x07\x00\x01\x00" + s("a") + b"\x30") == "invalid-subscription-options"


def test_mqtt5_suback_and_unsuback_reject_undefined_reason_codes() -> None:
    assert rule5(b"\x90\x04\x00\x01\x00\x05") == "MQTT-3.9.3-2"
    assert rule5(b"\xb0\x04\x00\x01\x00\x05") == "invalid-reason-code"


def test_mqtt5_ack_with_trailing_bytes_after_properties_is_malformed() -> None:
    assert rule5(b"\x40\x05\x00\x01\x00\x00\x00") == "malformed-packet"


def test_mqtt5_ack_shorter_than_packet_id_is_malformed() -> None:
    assert rule5(b"\x40\x01\x00") == "malformed-packet"


def test_mqtt5_auth_packet_type_15_decodes_at_5_and_stays_reserved_below() -> None:
    assert decode5(b"\xf0\x00") == [Auth()]
    decoder = Decoder()
    decoder.feed(b"\xf0\x00")
    with pytest.raises(MQTTProtocolError) as info:
        decoder.packets()
    assert info.value.rule == "invalid-packet-type"
