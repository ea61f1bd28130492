"""deploy/rocketmq with two broker groups and a slave each (RMQ_GROUPS=2 RMQ_SLAVES=1).

One NameServer + four brokers (broker-a and broker-b, each a SYNC_MASTER and a SLAVE) for the
whole module, started through LocalRocketMQ(groups=2, slaves=1); start-up ~30 s on two cores.
The tests run in file order; the module's fixture stops everything at the end.

Reading on a slave: a slave builds its consume queues, light queues (LMQ) included, from the
commit log it replicates, so a message is readable there as soon as it is replicated. It learns
the master's topic configs only every 60 s (its metadata sync), so pulling a parent topic created
a moment ago fails on the slave with TOPIC_NOT_EXIST for up to a minute; LMQs need no topic config.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import pytest

from bridge.storage.rocketmq.messages import decode_messages
from bridge.storage.rocketmq.remoting import RocketMQClient, SendStatus
from bridge.storage.rocketmq.wire import PullSysFlag, RequestCode, ResponseCode
from tests.support.rocketmq import LocalRocketMQ, broker_role
from tests.support.rocketmq_use import own_rocketmq

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(400)]

T = TypeVar("T")
PERM_WRITE = 2


@pytest.fixture(scope="module")
def mq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRocketMQ]:
    with own_rocketmq(
        tmp_path_factory.mktemp("rocketmq-groups"), groups=2, slaves=1, timer=False
    ) as node:
        yield node


def _name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def run(mq: LocalRocketMQ, scenario: Callable[[RocketMQClient], Awaitable[T]]) -> T:
    async def main() -> T:
        # request_timeout above the broker's slaveTimeout (3 s): a send the slave does not
        # confirm gets the broker's answer (FLUSH_SLAVE_TIMEOUT), not a client time-out.
        async with RocketMQClient(
            mq.namesrv_addr,
            client_id=_name("groups"),
            producer_group="groups_producers",
            consumer_group="groups_consumers",
            request_timeout=8.0,
        ) as client:
            return await scenario(client)

    return asyncio.run(main())


async def _max_offset_at(client: RocketMQClient, addr: str, topic: str) -> int:
    """GET_MAX_OFFSET of queue 0 asked of one broker (a slave too), not of the route's master."""
    response = await client.call(
        addr, RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": "0", "committed": "true"}
    )
    assert response.code == ResponseCode.SUCCESS, (addr, topic, response.remark)
    return int(response.ext_fields["offset"])


async def _pull_at(client: RocketMQClient, addr: str, topic: str, group: str) -> list[bytes]:
    """The bodies in queue 0 of `topic` from offset 0, pulled from one broker (a slave too)."""
    fields = {
        "consumerGroup": group,
        "topic": topic,
        "queueId": "0",
        "queueOffset": "0",
        "maxMsgNums": "32",
        "sysFlag": str(PullSysFlag.SUBSCRIPTION),
        "commitOffset": "0",
        "suspendTimeoutMillis": "0",
        "subscription": "*",
        "subVersion": "0",
        "expressionType": "TAG",
    }
    response = await client.call(addr, RequestCode.PULL_MESSAGE, fields)
    assert response.code == ResponseCode.SUCCESS, (addr, topic, response.code, response.remark)
    return [m.body for m in decode_messages(response.body)]


async def _await_max_offset_at(
    client: RocketMQClient, addr: str, topic: str, expected: int, within: float = 20.0
) -> None:
    deadline = time.monotonic() + within
    while (got := await _max_offset_at(client, addr, topic)) < expected:
        assert time.monotonic() < deadline, f"{topic} at {addr}: max offset {got} < {expected}"
        await asyncio.sleep(0.1)


