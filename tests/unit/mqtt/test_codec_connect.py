"""Byte-level unit tests of the MQTT 3.1.1 codec: the connection's packets.

CONNECT (protocol name and level, MQTT 3.1, the flags and the fields they announce, client id,
will, user name and password, keepalive, and what encode refuses), CONNACK (length, flags,
return codes, session present), and PINGREQ, PINGRESP and DISCONNECT.

Test names state the behaviour and cite the normative statement (or the kebab-case rule name
the codec reports when the specification has no id). Hand-built bytes come from codec_bytes.py.
"""

from __future__ import annotations

import pytest

from bridge.mqtt.codec import Decoder, encode
from bridge.mqtt.errors import MQTTProtocolError
from bridge.mqtt.packets import Connack, Connect, Will

from .codec_bytes import connect_body, decode_one, frame, rule_of, s

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


def test_connect_with_an_unknown_level_keeps_its_name_and_reads_a_later_level_as_5_0() -> None:
    # What can be read is kept for the CONNACK 0x01/0x84 and its log line: the client id, and
    # the protocol name even when nothing else parses.
    packet = decode_one(frame(0x10, s("MQIsdp") + b"\x09\xff"))
    assert packet == Connect(client_id="", protocol_level=9, protocol_name="MQIsdp")
    for name, level in (("MQTT", 6), ("MQIsdp", 5)):
        data = frame(0x10, connect_body(0x02, b"\x00" + s("c5"), name=name, level=level))
        assert decode_one(data) == Connect("c5", protocol_level=level, protocol_name=name)


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


# --- PINGREQ / PINGRESP / DISCONNECT ---------------------------------------------------------


@pytest.mark.parametrize("first", [0xC0, 0xD0, 0xE0])
def test_ping_and_disconnect_must_have_remaining_length_0(first: int) -> None:
    assert rule_of(bytes((first, 1, 0))) == "malformed-packet"
