"""MQTT data representations (section 1.5) and MQTT 5.0 properties (section 2.2.2.2).

The primitives here (Variable Byte Integer, UTF-8 string, binary data) are shared with the codec.
Readers take ``(buf, pos, end)`` and return ``(value, new_pos)``; they never read at or beyond
`end` and raise `MQTTProtocolError` instead of ``IndexError``.

A property block is a Variable Byte Integer length followed by that many bytes of
``identifier value`` pairs. Decoded properties are a ``dict[int, Any]`` keyed by identifier:

* byte, two-byte and four-byte integers and Variable Byte Integers decode to ``int``;
* UTF-8 strings to ``str``, binary data to ``bytes``;
* the repeatable properties are always lists in wire order: User Property (0x26) a
  ``list[tuple[str, str]]`` and Subscription Identifier (0x0B) a ``list[int]``.

A property other than User Property / Subscription Identifier appearing twice is a Protocol Error
(reason code 0x82); an unknown identifier, or one the caller's `allowed` set leaves out, makes the
packet malformed (0x81). Which identifiers each packet allows, and the rules on their values, are
`bridge.mqtt.property_rules`; the codec passes those sets in.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

from bridge.mqtt.errors import MQTTProtocolError
from bridge.mqtt.reasons import ReasonCode

__all__ = [
    "MAX_VARINT",
    "PROPERTY_TYPES",
    "REPEATABLE_PROPERTIES",
    "PropertyId",
    "PropertyType",
    "decode_properties",
    "encode_binary",
    "encode_properties",
    "encode_property_block_content",
    "encode_utf8",
    "encode_varint",
    "read_binary",
    "read_utf8",
    "read_varint",
]

MAX_VARINT = 268_435_455
"""The largest value a Variable Byte Integer (and so a remaining length) can hold."""

Buffer = bytes | bytearray


class PropertyType(IntEnum):
    """The data type of a property value."""

    BYTE = 1
    TWO_BYTE_INT = 2
    FOUR_BYTE_INT = 3
    VARINT = 4
    UTF8 = 5
    UTF8_PAIR = 6
    BINARY = 7


class PropertyId(IntEnum):
    """MQTT 5.0 property identifiers (table 2-4)."""

    PAYLOAD_FORMAT_INDICATOR = 0x01
    MESSAGE_EXPIRY_INTERVAL = 0x02
    CONTENT_TYPE = 0x03
    RESPONSE_TOPIC = 0x08
    CORRELATION_DATA = 0x09
    SUBSCRIPTION_IDENTIFIER = 0x0B
    SESSION_EXPIRY_INTERVAL = 0x11
    ASSIGNED_CLIENT_IDENTIFIER = 0x12
    SERVER_KEEP_ALIVE = 0x13
    AUTHENTICATION_METHOD = 0x15
    AUTHENTICATION_DATA = 0x16
    REQUEST_PROBLEM_INFORMATION = 0x17
    WILL_DELAY_INTERVAL = 0x18
    REQUEST_RESPONSE_INFORMATION = 0x19
    RESPONSE_INFORMATION = 0x1A
    SERVER_REFERENCE = 0x1C
    REASON_STRING = 0x1F
    RECEIVE_MAXIMUM = 0x21
    TOPIC_ALIAS_MAXIMUM = 0x22
    TOPIC_ALIAS = 0x23
    MAXIMUM_QOS = 0x24
    RETAIN_AVAILABLE = 0x25
    USER_PROPERTY = 0x26
    MAXIMUM_PACKET_SIZE = 0x27
    WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
    SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
    SHARED_SUBSCRIPTION_AVAILABLE = 0x2A


_P = PropertyId
_T = PropertyType

PROPERTY_TYPES: dict[int, PropertyType] = {
    _P.PAYLOAD_FORMAT_INDICATOR: _T.BYTE,
    _P.MESSAGE_EXPIRY_INTERVAL: _T.FOUR_BYTE_INT,
    _P.CONTENT_TYPE: _T.UTF8,
    _P.RESPONSE_TOPIC: _T.UTF8,
    _P.CORRELATION_DATA: _T.BINARY,
    _P.SUBSCRIPTION_IDENTIFIER: _T.VARINT,
    _P.SESSION_EXPIRY_INTERVAL: _T.FOUR_BYTE_INT,
    _P.ASSIGNED_CLIENT_IDENTIFIER: _T.UTF8,
    _P.SERVER_KEEP_ALIVE: _T.TWO_BYTE_INT,
    _P.AUTHENTICATION_METHOD: _T.UTF8,
    _P.AUTHENTICATION_DATA: _T.BINARY,
    _P.REQUEST_PROBLEM_INFORMATION: _T.BYTE,
    _P.WILL_DELAY_INTERVAL: _T.FOUR_BYTE_INT,
    _P.REQUEST_RESPONSE_INFORMATION: _T.BYTE,
    _P.RESPONSE_INFORMATION: _T.UTF8,
    _P.SERVER_REFERENCE: _T.UTF8,
    _P.REASON_STRING: _T.UTF8,
    _P.RECEIVE_MAXIMUM: _T.TWO_BYTE_INT,
    _P.TOPIC_ALIAS_MAXIMUM: _T.TWO_BYTE_INT,
    _P.TOPIC_ALIAS: _T.TWO_BYTE_INT,
    _P.MAXIMUM_QOS: _T.BYTE,
    _P.RETAIN_AVAILABLE: _T.BYTE,
    _P.USER_PROPERTY: _T.UTF8_PAIR,
    _P.MAXIMUM_PACKET_SIZE: _T.FOUR_BYTE_INT,
    _P.WILDCARD_SUBSCRIPTION_AVAILABLE: _T.BYTE,
    _P.SUBSCRIPTION_IDENTIFIER_AVAILABLE: _T.BYTE,
    _P.SHARED_SUBSCRIPTION_AVAILABLE: _T.BYTE,
}
"""The data type of every MQTT 5.0 property, by identifier."""

REPEATABLE_PROPERTIES = frozenset({_P.USER_PROPERTY, _P.SUBSCRIPTION_IDENTIFIER})
"""Properties that may appear more than once; their decoded value is a list."""

_INT_LIMITS = {_T.BYTE: 0xFF, _T.TWO_BYTE_INT: 0xFFFF, _T.FOUR_BYTE_INT: 0xFFFF_FFFF}
_INT_SIZES = {_T.BYTE: 1, _T.TWO_BYTE_INT: 2, _T.FOUR_BYTE_INT: 4}


def _malformed(message: str) -> MQTTProtocolError:
    return MQTTProtocolError("malformed-packet", message)


# --- Variable Byte Integer -------------------------------------------------------------------


def encode_varint(value: int) -> bytes:
    """Encode `value` (0..268,435,455) as a Variable Byte Integer (section 1.5.5 / 2.2.3)."""
    if value < 0x80:
        if value < 0:
            raise MQTTProtocolError("malformed-variable-byte-integer", f"negative value {value}")
        return bytes((value,))
    if value > MAX_VARINT:
        raise MQTTProtocolError(
            "malformed-variable-byte-integer", f"{value} does not fit a Variable Byte Integer"
        )
    out = bytearray()
    while True:
        digit = value & 0x7F
        value >>= 7
        if value:
            out.append(digit | 0x80)
        else:
            out.append(digit)
            return bytes(out)


def read_varint(buf: Buffer, pos: int, end: int) -> tuple[int, int]:
    """Read a Variable Byte Integer of at most 4 bytes at `pos`, before `end`."""
    value = 0
    shift = 0
    for i in range(4):
        if pos + i >= end:
            raise _malformed("Variable Byte Integer runs past the end of the packet")
        byte = buf[pos + i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos + i + 1
        shift += 7
    raise MQTTProtocolError(
        "malformed-variable-byte-integer", "Variable Byte Integer longer than 4 bytes"
    )


# --- UTF-8 strings and binary data -----------------------------------------------------------


def read_utf8(buf: Buffer, pos: int, end: int) -> tuple[str, int]:
    """Read a length-prefixed UTF-8 string (section 1.5.3) at `pos`, before `end`.

    Ill-formed UTF-8, including encoded surrogates U+D800..U+DFFF, is MQTT-1.5.3-1; U+0000 is
    MQTT-1.5.3-2.
    """
    if pos + 2 > end:
        raise _malformed("UTF-8 string length runs past the end of the packet")
    stop = pos + 2 + ((buf[pos] << 8) | buf[pos + 1])
    if stop > end:
        raise _malformed("UTF-8 string runs past the end of the packet")
    try:
        text = buf[pos + 2 : stop].decode("utf-8")
    except UnicodeDecodeError:
        raise MQTTProtocolError("MQTT-1.5.3-1", "ill-formed UTF-8 string") from None
    if "\x00" in text:
        raise MQTTProtocolError("MQTT-1.5.3-2", "UTF-8 string contains U+0000")
    return text, stop


def encode_utf8(text: str) -> bytes:
    """Encode `text` as a length-prefixed UTF-8 string, enforcing MQTT-1.5.3-1/-2 and the length."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        raise MQTTProtocolError("MQTT-1.5.3-1", "string contains a surrogate code point") from None
    if len(data) > 0xFFFF:
        raise MQTTProtocolError(
            "string-too-long", f"UTF-8 string of {len(data)} bytes exceeds 65535 bytes"
        )
    if b"\x00" in data:
        raise MQTTProtocolError("MQTT-1.5.3-2", "string contains U+0000")
    return len(data).to_bytes(2, "big") + data


