"""The peer-link protocol between bridge nodes: frames, their encoding, a sans-IO decoder.

PURE: no sockets, no event loop. `PeerDecoder.receive_data(bytes)` buffers what arrived and
`next_frame()` returns the next complete frame (or None: need more data); `encode(frame)` returns
the bytes to write. Every rule is unit-tested with byte literals
(tests/unit/cluster/test_peer_wire.py).

A frame on the wire is::

    length: u32 (big endian, of what follows) | type: u8 | fields

and its fields are, in the order the frame's class declares them (`bridge.cluster.frames`,
whose names this module re-exports): ``u8``, ``u64`` (8 bytes, big endian), ``str`` and
``bytes`` (u32 length, then UTF-8 or raw bytes), ``strs`` (u32 count, then that many ``str``),
``u64s`` (u32 count, then that many ``u64``) and ``pairs`` (u32 count, then that many ``str``
name, ``str`` value). A link starts with the handshake of `bridge.cluster.handshake` (`Hello`
from both sides, then a `Proof` of the cluster secret from each); a peer that speaks another
`VERSION` is refused with a clear error.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from bridge.cluster.frames import (
    FEATURE_METADATA,
    FEATURES,
    FRAME_TYPES,
    VERSION,
    AddFilters,
    Confirm,
    Confirmed,
    Deliver,
    DeliverMeta,
    Forward,
    ForwardMeta,
    Frame,
    Grew,
    Hello,
    NodeGone,
    Ping,
    Pong,
    Proof,
    Release,
    Released,
    RemoveFilters,
    Retained,
    SharedMember,
    SharedMemberGone,
    SyncBegin,
    SyncEnd,
    Wake,
)
from bridge.storage.base import Message

__all__ = [
    "FEATURES",
    "FEATURE_METADATA",
    "FRAME_TYPES",
    "MAX_FRAME",
    "VERSION",
    "AddFilters",
    "Confirm",
    "Confirmed",
    "Deliver",
    "DeliverMeta",
    "Forward",
    "ForwardMeta",
    "Frame",
    "Grew",
    "Hello",
    "NodeGone",
    "PeerDecoder",
    "PeerProtocolError",
    "Ping",
    "Pong",
    "Proof",
    "Release",
    "Released",
    "RemoveFilters",
    "Retained",
    "SharedMember",
    "SharedMemberGone",
    "SyncBegin",
    "SyncEnd",
    "Wake",
    "chunked",
    "decode_frame",
    "deliver_frame",
    "encode",
    "encode_forward",
    "forward_frame",
    "message_of",
]

MAX_FRAME = 64 * 1024 * 1024
"""Largest frame accepted: a full interest replay is split into frames well below this."""

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_FORWARD_HEAD = struct.Struct(">IBI")


class PeerProtocolError(Exception):
    """The peer sent bytes that are not a valid frame of this protocol version."""


# --- QoS 0 messages ------------------------------------------------------------------------------


def forward_frame(message: Message, *, metadata: bool) -> bytes:
    """The bytes of a QoS 0 message forwarded to a peer's subscribers: `ForwardMeta` when it
    has MQTT 5 metadata and the peer understands it (`metadata`), `Forward` otherwise (the
    metadata is then lost, as it would be on a node of an earlier version)."""
    if metadata and message.properties:
        return encode(
            ForwardMeta(
                message.topic,
                message.payload,
                int(message.retain),
                message.publisher,
                message.timestamp_ms,
                tuple(message.properties.items()),
            )
        )
    return encode_forward(message.topic, message.payload, int(message.retain))


def deliver_frame(client_id: str, message: Message, *, metadata: bool) -> bytes:
    """The bytes of a QoS 0 message for one of a peer's clients (see `forward_frame`)."""
    if metadata and message.properties:
        return encode(
            DeliverMeta(
                client_id,
                message.topic,
                message.payload,
                int(message.retain),
                message.publisher,
                message.timestamp_ms,
                tuple(message.properties.items()),
            )
        )
    return encode(Deliver(client_id, message.topic, message.payload))


def message_of(frame: Forward | ForwardMeta | Deliver | DeliverMeta) -> Message:
    """The QoS 0 message a `Forward`, `ForwardMeta`, `Deliver` or `DeliverMeta` carries (what
    the older frames lack is left empty)."""
    if isinstance(frame, ForwardMeta | DeliverMeta):
        return Message(
            frame.topic,
            frame.payload,
            retain=bool(frame.retain),
            publisher=frame.publisher,
            timestamp_ms=frame.timestamp_ms,
            properties=dict(frame.properties),
        )
    return Message(
        frame.topic, frame.payload, retain=isinstance(frame, Forward) and bool(frame.retain)
    )


# --- encoding ------------------------------------------------------------------------------------


def _put_str(out: list[bytes], value: str) -> None:
    data = value.encode()
    out.append(_U32.pack(len(data)))
    out.append(data)


def encode_forward(topic: str, payload: bytes, retain: int) -> bytes:
    """`encode(Forward(topic, payload, retain))`, without the generic field walk (the frame of
    every QoS 0 message that crosses nodes)."""
    name = topic.encode()
    length = 1 + 4 + len(name) + 4 + len(payload) + 1
    return b"".join(
        (
            _FORWARD_HEAD.pack(length, Forward.TYPE, len(name)),
            name,
            _U32.pack(len(payload)),
            payload,
            b"\x01" if retain else b"\x00",
        )
    )


