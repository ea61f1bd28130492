"""Apache RocketMQ remoting protocol (4.x/5.x TCP, not gRPC): a pure codec without I/O.

Everything here works on bytes and plain values; `bridge.storage.rocketmq_remoting` does the
networking. The formats follow the broker's Java sources (RocketMQ 5.3.x):

Frame (`RemotingCommand`)::

    int32  total length of what follows (header-length field + header + body), big-endian
    int32  high byte: serialize type (0 JSON, 1 ROCKETMQ binary); low 3 bytes: header length
    bytes  header (JSON object or ROCKETMQ binary): code, language, version, opaque, flag,
           remark, extFields (string -> string)
    bytes  body

`flag` bit 0 marks a response, bit 1 a oneway request. `opaque` pairs a response with its
request. Request-specific fields ("custom headers") travel as strings in `extFields`.

Message properties are ``name\\x01value\\x02`` repeated. Pulled messages arrive in the commit-log
format (`decode_messages`), which `encode_stored_message` can also produce (for tests and tools).
"""

from __future__ import annotations

import ipaddress
import json
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Final

__all__ = [
    "CURRENT_VERSION",
    "DEFAULT_MAX_FRAME_SIZE",
    "FLAG_ONEWAY",
    "FLAG_RESPONSE",
    "LMQ_DISPATCH_SEPARATOR",
    "LMQ_PREFIX",
    "LMQ_QUEUE_ID",
    "MESSAGE_MAGIC_CODE",
    "MESSAGE_MAGIC_CODE_V2",
    "PROPERTY_INNER_MULTI_DISPATCH",
    "PROPERTY_INNER_MULTI_QUEUE_OFFSET",
    "PROPERTY_KEYS",
    "PROPERTY_TAGS",
    "PROPERTY_UNIQ_KEY",
    "PROPERTY_WAIT_STORE_MSG_OK",
    "FrameDecoder",
    "LanguageCode",
    "MessageSysFlag",
    "PullSysFlag",
    "RemotingCommand",
    "RemotingProtocolError",
    "RequestCode",
    "ResponseCode",
    "SendHeaderField",
    "SerializeType",
    "StoredMessage",
    "UnsupportedCompression",
    "body_crc",
    "decode_command",
    "decode_messages",
    "decode_properties",
    "encode_command",
    "encode_properties",
    "encode_stored_message",
    "loads_fastjson",
    "make_offset_msg_id",
    "send_message_v2_fields",
]


CURRENT_VERSION: Final = 479
"""`MQVersion.Version.V5_3_3.ordinal()`: the version this client announces. Anything at or above
V4_9_4 (401) makes the NameServer answer route queries in standard JSON."""

DEFAULT_MAX_FRAME_SIZE: Final = 16 * 1024 * 1024
"""The broker's default `com.rocketmq.remoting.frameMaxLength` (16 MiB)."""

FLAG_RESPONSE: Final = 0x1
FLAG_ONEWAY: Final = 0x2

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


class RemotingProtocolError(Exception):
    """Bytes that are not a valid RocketMQ remoting frame or stored message."""


class UnsupportedCompression(RemotingProtocolError):
    """A stored message body compressed with an algorithm this codec cannot inflate (LZ4, ZSTD)."""


class SerializeType(IntEnum):
    """How a frame's header is serialized (high byte of the header-length field)."""

    JSON = 0
    ROCKETMQ = 1


class LanguageCode(IntEnum):
    """`LanguageCode` of the Java side: the header's `language` (name in JSON, byte in binary)."""

    JAVA = 0
    CPP = 1
    DOTNET = 2
    PYTHON = 3
    DELPHI = 4
    ERLANG = 5
    RUBY = 6
    OTHER = 7
    HTTP = 8
    GO = 9
    PHP = 10
    OMS = 11
    RUST = 12


class RequestCode(IntEnum):
    """Request codes used by this client (`RequestCode.java`)."""

    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_BROKER_CONFIG = 26
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    DELETE_TOPIC_IN_BROKER = 215
    SEND_MESSAGE_V2 = 310
    SEND_BATCH_MESSAGE = 320


class ResponseCode(IntEnum):
    """Response codes (`RemotingSysResponseCode.java` 0-4 and `ResponseCode.java`)."""

    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TRANSACTION_FAILED = 4
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    FILTER_DATA_NOT_EXIST = 27
    FILTER_DATA_NOT_LATEST = 28
    INVALID_PARAMETER = 29
    NO_MESSAGE = 208
    POLLING_FULL = 209
    POLLING_TIMEOUT = 210
    BROKER_NOT_EXIST = 211
    FLOW_CONTROL = 215
    NOT_LEADER_FOR_QUEUE = 501
    ILLEGAL_OPERATION = 604
    GO_AWAY = 1500


