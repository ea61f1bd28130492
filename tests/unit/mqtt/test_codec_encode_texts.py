"""What the codec says when it refuses to encode something: the rule, the message and the
reason code (see test_codec_error_texts.py for the decoding side), and the encoders' output at
the edges of each field (lengths of 127 and 128 bytes, 65,535-byte strings, the largest remaining
length). The acknowledgement encoders, built when the codec is imported, are built again here.
"""

from __future__ import annotations

from typing import Any

import pytest

from bridge.mqtt.codec import (
    encode,
    encode_ack5,
    encode_disconnect5,
    encode_property_block_content,
    encode_puback,
    encode_pubcomp,
    encode_publish5,
    encode_pubrec,
    encode_pubrel,
)
from bridge.mqtt.encoder import _encode_ack
from bridge.mqtt.errors import MQTTProtocolError
from bridge.mqtt.fast_encoders import encode_publish, fixed_header
from bridge.mqtt.packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    PacketType,
    Puback,
    Pubcomp,
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
    encode_binary,
    encode_utf8,
    encode_varint,
    read_binary,
    read_utf8,
    read_varint,
)
from bridge.mqtt.property_rules import check_property_values
from bridge.mqtt.topics import validate_topic_name

from .codec_bytes import ACKS, answer_of, frame, s, varint

# -- encoding: what a caller gets for a packet the protocol does not allow ---------------------