async def _topic_on(client: RocketMQClient, group: str) -> str:
    """A new one-queue topic on one group only."""
    topic = _name("G")
    await client.create_topic(topic, read_queue_nums=1, write_queue_nums=1, broker_names=[group])
    deadline = time.monotonic() + 10
    while True:
        try:
            await client.fetch_route(topic)
            return topic
        except Exception:
            assert time.monotonic() < deadline, f"no route for {topic}"
            await asyncio.sleep(0.1)


def _cluster_rows(out: str) -> set[tuple[str, int, str]]:
    """(broker name, broker id, address) of each row of `mqadmin clusterList`."""
    rows = set()
    for line in out.splitlines():
        cols = line.split()
        if len(cols) >= 4 and cols[0] == "DefaultCluster" and cols[2].isdigit():
            rows.add((cols[1], int(cols[2]), cols[3]))
    return rows


def test_two_groups_with_a_slave_each_register_four_brokers(mq: LocalRocketMQ) -> None:
    addrs = mq.broker_addrs()
    assert set(addrs) == {("broker-a", 0), ("broker-a", 1), ("broker-b", 0), ("broker-b", 1)}
    assert len(set(addrs.values())) == 4
    assert addrs[("broker-a", 0)] == mq.broker_addr  # group 0's master: the single-broker port
    for (group, broker_id), addr in addrs.items():
        assert mq.pid(broker_role(group, broker_id)), (group, broker_id)
        assert addr in mq.registered_brokers()
    rows = _cluster_rows(mq.admin("clusterList"))
    assert rows == {(group, broker_id, addr) for (group, broker_id), addr in addrs.items()}
    # Group 0's master keeps the single-broker files; the others have their own.
    assert (mq.data_dir / "broker.pid").exists() and (mq.log_dir / "broker.out").exists()
    assert (mq.data_dir / "conf" / "broker.conf").exists() and (mq.data_dir / "store").is_dir()
    for role in ("broker-a-1", "broker-b-0", "broker-b-1"):
        assert (mq.data_dir / f"{role}.pid").exists()
        assert (mq.log_dir / f"{role}.out").exists()
        assert (mq.data_dir / "conf" / f"{role}.conf").exists()
        assert (mq.data_dir / f"store-{role}").is_dir()


def test_masters_are_sync_masters_and_slaves_replicate_under_the_group_name(
    mq: LocalRocketMQ,
) -> None:
    configs = {}
    for broker_id in (0, 1):
        addr = mq.broker_addrs()[("broker-b", broker_id)]
        out = mq.admin("getBrokerConfig", "-b", addr)
        configs[broker_id] = {
            key.strip(): value.strip()
            for key, sep, value in (row.partition("=") for row in out.splitlines())
            if sep
        }
    master, slave = configs[0], configs[1]
    assert (master["brokerName"], master["brokerId"]) == ("broker-b", "0")
    assert (slave["brokerName"], slave["brokerId"]) == ("broker-b", "1")
    assert (master["brokerRole"], slave["brokerRole"]) == ("SYNC_MASTER", "SLAVE")
    # 5.3.3 outside controller mode: a SYNC_MASTER waits for the slave only with 2 here.
    assert master["inSyncReplicas"] == "2"
    for config in (master, slave):
        assert config["slaveReadEnable"] == "true"
        assert config["enableLmq"] == "true" and config["enableMultiDispatch"] == "true"
        assert config["flushDiskType"] == "SYNC_FLUSH"
        assert config["sendMessageThreadPoolNums"] == "1"
        assert int(config["haListenPort"]) == int(config["listenPort"]) + 1
    assert int(slave["listenPort"]) == int(master["listenPort"]) + 10
    assert master["storePathRootDir"] != slave["storePathRootDir"]


