"""A will whose publication failed on its node is published by the node that takes the client
over, once, with the ownership records in a real Redis.

Found by the nemesis (seed 764666): a will came due as the broker's disk filled, the send was
refused, and before the node could try again it was cut off and its sessions taken over. The
online record holding the will had been deleted before the send (records are written first), so
the taker had no will to publish, and the first node, fenced, left it to the taker: the will was
never published. The broker is a list here: what matters is the order of the record writes
against the sends, and the fencing, which are Redis's.
"""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from bridge.cluster.redis_access import RedisAccess
from bridge.cluster.registry import RedisRegistry, redis_client
from bridge.mqtt.packets import Will
from bridge.node import wills as wills_module
from bridge.node.wills import Wills, publication_begun
from bridge.state import KIND_ONLINE, will_of
from bridge.storage.base import Message, MetaUpdate, StoreUnavailable
from tests.support.redis import LocalRedis, run_and_collect


class Broker:
    """The messages stored, by key; a full disk refuses sends."""

    def __init__(self) -> None:
        self.stored: list[Message] = []
        self.full = True


class NodeStore:
    """One node's view: records go to its registry before the message goes to the broker, as
    the RocketMQ store sends them."""

    def __init__(self, registry: RedisRegistry, broker: Broker) -> None:
        self.registry = registry
        self.broker = broker
        self.traits = SimpleNamespace(atomic_meta=False)

    async def put_meta(self, updates: list[MetaUpdate]) -> None:
        await self.registry.put_meta(updates)

    async def find_key(self, topic: str, key: str) -> bool:
        return any(m.topic == topic and m.key == key for m in self.broker.stored)


class NodePublisher:
    def __init__(self, node_id: str, store: NodeStore) -> None:
        self.store = store
        self.counter = 0
        self.stamper = SimpleNamespace(node_id=node_id, stamp=self._stamp, next_key=self._key)

    def _key(self) -> str:
        self.counter += 1
        return f"{self.stamper.node_id}-{self.counter}"

    def _stamp(self, topic: str, payload: bytes, qos: int, retain: bool, publisher: str) -> Message:
        return Message(
            topic=topic, payload=payload, qos=qos, retain=retain, publisher=publisher,
            key=self._key(),
        )  # fmt: skip

    async def route(self, message: Message, meta: Any = ()) -> int:
        if meta:
            await self.store.put_meta(list(meta))
        if self.store.broker.full:
            raise StoreUnavailable("RocketMQ did not store the message: the broker's disk is full")
        self.store.broker.stored.append(message)
        return 1


class Counts:
    def inc(self, name: str, amount: int = 1) -> None:
        pass


def test_a_will_whose_send_failed_is_published_once_by_the_node_that_takes_its_client_over(
    redis_server: LocalRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wills_module, "RETRY_FIRST", 0.05)
    monkeypatch.setattr(wills_module, "RETRY_MAX", 0.05)
    prefix = f"w{uuid.uuid4().hex[:8]}"
    broker = Broker()

    async def main() -> None:
        made = [
            RedisRegistry(redis_client(RedisAccess(url=redis_server.url)), prefix, node)
            for node in ("n1", "n2")
        ]
        first, taker = (
            Wills(publisher=NodePublisher(r.node_id, NodeStore(r, broker)), metrics=Counts(),
                  spawn=asyncio.ensure_future)  # type: ignore[arg-type]
            for r in made
        )  # fmt: skip
        try:
            await made[0].claim("dev", False)
            record, key = first.online_record("dev", "10.0.0.9:4000", Will("gone/dev", b"bye", 1))
            await made[0].put_meta([MetaUpdate(KIND_ONLINE, "dev", record)])
            first.due("dev", Will("gone/dev", b"bye", 1), None, key)
            await asyncio.sleep(0.12)  # a try or two, refused by the full disk
            claim = await made[1].claim("dev", None, only_from="n1")
            assert claim is not None
            will = will_of(claim.online)
            assert will is not None, "the taker found no will to publish"
            assert will.key == key and publication_begun(claim.online)
            broker.full = False
            await taker.publish("dev", will, maybe_sent=publication_begun(claim.online))
            await asyncio.sleep(0.3)  # the first node's next try meets the taker's claim
            assert [(m.topic, m.key) for m in broker.stored] == [("gone/dev", key)]
            again = await made[0].claim("dev", None)
            assert again is not None and again.online is None  # the taker ended the record
        finally:
            for registry in made:
                await registry.close()

    run_and_collect(main())
