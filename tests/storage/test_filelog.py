"""FileLogStore specifics: recovery, segments, retention, snapshots, group commit, failures, and
the QoS 0 records kept for analytics (what the store leaves on disk, zeros written ahead and the
record layout: test_filelog_on_disk.py)."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.storage import FileLogStore, MetaUpdate, StoreUnavailable
from bridge.storage.base import Message
from bridge.storage.filelog import commit as filelog_commit
from bridge.storage.filelog.files import write_all
from bridge.storage.records import (
    HEADER,
    HEADER_SIZE,
    Decoded,
    decode_body,
    encode_message,
    encode_plain_message,
)
from tests.storage.conftest import Run
from tests.storage.test_contract import msg, read_all, submitted


def segments(path: Path) -> list[Path]:
    return sorted((path / "log").glob("*.log"))


async def opened(path: Path, **options: Any) -> FileLogStore:
    store = FileLogStore(path, **options)
    await store.open()
    return store


def abandon(store: FileLogStore) -> None:
    """Drop a store without close(): no final flush or snapshot, as if the process died."""
    store._shutdown_executors()
    for seg in store._log.segments:
        if seg.fd is not None:
            os.close(seg.fd)
            seg.fd = None


async def fill(store: FileLogStore, count: int, queues: list[str], start: int = 0) -> list[int]:
    return [await store.append(msg(i), queues) for i in range(start, start + count)]


# --- recovery --------------------------------------------------------------------------------


def test_torn_tail_garbage_is_truncated(
    tmp_path: Path, run: Run[Any], caplog: pytest.LogCaptureFixture
) -> None:
    async def body() -> None:
        store = await opened(tmp_path)
        await fill(store, 20, ["q"])
        abandon(store)
        [seg] = segments(tmp_path)
        size = seg.stat().st_size
        with seg.open("ab") as f:
            f.write(b"\x00\x00\x01\x00garbage that is not a record")
        store = await opened(tmp_path)
        assert seg.stat().st_size == size
        assert [s.message.key for s in await read_all(store, "q")] == [f"k{i}" for i in range(20)]
        assert await store.append(msg(20), ["q"]) == size
        assert store.end_offset("q") == 21
        await store.close()

    with caplog.at_level(logging.WARNING, logger="bridge.storage"):
        run(body())
    assert any("torn tail" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("damage", ["cut", "crc"])
def test_damaged_last_record_is_dropped(tmp_path: Path, run: Run[Any], damage: str) -> None:
    async def body() -> None:
        store = await opened(tmp_path)
        seqs = await fill(store, 10, ["q"])
        abandon(store)
        [seg] = segments(tmp_path)
        size = seg.stat().st_size
        if damage == "cut":
            os.truncate(seg, seqs[-1] + (size - seqs[-1]) // 2)
        else:
            with seg.open("r+b") as f:
                f.seek(size - 3)  # inside the payload of the last record
                byte = f.read(1)
                f.seek(size - 3)
                f.write(bytes([byte[0] ^ 0x40]))
        store = await opened(tmp_path)
        assert seg.stat().st_size == seqs[-1]
        assert [s.message.key for s in await read_all(store, "q")] == [f"k{i}" for i in range(9)]
        assert store.end_offset("q") == 9
        assert await store.append(msg(42), ["q"]) == seqs[-1]
        assert [s.offset for s in await read_all(store, "q")] == list(range(10))
        await store.close()

    run(body())


def test_log_shorter_than_the_snapshot_never_reuses_offsets(
    tmp_path: Path, run: Run[Any], caplog: pytest.LogCaptureFixture
) -> None:
    async def body() -> None:
        store = await opened(tmp_path)
        seqs = await fill(store, 10, ["q"])
        end = store.stats()["log_position"]
        await store.close()  # the snapshot covers all 10 records
        [seg] = segments(tmp_path)
        os.truncate(seg, seqs[-1])  # lose the last one anyway (e.g. fsync=False and a crash)
        store = await opened(tmp_path)
        assert store.end_offset("q") == 10
        result = await store.read("q", 8, 10)
        assert [s.offset for s in result.messages] == [8]
        assert (await store.read("q", 9, 10)).lost == 1
        assert await store.append(msg(10), ["q"]) == end
        assert [s.offset for s in (await store.read("q", 10, 10)).messages] == [10]
        await store.close()

    with caplog.at_level(logging.WARNING, logger="bridge.storage"):
        run(body())
    assert any("meta snapshot covers" in r.getMessage() for r in caplog.records)


def test_corrupt_earlier_segment_reports_lost_and_keeps_the_rest(
    tmp_path: Path, run: Run[Any], caplog: pytest.LogCaptureFixture
) -> None:
    async def body() -> None:
        store = await opened(tmp_path, segment_bytes=600)
        seqs = await fill(store, 30, ["q"])
        await store.close()
        first = segments(tmp_path)[0]
        assert len(segments(tmp_path)) > 3
        # damage the third record of the first segment
        with first.open("r+b") as f:
            f.seek(seqs[2] + HEADER_SIZE + 5)
            f.write(b"\xff\xff")
        per_segment = sum(1 for s in seqs if s < int(segments(tmp_path)[1].stem))
        store = await opened(tmp_path, segment_bytes=600)
        first_read = await store.read("q", 0, 100)
        assert [s.offset for s in first_read.messages] == [0, 1]
        assert first_read.next_offset == 2
        rest = await store.read("q", 2, 100)
        assert rest.lost == per_segment - 2
        assert rest.messages[0].offset == per_segment
        assert [s.message.key for s in rest.messages] == [f"k{i}" for i in range(per_segment, 30)]
        assert store.end_offset("q") == 30
        await store.close()

    with caplog.at_level(logging.ERROR, logger="bridge.storage"):
        run(body())
    assert any("corrupt segment" in r.getMessage() for r in caplog.records)


def test_segments_roll_and_are_named_by_position(tmp_path: Path, run: Run[Any]) -> None:
    async def body() -> None:
        store = await opened(tmp_path, segment_bytes=1000)
        seqs = await fill(store, 60, ["q"])
        files = segments(tmp_path)
        assert len(files) >= 5
        bases = [int(f.stem) for f in files]
        assert bases[0] == 0
        assert set(bases) <= set(seqs)
        for base, f in zip(bases, files, strict=False):
            assert f.stat().st_size <= 1000
            assert f.name == f"{base:020d}.log"
        assert store.stats()["segments"] == len(files)
        await store.close()
        store = await opened(tmp_path, segment_bytes=1000, cache_bytes=0)
        stored = await read_all(store, "q")
        assert [s.seq for s in stored] == seqs
        assert store.stats()["disk_reads"] > 0
        await store.close()

    run(body())


def test_record_larger_than_a_segment_gets_its_own(tmp_path: Path, run: Run[Any]) -> None:
    async def body() -> None:
        store = await opened(tmp_path, segment_bytes=1000)
        await store.append(msg(0), ["q"])
        await store.append(msg(1, payload=b"b" * 5000), ["q"])
        await store.append(msg(2), ["q"])
        assert len(segments(tmp_path)) == 3
        await store.close()
        store = await opened(tmp_path, segment_bytes=1000, cache_bytes=0)
        assert [len(s.message.payload) for s in await read_all(store, "q")] == [9, 5000, 9]
        await store.close()

    run(body())


# --- retention and snapshots -------------------------------------------------------------------


def test_retention_by_bytes(tmp_path: Path, run: Run[Any]) -> None:
    options = {"segment_bytes": 1000, "retention_bytes": 3000, "cache_bytes": 0}

    async def body() -> None:
        store = await opened(tmp_path, **options)
        await store.append(msg(0), ["early"], meta=[MetaUpdate("session", "c", b"early")])
        await fill(store, 100, ["q"], start=1)
        deleted = await store.enforce_retention()
        assert deleted > 0
        assert store.stats()["bytes_on_disk"] <= 3000 + 1000
        assert len(segments(tmp_path)) == store.stats()["segments"]
        result = await store.read("q", 0, 5)
        assert result.lost > 0
        assert result.messages[0].offset == result.lost
        assert result.next_offset == result.lost + 5
        assert result.messages[0].message.key == f"k{result.lost + 1}"
        assert store.backlog("q", 0) == (100 - result.lost, store.backlog("q", result.lost)[1])
        assert store.end_offset("early") == 1
        assert (await store.read("early", 0, 5)).lost == 1
        lost = result.lost
        await store.close()

        store = await opened(tmp_path, **options)
        again = await store.read("q", 0, 5)
        assert again.lost == lost
        assert store.end_offset("q") == 100
        assert store.end_offset("early") == 1  # from the snapshot: offsets are never reused
        assert store.meta("session") == {"c": b"early"}  # the segment went, the record stays
        await store.append(msg(200), ["early"])
        assert [s.offset for s in (await store.read("early", 0, 5)).messages] == [1]
        await store.close()

    run(body())


def test_retention_by_age_runs_after_commits(tmp_path: Path, run: Run[Any]) -> None:
    async def body() -> None:
        store = await opened(tmp_path, segment_bytes=1000, retention_seconds=0.3)
        store.retention_check_interval = 0.0
        await fill(store, 40, ["q"])
        before = store.stats()["segments"]
        assert before > 2
        await asyncio.sleep(0.35)
        await store.append(msg(40), ["q"])  # a commit triggers the check
        # The pass counts its segments as deleted before the read executor removes their files.
        for _ in range(500):
            if store.stats()["segments_deleted"] and len(segments(tmp_path)) == 1:
                break
            await asyncio.sleep(0.01)
        assert store.stats()["segments"] == 1
        assert len(segments(tmp_path)) == 1
        result = await store.read("q", 0, 100)
        assert result.lost == store.end_offset("q") - len(result.messages)
        assert result.messages[-1].message.key == "k40"
        await store.close()

    run(body())


def test_snapshot_goes_through_tmp_and_rename(
    tmp_path: Path, run: Run[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    renames: list[tuple[str, str]] = []
    real_replace = os.replace

    def spy(src: Any, dst: Any) -> None:
        renames.append((os.fspath(src), os.fspath(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)

    async def body() -> None:
        store = await opened(tmp_path, snapshot_every_bytes=2000)
        for i in range(40):
            await store.put_meta([MetaUpdate("session", f"c{i}", b"x" * 50)])
        await asyncio.sleep(0.05)
        assert store.stats()["snapshots"] >= 1
        await store.close()

    run(body())
    snap = str(tmp_path / "meta.snapshot")
    assert renames and all(pair == (snap + ".tmp", snap) for pair in renames)
    assert not (tmp_path / "meta.snapshot.tmp").exists()


def test_corrupt_snapshot_is_ignored(
    tmp_path: Path, run: Run[Any], caplog: pytest.LogCaptureFixture
) -> None:
    async def body() -> None:
        store = await opened(tmp_path)
        await store.put_meta([MetaUpdate("a", "1", b"one"), MetaUpdate("a", "2", b"two")])
        await store.append(msg(0), ["q"], meta=[MetaUpdate("a", "1", None)])
        await store.close()
        snap = tmp_path / "meta.snapshot"
        data = bytearray(snap.read_bytes())
        data[len(data) // 2] ^= 0xFF
        snap.write_bytes(bytes(data))
        (tmp_path / "meta.snapshot.tmp").write_bytes(b"half-written")
        store = await opened(tmp_path)
        assert store.meta("a") == {"2": b"two"}
        assert store.end_offset("q") == 1
        assert not (tmp_path / "meta.snapshot.tmp").exists()
        await store.close()

    with caplog.at_level(logging.ERROR, logger="bridge.storage"):
        run(body())
    assert any("corrupt meta snapshot" in r.getMessage() for r in caplog.records)


def test_meta_after_the_snapshot_is_replayed(tmp_path: Path, run: Run[Any]) -> None:
    async def body() -> None:
        store = await opened(tmp_path)
        await store.put_meta([MetaUpdate("a", "1", b"old")])
        await store.close()  # snapshot here
        store = await opened(tmp_path)
        await store.append(msg(0), ["q"], meta=[MetaUpdate("a", "1", b"new")])
        await store.put_meta([MetaUpdate("a", "2", b"two")])
        abandon(store)  # the next open replays the records after the snapshot
        store = await opened(tmp_path)
        assert store.meta("a") == {"1": b"new", "2": b"two"}
        await store.close()

    run(body())


# --- group commit and failures -----------------------------------------------------------------


def test_group_commit_batches_concurrent_appends(tmp_path: Path, run: Run[Any]) -> None:
    async def body() -> None:
        store = await opened(tmp_path)

        async def writer(w: int) -> None:
            for i in range(5):
                await store.append(msg(w * 10 + i), ["q"])

        await asyncio.gather(*(writer(w) for w in range(100)))
        stats = store.stats()
        assert stats["appends"] == 500
        assert stats["commits"] <= 25
        assert stats["fsyncs"] == stats["commits"]
        assert store.end_offset("q") == 500
        await store.close()

    run(body())


def test_a_commits_callbacks_share_one_pass_with_every_message_of_it_visible(
    tmp_path: Path, run: Run[Any]
) -> None:
    async def body() -> None:
        store = await opened(tmp_path)
        seen: list[tuple[int, tuple[int, int]]] = []

        def callback(_seq: int | None, error: BaseException | None) -> None:
            assert error is None
            seen.append((store.commit_pass, store.backlog("q", 0)))

        for i in range(3):  # one loop turn: one commit
            store.submit(msg(i), ["q"], callback=callback)
        await store.append(msg(3), ["q"])
        store.submit(msg(4), ["q"], callback=callback)
        await store.append(msg(5), ["q"])
        first, second = seen[0][0], seen[3][0]
        assert [p for p, _ in seen] == [first] * 3 + [second] and second > first
        assert [count for _, (count, _) in seen] == [4, 4, 4, 6], "a pass sees its whole commit"
        await store.close()

    run(body())


def test_write_failure_surfaces_and_rolls_back(
    tmp_path: Path, run: Run[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_full(fd: int, data: bytes | bytearray) -> None:
        write_all(fd, bytes(data)[: len(data) // 2])  # a partial write, then the error
        raise OSError(errno.ENOSPC, "No space left on device")

    async def body() -> None:
        store = await opened(tmp_path)
        await fill(store, 3, ["q"])
        await store.put_meta([MetaUpdate("m", "a", b"1")])
        good_size = segments(tmp_path)[0].stat().st_size
        monkeypatch.setattr(filelog_commit, "_write_all", disk_full)
        results = await asyncio.gather(
            store.append(msg(3), ["q", "new"], meta=[MetaUpdate("m", "a", b"2")]),
            store.put_meta([MetaUpdate("m", "b", b"3")]),
            return_exceptions=True,
        )
        assert all(isinstance(r, StoreUnavailable) for r in results)
        assert store.meta("m") == {"a": b"1"}
        assert store.end_offset("q") == 3
        assert store.end_offset("new") == 0
        assert store.stats()["write_errors"] == 1
        assert segments(tmp_path)[0].stat().st_size == good_size
        monkeypatch.undo()
        seq = await store.append(msg(4), ["q"])
        assert seq == good_size
        assert [s.message.key for s in await read_all(store, "q")] == ["k0", "k1", "k2", "k4"]
        await store.close()
        store = await opened(tmp_path)
        assert [s.offset for s in await read_all(store, "q")] == [0, 1, 2, 3]
        assert store.meta("m") == {"a": b"1"}
        await store.close()

    run(body())


def test_closed_store_refuses_work(tmp_path: Path, run: Run[Any]) -> None:
    async def body() -> None:
        store = await opened(tmp_path)
        await store.append(msg(0), ["q"], durable=False)
        await store.close()
        with pytest.raises(StoreUnavailable):
            await store.append(msg(1), ["q"])
        with pytest.raises(StoreUnavailable):
            await submitted(store, msg(1), ["q"])
        with pytest.raises(StoreUnavailable):
            await store.put_meta([MetaUpdate("a", "b", None)])
        store = await opened(tmp_path)
        assert store.end_offset("q") == 1
        await store.close()

    run(body())


def test_reads_while_retention_deletes(tmp_path: Path, run: Run[Any]) -> None:
    async def body() -> None:
        store = await opened(tmp_path, segment_bytes=2000, retention_bytes=6000, cache_bytes=0)
        offset = 0
        seen: list[int] = []
        for i in range(300):
            await store.append(msg(i), ["q"], durable=i % 10 == 9)
            if i % 7 == 0:
                result = await store.read("q", offset, 4)
                offset = result.next_offset
                seen.extend(s.offset for s in result.messages)
                await store.enforce_retention()
        assert seen == sorted(set(seen))
        assert store.stats()["segments_deleted"] > 0
        await store.close()

    run(body())


def test_appends_that_nobody_waits_for_share_commits_and_never_sync(
    tmp_path: Path, run: Run[Any]
) -> None:
    """Catches a per-append commit (a write and a thread hand-off each) or fsync, by counting
    them rather than timing them."""

    async def body() -> None:
        store = await opened(tmp_path, fsync=False)
        for i in range(5000):
            await store.append(msg(i), ["q"], durable=False)
        await store.close()
        assert store.stats()["commits"] < 500
        assert store.stats()["fsyncs"] == 0

    run(body())


# --- QoS 0 records kept for analytics -----------------------------------------------------------

_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=150, deadline=None)
@given(
    topic=_text.filter(bool),
    payload=st.binary(max_size=300),
    qos=st.integers(0, 2),
    retain=st.booleans(),
    publisher=_text,
    key=_text,
    node=_text,
    timestamp=st.integers(0, 2**62),
)
def test_plain_record_encoder_gives_the_same_bytes_as_the_general_one(
    topic, payload, qos, retain, publisher, key, node, timestamp
):
    message = Message(topic, payload, qos, retain, publisher, key, timestamp, node)
    header, body = encode_message(message, topic.encode(), [], ())
    assert encode_plain_message(message, topic.encode()) == header + body


def _log_records(data_dir: Path) -> list[Decoded]:
    out = []
    for segment in sorted((data_dir / "log").glob("*.log")):
        data = segment.read_bytes()
        pos = 0
        while pos + HEADER_SIZE <= len(data):
            length, _crc = HEADER.unpack_from(data, pos)
            out.append(decode_body(data[pos + HEADER_SIZE : pos + HEADER_SIZE + length]))
            pos += HEADER_SIZE + length
    return out


def test_unqueued_messages_reach_the_log_without_a_queue_entry(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = FileLogStore(tmp_path)
        await store.open()
        for i in range(50):
            store.append_unqueued(Message(f"telemetry/{i}", b"p%d" % i, 0, key=f"k{i}"))
        await store.close()

    asyncio.run(scenario())
    records = [r for r in _log_records(tmp_path) if r.message is not None]
    assert [r.message.topic for r in records] == [f"telemetry/{i}" for i in range(50)]
    assert records[7].message.payload == b"p7"
    assert all(not r.queues for r in records)


def test_a_read_from_memory_returns_what_read_does_and_none_when_the_disk_is_needed(
    tmp_path: Path, run: Run[Any]
) -> None:
    async def body() -> None:
        store = await opened(tmp_path)
        await fill(store, 10, ["q"])
        cached = store.read_cached("q", 3, 4)
        assert cached is not None
        read = await store.read("q", 3, 4)
        assert [(s.offset, s.seq, s.message.key) for s in cached.messages] == [
            (s.offset, s.seq, s.message.key) for s in read.messages
        ]
        assert cached.next_offset == read.next_offset == 7
        assert store.read_cached("q", 10, 4).messages == []  # caught up: nothing, no disk
        store._cache.drop_from(0)  # as if later records had pushed these out of the cache
        assert store.read_cached("q", 0, 4) is None
        assert [s.message.key for s in (await store.read("q", 0, 4)).messages] == [
            "k0",
            "k1",
            "k2",
            "k3",
        ]
        await store.close()

    run(body())