# fmt: off
ENCODED: list[Any] = [
    ("protocol level 256", Connect("c", protocol_level=256), 4,
        "0x81 invalid-protocol-level: protocol level 256 not a byte"),
    ("protocol level -1", Connect("c", protocol_level=-1), 4,
        "0x81 invalid-protocol-level: protocol level -1 not a byte"),
    ("keep alive 65536", Connect("c", keepalive=65536), 4,
        "0x81 invalid-keepalive: keep alive 65536 not 16-bit"),
    ("keep alive -1", Connect("c", keepalive=-1), 4,
        "0x81 invalid-keepalive: keep alive -1 not 16-bit"),
    ("3.1.1 password without user", Connect("c", password=b"p"), 4,
        "0x81 MQTT-3.1.2-22: a password needs a user name before MQTT 5.0"),
    ("will QoS 3", Connect("c", will=Will("w", b"", qos=3)), 4,
        "0x81 MQTT-3.1.2-14: will QoS must be 0, 1 or 2, got 3"),
    ("CONNACK code 6", Connack(6), 4,
        "0x81 connack-return-code: CONNACK return code 6 is reserved"),
    ("CONNACK session present with a refusal", Connack(5, session_present=True), 4,
        "0x81 MQTT-3.2.2-4: session present must be 0 with a non-zero return code"),
    ("5.0 CONNACK code 1", Connack(1), 5,
        "0x82 invalid-reason-code: CONNACK reason code 1 is not defined"),
    ("SUBSCRIBE without filters", Subscribe(1, []), 4,
        "0x82 MQTT-3.8.3-3: SUBSCRIBE must contain at least one filter"),
    ("SUBSCRIBE empty filter", Subscribe(1, [Subscription("")]), 4,
        "0x81 MQTT-4.7.3-1: topic filter must not be empty"),
    ("SUBSCRIBE QoS 3", Subscribe(1, [Subscription("a", 3)]), 4,
        "0x81 MQTT-3-8.3-4: requested QoS must be 0..2, got 3"),
    ("SUBSCRIBE QoS -1", Subscribe(1, [Subscription("a", -1)]), 4,
        "0x81 MQTT-3-8.3-4: requested QoS must be 0..2, got -1"),
    ("SUBSCRIBE id 0", Subscribe(0, [Subscription("a")]), 4,
        "0x81 MQTT-2.3.1-1: SUBSCRIBE needs a packet identifier in 1..65535, got 0"),
    ("5.0 SUBSCRIBE retain handling 3", Subscribe(1, [Subscription("a", retain_handling=3)]), 5,
        "0x82 invalid-subscription-options: retain handling must be 0..2, got 3"),
    ("5.0 shared SUBSCRIBE with No Local",
        Subscribe(1, [Subscription("$share/g/a", no_local=True)]), 5,
        "0x82 MQTT-3.8.3-4: No Local must not be set on a shared subscription"),
    ("SUBACK without codes", Suback(1, []), 4,
        "0x81 malformed-packet: SUBACK must contain at least one return code"),
    ("3.1.1 SUBACK code 0x87", Suback(1, [0x87]), 4,
        "0x82 MQTT-3.9.3-2: SUBACK return code 135 is reserved"),
    ("SUBACK id 0", Suback(0, [0]), 4,
        "0x81 MQTT-2.3.1-1: SUBACK needs a packet identifier in 1..65535, got 0"),
    ("UNSUBSCRIBE without filters", Unsubscribe(1, []), 4,
        "0x82 MQTT-3.10.3-2: UNSUBSCRIBE must contain at least one filter"),
    ("UNSUBSCRIBE empty filter", Unsubscribe(1, [""]), 4,
        "0x81 MQTT-4.7.3-1: topic filter must not be empty"),
    ("UNSUBSCRIBE id 70000", Unsubscribe(70000, ["a"]), 4,
        "0x81 MQTT-2.3.1-1: UNSUBSCRIBE needs a packet identifier in 1..65535, got 70000"),
    ("UNSUBACK id 0", Unsuback(0), 4,
        "0x81 MQTT-2.3.1-1: UNSUBACK needs a packet identifier in 1..65535, got 0"),
    ("5.0 UNSUBACK code 1", Unsuback(1, [1]), 5,
        "0x82 invalid-reason-code: UNSUBACK reason code 1 is not defined"),
    ("PUBACK id 0", Puback(0), 4,
        "0x81 MQTT-2.3.1-1: PUBACK needs a packet identifier in 1..65535, got 0"),
    ("PUBREL id 65536", Pubrel(65536), 4,
        "0x81 MQTT-2.3.1-1: PUBREL needs a packet identifier in 1..65535, got 65536"),
    ("5.0 PUBREC reason 1", Pubrec(1, 1), 5,
        "0x82 invalid-reason-code: PUBREC reason code 1 is not defined"),
    ("AUTH in 3.1.1", Auth(), 4,
        "0x81 invalid-packet-type: AUTH exists only in MQTT 5.0"),
    ("AUTH reason 1", Auth(1), 5,
        "0x82 invalid-reason-code: AUTH reason code 1 is not defined"),
    ("5.0 DISCONNECT reason 1", Disconnect(1), 5,
        "0x82 invalid-reason-code: DISCONNECT reason code 1 is not defined"),
    ("unknown property", Disconnect(0, {0x7F: 1}), 5,
        "0x81 invalid-property: property 0x7F is not allowed in DISCONNECT"),
]
# fmt: on


@pytest.mark.parametrize(
    ("packet", "level", "answer"),
    [pytest.param(packet, level, answer, id=what) for what, packet, level, answer in ENCODED],
)
def test_encoding_a_packet_the_protocol_forbids_names_the_rule(
    packet: Packet, level: int, answer: str
) -> None:
    with pytest.raises(MQTTProtocolError) as refused:
        encode(packet, level)
    assert answer_of(refused.value) == answer
    assert refused.value.packets == []


