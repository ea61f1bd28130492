"""PURE. Which browser origins may open an MQTT-over-WebSocket connection (`ws_allowed_origins`).

A browser sends `Origin: <scheme>://<host>[:<port>]` with every WebSocket upgrade, naming the
page that asks; a page of another site must not reach the broker with the user's network
position (cross-site WebSocket hijacking). An upgrade is allowed when:

* it has no Origin header (not a browser: devices, paho, mosquitto clients), or
* the Origin's host is the host the request was sent to (its Host header, ports ignored, so a
  console on another port of the same host works), or
* the Origin is in the allow-list (scheme, host and port compared; default ports dropped), or
  the list holds `*`.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

ANY = "*"
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


class OriginError(ValueError):
    """An allow-list entry that is not an origin; the message says why."""


def normalize_origin(text: str) -> str:
    """`scheme://host[:port]` in lower case without a default port; OriginError if `text` is
    not an origin (a path, credentials or a query make it a URL, not an origin)."""
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError as exc:
        raise OriginError(f"{text!r} is not an origin: {exc}") from None
    scheme = parts.scheme.lower()
    host = parts.hostname
    if scheme not in _DEFAULT_PORTS or not host:
        raise OriginError(f"{text!r} is not an origin like https://host or http://host:port")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username is not None:
        raise OriginError(f"{text!r} is not an origin: only scheme://host[:port], no path")
    if ":" in host:
        host = f"[{host}]"
    if port is None or port == _DEFAULT_PORTS[scheme]:
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


def host_of(authority: str) -> str:
    """The host of a Host header value or origin authority, lower case, without port or the
    brackets of an IPv6 address."""
    authority = authority.strip().lower()
    if authority.startswith("["):
        return authority[1:].partition("]")[0]
    return authority.rpartition(":")[0] if authority.count(":") == 1 else authority


class OriginPolicy:
    """The allow-list of one WebSocket listener (entries checked by `normalize_origin`)."""

    __slots__ = ("any", "origins")

    def __init__(self, allowed: Iterable[str] = ()) -> None:
        entries = [entry.strip() for entry in allowed]
        self.any = ANY in entries
        self.origins = frozenset(normalize_origin(e) for e in entries if e != ANY)

    def allows(self, origin: str | None, host: str) -> bool:
        """Whether an upgrade with this Origin header (None: none sent) to this Host header may
        proceed."""
        if origin is None or self.any:
            return True
        try:
            normalized = normalize_origin(origin)
        except OriginError:
            return False  # "null" (a sandboxed or file page) or garbage
        if normalized in self.origins:
            return True
        authority = normalized.partition("://")[2]
        return bool(host) and host_of(authority) == host_of(host)
