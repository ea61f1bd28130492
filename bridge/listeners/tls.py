"""TLS for the `tls_listen` and `wss_listen` listeners: the server's SSL context, built once from
the settings, the handshake of each connection (`TLSAcceptor`: failures counted and logged), and
the verified client certificate's CN of a connection.

Every fault in the certificate, key or CA files becomes a `TLSConfigError` naming the setting and
the file, raised at start-up (`Server.check`) so a node never runs with a listener it cannot serve.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from asyncio.sslproto import SSLProtocol
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bridge.access.ratelimit import LogThrottle

if TYPE_CHECKING:
    from bridge.counters import Metrics
    from bridge.settings import Config

log = logging.getLogger("bridge.tls")

CLIENT_CERT_MODES = {
    "none": ssl.CERT_NONE,
    "optional": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}


class TLSConfigError(ValueError):
    """A TLS file cannot be used; the message names the setting, the file and why."""


def _read_pem(setting: str, path: str, marker: str, what: str) -> None:
    """Fail with a message naming the file if it cannot be read or holds no `what`."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as exc:
        raise TLSConfigError(f"{setting} {path}: cannot read it: {exc.strerror}") from None
    if marker not in text:
        raise TLSConfigError(f"{setting} {path}: no PEM {what} in it")


def server_context(config: Config) -> ssl.SSLContext | None:
    """The SSL context of the TLS and WSS listeners (TLS 1.2 or later; client certificates
    checked against `tls_cafile` as `tls_client_cert` says), or None when neither is configured.
    Raises TLSConfigError for a missing, unreadable or mismatched file."""
    if not (config.tls_listen or config.wss_listen):
        return None
    certfile, keyfile = config.tls_certfile, config.tls_keyfile
    _read_pem("tls_certfile", certfile, "-----BEGIN CERTIFICATE-----", "certificate")
    _read_pem("tls_keyfile", keyfile, "PRIVATE KEY-----", "private key")

    def refuse_encrypted_key() -> bytes:
        # Without a callback OpenSSL would prompt for a passphrase on the terminal.
        raise TLSConfigError(
            f"tls_keyfile {keyfile}: the key is encrypted; give an unencrypted key"
        )

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certfile, keyfile, password=refuse_encrypted_key)
    except ssl.SSLError as exc:
        raise TLSConfigError(
            f"tls_certfile {certfile} / tls_keyfile {keyfile}: cannot load the certificate and "
            f"key: {exc.reason or exc}"
        ) from None
    context.verify_mode = CLIENT_CERT_MODES[config.tls_client_cert]
    if context.verify_mode != ssl.CERT_NONE:
        cafile = config.tls_cafile
        _read_pem("tls_cafile", cafile, "-----BEGIN CERTIFICATE-----", "certificate")
        try:
            context.load_verify_locations(cafile=cafile)
        except ssl.SSLError as exc:
            raise TLSConfigError(
                f"tls_cafile {cafile}: cannot load the CA certificates: {exc.reason or exc}"
            ) from None
        if config.tls_crlfile:
            _load_crl(context, config.tls_crlfile)
    return context


def _load_crl(context: ssl.SSLContext, crlfile: str) -> None:
    """Check each client certificate against the revocation lists in `crlfile`. Only the leaf
    is checked: a CRL is needed for every CA the check covers, and an intermediate CA's
    revocation is its issuer's business (remove it from tls_cafile instead)."""
    _read_pem("tls_crlfile", crlfile, "-----BEGIN X509 CRL-----", "certificate revocation list")
    try:
        context.load_verify_locations(cafile=crlfile)
    except ssl.SSLError as exc:
        raise TLSConfigError(
            f"tls_crlfile {crlfile}: cannot load the revocation list: {exc.reason or exc}"
        ) from None
    context.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF


def peer_cert_cn(transport: Any) -> str | None:
    """The subject CN of the client certificate the TLS handshake verified on `transport`, or
    None (plain TCP, no certificate sent, or no CN). The first CN counts, as in Mosquitto."""
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return None
    cert = ssl_object.getpeercert()
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


# -- the handshake -------------------------------------------------------------------------------


