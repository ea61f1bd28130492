"""Decoders of MQTT packet bodies (variable header and payload), one per packet type.

`BODY_DECODERS[packet_type]` turns a complete packet body into a packet object, validating it
strictly for MQTT 3.1.1 / 3.1 and, at ``level >= 5``, for MQTT 5.0: the property blocks (which
identifiers each packet allows and the rules on their values, from `bridge.mqtt.property_rules`),
the reason codes each packet may carry, the subscription options and the AUTH packet.

Framing (fixed header, remaining length, buffering), the inlined PUBLISH fast path (which applies
this module's `check_publish_topic` too) and the one rule that depends on direction (no
Subscription Identifier in a client's PUBLISH) are `bridge.mqtt.decoder.Decoder`'s job; this
module never sees partial packets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from bridge.mqtt.errors import MQTTProtocolError
from bridge.mqtt.packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    PacketType,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
)
from bridge.mqtt.properties import PropertyId, decode_properties, read_binary, read_utf8
from bridge.mqtt.property_rules import (
    ALLOWED_PROPERTIES,
    WILL,
    check_property_values,
    scope_name,
)
from bridge.mqtt.topics import SHARE_PREFIX, validate_topic_name
from bridge.mqtt.wire import (
    SUBACK_CODES_5,
    SUBACK_CODES_311,
    SUPPORTED_PROTOCOLS,
    check_reason_code,
    malformed,
    protocol_error,
)

__all__ = ["BODY_DECODERS", "BodyDecoder"]

_T = PacketType

BodyDecoder = Callable[[bytes, int, int, int, int], Packet]
"""Signature of a body decoder: (buf, pos, end, flags, level) -> packet, the body being
buf[pos:end], `flags` the low nibble of the fixed header and `level` the protocol level."""


def _read_packet_id(buf: bytes, pos: int, end: int, what: str) -> int:
    if pos + 2 > end:
        raise malformed(f"{what} is too short for a packet identifier")
    packet_id = (buf[pos] << 8) | buf[pos + 1]
    if packet_id == 0:
        raise MQTTProtocolError("MQTT-2.3.1-1", f"{what} packet identifier must be non-zero")
    return packet_id


def _check_end(pos: int, end: int, what: str) -> None:
    if pos != end:
        raise malformed(f"{what} has {end - pos} unexpected trailing bytes")


def _read_properties(buf: bytes, pos: int, end: int, scope: int) -> tuple[dict[int, Any], int]:
    """A 5.0 property block for `scope` (a packet type or WILL), with the rules applied."""
    if pos < end and buf[pos] == 0:
        return {}, pos + 1  # the common case: an empty block (length 0)
    props, pos = decode_properties(buf, pos, end, ALLOWED_PROPERTIES[scope], scope_name(scope))
    if props:
        check_property_values(props, scope)
    return props, pos


def _decode_connect(buf: bytes, pos: int, end: int, flags: int, level: int) -> Connect:
    name, pos = read_utf8(buf, pos, end)
    if name not in ("MQTT", "MQIsdp"):
        raise MQTTProtocolError("MQTT-3.1.2-1", f"unknown protocol name {name!r}")
    if pos >= end:
        raise malformed("CONNECT ends before the protocol level")
    protocol_level = buf[pos]
    pos += 1
    if (name, protocol_level) in SUPPORTED_PROTOCOLS:
        return _decode_connect_rest(buf, pos, end, name, protocol_level, protocol_level)
    # Unsupported level: decode what we can, but never fail, so the broker can answer
    # CONNACK 0x01 (MQTT-3.1.2-2).
    try:
        layout = 5 if protocol_level >= 5 else 4
        return _decode_connect_rest(buf, pos, end, name, protocol_level, layout)
    except MQTTProtocolError:
        return Connect(client_id="", protocol_level=protocol_level, protocol_name=name)


def _decode_connect_rest(
    buf: bytes, pos: int, end: int, name: str, protocol_level: int, layout: int
) -> Connect:
    if pos + 3 > end:
        raise malformed("CONNECT ends before the connect flags and keep alive")
    cflags = buf[pos]
    keepalive = (buf[pos + 1] << 8) | buf[pos + 2]
    pos += 3
    if cflags & 0x01:
        raise MQTTProtocolError("MQTT-3.1.2-3", "reserved flag in CONNECT must be 0")
    will_flag = cflags & 0x04
    will_qos = (cflags >> 3) & 0x03
    will_retain = bool(cflags & 0x20)
    has_password = cflags & 0x40
    has_username = cflags & 0x80
    if will_flag:
        if will_qos == 3:
            raise MQTTProtocolError("MQTT-3.1.2-14", "will QoS must not be 3")
    else:
        if will_qos:
            raise MQTTProtocolError("MQTT-3.1.2-13", "will QoS must be 0 when the will flag is 0")
        if will_retain:
            raise MQTTProtocolError(
                "MQTT-3.1.2-15", "will retain must be 0 when the will flag is 0"
            )
    if has_password and not has_username and layout < 5:
        raise MQTTProtocolError(
            "MQTT-3.1.2-22", "password flag must be 0 when the user name flag is 0"
        )
    properties: dict[int, Any] = {}
    if layout >= 5:
        properties, pos = _read_properties(buf, pos, end, _T.CONNECT)
    client_id, pos = read_utf8(buf, pos, end)
    will = None
    if will_flag:
        will_properties: dict[int, Any] = {}
        if layout >= 5:
            will_properties, pos = _read_properties(buf, pos, end, WILL)
        will_topic, pos = read_utf8(buf, pos, end)
        validate_topic_name(will_topic)
        will_payload, pos = read_binary(buf, pos, end)
        will = Will(will_topic, will_payload, will_qos, will_retain, will_properties)
    username = None
    if has_username:
        username, pos = read_utf8(buf, pos, end)
    password = None
    if has_password:
        password, pos = read_binary(buf, pos, end)
    _check_end(pos, end, "CONNECT")
    return Connect(
        client_id,
        bool(cflags & 0x02),
        keepalive,
        username,
        password,
        will,
        protocol_level,
        name,
        properties,
    )


def _decode_connack(buf: bytes, pos: int, end: int, flags: int, level: int) -> Connack:
    if level < 5 and end - pos != 2:
        raise malformed(f"CONNACK remaining length must be 2, got {end - pos}")
    if end - pos < 2:
        raise malformed("CONNACK is too short")
    ack_flags, code = buf[pos], buf[pos + 1]
    if ack_flags & 0xFE:
        raise MQTTProtocolError("connack-reserved-flags", "CONNACK flag bits 7-1 must be 0")
    properties: dict[int, Any] = {}
    if level >= 5:
        check_reason_code(_T.CONNACK, code, "CONNACK")
        if end - pos > 2:
            properties, stop = _read_properties(buf, pos + 2, end, _T.CONNACK)
            _check_end(stop, end, "CONNACK")
    elif code > 5:
        raise MQTTProtocolError("connack-return-code", f"CONNACK return code {code} is reserved")
    if code and ack_flags:
        raise MQTTProtocolError(
            "MQTT-3.2.2-4", "session present must be 0 with a non-zero return code"
        )
    return Connack(code, bool(ack_flags), properties)


def check_publish_topic(topic: str, level: int, aliased: bool) -> None:
    """The rules on a PUBLISH's topic name, for both ways a PUBLISH is decoded (this module's
    and `Decoder`'s inline one): not empty, unless a 5.0 PUBLISH names a Topic Alias instead
    (MQTT-4.7.3-1, 3.3.2.3.4), and no wildcard (MQTT-3.3.2-2). The UTF-8 rules are
    `read_utf8`'s."""
    if not topic:
        if level < 5:
            raise MQTTProtocolError("MQTT-4.7.3-1", "PUBLISH topic name must not be empty")
        if not aliased:
            raise protocol_error(
                "MQTT-4.7.3-1", "PUBLISH with an empty topic name needs a Topic Alias"
            )
    elif "+" in topic or "#" in topic:
        raise MQTTProtocolError("MQTT-3.3.2-2", "PUBLISH topic name must not contain wildcards")


