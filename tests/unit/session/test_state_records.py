"""The JSON records of retained messages and wills (`bridge.state`): a message's MQTT 5
metadata comes back whole and in order, and records of earlier versions still decode."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from bridge.state import decode_message, encode_message, will_of
from bridge.storage.base import Message
from tests.support.metadata_strategies import mqtt_text, stored_metadata


@given(
    topic=mqtt_text,
    payload=st.binary(max_size=40),
    qos=st.integers(0, 2),
    retain=st.booleans(),
    meta=stored_metadata(),
)
def test_a_message_and_its_metadata_round_trip(
    topic: str, payload: bytes, qos: int, retain: bool, meta: dict[str, str]
) -> None:
    message = Message(topic, payload, qos, retain, "dev-1", "n1-1-9", 1700000000123, "n1", meta)
    back = decode_message(encode_message(message))
    assert back == message
    assert list(back.properties.items()) == list(meta.items())


def test_a_record_of_an_earlier_version_decodes_without_metadata() -> None:
    old = b'{"t":"a/b","p":"b24=","q":1,"r":true,"pub":"dev","k":"n1-1-2","ts":5,"n":"n1"}'
    assert decode_message(old) == Message("a/b", b"on", 1, True, "dev", "n1-1-2", 5, "n1")
    online = json.dumps({"peer": "x", "will": old.decode()}).encode()
    will = will_of(online)
    assert will is not None and will.properties == {}


def test_metadata_is_left_out_of_a_record_without_any() -> None:
    assert b'"pr"' not in encode_message(Message("a/b", b"on"))
    record = json.loads(encode_message(Message("a/b", b"on", properties={"\x00ct": "t", "k": "v"})))
    assert record["pr"] == {"\x00ct": "t", "k": "v"}
