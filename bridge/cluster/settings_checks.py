"""Whether the cluster's settings can work: `check_cluster_settings(config)` raises `ConfigError`
naming the setting and why, before the node joins anything.

The cluster's settings are the node's id among its peers, how every Redis client reaches Redis
(credentials, TLS, Sentinel; `redis_access.py` builds them), and a member's peer links: where it
listens, how it authenticates them, and its timeouts.
"""

from __future__ import annotations

from bridge.cluster.credential import CredentialError, read_cluster_secrets
from bridge.redact import MASK, redact_url
from bridge.router.queues import ANY_PEER, PEER_PREFIX
from bridge.settings import Config, ConfigError, parse_listen


def check_cluster_settings(config: Config) -> None:
    """Raise ConfigError for cluster settings that cannot work."""
    # "*" stands for any peer, NUL starts a peer's subscriber id (bridge.router.queues)
    if config.node_id == ANY_PEER or PEER_PREFIX in config.node_id:
        raise ConfigError(f"node_id: {config.node_id!r} is reserved (pick a name)")
    _check_redis(config)
    if config.clustered:
        if config.store != "rocketmq":
            raise ConfigError(
                "redis_url/redis_sentinels: a cluster needs store=rocketmq (the embedded log is "
                "one process's files)"
            )
        parse_listen(config.peer_listen)
        if config.peer_advertise:
            parse_listen(config.peer_advertise)
        _check_peer_security(config)
        for name in ("redis_timeout", "node_timeout", "takeover_timeout", "peer_handshake_timeout"):
            if getattr(config, name) <= 0:
                raise ConfigError(f"{name}: must be positive")
        if not 0 <= config.interest_confirm_timeout <= 10:
            raise ConfigError(
                "interest_confirm_timeout: from 0 (SUBACK without confirmation) to 10 seconds"
            )


def _check_redis(config: Config) -> None:
    """The Redis access settings hang together (files are read when Redis is first used)."""
    for name in ("redis_password", "redis_sentinel_password"):
        if getattr(config, name) and getattr(config, f"{name}_file"):
            raise ConfigError(f"{name} and {name}_file: set one, not both")
    for name in ("redis_url", "metering_redis_url"):
        url = getattr(config, name)
        if url and not url.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigError(f"{name}: must start with redis://, rediss:// or unix://")
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


def _check_peer_security(config: Config) -> None:
    """A cluster member authenticates its peer links: with the cluster secret, mutual TLS, or
    both. Without either, anyone who reaches the peer port would own the cluster."""
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
