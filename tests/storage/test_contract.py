"""The MessageStore contract (bridge/storage/base.py): every backend must pass all of it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bridge.storage import Message, MessageStore, MetaUpdate, Stored, metadata
from bridge.storage.base import HoldingStore, TimerStore, future_callback
from tests.storage.conftest import Run, StoreFactory


def msg(i: int = 0, topic: str = "t/a", payload: bytes | None = None, **fields: Any) -> Message:
    return Message(
        topic=topic,
        payload=f"payload-{i}".encode() if payload is None else payload,
        key=f"k{i}",
        **fields,
    )


def submitted(
    store: MessageStore, message: Message, queues: list[str], meta: list[MetaUpdate] | None = None
) -> asyncio.Future[int]:
    """`store.submit`, awaitable: a future resolved by its durability callback (the `seq`) or
    failed with its error."""
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    store.submit(message, queues, meta=meta or (), callback=future_callback(future))
    return future


def check_backlog(store: MessageStore, queue: str, offset: int, count: int, size: int) -> None:
    """Backlog counts are exact everywhere; bytes too where the backend keeps sizes, else they
    are an estimate (average message size) that is zero exactly when the count is."""
    got_count, got_size = store.backlog(queue, offset)
    assert got_count == count
    if store.traits.exact_backlog_bytes:
        assert got_size == size
    else:
        assert (got_size == 0) == (count == 0 or size == 0)


async def read_all(store: MessageStore, queue: str, offset: int = 0) -> list[Stored]:
    out: list[Stored] = []
    while True:
        result = await store.read(queue, offset, 100)
        if not result.messages:
            return out
        out.extend(result.messages)
        offset = result.next_offset


def test_append_and_read_back_every_field(store: MessageStore, run: Run[Any]) -> None:
    message = Message(
        topic="sensors/t1/temp",
        payload=b"\x00\x01binary\xff",
        qos=2,
        retain=True,
        publisher="client-7",
        key="node1-42",
        timestamp_ms=1_700_000_000_123,
        node="node1",
        properties={"content-type": "text/plain", "x": ""},
    )
    seq = run(store.append(message, ["q"]))
    result = run(store.read("q", 0, 10))
    assert result.lost == 0
    assert result.next_offset == 1
    [stored] = result.messages
    assert stored.offset == 0
    assert stored.seq == seq
    assert stored.queues == ("q",)
    assert stored.size == len(message.payload) + len(message.topic.encode())
    assert stored.message == message


def test_offsets_are_dense_per_queue(store: MessageStore, run: Run[Any]) -> None:
    async def body() -> None:
        seqs = []
        for i in range(10):
            queues = ["a"] if i % 2 else ["a", "b"]
            seqs.append(await store.append(msg(i), queues))
        assert seqs == sorted(set(seqs))
        assert store.end_offset("a") == 10
        assert store.end_offset("b") == 5
        a = await read_all(store, "a")
        b = await read_all(store, "b")
        assert [s.offset for s in a] == list(range(10))
        assert [s.offset for s in b] == list(range(5))
        assert [s.message.key for s in b] == [f"k{i}" for i in range(0, 10, 2)]
        assert [s.seq for s in a] == seqs

    run(body())


def test_message_in_several_queues_has_one_seq(store: MessageStore, run: Run[Any]) -> None:
    async def body() -> None:
        await store.append(msg(0), ["x"])
        seq = await store.append(msg(1), ["x", "y", "z"])
        results = [await store.read(q, 0, 10) for q in ("x", "y", "z")]
        found = [r.messages[-1] for r in results]
        assert {s.seq for s in found} == {seq}
        assert [s.offset for s in found] == [1, 0, 0]
        assert all(s.queues == ("x", "y", "z") for s in found)
        assert all(s.message.key == "k1" for s in found)

    run(body())


def test_read_from_the_middle_and_limit(store: MessageStore, run: Run[Any]) -> None:
    async def body() -> None:
        for i in range(20):
            await store.append(msg(i), ["q"], durable=i == 19)
        result = await store.read("q", 7, 5)
        assert [s.offset for s in result.messages] == [7, 8, 9, 10, 11]
        assert [s.message.key for s in result.messages] == [f"k{i}" for i in range(7, 12)]
        assert result.next_offset == 12
        tail = await store.read("q", 18, 100)
        assert [s.offset for s in tail.messages] == [18, 19]
        assert tail.next_offset == 20
        none = await store.read("q", 3, 0)
        assert none.messages == [] and none.next_offset == 3

    run(body())


def test_reading_beyond_the_end(store: MessageStore, run: Run[Any]) -> None:
    async def body() -> None:
        await store.append(msg(0), ["q"])
        for queue, offset in (("q", 1), ("q", 50), ("unknown", 0), ("unknown", 9)):
            result = await store.read(queue, offset, 10)
            assert result.messages == []
            assert result.next_offset == offset
            assert result.lost == 0

    run(body())


def test_end_offset_and_backlog(store: MessageStore, run: Run[Any]) -> None:
    async def body() -> None:
        assert store.end_offset("nobody") == 0
        assert store.backlog("nobody", 0) == (0, 0)
        sizes = []
        for i in range(6):
            m = msg(i, topic="t/é", payload=b"x" * i)
            sizes.append(len(m.payload) + len(m.topic.encode()))
            await store.append(m, ["q"])
        assert store.end_offset("q") == 6
        assert await store.track_queue("q") == 6
        check_backlog(store, "q", 0, 6, sum(sizes))
        check_backlog(store, "q", 4, 2, sum(sizes[4:]))
        check_backlog(store, "q", 6, 0, 0)
        check_backlog(store, "q", 60, 0, 0)

    run(body())


def test_meta_set_delete_and_kinds(store: MessageStore, run: Run[Any]) -> None:
    async def body() -> None:
        assert store.meta("session") == {}
        await store.put_meta([MetaUpdate("session", "c1", b"one"), MetaUpdate("retain", "t", b"")])
        await store.put_meta([MetaUpdate("session", "c2", b"two")])
        await store.put_meta([MetaUpdate("session", "c1", None), MetaUpdate("session", "c2", b"2")])
        await store.put_meta([MetaUpdate("session", "missing", None)])
        assert store.meta("session") == {"c2": b"2"}
        assert store.meta("retain") == {"t": b""}

    run(body())


def test_meta_with_message_is_applied_with_it(store: MessageStore, run: Run[Any]) -> None:
    async def body() -> None:
        await store.append(
            msg(0, retain=True),
            ["q"],
            meta=[MetaUpdate("retain", "t/a", b"k0"), MetaUpdate("qos2", "c\x001", b"")],
        )
        assert store.meta("retain") == {"t/a": b"k0"}
        assert store.meta("qos2") == {"c\x001": b""}
        await store.append(msg(1), [], meta=[MetaUpdate("retain", "t/a", None)])
        assert store.meta("retain") == {}

    run(body())


def test_submit_orders_and_resolves_when_durable(store: MessageStore, run: Run[Any]) -> None:
    async def body() -> None:
        futures = [submitted(store, msg(i), ["q"]) for i in range(5)]
        futures.append(submitted(store, msg(5), ["q"], meta=[MetaUpdate("m", "k", b"v")]))
        assert store.meta("m") == {"k": b"v"}  # meta applies in memory at once
        seqs = await asyncio.gather(*futures)
        assert seqs == sorted(seqs)
        assert store.end_offset("q") == 6
        stored = await read_all(store, "q")
        assert [s.seq for s in stored] == seqs
        assert [s.message.key for s in stored] == [f"k{i}" for i in range(6)]

    run(body())


def test_non_durable_appends_become_durable(
    store_factory: StoreFactory, store: MessageStore, run: Run[Any]
) -> None:
    async def body() -> None:
        for i in range(30):
            await store.append(msg(i), ["q"], durable=False)
        await store.put_meta([MetaUpdate("m", "x", b"1")], durable=False)
        reopened = await store_factory.reopen()
        assert [s.message.key for s in await read_all(reopened, "q")] == [
            f"k{i}" for i in range(30)
        ]
        assert reopened.meta("m") == {"x": b"1"}

    run(body())


def test_everything_survives_reopen(
    store_factory: StoreFactory, store: MessageStore, run: Run[Any]
) -> None:
    async def body() -> None:
        expected: dict[str, list[tuple[int, int, str]]] = {}
        for i in range(40):
            queues = [f"q{j}" for j in range(4) if i % (j + 1) == 0]
            seq = await store.append(
                msg(i, properties={"i": str(i)}),
                queues,
                meta=[MetaUpdate("session", f"c{i % 7}", str(i).encode())],
            )
            for q in queues:
                expected.setdefault(q, []).append((len(expected.get(q, [])), seq, f"k{i}"))
        await store.put_meta([MetaUpdate("session", "c0", None)])
        meta_before = dict(store.meta("session"))
        ends_before = {q: store.end_offset(q) for q in expected}
        backlog_before = {q: store.backlog(q, 1) for q in expected}
        assert ends_before == {q: len(entries) for q, entries in expected.items()}

        reopened = await store_factory.reopen()
        assert dict(reopened.meta("session")) == meta_before
        assert "c0" not in meta_before
        assert {q: reopened.end_offset(q) for q in expected} == ends_before
        for q, (count, size) in backlog_before.items():
            check_backlog(reopened, q, 1, count, size)
        for q, entries in expected.items():
            stored = await read_all(reopened, q)
            assert [(s.offset, s.seq, s.message.key) for s in stored] == entries
            assert all(s.message.properties["i"] == s.message.key[1:] for s in stored)
        # appending after the restart continues the sequences
        seq = await reopened.append(msg(99), ["q0", "new"])
        assert seq > max(e[1] for entries in expected.values() for e in entries)
        assert reopened.end_offset("q0") == ends_before["q0"] + 1
        assert reopened.end_offset("new") == 1

    run(body())


def test_unicode_empty_and_large_payloads(
    store_factory: StoreFactory, store: MessageStore, run: Run[Any]
) -> None:
    big = bytes(range(256)) * 4096  # 1 MiB
    messages = [
        msg(0, topic="温度/室内/🌡", payload=b"", publisher="клиент", properties={"ключ": "値"}),
        msg(1, topic="big", payload=big),
        msg(2, topic="", payload=b"z"),
    ]

    async def body() -> None:
        for m in messages:
            await store.append(m, ["ü-queue"])
        current = store
        for _ in range(2):
            stored = await read_all(current, "ü-queue")
            assert [s.message for s in stored] == messages
            assert stored[1].size == len(big) + 3
            check_backlog(
                current,
                "ü-queue",
                0,
                3,
                sum(len(m.payload) + len(m.topic.encode()) for m in messages),
            )
            current = await store_factory.reopen()

    run(body())


def test_mqtt5_metadata_comes_back_whole_and_in_order(store: MessageStore, run: Run[Any]) -> None:
    """Every queue a message is read from gives its `properties` back as stored: the 5.0
    metadata keys (NUL-prefixed), and User Properties in the publisher's order with repeats
    (bridge/storage/metadata.py). RocketMQ's broker reorders properties: the mapping undoes it."""
    users = [(f"u{n}", f"v{n}") for n in range(12, 0, -1)] + [("u5", "again"), ("", "e")]
    meta = metadata.from_publish(
        {
            0x01: 1,
            0x02: 86400,
            0x03: "application/json; charset=utf-8",
            0x08: "replies/dev-7/50%",
            0x09: bytes(range(40)),
            0x26: users,
        }
    )
    message = msg(0, topic="v5/telemetry", publisher="dev-7", timestamp_ms=1_700_000_000_000)
    message.properties = meta

    async def body() -> None:
        await store.append(message, ["f:v5/#", "c:dev-8"])
        for queue in ("f:v5/#", "c:dev-8"):
            [stored] = await read_all(store, queue)
            assert stored.message == message
            assert metadata.user_properties(stored.message.properties) == users

    run(body())


