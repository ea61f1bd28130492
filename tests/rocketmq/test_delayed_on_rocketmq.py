"""Delayed publish on the RocketMQ store, in-process with the real broker: a QoS 2 resend whose
first send's answer was lost finds the timer message by its key (it waits in the broker's
timer topic) and is not stored twice; the message reaches its subscriber once, when due."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from bridge.mqtt import codec
from bridge.mqtt.packets import Publish, Pubrec, Subscribe, Subscription
from bridge.node import Node
from bridge.storage.rocketmq.store import RocketMQStore
from tests.integration.test_store_failure import open_connection
from tests.rocketmq.test_node_on_rocketmq import _notifier, _publishes, _run_node, _unique, _until
from tests.support.rocketmq import LocalRocketMQ

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(180)]


def test_qos2_delayed_resend_after_an_unanswered_send_is_delivered_once_when_due(
    rocketmq: LocalRocketMQ, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = _unique("dq2")

    async def scenario(node: Node, store: RocketMQStore, namespace: str) -> None:
        async with _notifier(node, store):
            sub, received = await open_connection(node, "subscriber")
            sub.data_received(codec.encode(Subscribe(1, [Subscription(f"{topic}/#", 2)])))
            await asyncio.sleep(0.2)
            pub, transport = await open_connection(node, "publisher")
            # The broker stores the timer message but its answer is lost: the send times out
            # (after 2 s; the resend is looked up while the message still waits for its time).
            real = store._pipeline._answered
            monkeypatch.setattr(store._pipeline, "_answered", lambda send, response, error: None)
            sent = time.monotonic()
            packet = Publish(f"$delayed/6/{topic}/x", b"once", 2, packet_id=5)
            pub.data_received(codec.encode(packet))
            await _until(lambda: transport.closed, 10)
            assert not any(isinstance(p, Pubrec) for p in transport.packets())
            pub.connection_lost(None)
            monkeypatch.setattr(store._pipeline, "_answered", real)

            pub, transport = await open_connection(node, "publisher")
            packet = Publish(f"$delayed/6/{topic}/x", b"once", 2, dup=True, packet_id=5)
            pub.data_received(codec.encode(packet))
            await _until(lambda: any(isinstance(p, Pubrec) for p in transport.packets()), 10)
            assert node.metrics.get("delayed_scheduled") == 0  # found, not stored again
            await _until(lambda: bool(_publishes(received)), 20)
            assert time.monotonic() - sent >= 6 - 0.15
            await asyncio.sleep(2.0)
            got = [(p.topic, p.payload) for p in _publishes(received)]
            assert got == [(f"{topic}/x", b"once")]

    _run_node(rocketmq, tmp_path, scenario)
