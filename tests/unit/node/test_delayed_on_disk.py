"""Delayed publishes on the embedded store (bridge/node/delayed.py) against a real FileLogStore
in a temporary directory: pending payloads wait in the log, not in memory; the queue they wait
on is held from the oldest one not delivered; they are read back when due and routed once."""

from __future__ import annotations

import asyncio
import gc
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from bridge.counters import Metrics
from bridge.node.delayed import DelayedPublishes
from bridge.node.quotas import Quota
from bridge.node.retained import RetainedMessages
from bridge.router.queues import DELAYED_QUEUE
from bridge.state import KIND_DELAYED, DelayedEntry, encode_message
from bridge.storage import FileLogStore, Message, MetaUpdate
from bridge.storage.base import DurableCallback

OUT = "f:#"
"""The queue every routed message goes to here (one subscriber of `#`)."""
KiB = 1024


def index_on(store: FileLogStore) -> DelayedPublishes:
    """The node's delayed publishes on `store`, routing every due message to `OUT`."""

    def route_submit(
        message: Message, meta: Sequence[MetaUpdate], on_durable: DurableCallback
    ) -> None:
        store.submit(message, [OUT], meta=meta, callback=on_durable)

    return DelayedPublishes(
        store=store,
        metrics=Metrics(),
        retained=RetainedMessages(),
        route_submit=route_submit,
        quota=Quota(),
    )


def publish(
    index: DelayedPublishes, key: str, target: str, payload: bytes, seconds: int
) -> asyncio.Future[int | None]:
    """Submit a delayed publish as the node does; the future is done once it is durable."""
    done: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()

    def durable(seq: int | None, error: BaseException | None) -> None:
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(seq)

    message = Message(target, payload, 1, False, "publisher-1", key, int(time.time() * 1000))
    index.submit(message, f"$delayed/{seconds}/{target}", seconds, [], durable)
    return done


async def until(check: Callable[[], bool]) -> None:
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not reached in 5 s")


def on_store(tmp_path: Path, body: Callable[[FileLogStore], Awaitable[Any]], **options: Any) -> Any:
    async def main() -> Any:
        store = FileLogStore(tmp_path, **options)
        await store.open()
        try:
            return await body(store)
        finally:
            await store.close()

    return asyncio.run(main())


def test_pending_delayed_payloads_wait_on_disk_and_the_index_holds_none_of_them(
    tmp_path: Path,
) -> None:
    count, size = 64, 64 * KiB

    async def body(store: FileLogStore) -> None:
        index = index_on(store)
        index.start()
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i in range(count):
                await publish(index, f"key-{i}", "factory/cmd", bytes([i]) * size, 3600)
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert index.pending() == count
        assert index.tally.bytes == count * (size + len("factory/cmd"))
        records = store.meta(KIND_DELAYED)
        assert len(records) == count
        assert max(len(value) for value in records.values()) < 100
        assert store.stats()["bytes_on_disk"] > count * size
        # What stays in memory is the index: far below one payload per publish.
        assert grown < count * size // 16, f"{grown} bytes kept for {count * size} of payloads"
        index.stop()

    on_store(tmp_path, body, cache_bytes=0)


def test_a_due_publish_is_read_back_from_the_log_and_routed_with_its_due_time(
    tmp_path: Path,
) -> None:
    async def body(store: FileLogStore) -> None:
        index = index_on(store)
        index.start()
        before = int(time.time() * 1000)
        await publish(index, "later", "alarm/late", b"in an hour", 3600)
        await publish(index, "now", "alarm/now", b"at once", 0)
        await until(lambda: store.end_offset(OUT) == 1)
        [routed] = (await store.read(OUT, 0, 1)).messages
        message = routed.message
        assert (message.topic, message.payload, message.key) == ("alarm/now", b"at once", "now")
        assert before <= message.timestamp_ms <= int(time.time() * 1000)
        assert set(store.meta(KIND_DELAYED)) == {"later"}
        assert index.tally.bytes == len(b"in an hour") + len("alarm/late")
        # The one due in an hour is at offset 0 and not read: the queue stays held there.
        assert store.holds.held(DELAYED_QUEUE) == 0
        index.stop()

    on_store(tmp_path, body, cache_bytes=0)


