"""`python -m notify` refuses what cannot work with a message and exit code 2, no traceback."""

from __future__ import annotations

import subprocess
import sys

from tests.support.processes import REPO


def run_notify(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "notify", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_notify_without_a_cluster_registry_says_what_it_needs() -> None:
    result = run_notify()
    assert result.returncode == 2
    assert "redis_url or redis_sentinels is needed" in result.stderr
    assert "Traceback" not in result.stderr


def test_notify_with_an_unknown_setting_names_it() -> None:
    result = run_notify("--set", "no_such_thing=1")
    assert result.returncode == 2
    assert "unknown setting 'no_such_thing'" in result.stderr


def test_notify_with_a_malformed_set_item_explains_the_form() -> None:
    result = run_notify("--set", "redis_url")
    assert result.returncode == 2
    assert "--set expects NAME=VALUE" in result.stderr