# what is called -> reason code and log text
# fmt: off
REFUSED_BY_FAST_ENCODERS: list[Any] = [
    (lambda: encode_puback(0),
        "0x81 MQTT-2.3.1-1: PUBACK needs a packet identifier in 1..65535, got 0"),
    (lambda: encode_pubrec(65536),
        "0x81 MQTT-2.3.1-1: PUBREC needs a packet identifier in 1..65535, got 65536"),
    (lambda: encode_pubrel(-1),
        "0x81 MQTT-2.3.1-1: PUBREL needs a packet identifier in 1..65535, got -1"),
    (lambda: encode_pubcomp(65536),
        "0x81 MQTT-2.3.1-1: PUBCOMP needs a packet identifier in 1..65535, got 65536"),
    (lambda: encode_ack5(PacketType.PUBACK, 1, 0x01, {}),
        "0x82 invalid-reason-code: PUBACK reason code 1 is not defined"),
    (lambda: encode_disconnect5(0x01),
        "0x82 invalid-reason-code: DISCONNECT reason code 1 is not defined"),
    (lambda: encode_disconnect5(0x00, {0x7F: 1}),
        "0x81 invalid-property: property 0x7F is not allowed in DISCONNECT"),
    (lambda: encode_publish5("a", b"", 1, False, False, 0),
        "0x81 MQTT-2.3.1-1: PUBLISH needs a packet identifier in 1..65535, got 0"),
    (lambda: encode_varint(-1),
        "0x81 malformed-variable-byte-integer: negative value -1"),
    (lambda: encode_varint(268_435_456),
        "0x81 malformed-variable-byte-integer: 268435456 does not fit a Variable Byte Integer"),
    (lambda: encode_property_block_content({0x7F: 1}),
        "0x81 invalid-property: unknown property 0x7F"),
    (lambda: encode_property_block_content({0x26: ("k", "v")}),
        "0x81 invalid-property: repeatable property 0x26 needs a list"),
    (lambda: encode_property_block_content({0x21: "x"}),
        "0x81 invalid-property: property 0x21 needs an int, got 'x'"),
    (lambda: encode_property_block_content({0x21: 65536}),
        "0x81 invalid-property: property 0x21 needs an int, got 65536"),
    (lambda: encode_property_block_content({0x1F: 1}),
        "0x81 invalid-property: property 0x1F needs a str, got 1"),
    (lambda: encode_property_block_content({0x09: "x"}),
        "0x81 invalid-property: property 0x09 needs bytes, got 'x'"),
    (lambda: encode_property_block_content({0x26: [("k",)]}),
        "0x81 invalid-property: property 0x26 needs a (name, value) pair"),
    (lambda: encode_property_block_content({0x26: ["kv"]}),
        "0x81 invalid-property: property 0x26 needs a (name, value) pair"),
]
# fmt: on


@pytest.mark.parametrize(("call", "answer"), REFUSED_BY_FAST_ENCODERS)
def test_the_fast_encoders_refuse_what_encode_refuses(call: Any, answer: str) -> None:
    with pytest.raises(MQTTProtocolError) as refused:
        call()
    assert answer_of(refused.value) == answer


def test_the_fast_encoders_write_big_endian_ids_and_lengths_past_one_byte() -> None:
    assert encode_puback(0x1234) == b"\x40\x02\x12\x34"
    assert encode_pubrec(0xFFFF) == b"\x50\x02\xff\xff"
    assert encode_pubrel(0x0102) == b"\x62\x02\x01\x02"
    assert encode_pubcomp(0x0201) == b"\x70\x02\x02\x01"
    assert encode(Puback(0x1234), 4) == b"\x40\x02\x12\x34"
    assert encode(Puback(0x1234, 0x10), 5) == b"\x40\x03\x12\x34\x10"
    # Each length on both sides of the one-byte Variable Byte Integer (127 and 128).
    for qos, packet_id in ((0, None), (1, 0x0102)):
        id_bytes = b"\x01\x02" if packet_id else b""
        for value_size in (62, 63):  # a property block of 127, then 128 bytes
            block = encode_property_block_content({0x26: [("k" * 60, "v" * value_size)]})
            data = encode_publish5("t" * 0x101, b"p", qos, False, False, packet_id, block)
            body = s("t" * 0x101) + id_bytes + varint(len(block)) + block + b"p"
            assert data == frame(0x30 | qos << 1, body), (qos, len(block))
        for payload_size in (123, 124):  # a remaining length of 127, then 128 (QoS 0)
            payload = b"p" * (payload_size - len(id_bytes))
            data = encode_publish5("t", payload, qos, False, False, packet_id, b"")
            assert data == frame(0x30 | qos << 1, s("t") + id_bytes + b"\x00" + payload)


