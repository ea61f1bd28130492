"""Byte-level unit tests of the MQTT 3.1.1 codec: SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK.

Filters and requested QoS, empty and ill-formed filters, packet id 0, SUBACK return codes, and
the lengths of UNSUBSCRIBE and UNSUBACK; wildcard placement is left to the broker.

Test names state the behaviour and cite the normative statement (or the kebab-case rule name
the codec reports when the specification has no id). Hand-built bytes come from codec_bytes.py.
"""

from __future__ import annotations

import pytest

from bridge.mqtt.codec import encode
from bridge.mqtt.errors import MQTTProtocolError
from bridge.mqtt.packets import Suback, Subscribe, Subscription, Unsubscribe

from .codec_bytes import decode_one, frame, rule_of, s

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
