"""A client's way into its session and out of it: the CONNECT it is logged in with, the deadlines
it must keep, the v5 CONNACK and the DISCONNECT.

`bridge.listeners.connection.Connection` moves a client's bytes (reading, writing, flow
control, closing); what the client must say, and when, to be let in and to stay is here:

- **CONNECT.** The first packet starts the login as a task of the node (`PreAuth.log_in`: the
  credentials, then the node's lifecycle, which claims the session and answers CONNACK). Packets
  that arrive meanwhile are held by the connection and handled, in order, once the login ends.
- **Deadlines.** One bucket per connection in the node's `Deadlines` (no loop timer each: an
  idle client must cost little): first the CONNACK's (`connect_timeout`), then, once logged in,
  the keepalive's, 1.5 x the keepalive granted (MQTT-3.1.2-24).
- **v5.** `accept_v5` takes the client's limits from its CONNECT and answers CONNACK with the
  server's.
- **DISCONNECT.** A v5 client may change its session expiry with it; reason 0x04 asks for the
  will all the same.

The functions take the connection as a `Joining`, its view here; they never import `Connection`,
so the listeners' modules form no circle (`bridge.listeners.link`).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from bridge.listeners.enhanced_auth import Authentication
from bridge.listeners.link import Link
from bridge.listeners.preauth import PreAuth
from bridge.listeners.v5 import Version5, connack_accepting
from bridge.mqtt.packets import Connect, Disconnect
from bridge.mqtt.reasons import ReasonCode
from bridge.node.deadlines import NONE, Due
from bridge.node.roles import ClientLink

log = logging.getLogger("bridge.connection")


class Joining(Link, ClientLink, Due, Protocol):
    """A connection as its way in and out sees it: the helpers' view (`Link`), the node's
    (`ClientLink`) and its deadlines' (`Due`), with its login."""

    level: int
    """The protocol level, set here from the CONNECT (read-only to the node)."""
    auth: Authentication | None
    preauth: PreAuth | None
    """What the client may make us hold until its CONNACK (None: logged in, or refused)."""
    connecting: bool
    """True while the login of its CONNECT runs (later packets are held meanwhile)."""
    graceful: bool
    """True once the client ended the session's connection with DISCONNECT (no will)."""
    deadline: int
    """Its bucket in the node's `Deadlines`: the CONNACK's, then the keepalive's."""
    keepalive_limit: float
    """Seconds without a packet after which the client is gone (0: no keepalive yet)."""
    last_rx: float
    """Loop time of the last read (or of reading again after a pause)."""

    def handle_held(self) -> None:
        """Handle the packets held while the client could not be served, in order."""
        ...


def start(conn: Joining, packet: Connect) -> None:
    """The client's CONNECT: log it in, in a task of the node (packets that follow are held)."""
    conn.level = packet.protocol_level
    conn.connecting = True
    if conn.preauth is not None:
        conn.preauth.deciding()  # at once: the login's task starts a loop turn later
    conn.node.spawn(_log_in(conn, packet))


async def _log_in(conn: Joining, packet: Connect) -> None:
    preauth = conn.preauth
    try:
        session = None if preauth is None else await preauth.log_in(packet)
    finally:
        conn.connecting = False
    if session is None or conn.closed:
        return
    conn.preauth = None
    node = conn.node
    conn.deadline = node.deadlines.remove(conn, conn.deadline)
    limits = node.limits.current
    if limits.paces_publishes:
        conn.limit_publishes(limits.client_publish_rate, limits.client_publish_bytes_rate)
    keepalive = conn.keepalive  # granted by the lifecycle (capped by max_keepalive)
    if keepalive:
        conn.keepalive_limit = keepalive * 1.5
        conn.deadline = node.deadlines.add(conn, conn.loop.time() + conn.keepalive_limit)
    conn.handle_held()


def accept_v5(
    conn: Joining, connect_props: dict[int, Any], chosen: dict[int, Any], session_present: bool
) -> None:
    """Accept a v5 CONNECT: take the client's limits, answer CONNACK with the server's (and
    what it `chosen` differently from what the client asked)."""
    config = conn.node.config
    v5 = conn.v5 = Version5(connect_props, config.topic_alias_maximum)
    conn.shared_encoding = 0 if v5.alias_out_max else 5
    conn.max_packet_out = v5.maximum_packet_size
    auth = conn.auth
    conn.send(
        connack_accepting(
            session_present=session_present,
            receive_maximum=conn.receive_maximum,
            maximum_packet_size=config.max_packet_size,
            topic_alias_maximum=config.topic_alias_maximum,
            chosen=chosen,
            auth=None if auth is None else (auth.method, auth.final),
        )
    )


def deadline_due(conn: Joining) -> None:
    """No CONNACK within `connect_timeout`, or the keepalive may have lapsed."""
    conn.deadline = NONE
    if conn.closed:
        return
    if not conn.keepalive_limit:
        if conn.session is None and conn.preauth is not None:
            conn.preauth.timed_out(conn.connecting)
        return
    now = conn.loop.time()
    # A client that is not read is not silent (`release_reading` notes when it is read again).
    idle = 0.0 if conn.flow.pauses else now - conn.last_rx
    if idle >= conn.keepalive_limit:
        conn.node.metrics.inc("keepalive_timeouts")
        conn.close(
            f"keepalive timeout: nothing received for {idle:.1f} s (MQTT-3.1.2-24)",
            reason_code=ReasonCode.KEEP_ALIVE_TIMEOUT,
        )
        return
    conn.deadline = conn.node.deadlines.add(conn, now - idle + conn.keepalive_limit)


def disconnect_received(conn: Joining, packet: Disconnect) -> None:
    """The client said DISCONNECT: a v5 client may change its session expiry with it (or be
    refused for asking wrongly); then the session's connection ends, gracefully unless the
    reason code asks for the will."""
    assert conn.session is not None
    lifecycle = conn.node.lifecycle
    if conn.v5 is not None and not lifecycle.disconnect_v5(conn, conn.session, packet):
        return
    # DISCONNECT with reason 0x04 asks for the will to be published all the same.
    conn.graceful = packet.reason_code != ReasonCode.DISCONNECT_WITH_WILL
    log.debug("client %s: DISCONNECT", conn.client_id)
    lifecycle.disconnected(conn, graceful=conn.graceful)
    conn.graceful = True
    conn.close("DISCONNECT", log_it=False)
