"""The admin API's listener: how long a connection may take to say what it wants.

aiohttp closes a connection idle between requests after its keep-alive timeout
(`admin_keepalive_timeout`), but it has no limit on the time a request's line and headers may
take: a client that sends `GET / HT` and then one byte a minute holds a socket (and aiohttp's
parser state) for as long as it likes, and a few thousand such clients hold the listener.

`AdminSite` listens like aiohttp's `TCPSite`, with each connection's protocol wrapped in
`_HeadDeadline`: a connection has `admin_header_timeout` seconds to deliver a complete request
head, counted from the moment it connects and from the first byte of each later request. The
head is complete when the request reaches the application, which tells `HeadDeadlines` so
(`head_received`) from its first middleware; bytes that arrive while a request is handled are
its body (bounded by `admin_body_timeout`, `bridge.operations.admin_bodies`). A connection past
its deadline is closed without an answer, as a reverse proxy's header timeout does.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

from aiohttp import web

log = logging.getLogger("bridge.admin")


class HeadDeadlines:
    """The listener's open connections by transport, each with its head deadline; the admin
    application reports when a request's head arrived and when it was answered."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.closed = 0
        """Connections closed for sending no complete request head in time, since start."""
        self._open: dict[Any, _HeadDeadline] = {}

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

    def _add(self, transport: Any, connection: _HeadDeadline) -> None:
        self._open[transport] = connection

    def _remove(self, transport: Any) -> None:
        self._open.pop(transport, None)


class _HeadDeadline(asyncio.Protocol):
    """aiohttp's protocol for one connection, with a deadline for each request head."""

    def __init__(self, inner: asyncio.Protocol, deadlines: HeadDeadlines) -> None:
        self._inner = inner
        self._deadlines = deadlines
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._in_request = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's are not asyncio.Transport subclasses, only alike).
        self._transport = cast("asyncio.Transport", transport)
        self._deadlines._add(self._transport, self)
        self._arm()  # a new connection must send its first request in time, too
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self._in_request and self._timer is None:
            self._arm()
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._transport is not None:
            self._deadlines._remove(self._transport)
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def head_received(self) -> None:
        self._disarm()
        self._in_request = True

    def answered(self) -> None:
        self._in_request = False

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._deadlines.timeout, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        self._deadlines.closed += 1
        log.debug(
            "admin API: closed %s: no complete request head within %g s",
            transport.get_extra_info("peername"),
            self._deadlines.timeout,
        )
        transport.close()


class AdminSite(web.BaseSite):
    """A TCP listener of an `AppRunner` whose connections get `deadlines` (see the module)."""

    def __init__(
        self, runner: web.BaseRunner, host: str, port: int, deadlines: HeadDeadlines
    ) -> None:
        super().__init__(runner)
        self._host = host
        self._port = port
        self._deadlines = deadlines

    @property
    def name(self) -> str:
        """The listener's address, as aiohttp names its sites."""
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        """Listen (the runner must be set up)."""
        await super().start()
        server = self._runner.server
        assert server is not None
        deadlines = self._deadlines

        def protocol() -> asyncio.Protocol:
            return _HeadDeadline(server(), deadlines)

        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            protocol, self._host, self._port, reuse_address=True
        )
