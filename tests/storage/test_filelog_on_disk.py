"""What the embedded store leaves on disk: zeros written ahead of its records
(`preallocate_bytes`) and what a crash, a close or a failed write makes of them, what the Spark
source reads of a live segment, and the byte layout of a message record (the store's behaviour
over those files: test_filelog.py)."""

from __future__ import annotations

import errno
import logging
import os
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.storage import MetaUpdate, StoreUnavailable
from bridge.storage.base import Message
from bridge.storage.filelog import commit as filelog_commit
from bridge.storage.records import (
    HEADER_SIZE,
    encode_message,
)
from tests.storage.conftest import Run
from tests.storage.test_contract import msg, read_all
from tests.storage.test_filelog import _text, abandon, fill, opened, segments

# --- zeros written ahead of the records (preallocate_bytes) ---------------------------------

AHEAD = 4096


def test_a_commit_into_zeros_written_ahead_leaves_the_file_length_alone(
    tmp_path: Path, run: Run[Any]
) -> None:
    async def body() -> None:
        store = await opened(tmp_path, preallocate_bytes=AHEAD)
        await fill(store, 1, ["q"])
        [seg] = segments(tmp_path)
        first_end = store.stats()["log_position"]
        assert seg.stat().st_size == first_end + AHEAD
        await fill(store, 5, ["q"], start=1)
        assert store.stats()["log_position"] < first_end + AHEAD  # still inside the zeros
        assert seg.stat().st_size == first_end + AHEAD
        data = seg.read_bytes()
        assert data[store.stats()["log_position"] :] == bytes(
            len(data) - int(store.stats()["log_position"])
        )
        await store.close()

    run(body())


def test_zeros_written_ahead_are_the_clean_end_after_a_crash(
    tmp_path: Path, run: Run[Any], caplog: pytest.LogCaptureFixture
) -> None:
    async def body() -> None:
        store = await opened(tmp_path, preallocate_bytes=AHEAD)
        await fill(store, 20, ["q"])
        end = store.stats()["log_position"]
        abandon(store)
        [seg] = segments(tmp_path)
        assert seg.stat().st_size > end
        store = await opened(tmp_path, preallocate_bytes=AHEAD)
        assert seg.stat().st_size == end  # the zeros are cut off at open
        assert [s.message.key for s in await read_all(store, "q")] == [f"k{i}" for i in range(20)]
        assert await store.append(msg(20), ["q"]) == end
        abandon(store)
        store = await opened(tmp_path, preallocate_bytes=AHEAD)
        assert [s.message.key for s in await read_all(store, "q")] == [f"k{i}" for i in range(21)]
        await store.close()

    with caplog.at_level(logging.WARNING, logger="bridge.storage"):
        run(body())
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_bytes_a_crash_left_in_the_zeros_never_come_back_after_later_records(
    tmp_path: Path, run: Run[Any]
) -> None:
    """A batch torn by a crash may leave whole records beyond a header the disk never wrote.
    They were never acknowledged; opening cuts them off with the zeros, so records appended
    later can never be followed by them."""

    async def body() -> None:
        store = await opened(tmp_path, preallocate_bytes=AHEAD)
        await fill(store, 3, ["q"])
        end = int(store.stats()["log_position"])
        abandon(store)
        [seg] = segments(tmp_path)
        stale = seg.read_bytes()[:end]  # three whole records, as a torn batch might leave them
        with seg.open("r+b") as f:
            f.seek(end + HEADER_SIZE)
            f.write(stale)
        store = await opened(tmp_path, preallocate_bytes=AHEAD)
        await fill(store, 1, ["q"], start=3)  # shorter than the gap before the stale bytes
        abandon(store)
        store = await opened(tmp_path, preallocate_bytes=AHEAD)
        assert [s.message.key for s in await read_all(store, "q")] == ["k0", "k1", "k2", "k3"]
        await store.close()

    run(body())