def test_encode_accepts_each_field_up_to_its_edges() -> None:
    # A client may send any protocol level byte (the server answers an unknown one with
    # CONNACK 0x01); keep alive is any 16-bit value.
    for level in (0, 255):
        assert encode(Connect("c", protocol_level=level))[8] == level
    for keepalive in (0, 0xFFFF):
        assert encode(Connect("c", keepalive=keepalive))[10:12] == keepalive.to_bytes(2, "big")
    assert encode(Connect("c", will=Will("w", b"", qos=2)))[9] == 0x02 | 0x04 | 0x10
    assert encode(Connack(5), 4) == b"\x20\x02\x00\x05"
    assert encode(Suback(0xFFFF, [0x80]), 4) == b"\x90\x03\xff\xff\x80"
    assert encode(Suback(1, [0x87]), 5) == b"\x90\x04\x00\x01\x00\x87"
    assert encode(Subscribe(1, [Subscription("a", 2)]), 4) == frame(
        0x82, b"\x00\x01" + s("a") + b"\x02"
    )
    assert encode(Subscribe(1, [Subscription("a", retain_handling=2)]), 5) == frame(
        0x82, b"\x00\x01\x00" + s("a") + b"\x20"
    )


@pytest.mark.parametrize(("cls", "packet_type", "what"), ACKS, ids=[a[2] for a in ACKS])
def test_an_acknowledgement_encoder_writes_the_short_form_below_5_and_the_reason_from_5(
    cls: Any, packet_type: int, what: str
) -> None:
    first = {Puback: 0x40, Pubrec: 0x50, Pubrel: 0x62, Pubcomp: 0x70}[cls]
    encode_one = _encode_ack(packet_type, what)
    code = 0x92 if packet_type in (PacketType.PUBREL, PacketType.PUBCOMP) else 0x10
    assert encode_one(cls(0x1234), 4) == bytes((first, 2, 0x12, 0x34))
    assert encode_one(cls(0x1234, code, {}), 4) == bytes((first, 2, 0x12, 0x34))
    assert encode_one(cls(0x1234), 5) == bytes((first, 2, 0x12, 0x34))
    assert encode_one(cls(0x1234, code, {}), 5) == bytes((first, 3, 0x12, 0x34, code))
    with_reason = encode_one(cls(7, code, {0x1F: "why"}), 5)
    assert with_reason == frame(first, b"\x00\x07" + bytes((code, 6, 0x1F)) + s("why"))
    with pytest.raises(MQTTProtocolError) as refused:
        encode_one(cls(0), 4)
    assert answer_of(refused.value) == (
        f"0x81 MQTT-2.3.1-1: {what} needs a packet identifier in 1..65535, got 0"
    )


