"""MQTT 5 metadata through a real RocketMQ (the session's NameServer + broker): what the bridge
stores is readable by any RocketMQ consumer under the documented property names, and what a
backend produces with those properties reaches the bridge as the same metadata.

The broker keeps a message's properties in a hash map and writes them back in its own order,
for a message in its topic and in its light queues alike: the order of User Properties
(MQTT-3.3.2-18) survives only through `mqtt.user_order`, and these tests show both.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from bridge.storage import metadata
from bridge.storage.base import Message
from bridge.storage.rocketmq import (
    RemotingError,
    RocketMQClient,
    RocketMQStore,
    message_of,
    rocketmq_topic,
)
from bridge.storage.rocketmq.groups import split_part
from bridge.storage.rocketmq.messages import StoredMessage
from bridge.storage.rocketmq.types import PullStatus

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(300)]

# Twelve names in reverse order, then a repeat: far from any hash map's iteration order.
USERS = [(f"{chr(ord('z') - n)}-name", f"value {n}") for n in range(12)] + [("z-name", "again")]
META = metadata.from_publish(
    {
        0x01: 1,  # Payload Format Indicator: UTF-8
        0x02: 3600,  # Message Expiry Interval
        0x03: "application/json",
        0x08: "replies/dev-7",
        0x09: b"\x00\x01req-7",
        0x26: USERS,
    }
)
READABLE = {
    "mqtt.payload_format": "1",
    "mqtt.message_expiry": "3600",
    "mqtt.content_type": "application/json",
    "mqtt.response_topic": "replies/dev-7",
    "mqtt.correlation_data": "AAFyZXEtNw==",
    "mqtt.user.z-name": "value 0",
    "mqtt.user.z-name%001": "again",
}


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def client_for(nameserver: str) -> RocketMQClient:
    return RocketMQClient(
        nameserver,
        client_id=unique("t-"),
        producer_group="tests_v5",
        consumer_group="tests_v5",
    )


async def pull_all(
    client: RocketMQClient, topic: str, *, within: float = 30.0
) -> list[StoredMessage]:
    """Every message of a (normal) RocketMQ topic, once it holds at least one."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        out: list[StoredMessage] = []
        try:
            route = await client.fetch_route(topic)
        except RemotingError:  # not routed yet
            route = None
        for queue in route.queues if route else ():
            for queue_id in range(queue.read_queue_nums):
                result = await client.pull(topic, queue_id, 0, 32, broker_name=queue.broker_name)
                if result.status is PullStatus.FOUND:
                    out.extend(result.messages)
        if out or loop.time() > deadline:
            return out
        await asyncio.sleep(0.2)


async def await_route(client: RocketMQClient, topic: str, within: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        try:
            await client.fetch_route(topic)
            return
        except RemotingError:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.1)


def user_names_in_broker_order(raw: StoredMessage) -> list[str]:
    return [name for name in raw.properties if name.startswith("mqtt.user.")]


def test_a_stored_message_carries_its_metadata_as_readable_properties_in_topic_and_lmq(
    rocketmq, tmp_path: Path
) -> None:
    first_level = unique("v5s")
    message = Message(
        f"{first_level}/dev-7/telemetry",
        b'{"t": 21.5}',
        qos=1,
        publisher="dev-7",
        key=unique("k-"),
        timestamp_ms=1_700_000_000_000,
        node="n1",
        properties=META,
    )
    sent_order = [f"mqtt.user.{name}" for name, _ in USERS[:-1]] + ["mqtt.user.z-name%001"]

    async def main() -> None:
        store = RocketMQStore(
            rocketmq.namesrv_addr, tmp_path / "store", namespace=unique("ns"), node_id="n1"
        )
        await store.open()
        try:
            await store.append(message, ["f:v5/#"])
            [part] = store.parts("f:v5/#")
            [stored] = (await store.read(part, 0, 10)).messages
            assert stored.message == message
            assert metadata.user_properties(stored.message.properties) == USERS

            group, queue = split_part(part) or ("", "")
            async with client_for(rocketmq.namesrv_addr) as client:
                [in_topic] = await pull_all(client, rocketmq_topic(message.topic))
                lmq = await client.pull(store.register_lmq(queue), 0, 0, 32, broker_name=group)
                [in_lmq] = lmq.messages
        finally:
            await store.close()

        for raw in (in_topic, in_lmq):
            assert READABLE.items() <= raw.properties.items()
            assert raw.properties["mqtt.user_order"] == ",".join(
                name.removeprefix("mqtt.user.") for name in sent_order
            )
            # What the broker did to the order, and what the mapping makes of it.
            assert user_names_in_broker_order(raw) != sent_order
            back = message_of(raw)
            assert back is not None and back.properties == META
            assert metadata.user_properties(back.properties) == USERS

    asyncio.run(main())
    # And the broker's own tools (a Java consumer) read them under the same names.
    printed = rocketmq.admin("consumeMessage", "-t", rocketmq_topic(message.topic))
    for name, value in READABLE.items():
        assert f"{name}={value}" in printed


def test_a_message_a_backend_produces_with_the_properties_reaches_the_bridge_as_metadata(
    rocketmq,
) -> None:
    """The path of a reply from a backend to a device: it writes the documented properties
    (here with the project's client, as any RocketMQ producer would) and the bridge reads the
    metadata a PUBLISH to the device is built from."""
    first_level = unique("v5b")
    topic = f"{first_level}/dev-7/cmd"
    order = ",".join(f"{name}" for name, _ in USERS[:-1]) + ",z-name%001"
    properties = {
        "mqtt.payload_format": "1",
        "mqtt.message_expiry": "3600",
        "mqtt.content_type": "application/json",
        "mqtt.response_topic": "replies/dev-7",
        "mqtt.correlation_data": "AAFyZXEtNw==",
        **{f"mqtt.user.{name}": value for name, value in USERS[:-1]},
        "mqtt.user.z-name%001": "again",
        "mqtt.user_order": order,
    }

    async def main() -> None:
        async with client_for(rocketmq.namesrv_addr) as client:
            await client.create_topic(rocketmq_topic(topic), read_queue_nums=1, write_queue_nums=1)
            await await_route(client, rocketmq_topic(topic))
            await client.send(rocketmq_topic(topic), b"on", tags=topic, properties=properties)
            [raw] = await pull_all(client, rocketmq_topic(topic))
        assert user_names_in_broker_order(raw) != [
            n for n in properties if n.startswith("mqtt.user.")
        ]
        message = message_of(raw)
        assert message is not None
        assert (message.topic, message.payload, message.qos) == (topic, b"on", 1)
        assert message.properties == META
        assert metadata.user_properties(message.properties) == USERS
        # No mqtt.ts: the expiry counts from the time the broker stored the message.
        assert message.timestamp_ms == raw.store_timestamp
        publish = metadata.to_publish(message.properties, message.timestamp_ms, raw.store_timestamp)
        assert publish[0x02] == 3600 and publish[0x09] == b"\x00\x01req-7"
        assert publish[0x26] == USERS

    asyncio.run(main())
