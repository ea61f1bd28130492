"""The mypyc build of the hot-path modules: what the tests import is what setup.py compiles, and
an edited source is never shadowed by its older compiled module."""

from __future__ import annotations

import importlib
import os
import re
from pathlib import Path

import pytest

from bridge import stale_compiled

REPO = Path(__file__).resolve().parents[3]


def compiled_list() -> list[str]:
    return re.findall(r'^    "(bridge/[\w/]+\.py)",$', (REPO / "setup.py").read_text(), re.M)


@pytest.mark.skipif(
    os.environ.get("MQTT_BRIDGE_COMPILE") == "0" and not os.environ.get("CI"),
    reason="a pure Python run asked for (MQTT_BRIDGE_COMPILE=0); never skipped in CI",
)
def test_the_modules_setup_py_compiles_are_imported_compiled():
    names = compiled_list()
    assert "bridge/node/publish.py" in names
    for path in names:
        module = importlib.import_module(path[:-3].replace("/", "."))
        assert module.__file__ is not None and module.__file__.endswith(".so"), (
            f"{path} is not compiled: run `make compile`"
        )


def test_a_source_edited_after_its_build_is_reported_stale(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    source, built = package / "hot.py", package / "hot.cpython-311-x86_64-linux-gnu.so"
    source.write_text("x = 1\n")
    built.write_bytes(b"\0")
    os.utime(source, (1_000, 1_000))
    os.utime(built, (2_000, 2_000))
    assert stale_compiled(str(package)) == []
    os.utime(source, (3_000, 3_000))
    assert stale_compiled(str(package)) == ["pkg/hot.py"]


def test_a_compiled_module_without_its_source_is_not_stale(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "native__mypyc.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\0")
    assert stale_compiled(str(tmp_path / "pkg")) == []
