"""The packets a logged-in client sends besides PUBLISH and the acknowledgements of what it was
sent: SUBSCRIBE, UNSUBSCRIBE, PINGREQ, DISCONNECT, AUTH and PUBREL, each handed to the part of the
node or of the connection that answers it.

`Connection._handle` calls the handlers of the two packets of every QoS 1 message (PUBLISH and
PUBACK) directly and looks the others up in `HANDLERS`, made once for the class: a table per
connection cost ~0.9 KiB of each connection's memory
(docs/performance/2026-11-22-connection-capacity.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from bridge.listeners import delivery_acks
from bridge.listeners.enhanced_auth import Authentication
from bridge.listeners.faults import close_for_fault
from bridge.listeners.inbound import Inbound
from bridge.listeners.link import Link
from bridge.mqtt import codec
from bridge.mqtt.packets import (
    Auth,
    Disconnect,
    Pingreq,
    Pingresp,
    Pubcomp,
    Pubrec,
    Pubrel,
    Subscribe,
    Unsubscribe,
)
from bridge.mqtt.reasons import ReasonCode
from bridge.node.roles import ClientLink

log = logging.getLogger("bridge.connection")

PINGRESP = codec.encode(Pingresp())


class Controlled(Link, ClientLink, Protocol):
    """A connection as these handlers see it: its helpers' view (`Link`) and the node's
    (`ClientLink`), with its enhanced authentication, its inbound side and its end."""

    auth: Authentication | None

    @property
    def inbound(self) -> Inbound:
        """What the client publishes (`bridge.listeners.inbound`)."""
        ...

    def disconnect_received(self, packet: Disconnect) -> None:
        """The client said DISCONNECT: end the session's connection as it asks."""
        ...


def on_subscribe(conn: Controlled, packet: Subscribe) -> None:
    assert conn.session is not None
    conn.node.subscriptions.subscribe(conn, conn.session, packet)


def on_unsubscribe(conn: Controlled, packet: Unsubscribe) -> None:
    assert conn.session is not None
    conn.node.subscriptions.unsubscribe(conn, conn.session, packet)


def on_pingreq(conn: Controlled, packet: Pingreq) -> None:
    conn.send(PINGRESP)


def on_auth(conn: Controlled, packet: Auth) -> None:
    auth = conn.auth
    if auth is None:
        close_for_fault(
            conn,
            "AUTH without enhanced authentication at CONNECT (MQTT-4.12.0-7)",
            ReasonCode.PROTOCOL_ERROR,
        )
        return
    auth.on_auth(packet)


def on_pubrel(conn: Controlled, packet: Pubrel) -> None:
    conn.inbound.on_pubrel(packet)


def on_disconnect(conn: Controlled, packet: Disconnect) -> None:
    conn.disconnect_received(packet)


HANDLERS: dict[type, Callable[[Controlled, Any], None]] = {
    Pubrec: delivery_acks.on_pubrec,
    Pubrel: on_pubrel,
    Pubcomp: delivery_acks.on_pubcomp,
    Subscribe: on_subscribe,
    Unsubscribe: on_unsubscribe,
    Pingreq: on_pingreq,
    Disconnect: on_disconnect,
    Auth: on_auth,
}
"""Packet type -> handler, for every packet a logged-in client may send but PUBLISH and PUBACK."""
