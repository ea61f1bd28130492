"""The hot path's plain classes (`bridge.fields.Fields`) keep the value semantics they had as
dataclasses: equal by class and fields, unhashable, a repr naming every field; and, compiled,
they refuse a field of the wrong type at once."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.mqtt.packets import Puback, Pubcomp, Publish, Pubrec, Pubrel
from bridge.session import InFlight, Phase
from bridge.storage.base import Message, ReadResult, Stored


def compiled(cls: type) -> bool:
    module = __import__(cls.__module__, fromlist=["_"])
    return str(module.__file__).endswith(".so")


def a_message(**changes: object) -> Message:
    fields: dict[str, object] = {
        "topic": "plant/1/line",
        "payload": b"42",
        "qos": 1,
        "retain": False,
        "publisher": "press-7",
        "key": "n1-abc-1",
        "timestamp_ms": 1_700_000_000_000,
        "node": "n1",
        "properties": {"content-type": "text/plain"},
    }
    fields.update(changes)
    return Message(**fields)  # type: ignore[arg-type]


@given(
    topic=st.text(max_size=20),
    payload=st.binary(max_size=20),
    qos=st.integers(0, 2),
    retain=st.booleans(),
    other_topic=st.text(max_size=20),
)
def test_a_message_equals_one_with_the_same_fields_and_no_other(
    topic, payload, qos, retain, other_topic
):
    one = Message(topic, payload, qos, retain, "p", "k", 1, "n")
    same = Message(topic=topic, payload=payload, qos=qos, retain=retain, publisher="p", key="k",
                   timestamp_ms=1, node="n")  # fmt: skip
    assert one == same
    assert (one != same) is False
    assert (one == Message(other_topic, payload, qos, retain, "p", "k", 1, "n")) == (
        topic == other_topic
    )


def test_every_field_takes_part_in_equality():
    base = a_message()
    for name, other in [
        ("topic", "plant/2/line"),
        ("payload", b"43"),
        ("qos", 2),
        ("retain", True),
        ("publisher", "press-8"),
        ("key", "n1-abc-2"),
        ("timestamp_ms", 1),
        ("node", "n2"),
        ("properties", {}),
    ]:
        assert a_message(**{name: other}) != base, name


def test_a_message_made_without_properties_gets_its_own_dict():
    one, two = Message("t", b""), Message("t", b"")
    one.properties["a"] = "b"
    assert two.properties == {}


def test_acknowledgements_of_different_types_are_never_equal():
    acks = [Puback(7), Pubrec(7), Pubrel(7), Pubcomp(7)]
    for i, left in enumerate(acks):
        for j, right in enumerate(acks):
            assert (left == right) == (i == j)
    assert Puback(7) == Puback(packet_id=7, reason_code=0, properties={})
    assert Puback(7) != Puback(7, 0x10)


@pytest.mark.parametrize(
    "value",
    [
        a_message(),
        Stored(3, 9, a_message(), ("q",), 12),
        ReadResult([], 4),
        Publish("t", b"x", 1, packet_id=5),
        Puback(5),
        InFlight(5, "q", 3, 9, 1, "t", b"x", False),
    ],
    ids=lambda value: type(value).__name__,
)
def test_the_plain_classes_are_unhashable_and_print_every_field(value):
    with pytest.raises(TypeError):
        hash(value)
    text = repr(value)
    assert text.startswith(type(value).__name__ + "(")
    for name in type(value).FIELDS:
        assert f"{name}=" in text


def test_a_message_in_flight_keeps_its_defaults_and_changes_phase():
    out = InFlight(5, "q", 3, 9, 2, "t", b"x", False)
    assert out.phase is Phase.AWAITING_ACK and out.message is None and out.sub_ids == ()
    out.phase = Phase.AWAITING_PUBCOMP
    assert out == InFlight(5, "q", 3, 9, 2, "t", b"x", False, Phase.AWAITING_PUBCOMP)


@pytest.mark.skipif(
    os.environ.get("MQTT_BRIDGE_COMPILE") == "0" and not os.environ.get("CI"),
    reason="a pure Python run asked for (MQTT_BRIDGE_COMPILE=0); never skipped in CI",
)
def test_compiled_a_message_refuses_a_payload_that_is_not_bytes():
    assert compiled(Message) and compiled(Publish)
    for payload in (bytearray(b"x"), memoryview(b"x"), "x"):
        with pytest.raises(TypeError):
            Message("t", payload)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Publish("t", bytearray(b"x"))  # type: ignore[arg-type]
