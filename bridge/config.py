"""Settings of a bridge node: defaults, a TOML file, `MQTT_BRIDGE_*` environment variables and the
command line, applied in that order (later wins).

`Config` is plain data and `SETTINGS` documents every field (both in `bridge.settings`). This
module is the front door of reading them: `read_config` builds a `Config` with every value of its
setting's type, and it re-exports the names its users need. Whether the values can work together
is each room's check (its `settings_checks.py`); `bridge.checks.load_config` reads and runs them
all, so this module imports no room.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from bridge.settings import ENV_PREFIX, SETTINGS, Config, ConfigError, KiB, MiB, parse_listen

# Settings whose default is "unset" (None), resolved when checked; they take true/false or `auto`.
_OPTIONAL_BOOLS = frozenset({"allow_anonymous"})


def _coerce(name: str, raw: Any, template: Any) -> Any:
    if name in _OPTIONAL_BOOLS:
        if raw is None or str(raw).strip().lower() in ("", "auto"):
            return None
        template = False
    if isinstance(template, bool):
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{name}: expected true/false, got {raw!r}")
    if isinstance(template, int):
        try:
            return int(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: expected an integer, got {raw!r}") from None
    if isinstance(template, float):
        try:
            return float(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: expected a number, got {raw!r}") from None
    if isinstance(template, list):
        if isinstance(raw, str):
            return [part.strip() for part in raw.split(",") if part.strip()]
        if isinstance(raw, list) and all(isinstance(x, str) for x in raw):
            return list(raw)
        raise ConfigError(f"{name}: expected a list of strings, got {raw!r}")
    if not isinstance(raw, str):
        raise ConfigError(f"{name}: expected a string, got {raw!r}")
    return raw


def read_config(
    file: str | Path | None = None,
    env: dict[str, str] | None = None,
    overrides: dict[str, Any] | None = None,
) -> Config:
    """Build a Config from defaults < TOML file < environment < explicit overrides; ConfigError for
    an unknown setting or a value not of its type. Not checked that the values can work together:
    a node's settings come from `bridge.checks.load_config`, which is."""
    config = Config()
    defaults = {f.name: getattr(config, f.name) for f in fields(Config)}
    layers: list[tuple[str, dict[str, Any]]] = []
    if file is not None:
        import tomllib  # only with a file: half a MiB a node without one does not hold

        try:
            with open(file, "rb") as fh:
                data = tomllib.load(fh)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {file}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {file} is not valid TOML: {exc}") from None
        section = data.get("bridge", data)
        layers.append((f"file {file}", {k.replace("-", "_"): v for k, v in section.items()}))
    environ: Mapping[str, str] = os.environ if env is None else env
    from_env = {
        key[len(ENV_PREFIX) :].lower(): value
        for key, value in environ.items()
        if key.startswith(ENV_PREFIX)
    }
    layers.append(("environment", from_env))
    if overrides:
        layers.append(("command line", {k: v for k, v in overrides.items() if v is not None}))
    for origin, values in layers:
        for name, raw in values.items():
            if name not in defaults:
                raise ConfigError(f"unknown setting {name!r} (from {origin})")
            setattr(config, name, _coerce(name, raw, defaults[name]))
    return config


__all__ = [
    "ENV_PREFIX",
    "SETTINGS",
    "Config",
    "ConfigError",
    "KiB",
    "MiB",
    "parse_listen",
    "read_config",
]
