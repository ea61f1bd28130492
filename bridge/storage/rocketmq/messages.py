"""RocketMQ messages as the remoting protocol carries them: a pure codec without I/O.

Message properties are ``name\\x01value\\x02`` repeated. A SEND_MESSAGE_V2 request carries them
in its one-letter `extFields` (`send_message_v2_fields`). Pulled messages arrive in the commit-log
format (`decode_messages`), which `encode_stored_message` can also produce (for tests and tools).

Frames, `RemotingCommand` and the request/response codes are in `bridge.storage.rocketmq.wire`,
which re-exports everything here.
"""

from __future__ import annotations

import ipaddress
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from bridge.storage.rocketmq.bytes import DEFAULT_MAX_FRAME_SIZE, ByteReader, RemotingProtocolError

__all__ = [
    "BLANK_MAGIC_CODE",
    "KEY_SEPARATOR",
    "LMQ_DISPATCH_SEPARATOR",
    "LMQ_PREFIX",
    "LMQ_QUEUE_ID",
    "MAX_PROPERTIES_BYTES",
    "MESSAGE_MAGIC_CODE",
    "MESSAGE_MAGIC_CODE_V2",
    "NAME_VALUE_SEPARATOR",
    "PROPERTY_INNER_MULTI_DISPATCH",
    "PROPERTY_INNER_MULTI_QUEUE_OFFSET",
    "PROPERTY_KEYS",
    "PROPERTY_SEPARATOR",
    "PROPERTY_TAGS",
    "PROPERTY_UNIQ_KEY",
    "PROPERTY_WAIT_STORE_MSG_OK",
    "MessageSysFlag",
    "SendHeaderField",
    "StoredMessage",
    "UnsupportedCompression",
    "body_crc",
    "decode_messages",
    "decode_properties",
    "encode_properties",
    "encode_stored_message",
    "make_offset_msg_id",
    "send_message_v2_fields",
]


MESSAGE_MAGIC_CODE: Final = -626843481
"""Stored message format V1: 1-byte topic length."""
MESSAGE_MAGIC_CODE_V2: Final = -626843477
"""Stored message format V2 (topic longer than 127 bytes): 2-byte topic length."""
BLANK_MAGIC_CODE: Final = -875286124

NAME_VALUE_SEPARATOR: Final = "\x01"
PROPERTY_SEPARATOR: Final = "\x02"

PROPERTY_KEYS: Final = "KEYS"
PROPERTY_TAGS: Final = "TAGS"
PROPERTY_WAIT_STORE_MSG_OK: Final = "WAIT"
PROPERTY_UNIQ_KEY: Final = "UNIQ_KEY"
PROPERTY_INNER_MULTI_DISPATCH: Final = "INNER_MULTI_DISPATCH"
PROPERTY_INNER_MULTI_QUEUE_OFFSET: Final = "INNER_MULTI_QUEUE_OFFSET"
KEY_SEPARATOR: Final = " "

LMQ_PREFIX: Final = "%LMQ%"
LMQ_QUEUE_ID: Final = 0
LMQ_DISPATCH_SEPARATOR: Final = ","

MAX_PROPERTIES_BYTES: Final = 32767
"""Properties length is a signed 16-bit field in the stored format."""


class UnsupportedCompression(RemotingProtocolError):
    """A stored message body compressed with an algorithm this codec cannot inflate (LZ4, ZSTD)."""


class MessageSysFlag:
    """Bits of a message's `sysFlag` (`MessageSysFlag.java`)."""

    COMPRESSED: Final = 0x1
    MULTI_TAGS: Final = 0x2
    TRANSACTION_PREPARED_TYPE: Final = 0x1 << 2
    TRANSACTION_COMMIT_TYPE: Final = 0x2 << 2
    TRANSACTION_ROLLBACK_TYPE: Final = 0x3 << 2
    BORNHOST_V6: Final = 0x1 << 4
    STOREHOST_V6: Final = 0x1 << 5
    NEED_UNWRAP: Final = 0x1 << 6
    INNER_BATCH: Final = 0x1 << 7
    COMPRESSION_LZ4_TYPE: Final = 0x1 << 8
    COMPRESSION_ZSTD_TYPE: Final = 0x2 << 8
    COMPRESSION_ZLIB_TYPE: Final = 0x3 << 8
    COMPRESSION_TYPE_MASK: Final = 0x7 << 8


