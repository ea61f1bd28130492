"""Each room checks its own settings and `bridge.checks` runs every room's check: reading the
settings (`bridge.config`) imports no room, and a bad setting of each room is refused by that
room's check and by `load_config`, the composed entry point."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from bridge.access.settings_checks import check_access_settings
from bridge.checks import ROOM_CHECKS, load_config
from bridge.cluster.settings_checks import check_cluster_settings
from bridge.config import read_config
from bridge.listeners.settings_checks import check_listener_settings
from bridge.node.settings_checks import check_node_settings
from bridge.operations.settings_checks import check_operations_settings
from bridge.settings import Config, ConfigError
from bridge.storage.settings_checks import check_storage_settings

REPO = Path(__file__).resolve().parents[3]

ONE_BAD_SETTING_PER_ROOM: list[tuple[Callable[[Config], None], dict[str, object], str]] = [
    (check_listener_settings, {"ws_path": "mqtt"}, "ws_path: 'mqtt' must start with /"),
    (check_access_settings, {"flapping_max_connects": -1}, "flapping_max_connects: must not be"),
    (check_cluster_settings, {"node_id": "*"}, "node_id: '*' is reserved (pick a name)"),
    (check_operations_settings, {"client_events_qos": 3}, "client_events_qos: must be 0, 1 or 2"),
    (check_node_settings, {"max_inflight": 0}, "max_inflight: must be positive, got 0"),
    (check_storage_settings, {"store": "sqlite"}, "store: unknown backend 'sqlite'"),
    (  # the RocketMQ client's security, which the storage room checks by building it
        check_storage_settings,
        {"rocketmq_access_key": "gw"},
        "rocketmq_secret_key: rocketmq_access_key is set, its key is not",
    ),
]


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, at its top or inside a function."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module, f"{path.name}: a relative import"
            names.add(node.module)
    return names


@pytest.mark.parametrize("module", ["config.py", "settings.py"])
def test_reading_the_settings_imports_only_the_settings_and_the_standard_library(
    module: str,
) -> None:
    imported = _imports(REPO / "bridge" / module)
    ours = {name for name in imported if name.split(".")[0] == "bridge"}
    assert ours <= {"bridge.settings"}, f"bridge/{module} imports {sorted(ours)}"
    assert {name.split(".")[0] for name in imported - ours} <= sys.stdlib_module_names


@pytest.mark.parametrize(
    ("room_check", "settings", "message"),
    ONE_BAD_SETTING_PER_ROOM,
    ids=[f"{check.__module__}:{next(iter(s))}" for check, s, _ in ONE_BAD_SETTING_PER_ROOM],
)
def test_a_bad_setting_is_refused_by_its_room_and_by_load_config(
    room_check: Callable[[Config], None], settings: dict[str, object], message: str
) -> None:
    read_config(env={}, overrides=settings)  # read: its type is right, whether it can work is not
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}"):
        room_check(Config(**settings))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}"):
        load_config(env={}, overrides=settings)


def test_every_room_check_is_composed_and_in_the_table_above() -> None:
    found = set()
    for path in sorted((REPO / "bridge").glob("*/settings_checks.py")):
        module = importlib.import_module(f"bridge.{path.parent.name}.settings_checks")
        found.update(
            function
            for name, function in inspect.getmembers(module, inspect.isfunction)
            if name.startswith("check_") and function.__module__ == module.__name__
        )
    assert len(found) == 6
    assert found == set(ROOM_CHECKS)
    assert found == {check for check, _, _ in ONE_BAD_SETTING_PER_ROOM}
