"""Whether a CONNECT is admitted, and on what terms.

`Admission` checks the protocol version, the ClientId, the bans (and counts connects for flapping
detection, `bridge.access.banlist`), the node's capacity, the credentials and the will's topic
against the ACL; it answers a refused client with CONNACK (a 5.0 reason code, or
for 3.1.1 the return code closest to it) and closes. For an admitted v5 client it settles the
session expiry and keepalive the server grants and what CONNACK must say about them.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from bridge.access.acl import PUBLISH
from bridge.access.auth import AuthResult
from bridge.access.bans import peer_ip
from bridge.access.login_guard import LOG_INTERVAL
from bridge.access.login_queue import LoginsBusy
from bridge.access.ownership import describe, refusal
from bridge.access.ratelimit import LogThrottle
from bridge.counters import Metrics
from bridge.logtext import RefusalLog, client_text, suppressed_note
from bridge.mqtt import codec
from bridge.mqtt.delayed import is_delayed
from bridge.mqtt.packets import Connack, Connect
from bridge.mqtt.properties import PropertyId
from bridge.mqtt.reasons import ReasonCode, connack_311
from bridge.node.quotas import will_fault
from bridge.node.roles import ClientLink
from bridge.storage.metadata import metadata_size

if TYPE_CHECKING:
    from bridge.access import AccessControl
    from bridge.access.banlist import BanList
    from bridge.access.bans import Ban
    from bridge.access.limits import LimitControl
    from bridge.settings import Config

log = logging.getLogger("bridge.node")

_SUPPORTED = frozenset({("MQIsdp", 3), ("MQTT", 4), ("MQTT", 5)})
"""(protocol name, level) pairs a client may connect with."""

_NOT_OWNER_LOG_INTERVAL = 10.0
"""Seconds between log lines about CONNECTs refused for another identity's session."""

_AUTH_REASONS = {
    AuthResult.BAD_CREDENTIALS: ReasonCode.BAD_USER_NAME_OR_PASSWORD,
    AuthResult.NOT_AUTHORIZED: ReasonCode.NOT_AUTHORIZED,
    AuthResult.UNAVAILABLE: ReasonCode.SERVER_UNAVAILABLE,
}


def source_address(peer: str) -> str:
    """The IP address of a `host:port` peer, as the per-address limits count it."""
    ip = peer_ip(peer)
    return peer if ip is None else str(ip)


class Refusable(Protocol):
    """What refusing a CONNECT needs of its connection."""

    client_id: str
    peer: str

    def send(self, data: bytes) -> None:
        """Queue an encoded packet."""
        ...

    def close(self, reason: str, *, log_it: bool = True) -> None:
        """Close after flushing what is queued."""
        ...


