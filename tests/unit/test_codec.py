"""Byte-level unit tests of the MQTT 3.1.1 codec (bridge.mqtt.codec).

Test names state the behaviour and cite the normative statement (or the kebab-case rule name
the codec reports when the specification has no id).
"""

from __future__ import annotations

import pickle

import pytest

from bridge.mqtt.codec import (
    MAX_PACKET_SIZE,
    Decoder,
    encode,
    encode_puback,
    encode_pubcomp,
    encode_publish,
    encode_pubrec,
    encode_pubrel,
)
from bridge.mqtt.errors import MQTTProtocolError, PacketTooLarge
from bridge.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
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

# --- helpers ---------------------------------------------------------------------------------


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


# --- errors ----------------------------------------------------------------------------------


def test_protocol_error_str_is_rule_then_message() -> None:
    error = MQTTProtocolError("MQTT-3.1.2-3", "reserved flag in CONNECT must be 0")
    assert str(error) == "MQTT-3.1.2-3: reserved flag in CONNECT must be 0"
    assert error.rule == "MQTT-3.1.2-3"
    assert error.message == "reserved flag in CONNECT must be 0"


def test_packet_too_large_is_a_protocol_error_with_size_and_limit() -> None:
    error = PacketTooLarge(300, 256)
    assert isinstance(error, MQTTProtocolError)
    assert (error.size, error.limit, error.rule) == (300, 256, "packet-too-large")
    assert "300" in str(error) and "256" in str(error)


def test_protocol_errors_survive_pickling() -> None:
    error = pickle.loads(pickle.dumps(MQTTProtocolError("MQTT-2.3.1-1", "zero id")))
    assert (error.rule, error.message) == ("MQTT-2.3.1-1", "zero id")
    too_large = pickle.loads(pickle.dumps(PacketTooLarge(10, 5)))
    assert (too_large.size, too_large.limit) == (10, 5)


# --- table: every packet type, bytes <-> packet ----------------------------------------------

CONNECT_FULL = frame(
    0x10,
    connect_body(
        0b1110_1110,  # username, password, will retain, will QoS 1, will, clean session
        s("client-1") + s("last/will") + s(b"bye") + s("user") + s(b"\x00secret"),
        keepalive=30,
    ),
)

ROUND_TRIP_311: list[tuple[str, Packet, bytes]] = [
    (
        "connect-minimal",
        Connect(client_id=""),
        b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00",
    ),
    (
        "connect-full",
        Connect(
            client_id="client-1",
            clean_session=True,
            keepalive=30,
            username="user",
            password=b"\x00secret",
            will=Will("last/will", b"bye", qos=1, retain=True),
        ),
        CONNECT_FULL,
    ),
    (
        "connect-mqtt-3.1",
        Connect(client_id="c", clean_session=False, protocol_level=3, protocol_name="MQIsdp"),
        frame(0x10, connect_body(0x00, s("c"), name="MQIsdp", level=3)),
    ),
    ("connack-accepted", Connack(), b"\x20\x02\x00\x00"),
    ("connack-session-present", Connack(0, session_present=True), b"\x20\x02\x01\x00"),
    ("connack-not-authorized", Connack(5), b"\x20\x02\x00\x05"),
    ("publish-qos0", Publish("a/b", b"hello"), b"\x30\x0a\x00\x03a/bhello"),
    ("publish-qos0-retain-empty", Publish("t", b"", retain=True), b"\x31\x03\x00\x01t"),
    (
        "publish-qos1",
        Publish("a/b", b"x", qos=1, packet_id=10),
        b"\x32\x08\x00\x03a/b\x00\x0ax",
    ),
    (
        "publish-qos2-dup-retain",
        Publish("a", b"", qos=2, retain=True, dup=True, packet_id=0xFFFF),
        b"\x3d\x05\x00\x01a\xff\xff",
    ),
    ("puback", Puback(1), b"\x40\x02\x00\x01"),
    ("pubrec", Pubrec(0x1234), b"\x50\x02\x12\x34"),
    ("pubrel", Pubrel(2), b"\x62\x02\x00\x02"),
    ("pubcomp", Pubcomp(3), b"\x70\x02\x00\x03"),
    (
        "subscribe",
        Subscribe(7, [Subscription("a/+", 1), Subscription("#", 2), Subscription("x", 0)]),
        b"\x82\x10\x00\x07" + s("a/+") + b"\x01" + s("#") + b"\x02" + s("x") + b"\x00",
    ),
    ("suback", Suback(7, [1, 2, 0, 0x80]), b"\x90\x06\x00\x07\x01\x02\x00\x80"),
    (
        "unsubscribe",
        Unsubscribe(9, ["a/+", "b"]),
        b"\xa2\x0a\x00\x09" + s("a/+") + s("b"),
    ),
    ("unsuback", Unsuback(9), b"\xb0\x02\x00\x09"),
    ("pingreq", Pingreq(), b"\xc0\x00"),
    ("pingresp", Pingresp(), b"\xd0\x00"),
    ("disconnect", Disconnect(), b"\xe0\x00"),
]


