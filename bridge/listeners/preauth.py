"""What a connection may make the node hold before its CONNACK: one room for the rules that keep
a party that has not logged in from starving the node or the honest clients.

* **A socket is admitted or closed at once.** Past `max_unauthenticated` sockets without a
  CONNACK (or `max_unauthenticated_per_address` from one IP address) a new one is closed before
  a byte of it is read (`bridge.access.login_guard.UnauthenticatedSockets`).
* **Its bytes are bounded.** Until its CONNACK a client may send `max_unauthenticated_bytes`
  (its CONNECT and whatever it sends after it without waiting); one byte more closes it, so the
  packets held for a CONNECT being decided stay small.
* **It is not read while its CONNECT is decided.** From the CONNECT to the decision the socket
  is paused (`PAUSED_FOR_CONNACK`); TCP flow control then holds back the rest in the client's
  buffers, not ours. SCRAM's AUTH round trips read again while they wait for the client.
* **One deadline covers the whole login**: `connect_timeout` runs from the accept to the
  CONNACK; a CONNECT still being decided then (its password check still queued) is answered
  "server busy" (CONNACK 0x89, 3.1.1: 3).

Closures for these reasons are counted and logged at most once per
`bridge.access.login_guard.LOG_INTERVAL` seconds, with how many more there were: a flood must not
flood the log too.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from bridge.listeners.enhanced_auth import METHODS, Authentication
from bridge.listeners.link import Link
from bridge.mqtt import codec
from bridge.mqtt.packets import Connack, Connect
from bridge.mqtt.properties import PropertyId
from bridge.mqtt.reasons import ReasonCode, connack_311
from bridge.node.admission import source_address
from bridge.node.flow import PAUSED_FOR_CONNACK
from bridge.node.roles import ClientLink

if TYPE_CHECKING:
    from bridge.session import Session

log = logging.getLogger("bridge.connection")


class LoggingIn(Link, ClientLink, Protocol):
    """A connection before its CONNACK, as `PreAuth` sees it: a `Link` that the node's
    lifecycle takes as a `ClientLink`, with its enhanced authentication."""

    auth: Authentication | None


class PreAuth:
    """The bounds on one connection from its accept to its CONNACK (then it is dropped)."""

    __slots__ = ("conn", "connect_seen", "limit", "received", "source")

    def __init__(self, conn: LoggingIn, source: str) -> None:
        self.conn = conn
        self.connect_seen = False
        """Whether its CONNECT was read (then a refusal is a CONNACK)."""
        self.source = source
        """The IP address the connection is counted under."""
        self.received = 0
        """Bytes the client sent so far."""
        self.limit = conn.node.config.max_unauthenticated_bytes

    @classmethod
    def arrive(cls, conn: LoggingIn) -> PreAuth | None:
        """Count a new connection as not logged in; None once it was closed at once (a limit
        of sockets without a CONNACK is reached)."""
        node = conn.node
        source = source_address(conn.peer)
        refused = node.unauthenticated.arrive(source)
        if refused is None:
            return cls(conn, source)
        node.metrics.inc("unauthenticated_refused")
        _log_throttled(conn, f"closed at once: {refused}")
        conn.close(refused, log_it=False)
        return None

    def take(self, size: int, packets: list[Any]) -> bool:
        """The client sent `size` more bytes, which brought `packets`: False once that is over
        `max_unauthenticated_bytes` (then the client is told, if its CONNECT was among them or
        before, and the connection closed with the packets unhandled)."""
        self.received += size
        if self.received <= self.limit:
            return True
        conn = self.conn
        conn.node.metrics.inc("unauthenticated_too_many_bytes")
        why = f"sent more than max_unauthenticated_bytes={self.limit} before its CONNACK"
        _log_throttled(conn, why)
        level = conn.level
        if not self.connect_seen and packets and type(packets[0]) is Connect:
            self.connect_seen = True
            level = packets[0].protocol_level
        self._refuse(ReasonCode.PACKET_TOO_LARGE, why, level)
        return False

    async def log_in(self, packet: Connect) -> Session | None:
        """Decide the CONNECT, the socket unread meanwhile (`deciding` was called as it
        arrived): its turn under `connection_rate`, the MQTT 5.0 enhanced authentication it
        asks for, then the node's admission and session. The session, or None once refused
        (answered and closed). On success the connection no longer counts as not logged in."""
        conn = self.conn
        node = conn.node
        try:
            # The connection rate first: a flood of logins must not cost SCRAM work either.
            if not await node.lifecycle.admission.paced(conn, packet):
                return None
            method = packet.properties.get(PropertyId.AUTHENTICATION_METHOD)
            if method in METHODS and packet.protocol_level >= 5 and node.access.scram_available:
                conn.auth = Authentication(conn, method)
                if not await conn.auth.at_connect(packet):
                    return None
            session = await node.lifecycle.connect(conn, packet)
        finally:
            self.decided()
        if session is not None and not conn.closed:
            self.leave()
        return session

    def deciding(self) -> None:
        """The CONNECT arrived: read nothing more until it is decided."""
        self.connect_seen = True
        self.conn.hold_reading(PAUSED_FOR_CONNACK)

    def waiting_for_client(self) -> None:
        """The login waits for the client's answer (a SCRAM AUTH): read it."""
        self.conn.release_reading(PAUSED_FOR_CONNACK)

    def decided(self) -> None:
        """The CONNECT was decided (accepted or refused): reading may go on."""
        self.conn.release_reading(PAUSED_FOR_CONNACK)

    def leave(self) -> None:
        """The connection logged in or closed: it no longer counts as not logged in."""
        self.conn.node.unauthenticated.leave(self.source)

    def timed_out(self, connecting: bool) -> None:
        """`connect_timeout` passed without a CONNACK: close, answering a CONNECT still being
        decided with "server busy"."""
        conn = self.conn
        timeout = conn.node.config.connect_timeout
        conn.node.metrics.inc("logins_timed_out")
        if not connecting:
            why = f"no CONNECT within connect_timeout={timeout} s"
            _log_throttled(conn, why)
            conn.close(why, log_it=False)
            return
        why = f"login not decided within connect_timeout={timeout} s"
        _log_throttled(conn, why)
        self._refuse(ReasonCode.SERVER_BUSY, why, conn.level)

    def _refuse(self, code: int, why: str, level: int) -> None:
        """Close; a client whose CONNECT (of protocol `level`) was read is first answered with
        a refusing CONNACK."""
        conn = self.conn
        if self.connect_seen and level >= 5:
            props: dict[int, Any] = {PropertyId.REASON_STRING: why[:200]}
            conn.send(codec.encode(Connack(code, False, props), 5))
        elif self.connect_seen:
            conn.send(codec.encode(Connack(connack_311(code), False)))
        conn.close(why, log_it=False)


def _log_throttled(conn: Link, why: str) -> None:
    """Log why a connection was closed before its CONNACK, unless a line was logged a moment
    ago (`login_guard.LOG_INTERVAL`)."""
    throttle = conn.node.unauthenticated.log_throttle
    log_it, suppressed = throttle.note(conn.loop.time())
    if log_it:
        more = f" ({suppressed} more since the last line)" if suppressed else ""
        log.warning("client from %s: %s%s", conn.peer, why, more)
