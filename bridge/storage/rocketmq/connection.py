"""One TCP connection of the RocketMQ remoting client, and the client's errors.

`RemotingConnection` is one TCP connection: requests are matched to responses by `opaque`, one
future per request, each with its own timeout; a lost connection fails every pending request
with `BrokerUnavailable` at once. Frames written in one event-loop turn leave in one socket
write at the end of that turn (a pipelined burst of sends costs one system call, not one each).
The client's `ConnectionPool` (pool.py) keeps one per NameServer and broker;
`bridge.storage.rocketmq.remoting` re-exports both.

A connection may be TLS (an `ssl.SSLContext` given to `open`) and may sign every request it
encodes (a `RequestSigner`, acl.py): both are per connection so that the pool hands every
NameServer and broker connection the same ones. Frames the caller encodes itself
(`send_frame_nowait`) are signed by their encoder (`SendFrames`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import ssl
from collections.abc import Callable, Mapping

from bridge.storage.rocketmq.acl import RequestSigner, authentication_hint
from bridge.storage.rocketmq.wire import (
    DEFAULT_MAX_FRAME_SIZE,
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    FrameDecoder,
    RemotingCommand,
    RemotingProtocolError,
    RequestCode,
    ResponseCode,
    SerializeType,
    encode_command,
)

__all__ = [
    "BINARY_HEADER_REQUESTS",
    "BrokerUnavailable",
    "RemotingConnection",
    "RemotingError",
    "RemotingTimeout",
    "RocketMQError",
    "refusal_message",
    "require_success",
]

# The remoting logger, shared by connection.py, routing.py and membership.py: a logging
# configuration that names `bridge.storage.rocketmq_remoting` applies to all three.
log = logging.getLogger("bridge.storage.rocketmq_remoting")

BINARY_HEADER_REQUESTS = frozenset({RequestCode.SEND_MESSAGE_V2, RequestCode.PULL_MESSAGE})
"""Requests sent with the binary (ROCKETMQ) header instead of JSON: the hot path's. The broker
reads a binary header with less work than it parses JSON (its codec threads are a large part of
its CPU per message); it answers in its own configured type (JSON by default), which
`decode_command` reads either way. Both requests have no empty header values, which the binary
form would turn into nulls."""


TLS_CLOSE_TIMEOUT = 1.0
"""Seconds `close` waits for a TLS connection's goodbye before dropping the socket."""


def _header_type(code: int) -> SerializeType:
    return SerializeType.ROCKETMQ if code in BINARY_HEADER_REQUESTS else SerializeType.JSON


ResponseCallback = Callable[["RemotingCommand | None", "BrokerUnavailable | None"], None]
"""Called with the response, or with the error that ended the connection first."""


# --- errors ------------------------------------------------------------------------------------


class RocketMQError(Exception):
    """Base class of this client's errors."""


def refusal_message(code: int, remark: str | None, *, addr: str = "", request: int = 0) -> str:
    """How an error answer reads in a log or an error: the answer itself, and for a broker
    that refused our credentials the setting to fix first ("rocketmq_secret_key: the broker
    refused the signature (...)")."""
    try:
        name = ResponseCode(code).name
    except ValueError:
        name = str(code)
    answer = f"{addr} answered {name} ({code}) to request {request}: {remark or ''}"
    hint = _credential_hint(code, remark)
    if hint is None:
        return answer
    setting, summary = hint
    return f"rocketmq_{setting}: {summary} ({answer})"


def _credential_hint(code: int, remark: str | None) -> tuple[str, str] | None:
    """`authentication_hint` of a NO_PERMISSION answer; None for any other answer."""
    if code != ResponseCode.NO_PERMISSION:
        return None
    return authentication_hint(remark or "")


class RemotingError(RocketMQError):
    """The server answered with an error code (`code`, a `ResponseCode` value) and `remark`.

    When the broker refused the request's credentials (none, an unknown user, a wrong
    signature), `refused_credential` says which to fix ("access_key" or "secret_key") and the
    message starts with the setting's name; otherwise it is None."""

    def __init__(self, code: int, remark: str | None, *, addr: str = "", request: int = 0) -> None:
        self.code = code
        self.remark = remark or ""
        self.addr = addr
        self.request = request
        hint = _credential_hint(code, self.remark)
        self.refused_credential = hint[0] if hint is not None else None
        super().__init__(refusal_message(code, self.remark, addr=addr, request=request))

    @property
    def authentication_refused(self) -> bool:
        """Whether the broker refused the request's credentials (see `refused_credential`)."""
        return self.refused_credential is not None


