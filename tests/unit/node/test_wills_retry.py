"""A will the store cannot take now is stored later, once: the client cannot send it again.
(The nemesis found a will lost when its client died as the Redis master froze, and another
when the broker's disk was full and the node was taken over before it could try again.)"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from bridge.mqtt.packets import Will
from bridge.node import wills as wills_module
from bridge.node.wills import Wills, publication_begun
from bridge.state import KIND_ONLINE, will_of
from bridge.storage.base import (
    Message,
    MetaUpdate,
    RecordsNotWritten,
    StaleOwner,
    StoreUnavailable,
)


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
        self.put: list[MetaUpdate] = []

    async def put_meta(self, updates: list[MetaUpdate]) -> None:
        self.put.extend(updates)

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
    maybe_sent: bool = False,
) -> tuple[Any, ...]:
    monkeypatch.setattr(wills_module, "RETRY_FIRST", 0.001)
    monkeypatch.setattr(wills_module, "RETRY_MAX", 0.002)
    publisher, metrics = FlakyPublisher(failures, store or KeyedStore([])), Counts()
    wills = Wills(publisher=publisher, metrics=metrics, spawn=None)  # type: ignore[arg-type]
    will = Message(topic="dead/c1", payload=b"gone", qos=1)
    asyncio.run(wills.publish("c1", will, maybe_sent=maybe_sent))
    return publisher, metrics


def test_a_will_the_store_could_not_take_is_stored_when_it_can_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    down = [StoreUnavailable("Redis timed out") for _ in range(3)]
    store = KeyedStore([], atomic=True)
    publisher, metrics = publish(down, monkeypatch, store)
    assert publisher.attempts == 4 and len(publisher.routed) == 1
    assert [u.value for u in publisher.routed[0][1]] == [None]  # the online record goes with it
    assert metrics.counts["wills_retried"] == 3


def test_a_will_whose_send_fails_stays_in_its_record_until_it_is_stored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where records are written apart from the message (RocketMQ with Redis), each try first
    rewrites the online record as being published, with the will and its key; the record is
    deleted only once the will is stored. Found by the nemesis: the record deleted before a
    send the full disk refused left a node that took the client over no will to publish."""
    store = KeyedStore([])
    publisher, _ = publish([StoreUnavailable("the broker's disk is full")], monkeypatch, store)
    assert publisher.attempts == 2 and len(publisher.routed) == 1
    (record,) = publisher.routed[0][1]
    assert record.kind == KIND_ONLINE and publication_begun(record.value)
    will = will_of(record.value)
    assert will is not None and will.key == "n1-boot-1" and will.payload == b"gone"
    assert [(u.kind, u.value) for u in store.put] == [(KIND_ONLINE, None)]


def test_a_will_taken_over_after_its_publication_began_is_not_sent_again_if_stored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = KeyedStore([True])
    publisher, _ = publish([], monkeypatch, store, maybe_sent=True)
    assert publisher.attempts == 0 and store.asked == [("dead/c1", "n1-boot-1")]
    assert [(u.kind, u.value) for u in store.put] == [(KIND_ONLINE, None)]


def test_a_will_taken_over_after_its_publication_began_is_sent_if_not_stored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = KeyedStore([False])
    publisher, _ = publish([], monkeypatch, store, maybe_sent=True)
    assert publisher.attempts == 1 and len(publisher.routed) == 1


def test_a_will_is_published_under_the_key_its_online_record_names() -> None:
    """So that a node taking the record over can look the will up in the store."""
    keys = iter(["n1-boot-7", "n1-boot-8"])
    stamper = SimpleNamespace(
        node_id="n1",
        stamp=lambda topic, payload, qos, retain, publisher: Message(
            topic=topic, payload=payload, qos=qos, retain=retain, key=next(keys)
        ),
    )
    publisher = SimpleNamespace(stamper=stamper)
    spawned: list[Any] = []
    wills = Wills(publisher=publisher, metrics=Counts(), spawn=spawned.append)  # type: ignore[arg-type]
    record, key = wills.online_record("c1", "10.0.0.1:5000", Will("dead/c1", b"gone", 1))
    recorded = will_of(record)
    assert recorded is not None and recorded.key == key == "n1-boot-7"
    captured: list[Message] = []

    async def publish(client_id: str, message: Message, **_: Any) -> None:
        captured.append(message)

    wills.publish = publish  # type: ignore[method-assign]
    wills.due("c1", Will("dead/c1", b"gone", 1), None, key)
    asyncio.run(spawned[0])
    assert [m.key for m in captured] == ["n1-boot-7"]
    assert not publication_begun(record)


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