def test_the_hold_moves_to_the_queue_end_once_every_pending_publish_is_delivered(
    tmp_path: Path,
) -> None:
    async def body(store: FileLogStore) -> None:
        index = index_on(store)
        index.start()
        for i in range(3):
            await publish(index, f"k{i}", "t", b"x", 0)
        await until(lambda: store.end_offset(OUT) == 3)
        await until(lambda: store.holds.held(DELAYED_QUEUE) == 3)
        assert index.pending() == 0 and index.tally.bytes == 0
        index.stop()

    on_store(tmp_path, body)


def test_after_a_restart_the_index_is_read_back_without_any_payload(tmp_path: Path) -> None:
    async def submit(store: FileLogStore) -> None:
        index = index_on(store)
        index.start()
        await publish(index, "kept", "door/cmd", b"p" * 4096, 3600)
        await publish(index, "due", "door/cmd", b"due at start", 1)
        index.stop()

    async def restart(store: FileLogStore) -> None:
        entry = DelayedEntry.decode(store.meta(KIND_DELAYED)["kept"])
        assert isinstance(entry, DelayedEntry) and entry.offset == 0
        await asyncio.sleep(1.1)  # the second one is overdue now
        index = index_on(store)
        index.start()
        assert index.tally.bytes == 4096 + len("door/cmd") + len(b"due at start") + len("door/cmd")
        await until(lambda: store.end_offset(OUT) == 1)
        [routed] = (await store.read(OUT, 0, 1)).messages
        assert (routed.message.topic, routed.message.payload) == ("door/cmd", b"due at start")
        assert store.holds.held(DELAYED_QUEUE) == 0
        assert set(store.meta(KIND_DELAYED)) == {"kept"}
        index.stop()

    on_store(tmp_path, submit)
    on_store(tmp_path, restart)


def test_an_index_record_of_an_earlier_version_holding_the_message_is_still_delivered(
    tmp_path: Path,
) -> None:
    async def body(store: FileLogStore) -> None:
        old = Message("old/t", b"from before", 2, False, "old-pub", "old-key", 1_000)
        await store.put_meta([MetaUpdate(KIND_DELAYED, "old-key", encode_message(old))])
        index = index_on(store)
        index.start()
        await until(lambda: store.end_offset(OUT) == 1)
        [routed] = (await store.read(OUT, 0, 1)).messages
        assert (routed.message.topic, routed.message.payload) == ("old/t", b"from before")
        assert store.meta(KIND_DELAYED) == {}
        assert index.tally.bytes == 0
        index.stop()

    on_store(tmp_path, body)


def test_publishes_delivered_behind_a_long_pending_one_are_not_remembered(
    tmp_path: Path,
) -> None:
    """The hold stays at the long one's offset; what was delivered after it is forgotten (the
    node's memory follows what is pending, not what passed while it waits)."""

    async def body(store: FileLogStore) -> None:
        index = index_on(store)
        index.start()
        await publish(index, "long", "t", b"x", 3600)
        for i in range(300):
            await publish(index, f"short-{i}", "t", b"x", 0)
        await until(lambda: store.end_offset(OUT) == 300)
        await until(lambda: index.pending() == 1)
        assert store.holds.held(DELAYED_QUEUE) == 0
        assert len(index._oldest) <= 2 + 64 and index._unread == {0}
        index.stop()

    on_store(tmp_path, body)


def test_a_due_publish_missing_from_the_log_is_dropped_with_its_record_and_a_log_line(
    tmp_path: Path, caplog: Any
) -> None:
    async def body(store: FileLogStore) -> None:
        entry = DelayedEntry(1_000, 5, "gone-pub", 10)  # offset 5 of an empty queue
        await store.put_meta([MetaUpdate(KIND_DELAYED, "gone", entry.encode())])
        index = index_on(store)
        index.start()
        assert index.tally.bytes == 10
        await until(lambda: not store.meta(KIND_DELAYED))
        await until(lambda: index.tally.bytes == 0)
        assert store.end_offset(OUT) == 0
        index.stop()

    on_store(tmp_path, body)
    assert "delayed publish gone dropped: not in the log at offset 5" in caplog.text
