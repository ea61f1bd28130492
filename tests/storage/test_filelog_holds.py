"""Holds on the file log's queues (`LogHolds`): retention keeps what a hold keeps, a hold
outlives a crash, and a failed write neither loses one nor leaves a later one."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

from bridge.storage import FileLogStore, StoreUnavailable
from bridge.storage.filelog import commit as filelog_commit
from bridge.storage.filelog.files import write_all
from tests.storage.conftest import Run
from tests.storage.test_contract import msg, submitted
from tests.storage.test_filelog import abandon, fill, opened, segments

SMALL = {"segment_bytes": 1000, "retention_bytes": 3000, "cache_bytes": 0}
HELD = "d:"


def test_retention_keeps_the_segment_of_a_held_message_until_the_hold_moves_past_it(
    tmp_path: Path, run: Run[Any]
) -> None:
    async def body() -> None:
        store = await opened(tmp_path, **SMALL)
        store.holds.hold(HELD, store.holds.next_offset(HELD))
        await store.append(msg(0, payload=b"due in three days"), [HELD])
        await fill(store, 100, ["q"], start=1)
        first_segment = segments(tmp_path)[0]
        await store.enforce_retention()
        assert first_segment.exists()
        kept = await store.read(HELD, 0, 1)
        assert (kept.lost, kept.messages[0].message.payload) == (0, b"due in three days")

        store.holds.hold(HELD, 1)  # read: retention may take it now
        assert await store.enforce_retention() > 0
        assert not first_segment.exists()
        assert (await store.read(HELD, 0, 1)).lost == 1
        assert store.stats()["bytes_on_disk"] <= 3000 + 1000
        await store.close()

    run(body())


def test_a_held_message_in_a_later_segment_keeps_that_segment_and_lets_older_ones_go(
    tmp_path: Path, run: Run[Any]
) -> None:
    async def body() -> None:
        store = await opened(tmp_path, **SMALL)
        await fill(store, 30, ["q"])
        store.holds.hold(HELD, 0)
        seq = await store.append(msg(30), [HELD])
        await fill(store, 70, ["q"], start=31)
        assert await store.enforce_retention() > 0
        assert store._log.segments[0].base <= seq  # the held record's segment stays
        assert (await store.read(HELD, 0, 1)).messages[0].seq == seq
        assert (await store.read("q", 0, 1)).lost > 0  # what came before it went
        await store.close()

    run(body())


def test_a_hold_outlives_a_crash_and_keeps_its_message_from_retention_at_once(
    tmp_path: Path, run: Run[Any]
) -> None:
    """After a crash the store holds the queue before anyone says so again: retention on the
    reopened store keeps the message."""

    async def body() -> None:
        store = await opened(tmp_path, **SMALL)
        await fill(store, 5, [HELD])  # offsets 0..4, read
        store.holds.hold(HELD, 5)
        await store.append(msg(5, payload=b"pending"), [HELD])
        await fill(store, 100, ["q"], start=6)
        abandon(store)

        reopened = await opened(tmp_path, **SMALL)
        assert reopened.holds.held(HELD) == 5
        assert reopened.holds.next_offset(HELD) == 6
        await reopened.enforce_retention()
        result = await reopened.read(HELD, 5, 1)
        assert (result.lost, result.messages[0].message.payload) == (0, b"pending")
        await reopened.close()

    run(body())


def test_next_offset_counts_messages_not_yet_durable(tmp_path: Path, run: Run[Any]) -> None:
    async def body() -> None:
        store = await opened(tmp_path)
        assert store.holds.next_offset(HELD) == 0
        assert store.holds.held(HELD) is None
        first = submitted(store, msg(0), [HELD])
        second = submitted(store, msg(1), [HELD])
        assert store.holds.next_offset(HELD) == 2
        assert store.end_offset(HELD) == 0  # neither is durable yet
        assert first is not None and second is not None
        await first
        await second
        stored = (await store.read(HELD, 0, 2)).messages
        assert [(s.offset, s.message.key) for s in stored] == [(0, "k0"), (1, "k1")]
        await store.close()

    run(body())


def test_a_failed_write_takes_back_a_hold_it_carried_and_gives_its_offset_again(
    tmp_path: Path, run: Run[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body() -> None:
        store = await opened(tmp_path)
        await store.append(msg(0), [HELD])
        store.holds.hold(HELD, 1)
        await store.append(msg(1), ["q"])  # the hold is durable now

        def disk_full(fd: int, data: bytes | bytearray) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(filelog_commit, "_write_all", disk_full)
        store.holds.hold(HELD, 2)
        failed = submitted(store, msg(2), [HELD])
        assert failed is not None
        with pytest.raises(StoreUnavailable):
            await failed
        assert store.holds.held(HELD) == 1  # taken back with the write: an earlier one
        assert store.holds.next_offset(HELD) == 1
        monkeypatch.setattr(filelog_commit, "_write_all", write_all)
        await store.append(msg(3), [HELD])
        assert [s.message.key for s in (await store.read(HELD, 1, 5)).messages] == ["k3"]
        await store.close()

    run(body())


def test_a_hold_on_a_closed_store_changes_nothing_and_does_not_raise(
    tmp_path: Path, run: Run[Any]
) -> None:
    async def body() -> None:
        store = await opened(tmp_path)
        store.holds.hold(HELD, 3)
        await store.close()
        store.holds.hold(HELD, 7)
        assert store.holds.held(HELD) == 3
        reopened = FileLogStore(tmp_path)
        await reopened.open()
        assert reopened.holds.held(HELD) == 3  # the close's snapshot has it
        await reopened.close()

    run(body())