def _decode_publish(buf: bytes, pos: int, end: int, flags: int, level: int) -> Publish:
    qos = (flags >> 1) & 3
    topic, pos = read_utf8(buf, pos, end)
    packet_id = None
    if qos:
        packet_id = _read_packet_id(buf, pos, end, "PUBLISH")
        pos += 2
    properties: dict[int, Any] = {}
    if level >= 5:
        properties, pos = _read_properties(buf, pos, end, _T.PUBLISH)
    check_publish_topic(topic, level, PropertyId.TOPIC_ALIAS in properties)
    return Publish(
        topic,
        buf[pos:end],
        qos,
        bool(flags & 0x01),
        bool(flags & 0x08),
        packet_id,
        properties,
    )


_AckClass = type[Puback] | type[Pubrec] | type[Pubrel] | type[Pubcomp]


def _make_ack_decoder(
    cls: _AckClass, packet_type: int, what: str
) -> Callable[[bytes, int, int, int, int], Puback | Pubrec | Pubrel | Pubcomp]:
    def decode(
        buf: bytes, pos: int, end: int, flags: int, level: int
    ) -> Puback | Pubrec | Pubrel | Pubcomp:
        size = end - pos
        if size != 2 and (level < 5 or size < 2):
            raise malformed(f"{what} remaining length must be 2, got {size}")
        packet_id = _read_packet_id(buf, pos, end, what)
        if size == 2:
            return cls(packet_id)
        reason = buf[pos + 2]
        check_reason_code(packet_type, reason, what)
        properties: dict[int, Any] = {}
        if size > 3:
            properties, stop = _read_properties(buf, pos + 3, end, packet_type)
            _check_end(stop, end, what)
        return cls(packet_id, reason, properties)

    return decode


