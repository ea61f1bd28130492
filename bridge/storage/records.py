"""Binary formats of the file-log store: record framing, record bodies and the meta snapshot.

Everything is big-endian. docs/storage-format.md describes the layout byte by byte (external
readers such as the Spark job parse these files directly), so change both together and bump
`VERSION` for any incompatible change.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping, Sequence
from typing import Final

from bridge.storage.base import Message, MetaUpdate

HEADER = struct.Struct(">II")
"""Record frame header: body length, CRC-32 (zlib.crc32) of the body."""
HEADER_SIZE = HEADER.size

TYPE_MESSAGE = 1
TYPE_META = 2
VERSION = 1

MAX_BODY: Final = 512 * 1024 * 1024
"""Largest body accepted; a longer length field at recovery is treated as corruption."""

SNAPSHOT_MAGIC = b"MBSN"
SNAPSHOT_VERSION = 1

_U8 = struct.Struct(">B")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_MSG_FIXED = struct.Struct(">BBqBB")  # type, version, timestamp_ms, qos, flags
_META_FIXED = struct.Struct(">BB")  # type, version
_SNAP_FIXED = struct.Struct(">4sBQ")  # magic, version, position

_FLAG_RETAIN: Final = 0x01
_NO_VALUE = b"\x00"
_HAS_VALUE = b"\x01"


class RecordError(ValueError):
    """A record or snapshot that cannot be decoded (corrupt, truncated or of an unknown version)."""


# --- encoding ------------------------------------------------------------------------------------


_crc32: Final = zlib.crc32
_ZERO_U32: Final = b"\x00\x00\x00\x00"
_MSG_TYPE_VERSION: Final = bytes((TYPE_MESSAGE, VERSION))
_SMALL: Final = 1024
_U32_OF: Final = [n.to_bytes(4, "big") for n in range(_SMALL)]
"""The 4-byte forms of the lengths most fields have: a list item, not a conversion (compiled,
`int.to_bytes` makes a Python int and a bytes object each time)."""
_QOS_FLAGS: Final = [bytes((qos, flags)) for qos in range(3) for flags in (0, _FLAG_RETAIN)]
_PREFIXED: Final[dict[str, bytes]] = {}
"""Strings that recur in records (client ids, the node id, queue names), encoded with their
length in front; emptied when it holds `_PREFIXED_MAX`."""
_PREFIXED_MAX: Final = 4096


def _u32(n: int) -> bytes:
    return _U32_OF[n] if 0 <= n < _SMALL else n.to_bytes(4, "big")


def _prefixed(text: str) -> bytes:
    """`text` in UTF-8 after its 4-byte length."""
    known = _PREFIXED.get(text)
    if known is None:
        data = text.encode()
        known = _u32(len(data)) + data
        if len(_PREFIXED) >= _PREFIXED_MAX:
            _PREFIXED.clear()
        _PREFIXED[text] = known
    return known


def _put_bytes(parts: list[bytes], data: bytes) -> None:
    parts.append(_u32(len(data)))
    parts.append(data)


def _put_meta(parts: list[bytes], meta: Sequence[MetaUpdate]) -> None:
    parts.append(_u32(len(meta)))
    for update in meta:
        _put_bytes(parts, update.kind.encode())
        _put_bytes(parts, update.key.encode())
        if update.value is None:
            parts.append(_NO_VALUE)
        else:
            parts.append(_HAS_VALUE)
            _put_bytes(parts, update.value)


def _frame(parts: list[bytes]) -> tuple[bytes, bytes]:
    body = b"".join(parts)
    n = len(body)
    if n > MAX_BODY:
        raise ValueError(f"record of {n} bytes exceeds the limit of {MAX_BODY}")
    return n.to_bytes(4, "big") + _crc32(body).to_bytes(4, "big"), body


def encode_message(
    message: Message,
    topic: bytes,
    queue_offsets: Sequence[tuple[str, int]],
    meta: Sequence[MetaUpdate],
) -> tuple[bytes, bytes]:
    """Frame header and body of a MESSAGE record. `topic` is the message's UTF-8 topic.

    Built as one list joined once: this runs for every QoS 1/2 message. The integers are
    written with `int.to_bytes` (compiled, no call into `struct`), small lengths and the
    repeating strings taken ready-made; a field out of its range raises OverflowError (as
    `struct.error` does for the other records).
    """
    key = message.key.encode()
    flags = _FLAG_RETAIN if message.retain else 0
    qos = message.qos
    parts = [
        _MSG_TYPE_VERSION,
        message.timestamp_ms.to_bytes(8, "big", signed=True),
        _QOS_FLAGS[qos * 2 + flags] if 0 <= qos <= 2 else ((qos << 8) | flags).to_bytes(2, "big"),
        _u32(len(topic)),
        topic,
        _prefixed(message.publisher),
        _u32(len(key)),
        key,
        _prefixed(message.node),
    ]
    props = message.properties
    if props:
        parts.append(_u32(len(props)))
        for name, value in props.items():
            _put_bytes(parts, name.encode())
            _put_bytes(parts, value.encode())
    else:
        parts.append(_ZERO_U32)
    if queue_offsets:
        parts.append(_u32(len(queue_offsets)))
        for name, offset in queue_offsets:
            parts.append(_prefixed(name))
            parts.append(offset.to_bytes(8, "big"))
    else:
        parts.append(_ZERO_U32)
    if meta:
        _put_meta(parts, meta)
    else:
        parts.append(_ZERO_U32)
    payload = message.payload
    parts.append(_u32(len(payload)))
    parts.append(payload)
    return _frame(parts)


def encode_plain_message(message: Message, topic: bytes) -> bytes:
    """A whole framed MESSAGE record (header + body) with no queue entries or meta updates: a
    QoS 0 message kept for analytics (`append_unqueued`)."""
    header, body = encode_message(message, topic, (), ())
    return header + body


def encode_meta(meta: Sequence[MetaUpdate]) -> tuple[bytes, bytes]:
    """Frame header and body of a META record."""
    parts = [_META_FIXED.pack(TYPE_META, VERSION)]
    _put_meta(parts, meta)
    return _frame(parts)


# --- decoding ------------------------------------------------------------------------------------


class _Reader:
    """Sequential reader over a body (bytes or memoryview) with bounds checks."""

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: bytes | memoryview, pos: int = 0) -> None:
        self.buf = buf
        self.pos = pos
        self.end = len(buf)

    def u8(self) -> int:
        if self.pos >= self.end:
            raise RecordError("truncated record")
        value = self.buf[self.pos]
        self.pos += 1
        return value

    def u32(self) -> int:
        if self.pos + 4 > self.end:
            raise RecordError("truncated record")
        (value,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return int(value)

    def u64(self) -> int:
        if self.pos + 8 > self.end:
            raise RecordError("truncated record")
        (value,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return int(value)

    def raw(self) -> memoryview | bytes:
        n = self.u32()
        start = self.pos
        stop = start + n
        if stop > self.end:
            raise RecordError("length field points past the end of the record")
        self.pos = stop
        return self.buf[start:stop]

    def bytes(self) -> bytes:
        return bytes(self.raw())

    def str(self) -> str:
        try:
            return str(self.raw(), "utf-8")
        except UnicodeDecodeError as exc:
            raise RecordError(f"invalid UTF-8: {exc}") from None

    def meta(self, count: int) -> list[MetaUpdate]:
        updates = []
        for _ in range(count):
            kind = self.str()
            key = self.str()
            flag = self.u8()
            if flag == 0:
                value = None
            elif flag == 1:
                value = self.bytes()
            else:
                raise RecordError(f"bad meta value flag {flag}")
            updates.append(MetaUpdate(kind, key, value))
        return updates


class Decoded:
    """One decoded record body."""

    __slots__ = ("message", "meta", "queues", "size", "type")

    def __init__(
        self,
        type_: int,
        message: Message | None,
        queues: list[tuple[str, int]],
        meta: list[MetaUpdate],
        size: int,
    ) -> None:
        self.type = type_
        self.message = message
        self.queues = queues
        self.meta = meta
        self.size = size


def decode_body(body: bytes | memoryview, *, payload: bool = True) -> Decoded:
    """Decode a record body whose CRC has been checked.

    With `payload=False` the payload is not copied (the message gets b"") but `size` is still
    exact; recovery uses this to rebuild indexes cheaply.
    """
    if len(body) < 2:
        raise RecordError("record body too short")
    type_, version = body[0], body[1]
    if version != VERSION:
        raise RecordError(f"unknown record version {version}")
    try:
        if type_ == TYPE_MESSAGE:
            return _decode_message(body, payload)
        if type_ == TYPE_META:
            reader = _Reader(body, 2)
            meta = reader.meta(reader.u32())
            if reader.pos != reader.end:
                raise RecordError("trailing bytes after META record")
            return Decoded(TYPE_META, None, [], meta, 0)
    except struct.error as exc:
        raise RecordError(str(exc)) from None
    raise RecordError(f"unknown record type {type_}")


def _decode_message(body: bytes | memoryview, with_payload: bool) -> Decoded:
    if len(body) < _MSG_FIXED.size:
        raise RecordError("truncated MESSAGE record")
    _, _, timestamp_ms, qos, flags = _MSG_FIXED.unpack_from(body, 0)
    reader = _Reader(body, _MSG_FIXED.size)
    topic_raw = reader.raw()
    try:
        topic = str(topic_raw, "utf-8")
    except UnicodeDecodeError as exc:
        raise RecordError(f"invalid UTF-8 topic: {exc}") from None
    publisher = reader.str()
    key = reader.str()
    node = reader.str()
    properties = {}
    for _ in range(reader.u32()):
        name = reader.str()
        properties[name] = reader.str()
    queues = []
    for _ in range(reader.u32()):
        name = reader.str()
        queues.append((name, reader.u64()))
    meta = reader.meta(reader.u32())
    payload_raw = reader.raw()
    if reader.pos != reader.end:
        raise RecordError("trailing bytes after MESSAGE record")
    message = Message(
        topic=topic,
        payload=bytes(payload_raw) if with_payload else b"",
        qos=qos,
        retain=bool(flags & _FLAG_RETAIN),
        publisher=publisher,
        key=key,
        timestamp_ms=timestamp_ms,
        node=node,
        properties=properties,
    )
    return Decoded(TYPE_MESSAGE, message, queues, meta, len(payload_raw) + len(topic_raw))


# --- snapshot ------------------------------------------------------------------------------------


def encode_snapshot(
    position: int, meta: Mapping[str, Mapping[str, bytes]], queue_ends: Mapping[str, int]
) -> bytes:
    """The meta snapshot file: position, every meta record, every queue's end offset, CRC."""
    parts = [_SNAP_FIXED.pack(SNAPSHOT_MAGIC, SNAPSHOT_VERSION, position)]
    parts.append(_U32.pack(len(meta)))
    for kind, records in meta.items():
        _put_bytes(parts, kind.encode())
        parts.append(_U32.pack(len(records)))
        for key, value in records.items():
            _put_bytes(parts, key.encode())
            _put_bytes(parts, value)
    parts.append(_U32.pack(len(queue_ends)))
    for name, end in queue_ends.items():
        _put_bytes(parts, name.encode())
        parts.append(_U64.pack(end))
    data = b"".join(parts)
    return data + _U32.pack(zlib.crc32(data))