def require_success(response: RemotingCommand, request: int) -> None:
    """Raise RemotingError for `response` to `request` unless its code is SUCCESS."""
    if response.code != ResponseCode.SUCCESS:
        raise RemotingError(response.code, response.remark, request=request)


class RemotingTimeout(RocketMQError, TimeoutError):
    """No response within the request's timeout (the request may still take effect)."""


class BrokerUnavailable(RocketMQError, ConnectionError):
    """The connection could not be opened, or was lost while the request was pending.

    `maybe_delivered` is False only when the request certainly never reached the server (the
    connection could not be opened), so even a non-idempotent request may be retried.
    """

    def __init__(self, message: str, *, maybe_delivered: bool = True) -> None:
        super().__init__(message)
        self.maybe_delivered = maybe_delivered


# --- one connection ----------------------------------------------------------------------------


class _Protocol(asyncio.Protocol):
    """asyncio protocol feeding a `RemotingConnection`."""

    def __init__(self, conn: RemotingConnection) -> None:
        self.conn = conn

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport, but have its methods.
        self.conn._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.conn._data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn._connection_lost(exc)

    def pause_writing(self) -> None:
        self.conn._pause_writing()

    def resume_writing(self) -> None:
        self.conn._resume_writing()


class RemotingConnection:
    """One TCP connection to a NameServer or broker; use `RemotingConnection.open(addr)`."""

    _opaques = itertools.count(random.randrange(1 << 20))

    def __init__(
        self,
        addr: str,
        *,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        signer: RequestSigner | None = None,
        tls: bool = False,
    ) -> None:
        self.addr = addr
        self.signer = signer
        """Signs every request this connection encodes (None: requests go unsigned)."""
        self._decoder = FrameDecoder(max_frame_size)
        self._answered = False
        """Whether the server ever sent a byte (a TLS-only server closes a plain-text client's
        connection without one)."""
        self._tls = tls
        self._lost = asyncio.Event()
        """Set when the transport reports the connection gone (`connection_lost`)."""
        self._pending: dict[int, asyncio.Future[RemotingCommand]] = {}
        self._callbacks: dict[int, ResponseCallback] = {}
        self._transport: asyncio.Transport | None = None
        self._closed: BrokerUnavailable | None = None
        self._closed_event = asyncio.Event()
        self._can_write: asyncio.Future[None] | None = None
        self._outgoing: list[bytes] = []
        """Frames written in this event-loop turn, sent together by `_send_outgoing`."""
        self._send_scheduled = False

    @classmethod
    async def open(
        cls,
        addr: str,
        *,
        connect_timeout: float = 3.0,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        ssl_context: ssl.SSLContext | None = None,
        signer: RequestSigner | None = None,
    ) -> RemotingConnection:
        """Connect to `addr` ("host:port"), over TLS with `ssl_context` (the TLS handshake is
        part of the connect and its timeout); BrokerUnavailable if that fails or times out."""
        host, _, port = addr.rpartition(":")
        conn = cls(addr, max_frame_size=max_frame_size, signer=signer, tls=ssl_context is not None)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(connect_timeout):
                await loop.create_connection(
                    lambda: _Protocol(conn), host.strip("[]"), int(port), ssl=ssl_context
                )
        except ssl.SSLError as exc:
            # A certificate that does not verify, or a server that does not speak TLS: the
            # same answer on every retry, so say which setting to look at.
            raise BrokerUnavailable(
                f"cannot connect to {addr}: TLS handshake failed ({exc}); check "
                "rocketmq_tls_cafile / rocketmq_tls_verify_hostname and that the server has TLS on",
                maybe_delivered=False,
            ) from exc
        except (OSError, TimeoutError, ValueError) as exc:
            raise BrokerUnavailable(
                f"cannot connect to {addr}: {exc!r}", maybe_delivered=False
            ) from exc
        return conn

    @property
    def closed(self) -> bool:
        """True once the connection is closed or lost."""
        return self._closed is not None

    @property
    def pending(self) -> int:
        """Requests waiting for a response."""
        return len(self._pending)

    async def wait_closed(self) -> None:
        """Return when the connection is closed or lost."""
        await self._closed_event.wait()

    async def request(
        self,
        code: int,
        ext_fields: Mapping[str, str] | None = None,
        body: bytes = b"",
        *,
        timeout: float = 3.0,
    ) -> RemotingCommand:
        """Send a request and return its response (whatever its code).

        Raises RemotingTimeout after `timeout` seconds, BrokerUnavailable if the connection is or
        gets closed first.
        """
        opaque = next(self._opaques) & 0x7FFFFFFF
        future: asyncio.Future[RemotingCommand] = asyncio.get_running_loop().create_future()
        self._pending[opaque] = future
        try:
            await self._write(
                RemotingCommand(
                    code=code,
                    opaque=opaque,
                    ext_fields=self._fields(ext_fields, body),
                    body=body,
                    serialize_type=_header_type(code),
                )
            )
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError:
            raise RemotingTimeout(
                f"no response from {self.addr} to request {code} within {timeout:.3f}s"
            ) from None
        finally:
            self._pending.pop(opaque, None)

    def request_nowait(
        self,
        code: int,
        ext_fields: Mapping[str, str],
        body: bytes,
        callback: ResponseCallback,
    ) -> int:
        """Write a request now and call `callback(response, None)` when its response arrives, or
        `callback(None, BrokerUnavailable)` if the connection is lost first; returns the request's
        opaque (pass it to `forget` to stop waiting). No future, no task, no timer: for pipelined
        hot paths whose caller tracks time-outs itself. Raises BrokerUnavailable if the
        connection is closed. Does not wait for the socket to drain (see `writable`)."""
        opaque = self.new_opaque()
        frame = encode_command(
            RemotingCommand(
                code=code,
                opaque=opaque,
                ext_fields=self._fields(ext_fields, body),
                body=body,
                serialize_type=_header_type(code),
            )
        )
        self.send_frame_nowait(opaque, frame, callback)
        return opaque

    def new_opaque(self) -> int:
        """An opaque for a request the caller encodes itself (`send_frame_nowait`)."""
        return next(self._opaques) & 0x7FFFFFFF

    def send_frame_nowait(self, opaque: int, frame: bytes, callback: ResponseCallback) -> None:
        """`request_nowait` for a frame the caller encoded itself (see `SendFrames`), with an
        opaque from `new_opaque`."""
        if self._closed is not None:
            raise BrokerUnavailable(
                f"connection to {self.addr} is closed: {self._closed}", maybe_delivered=False
            )
        self._callbacks[opaque] = callback
        self._queue_frame(frame)

    def forget(self, opaque: int) -> None:
        """Stop waiting for the response of a `request_nowait` (its callback is not called)."""
        self._callbacks.pop(opaque, None)

    @property
    def writable(self) -> bool:
        """False while the socket's write buffer is above its high-water mark."""
        return self._can_write is None

    def _queue_frame(self, frame: bytes) -> None:
        """Send `frame` at the end of this event-loop turn, after the frames queued before it."""
        self._outgoing.append(frame)
        if not self._send_scheduled:
            self._send_scheduled = True
            asyncio.get_running_loop().call_soon(self._send_outgoing)

    def _send_outgoing(self) -> None:
        self._send_scheduled = False
        frames, self._outgoing = self._outgoing, []
        if not frames or self._closed is not None or self._transport is None:
            return
        self._transport.write(frames[0] if len(frames) == 1 else b"".join(frames))

    async def drained(self) -> None:
        """Return once the write buffer is below its high-water mark (or the connection ended)."""
        if self._can_write is not None:
            await asyncio.shield(self._can_write)

    async def oneway(
        self, code: int, ext_fields: Mapping[str, str] | None = None, body: bytes = b""
    ) -> None:
        """Send a request that gets no response (written, not acknowledged)."""
        opaque = next(self._opaques) & 0x7FFFFFFF
        await self._write(
            RemotingCommand(
                code=code,
                opaque=opaque,
                flag=FLAG_ONEWAY,
                ext_fields=self._fields(ext_fields, body),
                body=body,
            )
        )

    async def close(self) -> None:
        """Close the connection; pending requests fail with BrokerUnavailable. A TLS
        connection is closed with the TLS goodbye (close_notify), waited for at most
        `TLS_CLOSE_TIMEOUT` seconds before the socket is dropped."""
        transport = self._transport
        closing = transport is not None and not self.closed
        if transport is not None and closing:
            self._send_outgoing()  # what was written before close() still goes out
            transport.close()
        self._fail(BrokerUnavailable(f"connection to {self.addr} closed by the client"))
        await self._closed_event.wait()
        if transport is not None and closing and self._tls:
            # The TLS transport lives on until the goodbye is through; an event loop closed
            # before that finds it still open.
            try:
                async with asyncio.timeout(TLS_CLOSE_TIMEOUT):
                    await self._lost.wait()
            except TimeoutError:
                transport.abort()

    # -- internals

    def _fields(self, ext_fields: Mapping[str, str] | None, body: bytes) -> dict[str, str]:
        """A copy of the request's fields, signed when this connection signs."""
        if self.signer is None:
            return dict(ext_fields or {})
        return self.signer.signed(ext_fields, body)

    async def _write(self, cmd: RemotingCommand) -> None:
        if self._closed is not None:
            raise BrokerUnavailable(
                f"connection to {self.addr} is closed: {self._closed}", maybe_delivered=False
            )
        if self._can_write is not None:
            await asyncio.shield(self._can_write)
            if self._closed is not None:
                raise BrokerUnavailable(f"connection to {self.addr} is closed: {self._closed}")
        assert self._transport is not None
        self._queue_frame(encode_command(cmd))

    def _data_received(self, data: bytes) -> None:
        self._answered = True
        try:
            commands = self._decoder.feed(data)
        except RemotingProtocolError as exc:
            log.error("malformed frame from %s: %s", self.addr, exc)
            self._fail(BrokerUnavailable(f"malformed frame from {self.addr}: {exc}"))
            if self._transport is not None:
                self._transport.abort()
            return
        for cmd in commands:
            if cmd.flag & FLAG_RESPONSE:
                callback = self._callbacks.pop(cmd.opaque, None)
                if callback is not None:
                    try:
                        callback(cmd, None)
                    except Exception:
                        log.exception("a response callback failed")
                    continue
                future = self._pending.pop(cmd.opaque, None)
                if future is not None and not future.done():
                    future.set_result(cmd)
            elif not cmd.flag & FLAG_ONEWAY and self._transport is not None:
                # A request from the server (e.g. a consumer-id change notice): not supported.
                reply = RemotingCommand(
                    code=ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                    opaque=cmd.opaque,
                    flag=FLAG_RESPONSE,
                    remark=f"request code {cmd.code} not supported by this client",
                )
                self._queue_frame(encode_command(reply))

    def _connection_lost(self, exc: Exception | None) -> None:
        self._lost.set()
        reason = f": {exc!r}" if exc else ""
        if not self._answered and not self._tls and self._closed is None:
            reason += " (closed before any answer: a TLS-only server? see rocketmq_tls)"
        elif isinstance(exc, ssl.SSLError) and "CERTIFICATE_REQUIRED" in str(exc):
            # TLS 1.3: the server's refusal of a missing client certificate arrives after the
            # handshake, at the first read.
            reason += " (the server requires a client certificate: rocketmq_tls_certfile)"
        self._fail(BrokerUnavailable(f"connection to {self.addr} lost{reason}"))

    def _fail(self, error: BrokerUnavailable) -> None:
        if self._closed is None:
            self._closed = error
        self._outgoing.clear()
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(BrokerUnavailable(str(error)))
        callbacks, self._callbacks = self._callbacks, {}
        for callback in callbacks.values():
            try:
                callback(None, BrokerUnavailable(str(error)))
            except Exception:
                log.exception("a response callback failed")
        self._resume_writing()
        self._closed_event.set()

    def _pause_writing(self) -> None:
        if self._can_write is None:
            self._can_write = asyncio.get_running_loop().create_future()

    def _resume_writing(self) -> None:
        if self._can_write is not None:
            if not self._can_write.done():
                self._can_write.set_result(None)
            self._can_write = None