def test_a_message_sent_to_broker_b_master_is_readable_on_its_slave_also_from_a_light_queue(
    mq: LocalRocketMQ,
) -> None:
    master = mq.broker_addrs()[("broker-b", 0)]
    slave = mq.broker_addrs()[("broker-b", 1)]

    async def scenario(client: RocketMQClient) -> None:
        topic = await _topic_on(client, "broker-b")
        lmq, group = f"%LMQ%{_name('lmq')}", f"%LMQ%{_name('g')}"
        for i in range(3):
            result = await client.send(
                topic,
                f"m{i}".encode(),
                tags="t",
                properties={"INNER_MULTI_DISPATCH": lmq},
                queue_id=0,
                broker_name="broker-b",
            )
            # SYNC_MASTER: acknowledged once the slave has it.
            assert result.status is SendStatus.SEND_OK
        for addr in (master, slave):
            await _await_max_offset_at(client, addr, topic, 3)
            await _await_max_offset_at(client, addr, lmq, 3)
            assert await _pull_at(client, addr, lmq, group) == [b"m0", b"m1", b"m2"]
        assert await _pull_at(client, master, topic, "groups_consumers") == [b"m0", b"m1", b"m2"]

    run(mq, scenario)


def test_a_killed_slave_restarts_and_gets_what_its_master_stored_meanwhile(
    mq: LocalRocketMQ,
) -> None:
    master = mq.broker_addrs()[("broker-b", 0)]
    slave = mq.broker_addrs()[("broker-b", 1)]
    old_pid = mq.pid("broker-b-1")
    master_pid = mq.pid("broker-b-0")
    assert old_pid and master_pid

    mq.kill_broker("broker-b", 1)
    assert mq.pid("broker-b-1") is None
    assert mq.pid("broker-b-0") == master_pid
    deadline = time.monotonic() + 10
    while slave in mq.registered_brokers():
        assert time.monotonic() < deadline, "the killed slave stays registered"
        time.sleep(0.2)
    assert master in mq.registered_brokers()

    lmq, group = f"%LMQ%{_name('down')}", f"%LMQ%{_name('g')}"

    async def send_while_down(client: RocketMQClient) -> str:
        topic = await _topic_on(client, "broker-b")
        began = time.monotonic()
        result = await client.send(
            topic,
            b"while-slave-down",
            tags="t",
            properties={"INNER_MULTI_DISPATCH": lmq},
            queue_id=0,
            broker_name="broker-b",
        )
        # Stored on the master, but not acknowledged as replicated: the broker waited
        # slaveTimeout (3 s) for the slave.
        assert result.status is SendStatus.FLUSH_SLAVE_TIMEOUT
        assert time.monotonic() - began >= 2.5
        await _await_max_offset_at(client, master, lmq, 1)
        return topic

    topic = run(mq, send_while_down)

    mq.start_broker("broker-b", 1)
    assert mq.pid("broker-b-1") not in (None, old_pid)
    assert slave in mq.registered_brokers()

    async def read_on_slave(client: RocketMQClient) -> None:
        await _await_max_offset_at(client, slave, lmq, 1)
        assert await _pull_at(client, slave, lmq, group) == [b"while-slave-down"]
        await _await_max_offset_at(client, slave, topic, 1)
        # With the slave back, sends are acknowledged as replicated again.
        result = await client.send(topic, b"after", queue_id=0, broker_name="broker-b")
        assert result.status is SendStatus.SEND_OK

    run(mq, read_on_slave)


def test_a_group_made_read_only_offers_no_write_queues_until_made_writable(
    mq: LocalRocketMQ,
) -> None:
    async def perm_of(client: RocketMQClient, topic: str) -> int:
        route = await client.fetch_route(topic)
        (queue,) = [q for q in route.queues if q.broker_name == "broker-b"]
        return queue.perm

    topic = run(mq, lambda client: _topic_on(client, "broker-b"))
    mq.set_write_permission("broker-b", False)
    try:
        assert not run(mq, lambda client: perm_of(client, topic)) & PERM_WRITE
    finally:
        mq.set_write_permission("broker-b", True)
    assert run(mq, lambda client: perm_of(client, topic)) & PERM_WRITE
