"""MQTT 5.0 reason codes (section 2.4) and how a 3.1.1 connection says the same thing.

One `ReasonCode` enum for every packet that carries a reason code (CONNACK, PUBACK, PUBREC,
PUBREL, PUBCOMP, SUBACK, UNSUBACK, DISCONNECT, AUTH). The numbers are the specification's; the
names are its names in upper case. `connack_311` maps a 5.0 CONNACK refusal onto the six return
codes a 3.1.1 client understands.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final


class ReasonCode(IntEnum):
    """MQTT 5.0 reason codes (table 2-6)."""

    SUCCESS = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    RE_AUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


_R = ReasonCode

_CONNACK_311: Final[dict[int, int]] = {
    _R.SUCCESS: 0x00,
    _R.UNSUPPORTED_PROTOCOL_VERSION: 0x01,
    _R.CLIENT_IDENTIFIER_NOT_VALID: 0x02,
    _R.SERVER_UNAVAILABLE: 0x03,
    _R.SERVER_BUSY: 0x03,
    _R.SERVER_SHUTTING_DOWN: 0x03,
    _R.USE_ANOTHER_SERVER: 0x03,
    _R.SERVER_MOVED: 0x03,
    _R.QUOTA_EXCEEDED: 0x03,
    _R.CONNECTION_RATE_EXCEEDED: 0x03,
    _R.BAD_USER_NAME_OR_PASSWORD: 0x04,
    _R.BAD_AUTHENTICATION_METHOD: 0x04,
    _R.NOT_AUTHORIZED: 0x05,
    _R.BANNED: 0x05,
    _R.TOPIC_NAME_INVALID: 0x05,  # a reserved will topic: the client may not publish there
}


def connack_311(code: int) -> int:
    """The MQTT 3.1.1 CONNACK return code closest to a 5.0 CONNACK reason code (0x03, server
    unavailable, for the refusals 3.1.1 has no word for)."""
    return _CONNACK_311.get(code, 0x03)
