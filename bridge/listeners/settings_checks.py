"""Whether the listeners' settings can work: `check_listener_settings(config)` raises
`ConfigError` naming the setting and why, before anything listens.

The listeners' settings are the client listeners and their TLS and WebSocket options, who may reach
them (exposure), the WebSocket Origin allow-list, the limits of one connection's bytes and the
pace of the log lines about faulty clients.
"""

from __future__ import annotations

from bridge.listeners.exposure import public_listeners
from bridge.listeners.origins import OriginError, OriginPolicy
from bridge.settings import Config, ConfigError, parse_listen, require_positive


def check_listener_settings(config: Config) -> None:
    """Raise ConfigError for listener settings that cannot work."""
    if not config.listen:
        raise ConfigError("listen: at least one listener is required")
    for address in config.listen:
        parse_listen(address)
    _check_tls_and_websocket(config)
    _check_exposure(config)
    try:
        OriginPolicy(config.ws_allowed_origins)
    except OriginError as exc:
        raise ConfigError(f"ws_allowed_origins: {exc}") from None
    if not 0 <= config.protocol_fault_log_interval <= 86400:  # also refuses nan
        raise ConfigError(
            "protocol_fault_log_interval: 0 to 86400 seconds, got "
            f"{config.protocol_fault_log_interval}"
        )
    if not 0 <= config.tls_failure_log_interval <= 86400:  # also refuses nan
        raise ConfigError(
            f"tls_failure_log_interval: 0 to 86400 seconds, got {config.tls_failure_log_interval}"
        )
    _check_connection_limits(config)


def _check_tls_and_websocket(config: Config) -> None:
    for name in ("tls_listen", "ws_listen", "wss_listen"):
        for address in getattr(config, name):
            parse_listen(address)
    if not config.ws_path.startswith("/"):
        raise ConfigError(f"ws_path: {config.ws_path!r} must start with /")
    if config.tls_client_cert not in ("none", "optional", "required"):
        raise ConfigError(
            f"tls_client_cert: {config.tls_client_cert!r} is not none/optional/required"
        )
    secure = config.tls_listen or config.wss_listen
    if secure and not (config.tls_certfile and config.tls_keyfile):
        raise ConfigError("tls_listen/wss_listen: need tls_certfile and tls_keyfile")
    if config.tls_client_cert != "none" and not config.tls_cafile:
        raise ConfigError("tls_client_cert: verifying client certificates needs tls_cafile")
    if config.tls_client_cert != "none" and not secure:
        # Only TLS listeners can ask for a certificate: with tls_cn_as_username and no
        # anonymous clients, nobody could log in.
        raise ConfigError("tls_client_cert: client certificates need tls_listen or wss_listen")
    if config.tls_cn_as_username and config.tls_client_cert == "none":
        raise ConfigError("tls_cn_as_username: needs tls_client_cert optional or required")
    if config.tls_crlfile and config.tls_client_cert == "none":
        raise ConfigError("tls_crlfile: revocation lists need tls_client_cert optional or required")


def _check_exposure(config: Config) -> None:
    """Anonymous access stays on loopback unless allow_anonymous_public says otherwise
    (docs/decisions.md, "Settings and configuration")."""
    exposed = public_listeners(config)
    if exposed and config.anonymous_allowed and not config.allow_anonymous_public:
        name, address = exposed[0]
        raise ConfigError(
            f"{name}: {address} is not a loopback address and anonymous clients are accepted "
            "(no password_file, auth_redis or tls_cn_as_username, or allow_anonymous=true): "
            "configure users, listen on 127.0.0.1, or set allow_anonymous_public=true"
        )


def _check_connection_limits(config: Config) -> None:
    """What one connection may send and be sent: packets, its unanswered publishes, its
    write buffer, the time to its CONNECT."""
    require_positive(
        config,
        (
            "max_packet_size",
            "max_inbound_pending",
            "receive_maximum",
            "write_buffer_high",
        ),
    )
    if config.receive_maximum > 65535:
        raise ConfigError("receive_maximum: at most 65535 (the packet id space)")
    if not 0 <= config.topic_alias_maximum <= 65535:
        raise ConfigError("topic_alias_maximum: 0..65535")
    if config.max_packet_size > 268_435_460:
        raise ConfigError("max_packet_size: at most 268435460 (the MQTT maximum)")
    if config.connect_timeout <= 0:
        raise ConfigError("connect_timeout: must be positive")
