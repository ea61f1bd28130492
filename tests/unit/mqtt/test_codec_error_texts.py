"""What the codec says when it refuses bytes it reads: the rule, the message and the reason code.

A refused packet closes the connection with a log line built from `str(error)` ("rule: message")
and, for MQTT 5.0, a CONNACK or DISCONNECT carrying `error.reason_code`. The other codec tests
check which rule a packet breaks; these pin the whole answer an operator reads in the log and a
5.0 client receives, one case per place the decoder refuses something (through the `Decoder`,
and the body decoders on their own where the `Decoder` never calls them). They also check the two
tables built when the codec is imported (the fixed header's first byte and the four
acknowledgement decoders) by building them again here, so a change to the code that builds them
is seen. What the encoders refuse: test_codec_encode_texts.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from bridge.mqtt.body_decoders import BODY_DECODERS, _make_ack_decoder
from bridge.mqtt.codec import Decoder, encode_disconnect5
from bridge.mqtt.decoder import _first_byte_problem
from bridge.mqtt.errors import MQTTProtocolError
from bridge.mqtt.packets import PacketType

from .codec_bytes import ACKS, answer_of, connect_body, decode_one, frame, s


def decodeanswer_of(data: bytes, level: int) -> str:
    decoder = Decoder()  # a server's: its clients may not send Subscription Identifiers
    decoder.protocol_level = level
    decoder.feed(data)
    with pytest.raises(MQTTProtocolError) as refused:
        decoder.packets()
    return answer_of(refused.value)


def _connect5(flags: int, rest: bytes) -> bytes:
    return frame(0x10, s("MQTT") + bytes((5, flags)) + b"\x00\x3c" + rest)


# what is wrong, protocol level, bytes -> reason code and log text
# fmt: off
DECODED: list[Any] = [
    # -- the fixed header
    ("reserved type 0", 4, b"\x00\x00",
        "0x81 invalid-packet-type: packet type 0 is reserved (first byte 0x00)"),
    ("AUTH before 5.0", 4, b"\xf0\x00",
        "0x81 invalid-packet-type: packet type 15 is reserved (first byte 0xF0)"),
    ("QoS 3 PUBLISH", 4, b"\x36\x00",
        "0x81 MQTT-3.3.1-4: PUBLISH must not have QoS 3"),
    ("DUP on QoS 0", 4, b"\x38\x00",
        "0x81 MQTT-3.3.1-2: DUP must be 0 in a QoS 0 PUBLISH"),
    ("PUBREL flags 0", 4, b"\x60\x02\x00\x01",
        "0x81 MQTT-2.2.2-1: reserved flags of PUBREL must be 0b0010, got 0b0000"),
    ("CONNECT flags 1", 4, b"\x11\x00",
        "0x81 MQTT-2.2.2-1: reserved flags of CONNECT must be 0b0000, got 0b0001"),
    ("five-byte remaining length", 4, b"\x30\xff\xff\xff\xff\x01",
        "0x81 malformed-remaining-length: remaining length is longer than 4 bytes"),
    ("AUTH after a 3.1.1 CONNECT in the same read", 4,
        frame(0x10, connect_body(0x02, s("c"))) + b"\xf0\x00",
        "0x81 invalid-packet-type: packet type 15 is reserved (first byte 0xF0)"),
    # -- PUBLISH on the inline path (3.1.1, and 5.0 with no properties)
    ("PUBLISH of one byte", 4, b"\x30\x01\x00",
        "0x81 malformed-packet: UTF-8 string length runs past the end of the packet"),
    ("PUBLISH topic past the end", 4, b"\x30\x03\x00\x05a",
        "0x81 malformed-packet: UTF-8 string runs past the end of the packet"),
    ("PUBLISH topic not UTF-8", 4, frame(0x30, s(b"\xff")),
        "0x81 MQTT-1.5.3-1: ill-formed UTF-8 string"),
    ("PUBLISH empty topic 3.1.1", 4, frame(0x30, s("") + b"x"),
        "0x81 MQTT-4.7.3-1: PUBLISH topic name must not be empty"),
    ("PUBLISH topic with U+0000", 4, frame(0x30, s("a\x00")),
        "0x81 MQTT-1.5.3-2: UTF-8 string contains U+0000"),
    ("PUBLISH topic with +", 4, frame(0x30, s("a/+")),
        "0x81 MQTT-3.3.2-2: PUBLISH topic name must not contain wildcards"),
    ("PUBLISH topic with #", 4, frame(0x30, s("a/#")),
        "0x81 MQTT-3.3.2-2: PUBLISH topic name must not contain wildcards"),
    ("QoS 1 PUBLISH without id", 4, frame(0x32, s("a") + b"\x00"),
        "0x81 malformed-packet: PUBLISH is too short for a packet identifier"),
    ("QoS 1 PUBLISH with id 0", 4, frame(0x32, s("a") + b"\x00\x00"),
        "0x81 MQTT-2.3.1-1: PUBLISH packet identifier must be non-zero"),
    # -- PUBLISH through the full 5.0 decoder
    ("5.0 PUBLISH empty topic, no alias", 5, frame(0x30, s("") + b"\x00x"),
        "0x82 MQTT-4.7.3-1: PUBLISH with an empty topic name needs a Topic Alias"),
    ("5.0 PUBLISH wildcard, properties", 5, frame(0x30, s("a/#") + b"\x02\x01\x01"),
        "0x81 MQTT-3.3.2-2: PUBLISH topic name must not contain wildcards"),
    ("5.0 PUBLISH without property length", 5, frame(0x30, s("a/b")),
        "0x81 malformed-packet: Variable Byte Integer runs past the end of the packet"),
    ("5.0 PUBLISH of two bytes", 5, b"\x30\x02\x00\x00",
        "0x81 malformed-packet: Variable Byte Integer runs past the end of the packet"),
    ("5.0 PUBLISH property length 1", 5, frame(0x30, s("a") + b"\x01\x01"),
        "0x81 malformed-packet: property value runs past the property block"),
    ("5.0 QoS 1 PUBLISH without id", 5, frame(0x32, s("a") + b"\x00"),
        "0x81 malformed-packet: PUBLISH is too short for a packet identifier"),
    ("5.0 PUBLISH from a client with a Subscription Identifier", 5,
        frame(0x30, s("a") + b"\x02\x0b\x01"),
        "0x82 MQTT-3.3.4-6: a PUBLISH from a client must not carry a Subscription Identifier"),
    ("5.0 PUBLISH with a property twice", 5, frame(0x30, s("a") + b"\x04\x01\x01\x01\x01"),
        "0x82 duplicate-property: property 0x01 appears more than once"),
    ("5.0 PUBLISH four-byte property past the block", 5, frame(0x30, s("a") + b"\x03\x02\x00\x00"),
        "0x81 malformed-packet: property value runs past the property block"),
    ("5.0 PUBLISH two-byte property past the block", 5, frame(0x30, s("a") + b"\x02\x23\x00"),
        "0x81 malformed-packet: property value runs past the property block"),
    # -- CONNECT
    ("unknown protocol name", 4, frame(0x10, s("MQTX") + b"\x04\x02\x00\x3c"),
        "0x81 MQTT-3.1.2-1: unknown protocol name 'MQTX'"),
    ("CONNECT without level", 4, frame(0x10, s("MQTT")),
        "0x81 malformed-packet: CONNECT ends before the protocol level"),
    ("CONNECT without flags", 4, frame(0x10, s("MQTT") + b"\x04\x02\x00"),
        "0x81 malformed-packet: CONNECT ends before the connect flags and keep alive"),
    ("CONNECT ends after keep alive", 4, frame(0x10, s("MQTT") + b"\x04\x02\x00\x3c"),
        "0x81 malformed-packet: UTF-8 string length runs past the end of the packet"),
    ("CONNECT reserved flag", 4, frame(0x10, connect_body(0x03, s("c"))),
        "0x81 MQTT-3.1.2-3: reserved flag in CONNECT must be 0"),
    ("will QoS 3", 4, frame(0x10, connect_body(0x1E, s("c") + s("w") + s("p"))),
        "0x81 MQTT-3.1.2-14: will QoS must not be 3"),
    ("will QoS without will", 4, frame(0x10, connect_body(0x0A, s("c"))),
        "0x81 MQTT-3.1.2-13: will QoS must be 0 when the will flag is 0"),
    ("will retain without will", 4, frame(0x10, connect_body(0x22, s("c"))),
        "0x81 MQTT-3.1.2-15: will retain must be 0 when the will flag is 0"),
    ("password without user name", 4, frame(0x10, connect_body(0x42, s("c") + s("pw"))),
        "0x81 MQTT-3.1.2-22: password flag must be 0 when the user name flag is 0"),
    ("CONNECT trailing bytes", 4, frame(0x10, connect_body(0x02, s("c") + b"zz")),
        "0x81 malformed-packet: CONNECT has 2 unexpected trailing bytes"),
    ("will topic with wildcard", 4, frame(0x10, connect_body(0x06, s("c") + s("w/+") + s("p"))),
        "0x81 MQTT-4.7.1-1: topic name 'w/+' must not contain wildcard characters"),
    ("5.0 CONNECT property past the block", 5, _connect5(0x02, b"\x02\x11" + s("c")),
        "0x81 malformed-packet: property value runs past the property block"),
    # -- CONNACK, read by a client
    ("3.1.1 CONNACK of 3 bytes", 4, b"\x20\x03\x00\x00\x00",
        "0x81 malformed-packet: CONNACK remaining length must be 2, got 3"),
    ("5.0 CONNACK of 1 byte", 5, b"\x20\x01\x00",
        "0x81 malformed-packet: CONNACK is too short"),
    ("CONNACK flag bit 1", 4, b"\x20\x02\x02\x00",
        "0x81 connack-reserved-flags: CONNACK flag bits 7-1 must be 0"),
    ("3.1.1 CONNACK code 6", 4, b"\x20\x02\x00\x06",
        "0x81 connack-return-code: CONNACK return code 6 is reserved"),
    ("session present with a refusal", 4, b"\x20\x02\x01\x05",
        "0x81 MQTT-3.2.2-4: session present must be 0 with a non-zero return code"),
    ("5.0 CONNACK code 0x01", 5, b"\x20\x03\x00\x01\x00",
        "0x82 invalid-reason-code: CONNACK reason code 1 is not defined"),
    ("5.0 CONNACK property length past the end", 5, b"\x20\x03\x00\x00\x05",
        "0x81 malformed-packet: property block runs past the end of the packet"),
    ("5.0 CONNACK trailing byte", 5, b"\x20\x04\x00\x00\x00\x00",
        "0x81 malformed-packet: CONNACK has 1 unexpected trailing bytes"),
    # -- acknowledgements
    ("3.1.1 PUBACK of 3 bytes", 4, b"\x40\x03\x00\x01\x00",
        "0x81 malformed-packet: PUBACK remaining length must be 2, got 3"),
    ("PUBACK with id 0", 4, b"\x40\x02\x00\x00",
        "0x81 MQTT-2.3.1-1: PUBACK packet identifier must be non-zero"),
    ("5.0 PUBREC of 1 byte", 5, b"\x50\x01\x00",
        "0x81 malformed-packet: PUBREC remaining length must be 2, got 1"),
    ("5.0 PUBREL reason 0x10", 5, b"\x62\x03\x00\x01\x10",
        "0x82 invalid-reason-code: PUBREL reason code 16 is not defined"),
    ("5.0 PUBCOMP trailing byte", 5, b"\x70\x05\x00\x01\x00\x00\x00",
        "0x81 malformed-packet: PUBCOMP has 1 unexpected trailing bytes"),
    # -- SUBSCRIBE, UNSUBSCRIBE and their acknowledgements
    ("SUBSCRIBE without id", 4, b"\x82\x01\x00",
        "0x81 malformed-packet: SUBSCRIBE is too short for a packet identifier"),
    ("SUBSCRIBE with id 0", 4, frame(0x82, b"\x00\x00" + s("a") + b"\x00"),
        "0x81 MQTT-2.3.1-1: SUBSCRIBE packet identifier must be non-zero"),
    ("SUBSCRIBE without filters", 4, b"\x82\x02\x00\x01",
        "0x82 MQTT-3.8.3-3: SUBSCRIBE must contain at least one filter"),
    ("SUBSCRIBE empty filter", 4, frame(0x82, b"\x00\x01" + s("") + b"\x00"),
        "0x81 MQTT-4.7.3-1: topic filter must not be empty"),
    ("SUBSCRIBE filter without QoS", 4, frame(0x82, b"\x00\x01" + s("a")),
        "0x81 malformed-packet: SUBSCRIBE filter without its requested QoS byte"),
    ("3.1.1 SUBSCRIBE QoS byte 0x04", 4, frame(0x82, b"\x00\x01" + s("a") + b"\x04"),
        "0x81 MQTT-3-8.3-4: requested QoS byte 0x04 must have bits 7-2 zero and QoS <= 2"),
    ("3.1.1 SUBSCRIBE QoS 3", 4, frame(0x82, b"\x00\x01" + s("a") + b"\x03"),
        "0x81 MQTT-3-8.3-4: requested QoS byte 0x03 must have bits 7-2 zero and QoS <= 2"),
    ("5.0 SUBSCRIBE reserved option bits", 5, frame(0x82, b"\x00\x01\x00" + s("a") + b"\x40"),
        "0x81 MQTT-3.8.3-5: reserved bits of subscription options must be 0"),
    ("5.0 SUBSCRIBE QoS 3", 5, frame(0x82, b"\x00\x01\x00" + s("a") + b"\x03"),
        "0x82 invalid-subscription-options: maximum QoS must not be 3"),
    ("5.0 SUBSCRIBE retain handling 3", 5, frame(0x82, b"\x00\x01\x00" + s("a") + b"\x30"),
        "0x82 invalid-subscription-options: retain handling must not be 3"),
    ("5.0 shared SUBSCRIBE with No Local", 5,
        frame(0x82, b"\x00\x01\x00" + s("$share/g/a") + b"\x04"),
        "0x82 MQTT-3.8.3-4: No Local must not be set on a shared subscription"),
    ("SUBACK without codes", 4, b"\x90\x02\x00\x01",
        "0x81 malformed-packet: SUBACK must contain at least one return code"),
    ("3.1.1 SUBACK code 0x87", 4, b"\x90\x03\x00\x01\x87",
        "0x82 MQTT-3.9.3-2: SUBACK return code 0x87 is reserved"),
    ("5.0 SUBACK code 0x03", 5, b"\x90\x04\x00\x01\x00\x03",
        "0x82 MQTT-3.9.3-2: SUBACK return code 0x03 is reserved"),
    ("SUBACK with id 0", 4, b"\x90\x03\x00\x00\x00",
        "0x81 MQTT-2.3.1-1: SUBACK packet identifier must be non-zero"),
    ("UNSUBSCRIBE without filters", 4, b"\xa2\x02\x00\x01",
        "0x82 MQTT-3.10.3-2: UNSUBSCRIBE must contain at least one filter"),
    ("UNSUBSCRIBE empty filter", 4, frame(0xA2, b"\x00\x01" + s("")),
        "0x81 MQTT-4.7.3-1: topic filter must not be empty"),
    ("UNSUBSCRIBE with id 0", 4, frame(0xA2, b"\x00\x00" + s("a")),
        "0x81 MQTT-2.3.1-1: UNSUBSCRIBE packet identifier must be non-zero"),
    ("3.1.1 UNSUBACK of 3 bytes", 4, b"\xb0\x03\x00\x01\x00",
        "0x81 malformed-packet: UNSUBACK remaining length must be 2, got 3"),
    ("UNSUBACK with id 0", 4, b"\xb0\x02\x00\x00",
        "0x81 MQTT-2.3.1-1: UNSUBACK packet identifier must be non-zero"),
    ("5.0 UNSUBACK code 0x01", 5, b"\xb0\x04\x00\x01\x00\x01",
        "0x82 invalid-reason-code: UNSUBACK reason code 1 is not defined"),
    # -- PINGREQ, PINGRESP, DISCONNECT, AUTH
    ("PINGREQ with a body", 4, b"\xc0\x01\x00",
        "0x81 malformed-packet: PINGREQ remaining length must be 0, got 1"),
    ("PINGRESP with a body", 4, b"\xd0\x02\x00\x00",
        "0x81 malformed-packet: PINGRESP remaining length must be 0, got 2"),
    ("3.1.1 DISCONNECT with a body", 4, b"\xe0\x01\x00",
        "0x81 malformed-packet: DISCONNECT remaining length must be 0, got 1"),
    ("5.0 DISCONNECT reason 0x01", 5, b"\xe0\x01\x01",
        "0x82 invalid-reason-code: DISCONNECT reason code 1 is not defined"),
    ("5.0 DISCONNECT property length past the end", 5, b"\xe0\x02\x00\x05",
        "0x81 malformed-packet: property block runs past the end of the packet"),
    ("5.0 DISCONNECT trailing byte", 5, b"\xe0\x03\x00\x00\x00",
        "0x81 malformed-packet: DISCONNECT has 1 unexpected trailing bytes"),
    ("AUTH of 1 byte", 5, b"\xf0\x01\x18",
        "0x81 malformed-packet: AUTH with a reason code needs a property length"),
    ("AUTH reason 0x01", 5, b"\xf0\x02\x01\x00",
        "0x82 invalid-reason-code: AUTH reason code 1 is not defined"),
    ("AUTH trailing byte", 5, b"\xf0\x03\x18\x00\x00",
        "0x81 malformed-packet: AUTH has 1 unexpected trailing bytes"),
    ("AUTH with a CONNECT-only property", 5, b"\xf0\x07\x18\x05\x11\x00\x00\x00\x01",
        "0x81 invalid-property: property 0x11 is not allowed in AUTH"),
]
# fmt: on


@pytest.mark.parametrize(
    ("data", "level", "answer"),
    [pytest.param(data, level, answer, id=what) for what, level, data, answer in DECODED],
)
def test_a_refused_packet_is_answered_with_its_rule_message_and_reason_code(
    data: bytes, level: int, answer: str
) -> None:
    assert decodeanswer_of(data, level) == answer


def test_a_client_reading_a_server_accepts_a_subscription_identifier() -> None:
    decoder = Decoder(from_server=True)
    decoder.protocol_level = 5
    decoder.feed(frame(0x30, s("a") + b"\x02\x0b\x01"))
    assert decoder.packets()[0].properties == {0x0B: [1]}


# The body decoders are a contract of their own (any caller, any level); the Decoder takes the
# inline path for every 3.1.1 PUBLISH, so these are reached only directly.
def test_the_publish_body_decoder_refuses_an_empty_topic_below_5_and_wildcards_at_any_level() -> (
    None
):
    decode_publish = BODY_DECODERS[PacketType.PUBLISH]
    for level, body, text in (
        (4, s("") + b"x", "MQTT-4.7.3-1: PUBLISH topic name must not be empty"),
        (4, s("a/+") + b"x", "MQTT-3.3.2-2: PUBLISH topic name must not contain wildcards"),
        (4, s("#"), "MQTT-3.3.2-2: PUBLISH topic name must not contain wildcards"),
        (5, s("+") + b"\x00", "MQTT-3.3.2-2: PUBLISH topic name must not contain wildcards"),
        (4, b"\x00\x01a", "MQTT-2.3.1-1: PUBLISH packet identifier must be non-zero"),
    ):
        flags = 0x02 if body == b"\x00\x01a" else 0
        data = s("a") + b"\x00\x00" if flags else body
        with pytest.raises(MQTTProtocolError) as refused:
            decode_publish(data, 0, len(data), flags, level)
        assert str(refused.value) == text
    packet = decode_publish(s("a/b") + b"\x00\x07p", 0, 8, 0x02, 4)
    assert (packet.topic, packet.packet_id, packet.payload) == ("a/b", 7, b"p")
    assert packet.properties == {}


# -- the first byte of the fixed header (MQTT 5.0 table 2-2), built again from the rules -------

_FLAGS = {kind: 0b0010 if kind in (6, 8, 10) else 0 for kind in range(1, 16) if kind != 3}
_NAMES = [PacketType(kind).name for kind in range(1, 16)]


def _expected_first_byte_problem(first: int, level: int) -> tuple[str, str] | None:
    kind, flags = divmod(first, 16)
    if kind == 0 or (kind == 15 and level == 4):
        return "invalid-packet-type", f"packet type {kind} is reserved (first byte 0x{first:02X})"
    if kind == 3:
        if flags & 0b0110 == 0b0110:
            return "MQTT-3.3.1-4", "PUBLISH must not have QoS 3"
        if flags & 0b0110 == 0 and flags & 0b1000:
            return "MQTT-3.3.1-2", "DUP must be 0 in a QoS 0 PUBLISH"
        return None
    if flags != _FLAGS[kind]:
        name = _NAMES[kind - 1]
        expected = _FLAGS[kind]
        return (
            "MQTT-2.2.2-1",
            f"reserved flags of {name} must be 0b{expected:04b}, got 0b{flags:04b}",
        )
    return None


@pytest.mark.parametrize("level", [4, 5])
def test_every_first_byte_is_judged_by_the_fixed_header_rules(level: int) -> None:
    for first in range(256):
        expected = _expected_first_byte_problem(first, level)
        assert _first_byte_problem(first, level) == expected, first


# -- the acknowledgement decoders, built again -------------------------------------------------

_BLOCK_PAST_END = "malformed-packet: property block runs past the end of the packet"


@pytest.mark.parametrize(("cls", "packet_type", "what"), ACKS, ids=[a[2] for a in ACKS])
def test_an_acknowledgement_decoder_reads_the_id_the_reason_and_the_properties(
    cls: Any, packet_type: int, what: str
) -> None:
    decode = _make_ack_decoder(cls, packet_type, what)
    assert decode(b"\xff\x12\x34", 1, 3, 0, 4) == cls(0x1234)
    assert decode(b"\xff\x12\x34", 1, 3, 0, 5) == cls(0x1234)
    reason = 0x92 if packet_type in (PacketType.PUBREL, PacketType.PUBCOMP) else 0x10
    assert decode(b"\xff\x00\x09" + bytes((reason,)), 1, 4, 0, 5) == cls(9, reason, {})
    properties = b"\x1f" + s("why") + b"\x26" + s("k") + s("v")
    body = b"\x00\x09\x00" + bytes((len(properties),)) + properties
    assert decode(b"\xff" + body + b"\xee", 1, 1 + len(body), 0, 5) == cls(
        9, 0, {0x1F: "why", 0x26: [("k", "v")]}
    )
    for data, level, text in (
        (b"\x00\x01\x00", 4, f"malformed-packet: {what} remaining length must be 2, got 3"),
        (b"\x00", 5, f"malformed-packet: {what} remaining length must be 2, got 1"),
        (b"\x00\x00", 4, f"MQTT-2.3.1-1: {what} packet identifier must be non-zero"),
        (b"\x00\x01\x01", 5, f"invalid-reason-code: {what} reason code 1 is not defined"),
        (b"\x00\x01\x00\x00\x00", 5, f"malformed-packet: {what} has 1 unexpected trailing bytes"),
        (b"\x00\x01\x00\x02\x1f", 5, _BLOCK_PAST_END),
    ):
        with pytest.raises(MQTTProtocolError) as refused:
            decode(data, 0, len(data), 0, level)
        assert str(refused.value) == text, data


def test_plain_publishes_decode_with_empty_properties_and_short_forms_encode_to_two_bytes() -> None:
    for level, data in ((4, frame(0x30, s("t") + b"p")), (4, frame(0x32, s("t") + b"\x00\x01p"))):
        packet = decode_one(data, level)
        assert packet.properties == {} and packet.payload == b"p"
    assert decode_one(frame(0x30, s("t") + b"\x00p"), 5).properties == {}
    assert encode_disconnect5() == b"\xe0\x00"
