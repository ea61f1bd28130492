"""The peer-link protocol between bridge nodes: frames, their encoding, a sans-IO decoder.

PURE: no sockets, no event loop. `PeerDecoder.receive_data(bytes)` buffers what arrived and
`next_frame()` returns the next complete frame (or None: need more data); `encode(frame)` returns
the bytes to write. Every rule is unit-tested with byte literals (tests/unit/test_peer_wire.py).

A frame on the wire is::

    length: u32 (big endian, of what follows) | type: u8 | fields

and its fields are, in the order the frame's class declares them: ``u8``, ``u64`` (8 bytes, big
endian), ``str`` and ``bytes`` (u32 length, then UTF-8 or raw bytes), ``strs`` (u32 count, then
that many ``str``), ``u64s`` (u32 count, then that many ``u64``) and ``pairs`` (u32 count, then
that many ``str`` name, ``str`` value). A link starts with the handshake of
`bridge.cluster.handshake` (`Hello` from both sides, then a `Proof` of the cluster secret from
each); a peer that speaks another `VERSION` is refused with a clear error. New frame types get new
type numbers; an unknown type is a protocol error, so a version bump is needed only when an old
node could misread a frame.

Frames an earlier version does not know are optional `FEATURES`: a node advertises the ones it
understands in its registry info, and a peer sends them only to a node that advertised them
(for the boot it is linked to), the older frame otherwise. So in a rolling upgrade old and new
nodes keep their links. `ForwardMeta` and `DeliverMeta` (feature `"meta"`) carry a QoS 0
message's MQTT 5 metadata; a message without any still goes as `Forward` or `Deliver`.

What each frame means to a node is described in docs/design.md ("Cluster").
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Final

from bridge.storage.base import Message

VERSION = 2
"""The peer protocol version this code speaks (sent in `Hello`). 2: the authenticated handshake
(`Hello` carries a nonce, `Proof` follows)."""

FEATURE_METADATA: Final = "meta"
"""The node understands `ForwardMeta` and `DeliverMeta`."""
FEATURES: Final = (FEATURE_METADATA,)
"""The optional frames this code understands (a node advertises them in its registry info)."""

MAX_FRAME = 64 * 1024 * 1024
"""Largest frame accepted: a full interest replay is split into frames well below this."""

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_FORWARD_HEAD = struct.Struct(">IBI")


class PeerProtocolError(Exception):
    """The peer sent bytes that are not a valid frame of this protocol version."""


@dataclass(frozen=True, slots=True)
class Frame:
    """Base of every frame; `TYPE` is its number on the wire, `SCHEMA` its field kinds."""

    TYPE: ClassVar[int] = 0
    SCHEMA: ClassVar[tuple[str, ...]] = ()


@dataclass(frozen=True, slots=True)
class Hello(Frame):
    """First frame of each side: protocol version, node id, a boot id that changes on every
    start (so a peer can tell a restarted node from a reconnected link) and a fresh random
    nonce the other side's `Proof` must cover (so no proof can be replayed)."""

    TYPE = 1
    SCHEMA = ("u64", "str", "str", "bytes")
    version: int
    node_id: str
    boot_id: str
    nonce: bytes


@dataclass(frozen=True, slots=True)
class Proof(Frame):
    """Second frame of each side: an HMAC of both `Hello`s and the sender's role, keyed with the
    cluster secret (`bridge.cluster.handshake.proof_mac`)."""

    TYPE = 20
    SCHEMA = ("bytes",)
    mac: bytes


@dataclass(frozen=True, slots=True)
class SyncBegin(Frame):
    """The sender replays its whole interest: the frames up to `SyncEnd` replace what the
    receiver knew of it (entries missing from the replay are dropped only at `SyncEnd`, so
    routing never has a gap while the replay streams)."""

    TYPE = 2


@dataclass(frozen=True, slots=True)
class SyncEnd(Frame):
    """End of the interest replay started by `SyncBegin`."""

    TYPE = 3


@dataclass(frozen=True, slots=True)
class AddFilters(Frame):
    """The sender now has local subscribers of these (non-shared) topic filters."""

    TYPE = 4
    SCHEMA = ("strs",)
    filters: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RemoveFilters(Frame):
    """The sender has no more local subscribers of these topic filters."""

    TYPE = 5
    SCHEMA = ("strs",)
    filters: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SharedMember(Frame):
    """A member of a shared subscription lives on the sender: its granted QoS and whether its
    client is connected now (the round-robin prefers connected members)."""

    TYPE = 6
    SCHEMA = ("str", "str", "u8", "u8")
    share_filter: str
    client_id: str
    qos: int
    online: int


