"""Whether the operations' settings can work: `check_operations_settings(config)` raises
`ConfigError` naming the setting and why, before the admin API listens.

The operations' settings are the admin API's listener and what a stranger can make it hold,
the `$SYS` statistics and client events, metering and the heap's trimming.
"""

from __future__ import annotations

from bridge.settings import Config, ConfigError, parse_listen


def check_operations_settings(config: Config) -> None:
    """Raise ConfigError for operations settings that cannot work."""
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
    for name in ("sys_interval", "metering_interval", "memory_trim_interval"):
        if getattr(config, name) < 0:
            raise ConfigError(f"{name}: must not be negative")