def encode(frame: Frame) -> bytes:
    """The bytes of one frame."""
    out: list[bytes] = [b"", bytes((frame.TYPE,))]
    for kind, spec in zip(frame.SCHEMA, fields(frame), strict=True):
        value: Any = getattr(frame, spec.name)
        if kind == "u8":
            out.append(bytes((value,)))
        elif kind == "u64":
            out.append(_U64.pack(value))
        elif kind == "str":
            _put_str(out, value)
        elif kind == "bytes":
            out.append(_U32.pack(len(value)))
            out.append(bytes(value))
        elif kind == "strs":
            out.append(_U32.pack(len(value)))
            for item in value:
                _put_str(out, item)
        elif kind == "pairs":
            out.append(_U32.pack(len(value)))
            for name, text in value:
                _put_str(out, name)
                _put_str(out, text)
        else:  # u64s
            out.append(_U32.pack(len(value)))
            out.extend(_U64.pack(item) for item in value)
    length = sum(len(part) for part in out)
    if length > MAX_FRAME:
        raise PeerProtocolError(f"frame of {length} bytes is larger than {MAX_FRAME}")
    out[0] = _U32.pack(length)
    return b"".join(out)


def chunked(
    filters: list[str], frame: Callable[[tuple[str, ...]], Frame], budget: int = 256 * 1024
) -> list[Frame]:
    """`frame`s carrying `filters`, each about `budget` bytes at most (an interest replay)."""
    frames: list[Frame] = []
    batch: list[str] = []
    size = 0
    for topic_filter in filters:
        cost = 4 + len(topic_filter) * 4
        if batch and size + cost > budget:
            frames.append(frame(tuple(batch)))
            batch, size = [], 0
        batch.append(topic_filter)
        size += cost
    if batch:
        frames.append(frame(tuple(batch)))
    return frames


# --- decoding ------------------------------------------------------------------------------------


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: memoryview) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> memoryview:
        end = self.pos + n
        if end > len(self.data):
            raise PeerProtocolError("frame ends inside a field")
        part = self.data[self.pos : end]
        self.pos = end
        return part

    def u32(self) -> int:
        value: int = _U32.unpack(self.take(4))[0]
        return value

    def string(self) -> str:
        try:
            return str(self.take(self.u32()), "utf-8")
        except UnicodeDecodeError as exc:
            raise PeerProtocolError(f"a string field is not UTF-8: {exc}") from None

    def field(self, kind: str) -> Any:
        if kind == "u8":
            return self.take(1)[0]
        if kind == "u64":
            return _U64.unpack(self.take(8))[0]
        if kind == "str":
            return self.string()
        if kind == "bytes":
            return bytes(self.take(self.u32()))
        count = self.u32()
        if kind == "strs":
            return tuple(self.string() for _ in range(count))
        if kind == "pairs":
            return tuple((self.string(), self.string()) for _ in range(count))
        if count * 8 > len(self.data) - self.pos:
            raise PeerProtocolError("frame ends inside a field")
        return tuple(_U64.unpack(self.take(8))[0] for _ in range(count))


def decode_frame(body: bytes | memoryview) -> Frame:
    """One frame from its type byte and fields (the length prefix already removed)."""
    view = memoryview(body)
    if not view:
        raise PeerProtocolError("empty frame")
    if view[0] == Forward.TYPE and len(view) >= 10:
        forward = _decode_forward(view)
        if forward is not None:
            return forward
    cls = FRAME_TYPES.get(view[0])
    if cls is None:
        raise PeerProtocolError(f"unknown frame type {view[0]}")
    reader = _Reader(view[1:])
    values = [reader.field(kind) for kind in cls.SCHEMA]
    if reader.pos != len(reader.data):
        raise PeerProtocolError(
            f"{cls.__name__} frame has {len(reader.data) - reader.pos} bytes after its fields"
        )
    return cls(*values)


def _decode_forward(view: memoryview) -> Forward | None:
    """The common frame without the generic walk; None to let the generic decoder say what is
    wrong with a malformed one."""
    (name_len,) = _U32.unpack_from(view, 1)
    payload_at = 5 + name_len
    if payload_at + 4 > len(view):
        return None
    (payload_len,) = _U32.unpack_from(view, payload_at)
    end = payload_at + 4 + payload_len
    if end + 1 != len(view) or view[end] > 1:
        return None
    try:
        topic = str(view[5:payload_at], "utf-8")
    except UnicodeDecodeError:
        return None
    return Forward(topic, bytes(view[payload_at + 4 : end]), view[end])


class PeerDecoder:
    """Buffers bytes from a peer and cuts them into frames (sans-IO)."""

    __slots__ = ("_buffer", "max_frame")

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buffer = bytearray()
        self.max_frame = max_frame

    def receive_data(self, data: bytes) -> None:
        """Append bytes read from the link."""
        self._buffer += data

    def next_frame(self) -> Frame | None:
        """The next complete frame, or None until more bytes arrive. Raises PeerProtocolError
        for bytes that cannot be a frame (the link must then be closed)."""
        buffer = self._buffer
        if len(buffer) < 4:
            return None
        (length,) = _U32.unpack_from(buffer)
        if length > self.max_frame:
            raise PeerProtocolError(f"frame of {length} bytes is larger than {self.max_frame}")
        if len(buffer) < 4 + length:
            return None
        body = bytes(buffer[4 : 4 + length])
        del buffer[: 4 + length]
        return decode_frame(body)

    def frames(self) -> list[Frame]:
        """Every complete frame buffered now."""
        out: list[Frame] = []
        while (frame := self.next_frame()) is not None:
            out.append(frame)
        return out
