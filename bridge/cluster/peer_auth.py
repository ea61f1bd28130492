"""What a node authenticates its peer links with, and how it reports the links it refuses.

`PeerAuth` holds the peer-link keys derived from the cluster secrets (`bridge.cluster.credential`),
the mutual-TLS contexts when `peer_tls_*` are set, and the handshake deadline. The handshake
itself is `bridge.cluster.handshake`; `bridge.cluster.peers` runs it on each link.

A refused link is one log line naming the remote address and the reason, at most `burst` lines
per `interval` seconds: a flood of strangers costs a count (`RefusalLog.refused`, the
`peer_links_refused` metric), not a log that fills the disk.
"""

from __future__ import annotations

import logging
import ssl
import time
from dataclasses import dataclass, field
from typing import Any

from bridge.cluster.credential import (
    PEER_LINK,
    CredentialError,
    derive_key,
    read_cluster_secrets,
)
from bridge.settings import Config

log = logging.getLogger("bridge.cluster")


class PeerTLSConfigError(ValueError):
    """A peer TLS file cannot be used; the message names the setting and the file."""


class RefusalLog:
    """Logs refused peer links: the first `burst` of each `interval` in full, then a count."""

    def __init__(self, burst: int = 20, interval: float = 10.0) -> None:
        self.burst = burst
        self.interval = interval
        self.refused = 0
        """Links refused since the node started."""
        self._window_start = -interval
        self._logged_in_window = 0
        self._silent = 0

    def refuse(self, address: str, reason: str, now: float | None = None) -> None:
        """Count a refused link from `address`; log it unless this window's lines are spent."""
        now = time.monotonic() if now is None else now
        self.refused += 1
        if now - self._window_start >= self.interval:
            if self._silent:
                log.warning(
                    "%d more peer links refused in the last %.0f s (not logged one by one)",
                    self._silent,
                    now - self._window_start,
                )
            self._window_start = now
            self._logged_in_window = 0
            self._silent = 0
        if self._logged_in_window < self.burst:
            self._logged_in_window += 1
            log.warning("refused peer link from %s: %s", address, reason)
        else:
            self._silent += 1


@dataclass(slots=True)
class PeerAuth:
    """How this node's peer links authenticate (see the module docstring)."""

    keys: tuple[bytes, ...]
    """Peer-link keys: the first proves this node, any of them verifies a peer."""
    handshake_timeout: float = 5.0
    server_ssl: ssl.SSLContext | None = None
    client_ssl: ssl.SSLContext | None = None
    refusals: RefusalLog = field(default_factory=RefusalLog)

    @property
    def tls(self) -> bool:
        """Whether peer links run over mutual TLS."""
        return self.server_ssl is not None

    def reload_keys(self, config: Config) -> None:
        """Re-read `cluster_secret_file` (SIGHUP): links started from now on prove and accept
        the secrets it holds now, so a secret is rotated without a restart. A file that cannot
        be used keeps the keys in force (logged)."""
        if not config.cluster_secret_file:
            return
        try:
            secrets = read_cluster_secrets("", config.cluster_secret_file)
        except CredentialError as exc:
            log.error("%s; the peer-link keys in force are kept", exc)
            return
        self.keys = tuple(derive_key(secret, PEER_LINK) for secret in secrets)
        log.info("reloaded the cluster secret file: %d secrets accepted", len(self.keys))


def peer_auth(config: Config) -> PeerAuth:
    """The node's `PeerAuth` from its settings (checked by `bridge.cluster.settings_checks`: a
    cluster member has a secret, peer TLS or both). Raises PeerTLSConfigError for unusable files."""
    secrets = read_cluster_secrets(config.cluster_secret, config.cluster_secret_file)
    keys = tuple(derive_key(secret, PEER_LINK) for secret in secrets)
    auth = PeerAuth(keys, config.peer_handshake_timeout)
    if config.peer_tls_certfile:
        auth.server_ssl = _context(config, ssl.Purpose.CLIENT_AUTH)
        auth.client_ssl = _context(config, ssl.Purpose.SERVER_AUTH)
    return auth


def _context(config: Config, purpose: ssl.Purpose) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(purpose, cafile=config.peer_tls_cafile)
    except (OSError, ssl.SSLError) as exc:
        raise PeerTLSConfigError(f"peer_tls_cafile {config.peer_tls_cafile}: {exc}") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(config.peer_tls_certfile, config.peer_tls_keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise PeerTLSConfigError(
            f"peer_tls_certfile {config.peer_tls_certfile} / peer_tls_keyfile "
            f"{config.peer_tls_keyfile}: {exc}"
        ) from None
    # Peers are addressed by whatever they advertise (an IP, a service name): the certificate
    # must chain to the cluster CA, and the node id a peer claims must be named in it
    # (`certificate_names`), not the address it was reached at.
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def certificate_names(peercert: dict[str, Any] | None) -> set[str]:
    """The names a verified peer certificate carries: its subject's commonName and its DNS
    subjectAltNames (`ssl.SSLSocket.getpeercert()` form)."""
    if not peercert:
        return set()
    names = {
        value for rdn in peercert.get("subject", ()) for key, value in rdn if key == "commonName"
    }
    names |= {value for kind, value in peercert.get("subjectAltName", ()) if kind == "DNS"}
    return names
