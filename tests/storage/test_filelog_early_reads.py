"""FileLogStore's early reads: a QoS 0/1 message readable before its commit, a QoS 2 one not,
and a failed write that takes back what readers could read tells who must go back."""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path
from typing import Any

import pytest

from bridge.storage import FileLogStore, StoreUnavailable
from bridge.storage.filelog import commit as filelog_commit
from tests.storage.conftest import Run
from tests.storage.test_contract import msg, read_all


async def opened(path: Path) -> FileLogStore:
    store = FileLogStore(path)
    await store.open()
    return store


def outcomes() -> tuple[list[tuple[int | None, BaseException | None]], Any]:
    seen: list[tuple[int | None, BaseException | None]] = []

    def callback(seq: int | None, error: BaseException | None) -> None:
        seen.append((seq, error))

    return seen, callback


def test_an_early_message_is_readable_before_its_commit_and_a_late_one_only_after(
    tmp_path: Path, run: Run[Any]
) -> None:
    async def body() -> None:
        store = await opened(tmp_path)
        seen, callback = outcomes()
        assert store.submit(msg(0), ["q"], callback=callback, early=True)
        assert store.end_offset("q") == 1
        cached = store.read_cached("q", 0, 10)
        assert cached is not None and [s.message.key for s in cached.messages] == ["k0"]
        assert seen == []  # not durable yet: nobody was told
        assert not store.submit(msg(1), ["r"], callback=callback)
        assert store.end_offset("r") == 0
        await store.append(msg(2), ["q"])  # a barrier: everything before it is durable
        assert [e for _, e in seen] == [None, None]
        assert store.end_offset("r") == 1
        assert store.end_offset("q") == 2
        await store.close()

    run(body())


def test_a_message_not_read_early_holds_back_the_early_ones_behind_it(
    tmp_path: Path, run: Run[Any]
) -> None:
    async def body() -> None:
        store = await opened(tmp_path)
        seen, callback = outcomes()
        assert not store.submit(msg(0), ["q"], callback=callback)  # QoS 2: never read early
        assert not store.submit(msg(1), ["q", "other"], callback=callback, early=True)
        assert store.end_offset("q") == 0
        assert store.end_offset("other") == 0  # one message: readable on all its queues or none
        # its queue has one before it that is not readable:
        assert not store.submit(msg(2), ["other"], callback=callback, early=True)
        await store.append(msg(3), ["q"])
        assert len(seen) == 3
        assert store.end_offset("q") == 3
        assert store.end_offset("other") == 2
        assert [s.message.key for s in await read_all(store, "q")] == ["k0", "k1", "k3"]
        await store.close()

    run(body())


def test_a_failed_write_rewinds_what_readers_could_read_and_the_offsets_go_to_the_next(
    tmp_path: Path, run: Run[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_full(fd: int, data: bytes | bytearray) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    async def body() -> None:
        store = await opened(tmp_path)
        await store.append(msg(0), ["q"])
        rewound: list[dict[str, int]] = []
        store.on_rewind = rewound.append
        monkeypatch.setattr(filelog_commit, "_write_all", disk_full)
        seen, callback = outcomes()
        assert store.submit(msg(1), ["q"], callback=callback, early=True)
        assert store.submit(msg(2), ["q", "r"], callback=callback, early=True)
        assert not store.submit(msg(3), ["late"], callback=callback)
        assert store.end_offset("q") == 3 and store.end_offset("r") == 1
        for _ in range(100):
            if len(seen) == 3:
                break
            await asyncio.sleep(0.01)
        assert all(isinstance(e, StoreUnavailable) for _, e in seen)
        # Only the queues whose readers could have gone past the new end; "late" never was.
        assert rewound == [{"q": 1, "r": 0}]
        assert store.end_offset("q") == 1 and store.end_offset("r") == 0
        monkeypatch.undo()
        assert await store.append(msg(4), ["q"]) > 0
        assert [(s.offset, s.message.key) for s in await read_all(store, "q")] == [
            (0, "k0"),
            (1, "k4"),
        ]
        await store.close()
        store = await opened(tmp_path)
        assert store.end_offset("q") == 2 and store.end_offset("r") == 0
        # after a restart the ends are durable and readable alike:
        assert store.submit(msg(5), ["q"], callback=callback, early=True)
        await store.append(msg(6), ["q"])
        assert [s.message.key for s in await read_all(store, "q")] == ["k0", "k4", "k5", "k6"]
        await store.close()

    run(body())


def test_a_read_that_needs_the_disk_stops_at_the_durable_end(tmp_path: Path, run: Run[Any]) -> None:
    """A read that waits for the disk returns no record read early: a failed write could take
    that record back while the read waits."""

    async def body() -> None:
        store = FileLogStore(tmp_path, cache_bytes=1)  # durable records leave the cache at once
        await store.open()
        for i in range(3):
            await store.append(msg(i), ["q"])
        _seen, callback = outcomes()
        assert store.submit(msg(3), ["q"], callback=callback, early=True)
        assert store.submit(msg(4), ["q"], callback=callback, early=True)
        assert store.end_offset("q") == 5
        first = await store.read("q", 0, 10)
        assert [s.offset for s in first.messages] == [0, 1, 2] and first.next_offset == 3
        rest = await store.read("q", 3, 10)
        assert [s.message.key for s in rest.messages] == ["k3", "k4"]
        await store.close()

    run(body())