class SendHeaderField:
    """The one-letter `extFields` names of `SendMessageRequestHeaderV2`."""

    PRODUCER_GROUP: Final = "a"
    TOPIC: Final = "b"
    DEFAULT_TOPIC: Final = "c"
    DEFAULT_TOPIC_QUEUE_NUMS: Final = "d"
    QUEUE_ID: Final = "e"
    SYS_FLAG: Final = "f"
    BORN_TIMESTAMP: Final = "g"
    FLAG: Final = "h"
    PROPERTIES: Final = "i"
    RECONSUME_TIMES: Final = "j"
    UNIT_MODE: Final = "k"
    MAX_RECONSUME_TIMES: Final = "l"
    BATCH: Final = "m"
    BROKER_NAME: Final = "n"


_INT32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_I64 = struct.Struct(">q")


# --- message properties ------------------------------------------------------------------------


def encode_properties(properties: Mapping[str, str]) -> str:
    """Serialize message properties as ``name\\x01value\\x02...``.

    Names and values must be non-empty (the broker drops empty ones) and free of the two
    separator characters; otherwise ValueError.
    """
    parts: list[str] = []
    for name, value in properties.items():
        if not name or not value:
            raise ValueError(f"property name and value must be non-empty: {name!r}={value!r}")
        for text in (name, value):
            if NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text:
                raise ValueError(f"property {name!r} contains a separator character (\\x01/\\x02)")
        parts.append(f"{name}{NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}")
    return "".join(parts)


def decode_properties(text: str) -> dict[str, str]:
    """Parse a properties string the way the broker does; entries it would skip are skipped."""
    result: dict[str, str] = {}
    for entry in text.split(PROPERTY_SEPARATOR):
        if len(entry) >= 3:
            name, sep, value = entry.partition(NAME_VALUE_SEPARATOR)
            if sep and name and value:
                result[name] = value
    return result


# --- send request ------------------------------------------------------------------------------


def send_message_v2_fields(
    *,
    producer_group: str,
    topic: str,
    queue_id: int,
    properties: Mapping[str, str],
    born_timestamp: int,
    sys_flag: int = 0,
    flag: int = 0,
    default_topic: str = "TBW102",
    default_topic_queue_nums: int = 4,
    reconsume_times: int = 0,
    max_reconsume_times: int | None = None,
    batch: bool = False,
    broker_name: str | None = None,
) -> dict[str, str]:
    """The `extFields` of a SEND_MESSAGE_V2 request (`SendMessageRequestHeaderV2`)."""
    props = encode_properties(properties)
    if len(props.encode("utf-8")) > MAX_PROPERTIES_BYTES:
        raise ValueError(f"properties exceed {MAX_PROPERTIES_BYTES} bytes")
    f = SendHeaderField
    fields = {
        f.PRODUCER_GROUP: producer_group,
        f.TOPIC: topic,
        f.DEFAULT_TOPIC: default_topic,
        f.DEFAULT_TOPIC_QUEUE_NUMS: str(default_topic_queue_nums),
        f.QUEUE_ID: str(queue_id),
        f.SYS_FLAG: str(sys_flag),
        f.BORN_TIMESTAMP: str(born_timestamp),
        f.FLAG: str(flag),
        f.PROPERTIES: props,
        f.RECONSUME_TIMES: str(reconsume_times),
        f.UNIT_MODE: "false",
        f.BATCH: "true" if batch else "false",
    }
    if max_reconsume_times is not None:
        fields[f.MAX_RECONSUME_TIMES] = str(max_reconsume_times)
    if broker_name is not None:
        fields[f.BROKER_NAME] = broker_name
    return fields


# --- stored messages (pull response body) ------------------------------------------------------