def _decode_subscribe(buf: bytes, pos: int, end: int, flags: int, level: int) -> Subscribe:
    packet_id = _read_packet_id(buf, pos, end, "SUBSCRIBE")
    pos += 2
    properties: dict[int, Any] = {}
    if level >= 5:
        properties, pos = _read_properties(buf, pos, end, _T.SUBSCRIBE)
    if pos >= end:
        raise protocol_error("MQTT-3.8.3-3", "SUBSCRIBE must contain at least one filter")
    subscriptions = []
    while pos < end:
        topic_filter, pos = read_utf8(buf, pos, end)
        if not topic_filter:
            raise MQTTProtocolError("MQTT-4.7.3-1", "topic filter must not be empty")
        if pos >= end:
            raise malformed("SUBSCRIBE filter without its requested QoS byte")
        options = buf[pos]
        pos += 1
        qos = options & 0x03
        if level >= 5:
            if options & 0xC0:
                raise MQTTProtocolError(
                    "MQTT-3.8.3-5", "reserved bits of subscription options must be 0"
                )
            if qos == 3:
                raise protocol_error("invalid-subscription-options", "maximum QoS must not be 3")
            retain_handling = (options >> 4) & 0x03
            if retain_handling == 3:
                raise protocol_error(
                    "invalid-subscription-options", "retain handling must not be 3"
                )
            no_local = bool(options & 0x04)
            if no_local and topic_filter.startswith(SHARE_PREFIX):
                raise protocol_error(
                    "MQTT-3.8.3-4", "No Local must not be set on a shared subscription"
                )
            subscriptions.append(
                Subscription(topic_filter, qos, no_local, bool(options & 0x08), retain_handling)
            )
        else:
            if options & 0xFC or qos == 3:
                raise MQTTProtocolError(
                    "MQTT-3-8.3-4",
                    f"requested QoS byte 0x{options:02X} must have bits 7-2 zero and QoS <= 2",
                )
            subscriptions.append(Subscription(topic_filter, qos))
    return Subscribe(packet_id, subscriptions, properties)


def _decode_suback(buf: bytes, pos: int, end: int, flags: int, level: int) -> Suback:
    packet_id = _read_packet_id(buf, pos, end, "SUBACK")
    pos += 2
    properties: dict[int, Any] = {}
    if level >= 5:
        properties, pos = _read_properties(buf, pos, end, _T.SUBACK)
    codes = list(buf[pos:end])
    if not codes:
        raise malformed("SUBACK must contain at least one return code")
    allowed = SUBACK_CODES_5 if level >= 5 else SUBACK_CODES_311
    for code in codes:
        if code not in allowed:
            raise protocol_error("MQTT-3.9.3-2", f"SUBACK return code 0x{code:02X} is reserved")
    return Suback(packet_id, codes, properties)


