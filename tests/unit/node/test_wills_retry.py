"""A will the store cannot take now is stored later, once: the client cannot send it again.
(The nemesis found a will lost when its client died as the Redis master froze.)"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from bridge.node import wills as wills_module
from bridge.node.wills import Wills
from bridge.storage.base import Message, RecordsNotWritten, StaleOwner, StoreUnavailable


class Counts:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def inc(self, name: str, amount: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + amount


class KeyedStore:
    """A store that answers whether it holds a key: `found` in turn (an exception is raised);
    `atomic`: its writes are atomic with their records, and it cannot be asked."""

    def __init__(self, found: list[bool | BaseException], atomic: bool = False) -> None:
        self.found = found
        self.asked: list[tuple[str, str]] = []
        self.traits = SimpleNamespace(atomic_meta=atomic)

    async def find_key(self, topic: str, key: str) -> bool:
        self.asked.append((topic, key))
        answer = self.found.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


class FlakyPublisher:
    """Fails each route with the next of `failures`, then stores."""

    def __init__(self, failures: list[BaseException], store: KeyedStore) -> None:
        self.failures = failures
        self.routed: list[tuple[Message, list[Any]]] = []
        self.attempts = 0
        self.stamper = SimpleNamespace(node_id="n1", next_key=lambda: "n1-boot-1")
        self.store = store

    async def route(self, message: Message, meta: Any = ()) -> int:
        self.attempts += 1
        if self.failures:
            raise self.failures.pop(0)
        self.routed.append((message, list(meta)))
        return 1


def publish(
    failures: list[BaseException],
    monkeypatch: pytest.MonkeyPatch,
    store: KeyedStore | None = None,
) -> tuple[Any, ...]:
    monkeypatch.setattr(wills_module, "RETRY_FIRST", 0.001)
    monkeypatch.setattr(wills_module, "RETRY_MAX", 0.002)
    publisher, metrics = FlakyPublisher(failures, store or KeyedStore([])), Counts()
    wills = Wills(publisher=publisher, metrics=metrics, spawn=None)  # type: ignore[arg-type]
    will = Message(topic="dead/c1", payload=b"gone", qos=1)
    asyncio.run(wills.publish("c1", will))
    return publisher, metrics


def test_a_will_the_store_could_not_take_is_stored_when_it_can_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    down = [StoreUnavailable("Redis timed out") for _ in range(3)]
    publisher, metrics = publish(down, monkeypatch)
    assert publisher.attempts == 4 and len(publisher.routed) == 1
    assert [u.value for u in publisher.routed[0][1]] == [None]  # the online record goes with it
    assert metrics.counts["wills_retried"] == 3


def test_a_will_of_a_client_another_node_took_over_is_left_to_that_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    publisher, _ = publish([StoreUnavailable("down"), StaleOwner(["c1"])], monkeypatch)
    assert publisher.attempts == 2 and publisher.routed == []


def test_a_will_whose_record_write_may_have_landed_is_sent_again_as_it_was_not_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis took the online record's deletion but no replica confirmed it: the will itself
    never went to the broker."""
    not_sent = RecordsNotWritten(
        "only 0 of 1 Redis replicas confirmed the write", maybe_stored=True
    )
    publisher, _ = publish([not_sent], monkeypatch)
    assert publisher.attempts == 2 and len(publisher.routed) == 1


def test_a_will_that_may_have_been_stored_and_was_is_not_sent_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = KeyedStore([StoreUnavailable("broker still away"), True])
    publisher, _ = publish([StoreUnavailable("timed out", maybe_stored=True)], monkeypatch, store)
    assert publisher.attempts == 1 and publisher.routed == []
    assert store.asked == [("dead/c1", "n1-boot-1")] * 2  # asked again until it answered


def test_a_will_that_may_have_been_stored_and_was_not_is_sent_again_under_its_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by the nemesis: a node cut from RocketMQ gave up on a will whose send timed out,
    and it was never published."""
    store = KeyedStore([False])
    publisher, _ = publish([StoreUnavailable("timed out", maybe_stored=True)], monkeypatch, store)
    assert publisher.attempts == 2 and len(publisher.routed) == 1
    assert publisher.routed[0][0].key == "n1-boot-1"


def test_a_will_a_store_cannot_look_up_is_not_sent_again_after_a_doubtful_send(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = KeyedStore([], atomic=True)
    publisher, _ = publish([StoreUnavailable("sync failed", maybe_stored=True)], monkeypatch, store)
    assert publisher.attempts == 1 and publisher.routed == [] and store.asked == []
