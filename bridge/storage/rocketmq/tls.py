"""TLS for the RocketMQ client: one client-side SSL context for every connection it opens.

RocketMQ's remoting servers (NameServer and broker, 5.3.3 `NettyRemotingServer`) speak TLS on
their ordinary ports when started with `-Dtls.server.mode=permissive` (TLS and plain text both
accepted, the server tells them apart by the first byte) or `enforcing` (TLS only; a plain-text
client is disconnected). The server's certificate and key come from `tls.server.certPath` /
`tls.server.keyPath` (PEM, key in PKCS#8), and with `tls.server.need.client.auth=require` it asks
for a client certificate signed by `tls.server.trustCertPath` (`TlsSystemConfig`, `TlsHelper`).
There is no TLS-specific handshake beyond TLS itself: the remoting frames are the same.

The client verifies the server's certificate against `cafile` (the system's CAs if empty) and,
unless `verify_hostname` is off, that it was issued for the address connected to (brokers are
reached at the IP the NameServer lists, so their certificates need that IP as a subject
alternative name). `certfile`/`keyfile` are the client certificate, for servers that ask.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

__all__ = ["TlsOptions", "TlsOptionsError"]


class TlsOptionsError(ValueError):
    """A TLS option names a file that cannot be used; `option` is the option's name."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"{option}: {message}")
        self.option = option


@dataclass(frozen=True, slots=True)
class TlsOptions:
    """What the client needs to open TLS connections (see the module docstring)."""

    cafile: str = ""
    certfile: str = ""
    keyfile: str = ""
    verify_hostname: bool = True

    def context(self) -> ssl.SSLContext:
        """A client SSL context from these options; TlsOptionsError names the option whose
        file is missing or unusable."""
        if bool(self.certfile) != bool(self.keyfile):
            raise TlsOptionsError(
                "certfile" if not self.certfile else "keyfile",
                "a client certificate needs both certfile and keyfile",
            )
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cafile:
            try:
                context.load_verify_locations(cafile=self.cafile)
            except (OSError, ssl.SSLError) as exc:
                raise TlsOptionsError("cafile", f"cannot load {self.cafile!r}: {exc}") from None
        context.check_hostname = self.verify_hostname
        if self.certfile:
            try:
                context.load_cert_chain(self.certfile, self.keyfile)
            except (OSError, ssl.SSLError) as exc:
                raise TlsOptionsError(
                    "certfile", f"cannot load {self.certfile!r} with {self.keyfile!r}: {exc}"
                ) from None
        return context
