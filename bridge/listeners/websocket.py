"""MQTT over WebSocket (RFC 6455; MQTT 3.1.1 section 6): an HTTP upgrade, then WebSocket
messages carry the MQTT byte stream both ways.

`WebSocketProtocol` is the asyncio.Protocol of a `ws_listen`/`wss_listen` socket. It feeds bytes to
wsproto (sans-IO), accepts the upgrade on `ws_path`, then hands the byte stream to an inner
protocol (a `Connection`) through `WebSocketTransport`, which the inner protocol uses as its
socket: each write becomes one binary message, `close` sends a close frame. MQTT packets may span
messages and one message may hold several packets, so message boundaries are ignored.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Message,
    Ping,
    RejectConnection,
    Request,
)
from wsproto.frame_protocol import CloseReason
from wsproto.utilities import RemoteProtocolError

from bridge.listeners.origins import OriginPolicy

if TYPE_CHECKING:
    from bridge.counters import Metrics
    from bridge.settings import Config

log = logging.getLogger("bridge.websocket")

SUBPROTOCOLS = ("mqtt", "mqttv3.1")
"""Accepted `Sec-WebSocket-Protocol` values, the first the client offers wins (paho and browser
clients offer `mqtt`; old ones `mqttv3.1`). A client that offers none is accepted without one."""
MAX_REQUEST_BYTES = 16 * 1024
"""The upgrade request with its headers; more is refused with 431 (h11's own limit is the same)."""
MESSAGE_SLACK = 64 * 1024
"""A message may hold a largest packet plus the small ones a client batches around it."""
SAME_HOST = OriginPolicy()
"""Browsers' upgrades allowed only from pages of the host they connect to (and non-browser
clients, which send no Origin): the default of `ws_allowed_origins`."""


def websocket_factory(
    inner_factory: Callable[[], asyncio.Protocol], config: Config, metrics: Metrics | None = None
) -> Callable[[], WebSocketProtocol]:
    """The protocol factory of a WebSocket listener whose connections run `inner_factory()`
    (refused upgrades counted in `metrics`)."""
    origins = OriginPolicy(config.ws_allowed_origins)

    def factory() -> WebSocketProtocol:
        return WebSocketProtocol(
            inner_factory,
            path=config.ws_path,
            handshake_timeout=config.connect_timeout,
            max_message_size=config.max_packet_size + MESSAGE_SLACK,
            origins=origins,
            metrics=metrics,
        )

    return factory


def http_error(status: int, headers: Iterable[tuple[bytes, bytes]] = ()) -> bytes:
    """A complete HTTP/1.1 response without a body, announcing that the connection closes."""
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", "Content-Length: 0"]
    lines += [f"{name.decode('latin-1')}: {value.decode('latin-1')}" for name, value in headers]
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class WebSocketProtocol(asyncio.Protocol):
    """One WebSocket connection: the upgrade handshake, then the framing around the inner
    protocol's byte stream. Never raises: bad input is logged in one line naming the peer and
    the fault, and the connection closed."""

    def __init__(
        self,
        inner_factory: Callable[[], asyncio.Protocol],
        *,
        path: str,
        handshake_timeout: float,
        max_message_size: int,
        origins: OriginPolicy = SAME_HOST,
        metrics: Metrics | None = None,
    ) -> None:
        self.inner_factory = inner_factory
        self.path = path
        self.origins = origins
        self.metrics = metrics
        self.handshake_timeout = handshake_timeout
        self.max_message_size = max_message_size
        self.ws = WSConnection(ConnectionType.SERVER)
        self.transport: Any = None  # asyncio's or uvloop's transport (the latter no subclass)
        self.inner: asyncio.Protocol | None = None
        self.peer = "?"
        self._request_bytes = 0
        self._message_bytes = 0
        self._timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self.handshake_timeout, self._handshake_timed_out)

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return
        try:
            if self.inner is None:
                self._receive_handshake(data)
            else:
                self._receive_frames(data)
        except Exception:
            log.exception("websocket %s: internal error", self.peer)
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        if self.inner is not None:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    # -- the upgrade -----------------------------------------------------------------------------

    def _receive_handshake(self, data: bytes) -> None:
        self._request_bytes += len(data)
        if self._request_bytes > MAX_REQUEST_BYTES:
            self._reject(431, f"upgrade request over {MAX_REQUEST_BYTES} bytes")
            return
        try:
            self.ws.receive_data(data)
            events = list(self.ws.events())
        except RemoteProtocolError as exc:
            hint = exc.event_hint
            if isinstance(hint, RejectConnection):
                self._reject(hint.status_code, f"not a WebSocket upgrade: {exc}", hint.headers)
            else:
                self._reject(400, f"not a WebSocket upgrade: {exc}")
            return
        for event in events:
            if isinstance(event, Request):
                self._upgrade(event)
                return

    def _upgrade(self, request: Request) -> None:
        path = request.target.partition("?")[0]
        if path != self.path:
            self._reject(404, f"no WebSocket endpoint at {path[:100]!r} (ws_path={self.path})")
            return
        origin = _origin_of(request)
        if not self.origins.allows(origin, request.host):
            if self.metrics is not None:
                self.metrics.inc("websocket_origin_refused")
            self._reject(
                403,
                f"Origin {origin!r} not allowed for host {request.host[:100]!r} "
                "(ws_allowed_origins)",
            )
            return
        offered = request.subprotocols
        subprotocol = next((name for name in offered if name.lower() in SUBPROTOCOLS), None)
        if offered and subprotocol is None:
            self._reject(400, f"subprotocols {offered[:5]} offered, none of {SUBPROTOCOLS}")
            return
        self._cancel_timer()
        self.transport.write(self.ws.send(AcceptConnection(subprotocol=subprotocol)))
        log.debug("websocket %s: upgraded on %s, subprotocol %s", self.peer, path, subprotocol)
        self.inner = self.inner_factory()
        self.inner.connection_made(WebSocketTransport(self))

    def _reject(
        self, status: int, reason: str, headers: Iterable[tuple[bytes, bytes]] = ()
    ) -> None:
        log.info("websocket %s: HTTP %d: %s", self.peer, status, reason)
        self._cancel_timer()
        self.transport.write(http_error(status, headers))
        self.transport.close()

    def _handshake_timed_out(self) -> None:
        self._timer = None
        if self.inner is None and not self.transport.is_closing():
            log.info(
                "websocket %s: closing: no upgrade request within connect_timeout=%s s",
                self.peer,
                self.handshake_timeout,
            )
            self.transport.close()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- after the upgrade -----------------------------------------------------------------------

    def _receive_frames(self, data: bytes) -> None:
        assert self.inner is not None
        ws = self.ws
        if ws.state not in (ConnectionState.OPEN, ConnectionState.LOCAL_CLOSING):
            return
        ws.receive_data(data)
        for event in ws.events():
            if self.transport.is_closing():
                return
            if isinstance(event, Message):
                payload = event.data.encode() if isinstance(event.data, str) else event.data
                self._message_bytes += len(payload)
                if self._message_bytes > self.max_message_size:
                    self._fault(
                        CloseReason.MESSAGE_TOO_BIG,
                        f"WebSocket message over {self.max_message_size} bytes",
                    )
                    return
                if event.message_finished:
                    self._message_bytes = 0
                self.inner.data_received(payload)
            elif isinstance(event, Ping):
                self._send(event.response())
            elif isinstance(event, CloseConnection):
                self._on_close(event)
                return

    def _on_close(self, event: CloseConnection) -> None:
        state = self.ws.state
        if state is ConnectionState.REMOTE_CLOSING:
            log.debug("websocket %s: close frame from the client (%s)", self.peer, event.code)
            self.transport.write(self.ws.send(event.response()))
            self.transport.close()
        elif state is ConnectionState.CLOSED:  # the answer to our close frame
            self.transport.close()
        else:  # wsproto found a framing fault and proposes this close
            self._fault(event.code, f"WebSocket protocol error: {event.reason}")

    def _fault(self, code: int, reason: str) -> None:
        log.warning("websocket %s: closing: %s", self.peer, reason)
        self.close(code)

    def _send(self, event: Event) -> None:
        if self.ws.state is ConnectionState.OPEN:
            self.transport.write(self.ws.send(event))

    def send_message(self, data: bytes) -> None:
        """Send `data` as one binary message (dropped once the WebSocket is closing)."""
        self._send(BytesMessage(data=data))

    def close(self, code: int = CloseReason.NORMAL_CLOSURE) -> None:
        """Send a close frame if none was sent yet, then close the socket once what is queued
        has been written."""
        if self.ws.state in (ConnectionState.OPEN, ConnectionState.REMOTE_CLOSING):
            self.transport.write(self.ws.send(CloseConnection(code=code)))
        self.transport.close()


def _origin_of(request: Request) -> str | None:
    """The request's Origin header (None: none; several: the first)."""
    for name, value in request.extra_headers:
        if name.lower() == b"origin":
            return value.decode("latin-1")[:300]
    return None


class WebSocketTransport(asyncio.Transport):
    """The inner protocol's view of a WebSocket connection as a socket: writes become binary
    messages, close sends a close frame; everything else is the real transport's."""

    __slots__ = ("_closing", "_outer", "_transport")

    def __init__(self, outer: WebSocketProtocol) -> None:
        super().__init__()
        self._outer = outer
        self._transport = outer.transport
        self._closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._closing:
            self._outer.send_message(bytes(data))

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            self._outer.close()

    def abort(self) -> None:
        self._closing = True
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._closing or bool(self._transport.is_closing())

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return bool(self._transport.is_reading())

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return int(self._transport.get_write_buffer_size())