def test_concurrent_appends_keep_offsets_dense(store: MessageStore, run: Run[Any]) -> None:
    async def writer(w: int) -> list[int]:
        return [await store.append(msg(w * 100 + i), ["shared", f"own{w}"]) for i in range(20)]

    async def body() -> None:
        results = await asyncio.gather(*(writer(w) for w in range(10)))
        stored = await read_all(store, "shared")
        assert [s.offset for s in stored] == list(range(200))
        assert [s.seq for s in stored] == sorted(seq for seqs in results for seq in seqs)
        for w, seqs in enumerate(results):
            own = await read_all(store, f"own{w}")
            assert [s.seq for s in own] == seqs

    run(body())


def test_queue_end_is_the_truth_and_note_end_only_raises(
    store: MessageStore, run: Run[Any]
) -> None:
    async def body() -> None:
        assert await store.track_queue("fresh") == 0
        for i in range(3):
            await store.append(msg(i), ["fresh"])
        assert await store.track_queue("fresh") == 3
        store.note_end("fresh", 1)  # stale news never lowers what the store knows
        assert store.end_offset("fresh") == 3

    run(body())


def test_submit_callbacks_come_in_submission_order(store: MessageStore, run: Run[Any]) -> None:
    async def body() -> None:
        calls: list[tuple[int, int | None, BaseException | None]] = []
        done = asyncio.Event()
        for i in range(50):

            def callback(seq: int | None, err: BaseException | None, i: int = i) -> None:
                calls.append((i, seq, err))
                if len(calls) == 50:
                    done.set()

            assert store.submit(msg(i), ["ordered"], callback=callback) is False  # not early
        await asyncio.wait_for(done.wait(), 30)
        assert [c[0] for c in calls] == list(range(50))
        assert all(err is None for _, _, err in calls)
        seqs = [seq for _, seq, _ in calls]
        assert seqs == sorted(seqs)
        stored = await read_all(store, "ordered")
        assert [s.message.key for s in stored] == [f"k{i}" for i in range(50)]

    run(body())