def test_a_closed_segment_is_cut_back_to_its_records(tmp_path: Path, run: Run[Any]) -> None:
    async def body() -> None:
        store = await opened(tmp_path, segment_bytes=1000, preallocate_bytes=AHEAD)
        await fill(store, 60, ["q"])
        files = segments(tmp_path)
        assert len(files) >= 5
        bases = [int(f.stem) for f in files]
        for f, base, next_base in zip(files, bases, bases[1:], strict=False):
            assert f.stat().st_size == next_base - base
        assert files[-1].stat().st_size <= 1000  # zeros ahead stop at segment_bytes
        abandon(store)
        store = await opened(tmp_path, segment_bytes=1000, preallocate_bytes=AHEAD)
        assert [s.message.key for s in await read_all(store, "q")] == [f"k{i}" for i in range(60)]
        await store.close()

    run(body())


def test_a_failed_write_into_zeros_written_ahead_rolls_back_to_the_records(
    tmp_path: Path, run: Run[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_full(fd: int, data: bytes | bytearray) -> None:
        os.write(fd, bytes(data)[:7])  # part of it lands, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    async def body() -> None:
        store = await opened(tmp_path, preallocate_bytes=AHEAD)
        await fill(store, 3, ["q"])
        end = store.stats()["log_position"]
        monkeypatch.setattr(filelog_commit, "_write_all", disk_full)
        with pytest.raises(StoreUnavailable):
            await store.append(msg(3), ["q"])
        monkeypatch.undo()
        [seg] = segments(tmp_path)
        assert seg.stat().st_size == end
        assert await store.append(msg(4), ["q"]) == end
        abandon(store)
        store = await opened(tmp_path, preallocate_bytes=AHEAD)
        assert [s.message.key for s in await read_all(store, "q")] == ["k0", "k1", "k2", "k4"]
        await store.close()

    run(body())


def test_the_spark_source_reads_a_live_segment_up_to_its_records(
    tmp_path: Path, run: Run[Any]
) -> None:
    from spark.log_reader import scan_end

    async def body() -> int:
        store = await opened(tmp_path, preallocate_bytes=AHEAD)
        await fill(store, 7, ["q"])
        end = int(store.stats()["log_position"])
        abandon(store)  # as a running node leaves it: zeros after the records
        return end

    end = run(body())
    assert segments(tmp_path)[0].stat().st_size > end
    assert scan_end(str(tmp_path), 0) == end


def _reference_message_record(
    message: Message, queues: list[tuple[str, int]], meta: list[MetaUpdate]
) -> bytes:
    """A MESSAGE record laid out field by field with `struct`, as docs/storage-format.md says."""

    def text(value: str | bytes) -> bytes:
        data = value.encode() if isinstance(value, str) else value
        return struct.pack(">I", len(data)) + data

    body = struct.pack(">BBqBB", 1, 1, message.timestamp_ms, message.qos, int(message.retain))
    body += text(message.topic) + text(message.publisher) + text(message.key) + text(message.node)
    body += struct.pack(">I", len(message.properties))
    for name, value in message.properties.items():
        body += text(name) + text(value)
    body += struct.pack(">I", len(queues))
    for name, offset in queues:
        body += text(name) + struct.pack(">Q", offset)
    body += struct.pack(">I", len(meta))
    for update in meta:
        body += text(update.kind) + text(update.key)
        body += b"\x00" if update.value is None else b"\x01" + text(update.value)
    body += text(message.payload)
    return struct.pack(">II", len(body), zlib.crc32(body)) + body


@settings(max_examples=200, deadline=None)
@given(
    topic=_text.filter(bool),
    payload=st.binary(max_size=1500),
    qos=st.integers(0, 2),
    retain=st.booleans(),
    publisher=_text,
    key=_text,
    node=st.sampled_from(["n1", "node-ä"]),
    timestamp=st.integers(0, 2**62),
    properties=st.dictionaries(_text, _text, max_size=2),
    queues=st.lists(st.tuples(_text, st.integers(0, 2**63 - 1)), max_size=3),
    meta=st.lists(
        st.builds(MetaUpdate, _text, _text, st.none() | st.binary(max_size=20)), max_size=2
    ),
)
def test_message_records_are_laid_out_as_the_format_says_with_repeating_strings_remembered(
    topic, payload, qos, retain, publisher, key, node, timestamp, properties, queues, meta
):
    message = Message(topic, payload, qos, retain, publisher, key, timestamp, node)
    message.properties = properties
    expected = _reference_message_record(message, queues, meta)
    for _ in range(2):  # the second time from the remembered encodings
        header, body = encode_message(message, topic.encode(), queues, meta)
        assert header + body == expected