class Admission:
    """The checks a CONNECT passes before it gets a session."""

    def __init__(
        self,
        *,
        config: Config,
        access: AccessControl,
        bans: BanList,
        limits: LimitControl,
        metrics: Metrics,
        refusing: Callable[[], int | None],
        topic_fault: Callable[[str], str | None],
    ) -> None:
        self.config = config
        self.access = access
        self.bans = bans
        self.limits = limits
        self.metrics = metrics
        self.refusing = refusing
        """Why the node takes no new clients now (a reason code: draining, at
        max_connections), or None when it does."""
        self.topic_fault = topic_fault
        self.refusals = RefusalLog(config.refused_connect_log_interval)
        """What is wrong with a topic under the configured limits (None: nothing)."""
        self.not_owner_log = LogThrottle(_NOT_OWNER_LOG_INTERVAL)
        """Paces the log lines about CONNECTs refused for another identity's session."""
        self.busy_log = LogThrottle(LOG_INTERVAL)
        """One log line per `LOG_INTERVAL` about logins refused because too many wait: a
        flood of them must not flood the log."""

    async def paced(self, conn: ClientLink, packet: Connect) -> bool:
        """Wait for the CONNECT's turn under the node's `connection_rate`; False once refused
        (CONNACK 0x9F, 3.1.1: 3) because its turn would come after `connection_rate_wait`, or
        once the client left while it waited."""
        wait = self.limits.connection_slot()
        if wait == 0.0:
            return True
        if wait is None:
            self.metrics.inc("connections_rate_refused")
            limits = self.limits.current
            self.refuse(
                conn,
                ReasonCode.CONNECTION_RATE_EXCEEDED,
                f"over connection_rate={limits.connection_rate:g}/s for more than "
                f"connection_rate_wait={limits.connection_rate_wait:g} s",
                packet.protocol_level,
            )
            return False
        self.metrics.inc("connections_rate_delayed")
        await asyncio.sleep(wait)
        return not conn.closed

    def check(self, conn: ClientLink, packet: Connect) -> str | None:
        """The ClientId this CONNECT may use (assigned if empty), or None once refused."""
        cfg = self.config
        if (packet.protocol_name, packet.protocol_level) not in _SUPPORTED:
            self.refuse(
                conn,
                ReasonCode.UNSUPPORTED_PROTOCOL_VERSION,
                f"protocol level {packet.protocol_level} not supported (MQTT-3.1.2-2)",
                4,  # a client of an unknown level is answered as 3.1.1 does: return code 1
            )
            return None
        client_id = packet.client_id
        v5 = packet.protocol_level >= 5
        if not client_id:
            if not packet.clean_session and not v5:
                self.refuse(
                    conn,
                    ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
                    "empty ClientId with clean session 0 (MQTT-3.1.3-8)",
                    packet.protocol_level,
                )
                return None
            if not cfg.allow_zero_length_clientid:
                self.refuse(
                    conn,
                    ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
                    "empty ClientId not allowed by configuration",
                    packet.protocol_level,
                )
                return None
            client_id = f"auto-{uuid.uuid4().hex}"
        elif packet.protocol_level == 3 and len(client_id) > 23:
            self.refuse(
                conn,
                ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
                "MQTT 3.1 ClientId longer than 23 characters",
                packet.protocol_level,
            )
            return None
        if "\x00" in client_id or len(client_id.encode()) > cfg.max_topic_length:
            self.refuse(
                conn,
                ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
                "ClientId too long",
                packet.protocol_level,
            )
            return None
        ban = self.bans.ban_of(client_id, packet.username, conn.peer)
        if ban is not None:
            self.refuse_banned(conn, client_id, ban, packet.protocol_level)
            return None
        refused = self.refusing()
        if refused is not None:
            if refused == ReasonCode.QUOTA_EXCEEDED:
                self.metrics.inc("connections_over_max")
            self.refuse(
                conn,
                refused,
                "node is shutting down"
                if refused == ReasonCode.SERVER_SHUTTING_DOWN
                else f"node is at max_connections={self.limits.current.max_connections}",
                packet.protocol_level,
            )
            return None
        method = packet.properties.get(PropertyId.AUTHENTICATION_METHOD) if v5 else None
        if method is not None and conn.auth_method is None:
            self.refuse(
                conn,
                ReasonCode.BAD_AUTHENTICATION_METHOD,
                f"authentication method {method!r} not supported",
                packet.protocol_level,
            )
            return None
        return client_id

    async def admit(
        self, conn: ClientLink, packet: Connect, client_id: str
    ) -> tuple[bool, str | None, str]:
        """Authenticate and check the will against the ACL: whether the client is admitted, the
        user name it acts as (None: anonymous) and the ClientId it gets (its user name under
        `use_username_as_clientid`). Refused clients are answered here."""
        level = packet.protocol_level
        source = source_address(conn.peer)
        if conn.auth_method is not None:
            # Enhanced authentication (MQTT 5.0 AUTH) already proved who the client is.
            result, username = AuthResult.ACCEPTED, conn.username
        else:
            try:
                result, username = await self.access.authenticate(
                    client_id,
                    packet.username,
                    packet.password,
                    conn.cert_cn,
                    source=source,
                    wanted=lambda: not conn.closed,
                )
            except LoginsBusy as busy:
                if not conn.closed:
                    self.metrics.inc("logins_busy")
                    log_it, suppressed = self.busy_log.note(time.monotonic())
                    if log_it:
                        log.warning(
                            "client from %s: login not checked: %s%s",
                            conn.peer,
                            busy,
                            suppressed_note(suppressed),
                        )
                    why = f"login not checked: {busy}"
                    self.refuse(conn, ReasonCode.SERVER_BUSY, why, level, log_it=False)
                return False, None, client_id
        if conn.closed:
            return False, None, client_id
        if result is not AuthResult.ACCEPTED:
            await self.failed(conn, packet, client_id, result, source)
            return False, None, client_id
        if self.config.use_username_as_clientid:
            if username is None:
                self.refuse(
                    conn,
                    ReasonCode.NOT_AUTHORIZED,
                    "use_username_as_clientid: a client without a user name is refused",
                    level,
                )
                return False, None, client_id
            if "\x00" in username or len(username.encode()) > self.config.max_topic_length:
                self.refuse(
                    conn,
                    ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
                    "use_username_as_clientid: the user name cannot be a ClientId",
                    level,
                )
                return False, None, client_id
            client_id = username
        refused = self.access.clientid_refusal(client_id, username)
        if refused is not None:
            self.metrics.inc("connections_refused_clientid_prefix")
            self.refuse(conn, ReasonCode.NOT_AUTHORIZED, refused, level, client_id)
            return False, None, client_id
        ban = None
        if username != packet.username or client_id != packet.client_id:
            # a certificate's or enhanced authentication's user, or a ClientId set here
            ban = self.bans.ban_of(client_id, username, conn.peer)
        if ban is None and packet.client_id:  # an assigned ClientId is new every time
            ban = await self.bans.connected(client_id)  # flapping?
        if ban is not None:
            if not conn.closed:
                self.refuse_banned(conn, client_id, ban, level)
            return False, None, client_id
        will = packet.will
        if will is not None and metadata_size(will.properties) > self.config.max_message_properties:
            self.refuse(
                conn,
                ReasonCode.QUOTA_EXCEEDED,
                "will properties exceed max_message_properties="
                f"{self.config.max_message_properties} bytes",
                level,
            )
            return False, None, client_id
        fault = will_fault(len(will.payload), self.config.max_will_bytes) if will else None
        if fault:
            self.metrics.inc("quota_refused_will")
            self.refuse(conn, ReasonCode.QUOTA_EXCEEDED, fault, level)
            return False, None, client_id
        if will is not None and (is_delayed(will.topic) or will.topic.startswith("$SYS")):
            # What a client may not publish, its will may not either; a will is delayed by its
            # Will Delay Interval (v5), never by a `$delayed/` topic.
            self.refuse(
                conn,
                ReasonCode.TOPIC_NAME_INVALID,
                f"will topic {will.topic[:64]!r} is reserved (a `$delayed/` or `$SYS` topic)",
                level,
            )
            return False, None, client_id
        if packet.will is not None and not self.access.acl.allows(
            PUBLISH, client_id, username, packet.will.topic
        ):
            self.metrics.inc("acl_denied_will")
            self.refuse(
                conn,
                ReasonCode.NOT_AUTHORIZED,
                f"ACL denies publishing the will topic {packet.will.topic!r}",
                level,
            )
            return False, None, client_id
        return True, username, client_id

    async def failed(
        self, conn: ClientLink, packet: Connect, client_id: str, result: AuthResult, source: str
    ) -> None:
        """Refuse a CONNECT whose credentials failed: after a wait that grows with the failures
        from its address in a row (`login_failure_delay`; no hashing thread is held meanwhile),
        and counting it as a connect of its ClientId for flapping detection
        (`flapping_failed_logins`): a guesser that keeps one ClientId gets banned. A user store
        that could not be asked is not the client's failure: refused at once."""
        self.metrics.inc("auth_failures")
        loop = asyncio.get_running_loop()
        unavailable = result is AuthResult.UNAVAILABLE
        delay = 0.0 if unavailable else self.access.failed_logins.failed(source, loop.time())
        if delay > 0:
            self.metrics.inc("login_failure_delays")
            await asyncio.sleep(delay)
            if conn.closed:
                return
        level = packet.protocol_level
        if self.config.flapping_failed_logins and packet.client_id and not unavailable:
            ban = await self.bans.connected(client_id)
            if ban is not None:
                if not conn.closed:
                    self.refuse_banned(conn, client_id, ban, level)
                return
        if conn.closed:
            return
        self.refuse(
            conn,
            _AUTH_REASONS[result],
            f"authentication failed ({result.name}) for user {packet.username!r}",
            level,
            client_id,
        )

    def negotiate(self, packet: Connect) -> tuple[float | None, int, dict[int, Any]]:
        """What a CONNECT is granted: session expiry (None: a 3.1.1 session), keepalive, and
        for v5 the CONNACK properties that say where the server chose otherwise."""
        cfg = self.config
        keepalive = packet.keepalive
        said: dict[int, Any] = {}
        if cfg.max_keepalive and (keepalive == 0 or keepalive > cfg.max_keepalive):
            keepalive = cfg.max_keepalive
            said[PropertyId.SERVER_KEEP_ALIVE] = keepalive
        if packet.protocol_level < 5:
            return None, keepalive, said
        expiry = packet.properties.get(PropertyId.SESSION_EXPIRY_INTERVAL, 0)
        limit = int(cfg.session_expiry_seconds)
        if expiry > limit:
            expiry = limit
            said[PropertyId.SESSION_EXPIRY_INTERVAL] = expiry
        return float(expiry), keepalive, said

    def refuse_banned(self, conn: Refusable, client_id: str, ban: Ban, level: int) -> None:
        """Refuse a client that `ban` names: CONNACK 0x8A (3.1.1: 5, not authorized)."""
        self.metrics.inc("banned_connects")
        why = f"; {ban.reason}" if ban.reason else ""
        reason = f"ClientId {client_id!r} banned by {ban.kind} {ban.value!r}{why}"
        self.refuse(conn, ReasonCode.BANNED, reason, level, client_id)

    def refuse_not_owner(
        self, conn: Refusable, client_id: str, owner: str, identity: str, level: int
    ) -> None:
        """Refuse a CONNECT by `identity` whose ClientId's session belongs to `owner`: CONNACK
        0x87 (3.1.1: 5), the reason string naming only the refused identity. Logged at most
        once per `_NOT_OWNER_LOG_INTERVAL` (an intruder retrying must not flood the log),
        counted every time."""
        self.metrics.inc("connections_refused_not_owner")
        log_it, suppressed = self.not_owner_log.note(time.monotonic())
        if log_it:
            log.warning(
                "client %s from %s refused: its session belongs to %s, not to %s%s",
                client_text(client_id),
                conn.peer,
                describe(owner),
                describe(identity),
                suppressed_note(suppressed),
            )
        reason = refusal(owner, identity) or "the ClientId's session belongs to another identity"
        self.refuse(conn, ReasonCode.NOT_AUTHORIZED, reason, level, log_it=False)

    def refuse(
        self,
        conn: Refusable,
        code: int,
        reason: str,
        level: int = 4,
        client_id: str = "",
        *,
        log_it: bool = True,
    ) -> None:
        """Answer CONNACK with a refusal (`code`, a 5.0 reason code; a 3.1.1 client gets the
        return code closest to it), log it unless the caller did (paced per reason code:
        `RefusalLog`; `client_id`: the one the CONNECT asked for, before the connection has
        one) and count it, close."""
        shown, suppressed = self.refusals.note(code) if log_it else (False, 0)
        if shown:
            log.warning(
                "client %s from %s refused: %s%s",
                client_text(conn.client_id or client_id),
                conn.peer,
                client_text(reason, 256),
                suppressed_note(suppressed),
            )
        self.metrics.inc("connections_refused")
        if level >= 5:
            props: dict[int, Any] = {PropertyId.REASON_STRING: reason[:200]}
            conn.send(codec.encode(Connack(code, False, props), 5))
        else:
            conn.send(codec.encode(Connack(connack_311(code), False)))
        conn.close(reason, log_it=False)
