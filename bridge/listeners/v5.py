"""What an MQTT 5.0 connection adds to a 3.1.1 one: the client's limits, topic aliases both
ways, and the PUBLISH properties the server sends.

`Version5` is created when a v5 CONNECT is accepted and lives as long as its connection
(`Connection.v5`; None for 3.1.1). It is pure bookkeeping, no I/O: the connection asks it how
to encode a message for this client, and whether an incoming topic alias is valid.
"""

from __future__ import annotations

import time
from typing import Any

from bridge.mqtt import codec
from bridge.mqtt.packets import Connack, Publish
from bridge.mqtt.properties import PropertyId
from bridge.mqtt.reasons import ReasonCode
from bridge.storage import metadata
from bridge.storage.base import Message

_P = PropertyId

NO_LIMIT = 268_435_460
"""The client set no Maximum Packet Size: only the protocol's own limit applies."""


class ProtocolFault(Exception):
    """A v5 client broke a rule the connection enforces: answered with DISCONNECT `reason`."""

    def __init__(self, reason: int, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class Version5:
    """The MQTT 5.0 state of one connection."""

    __slots__ = (
        "alias_in",
        "alias_in_max",
        "alias_out",
        "alias_out_max",
        "maximum_packet_size",
        "problem_information",
        "receive_maximum",
        "response_information",
    )

    def __init__(self, connect_props: dict[int, Any], topic_alias_maximum: int) -> None:
        self.receive_maximum: int = connect_props.get(_P.RECEIVE_MAXIMUM, 65535)
        """QoS 1/2 messages the client takes unacknowledged (our in-flight window to it)."""
        self.maximum_packet_size: int = connect_props.get(_P.MAXIMUM_PACKET_SIZE, NO_LIMIT)
        """The largest packet the client accepts: larger messages are not sent to it."""
        self.alias_out_max: int = connect_props.get(_P.TOPIC_ALIAS_MAXIMUM, 0)
        """Topic aliases the client accepts from us (0: none)."""
        self.problem_information = connect_props.get(_P.REQUEST_PROBLEM_INFORMATION, 1) == 1
        """Whether reason strings may go into packets other than CONNACK and DISCONNECT."""
        self.response_information = connect_props.get(_P.REQUEST_RESPONSE_INFORMATION, 0) == 1
        self.alias_in_max = topic_alias_maximum
        """Topic aliases we accept from the client (what CONNACK told it)."""
        self.alias_in: dict[int, str] = {}
        self.alias_out: dict[str, int] = {}
        """Topic -> alias, least recently used first."""

    # -- client -> server ------------------------------------------------------------------------

    def resolve_topic(self, packet: Publish) -> str:
        """The topic of an incoming PUBLISH, through its Topic Alias if it carries one (a
        topic with an alias sets the alias). Raises ProtocolFault for a bad alias."""
        alias = packet.properties.get(_P.TOPIC_ALIAS)
        if alias is None:
            return packet.topic  # (an empty topic without an alias is refused by the codec)
        if not 0 < alias <= self.alias_in_max:
            raise ProtocolFault(
                ReasonCode.TOPIC_ALIAS_INVALID,
                f"Topic Alias {alias} outside 1..{self.alias_in_max} (MQTT-3.3.2-9)",
            )
        if packet.topic:
            self.alias_in[alias] = packet.topic
            return packet.topic
        topic = self.alias_in.get(alias)
        if topic is None:
            raise ProtocolFault(
                ReasonCode.PROTOCOL_ERROR, f"Topic Alias {alias} used before it was set"
            )
        return topic

    # -- server -> client ------------------------------------------------------------------------

    def _alias(self, topic: str) -> tuple[int, bool]:
        """The alias to send `topic` with (0: none) and whether the topic must go too (the
        alias is new or was moved to this topic). Least recently used aliases are reused."""
        aliases = self.alias_out
        alias = aliases.pop(topic, 0)
        if alias:
            aliases[topic] = alias  # most recently used now
            return alias, False
        if len(topic) < 3:
            return 0, True  # an alias would save nothing
        if len(aliases) < self.alias_out_max:
            alias = len(aliases) + 1
        else:
            oldest = next(iter(aliases))
            alias = aliases.pop(oldest)
        aliases[topic] = alias
        return alias, True

    def encode_publish(
        self,
        message: Message,
        qos: int,
        retain: bool,
        dup: bool,
        packet_id: int | None,
        sub_ids: tuple[int, ...] = (),
        *,
        alias: bool = True,
    ) -> bytes | None:
        """The PUBLISH of `message` for this client: its stored metadata as properties (the
        expiry reduced by the time it waited), the Subscription Identifiers it matched, a topic
        alias where that saves bytes. None if the packet would exceed the client's Maximum
        Packet Size (it must not be sent, MQTT-3.1.2-25)."""
        if not message.properties and not sub_ids and not self.alias_out_max:
            # The common case: nothing of this client's or the message's own to add.
            data = codec.encode_publish5(
                message.topic, message.payload, qos, retain, dup, packet_id
            )
            return data if len(data) <= self.maximum_packet_size else None
        props = (
            metadata.to_publish(message.properties, message.timestamp_ms, int(time.time() * 1000))
            if message.properties
            else {}
        )
        if sub_ids:
            props[_P.SUBSCRIPTION_IDENTIFIER] = list(sub_ids)
        topic = message.topic
        aliased = 0
        if alias and self.alias_out_max:
            aliased, with_topic = self._alias(topic)
            if aliased:
                props[_P.TOPIC_ALIAS] = aliased
                if not with_topic:
                    topic = ""
        data = codec.encode_publish5(
            topic,
            message.payload,
            qos,
            retain,
            dup,
            packet_id,
            codec.encode_property_block_content(props) if props else b"",
        )
        if len(data) <= self.maximum_packet_size:
            return data
        if aliased and not topic:
            # Never sent: the client does not know the alias is still this topic's; forget it.
            self.alias_out.pop(message.topic, None)
        return None


def connack_accepting(
    *,
    session_present: bool,
    receive_maximum: int,
    maximum_packet_size: int,
    topic_alias_maximum: int,
    chosen: dict[int, Any],
    auth: tuple[str, bytes] | None,
) -> bytes:
    """The CONNACK accepting a v5 CONNECT: the properties that tell the client what this server
    does (MQTT-3.2.2.3), what it `chosen` for this connection differently from what the client
    asked (keepalive, expiry, ClientId), and the enhanced authentication (method, data) it
    completed."""
    props: dict[int, Any] = {
        _P.RECEIVE_MAXIMUM: receive_maximum,
        _P.TOPIC_ALIAS_MAXIMUM: topic_alias_maximum,
        _P.RETAIN_AVAILABLE: 1,
        _P.WILDCARD_SUBSCRIPTION_AVAILABLE: 1,
        _P.SUBSCRIPTION_IDENTIFIER_AVAILABLE: 1,
        _P.SHARED_SUBSCRIPTION_AVAILABLE: 1,
    }
    if maximum_packet_size < NO_LIMIT:
        props[_P.MAXIMUM_PACKET_SIZE] = maximum_packet_size
    props.update(chosen)
    if auth is not None:
        props[_P.AUTHENTICATION_METHOD], props[_P.AUTHENTICATION_DATA] = auth
    return codec.encode(Connack(0, session_present, props), 5)


def disconnect_saying(reason_code: int, reason: str, server_reference: str = "") -> bytes:
    """The DISCONNECT that tells a v5 client why: `reason_code`, the reason as Reason String (at
    most 200 characters), and the `server_reference` to use instead, if any."""
    props: dict[int, Any] = {_P.REASON_STRING: reason[:200]}
    if server_reference:
        props[_P.SERVER_REFERENCE] = server_reference
    return codec.encode_disconnect5(reason_code, props)