def _decode_unsubscribe(buf: bytes, pos: int, end: int, flags: int, level: int) -> Unsubscribe:
    packet_id = _read_packet_id(buf, pos, end, "UNSUBSCRIBE")
    pos += 2
    properties: dict[int, Any] = {}
    if level >= 5:
        properties, pos = _read_properties(buf, pos, end, _T.UNSUBSCRIBE)
    if pos >= end:
        raise protocol_error("MQTT-3.10.3-2", "UNSUBSCRIBE must contain at least one filter")
    filters = []
    while pos < end:
        topic_filter, pos = read_utf8(buf, pos, end)
        if not topic_filter:
            raise MQTTProtocolError("MQTT-4.7.3-1", "topic filter must not be empty")
        filters.append(topic_filter)
    return Unsubscribe(packet_id, filters, properties)


def _decode_unsuback(buf: bytes, pos: int, end: int, flags: int, level: int) -> Unsuback:
    if level < 5 and end - pos != 2:
        raise malformed(f"UNSUBACK remaining length must be 2, got {end - pos}")
    packet_id = _read_packet_id(buf, pos, end, "UNSUBACK")
    if level < 5:
        return Unsuback(packet_id)
    properties, pos = _read_properties(buf, pos + 2, end, _T.UNSUBACK)
    codes = list(buf[pos:end])
    for code in codes:
        check_reason_code(_T.UNSUBACK, code, "UNSUBACK")
    return Unsuback(packet_id, codes, properties)


def _decode_pingreq(buf: bytes, pos: int, end: int, flags: int, level: int) -> Pingreq:
    if end != pos:
        raise malformed(f"PINGREQ remaining length must be 0, got {end - pos}")
    return Pingreq()


def _decode_pingresp(buf: bytes, pos: int, end: int, flags: int, level: int) -> Pingresp:
    if end != pos:
        raise malformed(f"PINGRESP remaining length must be 0, got {end - pos}")
    return Pingresp()


def _decode_disconnect(buf: bytes, pos: int, end: int, flags: int, level: int) -> Disconnect:
    if end == pos:
        return Disconnect()
    if level < 5:
        raise malformed(f"DISCONNECT remaining length must be 0, got {end - pos}")
    reason = buf[pos]
    check_reason_code(_T.DISCONNECT, reason, "DISCONNECT")
    properties: dict[int, Any] = {}
    if end - pos > 1:
        properties, stop = _read_properties(buf, pos + 1, end, _T.DISCONNECT)
        _check_end(stop, end, "DISCONNECT")
    return Disconnect(reason, properties)


def _decode_auth(buf: bytes, pos: int, end: int, flags: int, level: int) -> Auth:
    if level < 5:  # pragma: no cover - the Decoder rejects type 15 below 5.0 by its first byte
        raise MQTTProtocolError("invalid-packet-type", "AUTH needs MQTT 5.0")
    if end == pos:
        return Auth()  # the short form: Success, no properties
    if end - pos < 2:
        raise malformed("AUTH with a reason code needs a property length")
    reason = buf[pos]
    check_reason_code(_T.AUTH, reason, "AUTH")
    properties, stop = decode_properties(
        buf, pos + 1, end, ALLOWED_PROPERTIES[_T.AUTH], scope_name(_T.AUTH)
    )
    _check_end(stop, end, "AUTH")
    check_property_values(properties, _T.AUTH)  # also when empty: AUTH needs its method
    return Auth(reason, properties)


def _decode_reserved(buf: bytes, pos: int, end: int, flags: int, level: int) -> Packet:
    raise MQTTProtocolError("invalid-packet-type", "reserved packet type")  # pragma: no cover


BODY_DECODERS: Final[tuple[BodyDecoder, ...]] = (
    _decode_reserved,
    _decode_connect,
    _decode_connack,
    _decode_publish,
    _make_ack_decoder(Puback, _T.PUBACK, "PUBACK"),
    _make_ack_decoder(Pubrec, _T.PUBREC, "PUBREC"),
    _make_ack_decoder(Pubrel, _T.PUBREL, "PUBREL"),
    _make_ack_decoder(Pubcomp, _T.PUBCOMP, "PUBCOMP"),
    _decode_subscribe,
    _decode_suback,
    _decode_unsubscribe,
    _decode_unsuback,
    _decode_pingreq,
    _decode_pingresp,
    _decode_disconnect,
    _decode_auth,
)
"""Body decoder per packet type (the high nibble of the first byte); the Decoder rejects type 0,
and type 15 (AUTH) below MQTT 5.0, before a body decoder is called."""
