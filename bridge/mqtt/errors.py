"""Errors raised by the MQTT codec and topic helpers.

Every protocol violation is an `MQTTProtocolError` naming the rule it breaks: the normative
statement id of MQTT 3.1.1 (or 5.0) when the specification has one, e.g. ``"MQTT-3.1.2-3"``,
otherwise a short kebab-case name such as ``"malformed-remaining-length"``. The broker closes the
network connection on any of these (MQTT-4.8.0-1).

Each error also carries the MQTT 5.0 `reason_code` a server puts in the CONNACK or DISCONNECT it
sends before closing: 0x81 (Malformed Packet) unless the specification calls the violation a
Protocol Error (0x82); `PacketTooLarge` is 0x95. A 3.1.1 connection has no reason codes and
ignores it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bridge.mqtt.reasons import ReasonCode

if TYPE_CHECKING:
    from bridge.mqtt.packets import Packet

__all__ = ["MQTTProtocolError", "PacketTooLarge"]


class MQTTProtocolError(Exception):
    """A violation of the MQTT protocol found while decoding or encoding a packet.

    `rule` is the normative statement id (or a kebab-case name), `message` a human explanation,
    `reason_code` the MQTT 5.0 reason code that reports it (0x81 Malformed Packet by default,
    0x82 Protocol Error, 0x95 Packet Too Large). When raised by `Decoder.packets()`, `packets`
    holds the packets that were decoded completely in that same call before the violation (in
    stream order), so a caller may still act on them before it closes the connection; it is
    empty otherwise.
    """

    rule: str
    message: str
    reason_code: int
    packets: list[Packet]

    def __init__(
        self, rule: str, message: str, *, reason_code: int = ReasonCode.MALFORMED_PACKET
    ) -> None:
        super().__init__(rule, message)
        self.rule = rule
        self.message = message
        self.reason_code = reason_code
        self.packets = []

    def __str__(self) -> str:
        return f"{self.rule}: {self.message}"

    def __repr__(self) -> str:
        if self.reason_code == ReasonCode.MALFORMED_PACKET:
            return f"{type(self).__name__}({self.rule!r}, {self.message!r})"
        return (
            f"{type(self).__name__}({self.rule!r}, {self.message!r}, "
            f"reason_code=0x{self.reason_code:02X})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword arguments are not in `args`; rebuild through a helper so pickling keeps them.
        return (_rebuild, (type(self), self.rule, self.message, self.reason_code))


def _rebuild(
    cls: type[MQTTProtocolError], rule: str, message: str, reason_code: int
) -> MQTTProtocolError:
    return cls(rule, message, reason_code=reason_code)


class PacketTooLarge(MQTTProtocolError):
    """A packet whose total size (fixed header + remaining length) exceeds the allowed maximum.

    `size` is the total size the fixed header announced, `limit` the maximum that applies.
    """

    size: int
    limit: int

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            "packet-too-large",
            f"packet of {size} bytes exceeds the maximum packet size of {limit} bytes",
            reason_code=ReasonCode.PACKET_TOO_LARGE,
        )
        self.args = (size, limit)
        self.size = size
        self.limit = limit

    def __repr__(self) -> str:
        return f"PacketTooLarge(size={self.size}, limit={self.limit})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.size, self.limit))