class TLSAcceptor:
    """The TLS of a `tls_listen`/`wss_listen` listener, with its failed handshakes seen: asyncio
    and uvloop tell nobody when a server-side handshake fails (an `ssl.SSLError` is an
    `OSError`, which they log only in debug mode). Each failure is counted
    (`tls_handshake_failures`) and logged, at most one line per `tls_failure_log_interval`
    seconds, which says how many more failed meanwhile. A client that just closes before the
    handshake ends (an L4 health check) is counted apart (`tls_handshakes_abandoned`).

    The listener is a plain TCP one; each accepted socket gets the event loop's own TLS protocol
    (what `create_server(ssl=...)` uses) with a waiter that says how its handshake ended, and
    above it the connection's protocol from `inner_factory` (a `Connection`, or the WebSocket
    protocol of `wss_listen`), told `connection_made` once the handshake is done."""

    def __init__(
        self,
        context: ssl.SSLContext,
        *,
        handshake_timeout: float,
        log_interval: float,
        metrics: Metrics,
    ) -> None:
        self.context = context
        self.handshake_timeout = handshake_timeout
        self.metrics = metrics
        self.throttle = LogThrottle(log_interval)

    def factory(
        self, inner_factory: Callable[[], asyncio.Protocol]
    ) -> Callable[[], asyncio.Protocol]:
        """The protocol factory of a listener whose connections run `inner_factory()` on TLS."""
        return lambda: _Accepted(self, inner_factory)

    def wrap(self, transport: Any, inner_factory: Callable[[], asyncio.Protocol]) -> None:
        """Put TLS between `transport` (just accepted, not read yet) and a new inner protocol."""
        loop = asyncio.get_running_loop()
        peer = _peer(transport)
        waiter = loop.create_future()
        waiter.add_done_callback(lambda done: self._handshake_done(done, peer))
        tls = _tls_protocol_class(loop)(
            loop,
            inner_factory(),
            self.context,
            waiter,
            server_side=True,
            ssl_handshake_timeout=self.handshake_timeout,
        )
        transport.set_protocol(tls)
        tls.connection_made(transport)

    def _handshake_done(self, done: asyncio.Future[None], peer: str) -> None:
        if done.cancelled():
            return
        exc = done.exception()
        if exc is None:
            return
        if type(exc) is ConnectionResetError and not exc.args:
            # The client closed before it finished (an L4 health check opens and closes):
            # counted apart, not logged as a failure.
            self.metrics.inc("tls_handshakes_abandoned")
            log.debug("TLS connection from %s closed before its handshake ended", peer)
            return
        self.failed(peer, exc)

    def failed(self, peer: str, exc: BaseException) -> None:
        """Count a failed handshake; log it unless a line was logged a moment ago."""
        self.metrics.inc("tls_handshake_failures")
        log_it, suppressed = self.throttle.note(time.monotonic())
        if not log_it:
            return
        more = f" ({suppressed} more failed since the last line)" if suppressed else ""
        log.warning("TLS handshake with %s failed: %s%s", peer, _describe(exc), more)


class _Accepted(asyncio.Protocol):
    """The protocol of an accepted socket of a TLS listener for the moment it takes to put TLS
    in its place (in `connection_made`, before anything is read)."""

    def __init__(
        self, acceptor: TLSAcceptor, inner_factory: Callable[[], asyncio.Protocol]
    ) -> None:
        self.acceptor = acceptor
        self.inner_factory = inner_factory

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.acceptor.wrap(transport, self.inner_factory)


def _tls_protocol_class(loop: asyncio.AbstractEventLoop) -> Any:
    """The TLS protocol of `loop`'s kind (uvloop's own works only on uvloop's transports)."""
    try:
        import uvloop
        from uvloop.loop import SSLProtocol as UVSSLProtocol  # type: ignore[attr-defined]
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return SSLProtocol
    return UVSSLProtocol if isinstance(loop, uvloop.Loop) else SSLProtocol


def _peer(transport: Any) -> str:
    peer = transport.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if peer else "?"


_HINTS = {
    "WRONG_VERSION_NUMBER": "not TLS: a plain MQTT client on the TLS port?",
    "HTTP_REQUEST": "plain HTTP on the TLS port",
    "TLSV1_ALERT_UNKNOWN_CA": "the client does not trust the server's certificate",
    "SSLV3_ALERT_BAD_CERTIFICATE": "the client rejected the server's certificate",
    "CERTIFICATE_VERIFY_FAILED": "the client's certificate is not from tls_cafile",
    "PEER_DID_NOT_RETURN_A_CERTIFICATE": "no client certificate (tls_client_cert=required)",
}


def _describe(exc: BaseException) -> str:
    """One line on why a handshake failed, in words, with a hint for the usual causes."""
    if isinstance(exc, ssl.SSLError) and exc.reason:
        hint = _HINTS.get(exc.reason)
        words = exc.reason.lower().replace("_", " ")
        return f"{words} ({hint})" if hint else words
    return str(exc) or type(exc).__name__