@dataclass(slots=True)
class StoredMessage:
    """A message as the broker stores it and returns it from a pull."""

    topic: str
    body: bytes
    properties: dict[str, str]
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    store_timestamp: int
    born_timestamp: int
    born_host: str
    store_host: str
    sys_flag: int = 0
    flag: int = 0
    body_crc: int = 0
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    store_size: int = 0
    offset_msg_id: str = ""
    """Broker-side id: store host (IP + port) and commit-log offset, upper-case hex."""

    @property
    def tags(self) -> str | None:
        """The TAGS property."""
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        """The KEYS property split on spaces."""
        raw = self.properties.get(PROPERTY_KEYS, "")
        return [key for key in raw.split(KEY_SEPARATOR) if key]

    @property
    def msg_id(self) -> str:
        """The client-assigned unique id (UNIQ_KEY) if any, else the broker offset id."""
        return self.properties.get(PROPERTY_UNIQ_KEY) or self.offset_msg_id

    def lmq_offsets(self) -> dict[str, int]:
        """LMQ name -> this message's offset in that LMQ (from the multi-dispatch properties)."""
        names = self.properties.get(PROPERTY_INNER_MULTI_DISPATCH)
        offsets = self.properties.get(PROPERTY_INNER_MULTI_QUEUE_OFFSET)
        if not names or not offsets:
            return {}
        result: dict[str, int] = {}
        for name, offset in zip(
            names.split(LMQ_DISPATCH_SEPARATOR), offsets.split(LMQ_DISPATCH_SEPARATOR), strict=False
        ):
            try:
                result[name] = int(offset)
            except ValueError:
                continue
        return result


def _pack_host(host: str, what: str) -> tuple[bytes, bool]:
    address, _, port = host.rpartition(":")
    try:
        ip = ipaddress.ip_address(address.strip("[]"))
        port_num = int(port)
    except ValueError:
        raise ValueError(f"{what} {host!r} is not ip:port") from None
    return ip.packed + _INT32.pack(port_num), ip.version == 6


def _unpack_host(raw: bytes) -> str:
    if len(raw) == 8:  # IPv4, the usual case: no ipaddress object per message
        return f"{raw[0]}.{raw[1]}.{raw[2]}.{raw[3]}:{_INT32.unpack_from(raw, 4)[0]}"
    ip = ipaddress.ip_address(raw[:-4])
    (port,) = _INT32.unpack(raw[-4:])
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def make_offset_msg_id(store_host_raw: bytes, commit_log_offset: int) -> str:
    """The broker's message id: packed store IP + int32 port + int64 offset as upper-case hex."""
    return (store_host_raw + _I64.pack(commit_log_offset)).hex().upper()


def body_crc(body: bytes) -> int:
    """CRC32 of a body as the broker computes it (masked to a non-negative int32)."""
    return zlib.crc32(body) & 0x7FFFFFFF


def encode_stored_message(message: StoredMessage, *, compress: bool = False) -> bytes:
    """Encode a message in the broker's stored (commit-log) format.

    Used to build test data and fixtures; `message.sys_flag`'s host bits are derived from the
    hosts, and `compress=True` deflates the body with zlib and sets the compression bits.
    """
    born, born_v6 = _pack_host(message.born_host, "born host")
    store, store_v6 = _pack_host(message.store_host, "store host")
    sys_flag = message.sys_flag & ~(
        MessageSysFlag.BORNHOST_V6
        | MessageSysFlag.STOREHOST_V6
        | MessageSysFlag.COMPRESSED
        | MessageSysFlag.COMPRESSION_TYPE_MASK
    )
    if born_v6:
        sys_flag |= MessageSysFlag.BORNHOST_V6
    if store_v6:
        sys_flag |= MessageSysFlag.STOREHOST_V6
    body = message.body
    if compress:
        body = zlib.compress(body, 5)
        sys_flag |= MessageSysFlag.COMPRESSED | MessageSysFlag.COMPRESSION_ZLIB_TYPE
    topic = message.topic.encode("utf-8")
    props = encode_properties(message.properties).encode("utf-8")
    if len(props) > MAX_PROPERTIES_BYTES:
        raise ValueError(f"properties exceed {MAX_PROPERTIES_BYTES} bytes")
    if len(topic) > 127:
        if len(topic) > 0x7FFF:
            raise ValueError("topic too long")
        magic, topic_len = MESSAGE_MAGIC_CODE_V2, _I16.pack(len(topic))
    else:
        magic, topic_len = MESSAGE_MAGIC_CODE, bytes([len(topic)])
    rest = b"".join(
        (
            struct.pack(
                ">iiiiqqiq",
                magic,
                body_crc(body),
                message.queue_id,
                message.flag,
                message.queue_offset,
                message.commit_log_offset,
                sys_flag,
                message.born_timestamp,
            ),
            born,
            _I64.pack(message.store_timestamp),
            store,
            struct.pack(">iq", message.reconsume_times, message.prepared_transaction_offset),
            _INT32.pack(len(body)),
            body,
            topic_len,
            topic,
            _I16.pack(len(props)),
            props,
        )
    )
    return _INT32.pack(4 + len(rest)) + rest


