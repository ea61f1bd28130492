"""The asyncio RocketMQ remoting client's requests about topics, groups and offsets (not the
message path of tests/rocketmq/test_remoting.py) against a real NameServer + broker: consumer
offsets, topics created on first send, queries by key, the topic list and a group's members.

These tests neither kill nor reconfigure the broker, so they use the session's RocketMQ (shared
by pytest-xdist's workers); each uses topics and groups of its own."""

from __future__ import annotations

import asyncio
import time

import pytest

from bridge.storage.rocketmq.remoting import RemotingError, RocketMQClient, SendStatus
from bridge.storage.rocketmq.wire import ResponseCode
from tests.rocketmq.test_remoting import _await_route, _name, _topic, run
from tests.support.rocketmq import ExternalRocketMQ, LocalRocketMQ

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(300)]


@pytest.fixture
def rmq(rocketmq: LocalRocketMQ | ExternalRocketMQ) -> LocalRocketMQ | ExternalRocketMQ:
    """The session's RocketMQ."""
    return rocketmq


def test_consumer_offsets_round_trip(rmq: LocalRocketMQ) -> None:
    async def scenario(client: RocketMQClient) -> None:
        topic = await _topic(client, queues=2)
        group = _name("G")
        for _ in range(5):
            await client.send(topic, b"x", queue_id=1)
        # The broker knows a group once it pulled (autoCreateSubscriptionGroup).
        await client.pull(topic, 1, 0, 1, consumer_group=group, suspend_timeout_ms=1000)
        assert await client.query_consumer_offset(topic, 1, consumer_group=group) is None
        await client.update_consumer_offset(topic, 1, 3, consumer_group=group)
        assert await client.query_consumer_offset(topic, 1, consumer_group=group) == 3
        await client.update_consumer_offset(topic, 1, 5, consumer_group=group, oneway=True)
        for _ in range(50):
            if await client.query_consumer_offset(topic, 1, consumer_group=group) == 5:
                break
            await asyncio.sleep(0.05)
        assert await client.query_consumer_offset(topic, 1, consumer_group=group) == 5
        assert await client.query_consumer_offset(topic, 0, consumer_group=group) is None

        with pytest.raises(RemotingError) as info:
            await client.update_consumer_offset(topic, 1, 1, consumer_group=_name("unknown"))
        assert info.value.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST

    run(rmq, scenario)


def test_send_to_new_topic_autocreates(rmq: LocalRocketMQ) -> None:
    async def scenario(client: RocketMQClient) -> None:
        topic = _name("Auto")
        with pytest.raises(RemotingError) as info:
            await client.get_route(topic)
        assert info.value.code == ResponseCode.TOPIC_NOT_EXIST
        result = await client.send(topic, b"hello", tags="t")
        assert result.status is SendStatus.SEND_OK
        assert result.queue_offset == 0
        await _await_route(client, topic)
        pulled = await client.pull(topic, result.queue_id, 0, 10, suspend_timeout_ms=3000)
        assert [m.body for m in pulled.messages] == [b"hello"]

    run(rmq, scenario)


def test_query_by_key_finds_sent_message_and_nothing_for_unknown_key(rmq: LocalRocketMQ) -> None:
    async def scenario(client: RocketMQClient) -> None:
        topic = await _topic(client, queues=2)
        key = _name("order")
        other = await client.send(topic, b"other", keys=[_name("order")], queue_id=0)
        sent = await client.send(topic, b"wanted", keys=[key, "second"], queue_id=1)
        assert other.status is sent.status is SendStatus.SEND_OK
        # The broker indexes keys a few milliseconds after SEND_OK: retry for a while.
        deadline = time.monotonic() + 3.0
        while not (found := await client.query_messages_by_key(topic, key)):
            assert time.monotonic() < deadline, "key was not indexed within 3 s"
            await asyncio.sleep(0.05)
        assert [m.body for m in found] == [b"wanted"]
        (msg,) = found
        assert (msg.topic, msg.queue_id, msg.queue_offset) == (topic, 1, sent.queue_offset)
        assert msg.msg_id == sent.msg_id
        assert msg.keys == [key, "second"]
        # The second key is indexed too.
        assert [m.msg_id for m in await client.query_messages_by_key(topic, "second")] == [
            sent.msg_id
        ]
        # The time range is exact to the millisecond (the broker's index keeps whole seconds).
        ts = msg.store_timestamp
        assert await client.query_messages_by_key(topic, key, begin_ms=ts, end_ms=ts) == found
        assert await client.query_messages_by_key(topic, key, end_ms=ts - 1) == []
        assert await client.query_messages_by_key(topic, key, begin_ms=ts + 1) == []
        # Unknown key (QUERY_NOT_FOUND) and a key that only prefixes a real one: nothing.
        assert await client.query_messages_by_key(topic, _name("missing")) == []
        assert await client.query_messages_by_key(topic, key[:-1]) == []

    run(rmq, scenario)


def test_topic_list_contains_new_topic_and_tbw102(rmq: LocalRocketMQ) -> None:
    async def scenario(client: RocketMQClient) -> None:
        topic = await _topic(client, queues=1)
        topics = await client.topic_list()
        assert topic in topics
        assert "TBW102" in topics
        assert topics == sorted(topics)

    run(rmq, scenario)


def test_consumer_group_lists_every_member_and_drops_one_that_unregisters(
    rmq: LocalRocketMQ,
) -> None:
    async def scenario(client: RocketMQClient) -> None:
        topic = await _topic(client, queues=2)
        group = _name("CG")
        # A group nobody joined: the broker answers SYSTEM_ERROR "no consumer for this group".
        assert await client.consumer_ids(group, topic) == []

        # The second client has no cached route: its heartbeat reaches the cluster's masters.
        async with RocketMQClient(
            rmq.namesrv_addr, client_id=_name("member"), producer_group="test_producers"
        ) as other:
            client.register_consumer(group, [topic])
            other.register_consumer(group, [topic])
            assert other.consumer_groups == {group: (topic,)}
            await client.heartbeat()
            await other.heartbeat()
            both = sorted([client.client_id, other.client_id])
            assert await client.consumer_ids(group, topic) == both

            # A repeated heartbeat neither duplicates nor drops anyone.
            await other.heartbeat()
            assert await client.consumer_ids(group, topic) == both

            await other.unregister_client(group)
            assert await client.consumer_ids(group, topic) == [client.client_id]
            assert other.consumer_groups == {}
            # Unregistering also stopped its heartbeats from announcing the group.
            await other.heartbeat()
            assert await client.consumer_ids(group, topic) == [client.client_id]

        await client.unregister_client(group)
        assert await client.consumer_ids(group, topic) == []

    run(rmq, scenario)
