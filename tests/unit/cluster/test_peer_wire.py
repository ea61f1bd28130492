"""The peer-link wire format: byte literals, round trips, and arbitrary input never crashes."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.cluster import wire
from bridge.cluster.wire import (
    AddFilters,
    Confirm,
    Confirmed,
    Deliver,
    DeliverMeta,
    Forward,
    ForwardMeta,
    Grew,
    Hello,
    PeerDecoder,
    PeerProtocolError,
    Ping,
    encode,
)
from bridge.storage.base import Message
from tests.support.metadata_strategies import stored_metadata


def test_hello_has_the_documented_layout() -> None:
    data = encode(Hello(2, "n1", "b", b"\x07"))
    assert data == (
        b"\x00\x00\x00\x19"  # length of type + fields
        b"\x01"  # Hello
        b"\x00\x00\x00\x00\x00\x00\x00\x02"  # version
        b"\x00\x00\x00\x02n1"
        b"\x00\x00\x00\x01b"
        b"\x00\x00\x00\x01\x07"  # nonce
    )


def test_a_frame_without_fields_is_its_type_byte() -> None:
    assert encode(Ping()) == b"\x00\x00\x00\x01\x10"


def test_confirm_and_its_answer_carry_one_token() -> None:
    token = b"\x00\x00\x00\x00\x00\x00\x01\x02"
    assert encode(Confirm(258)) == b"\x00\x00\x00\x09\x15" + token
    assert encode(Confirmed(258)) == b"\x00\x00\x00\x09\x16" + token
    decoder = PeerDecoder()
    decoder.receive_data(encode(AddFilters(("a/#",))) + encode(Confirm(2**64 - 1)))
    assert decoder.frames() == [AddFilters(("a/#",)), Confirm(2**64 - 1)]


def test_frames_split_anywhere_decode_the_same() -> None:
    frames = [
        Hello(wire.VERSION, "node-a", "boot", b"n" * 32),
        AddFilters(("a/+/c", "x/#", "ünï/çødé")),
        Forward("a/b/c", b"\x00payload", 1),
        Grew(("f:a/#",), (2**40,)),
        Ping(),
    ]
    data = b"".join(encode(f) for f in frames)
    for step in (1, 3, 7, len(data)):
        decoder = PeerDecoder()
        out = []
        for i in range(0, len(data), step):
            decoder.receive_data(data[i : i + step])
            out.extend(decoder.frames())
        assert out == frames


def test_unknown_frame_type_is_a_protocol_error() -> None:
    decoder = PeerDecoder()
    decoder.receive_data(b"\x00\x00\x00\x01\xee")
    with pytest.raises(PeerProtocolError, match="unknown frame type 238"):
        decoder.next_frame()


def test_a_frame_larger_than_the_limit_is_refused_before_it_is_buffered_whole() -> None:
    decoder = PeerDecoder(max_frame=100)
    decoder.receive_data(b"\x00\x00\x01\x00\x04")
    with pytest.raises(PeerProtocolError, match="larger than 100"):
        decoder.next_frame()


def test_trailing_bytes_after_the_fields_are_a_protocol_error() -> None:
    decoder = PeerDecoder()
    decoder.receive_data(b"\x00\x00\x00\x02\x10\x00")
    with pytest.raises(PeerProtocolError, match="after its fields"):
        decoder.next_frame()


def test_a_count_larger_than_the_frame_is_a_protocol_error_not_a_huge_allocation() -> None:
    decoder = PeerDecoder()
    decoder.receive_data(b"\x00\x00\x00\x09\x0b\x00\x00\x00\x00\xff\xff\xff\xff")
    with pytest.raises(PeerProtocolError, match="ends inside"):
        decoder.next_frame()


def test_chunked_replay_keeps_every_filter_in_order() -> None:
    filters = [f"site/{i}/+" for i in range(5000)]
    frames = wire.chunked(filters, AddFilters, budget=4096)
    assert len(frames) > 1
    assert [f for frame in frames for f in frame.filters] == filters  # type: ignore[attr-defined]
    assert all(len(encode(frame)) <= 4096 + 64 for frame in frames)


_text = st.text(max_size=20)
_u64 = st.integers(min_value=0, max_value=2**64 - 1)
_u8 = st.integers(min_value=0, max_value=255)
_by_kind = {
    "u8": _u8,
    "u64": _u64,
    "str": _text,
    "bytes": st.binary(max_size=40),
    "strs": st.lists(_text, max_size=5).map(tuple),
    "u64s": st.lists(_u64, max_size=5).map(tuple),
    "pairs": st.lists(st.tuples(_text, _text), max_size=4).map(tuple),
}
_frames = st.sampled_from(sorted(wire.FRAME_TYPES.values(), key=lambda c: c.TYPE)).flatmap(
    lambda cls: st.tuples(*(_by_kind[k] for k in cls.SCHEMA)).map(lambda v: cls(*v))
)


@given(st.lists(_frames, max_size=8))
def test_any_frames_round_trip(frames: list[wire.Frame]) -> None:
    decoder = PeerDecoder()
    decoder.receive_data(b"".join(encode(f) for f in frames))
    assert decoder.frames() == frames


@given(st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_raise_the_protocol_error(data: bytes) -> None:
    decoder = PeerDecoder(max_frame=1000)
    decoder.receive_data(data)
    with contextlib.suppress(PeerProtocolError):
        decoder.frames()


@given(st.text(max_size=30), st.binary(max_size=60), st.integers(min_value=0, max_value=1))
def test_the_fast_forward_encoding_is_the_generic_one(
    topic: str, payload: bytes, retain: int
) -> None:
    frame = Forward(topic, payload, retain)
    assert wire.encode_forward(topic, payload, retain) == encode(frame)
    assert wire.decode_frame(encode(frame)[4:]) == frame


def test_a_malformed_forward_is_still_a_protocol_error() -> None:
    body = encode(Forward("a/b", b"xy", 1))[4:]
    with pytest.raises(PeerProtocolError, match="after its fields"):
        wire.decode_frame(body + b"\x00")
    with pytest.raises(PeerProtocolError, match="ends inside"):
        wire.decode_frame(body[:8])


# --- QoS 0 messages with MQTT 5 metadata ---------------------------------------------------------


def test_the_metadata_frames_have_the_documented_layout() -> None:
    frame = ForwardMeta("a", b"p", 1, "dev", 258, (("\x00ct", "t"), ("k", "v")))
    assert (ForwardMeta.TYPE, DeliverMeta.TYPE) == (18, 19)
    assert encode(frame) == (
        b"\x00\x00\x00\x35"  # length: 53
        b"\x12"  # ForwardMeta
        b"\x00\x00\x00\x01a"  # topic
        b"\x00\x00\x00\x01p"  # payload
        b"\x01"  # retain
        b"\x00\x00\x00\x03dev"  # publisher
        b"\x00\x00\x00\x00\x00\x00\x01\x02"  # timestamp_ms
        b"\x00\x00\x00\x02"  # 2 properties, each name then value
        b"\x00\x00\x00\x03\x00ct\x00\x00\x00\x01t"
        b"\x00\x00\x00\x01k\x00\x00\x00\x01v"
    )


_messages = st.builds(
    Message,
    topic=_text,
    payload=st.binary(max_size=40),
    retain=st.booleans(),
    publisher=_text,
    timestamp_ms=st.integers(min_value=0, max_value=2**63 - 1),
    properties=stored_metadata(),
)


def _decoded(data: bytes) -> wire.Frame:
    decoder = PeerDecoder()
    decoder.receive_data(data)
    [frame] = decoder.frames()
    return frame


@given(_messages)
def test_a_qos0_message_crosses_to_a_peer_with_its_metadata_in_order(message: Message) -> None:
    forwarded = _decoded(wire.forward_frame(message, metadata=True))
    delivered = _decoded(wire.deliver_frame("dev-9", message, metadata=True))
    assert isinstance(forwarded, Forward | ForwardMeta)
    assert isinstance(delivered, Deliver | DeliverMeta) and delivered.client_id == "dev-9"
    for frame in (forwarded, delivered):
        back = wire.message_of(frame)
        assert (back.topic, back.payload, back.qos) == (message.topic, message.payload, 0)
        assert list(back.properties.items()) == list(message.properties.items())
        if message.properties:
            assert (back.publisher, back.timestamp_ms) == (message.publisher, message.timestamp_ms)
    assert wire.message_of(forwarded).retain == message.retain


@given(_messages)
def test_a_peer_of_an_earlier_version_gets_only_the_frames_it_knows(message: Message) -> None:
    """A message without metadata goes in the old frames whatever the peer; with metadata, a
    peer that did not advertise `FEATURE_METADATA` gets the old frames too (without it)."""
    for metadata in (False, not message.properties):
        forward = wire.forward_frame(message, metadata=metadata)
        assert forward == wire.encode_forward(message.topic, message.payload, int(message.retain))
        deliver = wire.deliver_frame("c", message, metadata=metadata)
        assert deliver == encode(Deliver("c", message.topic, message.payload))
        assert wire.message_of(_decoded(forward)).properties == {}