class PullSysFlag:
    """Bits of a pull request's `sysFlag` (`PullSysFlag.java`)."""

    COMMIT_OFFSET: Final = 0x1
    SUSPEND: Final = 0x2
    SUBSCRIPTION: Final = 0x4
    CLASS_FILTER: Final = 0x8
    LITE_PULL_MESSAGE: Final = 0x10


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


# --- frames ------------------------------------------------------------------------------------

_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
_LANGUAGE_NAMES: Final = {member.name for member in LanguageCode}


@dataclass(slots=True)
class RemotingCommand:
    """One remoting frame: a request or a response."""

    code: int
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    language: str = "PYTHON"
    version: int = CURRENT_VERSION
    serialize_type: SerializeType = SerializeType.JSON

    @property
    def is_response(self) -> bool:
        """True for a response (flag bit 0)."""
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        """True for a oneway request, which gets no response (flag bit 1)."""
        return bool(self.flag & FLAG_ONEWAY)


def _encode_json_header(cmd: RemotingCommand) -> bytes:
    header: dict[str, Any] = {
        "code": cmd.code,
        "language": cmd.language,
        "version": cmd.version,
        "opaque": cmd.opaque,
        "flag": cmd.flag,
        "serializeTypeCurrentRPC": "JSON",
    }
    if cmd.remark is not None:
        header["remark"] = cmd.remark
    if cmd.ext_fields:
        header["extFields"] = cmd.ext_fields
    try:
        return json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"header text is not encodable as UTF-8: {exc}") from None


def _encode_binary_header(cmd: RemotingCommand) -> bytes:
    try:
        language = LanguageCode[cmd.language]
    except KeyError:
        raise ValueError(f"language {cmd.language!r} has no binary code") from None
    parts = [struct.pack(">hBhii", cmd.code, language, cmd.version, cmd.opaque, cmd.flag)]
    remark = (cmd.remark or "").encode("utf-8")
    parts.append(_UINT32.pack(len(remark)) + remark)
    fields = bytearray()
    for key, value in cmd.ext_fields.items():
        try:
            k, v = key.encode("utf-8"), value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"extFields text is not encodable as UTF-8: {exc}") from None
        if len(k) > 0x7FFF:
            raise ValueError(f"extFields key too long for the binary header: {len(k)} bytes")
        fields += struct.pack(">H", len(k)) + k + _UINT32.pack(len(v)) + v
    parts.append(_UINT32.pack(len(fields)) + bytes(fields))
    return b"".join(parts)


def encode_command(cmd: RemotingCommand) -> bytes:
    """Encode a command as a complete frame, length prefix included.

    Raises ValueError for values the wire cannot carry (a non-string extFields value, a header
    longer than 16 MiB, a code or version outside 16 bits in the binary header).
    """
    for key, value in cmd.ext_fields.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ValueError(f"extFields must map str to str, got {key!r}: {value!r}")
    if cmd.serialize_type == SerializeType.JSON:
        header = _encode_json_header(cmd)
    else:
        try:
            header = _encode_binary_header(cmd)
        except struct.error as exc:
            raise ValueError(f"value out of range for the binary header: {exc}") from None
    if len(header) > 0xFFFFFF:
        raise ValueError(f"header too long: {len(header)} bytes")
    total = 4 + len(header) + len(cmd.body)
    if total > 0x7FFFFFFF:
        raise ValueError(f"frame too long: {total} bytes")
    return b"".join(
        (
            _UINT32.pack(total),
            _UINT32.pack((int(cmd.serialize_type) << 24) | len(header)),
            header,
            cmd.body,
        )
    )


def _as_int(header: Mapping[str, Any], name: str, default: int | None = None) -> int:
    value = header.get(name, default)
    if value is None:
        raise RemotingProtocolError(f"header field {name!r} is missing")
    if isinstance(value, bool) or not isinstance(value, int):
        raise RemotingProtocolError(f"header field {name!r} is not an integer: {value!r}")
    if not -(2**31) <= value < 2**31:
        raise RemotingProtocolError(f"header field {name!r} out of int32 range: {value}")
    return value


