"""Which client listeners are reachable from other machines: the rule that keeps a gateway
without users on loopback (docs/decisions.md, "Settings and configuration")."""

from __future__ import annotations

import ipaddress
import logging

from bridge.settings import Config, parse_listen


def is_loopback_host(host: str) -> bool:
    """Whether `host` (an address or name from a `HOST:PORT` setting) is this machine only.

    Names other than `localhost` count as public: what they resolve to can change."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def public_listeners(config: Config) -> list[tuple[str, str]]:
    """The (setting, address) of every client listener bound beyond loopback that lets a client
    in without proving who it is. A TLS listener that requires a client certificate does not
    count: the certificate is the proof."""
    names = ["listen", "ws_listen"]
    if config.tls_client_cert != "required":
        names += ["tls_listen", "wss_listen"]
    exposed = []
    for name in names:
        for address in getattr(config, name):
            host, _ = parse_listen(address)
            if not is_loopback_host(host):
                exposed.append((name, address))
    return exposed


def _any_public(config: Config) -> bool:
    addresses = [*config.listen, *config.ws_listen, *config.tls_listen, *config.wss_listen]
    return any(not is_loopback_host(parse_listen(address)[0]) for address in addresses)


def describe_exposure(config: Config) -> tuple[int, str]:
    """The start-up log line saying who can reach the client listeners, and why, with its level
    (a warning when anonymous clients can come from other machines)."""
    exposed = public_listeners(config)
    if not config.anonymous_allowed:
        return logging.INFO, "client listeners: anonymous clients refused"
    if not exposed and config.tls_client_cert == "required" and _any_public(config):
        return logging.INFO, (
            "client listeners beyond loopback require a client certificate; anonymous "
            "clients are accepted on loopback only"
        )
    if not exposed:
        return logging.INFO, (
            "client listeners on loopback only: anonymous clients are accepted, so the bridge "
            "is not exposed until users are configured (password_file, auth_redis, "
            "tls_cn_as_username) or allow_anonymous_public is set"
        )
    addresses = ", ".join(address for _, address in exposed)
    return logging.WARNING, (
        f"anonymous clients accepted on public listeners {addresses} (allow_anonymous_public)"
    )
