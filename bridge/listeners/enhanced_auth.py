"""MQTT 5.0 enhanced authentication on a connection: the AUTH exchange, with SCRAM-SHA-256.

At CONNECT (section 4.12): the CONNECT names the method and carries the client-first message;
the server answers AUTH 0x18 (continue) with server-first; the client answers AUTH 0x18 with
client-final; the server's CONNACK carries server-final. Re-authentication later on the same
connection runs the same steps, started by the client's AUTH 0x19 and ended by the server's AUTH
0x00. A failed exchange at CONNECT is refused with CONNACK 0x86; a failed re-authentication
ends the connection with DISCONNECT 0x87. The SCRAM state machine and the user lookup are in
`bridge.access`; this module only moves their messages in AUTH packets.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from bridge.access import SCRAM_SHA_256, ScramError, UserStoreUnavailable
from bridge.listeners.faults import close_for_fault
from bridge.mqtt import codec
from bridge.mqtt.packets import Auth, Connect
from bridge.mqtt.properties import PropertyId
from bridge.mqtt.reasons import ReasonCode
from bridge.node.flow import PAUSED_FOR_CONNACK

if TYPE_CHECKING:
    from bridge.access import AccessControl
    from bridge.listeners.link import Link

METHODS = frozenset({SCRAM_SHA_256})
"""The authentication methods the bridge speaks."""


class AuthFailed(Exception):
    """The exchange failed: `reason` is the reason code to answer with."""

    def __init__(self, reason: int, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def auth_packet(reason: int, method: str, data: bytes) -> bytes:
    """An AUTH packet of `method` carrying `data`."""
    props: dict[int, Any] = {
        PropertyId.AUTHENTICATION_METHOD: method,
        PropertyId.AUTHENTICATION_DATA: data,
    }
    return codec.encode(Auth(reason, props), 5)


async def run_exchange(
    access: AccessControl,
    method: str,
    client_first: bytes,
    send: Any,
    reply: asyncio.Future[Auth],
    timeout: float,
) -> tuple[str, bytes]:
    """Run one SCRAM exchange: the user name proven and the server-final message to send.
    `send(bytes)` sends the AUTH continue packet; `reply` is completed with the client's next
    AUTH packet. Raises AuthFailed."""
    if method not in METHODS:
        raise AuthFailed(ReasonCode.BAD_AUTHENTICATION_METHOD, f"method {method!r} not supported")
    exchange = access.new_scram_exchange()
    try:
        username = exchange.client_first(client_first)
        credential = await access.scram_credential(username)
        send(
            auth_packet(
                ReasonCode.CONTINUE_AUTHENTICATION, method, exchange.server_first(credential)
            )
        )
        try:
            answer = await asyncio.wait_for(reply, timeout)
        except TimeoutError as exc:
            raise AuthFailed(
                ReasonCode.NOT_AUTHORIZED, f"no AUTH answer within {timeout:.0f} s"
            ) from exc
        if answer.reason_code != ReasonCode.CONTINUE_AUTHENTICATION:
            raise AuthFailed(
                ReasonCode.PROTOCOL_ERROR,
                f"AUTH with reason 0x{answer.reason_code:02X} where 0x18 was due",
            )
        if answer.properties.get(PropertyId.AUTHENTICATION_METHOD) != method:
            raise AuthFailed(ReasonCode.PROTOCOL_ERROR, "AUTH names another method (MQTT-4.12.0-5)")
        final = exchange.client_final(answer.properties.get(PropertyId.AUTHENTICATION_DATA, b""))
    except ScramError as exc:
        raise AuthFailed(
            ReasonCode.BAD_USER_NAME_OR_PASSWORD, f"SCRAM-SHA-256 failed: {exc}"
        ) from exc
    except UserStoreUnavailable as exc:
        raise AuthFailed(ReasonCode.SERVER_UNAVAILABLE, f"user store unavailable: {exc}") from exc
    return username, final


class Authentication:
    """The enhanced authentication of one connection: at CONNECT, and re-authentications."""

    __slots__ = ("conn", "final", "method", "reply")

    def __init__(self, conn: Link, method: str) -> None:
        self.conn = conn
        self.method = method
        self.final = b""
        """The server-final message of the last exchange that succeeded (b"": none yet)."""
        self.reply: asyncio.Future[Auth] | None = None

    @property
    def waiting(self) -> bool:
        """Whether an exchange waits for the client's AUTH."""
        return self.reply is not None

    async def _exchange(self, client_first: bytes, timeout: float) -> tuple[str, bytes]:
        conn = self.conn
        reply = self.reply = conn.loop.create_future()
        try:
            return await run_exchange(
                conn.node.access, self.method, client_first, conn.send, reply, timeout
            )
        finally:
            self.reply = None

    async def at_connect(self, packet: Connect) -> bool:
        """Authenticate before CONNACK; False once refused (CONNACK sent, connection closed)."""
        conn = self.conn
        conn.client_id = packet.client_id  # for the log lines of a refusal
        # The socket is not read while a CONNECT is decided (`bridge.listeners.preauth`), but
        # the client's AUTH answers must be: read while the exchange waits for them.
        conn.release_reading(PAUSED_FOR_CONNACK)
        try:
            username, final = await self._exchange(
                packet.properties.get(PropertyId.AUTHENTICATION_DATA, b""),
                # A backstop only: the connection's deadline, `connect_timeout` from its accept
                # to its CONNACK, ends a login whose client does not answer first.
                2 * conn.node.config.connect_timeout,
            )
        except AuthFailed as failed:
            conn.node.metrics.inc("auth_failures")
            conn.node.lifecycle.admission.refuse(conn, failed.reason, str(failed), 5)
            return False
        finally:
            if not conn.closed:  # (a closed one reads on for a moment: `close`)
                conn.hold_reading(PAUSED_FOR_CONNACK)
        if packet.username is not None and packet.username != username:
            conn.node.metrics.inc("auth_failures")
            conn.node.lifecycle.admission.refuse(
                conn,
                ReasonCode.NOT_AUTHORIZED,
                f"User Name {packet.username!r} is not the user SCRAM proved ({username!r})",
                5,
            )
            return False
        conn.username = username
        self.final = final
        return True

    def on_auth(self, packet: Auth) -> None:
        """AUTH from the client: the answer an exchange waits for, or a re-authentication."""
        reply = self.reply
        if reply is not None:
            if not reply.done():
                reply.set_result(packet)
            return
        method = packet.properties.get(PropertyId.AUTHENTICATION_METHOD)
        if packet.reason_code != ReasonCode.RE_AUTHENTICATE or method != self.method:
            close_for_fault(
                self.conn,
                f"AUTH 0x{packet.reason_code:02X} with method {method!r} out of place "
                "(MQTT-4.12.0-6, -7)",
                ReasonCode.PROTOCOL_ERROR,
            )
            return
        self.conn.node.spawn(self._reauthenticate(packet))

    async def _reauthenticate(self, packet: Auth) -> None:
        conn = self.conn
        try:
            username, final = await self._exchange(
                packet.properties.get(PropertyId.AUTHENTICATION_DATA, b""),
                conn.node.config.connect_timeout,
            )
        except AuthFailed as failed:
            conn.node.metrics.inc("auth_failures")
            conn.close(f"re-authentication failed: {failed}", reason_code=ReasonCode.NOT_AUTHORIZED)
            return
        if username != conn.username and conn.session is not None:
            conn.session.reads_judged = -1  # what it may read is judged anew for this name
        conn.username = username
        self.final = final
        conn.send(auth_packet(ReasonCode.SUCCESS, self.method, final))
