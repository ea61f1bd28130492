"""The peer-link wire format: byte literals, round trips, and arbitrary input never crashes."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.cluster import wire
from bridge.cluster.wire import (
    AddFilters,
    Forward,
    Grew,
    Hello,
    PeerDecoder,
    PeerProtocolError,
    Ping,
    encode,
)


def test_hello_has_the_documented_layout() -> None:
    data = encode(Hello(1, "n1", "b"))
    assert data == (
        b"\x00\x00\x00\x14"  # length of type + fields
        b"\x01"  # Hello
        b"\x00\x00\x00\x00\x00\x00\x00\x01"  # version
        b"\x00\x00\x00\x02n1"
        b"\x00\x00\x00\x01b"
    )


def test_a_frame_without_fields_is_its_type_byte() -> None:
    assert encode(Ping()) == b"\x00\x00\x00\x01\x10"


def test_frames_split_anywhere_decode_the_same() -> None:
    frames = [
        Hello(wire.VERSION, "node-a", "boot"),
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