def decode_snapshot(data: bytes) -> tuple[int, dict[str, dict[str, bytes]], dict[str, int]]:
    """(position, meta, queue ends) of a snapshot file; RecordError if it is damaged."""
    if len(data) < _SNAP_FIXED.size + 4:
        raise RecordError("snapshot too short")
    (crc,) = _U32.unpack_from(data, len(data) - 4)
    content = memoryview(data)[:-4]
    if zlib.crc32(content) != crc:
        raise RecordError("snapshot CRC mismatch")
    magic, version, position = _SNAP_FIXED.unpack_from(content, 0)
    if magic != SNAPSHOT_MAGIC or version != SNAPSHOT_VERSION:
        raise RecordError(f"not a version {SNAPSHOT_VERSION} snapshot")
    reader = _Reader(content, _SNAP_FIXED.size)
    meta: dict[str, dict[str, bytes]] = {}
    for _ in range(reader.u32()):
        kind = reader.str()
        records = meta.setdefault(kind, {})
        for _ in range(reader.u32()):
            key = reader.str()
            records[key] = reader.bytes()
    ends = {}
    for _ in range(reader.u32()):
        name = reader.str()
        ends[name] = reader.u64()
    if reader.pos != reader.end:
        raise RecordError("trailing bytes in snapshot")
    return position, meta, ends