def test_meta_passed_with_a_message_is_durable_when_it_is(
    store_factory: StoreFactory, store: MessageStore, run: Run[Any]
) -> None:
    async def body() -> None:
        await store.append(msg(0), ["q"], meta=[MetaUpdate("q2in", "c\x007", b"{}")])
        reopened = await store_factory.reopen()
        assert reopened.meta("q2in") == {"c\x007": b"{}"}

    run(body())


def test_every_backend_keeps_delayed_messages_by_timer_or_by_hold(store: MessageStore) -> None:
    """`bridge.node.delayed` needs one of the two: a backend whose timer holds a delayed
    message until due, or queues the node can hold back from retention while they wait."""
    backend = store.store  # type: ignore[attr-defined]  # the OnePartView's store
    assert isinstance(backend, (TimerStore, HoldingStore))


def test_a_hold_names_the_next_offset_and_outlives_a_reopen(
    store_factory: StoreFactory, store: MessageStore, run: Run[Any]
) -> None:
    backend = store.store  # type: ignore[attr-defined]
    if not isinstance(backend, HoldingStore):
        pytest.skip("this backend holds delayed messages in its timer (TimerStore)")

    async def body() -> None:
        holds = backend.holds
        assert holds.held("d") is None
        holds.hold("d", holds.next_offset("d"))
        for i in range(3):
            offset = holds.next_offset("d")
            await store.append(msg(i), ["d"])
            assert (await store.read("d", offset, 1)).messages[0].message.key == f"k{i}"
        holds.hold("d", 1)
        assert holds.held("d") == 1
        reopened = await store_factory.reopen()
        again = reopened.store.holds  # type: ignore[attr-defined]
        assert (again.held("d"), again.next_offset("d")) == (1, 3)

    run(body())