def _decode_json_header(data: bytes) -> RemotingCommand:
    try:
        header = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RemotingProtocolError(f"header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise RemotingProtocolError(f"header is not a JSON object: {type(header).__name__}")
    remark = header.get("remark")
    if remark is not None and not isinstance(remark, str):
        raise RemotingProtocolError(f"remark is not a string: {remark!r}")
    raw_fields = header.get("extFields")
    ext_fields: dict[str, str] = {}
    if raw_fields is not None:
        if not isinstance(raw_fields, dict):
            raise RemotingProtocolError(f"extFields is not an object: {raw_fields!r}")
        for key, value in raw_fields.items():
            if value is None:
                continue
            if isinstance(value, (dict, list)):
                raise RemotingProtocolError(f"extFields[{key!r}] is not a scalar: {value!r}")
            if isinstance(value, bool):
                value = "true" if value else "false"
            ext_fields[key] = value if isinstance(value, str) else str(value)
    language = header.get("language", "JAVA")
    if isinstance(language, int) and not isinstance(language, bool):
        try:
            language = LanguageCode(language).name
        except ValueError:
            language = str(language)
    if not isinstance(language, str):
        raise RemotingProtocolError(f"language is not a string: {language!r}")
    return RemotingCommand(
        code=_as_int(header, "code"),
        opaque=_as_int(header, "opaque", 0),
        flag=_as_int(header, "flag", 0),
        remark=remark,
        ext_fields=ext_fields,
        language=language,
        version=_as_int(header, "version", 0),
        serialize_type=SerializeType.JSON,
    )


class _Reader:
    """Bounds-checked big-endian reads from a bytes-like object."""

    __slots__ = ("data", "end", "pos", "what")

    def __init__(self, data: bytes | memoryview, what: str, pos: int = 0, end: int = -1) -> None:
        self.data = data
        self.pos = pos
        self.end = len(data) if end < 0 else end
        self.what = what

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > self.end:
            raise RemotingProtocolError(
                f"{self.what}: needs {n} bytes at offset {self.pos},"
                f" only {self.end - self.pos} left"
            )
        chunk = bytes(self.data[self.pos : self.pos + n])
        self.pos += n
        return chunk

    def unpack(self, fmt: struct.Struct) -> tuple[Any, ...]:
        return fmt.unpack(self.take(fmt.size))

    def text(self, n: int, name: str) -> str:
        try:
            return self.take(n).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RemotingProtocolError(f"{self.what}: {name} is not UTF-8: {exc}") from None


_BIN_FIXED = struct.Struct(">hbhii")
_U16 = struct.Struct(">H")
_I16 = struct.Struct(">h")
_I64 = struct.Struct(">q")


def _decode_binary_header(data: bytes) -> RemotingCommand:
    reader = _Reader(data, "binary header")
    code, language, version, opaque, flag = reader.unpack(_BIN_FIXED)
    (remark_len,) = reader.unpack(_UINT32)
    remark = reader.text(remark_len, "remark") if remark_len else None
    (fields_len,) = reader.unpack(_UINT32)
    fields_end = reader.pos + fields_len
    if fields_end > reader.end:
        raise RemotingProtocolError(f"binary header: extFields length {fields_len} too long")
    ext_fields: dict[str, str] = {}
    sub = _Reader(data, "binary header extFields", reader.pos, fields_end)
    while sub.pos < sub.end:
        (key_len,) = sub.unpack(_U16)
        key = sub.text(key_len, "extFields key")
        (value_len,) = sub.unpack(_UINT32)
        ext_fields[key] = sub.text(value_len, "extFields value")
    try:
        language_name = LanguageCode(language).name
    except ValueError:
        language_name = str(language)
    return RemotingCommand(
        code=code,
        opaque=opaque,
        flag=flag,
        remark=remark,
        ext_fields=ext_fields,
        language=language_name,
        version=version,
        serialize_type=SerializeType.ROCKETMQ,
    )


def decode_command(frame: bytes | memoryview) -> RemotingCommand:
    """Decode one frame given without its 4-byte length prefix.

    Raises RemotingProtocolError when the bytes are not a valid frame.
    """
    if len(frame) < 4:
        raise RemotingProtocolError(f"frame of {len(frame)} bytes is shorter than 4")
    (raw,) = _UINT32.unpack_from(frame, 0)
    kind, header_len = raw >> 24, raw & 0xFFFFFF
    if header_len > len(frame) - 4:
        raise RemotingProtocolError(
            f"header length {header_len} exceeds the frame's remaining {len(frame) - 4} bytes"
        )
    header = bytes(frame[4 : 4 + header_len])
    if kind == SerializeType.JSON:
        cmd = _decode_json_header(header)
    elif kind == SerializeType.ROCKETMQ:
        cmd = _decode_binary_header(header)
    else:
        raise RemotingProtocolError(f"unknown serialize type {kind}")
    cmd.body = bytes(frame[4 + header_len :])
    return cmd


class FrameDecoder:
    """Incremental frame decoder: `feed(data)` returns every command completed by `data`.

    A frame announcing more than `max_frame_size` bytes, or fewer than 4, raises
    RemotingProtocolError; after any error the decoder is broken (the stream is out of sync) and
    keeps raising.
    """

    __slots__ = ("_broken", "_buffer", "max_frame_size")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.max_frame_size = max_frame_size
        self._buffer = bytearray()
        self._broken: RemotingProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a complete frame."""
        return len(self._buffer)

    def feed(self, data: bytes | bytearray | memoryview) -> list[RemotingCommand]:
        """Add received bytes; return the commands they complete, in stream order."""
        if self._broken is not None:
            raise self._broken
        buf = self._buffer
        buf += data
        out: list[RemotingCommand] = []
        pos = 0
        try:
            while len(buf) - pos >= 4:
                (length,) = _UINT32.unpack_from(buf, pos)
                if length < 4 or length > self.max_frame_size:
                    raise RemotingProtocolError(
                        f"frame length {length} outside 4..{self.max_frame_size}"
                    )
                if len(buf) - pos - 4 < length:
                    break
                start = pos + 4
                out.append(decode_command(memoryview(buf)[start : start + length]))
                pos = start + length
        except RemotingProtocolError as exc:
            self._broken = exc
            raise
        finally:
            del buf[:pos]
        return out


# --- JSON bodies -------------------------------------------------------------------------------


def loads_fastjson(data: bytes | str) -> Any:
    """Parse a JSON body written by the Java side's fastjson.

    Unless asked for standard JSON, fastjson writes maps with integer keys unquoted
    (``{"brokerAddrs":{0:"127.0.0.1:10911"}}``); such keys are quoted before parsing. Raises
    RemotingProtocolError when the text is not (fastjson) JSON.
    """
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        return json.loads(text)
    except UnicodeDecodeError as exc:
        raise RemotingProtocolError(f"JSON body is not UTF-8: {exc}") from None
    except RecursionError:
        raise RemotingProtocolError("JSON body nested too deeply") from None
    except ValueError:
        pass
    out: list[str] = []
    in_string = escaped = expect_key = False
    containers: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if in_string:
            out.append(ch)
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            i += 1
            continue
        if ch == '"':
            in_string, expect_key = True, False
        elif ch in "{[":
            containers.append(ch)
            expect_key = ch == "{"
        elif ch in "}]":
            if containers:
                containers.pop()
            expect_key = False
        elif ch == ",":
            expect_key = bool(containers) and containers[-1] == "{"
        elif expect_key and (ch.isdigit() or ch == "-"):
            j = i + 1
            while j < n and text[j].isdigit():
                j += 1
            out.append(f'"{text[i:j]}"')
            i, expect_key = j, False
            continue
        elif not ch.isspace():
            expect_key = False
        out.append(ch)
        i += 1
    try:
        return json.loads("".join(out))
    except (ValueError, RecursionError) as exc:
        raise RemotingProtocolError(f"body is not JSON: {exc}") from None


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
    index, length = 0, len(text)
    while index < length:
        end = text.find(PROPERTY_SEPARATOR, index)
        if end < 0:
            end = length
        if end - index >= 3:
            sep = text.find(NAME_VALUE_SEPARATOR, index, end)
            if index < sep < end - 1:
                result[text[index:sep]] = text[sep + 1 : end]
        index = end + 1
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


def _decode_one(reader: _Reader, max_body: int) -> StoredMessage:
    start = reader.pos
    (store_size,) = reader.unpack(_INT32)
    if store_size < 4 or start + store_size > reader.end:
        raise RemotingProtocolError(
            f"stored message at {start}: size {store_size} does not fit the {reader.end - start}"
            " bytes left"
        )
    msg = _Reader(reader.data, f"stored message at {start}", reader.pos, start + store_size)
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
    return StoredMessage(
        topic=topic,
        body=body,
        properties=properties,
        queue_id=queue_id,
        queue_offset=queue_offset,
        commit_log_offset=phys,
        store_timestamp=store_ts,
        born_timestamp=born_ts,
        born_host=_unpack_host(born_raw),
        store_host=_unpack_host(store_raw),
        sys_flag=sys_flag,
        flag=flag,
        body_crc=crc,
        reconsume_times=reconsume_times,
        prepared_transaction_offset=prepared,
        store_size=store_size,
        offset_msg_id=make_offset_msg_id(store_raw, phys),
    )


def decode_messages(
    body: bytes | memoryview, *, max_body: int = DEFAULT_MAX_FRAME_SIZE * 4
) -> list[StoredMessage]:
    """Decode a pull response body: stored messages back to back.

    `max_body` bounds a decompressed body. Raises RemotingProtocolError (UnsupportedCompression
    for LZ4/ZSTD bodies) when the bytes are not valid stored messages.
    """
    reader = _Reader(body, "pull body")
    messages: list[StoredMessage] = []
    while reader.pos < reader.end:
        messages.append(_decode_one(reader, max_body))
    return messages