_STORED_FIXED = struct.Struct(">iiiiqqiq")  # magic .. born timestamp (after total size)
_STORED_TAIL = struct.Struct(">iq")  # reconsume times, prepared transaction offset
_STORED_V4_HEAD = struct.Struct(">iiiiiqqiq8sq8siqi")
"""Total size .. body length of a V1 message with IPv4 hosts, read in one call (the fast path)."""
_SYS_FLAG_AT = 36  # offset of sysFlag in a stored message
_SLOW_FLAGS = MessageSysFlag.BORNHOST_V6 | MessageSysFlag.STOREHOST_V6 | MessageSysFlag.COMPRESSED


def _inflate(data: bytes, sys_flag: int, limit: int) -> bytes:
    kind = (sys_flag & MessageSysFlag.COMPRESSION_TYPE_MASK) >> 8
    if kind not in (0, 3):
        name = {1: "LZ4", 2: "ZSTD"}.get(kind, f"type {kind}")
        raise UnsupportedCompression(f"message body compressed with {name}")
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(data, limit)
    except zlib.error as exc:
        raise RemotingProtocolError(f"compressed body does not inflate: {exc}") from None
    if inflater.unconsumed_tail:
        raise RemotingProtocolError(f"compressed body inflates beyond {limit} bytes")
    if not inflater.eof:
        raise RemotingProtocolError("compressed body is truncated")
    return out


def _decode_plain(data: bytes | memoryview, start: int, end: int) -> StoredMessage | None:
    """The fast path of `_decode_one`: a V1 message with IPv4 hosts and an uncompressed body,
    read with one struct call and slices. None if the message is of another kind or does not
    fit (the careful path then reads it and names the fault)."""
    if start + _STORED_V4_HEAD.size > end:
        return None
    (sys_flag,) = _INT32.unpack_from(data, start + _SYS_FLAG_AT)
    if sys_flag & _SLOW_FLAGS:
        return None
    (
        store_size,
        magic,
        crc,
        queue_id,
        flag,
        queue_offset,
        phys,
        sys_flag,
        born_ts,
        born_raw,
        store_ts,
        store_raw,
        reconsume_times,
        prepared,
        body_len,
    ) = _STORED_V4_HEAD.unpack_from(data, start)
    stop = start + store_size
    if magic != MESSAGE_MAGIC_CODE or store_size < 4 or stop > end or body_len < 0:
        return None
    pos = start + _STORED_V4_HEAD.size
    body_end = pos + body_len
    if body_end + 1 > stop:
        return None
    topic_len = data[body_end]
    topic_end = body_end + 1 + topic_len
    if topic_len > 127 or topic_end + 2 > stop:
        return None
    (props_len,) = _I16.unpack_from(data, topic_end)
    props_end = topic_end + 2 + props_len
    if props_len < 0 or props_end > stop:
        return None
    try:
        topic = bytes(data[body_end + 1 : topic_end]).decode("utf-8")
        text = bytes(data[topic_end + 2 : props_end]).decode("utf-8") if props_len > 0 else ""
    except UnicodeDecodeError:
        return None
    properties = decode_properties(text) if text else {}
    body = bytes(data[pos:body_end])
    return _assemble(
        (topic, body, properties, queue_id, queue_offset, phys, store_ts, born_ts),
        (born_raw, store_raw),
        (sys_flag, flag, crc, reconsume_times, prepared, store_size),
    )