@pytest.mark.parametrize(
    ("packet", "wire"),
    [(p, w) for _, p, w in ROUND_TRIP_311],
    ids=[n for n, _, _ in ROUND_TRIP_311],
)
def test_every_packet_type_encodes_to_the_expected_bytes(packet: Packet, wire: bytes) -> None:
    assert encode(packet) == wire


@pytest.mark.parametrize(
    ("packet", "wire"),
    [(p, w) for _, p, w in ROUND_TRIP_311],
    ids=[n for n, _, _ in ROUND_TRIP_311],
)
def test_every_packet_type_decodes_from_its_bytes(packet: Packet, wire: bytes) -> None:
    assert decode_one(wire) == packet


def test_encode_rejects_objects_that_are_not_packets() -> None:
    with pytest.raises(TypeError):
        encode("PINGREQ")  # type: ignore[arg-type]


# --- fixed header ----------------------------------------------------------------------------


@pytest.mark.parametrize("first", [0x00, 0x0F, 0xF0, 0xFF])
def test_reserved_packet_types_0_and_15_are_rejected(first: int) -> None:
    assert rule_of(bytes((first, 0))) == "invalid-packet-type"


@pytest.mark.parametrize(
    "first",
    [
        0x11,
        0x18,
        0x21,
        0x41,
        0x58,
        0x60,
        0x63,
        0x72,
        0x80,
        0x83,
        0x92,
        0xA0,
        0xAA,
        0xB4,
        0xC1,
        0xD2,
        0xE8,
    ],
)
def test_wrong_reserved_flags_in_fixed_header_are_rejected_MQTT_2_2_2_1(first: int) -> None:
    assert rule_of(bytes((first, 0))) == "MQTT-2.2.2-1"


def test_pubrel_subscribe_unsubscribe_need_flags_0010_MQTT_2_2_2_1() -> None:
    assert rule_of(b"\x60\x02\x00\x01") == "MQTT-2.2.2-1"
    assert rule_of(b"\x80\x06\x00\x01" + s("a") + b"\x00") == "MQTT-2.2.2-1"
    assert rule_of(b"\xa0\x05\x00\x01" + s("a")) == "MQTT-2.2.2-1"


def test_bad_first_byte_is_rejected_before_the_rest_arrives_MQTT_2_2_2_1() -> None:
    decoder = Decoder()
    decoder.feed(b"\x41")
    with pytest.raises(MQTTProtocolError) as info:
        decoder.packets()
    assert info.value.rule == "MQTT-2.2.2-1"


