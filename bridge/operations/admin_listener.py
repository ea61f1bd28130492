"""The admin API's listener: how long a connection may take to say what it wants, and how many
connections may be open at once.

aiohttp closes a connection idle between requests after its keep-alive timeout
(`admin_keepalive_timeout`), but it has no limit on the time a request's line and headers may
take: a client that sends `GET / HT` and then one byte a minute holds a socket (and aiohttp's
parser state) for as long as it likes, and a few thousand such clients hold the listener.

`AdminSite` listens like aiohttp's `TCPSite`, with each connection's protocol wrapped in
`_HeadDeadline`: a connection has `admin_header_timeout` seconds to deliver a complete request
head, counted from the moment it connects and from the first byte of each later request. The
head is complete when the request reaches the application, which tells `AdminConnections` so
(`head_received`) from its first middleware; bytes that arrive while a request is handled are
its body (bounded by `admin_body_timeout`, `bridge.operations.admin_bodies`). A connection past
its deadline is closed without an answer, as a reverse proxy's header timeout does.

At most `admin_max_connections` connections are open at once; one more is closed as soon as it
is accepted. Every socket is a file descriptor of the node's process, the same that the MQTT
listeners accept with: without a cap, a stranger opening admin connections faster than the
header timeout closes them could exhaust them and keep devices out. With it, a flood costs the
admin API its availability for as long as it lasts, never the MQTT side.

A request aiohttp cannot parse (not HTTP, a bad header, a line over 8 KiB) it answers 400 itself,
before the application sees it, and logs with a traceback: anyone could fill the node's log.
Its log (`HTTP_LOG`) goes through `_MalformedRequests`, which makes that one line without a
traceback, at most once per `REFUSAL_LOG_INTERVAL`; anything else aiohttp logs is left whole.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from bridge.access.ratelimit import LogThrottle

log = logging.getLogger("bridge.admin")

REFUSAL_LOG_INTERVAL = 10.0
"""Seconds between log lines about connections refused for `admin_max_connections`, and about
malformed requests."""
MAX_FAULT_TEXT = 200
"""Characters of a parser's fault kept in the log line (it quotes the request's bytes)."""


class _MalformedRequests(logging.Filter):
    """Rewrites aiohttp's record of a request it could not parse into one line naming the
    fault, without the traceback, and drops those past one per `REFUSAL_LOG_INTERVAL`."""

    def __init__(self) -> None:
        super().__init__()
        self._throttle = LogThrottle(REFUSAL_LOG_INTERVAL)

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether to log `record` (rewritten if it is about a malformed request)."""
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        log_it, suppressed = self._throttle.note(time.monotonic())
        if not log_it:
            return False
        fault = " ".join(str(exc.message).split())[:MAX_FAULT_TEXT]
        remote = record.args[0] if isinstance(record.args, tuple) and record.args else None
        record.msg = (
            "admin API: answered 400 to a malformed request from %s: %r (%d more since the last "
            "line)"
        )
        record.args = (remote, fault, suppressed)
        record.exc_info = None
        record.exc_text = None
        if record.levelno > logging.WARNING:  # aiohttp's ERROR; what it logs at debug stays so
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


HTTP_LOG = logging.getLogger("bridge.admin.http")
"""aiohttp's own log of the admin listener (`AppRunner(logger=...)`)."""
HTTP_LOG.addFilter(_MalformedRequests())


class AdminConnections:
    """The listener's open connections by transport (at most `max_open`), each with its head
    deadline of `timeout` seconds; the admin application reports when a request's head arrived
    and when it was answered."""

    def __init__(self, timeout: float, max_open: int) -> None:
        self.timeout = timeout
        self.max_open = max_open
        self.closed = 0
        """Connections closed for sending no complete request head in time, since start."""
        self.refused = 0
        """Connections closed on arrival because `max_open` were open, since start."""
        self._open: dict[Any, _HeadDeadline] = {}
        self._throttle = LogThrottle(REFUSAL_LOG_INTERVAL)

    @property
    def full(self) -> bool:
        """Whether `max_open` connections are open."""
        return len(self._open) >= self.max_open

    def head_received(self, transport: Any) -> None:
        """A request's head from `transport` reached the application: its deadline is met."""
        connection = self._open.get(transport)
        if connection is not None:
            connection.head_received()

    def answered(self, transport: Any) -> None:
        """The request from `transport` was answered: its next byte starts a new deadline."""
        connection = self._open.get(transport)
        if connection is not None:
            connection.answered()

    def track(self, transport: Any, connection: _HeadDeadline) -> None:
        """A connection was accepted (there was room for it)."""
        self._open[transport] = connection

    def note_refused(self) -> None:
        """A connection was closed on arrival because the listener was full: counted, and
        logged at most once per `REFUSAL_LOG_INTERVAL`."""
        self.refused += 1
        log_it, suppressed = self._throttle.note(time.monotonic())
        if log_it:
            log.warning(
                "admin API: refused a connection: admin_max_connections=%d are open "
                "(%d more refused since the last line)",
                self.max_open,
                suppressed,
            )

    def note_expired(self, transport: Any) -> None:
        """The connection of `transport` was closed for its request head's deadline."""
        self.closed += 1
        log.debug(
            "admin API: closed %s: no complete request head within %g s",
            transport.get_extra_info("peername"),
            self.timeout,
        )

    def untrack(self, transport: Any) -> None:
        """A tracked connection is gone."""
        self._open.pop(transport, None)


class _HeadDeadline(asyncio.Protocol):
    """aiohttp's protocol for one connection, with a deadline for each request head; a
    connection refused for the cap is closed here and never reaches aiohttp."""

    def __init__(self, inner: asyncio.Protocol, connections: AdminConnections) -> None:
        self._inner = inner
        self._connections = connections
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._in_request = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._connections.full:
            # Never handed to aiohttp: no handler, no parser, the descriptor freed at once.
            self._connections.note_refused()
            transport.close()
            return
        # A stream transport (uvloop's are not asyncio.Transport subclasses, only alike).
        self._transport = cast("asyncio.Transport", transport)
        self._connections.track(self._transport, self)
        self._arm()  # a new connection must send its first request in time, too
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._transport is None:
            return  # refused
        if not self._in_request and self._timer is None:
            self._arm()
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        if self._transport is None:
            return None
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._transport is None:
            return  # refused: aiohttp never saw it
        self._connections.untrack(self._transport)
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    @property
    def waiting_for_head(self) -> bool:
        """Whether the clock of a request head runs (it is closed when it runs out)."""
        return self._timer is not None

    def head_received(self) -> None:
        self._disarm()
        self._in_request = True

    def answered(self) -> None:
        self._in_request = False

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._connections.timeout, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        self._connections.note_expired(transport)
        transport.close()


class AdminSite(web.BaseSite):
    """A TCP listener of an `AppRunner`; `connections` counts its connections and times each
    one's request heads (see the module)."""

    def __init__(
        self, runner: web.BaseRunner, host: str, port: int, connections: AdminConnections
    ) -> None:
        super().__init__(runner)
        self._host = host
        self._port = port
        self._connections = connections

    @property
    def name(self) -> str:
        """The listener's address, as aiohttp names its sites."""
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        """Listen (the runner must be set up)."""
        await super().start()
        server = self._runner.server
        assert server is not None
        connections = self._connections

        def protocol() -> asyncio.Protocol:
            return _HeadDeadline(server(), connections)

        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            protocol, self._host, self._port, reuse_address=True
        )
