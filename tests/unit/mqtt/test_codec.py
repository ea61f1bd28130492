"""Byte-level unit tests of the MQTT 3.1.1 codec (bridge.mqtt.codec): framing and the stream.

The error types; every packet type encoded to and decoded from its exact bytes; the fixed
header (packet types, reserved flags, the 1-4 byte remaining length); the maximum packet size;
and the Decoder as a stream reader (many packets per read, one packet over many reads,
buffering, failing for good, the protocol level a CONNECT sets). Each packet type's own rules
are in test_codec_publish.py, test_codec_connect.py and test_codec_subscribe.py.

Test names state the behaviour and cite the normative statement (or the kebab-case rule name
the codec reports when the specification has no id). Hand-built bytes come from codec_bytes.py.
"""

from __future__ import annotations

import pickle

import pytest

from bridge.mqtt.codec import Decoder, encode, encode_publish
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

from .codec_bytes import connect_body, decode_all, decode_one, frame, rule_of, s

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