def test_a_message_submitted_early_is_readable_at_once_exactly_where_the_traits_say(
    store: MessageStore, run: Run[Any]
) -> None:
    async def body() -> None:
        seen: list[BaseException | None] = []
        readable = store.submit(
            msg(0), ["early"], callback=lambda _seq, err: seen.append(err), early=True
        )
        assert readable is store.traits.early_reads
        if readable:  # readable before its callback: the end moved and a read finds it
            assert seen == [] and store.end_offset("early") == 1
        await store.append(msg(1), ["early"])  # a barrier: everything before it is durable
        assert seen == [None]
        assert [s.message.key for s in await read_all(store, "early")] == ["k0", "k1"]

    run(body())


def test_a_cached_read_answers_what_a_read_does_or_none_and_never_where_traits_say_so(
    store: MessageStore, run: Run[Any]
) -> None:
    """The embedded store answers from its record cache what it just wrote; RocketMQ's from
    the batch it last pulled of the queue (so only once a read pulled it); either may answer
    None (not in memory), and what it answers is what a read returns."""

    async def body() -> None:
        for i in range(3):
            await store.append(msg(i), ["cached"])
        cached = store.read_cached("cached", 0, 10)
        if not store.traits.cached_reads:
            assert cached is None
            return
        read = await store.read("cached", 0, 10)
        if cached is None:
            cached = store.read_cached("cached", 0, 10)
        assert cached is not None and [s.message.key for s in cached.messages] == ["k0", "k1", "k2"]
        assert cached == read
        assert store.read_cached("cached", 1, 1) == await store.read("cached", 1, 1)
        after = store.read_cached("cached", 3, 10)
        assert after is None or after == await store.read("cached", 3, 10)

    run(body())
