"""Which MQTT 5.0 property may appear in which packet (table 2-4), and the rules on their values.

A *scope* is where a property block sits: a packet type (`PacketType`, 1..15) or `WILL`, the
will properties in CONNECT's payload. `ALLOWED_PROPERTIES[scope]` is the set of identifiers that
scope allows; the decoder hands it to `bridge.mqtt.properties.decode_properties`, which rejects
any other identifier as a Malformed Packet (reason code 0x81, MQTT 5.0 section 2.2.2.2).

`check_property_values` applies what the specification calls Protocol Errors (0x82) once the
block is decoded: byte flags that must be 0 or 1, values that must not be 0, a Subscription
Identifier given twice in SUBSCRIBE, Authentication Data without an Authentication Method, an
AUTH without an Authentication Method. The encoder calls `check_properties` (identifiers and
values) so the server never writes what it would refuse to read.

Rules that depend on the direction of a packet or on connection state (a Subscription Identifier
in a client's PUBLISH, Topic Alias maximums, Receive Maximum flow control) are not here: the
first is `bridge.mqtt.decoder.Decoder`'s, the others the connection's.
"""

from __future__ import annotations

from typing import Any, Final

from bridge.mqtt.errors import MQTTProtocolError
from bridge.mqtt.packets import PacketType
from bridge.mqtt.properties import PropertyId
from bridge.mqtt.wire import protocol_error

__all__ = [
    "ALLOWED_PROPERTIES",
    "WILL",
    "check_properties",
    "check_property_values",
    "scope_name",
]

WILL: Final = 16
"""The scope of the will properties in CONNECT's payload (packet types are 1..15)."""

_P = PropertyId
_T = PacketType

_CONNECT, _CONNACK, _PUBLISH = _T.CONNECT, _T.CONNACK, _T.PUBLISH
_PUBACK, _PUBREC, _PUBREL, _PUBCOMP = _T.PUBACK, _T.PUBREC, _T.PUBREL, _T.PUBCOMP
_SUBSCRIBE, _SUBACK, _UNSUBSCRIBE, _UNSUBACK = _T.SUBSCRIBE, _T.SUBACK, _T.UNSUBSCRIBE, _T.UNSUBACK
_DISCONNECT, _AUTH = _T.DISCONNECT, _T.AUTH

_WHERE_ALLOWED: Final[dict[int, tuple[int, ...]]] = {
    _P.PAYLOAD_FORMAT_INDICATOR: (_PUBLISH, WILL),
    _P.MESSAGE_EXPIRY_INTERVAL: (_PUBLISH, WILL),
    _P.CONTENT_TYPE: (_PUBLISH, WILL),
    _P.RESPONSE_TOPIC: (_PUBLISH, WILL),
    _P.CORRELATION_DATA: (_PUBLISH, WILL),
    _P.SUBSCRIPTION_IDENTIFIER: (_PUBLISH, _SUBSCRIBE),
    _P.SESSION_EXPIRY_INTERVAL: (_CONNECT, _CONNACK, _DISCONNECT),
    _P.ASSIGNED_CLIENT_IDENTIFIER: (_CONNACK,),
    _P.SERVER_KEEP_ALIVE: (_CONNACK,),
    _P.AUTHENTICATION_METHOD: (_CONNECT, _CONNACK, _AUTH),
    _P.AUTHENTICATION_DATA: (_CONNECT, _CONNACK, _AUTH),
    _P.REQUEST_PROBLEM_INFORMATION: (_CONNECT,),
    _P.WILL_DELAY_INTERVAL: (WILL,),
    _P.REQUEST_RESPONSE_INFORMATION: (_CONNECT,),
    _P.RESPONSE_INFORMATION: (_CONNACK,),
    _P.SERVER_REFERENCE: (_CONNACK, _DISCONNECT),
    _P.REASON_STRING: (
        _CONNACK,
        _PUBACK,
        _PUBREC,
        _PUBREL,
        _PUBCOMP,
        _SUBACK,
        _UNSUBACK,
        _DISCONNECT,
        _AUTH,
    ),
    _P.RECEIVE_MAXIMUM: (_CONNECT, _CONNACK),
    _P.TOPIC_ALIAS_MAXIMUM: (_CONNECT, _CONNACK),
    _P.TOPIC_ALIAS: (_PUBLISH,),
    _P.MAXIMUM_QOS: (_CONNACK,),
    _P.RETAIN_AVAILABLE: (_CONNACK,),
    _P.USER_PROPERTY: (
        _CONNECT,
        _CONNACK,
        _PUBLISH,
        WILL,
        _PUBACK,
        _PUBREC,
        _PUBREL,
        _PUBCOMP,
        _SUBSCRIBE,
        _SUBACK,
        _UNSUBSCRIBE,
        _UNSUBACK,
        _DISCONNECT,
        _AUTH,
    ),
    _P.MAXIMUM_PACKET_SIZE: (_CONNECT, _CONNACK),
    _P.WILDCARD_SUBSCRIPTION_AVAILABLE: (_CONNACK,),
    _P.SUBSCRIPTION_IDENTIFIER_AVAILABLE: (_CONNACK,),
    _P.SHARED_SUBSCRIPTION_AVAILABLE: (_CONNACK,),
}
"""Table 2-4 of MQTT 5.0 as written there: for each property, the scopes it may appear in."""

