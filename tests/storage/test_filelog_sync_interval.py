"""The embedded store under `sync = interval`: a waited-for record is acknowledged once written to
the OS, and the log is synced within the interval by a later batch or, when none comes, by the
store's own timer.

What the interval promises on a power loss cannot be shown here (a test cannot cut the power of
the machine it runs on); what can is that the timer syncs, how soon, where, and that a failed
sync stops the store from acknowledging anything more. That a kill -9 of the process loses
nothing acknowledged is shown with real processes in tests/faults/test_crash_recovery.py.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from bridge.storage.base import StoreUnavailable
from bridge.storage.filelog import commit as filelog_commit
from tests.storage.conftest import Run
from tests.storage.test_contract import msg
from tests.storage.test_filelog import fill, opened

INTERVAL = 0.05


def unsynced(store: Any) -> bool:
    """Whether the store holds written records its disk may not have yet."""
    return any(seg.unsynced for seg in store._log.segments)


def test_acknowledged_records_are_written_at_once_and_synced_when_the_store_closes(
    tmp_path: Path, run: Run[Any]
) -> None:
    async def body() -> None:
        store = await opened(tmp_path, sync_interval=60.0)
        await fill(store, 1, ["q"])  # the first waited batch syncs: none before it
        synced = store.stats()["fsyncs"]
        await fill(store, 50, ["q"], start=1)  # fifty commits, each acknowledged once written
        assert store.stats()["commits"] >= 51
        assert store.stats()["fsyncs"] == synced
        assert unsynced(store)
        await store.close()
        assert not unsynced(store)
        assert store._sync_timer is None

    run(body())


def test_the_timer_syncs_the_log_once_the_interval_since_the_last_sync_has_passed(
    tmp_path: Path, run: Run[Any]
) -> None:
    async def body() -> None:
        store = await opened(tmp_path, sync_interval=INTERVAL)
        loop = asyncio.get_running_loop()
        await fill(store, 1, ["q"])
        first, synced = store._synced_at, store.stats()["fsyncs"]
        await fill(store, 5, ["q"], start=1)
        deadline = loop.time() + 10
        while unsynced(store):
            assert loop.time() < deadline, "the timer never synced the log"
            await asyncio.sleep(0.005)
        assert store._synced_at - first >= INTERVAL - 0.002  # uvloop's clock counts in ms
        assert store.stats()["fsyncs"] > synced
        await store.close()

    run(body())


def test_a_batch_taken_after_the_interval_syncs_before_its_waiters_are_told(
    tmp_path: Path, run: Run[Any]
) -> None:
    async def body() -> None:
        store = await opened(tmp_path, sync_interval=0.02)
        await fill(store, 1, ["q"])
        await asyncio.sleep(0.05)  # the interval has passed (nothing left unsynced meanwhile)
        synced = store.stats()["fsyncs"]
        await fill(store, 1, ["q"], start=1)
        assert store.stats()["fsyncs"] == synced + 1
        assert not unsynced(store)
        await store.close()

    run(body())


def test_with_commit_sync_every_waited_batch_is_synced_before_it_is_acknowledged(
    tmp_path: Path, run: Run[Any]
) -> None:
    async def body() -> None:
        store = await opened(tmp_path)
        await fill(store, 20, ["q"])
        assert not unsynced(store)
        assert store.stats()["fsyncs"] == store.stats()["commits"] == 20
        await store.close()

    run(body())


def test_the_timer_syncs_on_the_writer_thread_while_commits_are_slow(
    tmp_path: Path, run: Run[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[int] = []
    real = filelog_commit._timed_sync

    def noting(fd: int) -> float:
        threads.append(threading.get_ident())
        return real(fd)

    monkeypatch.setattr(filelog_commit, "_timed_sync", noting)

    async def body() -> None:
        store = await opened(tmp_path, sync_interval=0.02, inline_commit_seconds=0.0)
        await fill(store, 1, ["q"])
        await fill(store, 5, ["q"], start=1)
        deadline = asyncio.get_running_loop().time() + 10
        while unsynced(store):
            assert asyncio.get_running_loop().time() < deadline, "the timer never synced the log"
            await asyncio.sleep(0.01)
        assert threads and threading.get_ident() not in threads
        await fill(store, 1, ["q"], start=6)  # commits go on after it
        await store.close()

    run(body())


def test_a_failed_sync_stops_the_store_acknowledging_and_says_why(
    tmp_path: Path,
    run: Run[Any],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def failing(fd: int) -> float:
        raise OSError(errno.EIO, "Input/output error")

    async def body() -> None:
        store = await opened(tmp_path, sync_interval=0.02)
        await fill(store, 1, ["q"])
        monkeypatch.setattr(filelog_commit, "_timed_sync", failing)
        await fill(store, 3, ["q"], start=1)  # acknowledged once written: before the sync
        deadline = asyncio.get_running_loop().time() + 10
        while store._broken is None:
            assert asyncio.get_running_loop().time() < deadline, "the sync never ran"
            await asyncio.sleep(0.01)
        with pytest.raises(StoreUnavailable):
            await store.append(msg(4), ["q"])
        assert store.stats()["write_errors"] == 1
        await store.close()

    with caplog.at_level(logging.CRITICAL, logger="bridge.storage"):
        run(body())
    assert "syncing the log failed" in caplog.text
    assert "restart the node" in caplog.text
