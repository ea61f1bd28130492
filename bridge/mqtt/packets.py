"""MQTT control packets as plain data.

Every packet is a small slotted dataclass, except PUBLISH and its acknowledgements: plain
classes with the same fields, equality and repr, made faster (`bridge.fields`). The codec
(`bridge.mqtt.codec`) turns bytes into these and back; nothing here does I/O. Fields that only
MQTT 5.0 uses (`properties`, reason codes) are present already, so 5.0 support extends the codec
without changing the shape of the packets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Final

from bridge.fields import Fields


class PacketType(IntEnum):
    """The control packet type, the high nibble of the fixed header's first byte."""

    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


class ProtocolLevel(IntEnum):
    """The protocol level byte of CONNECT."""

    MQTT_3_1 = 3
    MQTT_3_1_1 = 4
    MQTT_5 = 5


class ConnackCode(IntEnum):
    """CONNACK return codes of MQTT 3.1.1 (section 3.2.2.3)."""

    ACCEPTED = 0
    UNACCEPTABLE_PROTOCOL_VERSION = 1
    IDENTIFIER_REJECTED = 2
    SERVER_UNAVAILABLE = 3
    BAD_USERNAME_OR_PASSWORD = 4
    NOT_AUTHORIZED = 5


SUBACK_FAILURE = 0x80
"""The SUBACK return code for a refused subscription (MQTT-3.9.3)."""

Properties = dict[int, Any]
"""MQTT 5.0 properties by identifier; always empty for 3.1.1."""


@dataclass(slots=True)
class Will:
    """The will message carried in CONNECT."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Connect:
    """CONNECT: the first packet a client sends."""

    client_id: str
    clean_session: bool = True
    keepalive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    protocol_level: int = ProtocolLevel.MQTT_3_1_1
    protocol_name: str = "MQTT"
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Connack:
    """CONNACK: the server's answer to CONNECT."""

    return_code: int = ConnackCode.ACCEPTED
    session_present: bool = False
    properties: Properties = field(default_factory=dict)


class Publish(Fields):
    """PUBLISH, in either direction. `packet_id` is None exactly when `qos` is 0.

    A plain class, not a dataclass, as are the acknowledgements below: one is made for every
    message (`bridge.fields` says why)."""

    FIELDS = ("topic", "payload", "qos", "retain", "dup", "packet_id", "properties")
    __slots__ = FIELDS

    def __init__(
        self,
        topic: str,
        payload: bytes = b"",
        qos: int = 0,
        retain: bool = False,
        dup: bool = False,
        packet_id: int | None = None,
        properties: Properties | None = None,
    ) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.dup = dup
        self.packet_id = packet_id
        self.properties: Properties = {} if properties is None else properties


class _Ack(Fields):
    """The shape PUBACK, PUBREC, PUBREL and PUBCOMP share."""

    FIELDS = ("packet_id", "reason_code", "properties")
    __slots__ = FIELDS

    def __init__(
        self, packet_id: int, reason_code: int = 0, properties: Properties | None = None
    ) -> None:
        self.packet_id = packet_id
        self.reason_code = reason_code
        self.properties: Properties = {} if properties is None else properties


class Puback(_Ack):
    """PUBACK: acknowledges a QoS 1 PUBLISH."""

    __slots__ = ()


class Pubrec(_Ack):
    """PUBREC: first answer to a QoS 2 PUBLISH."""

    __slots__ = ()


class Pubrel(_Ack):
    """PUBREL: the publisher releases a QoS 2 packet id."""

    __slots__ = ()


class Pubcomp(_Ack):
    """PUBCOMP: completes a QoS 2 exchange."""

    __slots__ = ()


@dataclass(slots=True)
class Subscription:
    """One topic filter and its requested QoS (plus the 5.0 options, zero for 3.1.1)."""

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(slots=True)
class Subscribe:
    """SUBSCRIBE: one or more filters."""

    packet_id: int
    subscriptions: list[Subscription]
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Suback:
    """SUBACK: one return code per requested filter (granted QoS or 0x80)."""

    packet_id: int
    return_codes: list[int]
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Unsubscribe:
    """UNSUBSCRIBE: one or more filters."""

    packet_id: int
    topic_filters: list[str]
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Unsuback:
    """UNSUBACK (3.1.1 has no payload; 5.0 adds reason codes)."""

    packet_id: int
    reason_codes: list[int] = field(default_factory=list)
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Pingreq:
    """PINGREQ: keepalive from the client."""


@dataclass(slots=True)
class Pingresp:
    """PINGRESP: the server's answer to PINGREQ."""


@dataclass(slots=True)
class Disconnect:
    """DISCONNECT: a clean end of the connection (5.0 adds a reason code)."""

    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Auth:
    """AUTH (MQTT 5.0 only): one step of an enhanced authentication exchange.

    `reason_code` is 0x00 (success), 0x18 (continue authentication) or 0x19 (re-authenticate);
    `properties` carry the Authentication Method and Data.
    """

    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


Packet = (
    Connect
    | Connack
    | Publish
    | Puback
    | Pubrec
    | Pubrel
    | Pubcomp
    | Subscribe
    | Suback
    | Unsubscribe
    | Unsuback
    | Pingreq
    | Pingresp
    | Disconnect
    | Auth
)

TYPE_NUMBERS: Final[dict[type, int]] = {
    Connect: 1,
    Connack: 2,
    Publish: 3,
    Puback: 4,
    Pubrec: 5,
    Pubrel: 6,
    Pubcomp: 7,
    Subscribe: 8,
    Suback: 9,
    Unsubscribe: 10,
    Unsuback: 11,
    Pingreq: 12,
    Pingresp: 13,
    Disconnect: 14,
    Auth: 15,
}
"""Packet class -> its control packet type (`PacketType`), as plain ints for counting."""
