"""A session's positions in the parts of its queues (bridge/node/positions.py)."""

from __future__ import annotations

import asyncio

from bridge.node.positions import start_new_parts, start_reading, stop_reading
from bridge.session import Session
from bridge.storage.rocketmq.groups import part_name, split_part


class PartedStore:
    """The part naming of the RocketMQ store over given groups and part ends (no broker)."""

    def __init__(self, groups: list[str], ends: dict[str, int] | None = None) -> None:
        self.groups = groups
        self.ends = ends or {}

    def parts(self, queue: str) -> tuple[str, ...]:
        return tuple(part_name(g, queue) for g in sorted(self.groups))

    def queue_of_part(self, part: str) -> str | None:
        split = split_part(part)
        return split[1] if split else None

    def upgrade_part(self, queue: str) -> str:
        return queue if split_part(queue) else part_name(sorted(self.groups)[0], queue)

    async def track_queue(self, part: str) -> int:
        return self.ends.get(part, 0)


def test_reading_a_queue_starts_every_part_at_its_own_end() -> None:
    a, b = part_name("broker-a", "f:x"), part_name("broker-b", "f:x")
    store = PartedStore(["broker-a", "broker-b"], {a: 7, b: 3})
    session = Session("c", persistent=True)
    asyncio.run(start_reading(store, session, "f:x"))  # type: ignore[arg-type]
    assert session.cursors == {a: 7, b: 3}
    store.ends = {a: 9, b: 9}
    asyncio.run(start_reading(store, session, "f:x"))  # type: ignore[arg-type]
    assert session.cursors == {a: 7, b: 3}  # already read: positions kept


def test_unsubscribing_stops_every_part_and_only_that_queue() -> None:
    store = PartedStore(["broker-a", "broker-b"])
    session = Session("c", persistent=True)
    for queue in ("f:x", "f:y"):
        asyncio.run(start_reading(store, session, queue))  # type: ignore[arg-type]
    session.cursors[part_name("broker-gone", "f:x")] = 4  # a group no longer registered
    stop_reading(store, session, "f:x")  # type: ignore[arg-type]
    assert sorted(session.cursors) == sorted(store.parts("f:y"))


def test_parts_of_a_new_group_are_read_from_their_start() -> None:
    store = PartedStore(["broker-a"])
    session = Session("c", persistent=True)
    session.cursors = {part_name("broker-a", "f:x"): 5}
    store.groups.append("broker-b")
    assert start_new_parts(store, session)  # type: ignore[arg-type]
    assert session.cursors == {part_name("broker-a", "f:x"): 5, part_name("broker-b", "f:x"): 0}
    assert not start_new_parts(store, session)  # type: ignore[arg-type]


def test_positions_kept_before_queues_had_parts_move_to_the_first_group() -> None:
    store = PartedStore(["broker-a", "broker-b"])
    session = Session("c", persistent=True)
    session.cursors = {"f:x": 12, "c:c": 1}
    session.resend_below = {"f:x": 14}
    assert start_new_parts(store, session)  # type: ignore[arg-type]
    assert session.cursors == {
        part_name("broker-a", "f:x"): 12,
        part_name("broker-a", "c:c"): 1,
        part_name("broker-b", "f:x"): 0,
        part_name("broker-b", "c:c"): 0,
    }
    assert session.resend_below == {part_name("broker-a", "f:x"): 14}


def test_a_store_with_one_log_keeps_queue_names_as_they_are(tmp_path) -> None:
    from bridge.storage import FileLogStore

    store = FileLogStore(tmp_path)
    session = Session("c", persistent=True)
    session.cursors = {"f:x": 3}
    assert not start_new_parts(store, session)
    assert store.parts("f:x") == ("f:x",)
    stop_reading(store, session, "f:x")
    assert session.cursors == {}