@dataclass(frozen=True, slots=True)
class SharedMemberGone(Frame):
    """The member left the shared subscription (or its session moved to another node)."""

    TYPE = 7
    SCHEMA = ("str", "str")
    share_filter: str
    client_id: str


@dataclass(frozen=True, slots=True)
class Forward(Frame):
    """A QoS 0 message for the receiver's local (non-shared) subscribers of `topic`."""

    TYPE = 8
    SCHEMA = ("str", "bytes", "u8")
    topic: str
    payload: bytes
    retain: int


@dataclass(frozen=True, slots=True)
class Deliver(Frame):
    """A QoS 0 message for one client of the receiver (a shared-subscription pick)."""

    TYPE = 9
    SCHEMA = ("str", "str", "bytes")
    client_id: str
    topic: str
    payload: bytes


@dataclass(frozen=True, slots=True)
class ForwardMeta(Frame):
    """`Forward` of a message with MQTT 5 metadata: also its publisher (for No Local), its
    timestamp (its expiry counts from it) and its `Message.properties`, in order. Sent only to
    a peer with `FEATURE_METADATA`."""

    TYPE = 18
    SCHEMA = ("str", "bytes", "u8", "str", "u64", "pairs")
    topic: str
    payload: bytes
    retain: int
    publisher: str
    timestamp_ms: int
    properties: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class DeliverMeta(Frame):
    """`Deliver` of a message with MQTT 5 metadata (the fields of `ForwardMeta`). Sent only to
    a peer with `FEATURE_METADATA`."""

    TYPE = 19
    SCHEMA = ("str", "str", "bytes", "u8", "str", "u64", "pairs")
    client_id: str
    topic: str
    payload: bytes
    retain: int
    publisher: str
    timestamp_ms: int
    properties: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Wake(Frame):
    """Messages were stored on these queues (ends not known to the sender): wake their readers."""

    TYPE = 10
    SCHEMA = ("strs",)
    queues: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Grew(Frame):
    """These queues hold messages up to these ends (notify read them): wake their readers."""

    TYPE = 11
    SCHEMA = ("strs", "u64s")
    queues: tuple[str, ...]
    ends: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Retained(Frame):
    """The retained message of `topic` changed: `record` is its encoding, empty when cleared."""

    TYPE = 12
    SCHEMA = ("str", "bytes")
    topic: str
    record: bytes


@dataclass(frozen=True, slots=True)
class Release(Frame):
    """The sender took over `client_id` at `epoch`: close its connection here (no will: the new
    owner publishes it) and answer `Released` with the session's state."""

    TYPE = 13
    SCHEMA = ("u64", "str", "u64")
    request: int
    client_id: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Released(Frame):
    """Answer to `Release`: `state` is the session's last subscriptions and offsets (JSON), empty
    if this node did not hold the session."""

    TYPE = 14
    SCHEMA = ("u64", "str", "bytes")
    request: int
    client_id: str
    state: bytes


@dataclass(frozen=True, slots=True)
class NodeGone(Frame):
    """The sender has taken over the sessions of a dead node: forget that node's interest. Sent
    with the sender's own id, it says the sender is stopping: take over its sessions now."""

    TYPE = 15
    SCHEMA = ("str",)
    node_id: str


@dataclass(frozen=True, slots=True)
class Ping(Frame):
    """Keepalive: a link that carries nothing for a while proves it is alive."""

    TYPE = 16


@dataclass(frozen=True, slots=True)
class Pong(Frame):
    """Answer to `Ping`."""

    TYPE = 17


FRAME_TYPES: dict[int, type[Frame]] = {
    cls.TYPE: cls
    for cls in (
        Hello,
        Proof,
        SyncBegin,
        SyncEnd,
        AddFilters,
        RemoveFilters,
        SharedMember,
        SharedMemberGone,
        Forward,
        Deliver,
        Wake,
        Grew,
        Retained,
        Release,
        Released,
        NodeGone,
        Ping,
        Pong,
        ForwardMeta,
        DeliverMeta,
    )
}


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
