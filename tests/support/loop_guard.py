"""Nothing escapes unseen: a test fails when, while it ran, an event loop in the test process
reported an exception nobody handled or a task destroyed while still pending.

asyncio and uvloop report both through the loop's exception handler, whose default logs an
ERROR on the "asyncio" logger: "Task exception was never retrieved", "Exception in callback
...", "Task was destroyed but it is pending!", a protocol's failure, uvloop's "deallocating an
open event loop". One handler on that logger, installed for the whole session, hears them from
every loop and every thread of this process; the autouse guard checks what it heard after each
test. An abandoned task or future is reported only when it is garbage-collected, so after a
test that used an event loop the guard collects before it looks: the leak is then blamed on the
test that left it, not on whichever later test the collector happens to run in. A test that
provokes such a report on purpose claims it with the `loop_errors` fixture; what nobody claims
fails the test.

Registered from tests/conftest.py (`pytest_plugins`). Bridge processes are separate: their
logs are checked for tracebacks by the `bridge_factory` fixture.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import uvloop

ASYNCIO_LOGGER = "asyncio"


class LoopErrors(logging.Handler):
    """The ERROR records the "asyncio" logger received and nobody claimed yet."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self._records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self._records.append(record)  # called with self.lock held (Handler.handle)

    def take(self) -> list[logging.LogRecord]:
        """Every record heard so far, now claimed: the guard no longer fails on them."""
        with self.lock:
            taken, self._records = self._records, []
        return taken

    def messages(self) -> list[str]:
        """The unclaimed records' messages (a test polls this while it waits for one)."""
        with self.lock:
            return [record.getMessage() for record in self._records]


def report(records: list[logging.LogRecord], when: str) -> str:
    """The failure text for records nobody claimed: each with its traceback."""
    formatter = logging.Formatter("%(levelname)s %(name)s (thread %(threadName)s): %(message)s")
    shown = "\n\n".join(formatter.format(record) for record in records)
    return (
        f"an event loop in the test process reported {len(records)} unhandled error(s) "
        f"{when} (an exception nobody retrieved or handled, or a task destroyed while "
        f"pending):\n\n{shown}"
    )


def check(errors: LoopErrors, when: str) -> None:
    """Fail with `report` if `errors` holds unclaimed records; fail too if the "asyncio"
    logger was silenced (a disabled logger or a level above ERROR would hide every report)."""
    logger = logging.getLogger(ASYNCIO_LOGGER)
    if logger.disabled or not logger.isEnabledFor(logging.ERROR):
        pytest.fail(
            f'the "asyncio" logger was silenced {when}: the guard cannot hear the event '
            "loops' unhandled errors",
            pytrace=False,
        )
    if records := errors.take():
        pytest.fail(report(records, when), pytrace=False)


class Loops:
    """The event loops (asyncio's and uvloop's) made in this process, seen as they are made."""

    def __init__(self) -> None:
        self.made = False
        """Whether a loop was made since `clear`."""
        self._all: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()

    def clear(self) -> None:
        self.made = False

    def in_use(self) -> bool:
        """Whether a loop was made since `clear` or one made before is still open (a fixture
        shared by several tests keeps it): only then can a task or future have been left for
        the collector to report. A test that used no loop skips the collection, which costs
        tens of milliseconds."""
        return self.made or any(not loop.is_closed() for loop in list(self._all))

    def watch(self) -> None:
        """Wrap the loop classes' constructors: every loop is made through one of them."""
        for cls in (asyncio.BaseEventLoop, uvloop.Loop):
            self._wrap(cls)

    def _wrap(self, cls: type) -> None:
        made_by: Callable[..., None] = cls.__init__

        def init(loop: asyncio.AbstractEventLoop, *args: Any, **kwargs: Any) -> None:
            made_by(loop, *args, **kwargs)
            self.made = True
            self._all.add(loop)

        cls.__init__ = init  # type: ignore[misc]


_errors = LoopErrors()
_loops = Loops()


def pytest_configure(config: pytest.Config) -> None:
    logging.getLogger(ASYNCIO_LOGGER).addHandler(_errors)
    _loops.watch()


def pytest_collection_finish(session: pytest.Session) -> None:
    """What exists once the tests are collected (modules, classes, test items) lives for the
    whole session: frozen, it is no longer walked by each collection, the guard's or Python's
    own, which makes them several times cheaper. Not when a module made an event loop as it
    was imported: that loop's tasks must stay within the collector's sight."""
    gc.collect()
    if not _loops.made:
        gc.freeze()


def pytest_unconfigure(config: pytest.Config) -> None:
    logging.getLogger(ASYNCIO_LOGGER).removeHandler(_errors)


@pytest.fixture(autouse=True)
def _nothing_escapes_unseen() -> Iterator[None]:
    check(_errors, "before this test began (in a fixture several tests share, or between tests)")
    _loops.clear()
    yield
    if _loops.in_use():
        gc.collect()
    check(_errors, "while this test ran")


@pytest.fixture
def loop_errors() -> LoopErrors:
    """For a test that makes an event loop report an error on purpose: `loop_errors.take()`
    claims what was reported so far (to assert on it); the rest fails the test."""
    return _errors


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """What was reported after the last test's check (a session fixture's teardown) fails the
    run too: printed, and the exit status set."""
    gc.collect()
    if records := _errors.take():
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        text = report(records, "after the last test (in a session fixture's teardown)")
        if reporter is not None:
            reporter.write_line(text, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
