"""Whether a node's settings can work, asked of every room: `load_config` reads the settings
(`bridge.config.read_config`) and checks them (`check_config`), so a node, a command line or a
test gets a `ConfigError` naming the setting and why before anything starts.

Each room checks its own settings in its `settings_checks.py`; this module, above the rooms, only
lists them (`ROOM_CHECKS`), so `bridge.config` and `bridge.settings` import no room.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from bridge.access.settings_checks import check_access_settings
from bridge.cluster.settings_checks import check_cluster_settings
from bridge.config import read_config
from bridge.listeners.settings_checks import check_listener_settings
from bridge.node.settings_checks import check_node_settings
from bridge.operations.settings_checks import check_operations_settings
from bridge.settings import Config, ConfigError
from bridge.storage.settings_checks import check_storage_settings

ROOM_CHECKS: tuple[Callable[[Config], None], ...] = (
    check_listener_settings,
    check_access_settings,
    check_cluster_settings,
    check_operations_settings,
    check_node_settings,
    check_storage_settings,
)
"""Every room's check of its settings, in the order they run (the first error is reported)."""


def check_config(config: Config) -> None:
    """Raise ConfigError for values that cannot work: the process's own (`log_level`), then each
    room's. Resolves `allow_anonymous` (the access room's check)."""
    if config.log_level.lower() not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"log_level: {config.log_level!r} is not debug/info/warning/error")
    for check in ROOM_CHECKS:
        check(config)


def load_config(
    file: str | Path | None = None,
    env: dict[str, str] | None = None,
    overrides: dict[str, Any] | None = None,
) -> Config:
    """The Config a node runs with, from defaults < TOML file < environment < explicit overrides,
    checked: ConfigError for a bad name or value, or for values that cannot work together."""
    config = read_config(file, env, overrides)
    check_config(config)
    return config
