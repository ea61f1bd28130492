"""Whether a node's settings can work: `validate(config)` raises `ConfigError` naming the setting
and why, before anything starts. Each concern's rules are a function of their own (listeners,
exposure, Redis, operations, logins, limits, peer security, RocketMQ security).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from bridge.settings import Config, ConfigError, parse_listen

if TYPE_CHECKING:
    from bridge.storage.rocketmq import Credentials, TlsOptions


def _validate_listeners(config: Config) -> None:
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


def _validate_exposure(config: Config) -> None:
    """Anonymous access stays on loopback unless allow_anonymous_public says otherwise
    (docs/decisions.md, "Settings and configuration")."""
    from bridge.listeners.exposure import public_listeners

    exposed = public_listeners(config)
    if exposed and config.anonymous_allowed and not config.allow_anonymous_public:
        name, address = exposed[0]
        raise ConfigError(
            f"{name}: {address} is not a loopback address and anonymous clients are accepted "
            "(no password_file, auth_redis or tls_cn_as_username, or allow_anonymous=true): "
            "configure users, listen on 127.0.0.1, or set allow_anonymous_public=true"
        )


def _validate_redis(config: Config) -> None:
    """The Redis access settings hang together (files are read when Redis is first used)."""
    for name in ("redis_password", "redis_sentinel_password"):
        if getattr(config, name) and getattr(config, f"{name}_file"):
            raise ConfigError(f"{name} and {name}_file: set one, not both")
    for name in ("redis_url", "metering_redis_url"):
        url = getattr(config, name)
        if url and not url.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigError(f"{name}: must start with redis://, rediss:// or unix://")
    from bridge.redact import MASK, redact_url

    if (config.redis_password or config.redis_password_file) and MASK in redact_url(
        config.redis_url
    ):
        raise ConfigError(
            "redis_url carries a password and redis_password(_file) is set: keep one "
            "(the settings' file keeps it off the command line)"
        )
    tls = config.redis_tls or config.redis_url.startswith("rediss://")
    files = ("redis_tls_cafile", "redis_tls_certfile", "redis_tls_keyfile")
    for name in files:
        if getattr(config, name) and not tls:
            raise ConfigError(f"{name}: needs redis_tls = true (or a rediss:// redis_url)")
    if bool(config.redis_tls_certfile) != bool(config.redis_tls_keyfile):
        raise ConfigError("redis_tls_certfile and redis_tls_keyfile: set both or neither")
    sentinel_access = (
        config.redis_sentinel_username
        or config.redis_sentinel_password
        or config.redis_sentinel_password_file
    )
    if sentinel_access and not config.redis_sentinels:
        raise ConfigError("redis_sentinel_username/password: only used with redis_sentinels")


def _validate_operations(config: Config) -> None:
    from bridge.node.presubscribe import PresubscribeError, parse_presubscriptions

    try:
        parse_presubscriptions(config.presubscribe)
    except PresubscribeError as exc:
        raise ConfigError(f"presubscribe: {exc}") from None
    if config.admin_listen:
        parse_listen(config.admin_listen)
    for name in ("admin_header_timeout", "admin_keepalive_timeout", "admin_body_timeout"):
        value = getattr(config, name)
        if not 0 < value <= 3600:  # also refuses nan
            raise ConfigError(f"{name}: 0 < seconds <= 3600, got {value}")
    if config.admin_max_connections < 1:
        raise ConfigError(
            f"admin_max_connections: must be at least 1, got {config.admin_max_connections}"
        )
    if config.client_events_qos not in (0, 1, 2):
        raise ConfigError("client_events_qos: must be 0, 1 or 2")
    for name in (
        "auth_cache_ttl",
        "acl_cache_ttl",
        "sys_interval",
        "metering_interval",
        "inline_commit_ms",
        "memory_trim_interval",
        "qos0_publisher_wait",
        "segment_preallocate_bytes",
        "qos2_copy_window",
    ):
        if getattr(config, name) < 0:
            raise ConfigError(f"{name}: must not be negative")
    _validate_flapping(config)
    _validate_logins(config)


def _validate_logins(config: Config) -> None:
    """The bounds of what an address that has not logged in may hold and cost."""
    for name in (
        "max_unauthenticated",
        "max_unauthenticated_per_address",
        "login_queue_per_address",
    ):
        if getattr(config, name) < 0:
            raise ConfigError(f"{name}: must not be negative (0: unlimited)")
    for name in ("max_unauthenticated_bytes", "login_queue"):
        if getattr(config, name) < 1:
            raise ConfigError(f"{name}: must be at least 1, got {getattr(config, name)}")
    if not 0 <= config.login_failure_delay <= config.login_failure_delay_max:  # refuses nan
        raise ConfigError(
            "login_failure_delay: 0 to login_failure_delay_max seconds, got "
            f"{config.login_failure_delay}"
        )


def _validate_flapping(config: Config) -> None:
    from bridge.access.bans import MAX_SECONDS

    if config.flapping_max_connects < 0:
        raise ConfigError("flapping_max_connects: must not be negative (0: off)")
    for name in ("flapping_window", "flapping_ban_seconds"):
        value = getattr(config, name)
        if not 0 < value <= MAX_SECONDS:  # also refuses nan
            raise ConfigError(f"{name}: must be a positive number of seconds, got {value}")


def _validate_limits(config: Config) -> None:
    """The limits the admin API can change follow the same rules here (`check_limit`); the
    WebSocket allow-list holds origins; TLS failures are logged at a sane pace."""
    from bridge.access.ratelimit import LIMIT_NAMES, LimitError, check_limit
    from bridge.listeners.origins import OriginError, OriginPolicy

    for name in LIMIT_NAMES:
        try:
            check_limit(name, getattr(config, name))
        except LimitError as exc:
            raise ConfigError(str(exc)) from None
    try:
        OriginPolicy(config.ws_allowed_origins)
    except OriginError as exc:
        raise ConfigError(f"ws_allowed_origins: {exc}") from None
    if not 0 <= config.refused_connect_log_interval <= 86400:  # also refuses nan
        raise ConfigError(
            "refused_connect_log_interval: 0 to 86400 seconds, got "
            f"{config.refused_connect_log_interval}"
        )
    if not 0 <= config.protocol_fault_log_interval <= 86400:  # also refuses nan
        raise ConfigError(
            "protocol_fault_log_interval: 0 to 86400 seconds, got "
            f"{config.protocol_fault_log_interval}"
        )
    if not 0 <= config.tls_failure_log_interval <= 86400:  # also refuses nan
        raise ConfigError(
            f"tls_failure_log_interval: 0 to 86400 seconds, got {config.tls_failure_log_interval}"
        )


def _validate_peer_security(config: Config) -> None:
    """A cluster member authenticates its peer links: with the cluster secret, mutual TLS, or
    both. Without either, anyone who reaches the peer port would own the cluster."""
    from bridge.cluster.credential import CredentialError, read_cluster_secrets

    try:
        secrets = read_cluster_secrets(config.cluster_secret, config.cluster_secret_file)
    except CredentialError as exc:
        raise ConfigError(str(exc)) from None
    tls = (config.peer_tls_certfile, config.peer_tls_keyfile, config.peer_tls_cafile)
    if any(tls) and not all(tls):
        raise ConfigError(
            "peer_tls_certfile/peer_tls_keyfile/peer_tls_cafile: set all three (each end of a "
            "peer link presents its certificate and verifies the other's against the CA)"
        )
    if not secrets and not all(tls):
        raise ConfigError(
            "cluster_secret_file: a cluster member needs the cluster's secret "
            "(cluster_secret_file or cluster_secret) or peer TLS (peer_tls_certfile, "
            "peer_tls_keyfile, peer_tls_cafile) to authenticate its peer links"
        )
    if config.peer_handshake_timeout > 60:
        raise ConfigError("peer_handshake_timeout: at most 60 seconds")


def rocketmq_security(config: Config) -> tuple[Credentials | None, TlsOptions | None]:
    """(Credentials or None, TlsOptions or None) of the RocketMQ client from the settings;
    ConfigError names the setting that cannot work (credentials half given, an unusable file)."""
    from bridge.storage.rocketmq import Credentials, TlsOptions, TlsOptionsError

    credentials = None
    secret_key = _rocketmq_secret_key(config)
    if config.rocketmq_access_key or secret_key:
        if not config.rocketmq_access_key:
            raise ConfigError("rocketmq_access_key: rocketmq_secret_key is set, the user is not")
        if not secret_key:
            raise ConfigError("rocketmq_secret_key: rocketmq_access_key is set, its key is not")
        credentials = Credentials(config.rocketmq_access_key, secret_key)
    tls = None
    files = ("rocketmq_tls_cafile", "rocketmq_tls_certfile", "rocketmq_tls_keyfile")
    if config.rocketmq_tls:
        tls = TlsOptions(
            cafile=config.rocketmq_tls_cafile,
            certfile=config.rocketmq_tls_certfile,
            keyfile=config.rocketmq_tls_keyfile,
            verify_hostname=config.rocketmq_tls_verify_hostname,
        )
        try:
            tls.context()
        except TlsOptionsError as exc:
            raise ConfigError(f"rocketmq_tls_{exc}") from None
    else:
        for name in files:
            if getattr(config, name):
                raise ConfigError(f"{name}: set rocketmq_tls = true to use it")
    return credentials, tls


def _rocketmq_secret_key(config: Config) -> str:
    """rocketmq_secret_key, or the secret read from rocketmq_secret_key_file."""
    path = config.rocketmq_secret_key_file
    if not path:
        return config.rocketmq_secret_key
    if config.rocketmq_secret_key:
        raise ConfigError("rocketmq_secret_key and rocketmq_secret_key_file: set one, not both")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"rocketmq_secret_key_file: cannot read {path}: {exc}") from None
    for line in text.splitlines():
        if line.strip() and not line.strip().startswith("#"):
            return line.strip()
    raise ConfigError(f"rocketmq_secret_key_file: {path} holds no secret")


def _validate_rocketmq_security(config: Config) -> None:
    if (
        config.store == "rocketmq"
        or config.rocketmq_access_key
        or config.rocketmq_secret_key_file
        or config.rocketmq_tls
    ):
        rocketmq_security(config)


def validate(config: Config) -> None:
    """Raise ConfigError for values that cannot work."""
    if not config.listen:
        raise ConfigError("listen: at least one listener is required")
    for address in config.listen:
        parse_listen(address)
    if config.node_id == "*" or "\x00" in config.node_id:
        raise ConfigError(f"node_id: {config.node_id!r} is reserved (pick a name)")
    if config.log_level.lower() not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"log_level: {config.log_level!r} is not debug/info/warning/error")
    if config.allow_anonymous is False and not config.has_user_source:
        raise ConfigError(
            "allow_anonymous: false needs a password_file, auth_redis or tls_cn_as_username"
        )
    config.allow_anonymous = config.anonymous_allowed
    if (config.auth_redis or config.acl_redis) and not config.clustered:
        raise ConfigError("auth_redis/acl_redis: need the cluster's Redis (redis_url)")
    _validate_listeners(config)
    _validate_redis(config)
    _validate_exposure(config)
    _validate_operations(config)
    _validate_limits(config)
    if config.store not in ("filelog", "rocketmq"):
        raise ConfigError(f"store: unknown backend {config.store!r} (known: filelog, rocketmq)")
    if config.store == "rocketmq" and not config.rocketmq_namesrv.strip():
        raise ConfigError("rocketmq_namesrv: store=rocketmq needs a NameServer address")
    if config.clustered:
        if config.store != "rocketmq":
            raise ConfigError(
                "redis_url/redis_sentinels: a cluster needs store=rocketmq (the embedded log is "
                "one process's files)"
            )
        parse_listen(config.peer_listen)
        if config.peer_advertise:
            parse_listen(config.peer_advertise)
        _validate_peer_security(config)
        for name in ("redis_timeout", "node_timeout", "takeover_timeout", "peer_handshake_timeout"):
            if getattr(config, name) <= 0:
                raise ConfigError(f"{name}: must be positive")
        if not 0 <= config.interest_confirm_timeout <= 10:
            raise ConfigError(
                "interest_confirm_timeout: from 0 (SUBACK without confirmation) to 10 seconds"
            )
    if config.rocketmq_send_timeout <= 0:
        raise ConfigError("rocketmq_send_timeout: must be positive")
    _validate_rocketmq_security(config)
    positive = (
        "segment_bytes",
        "retention_bytes",
        "max_packet_size",
        "max_topic_length",
        "max_topic_levels",
        "max_inflight",
        "max_inbound_pending",
        "receive_maximum",
        "max_message_properties",
        "delayed_max_pending",
        "delayed_max_bytes",
        "delayed_max_bytes_per_client",
        "retained_max_messages",
        "retained_max_bytes",
        "retained_max_messages_per_client",
        "retained_max_bytes_per_client",
        "max_subscriptions_per_client",
        "max_awaiting_rel",
        "max_will_bytes",
        "max_queued_messages",
        "max_queued_bytes",
        "write_buffer_high",
    )
    for name in positive:
        if getattr(config, name) <= 0:
            raise ConfigError(f"{name}: must be positive, got {getattr(config, name)}")
    if config.max_inflight > 65535:
        raise ConfigError("max_inflight: at most 65535 (the packet id space)")
    if config.receive_maximum > 65535:
        raise ConfigError("receive_maximum: at most 65535 (the packet id space)")
    if not 0 <= config.topic_alias_maximum <= 65535:
        raise ConfigError("topic_alias_maximum: 0..65535")
    if not 0 <= config.delayed_max_seconds <= 9_999_999_999:
        raise ConfigError("delayed_max_seconds: 0 (off) to 9999999999 seconds")
    if config.max_packet_size > 268_435_460:
        raise ConfigError("max_packet_size: at most 268435460 (the MQTT maximum)")
    for name in ("connect_timeout", "offset_flush_interval", "session_expiry_seconds"):
        if getattr(config, name) <= 0:
            raise ConfigError(f"{name}: must be positive")
