"""Whether the storage settings can work: `check_storage_settings(config)` raises `ConfigError`
naming the setting and why, before the store opens.

The storage settings are which backend keeps the messages, the embedded log's segments,
retention and commits, and RocketMQ's NameServer, send timeout, credentials and TLS (checked by
building them: `bridge.storage.rocketmq.rocketmq_security`).
"""

from __future__ import annotations

from bridge.settings import Config, ConfigError, require_positive

MAX_SYNC_INTERVAL_MS = 120_000
"""The longest `sync_interval_ms`, NATS JetStream's default sync interval (RocketMQ's asynchronous
flush runs every 500 ms): a longer unsynced window is a snapshot policy, which this store does not
offer."""


MAX_HELD_READS = 100_000
"""Held reads one node may keep at the broker at most: each is a request its hold service
holds and checks every 5 s."""


def check_storage_settings(config: Config) -> None:
    """Raise ConfigError for storage settings that cannot work."""
    if config.store not in ("filelog", "rocketmq"):
        raise ConfigError(f"store: unknown backend {config.store!r} (known: filelog, rocketmq)")
    if config.store == "rocketmq" and not config.rocketmq_namesrv.strip():
        raise ConfigError("rocketmq_namesrv: store=rocketmq needs a NameServer address")
    if config.rocketmq_send_timeout <= 0:
        raise ConfigError("rocketmq_send_timeout: must be positive")
    if not 0 <= config.rocketmq_held_reads <= MAX_HELD_READS:
        raise ConfigError(
            f"rocketmq_held_reads: must be 0..{MAX_HELD_READS} (each is a pull the broker keeps)"
        )
    if _uses_rocketmq_client(config):
        # Imported only here: a node on the embedded log does not hold the RocketMQ client
        # (about a MiB of modules it would never run).
        from bridge.storage.rocketmq import rocketmq_security

        rocketmq_security(config)
    if config.sync not in ("commit", "interval"):
        raise ConfigError(f"sync: unknown policy {config.sync!r} (known: commit, interval)")
    if config.sync == "interval" and not 0 < config.sync_interval_ms <= MAX_SYNC_INTERVAL_MS:
        raise ConfigError(
            f"sync_interval_ms: must be above 0 and at most {MAX_SYNC_INTERVAL_MS:,} "
            "(the most acknowledged data a power loss may take is what this interval writes)"
        )
    for name in ("inline_commit_ms", "segment_preallocate_bytes"):
        if getattr(config, name) < 0:
            raise ConfigError(f"{name}: must not be negative")
    require_positive(config, ("segment_bytes", "retention_bytes"))


def _uses_rocketmq_client(config: Config) -> bool:
    """Whether the node talks to RocketMQ (its store), or has settings that secure that talk."""
    return bool(
        config.store == "rocketmq"
        or config.rocketmq_access_key
        or config.rocketmq_secret_key_file
        or config.rocketmq_tls
    )