def read_binary(buf: Buffer, pos: int, end: int) -> tuple[bytes, int]:
    """Read length-prefixed binary data (section 1.5.6 of 5.0; will message and password)."""
    if pos + 2 > end:
        raise _malformed("binary data length runs past the end of the packet")
    stop = pos + 2 + ((buf[pos] << 8) | buf[pos + 1])
    if stop > end:
        raise _malformed("binary data runs past the end of the packet")
    return bytes(buf[pos + 2 : stop]), stop


def encode_binary(data: bytes) -> bytes:
    """Encode `data` as length-prefixed binary data."""
    if len(data) > 0xFFFF:
        raise MQTTProtocolError(
            "binary-too-long", f"binary data of {len(data)} bytes exceeds 65535 bytes"
        )
    return len(data).to_bytes(2, "big") + bytes(data)


# --- Properties ------------------------------------------------------------------------------


def _encode_value(kind: PropertyType, identifier: int, value: Any) -> bytes:
    prefix = encode_varint(identifier)
    if kind in _INT_LIMITS:
        if not isinstance(value, int) or not 0 <= value <= _INT_LIMITS[kind]:
            raise MQTTProtocolError(
                "invalid-property", f"property 0x{identifier:02X} needs an int, got {value!r}"
            )
        return prefix + value.to_bytes(_INT_SIZES[kind], "big")
    if kind is PropertyType.VARINT:
        if not isinstance(value, int):
            raise MQTTProtocolError(
                "invalid-property", f"property 0x{identifier:02X} needs an int, got {value!r}"
            )
        return prefix + encode_varint(value)
    if kind is PropertyType.UTF8:
        if not isinstance(value, str):
            raise MQTTProtocolError(
                "invalid-property", f"property 0x{identifier:02X} needs a str, got {value!r}"
            )
        return prefix + encode_utf8(value)
    if kind is PropertyType.BINARY:
        if not isinstance(value, bytes | bytearray):
            raise MQTTProtocolError(
                "invalid-property", f"property 0x{identifier:02X} needs bytes, got {value!r}"
            )
        return prefix + encode_binary(bytes(value))
    # UTF8_PAIR
    if not (isinstance(value, tuple | list) and len(value) == 2):
        raise MQTTProtocolError(
            "invalid-property", f"property 0x{identifier:02X} needs a (name, value) pair"
        )
    return prefix + encode_utf8(value[0]) + encode_utf8(value[1])