# what is called -> reason code and log text
# fmt: off
REFUSED_FIELDS: list[Any] = [
    (lambda: encode_utf8("a\ud800"),
        "0x81 MQTT-1.5.3-1: string contains a surrogate code point"),
    (lambda: encode_utf8("a\x00"),
        "0x81 MQTT-1.5.3-2: string contains U+0000"),
    (lambda: encode_utf8("x" * 65536),
        "0x81 string-too-long: UTF-8 string of 65536 bytes exceeds 65535 bytes"),
    (lambda: encode_binary(b"x" * 65536),
        "0x81 binary-too-long: binary data of 65536 bytes exceeds 65535 bytes"),
    (lambda: read_utf8(b"\x00", 0, 1),
        "0x81 malformed-packet: UTF-8 string length runs past the end of the packet"),
    (lambda: read_utf8(b"\x00\x05ab", 0, 4),
        "0x81 malformed-packet: UTF-8 string runs past the end of the packet"),
    (lambda: read_utf8(b"\x00\x01\xff", 0, 3),
        "0x81 MQTT-1.5.3-1: ill-formed UTF-8 string"),
    (lambda: read_utf8(b"\x00\x01\x00", 0, 3),
        "0x81 MQTT-1.5.3-2: UTF-8 string contains U+0000"),
    (lambda: read_binary(b"\x00", 0, 1),
        "0x81 malformed-packet: binary data length runs past the end of the packet"),
    (lambda: read_binary(b"\x00\x05ab", 0, 4),
        "0x81 malformed-packet: binary data runs past the end of the packet"),
    (lambda: read_varint(b"\xff\xff\xff\xff\x01", 0, 5),
        "0x81 malformed-variable-byte-integer: Variable Byte Integer longer than 4 bytes"),
    (lambda: read_varint(b"\x80\x80", 0, 2),
        "0x81 malformed-packet: Variable Byte Integer runs past the end of the packet"),
    (lambda: encode_publish("t", b"", 0, dup=True),
        "0x81 MQTT-3.3.1-2: DUP must be 0 in a QoS 0 PUBLISH"),
    (lambda: encode_publish("t", b"", 0, packet_id=1),
        "0x81 MQTT-2.3.1-5: a QoS 0 PUBLISH has no packet identifier"),
    (lambda: encode_publish("t", b"", 3, packet_id=1),
        "0x81 MQTT-3.3.1-4: PUBLISH QoS must be 0, 1 or 2, got 3"),
    (lambda: encode_publish("t" * 65536, b"", 0),
        "0x81 MQTT-4.7.3-3: topic name of 65536 bytes exceeds 65535 bytes"),
    (lambda: fixed_header(0x30, 268_435_456),
        "0x95 packet-too-large: packet of 268435461 bytes exceeds the maximum packet size of "
        "268435460 bytes"),
    (lambda: validate_topic_name("a\ud800"),
        "0x81 MQTT-1.5.3-1: topic name contains a surrogate code point"),
    (lambda: validate_topic_name("\u00e9" * 32768),
        "0x81 MQTT-4.7.3-3: topic name encodes to 65536 bytes, more than 65535"),
    (lambda: check_property_values({0x17: 2}, PacketType.CONNECT),
        "0x82 invalid-property-value: REQUEST_PROBLEM_INFORMATION (0x17) must be 0 or 1, got 2"),
    (lambda: check_property_values({0x21: 0}, PacketType.CONNECT),
        "0x82 invalid-property-value: RECEIVE_MAXIMUM (0x21) must not be 0"),
    (lambda: check_property_values({0x0B: [0]}, PacketType.PUBLISH),
        "0x82 invalid-property-value: SUBSCRIPTION_IDENTIFIER (0x0B) must not be 0"),
    (lambda: check_property_values({0x0B: [1, 2]}, PacketType.SUBSCRIBE),
        "0x82 duplicate-property: SUBSCRIBE may carry only one Subscription Identifier"),
    (lambda: check_property_values({}, PacketType.AUTH),
        "0x82 authentication-method-missing: an AUTH other than the empty short form needs an "
        "Authentication Method"),
    (lambda: check_property_values({0x16: b"x"}, PacketType.CONNECT),
        "0x82 authentication-data-without-method: Authentication Data needs an Authentication "
        "Method"),
]
# fmt: on


@pytest.mark.parametrize(("call", "answer"), REFUSED_FIELDS)
def test_the_field_coders_and_value_rules_name_what_they_refuse(call: Any, answer: str) -> None:
    with pytest.raises(MQTTProtocolError) as refused:
        call()
    assert answer_of(refused.value) == answer


def test_each_field_is_accepted_up_to_its_largest_size() -> None:
    assert encode_utf8("x" * 65535)[:2] == b"\xff\xff"
    assert encode_binary(b"x" * 65535)[:2] == b"\xff\xff"
    assert read_utf8(b"\x01\x00" + b"a" * 256, 0, 258) == ("a" * 256, 258)
    assert read_binary(b"\x01\x00" + b"a" * 256 + b"z", 0, 259) == (b"a" * 256, 258)
    assert encode_publish("t" * 65535, b"", 0)[4:6] == b"\xff\xff"  # after a 4-byte header
    assert fixed_header(0x30, 268_435_455) == b"\x30\xff\xff\xff\x7f"
