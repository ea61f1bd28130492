"""MQTT 5.0 rules of the codec beyond the wire layout, on hand-built bytes.

Which property each packet (and the will) allows, checked exhaustively against the
specification's lists in mqtt5_spec.py, when decoding and when encoding; duplicated properties;
the values the specification calls Protocol Errors; subscription options; authentication
properties; the Subscription Identifier a client must not send; the reason codes each packet
defines; and the reason code (0x81 Malformed Packet, 0x82 Protocol Error, 0x95 Packet Too Large)
every `MQTTProtocolError` carries.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import pytest

from bridge.mqtt.codec import Decoder, encode
from bridge.mqtt.errors import MQTTProtocolError, PacketTooLarge
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
from bridge.mqtt.reasons import ReasonCode

from .codec_bytes import frame, s
from .mqtt5_spec import (
    ALL_PROPERTY_IDS,
    SAMPLE_VALUES,
    SPEC_PROPERTIES,
    SPEC_REASON_CODES,
    WILL,
    block,
    property_bytes,
)

MALFORMED = ReasonCode.MALFORMED_PACKET
PROTOCOL_ERROR = ReasonCode.PROTOCOL_ERROR


def decode5(data: bytes, from_server: bool = False) -> list[Packet]:
    decoder = Decoder(from_server=from_server)
    decoder.protocol_level = 5
    decoder.feed(data)
    return decoder.packets()


def error5(data: bytes, from_server: bool = False) -> MQTTProtocolError:
    with pytest.raises(MQTTProtocolError) as info:
        decode5(data, from_server)
    return info.value


def encode_error(packet: Packet) -> MQTTProtocolError:
    with pytest.raises(MQTTProtocolError) as info:
        encode(packet, 5)
    return info.value


# --- where a property block sits, per scope --------------------------------------------------

WIRE: dict[str, Callable[[bytes], bytes]] = {
    "CONNECT": lambda b: frame(0x10, s("MQTT") + b"\x05\x02\x00\x0a" + b + s("cid")),
    WILL: lambda b: frame(
        0x10, s("MQTT") + b"\x05\x06\x00\x0a\x00" + s("cid") + b + s("w") + s("")
    ),
    "CONNACK": lambda b: frame(0x20, b"\x00\x00" + b),
    "PUBLISH": lambda b: frame(0x32, s("t") + b"\x00\x01" + b + b"payload"),
    "PUBACK": lambda b: frame(0x40, b"\x00\x01\x00" + b),
    "PUBREC": lambda b: frame(0x50, b"\x00\x01\x00" + b),
    "PUBREL": lambda b: frame(0x62, b"\x00\x01\x00" + b),
    "PUBCOMP": lambda b: frame(0x70, b"\x00\x01\x00" + b),
    "SUBSCRIBE": lambda b: frame(0x82, b"\x00\x01" + b + s("f") + b"\x01"),
    "SUBACK": lambda b: frame(0x90, b"\x00\x01" + b + b"\x00"),
    "UNSUBSCRIBE": lambda b: frame(0xA2, b"\x00\x01" + b + s("f")),
    "UNSUBACK": lambda b: frame(0xB0, b"\x00\x01" + b + b"\x00"),
    "DISCONNECT": lambda b: frame(0xE0, b"\x00" + b),
    "AUTH": lambda b: frame(0xF0, b"\x18" + b),
}
"""A valid packet of each scope around the property block `b` (length included)."""

PACKET: dict[str, Callable[[dict[int, Any]], Packet]] = {
    "CONNECT": lambda p: Connect("cid", keepalive=10, protocol_level=5, properties=p),
    WILL: lambda p: Connect(
        "cid", keepalive=10, will=Will("w", b"", properties=p), protocol_level=5
    ),
    "CONNACK": lambda p: Connack(0, False, p),
    "PUBLISH": lambda p: Publish("t", b"payload", 1, packet_id=1, properties=p),
    "PUBACK": lambda p: Puback(1, 0, p),
    "PUBREC": lambda p: Pubrec(1, 0, p),
    "PUBREL": lambda p: Pubrel(1, 0, p),
    "PUBCOMP": lambda p: Pubcomp(1, 0, p),
    "SUBSCRIBE": lambda p: Subscribe(1, [Subscription("f", 1)], p),
    "SUBACK": lambda p: Suback(1, [0], p),
    "UNSUBSCRIBE": lambda p: Unsubscribe(1, ["f"], p),
    "UNSUBACK": lambda p: Unsuback(1, [0], p),
    "DISCONNECT": lambda p: Disconnect(0, p),
    "AUTH": lambda p: Auth(0x18, p),
}
"""The same packets as objects, for the encoder."""


def companions(scope: str, identifier: int) -> dict[int, Any]:
    """Properties a block needs besides `identifier` to be valid: AUTH always needs its
    Authentication Method, Authentication Data needs one too."""
    if identifier != 0x15 and (scope == "AUTH" or identifier == 0x16):
        return {0x15: SAMPLE_VALUES[0x15]}
    return {}


def properties_of(packet: Packet, scope: str) -> dict[int, Any]:
    if scope == WILL:
        assert isinstance(packet, Connect) and packet.will is not None
        return packet.will.properties
    props: dict[int, Any] = packet.properties  # type: ignore[union-attr]
    return props


def block_of(props: dict[int, Any]) -> bytes:
    return block(*(property_bytes(pid, value) for pid, value in props.items()))


SCOPE_PROPERTY_PAIRS = [(sc, pid) for sc in SPEC_PROPERTIES for pid in sorted(ALL_PROPERTY_IDS)]
PAIR_IDS = [f"{sc}-0x{pid:02X}" for sc, pid in SCOPE_PROPERTY_PAIRS]


# --- the error's reason code -----------------------------------------------------------------


def test_protocol_error_is_malformed_packet_0x81_unless_told_otherwise() -> None:
    assert MQTTProtocolError("MQTT-3.1.2-3", "reserved flag").reason_code == 0x81
    error = MQTTProtocolError("rule", "message", reason_code=ReasonCode.PROTOCOL_ERROR)
    assert (error.rule, error.message, error.reason_code) == ("rule", "message", 0x82)
    assert str(error) == "rule: message"


def test_packet_too_large_reports_reason_code_0x95() -> None:
    assert PacketTooLarge(300, 256).reason_code == 0x95


def test_reason_code_survives_pickling() -> None:
    error = MQTTProtocolError("rule", "message", reason_code=0x82)
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), copy.rule, copy.message, copy.reason_code) == (
        MQTTProtocolError,
        "rule",
        "message",
        0x82,
    )
    assert pickle.loads(pickle.dumps(PacketTooLarge(10, 5))).reason_code == 0x95


def test_packet_too_large_from_the_decoder_carries_0x95() -> None:
    decoder = Decoder(max_packet_size=4)
    decoder.protocol_level = 5
    decoder.feed(b"\x30\x05\x00\x01a\x00x")
    with pytest.raises(PacketTooLarge) as info:
        decoder.packets()
    assert info.value.reason_code == 0x95


# --- which property goes where (table 2-4) ---------------------------------------------------


@pytest.mark.parametrize(("scope", "identifier"), SCOPE_PROPERTY_PAIRS, ids=PAIR_IDS)
def test_decoding_accepts_exactly_the_properties_the_packet_allows(
    scope: str, identifier: int
) -> None:
    props = {**companions(scope, identifier), identifier: SAMPLE_VALUES[identifier]}
    wire = WIRE[scope](block_of(props))
    if identifier in SPEC_PROPERTIES[scope]:
        [packet] = decode5(wire, from_server=True)
        assert properties_of(packet, scope) == props
    else:
        error = error5(wire, from_server=True)
        assert (error.rule, error.reason_code) == ("invalid-property", MALFORMED)


@pytest.mark.parametrize(("scope", "identifier"), SCOPE_PROPERTY_PAIRS, ids=PAIR_IDS)
def test_encoding_accepts_exactly_the_properties_the_packet_allows(
    scope: str, identifier: int
) -> None:
    props = {**companions(scope, identifier), identifier: SAMPLE_VALUES[identifier]}
    packet = PACKET[scope](props)
    if identifier in SPEC_PROPERTIES[scope]:
        assert encode(packet, 5) == WIRE[scope](block_of(props))
    else:
        error = encode_error(packet)
        assert (error.rule, error.reason_code) == ("invalid-property", MALFORMED)


def test_unknown_property_identifier_is_malformed() -> None:
    error = error5(WIRE["PUBACK"](b"\x02\x04\x00"))
    assert (error.rule, error.reason_code) == ("invalid-property", MALFORMED)


def test_invalid_property_is_reported_before_a_later_duplicate() -> None:
    topic_alias = property_bytes(0x23, 1)
    error = error5(WIRE["CONNECT"](block(topic_alias, topic_alias)))
    assert (error.rule, error.reason_code) == ("invalid-property", MALFORMED)


NON_REPEATABLE = [
    (pid, next(sc for sc in SPEC_PROPERTIES if pid in SPEC_PROPERTIES[sc]))
    for pid in sorted(ALL_PROPERTY_IDS - {0x0B, 0x26})
]


@pytest.mark.parametrize(
    ("identifier", "scope"), NON_REPEATABLE, ids=[f"0x{p:02X}" for p, _ in NON_REPEATABLE]
)
def test_a_non_repeatable_property_twice_is_a_protocol_error(identifier: int, scope: str) -> None:
    once = property_bytes(identifier, SAMPLE_VALUES[identifier])
    others = [property_bytes(p, v) for p, v in companions(scope, identifier).items()]
    error = error5(WIRE[scope](block(*others, once, once)), from_server=True)
    assert (error.rule, error.reason_code) == ("duplicate-property", PROTOCOL_ERROR)


def test_user_property_may_repeat_everywhere_it_is_allowed() -> None:
    pairs = [("a", "1"), ("a", "2"), ("b", "3")]
    [packet] = decode5(WIRE["PUBACK"](block(property_bytes(0x26, pairs))))
    assert packet == Puback(1, 0, {0x26: pairs})


def test_several_subscription_identifiers_in_a_server_publish_are_kept_in_order() -> None:
    [packet] = decode5(WIRE["PUBLISH"](block(property_bytes(0x0B, [3, 1, 200]))), True)
    assert isinstance(packet, Publish) and packet.properties == {0x0B: [3, 1, 200]}


def test_two_subscription_identifiers_in_subscribe_are_a_protocol_error() -> None:
    error = error5(WIRE["SUBSCRIBE"](block(property_bytes(0x0B, [1, 2]))))
    assert (error.rule, error.reason_code) == ("duplicate-property", PROTOCOL_ERROR)
    error = encode_error(Subscribe(1, [Subscription("f")], {0x0B: [1, 2]}))
    assert error.reason_code == PROTOCOL_ERROR


# --- values the specification calls Protocol Errors ------------------------------------------

BAD_VALUES = [
    ("PUBLISH", 0x01, 2),  # Payload Format Indicator
    (WILL, 0x01, 255),
    ("CONNECT", 0x17, 2),  # Request Problem Information
    ("CONNECT", 0x19, 2),  # Request Response Information
    ("CONNECT", 0x21, 0),  # Receive Maximum
    ("CONNACK", 0x21, 0),
    ("CONNECT", 0x27, 0),  # Maximum Packet Size
    ("CONNACK", 0x27, 0),
    ("SUBSCRIBE", 0x0B, [0]),  # Subscription Identifier
    ("PUBLISH", 0x0B, [1, 0]),
    ("CONNACK", 0x24, 2),  # Maximum QoS
    ("CONNACK", 0x25, 2),  # Retain Available
    ("CONNACK", 0x28, 2),  # Wildcard Subscription Available
    ("CONNACK", 0x29, 2),  # Subscription Identifier Available
    ("CONNACK", 0x2A, 2),  # Shared Subscription Available
]
BAD_VALUE_IDS = [f"{sc}-0x{pid:02X}={value}" for sc, pid, value in BAD_VALUES]


@pytest.mark.parametrize(("scope", "identifier", "value"), BAD_VALUES, ids=BAD_VALUE_IDS)
def test_forbidden_property_value_is_a_protocol_error_when_decoded(
    scope: str, identifier: int, value: Any
) -> None:
    error = error5(WIRE[scope](block(property_bytes(identifier, value))), from_server=True)
    assert (error.rule, error.reason_code) == ("invalid-property-value", PROTOCOL_ERROR)


@pytest.mark.parametrize(("scope", "identifier", "value"), BAD_VALUES, ids=BAD_VALUE_IDS)
def test_forbidden_property_value_is_refused_when_encoded(
    scope: str, identifier: int, value: Any
) -> None:
    error = encode_error(PACKET[scope]({identifier: value}))
    assert (error.rule, error.reason_code) == ("invalid-property-value", PROTOCOL_ERROR)


@pytest.mark.parametrize(
    ("scope", "identifier", "value"),
    [
        ("PUBLISH", 0x01, 0),
        ("PUBLISH", 0x01, 1),
        ("PUBLISH", 0x23, 0),  # Topic Alias 0: the receiver answers 0x94 (it knows its maximum)
        ("CONNECT", 0x17, 0),
        ("CONNECT", 0x19, 1),
        ("CONNECT", 0x21, 1),
        ("CONNACK", 0x27, 1),
        ("CONNACK", 0x24, 0),
        ("SUBSCRIBE", 0x0B, [268_435_455]),
        ("PUBLISH", 0x23, 0xFFFF),
        ("CONNACK", 0x22, 0),  # Topic Alias Maximum 0 just means "no aliases"
    ],
)
def test_boundary_values_that_are_allowed_decode(scope: str, identifier: int, value: Any) -> None:
    [packet] = decode5(WIRE[scope](block(property_bytes(identifier, value))), from_server=True)
    assert properties_of(packet, scope) == {identifier: value}


# --- authentication properties ---------------------------------------------------------------


def test_connect_with_authentication_data_but_no_method_is_a_protocol_error() -> None:
    error = error5(WIRE["CONNECT"](block(property_bytes(0x16, b"token"))))
    assert (error.rule, error.reason_code) == ("authentication-data-without-method", PROTOCOL_ERROR)
    assert encode_error(PACKET["CONNECT"]({0x16: b"token"})).reason_code == PROTOCOL_ERROR


def test_connect_with_authentication_method_and_data_decodes() -> None:
    props = {0x15: "SCRAM-SHA-256", 0x16: b"client-first"}
    [packet] = decode5(WIRE["CONNECT"](block_of(props)))
    assert isinstance(packet, Connect) and packet.properties == props


def test_auth_without_authentication_method_is_a_protocol_error() -> None:
    error = error5(frame(0xF0, b"\x18\x00"))
    assert (error.rule, error.reason_code) == ("authentication-method-missing", PROTOCOL_ERROR)
    error = error5(WIRE["AUTH"](block(property_bytes(0x16, b"x"))))
    assert error.rule == "authentication-method-missing"
    assert encode_error(Auth(0x18)).rule == "authentication-method-missing"


# --- direction: a client's PUBLISH has no Subscription Identifier ----------------------------


def test_server_side_decoder_refuses_a_publish_with_subscription_identifier_MQTT_3_3_4_6() -> None:
    wire = WIRE["PUBLISH"](block(property_bytes(0x0B, [5])))
    error = error5(wire)
    assert (error.rule, error.reason_code) == ("MQTT-3.3.4-6", PROTOCOL_ERROR)
    assert decode5(wire, from_server=True) == [
        Publish("t", b"payload", 1, packet_id=1, properties={0x0B: [5]})
    ]


def test_server_can_still_encode_a_publish_with_subscription_identifiers() -> None:
    packet = Publish("t", b"payload", 1, packet_id=1, properties={0x0B: [5, 9]})
    assert encode(packet, 5) == WIRE["PUBLISH"](block(property_bytes(0x0B, [5, 9])))


def test_mqtt_3_1_1_publish_is_not_affected_by_the_direction() -> None:
    decoder = Decoder()
    decoder.feed(b"\x30\x04\x00\x01ax")
    assert decoder.packets() == [Publish("a", b"x")]


# --- PUBLISH topic ---------------------------------------------------------------------------


def test_publish_with_empty_topic_and_no_topic_alias_is_a_protocol_error() -> None:
    error = error5(b"\x30\x03\x00\x00\x00")
    assert (error.rule, error.reason_code) == ("MQTT-4.7.3-1", PROTOCOL_ERROR)


def test_publish_with_empty_topic_and_a_topic_alias_decodes() -> None:
    assert decode5(b"\x30\x06\x00\x00\x03\x23\x00\x07") == [Publish("", properties={0x23: 7})]


# --- SUBSCRIBE options -----------------------------------------------------------------------


def subscribe_with_options(options: int, topic_filter: str = "a/b") -> bytes:
    return frame(0x82, b"\x00\x01\x00" + s(topic_filter) + bytes((options,)))


@pytest.mark.parametrize("options", [0x40, 0x80, 0xC0, 0x41])
def test_subscription_options_reserved_bits_6_7_are_malformed_MQTT_3_8_3_5(options: int) -> None:
    error = error5(subscribe_with_options(options))
    assert (error.rule, error.reason_code) == ("MQTT-3.8.3-5", MALFORMED)


def test_retain_handling_3_is_a_protocol_error() -> None:
    error = error5(subscribe_with_options(0x30))
    assert (error.rule, error.reason_code) == ("invalid-subscription-options", PROTOCOL_ERROR)


def test_maximum_qos_3_in_subscription_options_is_a_protocol_error() -> None:
    error = error5(subscribe_with_options(0x03))
    assert (error.rule, error.reason_code) == ("invalid-subscription-options", PROTOCOL_ERROR)


def test_no_local_on_a_shared_subscription_is_a_protocol_error_MQTT_3_8_3_4() -> None:
    error = error5(subscribe_with_options(0x04, "$share/g/a"))
    assert (error.rule, error.reason_code) == ("MQTT-3.8.3-4", PROTOCOL_ERROR)
    packet = Subscribe(1, [Subscription("$share/g/a", 1, no_local=True)])
    assert encode_error(packet).rule == "MQTT-3.8.3-4"


def test_every_valid_subscription_options_byte_decodes() -> None:
    for options in range(0x40):
        qos, retain_handling = options & 3, (options >> 4) & 3
        if qos == 3 or retain_handling == 3:
            continue
        [packet] = decode5(subscribe_with_options(options))
        assert packet == Subscribe(
            1,
            [Subscription("a/b", qos, bool(options & 4), bool(options & 8), retain_handling)],
        )


def test_subscribe_and_unsubscribe_without_filters_are_protocol_errors() -> None:
    assert error5(frame(0x82, b"\x00\x01\x00")).reason_code == PROTOCOL_ERROR
    assert error5(frame(0xA2, b"\x00\x01\x00")).reason_code == PROTOCOL_ERROR


# --- reason codes each packet defines --------------------------------------------------------

REASON_WIRE: dict[str, Callable[[int], bytes]] = {
    "CONNACK": lambda code: bytes((0x20, 3, 0, code, 0)),
    "PUBACK": lambda code: bytes((0x40, 3, 0, 1, code)),
    "PUBREC": lambda code: bytes((0x50, 3, 0, 1, code)),
    "PUBREL": lambda code: bytes((0x62, 3, 0, 1, code)),
    "PUBCOMP": lambda code: bytes((0x70, 3, 0, 1, code)),
    "DISCONNECT": lambda code: bytes((0xE0, 1, code)),
    "AUTH": lambda code: bytes((0xF0, 2, code, 0)) if code else bytes((0xF0, 0)),
}


@pytest.mark.parametrize("name", sorted(REASON_WIRE))
def test_only_the_reason_codes_a_packet_defines_decode(name: str) -> None:
    for code in range(256):
        wire = REASON_WIRE[name](code)
        if name == "AUTH" and code:
            # A long-form AUTH needs its Authentication Method (checked after the code).
            wire = frame(0xF0, bytes((code,)) + block(property_bytes(0x15, "m")))
        if code in SPEC_REASON_CODES[name]:
            assert len(decode5(wire)) == 1, hex(code)
        else:
            error = error5(wire)
            assert (error.rule, error.reason_code) == ("invalid-reason-code", PROTOCOL_ERROR)


REASON_PACKETS: dict[str, Callable[[int], Packet]] = {
    "CONNACK": lambda code: Connack(code),
    "PUBACK": lambda code: Puback(1, code),
    "PUBREC": lambda code: Pubrec(1, code),
    "PUBREL": lambda code: Pubrel(1, code),
    "PUBCOMP": lambda code: Pubcomp(1, code),
    "DISCONNECT": lambda code: Disconnect(code),
    "AUTH": lambda code: Auth(code, {0x15: "m"}),
}


@pytest.mark.parametrize("name", sorted(REASON_PACKETS))
def test_only_the_reason_codes_a_packet_defines_encode(name: str) -> None:
    for code in range(256):
        packet = REASON_PACKETS[name](code)
        if code in SPEC_REASON_CODES[name]:
            assert decode5(encode(packet, 5)) == [packet]
        else:
            assert encode_error(packet).reason_code == PROTOCOL_ERROR


def test_suback_and_unsuback_undefined_codes_are_protocol_errors() -> None:
    assert error5(b"\x90\x04\x00\x01\x00\x05").reason_code == PROTOCOL_ERROR
    assert error5(b"\xb0\x04\x00\x01\x00\x05").reason_code == PROTOCOL_ERROR


def test_wire_format_violations_stay_malformed() -> None:
    assert error5(b"\x41\x02\x00\x01").reason_code == MALFORMED  # reserved flags
    assert error5(b"\x36\x05\x00\x01a\x00\x01").reason_code == MALFORMED  # QoS 3
    assert error5(WIRE["PUBACK"](b"\x05\x01\x00")).reason_code == MALFORMED  # block too long
