"""MQTT-Bridge: a clustered MQTT gateway over RocketMQ storage."""

from __future__ import annotations

import os

__version__ = "0.1.0"


def stale_compiled(package: str) -> list[str]:
    """The modules of `package` (a directory) whose mypyc build (a .so beside the .py) is older
    than their source. Python imports the compiled module first, so an edited source would
    silently not run."""
    stale = []
    for root, _dirs, files in os.walk(package):
        for name in files:
            if not name.endswith(".so"):
                continue
            source = os.path.join(root, name.split(".", 1)[0] + ".py")
            built = os.path.join(root, name)
            if os.path.exists(source) and os.path.getmtime(source) > os.path.getmtime(built):
                stale.append(os.path.relpath(source, os.path.dirname(package)))
    return sorted(stale)


def _check_compiled() -> None:
    package = os.path.dirname(os.path.abspath(__file__))
    if not os.path.exists(os.path.join(os.path.dirname(package), "setup.py")):
        return  # an installed package, not a source checkout: nothing is edited in place
    stale = stale_compiled(package)
    if stale:
        raise ImportError(
            f"{', '.join(stale)} changed after it was compiled: run `make compile` to rebuild "
            "the compiled modules (or `make pure` to remove them and run pure Python)"
        )


_check_compiled()