ALLOWED_PROPERTIES: Final[dict[int, frozenset[int]]] = {
    scope: frozenset(pid for pid, scopes in _WHERE_ALLOWED.items() if scope in scopes)
    for scope in (*PacketType, WILL)
}
"""The property identifiers each scope (packet type or `WILL`) allows; empty for PINGREQ and
PINGRESP, which have no property block."""

_SCOPE_NAMES: Final = {**{int(t): t.name for t in PacketType}, WILL: "the will properties"}

_ZERO_OR_ONE: Final = frozenset(
    {
        _P.PAYLOAD_FORMAT_INDICATOR,
        _P.REQUEST_PROBLEM_INFORMATION,
        _P.REQUEST_RESPONSE_INFORMATION,
        _P.MAXIMUM_QOS,
        _P.RETAIN_AVAILABLE,
        _P.WILDCARD_SUBSCRIPTION_AVAILABLE,
        _P.SUBSCRIPTION_IDENTIFIER_AVAILABLE,
        _P.SHARED_SUBSCRIPTION_AVAILABLE,
    }
)
"""Byte properties whose only values are 0 and 1; anything else is a Protocol Error."""

_NOT_ZERO: Final = frozenset(
    {_P.RECEIVE_MAXIMUM, _P.MAXIMUM_PACKET_SIZE, _P.SUBSCRIPTION_IDENTIFIER}
)
"""Properties for which 0 is a Protocol Error (a Subscription Identifier is 1..268,435,455).
A Topic Alias of 0 is left to the receiver, which knows its Topic Alias Maximum and answers both
0 and too large with 0x94 (Topic Alias invalid), as Mosquitto does."""


def scope_name(scope: int) -> str:
    """The packet name (or "the will properties") for error messages."""
    return _SCOPE_NAMES.get(scope) or f"scope {scope}"


def _name(identifier: int) -> str:
    return f"{PropertyId(identifier).name} (0x{identifier:02X})"


def check_property_values(props: dict[int, Any], scope: int) -> None:
    """Raise a Protocol Error (0x82) for a property value, or combination, MQTT 5.0 forbids in
    `scope`. Identifiers are assumed valid for the scope (see `check_properties`)."""
    for identifier, value in props.items():
        if identifier in _ZERO_OR_ONE:
            if value != 0 and value != 1:
                raise protocol_error(
                    "invalid-property-value", f"{_name(identifier)} must be 0 or 1, got {value!r}"
                )
        elif identifier in _NOT_ZERO:
            if identifier == _P.SUBSCRIPTION_IDENTIFIER:
                if isinstance(value, list) and 0 in value:
                    raise protocol_error(
                        "invalid-property-value", f"{_name(identifier)} must not be 0"
                    )
            elif value == 0:
                raise protocol_error("invalid-property-value", f"{_name(identifier)} must not be 0")
    if scope == _SUBSCRIBE:
        sub_ids = props.get(_P.SUBSCRIPTION_IDENTIFIER)
        if isinstance(sub_ids, list) and len(sub_ids) > 1:
            raise protocol_error(
                "duplicate-property", "SUBSCRIBE may carry only one Subscription Identifier"
            )
    elif scope == _AUTH:
        if _P.AUTHENTICATION_METHOD not in props:
            raise protocol_error(
                "authentication-method-missing",
                "an AUTH other than the empty short form needs an Authentication Method",
            )
    elif (
        scope == _CONNECT
        and _P.AUTHENTICATION_DATA in props
        and _P.AUTHENTICATION_METHOD not in props
    ):
        raise protocol_error(
            "authentication-data-without-method",
            "Authentication Data needs an Authentication Method",
        )


def check_properties(props: dict[int, Any], scope: int) -> None:
    """Raise unless `props` may be sent in `scope`: an identifier the scope does not allow is a
    Malformed Packet (0x81), a forbidden value a Protocol Error (0x82). The encoder's check;
    the decoder checks identifiers while it reads them."""
    allowed = ALLOWED_PROPERTIES[scope]
    for identifier in props:
        if identifier not in allowed:
            raise MQTTProtocolError(
                "invalid-property",
                f"property 0x{identifier:02X} is not allowed in {scope_name(scope)}",
            )
    check_property_values(props, scope)
