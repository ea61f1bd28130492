"""The guard of tests/support/loop_guard.py bites: a test during which an event loop reported an
unhandled error fails, whatever the test asserted, and a test that claims the error it provoked
passes. The tests below run in a pytest of their own (a subprocess with only the guard as
plugin), so their failures are the guard's verdicts, read from its report."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GUARD_ONLY = ["-p", "tests.support.loop_guard", "-p", "no:cacheprovider"]
"""Options of the inner pytest: the guard as its one plugin of ours (no tests/conftest.py)."""

GUARDED = """
import asyncio

import uvloop


async def _fail() -> None:
    raise RuntimeError("nobody retrieved me")


def test_task_exception_never_retrieved() -> None:
    async def main() -> None:
        task = asyncio.get_running_loop().create_task(_fail())
        await asyncio.wait([task])  # done, its exception never asked for

    asyncio.run(main())


def test_exception_in_a_callback() -> None:
    async def main() -> None:
        asyncio.get_running_loop().call_soon(_raise)
        await asyncio.sleep(0)

    asyncio.run(main())


def _raise() -> None:
    raise RuntimeError("a callback failed")


def test_task_destroyed_pending_on_asyncio() -> None:
    _leave_a_task_pending(asyncio.new_event_loop())


def test_task_destroyed_pending_on_uvloop() -> None:
    _leave_a_task_pending(uvloop.new_event_loop())


def _leave_a_task_pending(loop: asyncio.AbstractEventLoop) -> None:
    # The task waits on a future that only the closed loop could complete; the two refer to
    # each other, so only the collector finds them, and only then is the task reported.
    loop.create_task(asyncio.sleep(3600))
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()


def test_an_error_claimed_by_the_test_passes(loop_errors) -> None:
    test_exception_in_a_callback()
    assert [str(r.exc_info[1]) for r in loop_errors.take()] == ["a callback failed"]


def test_a_clean_loop_passes() -> None:
    asyncio.run(asyncio.sleep(0))
"""


def test_a_test_fails_when_its_event_loop_reported_an_unhandled_error(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_guarded.py").write_text(GUARDED)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *GUARD_ONLY, "-rA", "test_guarded.py"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = done.stdout
    verdicts: dict[str, set[str]] = {}
    for verdict, test in re.findall(r"^(PASSED|ERROR|FAILED) test_guarded.py::(\w+)", out, re.M):
        verdicts.setdefault(test, set()).add(verdict)
    assert done.returncode == 1 and verdicts == {
        # Each ran to its end: the guard's verdict comes at teardown.
        "test_task_exception_never_retrieved": {"PASSED", "ERROR"},
        "test_exception_in_a_callback": {"PASSED", "ERROR"},
        "test_task_destroyed_pending_on_asyncio": {"PASSED", "ERROR"},
        "test_task_destroyed_pending_on_uvloop": {"PASSED", "ERROR"},
        "test_an_error_claimed_by_the_test_passes": {"PASSED"},
        "test_a_clean_loop_passes": {"PASSED"},
    }, out
    for reported in (
        "Task exception was never retrieved",
        "RuntimeError: nobody retrieved me",
        "Exception in callback _raise()",
        "RuntimeError: a callback failed",
        "Task was destroyed but it is pending!",
    ):
        assert reported in out, out