@pytest.mark.parametrize(
    ("length", "encoded"),
    [
        (3, b"\x03"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (16_383, b"\xff\x7f"),
        (16_384, b"\x80\x80\x01"),
        (2_097_151, b"\xff\xff\x7f"),
        (2_097_152, b"\x80\x80\x80\x01"),
    ],
)
def test_remaining_length_uses_1_to_4_byte_variable_length_encoding(
    length: int, encoded: bytes
) -> None:
    payload = b"p" * (length - 3)  # topic "t" takes 3 bytes
    wire = encode_publish("t", payload, 0)
    assert wire[: 1 + len(encoded)] == b"\x30" + encoded
    assert len(wire) == 1 + len(encoded) + length
    assert decode_one(wire) == Publish("t", payload)


def test_largest_remaining_length_268435455_is_read_from_four_bytes() -> None:
    decoder = Decoder(max_packet_size=1000)
    decoder.feed(b"\x30\xff\xff\xff\x7f")
    with pytest.raises(PacketTooLarge) as info:
        decoder.packets()
    assert info.value.size == 5 + 268_435_455


def test_remaining_length_of_five_bytes_is_malformed() -> None:
    assert rule_of(b"\x30\xff\xff\xff\xff\x01") == "malformed-remaining-length"


def test_malformed_remaining_length_is_reported_at_the_fourth_continuation_byte() -> None:
    decoder = Decoder()
    decoder.feed(b"\x30\x80\x80\x80")
    assert decoder.packets() == []
    decoder.feed(b"\x80")
    with pytest.raises(MQTTProtocolError) as info:
        decoder.packets()
    assert info.value.rule == "malformed-remaining-length"


def test_incomplete_remaining_length_waits_for_more_bytes() -> None:
    decoder = Decoder()
    decoder.feed(b"\x30\x80")
    assert decoder.next_packet() is None
    decoder.feed(b"\x01" + s("t") + b"p" * 125)
    assert decoder.next_packet() == Publish("t", b"p" * 125)


# --- max packet size -------------------------------------------------------------------------


def test_packet_larger_than_max_packet_size_is_rejected_from_the_header_alone() -> None:
    decoder = Decoder(max_packet_size=100)
    decoder.feed(b"\x30\xe8\x07")  # remaining length 1000, no body yet
    with pytest.raises(PacketTooLarge) as info:
        decoder.packets()
    assert (info.value.size, info.value.limit) == (1003, 100)


def test_packet_of_exactly_max_packet_size_is_accepted() -> None:
    wire = encode_publish("t", b"x" * 10, 0)
    assert decode_all(wire, max_packet_size=len(wire)) == [Publish("t", b"x" * 10)]
    with pytest.raises(PacketTooLarge):
        decode_all(wire, max_packet_size=len(wire) - 1)


def test_max_packet_size_applies_to_every_packet_type() -> None:
    with pytest.raises(PacketTooLarge):
        decode_all(b"\xc0\x00", max_packet_size=1)


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


# --- CONNECT ---------------------------------------------------------------------------------


def test_connect_sets_the_decoder_protocol_level() -> None:
    decoder = Decoder()
    decoder.protocol_level = 5
    decoder.feed(b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00")
    assert decoder.packets() == [Connect(client_id="")]
    assert decoder.protocol_level == 4


def test_connect_with_mqisdp_level_3_decodes_as_mqtt_3_1() -> None:
    decoder = Decoder()
    decoder.feed(frame(0x10, connect_body(0x02, s("old"), name="MQIsdp", level=3)))
    assert decoder.packets() == [Connect("old", protocol_level=3, protocol_name="MQIsdp")]
    assert decoder.protocol_level == 3


@pytest.mark.parametrize("name", ["MQTX", "mqtt", "", "MQIsdp3", "MQ"])
def test_connect_with_wrong_protocol_name_is_rejected_MQTT_3_1_2_1(name: str) -> None:
    assert rule_of(frame(0x10, connect_body(0x02, s("c"), name=name))) == "MQTT-3.1.2-1"


@pytest.mark.parametrize("level", [0, 1, 2, 6, 7, 255])
def test_connect_with_unknown_protocol_level_decodes_so_broker_can_refuse_MQTT_3_1_2_2(
    level: int,
) -> None:
    decoder = Decoder()
    decoder.feed(frame(0x10, connect_body(0x02, s("c"), level=level)))
    packet = decoder.next_packet()
    assert isinstance(packet, Connect)
    assert (packet.protocol_level, packet.protocol_name) == (level, "MQTT")
    assert decoder.protocol_level == 4  # unchanged: the level is not supported


def test_connect_with_unknown_level_and_unparseable_rest_still_decodes_MQTT_3_1_2_2() -> None:
    packet = decode_one(frame(0x10, s("MQTT") + b"\x09\xff\xff"))
    assert packet == Connect(client_id="", protocol_level=9, protocol_name="MQTT")


def test_connect_with_level_3_but_name_mqtt_is_an_unsupported_pair_MQTT_3_1_2_2() -> None:
    decoder = Decoder()
    decoder.feed(frame(0x10, connect_body(0x02, s("c"), name="MQTT", level=3)))
    assert decoder.packets() == [Connect("c", protocol_level=3, protocol_name="MQTT")]
    assert decoder.protocol_level == 4


def test_connect_with_reserved_flag_set_is_rejected_MQTT_3_1_2_3() -> None:
    assert rule_of(frame(0x10, connect_body(0x03, s("c")))) == "MQTT-3.1.2-3"


def test_connect_will_qos_without_will_flag_is_rejected_MQTT_3_1_2_13() -> None:
    assert rule_of(frame(0x10, connect_body(0x0A, s("c")))) == "MQTT-3.1.2-13"


def test_connect_will_retain_without_will_flag_is_rejected_MQTT_3_1_2_15() -> None:
    assert rule_of(frame(0x10, connect_body(0x22, s("c")))) == "MQTT-3.1.2-15"


def test_connect_will_qos_3_is_rejected_MQTT_3_1_2_14() -> None:
    body = connect_body(0x1E, s("c") + s("w") + s(b"m"))
    assert rule_of(frame(0x10, body)) == "MQTT-3.1.2-14"


def test_connect_password_without_username_is_rejected_MQTT_3_1_2_22() -> None:
    assert rule_of(frame(0x10, connect_body(0x42, s("c") + s(b"pw")))) == "MQTT-3.1.2-22"


def test_connect_will_fields_present_iff_will_flag_MQTT_3_1_3_1() -> None:
    # will flag set but no will topic / message: the packet ends early
    assert rule_of(frame(0x10, connect_body(0x06, s("c")))) == "malformed-packet"
    assert rule_of(frame(0x10, connect_body(0x06, s("c") + s("w")))) == "malformed-packet"
    # will flag clear but will fields present: trailing bytes
    assert rule_of(frame(0x10, connect_body(0x02, s("c") + s("w") + s(b"m")))) == (
        "malformed-packet"
    )


def test_connect_username_and_password_present_iff_flags_MQTT_3_1_2_18_to_21() -> None:
    assert rule_of(frame(0x10, connect_body(0x82, s("c")))) == "malformed-packet"
    assert rule_of(frame(0x10, connect_body(0xC2, s("c") + s("u")))) == "malformed-packet"
    assert rule_of(frame(0x10, connect_body(0x02, s("c") + s("u")))) == "malformed-packet"


def test_connect_with_trailing_bytes_is_malformed() -> None:
    assert rule_of(frame(0x10, connect_body(0x02, s("c") + b"\x00"))) == "malformed-packet"


def test_connect_without_client_id_field_is_malformed_MQTT_3_1_3_3() -> None:
    assert rule_of(frame(0x10, connect_body(0x02, b""))) == "malformed-packet"


def test_connect_truncated_in_variable_header_is_malformed() -> None:
    assert rule_of(frame(0x10, s("MQTT"))) == "malformed-packet"
    assert rule_of(frame(0x10, s("MQTT") + b"\x04\x02\x00")) == "malformed-packet"
    assert rule_of(frame(0x10, s("MQ"))) == "MQTT-3.1.2-1"
    assert rule_of(frame(0x10, b"\x00\x04MQ")) == "malformed-packet"


def test_connect_with_zero_length_client_id_decodes_MQTT_3_1_3_6() -> None:
    assert decode_one(frame(0x10, connect_body(0x00, s("")))) == Connect("", clean_session=False)


def test_connect_client_id_with_ill_formed_utf8_is_rejected_MQTT_1_5_3_1() -> None:
    assert rule_of(frame(0x10, connect_body(0x02, s(b"\xed\xa0\x80")))) == "MQTT-1.5.3-1"


def test_connect_username_with_null_is_rejected_MQTT_1_5_3_2() -> None:
    assert rule_of(frame(0x10, connect_body(0x82, s("c") + s(b"u\x00")))) == "MQTT-1.5.3-2"


def test_connect_will_topic_with_wildcard_is_rejected_MQTT_4_7_1_1() -> None:
    body = connect_body(0x06, s("c") + s("w/#") + s(b"m"))
    assert rule_of(frame(0x10, body)) == "MQTT-4.7.1-1"


def test_connect_with_empty_will_topic_is_rejected_MQTT_4_7_3_1() -> None:
    body = connect_body(0x06, s("c") + s("") + s(b"m"))
    assert rule_of(frame(0x10, body)) == "MQTT-4.7.3-1"


def test_connect_password_is_binary_and_may_be_empty() -> None:
    packet = decode_one(frame(0x10, connect_body(0xC2, s("c") + s("u") + s(b""))))
    assert packet == Connect("c", username="u", password=b"")


def test_connect_keepalive_is_big_endian_16_bit() -> None:
    packet = decode_one(frame(0x10, connect_body(0x02, s("c"), keepalive=0xFFFF)))
    assert isinstance(packet, Connect) and packet.keepalive == 65535


def test_encode_connect_rejects_password_without_username_MQTT_3_1_2_22() -> None:
    with pytest.raises(MQTTProtocolError) as info:
        encode(Connect("c", password=b"x"))
    assert info.value.rule == "MQTT-3.1.2-22"


def test_encode_connect_rejects_will_qos_3_MQTT_3_1_2_14() -> None:
    with pytest.raises(MQTTProtocolError) as info:
        encode(Connect("c", will=Will("w", b"", qos=3)))
    assert info.value.rule == "MQTT-3.1.2-14"


def test_encode_rejects_strings_with_null_MQTT_1_5_3_2() -> None:
    with pytest.raises(MQTTProtocolError) as info:
        encode(Connect("a\x00b"))
    assert info.value.rule == "MQTT-1.5.3-2"


def test_encode_rejects_strings_with_surrogates_MQTT_1_5_3_1() -> None:
    with pytest.raises(MQTTProtocolError) as info:
        encode(Connect("a\ud800"))
    assert info.value.rule == "MQTT-1.5.3-1"


def test_encode_rejects_strings_over_65535_bytes() -> None:
    with pytest.raises(MQTTProtocolError) as info:
        encode(Connect("x" * 65536))
    assert info.value.rule == "string-too-long"


# --- CONNACK ---------------------------------------------------------------------------------


def test_connack_with_wrong_remaining_length_is_malformed() -> None:
    assert rule_of(b"\x20\x03\x00\x00\x00") == "malformed-packet"
    assert rule_of(b"\x20\x01\x00") == "malformed-packet"


def test_connack_reserved_acknowledge_flags_must_be_0() -> None:
    assert rule_of(b"\x20\x02\x02\x00") == "connack-reserved-flags"


def test_connack_return_codes_above_5_are_reserved() -> None:
    assert rule_of(b"\x20\x02\x00\x06") == "connack-return-code"
    with pytest.raises(MQTTProtocolError):
        encode(Connack(6))


def test_connack_session_present_with_error_code_is_rejected_MQTT_3_2_2_4() -> None:
    assert rule_of(b"\x20\x02\x01\x05") == "MQTT-3.2.2-4"
    with pytest.raises(MQTTProtocolError) as info:
        encode(Connack(1, session_present=True))
    assert info.value.rule == "MQTT-3.2.2-4"


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


# --- SUBSCRIBE / SUBACK ----------------------------------------------------------------------


def test_subscribe_without_filters_is_rejected_MQTT_3_8_3_3() -> None:
    assert rule_of(b"\x82\x02\x00\x01") == "MQTT-3.8.3-3"
    with pytest.raises(MQTTProtocolError) as info:
        encode(Subscribe(1, []))
    assert info.value.rule == "MQTT-3.8.3-3"


@pytest.mark.parametrize("qos_byte", [0x03, 0x04, 0x40, 0x80, 0xFC, 0x81])
def test_subscribe_requested_qos_byte_must_be_0_to_2_MQTT_3_8_3_4(qos_byte: int) -> None:
    assert rule_of(frame(0x82, b"\x00\x01" + s("a") + bytes((qos_byte,)))) == "MQTT-3-8.3-4"


def test_subscribe_filter_without_qos_byte_is_malformed() -> None:
    assert rule_of(frame(0x82, b"\x00\x01" + s("a"))) == "malformed-packet"
    assert rule_of(frame(0x82, b"\x00\x01" + s("a") + b"\x00" + s("b"))) == "malformed-packet"


def test_subscribe_with_empty_filter_is_rejected_MQTT_4_7_3_1() -> None:
    assert rule_of(frame(0x82, b"\x00\x01" + s("") + b"\x00")) == "MQTT-4.7.3-1"


def test_subscribe_with_packet_id_0_is_rejected_MQTT_2_3_1_1() -> None:
    assert rule_of(frame(0x82, b"\x00\x00" + s("a") + b"\x00")) == "MQTT-2.3.1-1"


def test_subscribe_filter_with_ill_formed_utf8_is_rejected_MQTT_1_5_3_1() -> None:
    assert rule_of(frame(0x82, b"\x00\x01" + s(b"\xff") + b"\x00")) == "MQTT-1.5.3-1"


def test_subscribe_filter_with_misplaced_wildcards_decodes_for_the_broker_to_refuse() -> None:
    # The broker validates wildcard placement itself and answers 0x80 in SUBACK.
    packet = decode_one(frame(0x82, b"\x00\x01" + s("a/b#") + b"\x01" + s("a+") + b"\x00"))
    assert packet == Subscribe(1, [Subscription("a/b#", 1), Subscription("a+", 0)])


def test_suback_with_reserved_return_code_is_rejected_MQTT_3_9_3_2() -> None:
    assert rule_of(b"\x90\x03\x00\x01\x03") == "MQTT-3.9.3-2"
    assert rule_of(b"\x90\x03\x00\x01\x81") == "MQTT-3.9.3-2"
    with pytest.raises(MQTTProtocolError) as info:
        encode(Suback(1, [3]))
    assert info.value.rule == "MQTT-3.9.3-2"


def test_suback_without_return_codes_is_malformed() -> None:
    assert rule_of(b"\x90\x02\x00\x01") == "malformed-packet"


def test_suback_with_packet_id_0_is_rejected_MQTT_2_3_1_1() -> None:
    assert rule_of(b"\x90\x03\x00\x00\x00") == "MQTT-2.3.1-1"


# --- UNSUBSCRIBE / UNSUBACK ------------------------------------------------------------------


def test_unsubscribe_without_filters_is_rejected_MQTT_3_10_3_2() -> None:
    assert rule_of(b"\xa2\x02\x00\x01") == "MQTT-3.10.3-2"
    with pytest.raises(MQTTProtocolError) as info:
        encode(Unsubscribe(1, []))
    assert info.value.rule == "MQTT-3.10.3-2"


def test_unsubscribe_with_packet_id_0_is_rejected_MQTT_2_3_1_1() -> None:
    assert rule_of(frame(0xA2, b"\x00\x00" + s("a"))) == "MQTT-2.3.1-1"


def test_unsubscribe_with_empty_filter_is_rejected_MQTT_4_7_3_1() -> None:
    assert rule_of(frame(0xA2, b"\x00\x01" + s(""))) == "MQTT-4.7.3-1"


def test_unsubscribe_with_truncated_filter_is_malformed() -> None:
    assert rule_of(frame(0xA2, b"\x00\x01" + s("ab")[:-1])) == "malformed-packet"
    assert rule_of(frame(0xA2, b"\x00\x01" + s("a") + b"\x00")) == "malformed-packet"


def test_unsuback_remaining_length_must_be_2_in_mqtt_3_1_1() -> None:
    assert rule_of(b"\xb0\x03\x00\x01\x00") == "malformed-packet"
    assert rule_of(b"\xb0\x02\x00\x00") == "MQTT-2.3.1-1"


# --- PINGREQ / PINGRESP / DISCONNECT ---------------------------------------------------------


@pytest.mark.parametrize("first", [0xC0, 0xD0, 0xE0])
def test_ping_and_disconnect_must_have_remaining_length_0(first: int) -> None:
    assert rule_of(bytes((first, 1, 0))) == "malformed-packet"


# --- Decoder behaviour -----------------------------------------------------------------------


def test_many_packets_in_one_read_are_all_returned_in_order() -> None:
    wires = [w for _, _, w in ROUND_TRIP_311 if not w.startswith(b"\x10")]
    packets = [p for _, p, w in ROUND_TRIP_311 if not w.startswith(b"\x10")]
    assert decode_all(b"".join(wires)) == packets


def test_one_packet_split_over_many_reads_is_returned_once_complete() -> None:
    decoder = Decoder()
    for byte in CONNECT_FULL[:-1]:
        decoder.feed(bytes((byte,)))
        assert decoder.packets() == []
    decoder.feed(CONNECT_FULL[-1:])
    [packet] = decoder.packets()
    assert isinstance(packet, Connect) and packet.username == "user"
    assert decoder.packets() == []
    assert decoder.buffered == 0


def test_next_packet_returns_packets_one_at_a_time() -> None:
    decoder = Decoder()
    decoder.feed(b"\xc0\x00\xd0\x00\xe0")
    assert decoder.next_packet() == Pingreq()
    assert decoder.next_packet() == Pingresp()
    assert decoder.next_packet() is None
    decoder.feed(b"\x00")
    assert decoder.next_packet() == Disconnect()
    assert decoder.next_packet() is None


def test_feed_accepts_bytearray_and_memoryview_and_ignores_empty_data() -> None:
    decoder = Decoder()
    decoder.feed(b"")
    decoder.feed(bytearray(b"\xc0"))
    decoder.feed(memoryview(b"\x00\xd0\x00"))
    assert decoder.packets() == [Pingreq(), Pingresp()]


def test_large_packet_in_many_small_reads_decodes() -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB
    wire = encode_publish("big/topic", payload, 2, packet_id=9) + b"\xc0\x00"
    decoder = Decoder()
    got: list[Packet] = []
    for offset in range(0, len(wire), 1500):
        decoder.feed(wire[offset : offset + 1500])
        got.extend(decoder.packets())
    assert got == [Publish("big/topic", payload, 2, packet_id=9), Pingreq()]
    assert decoder.buffered == 0


def test_buffered_counts_undecoded_bytes() -> None:
    decoder = Decoder()
    decoder.feed(b"\x30\x0a\x00\x03a/b")
    assert decoder.packets() == []
    decoder.feed(b"he")
    assert decoder.buffered == 9
    decoder.feed(b"llo\xc0")
    assert decoder.packets() == [Publish("a/b", b"hello")]
    assert decoder.buffered == 1


def test_error_carries_packets_decoded_before_it_in_the_same_call() -> None:
    decoder = Decoder()
    decoder.feed(b"\xc0\x00" + encode_publish("t", b"x", 0) + b"\x41\x02\x00\x01")
    with pytest.raises(MQTTProtocolError) as info:
        decoder.packets()
    assert info.value.rule == "MQTT-2.2.2-1"
    assert info.value.packets == [Pingreq(), Publish("t", b"x")]


def test_decoder_stays_failed_after_an_error() -> None:
    decoder = Decoder()
    decoder.feed(b"\x00")
    with pytest.raises(MQTTProtocolError) as first:
        decoder.packets()
    decoder.feed(b"\xc0\x00")
    with pytest.raises(MQTTProtocolError) as second:
        decoder.next_packet()
    assert second.value is first.value


def test_protocol_level_set_by_connect_applies_to_following_packets_in_the_same_read() -> None:
    connect5 = frame(0x10, connect_body(0x02, b"\x00" + s("c"), level=5))
    publish5 = frame(0x30, s("t") + b"\x03\x23\x00\x07" + b"data")  # topic alias 7
    decoder = Decoder()
    decoder.feed(connect5 + publish5)
    packets = decoder.packets()
    assert decoder.protocol_level == 5
    assert packets[1] == Publish("t", b"data", properties={0x23: 7})
