"""Whether the node's settings can work: `check_node_settings(config)` raises `ConfigError`
naming the setting and why, before the node opens its store.

The node's settings are the subscriptions every session starts with (`presubscribe`), what a
client may make the node keep (in-flight and queued messages, retained and delayed publishes,
subscriptions, wills, QoS 2 exchanges), topics' limits, how QoS 0 publishers wait for full
subscribers, and the pace of its housekeeping (offsets, session expiry, refused CONNECTs' log).
"""

from __future__ import annotations

from bridge.node.presubscribe import PresubscribeError, parse_presubscriptions
from bridge.settings import Config, ConfigError, require_positive


def check_node_settings(config: Config) -> None:
    """Raise ConfigError for node settings that cannot work."""
    try:
        parse_presubscriptions(config.presubscribe)
    except PresubscribeError as exc:
        raise ConfigError(f"presubscribe: {exc}") from None
    for name in ("qos0_publisher_wait", "qos2_copy_window"):
        if getattr(config, name) < 0:
            raise ConfigError(f"{name}: must not be negative")
    if not 0 <= config.refused_connect_log_interval <= 86400:  # also refuses nan
        raise ConfigError(
            "refused_connect_log_interval: 0 to 86400 seconds, got "
            f"{config.refused_connect_log_interval}"
        )
    _check_quotas(config)
    for name in ("offset_flush_interval", "session_expiry_seconds"):
        if getattr(config, name) <= 0:
            raise ConfigError(f"{name}: must be positive")


def _check_quotas(config: Config) -> None:
    """What a client may make the node keep, and the topics it may use."""
    require_positive(
        config,
        (
            "max_topic_length",
            "max_topic_levels",
            "max_inflight",
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
        ),
    )
    if config.max_inflight > 65535:
        raise ConfigError("max_inflight: at most 65535 (the packet id space)")
    if not 0 <= config.delayed_max_seconds <= 9_999_999_999:
        raise ConfigError("delayed_max_seconds: 0 (off) to 9999999999 seconds")
