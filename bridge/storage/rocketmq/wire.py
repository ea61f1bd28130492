"""Apache RocketMQ remoting protocol (4.x/5.x TCP, not gRPC): a pure codec without I/O.

Everything here works on bytes and plain values; `bridge.storage.rocketmq.remoting` does the
networking. The formats follow the broker's Java sources (RocketMQ 5.3.x):

Frame (`RemotingCommand`)::

    int32  total length of what follows (header-length field + header + body), big-endian
    int32  high byte: serialize type (0 JSON, 1 ROCKETMQ binary); low 3 bytes: header length
    bytes  header (JSON object or ROCKETMQ binary): code, language, version, opaque, flag,
           remark, extFields (string -> string)
    bytes  body

`flag` bit 0 marks a response, bit 1 a oneway request. `opaque` pairs a response with its
request. Request-specific fields ("custom headers") travel as strings in `extFields`.

Message properties, SEND_MESSAGE_V2 fields and the stored-message format (pull bodies) are in
`bridge.storage.rocketmq.messages`; the protocol error and byte reader shared by both are in
`bridge.storage.rocketmq.bytes` (re-exported here).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Final

from bridge.storage.rocketmq.bytes import DEFAULT_MAX_FRAME_SIZE, ByteReader, RemotingProtocolError

__all__ = [
    "CURRENT_VERSION",
    "DEFAULT_MAX_FRAME_SIZE",
    "FLAG_ONEWAY",
    "FLAG_RESPONSE",
    "FrameDecoder",
    "LanguageCode",
    "PullSysFlag",
    "RemotingCommand",
    "RemotingProtocolError",
    "RequestCode",
    "ResponseCode",
    "SerializeType",
    "decode_command",
    "encode_command",
    "loads_fastjson",
]


CURRENT_VERSION: Final = 479
"""`MQVersion.Version.V5_3_3.ordinal()`: the version this client announces. Anything at or above
V4_9_4 (401) makes the NameServer answer route queries in standard JSON."""

FLAG_RESPONSE: Final = 0x1
FLAG_ONEWAY: Final = 0x2


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
    QUERY_MESSAGE = 12
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_BROKER_CONFIG = 26
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    GET_CONSUMER_LIST_BY_GROUP = 38
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
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


# --- frames ------------------------------------------------------------------------------------

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


_BIN_FIXED = struct.Struct(">hbhii")
_U16 = struct.Struct(">H")


def _decode_binary_header(data: bytes) -> RemotingCommand:
    reader = ByteReader(data, "binary header")
    code, language, version, opaque, flag = reader.unpack(_BIN_FIXED)
    (remark_len,) = reader.unpack(_UINT32)
    remark = reader.text(remark_len, "remark") if remark_len else None
    (fields_len,) = reader.unpack(_UINT32)
    fields_end = reader.pos + fields_len
    if fields_end > reader.end:
        raise RemotingProtocolError(f"binary header: extFields length {fields_len} too long")
    ext_fields: dict[str, str] = {}
    sub = ByteReader(data, "binary header extFields", reader.pos, fields_end)
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