def encode_property_block_content(props: dict[int, Any]) -> bytes:
    """Encode the properties of a block without its length prefix (b"" when `props` is empty).

    Values of repeatable properties (User Property, Subscription Identifier) are lists; each
    element is written as one property, in order. Whether the properties suit a packet type is
    not checked here (see `bridge.mqtt.property_rules`).
    """
    parts: list[bytes] = []
    for identifier, value in props.items():
        kind = PROPERTY_TYPES.get(identifier)
        if kind is None:
            raise MQTTProtocolError("invalid-property", f"unknown property 0x{identifier:02X}")
        if identifier in REPEATABLE_PROPERTIES:
            if not isinstance(value, list):
                raise MQTTProtocolError(
                    "invalid-property", f"repeatable property 0x{identifier:02X} needs a list"
                )
            parts.extend(_encode_value(kind, identifier, item) for item in value)
        else:
            parts.append(_encode_value(kind, identifier, value))
    return b"".join(parts)


def encode_properties(props: dict[int, Any]) -> bytes:
    """Encode a property block: Variable Byte Integer length, then the properties (see
    `encode_property_block_content`)."""
    if not props:
        return b"\x00"
    body = encode_property_block_content(props)
    return encode_varint(len(body)) + body


def decode_properties(
    buf: Buffer,
    pos: int,
    end: int | None = None,
    allowed: frozenset[int] | None = None,
    where: str = "this packet",
) -> tuple[dict[int, Any], int]:
    """Decode the property block starting at `pos` (its length first); return (props, new_pos).

    `end` bounds the read (default: the end of `buf`); a block running past it is malformed.
    With `allowed`, an identifier outside it is malformed too (MQTT 5.0 section 2.2.2.2); `where`
    names the packet (or will) in that error.
    """
    if end is None:
        end = len(buf)
    length, pos = read_varint(buf, pos, end)
    stop = pos + length
    if stop > end:
        raise _malformed("property block runs past the end of the packet")
    props: dict[int, Any] = {}
    while pos < stop:
        identifier, pos = read_varint(buf, pos, stop)
        kind = PROPERTY_TYPES.get(identifier)
        if kind is None:
            raise MQTTProtocolError("invalid-property", f"unknown property 0x{identifier:02X}")
        if allowed is not None and identifier not in allowed:
            raise MQTTProtocolError(
                "invalid-property", f"property 0x{identifier:02X} is not allowed in {where}"
            )
        value: Any
        if kind is PropertyType.BYTE:
            if pos + 1 > stop:
                raise _malformed("property value runs past the property block")
            value = buf[pos]
            pos += 1
        elif kind is PropertyType.TWO_BYTE_INT:
            if pos + 2 > stop:
                raise _malformed("property value runs past the property block")
            value = (buf[pos] << 8) | buf[pos + 1]
            pos += 2
        elif kind is PropertyType.FOUR_BYTE_INT:
            if pos + 4 > stop:
                raise _malformed("property value runs past the property block")
            value = int.from_bytes(buf[pos : pos + 4], "big")
            pos += 4
        elif kind is PropertyType.VARINT:
            value, pos = read_varint(buf, pos, stop)
        elif kind is PropertyType.UTF8:
            value, pos = read_utf8(buf, pos, stop)
        elif kind is PropertyType.BINARY:
            value, pos = read_binary(buf, pos, stop)
        else:
            name, pos = read_utf8(buf, pos, stop)
            text, pos = read_utf8(buf, pos, stop)
            value = (name, text)
        if identifier in REPEATABLE_PROPERTIES:
            props.setdefault(identifier, []).append(value)
        elif identifier in props:
            raise MQTTProtocolError(
                "duplicate-property",
                f"property 0x{identifier:02X} appears more than once",
                reason_code=ReasonCode.PROTOCOL_ERROR,
            )
        else:
            props[identifier] = value
    return props, stop
