"""MQTT 5.0 AUTH, the short forms, the 5.0 fast encoders, and round trips of every 5.0 packet.

AUTH on the wire (short and long form, flags, reason codes, only from 5.0 on); the short forms
of the acknowledgements, DISCONNECT and AUTH; `encode_publish5`, `encode_ack5`,
`encode_disconnect5` and `encode_property_block_content` against byte literals and against
`encode`; the 3.1.1 encodings unchanged, byte for byte; and hypothesis round trips of every 5.0
packet type with random valid properties, fed whole and byte by byte.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.mqtt import codec
from bridge.mqtt.codec import (
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
from bridge.mqtt.errors import MQTTProtocolError
from bridge.mqtt.packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    PacketType,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Subscribe,
    Subscription,
    Unsuback,
)
from bridge.mqtt.properties import encode_properties

from .codec_bytes import connect_body, frame, s
from .mqtt5_spec import block, property_bytes
from .test_codec_properties import packets, publishes

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def decode5(data: bytes, from_server: bool = False) -> list[Packet]:
    decoder = Decoder(from_server=from_server)
    decoder.protocol_level = 5
    decoder.feed(data)
    return decoder.packets()


def error5(data: bytes) -> MQTTProtocolError:
    with pytest.raises(MQTTProtocolError) as info:
        decode5(data)
    return info.value


# --- AUTH ------------------------------------------------------------------------------------


def test_auth_short_form_is_an_empty_body_meaning_success_without_properties() -> None:
    assert decode5(b"\xf0\x00") == [Auth()]
    assert encode(Auth(), 5) == b"\xf0\x00"
    assert encode(Auth(0, {}), 5) == b"\xf0\x00"


def test_auth_long_form_carries_reason_code_and_properties() -> None:
    props = {0x15: "SCRAM-SHA-256", 0x16: b"\x01\x02", 0x1F: "go on", 0x26: [("k", "v")]}
    wire = frame(
        0xF0,
        b"\x18"
        + block(
            property_bytes(0x15, "SCRAM-SHA-256"),
            property_bytes(0x16, b"\x01\x02"),
            property_bytes(0x1F, "go on"),
            property_bytes(0x26, [("k", "v")]),
        ),
    )
    assert encode(Auth(0x18, props), 5) == wire
    assert decode5(wire) == [Auth(0x18, props)]


def test_auth_success_with_properties_uses_the_long_form() -> None:
    wire = frame(0xF0, b"\x00" + block(property_bytes(0x15, "m")))
    assert encode(Auth(0, {0x15: "m"}), 5) == wire
    assert decode5(wire) == [Auth(0, {0x15: "m"})]


def test_auth_re_authenticate_decodes() -> None:
    wire = frame(0xF0, b"\x19" + block(property_bytes(0x15, "m")))
    assert decode5(wire) == [Auth(0x19, {0x15: "m"})]


@pytest.mark.parametrize("first", range(0xF1, 0x100))
def test_auth_flags_must_be_0_MQTT_2_2_2_1(first: int) -> None:
    error = error5(bytes((first, 0)))
    assert (error.rule, error.reason_code) == ("MQTT-2.2.2-1", 0x81)


def test_auth_with_a_reason_code_but_no_property_length_is_malformed() -> None:
    assert error5(b"\xf0\x01\x18").rule == "malformed-packet"


def test_auth_with_bytes_after_its_properties_is_malformed() -> None:
    assert error5(frame(0xF0, b"\x18" + block(property_bytes(0x15, "m")) + b"\x00")).rule == (
        "malformed-packet"
    )


@pytest.mark.parametrize("level", [3, 4])
def test_packet_type_15_stays_reserved_before_mqtt_5(level: int) -> None:
    decoder = Decoder()
    decoder.protocol_level = level
    decoder.feed(b"\xf0\x00")
    with pytest.raises(MQTTProtocolError) as info:
        decoder.packets()
    assert (info.value.rule, info.value.reason_code) == ("invalid-packet-type", 0x81)
    with pytest.raises(MQTTProtocolError):
        encode(Auth(), level)


def test_auth_after_a_5_0_connect_in_the_same_read_decodes() -> None:
    connect = frame(0x10, connect_body(0x02, b"\x00" + s("c"), level=5))
    decoder = Decoder()
    decoder.feed(connect + b"\xf0\x00")
    assert [type(p) for p in decoder.packets()] == [Connect, Auth]


# --- short forms -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("packet_type", "first"),
    [
        (PacketType.PUBACK, 0x40),
        (PacketType.PUBREC, 0x50),
        (PacketType.PUBREL, 0x62),
        (PacketType.PUBCOMP, 0x70),
    ],
)
def test_encode_ack5_writes_the_shortest_form(packet_type: int, first: int) -> None:
    code = 0x92 if packet_type in (PacketType.PUBREL, PacketType.PUBCOMP) else 0x10
    assert encode_ack5(packet_type, 1) == bytes((first, 2, 0, 1))
    assert encode_ack5(packet_type, 0x1234, 0, {}) == bytes((first, 2, 0x12, 0x34))
    assert encode_ack5(packet_type, 1, code) == bytes((first, 3, 0, 1, code))
    assert (
        encode_ack5(packet_type, 1, code, {0x1F: "r"})
        == bytes((first, 8, 0, 1, code, 4, 0x1F, 0, 1)) + b"r"
    )
    assert encode_ack5(packet_type, 1, 0, {0x1F: ""}) == bytes((first, 7, 0, 1, 0, 3, 0x1F, 0, 0))


@pytest.mark.parametrize(
    ("packet", "short"),
    [
        (Puback(7), b"\x40\x02\x00\x07"),
        (Pubrec(7, 0x10), b"\x50\x03\x00\x07\x10"),
        (Pubrel(7, 0x92), b"\x62\x03\x00\x07\x92"),
        (Pubcomp(7), b"\x70\x02\x00\x07"),
        (Disconnect(), b"\xe0\x00"),
        (Disconnect(0x04), b"\xe0\x01\x04"),
        (Auth(), b"\xf0\x00"),
    ],
)
def test_encode_writes_and_decode_reads_the_short_forms(packet: Packet, short: bytes) -> None:
    assert encode(packet, 5) == short
    assert decode5(short) == [packet]


def test_ack_with_reason_code_and_empty_property_length_decodes() -> None:
    assert decode5(b"\x40\x04\x00\x01\x10\x00") == [Puback(1, 0x10)]


def test_encode_ack5_is_what_encode_writes() -> None:
    for packet, kind in [
        (Puback(3, 0x97, {0x26: [("a", "b")]}), PacketType.PUBACK),
        (Pubrel(3, 0x92), PacketType.PUBREL),
    ]:
        assert encode(packet, 5) == encode_ack5(
            kind, packet.packet_id, packet.reason_code, packet.properties
        )


def test_encode_ack5_refuses_bad_input() -> None:
    with pytest.raises(ValueError):
        encode_ack5(PacketType.PUBLISH, 1)
    for packet_id in (0, 0x10000):
        with pytest.raises(MQTTProtocolError) as info:
            encode_ack5(PacketType.PUBACK, packet_id)
        assert info.value.rule == "MQTT-2.3.1-1"
    with pytest.raises(MQTTProtocolError) as info:
        encode_ack5(PacketType.PUBREL, 1, 0x10)  # a PUBACK code, not a PUBREL one
    assert (info.value.rule, info.value.reason_code) == ("invalid-reason-code", 0x82)
    with pytest.raises(MQTTProtocolError) as info:
        encode_ack5(PacketType.PUBACK, 1, 0, {0x11: 5})  # Session Expiry is not for acks
    assert (info.value.rule, info.value.reason_code) == ("invalid-property", 0x81)


def test_encode_disconnect5_short_forms_and_properties() -> None:
    assert encode_disconnect5(0) == b"\xe0\x00"
    assert encode_disconnect5(0x8E) == b"\xe0\x01\x8e"
    assert encode_disconnect5(0x8E, {0x1F: "x"}) == b"\xe0\x06\x8e\x04\x1f\x00\x01x"
    assert encode_disconnect5(0, {0x11: 0}) == b"\xe0\x07\x00\x05\x11\x00\x00\x00\x00"
    with pytest.raises(MQTTProtocolError) as info:
        encode_disconnect5(0x01)
    assert info.value.reason_code == 0x82
    with pytest.raises(MQTTProtocolError) as info:
        encode_disconnect5(0, {0x23: 1})  # Topic Alias belongs to PUBLISH
    assert info.value.rule == "invalid-property"


# --- encode_publish5 and property block content ----------------------------------------------


def test_encode_property_block_content_is_the_block_without_its_length() -> None:
    props = {0x02: 60, 0x26: [("a", "b")], 0x0B: [1, 300]}
    content = encode_property_block_content(props)
    assert encode_properties(props) == bytes((len(content),)) + content
    assert encode_property_block_content({}) == b""


def test_encode_publish5_byte_literals() -> None:
    assert encode_publish5("a", b"x", 0, False, False, None) == b"\x30\x05\x00\x01a\x00x"
    assert encode_publish5("a", b"x", 1, True, True, 4) == b"\x3b\x07\x00\x01a\x00\x04\x00x"
    alias_only = encode_publish5("", b"", 0, False, False, None, b"\x23\x00\x03")
    assert alias_only == b"\x30\x06\x00\x00\x03\x23\x00\x03"
    assert decode5(alias_only) == [Publish("", properties={0x23: 3})]


def test_encode_publish5_with_long_properties_and_payload_uses_multi_byte_lengths() -> None:
    content = encode_property_block_content({0x03: "c" * 200})
    wire = encode_publish5("t", b"p" * 300, 2, False, False, 9, content)
    # remaining 510 = topic 3 + packet id 2 + property length 2 + properties 203 + payload 300
    assert wire[:6] == b"\x34\xfe\x03\x00\x01t"
    assert wire[8:10] == b"\xcb\x01"  # property length 203 as a Variable Byte Integer
    assert decode5(wire) == [Publish("t", b"p" * 300, 2, packet_id=9, properties={0x03: "c" * 200})]


def test_encode_publish5_checks_qos_dup_and_packet_id() -> None:
    cases = [
        ((0, False, 1), "MQTT-2.3.1-5"),
        ((0, True, None), "MQTT-3.3.1-2"),
        ((3, False, 1), "MQTT-3.3.1-4"),
        ((1, False, None), "MQTT-2.3.1-1"),
        ((2, False, 0x10000), "MQTT-2.3.1-1"),
    ]
    for (qos, dup, packet_id), rule in cases:
        with pytest.raises(MQTTProtocolError) as info:
            encode_publish5("t", b"", qos, False, dup, packet_id)
        assert info.value.rule == rule
    with pytest.raises(MQTTProtocolError) as info:
        encode_publish5("a" * 65536, b"", 0, False, False, None)
    assert info.value.rule == "MQTT-4.7.3-3"


@SETTINGS
@given(publishes(5))
def test_encode_publish5_matches_encode_of_the_same_publish(packet: Publish) -> None:
    content = encode_property_block_content(packet.properties)
    fast = encode_publish5(
        packet.topic,
        packet.payload,
        packet.qos,
        packet.retain,
        packet.dup,
        packet.packet_id,
        content,
    )
    assert fast == encode(packet, 5)
    assert decode5(fast, from_server=True) == [packet]


def test_fast_encoders_are_exported_from_the_package_front_door() -> None:
    import bridge.mqtt as mqtt

    for name in ("encode_publish5", "encode_ack5", "encode_disconnect5"):
        assert getattr(mqtt, name) is getattr(codec, name)
    assert mqtt.encode_property_block_content is codec.encode_property_block_content


# --- MQTT 3.1.1 encodings are unchanged ------------------------------------------------------


def test_mqtt_3_1_1_fast_paths_are_byte_for_byte_unchanged() -> None:
    assert encode_publish("a/b", b"hi", 0) == b"\x30\x07\x00\x03a/bhi"
    assert encode_publish("a/b", b"hi", 0, retain=True) == b"\x31\x07\x00\x03a/bhi"
    assert encode_publish("a/b", b"hi", 1, True, True, 10) == b"\x3b\x09\x00\x03a/b\x00\x0ahi"
    assert encode_publish("a/b", b"hi", 2, packet_id=0xFFFF) == b"\x34\x09\x00\x03a/b\xff\xffhi"
    big = b"z" * 200
    assert encode_publish("a/b", big, 0) == b"\x30\xcd\x01\x00\x03a/b" + big
    assert encode_publish("a/b", big, 1, packet_id=1) == b"\x32\xcf\x01\x00\x03a/b\x00\x01" + big
    assert encode_puback(1) == b"\x40\x02\x00\x01"
    assert encode_pubrec(0x0102) == b"\x50\x02\x01\x02"
    assert encode_pubrel(0xFFFF) == b"\x62\x02\xff\xff"
    assert encode_pubcomp(5) == b"\x70\x02\x00\x05"


def test_mqtt_3_1_1_encode_ignores_5_0_fields_byte_for_byte() -> None:
    assert encode(Puback(1, 0x10, {0x1F: "x"})) == b"\x40\x02\x00\x01"
    assert encode(Pubrel(2, 0x92)) == b"\x62\x02\x00\x02"
    assert encode(Disconnect(0x04, {0x1F: "x"})) == b"\xe0\x00"
    assert encode(Connack(0, True, {0x21: 5})) == b"\x20\x02\x01\x00"
    assert encode(Connack(5)) == b"\x20\x02\x00\x05"
    assert encode(Unsuback(3, [0x11])) == b"\xb0\x02\x00\x03"
    assert encode(Publish("t", b"x", 1, packet_id=2, properties={0x23: 0})) == (
        b"\x32\x06\x00\x01t\x00\x02x"
    )
    assert encode(Subscribe(1, [Subscription("a", 1, True, True, 2)], {0x0B: [0]})) == (
        b"\x82\x06\x00\x01\x00\x01a\x01"
    )


# --- round trips of every 5.0 packet ---------------------------------------------------------


def decode_bytewise(data: bytes, from_server: bool) -> list[Packet]:
    decoder = Decoder(from_server=from_server)
    decoder.protocol_level = 5
    got: list[Packet] = []
    for index in range(len(data)):
        decoder.feed(data[index : index + 1])
        got.extend(decoder.packets())
    assert decoder.buffered == 0
    return got


@SETTINGS
@given(packets(5))
def test_every_mqtt_5_packet_with_random_properties_round_trips_whole_and_byte_by_byte(
    packet: Packet,
) -> None:
    wire = encode(packet, 5)
    assert decode5(wire, from_server=True) == [packet]
    assert decode_bytewise(wire, from_server=True) == [packet]


def without_subscription_ids(packet: Packet) -> Packet:
    if isinstance(packet, Publish) and 0x0B in packet.properties:
        props = {k: v for k, v in packet.properties.items() if k != 0x0B}
        return Publish(
            packet.topic,
            packet.payload,
            packet.qos,
            packet.retain,
            packet.dup,
            packet.packet_id,
            props,
        )
    return packet


@SETTINGS
@given(st.lists(packets(5).map(without_subscription_ids), min_size=1, max_size=5))
def test_a_stream_a_client_may_send_decodes_on_the_server_whole_and_byte_by_byte(
    items: list[Packet],
) -> None:
    wire = b"".join(encode(p, 5) for p in items)
    assert decode5(wire) == items
    assert decode_bytewise(wire, from_server=False) == items


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=120), st.lists(st.integers(0, 200), max_size=6))
def test_every_error_on_arbitrary_5_0_bytes_carries_0x81_0x82_or_0x95(
    data: bytes, cuts: list[int]
) -> None:
    decoder = Decoder(max_packet_size=64)
    decoder.protocol_level = 5
    bounds = [0, *sorted({c % (len(data) + 1) for c in cuts}), len(data)]
    for start, stop in itertools.pairwise(bounds):
        decoder.feed(data[start:stop])
        try:
            decoder.packets()
        except MQTTProtocolError as error:
            assert error.reason_code in (0x81, 0x82, 0x95)
            return
