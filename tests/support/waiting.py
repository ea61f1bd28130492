"""Waiting for a condition, with a deadline: the one polling loop the tests and their servers'
helpers share."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

POLL_INTERVAL = 0.02


def poll_until(check: Callable[[], bool], timeout: float) -> bool:
    """Whether `check` became true within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_INTERVAL)
    return True


def wait_until(
    probe: Callable[[], T],
    timeout: float,
    what: str,
    *,
    retrying: tuple[type[Exception], ...] = (),
) -> T:
    """Call `probe` until it returns something true, and return that; fail the test (an
    AssertionError naming `what`) once `timeout` seconds have passed. An exception of a type in
    `retrying` (a server still starting, a failover in progress) counts as a false answer, and
    the last one is named if time runs out."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            result = probe()
        except retrying as exc:
            last_error = exc
        else:
            if result:
                return result
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            raise AssertionError(f"timed out after {timeout} s waiting for {what}{detail}")
        time.sleep(POLL_INTERVAL)