def _decode_one(reader: ByteReader, max_body: int) -> StoredMessage:
    plain = _decode_plain(reader.data, reader.pos, reader.end)
    if plain is not None:
        reader.pos += plain.store_size
        return plain
    return _decode_careful(reader, max_body)


def _decode_careful(reader: ByteReader, max_body: int) -> StoredMessage:
    """Any stored message, field by field, with an error that names what does not fit."""
    start = reader.pos
    (store_size,) = reader.unpack(_INT32)
    if store_size < 4 or start + store_size > reader.end:
        raise RemotingProtocolError(
            f"stored message at {start}: size {store_size} does not fit the {reader.end - start}"
            " bytes left"
        )
    msg = ByteReader(reader.data, f"stored message at {start}", reader.pos, start + store_size)
    magic, crc, queue_id, flag, queue_offset, phys, sys_flag, born_ts = msg.unpack(_STORED_FIXED)
    if magic == MESSAGE_MAGIC_CODE:
        topic_len_fmt: struct.Struct | None = None
    elif magic == MESSAGE_MAGIC_CODE_V2:
        topic_len_fmt = _I16
    else:
        raise RemotingProtocolError(f"stored message at {start}: bad magic code {magic:#x}")
    born_raw = msg.take(20 if sys_flag & MessageSysFlag.BORNHOST_V6 else 8)
    (store_ts,) = msg.unpack(_I64)
    store_raw = msg.take(20 if sys_flag & MessageSysFlag.STOREHOST_V6 else 8)
    reconsume_times, prepared = msg.unpack(_STORED_TAIL)
    (body_len,) = msg.unpack(_INT32)
    body = msg.take(body_len) if body_len > 0 else b""
    if sys_flag & MessageSysFlag.COMPRESSED:
        body = _inflate(body, sys_flag, max_body)
        sys_flag &= ~MessageSysFlag.COMPRESSED
    if topic_len_fmt is None:
        topic_len = msg.take(1)[0]
        if topic_len > 127:  # Java reads a signed byte
            raise RemotingProtocolError(f"stored message at {start}: negative topic length")
    else:
        (topic_len,) = msg.unpack(topic_len_fmt)
    topic = msg.text(topic_len, "topic")
    (props_len,) = msg.unpack(_I16)
    properties = decode_properties(msg.text(props_len, "properties")) if props_len > 0 else {}
    reader.pos = start + store_size
    return _assemble(
        (topic, body, properties, queue_id, queue_offset, phys, store_ts, born_ts),
        (born_raw, store_raw),
        (sys_flag, flag, crc, reconsume_times, prepared, store_size),
    )


def _assemble(
    head: tuple[str, bytes, dict[str, str], int, int, int, int, int],
    hosts: tuple[bytes, bytes],
    tail: tuple[int, int, int, int, int, int],
) -> StoredMessage:
    """A decoded message from its fields: (topic, body, properties, queue id, queue offset,
    commit-log offset, store time, birth time), the packed (born, store) hosts, and (sys flag,
    flag, body CRC, reconsume times, prepared transaction offset, store size)."""
    born_raw, store_raw = hosts
    return StoredMessage(
        *head,
        _unpack_host(born_raw),
        _unpack_host(store_raw),
        *tail,
        offset_msg_id=make_offset_msg_id(store_raw, head[5]),
    )


def decode_messages(
    body: bytes | memoryview, *, max_body: int = DEFAULT_MAX_FRAME_SIZE * 4
) -> list[StoredMessage]:
    """Decode a pull response body: stored messages back to back.

    `max_body` bounds a decompressed body. Raises RemotingProtocolError (UnsupportedCompression
    for LZ4/ZSTD bodies) when the bytes are not valid stored messages.
    """
    reader = ByteReader(body, "pull body")
    messages: list[StoredMessage] = []
    while reader.pos < reader.end:
        messages.append(_decode_one(reader, max_body))
    return messages
