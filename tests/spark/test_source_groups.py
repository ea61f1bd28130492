"""The `rocketmq` data source against a RocketMQ of two broker groups (broker-a, broker-b).

One RocketMQ topic has queues on both groups, another only on the second (created there by its
first message). The messages go in with RocketMQ's own admin tool (`sendMessage -b GROUP -i
QUEUE`), not through a bridge, so where each one is stored is known; Spark must read them back
from every group, in a batch and in a stream. The two groups are the package's `two_groups`
(tests/spark/conftest.py), started once for this module and test_cluster.py.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import Row, SparkSession

from tests.spark.conftest import run_available_now, unique
from tests.support.rocketmq import LocalRocketMQ

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(300)]

GROUPS = ("broker-a", "broker-b")

Stored = tuple[str, str, str, bytes]
"""(RocketMQ topic, broker group, MQTT topic, payload) of one message."""


def send(
    mq: LocalRocketMQ, rocketmq_topic: str, group: str, queue: int, mqtt_topic: str, body: str
) -> Stored:
    """One message into queue `queue` of `group` with mqadmin; its tag is the MQTT topic, as a
    backend sends. mqadmin honours -b only with -i, and only for a group the topic's route
    already lists (or any group while the topic does not exist: it is created there)."""
    where = ("-b", group, "-i", str(queue))
    out = mq.admin("sendMessage", "-t", rocketmq_topic, *where, "-c", mqtt_topic, "-p", body)
    broker, qid, status = out.strip().splitlines()[-1].split()[:3]
    assert (broker, qid, status) == (group, str(queue), "SEND_OK"), out
    return (rocketmq_topic, group, mqtt_topic, body.encode())


@pytest.fixture(scope="module")
def stored(two_groups: LocalRocketMQ) -> list[Stored]:
    """Two messages of one topic on each group (created on both first), and one topic that
    exists only on broker-b, where its one message created it."""
    shared, only_b = unique("grp"), unique("onb")
    two_groups.create_topic(shared)
    messages = [
        send(two_groups, shared, group, i, f"{shared}/{group}/{i}", f"{group}-{i}")
        for group in GROUPS
        for i in range(2)
    ]
    messages.append(send(two_groups, only_b, "broker-b", 0, f"{only_b}/x", "only on broker-b"))
    return messages


def as_stored(rows: list[Row]) -> Counter[Stored]:
    return Counter((r.rocketmq_topic, r.broker, r.topic, bytes(r.payload)) for r in rows)


def test_the_source_reads_messages_of_every_broker_group(
    spark: SparkSession, two_groups: LocalRocketMQ, stored: list[Stored]
) -> None:
    ns = two_groups.namesrv_addr
    topics = sorted({s[0] for s in stored})
    named = (
        spark.read.format("rocketmq")
        .option("nameserver", ns)
        .option("topics", ",".join(topics))
        .load()
        .collect()
    )
    assert as_stored(named) == Counter(stored)
    # With no topic named, the data topics the NameServer lists: the same messages, no others.
    every = spark.read.format("rocketmq").option("nameserver", ns).load().collect()
    assert as_stored(every) == Counter(stored)
    assert len({(r.rocketmq_topic, r.broker, r.queue, r.offset) for r in every}) == len(stored)


def test_a_stream_reads_messages_of_every_broker_group(
    spark: SparkSession, two_groups: LocalRocketMQ, stored: list[Stored], tmp_path: Path
) -> None:
    frame = (
        spark.readStream.format("rocketmq")
        .option("nameserver", two_groups.namesrv_addr)
        .option("topics", ",".join(sorted({s[0] for s in stored})))
        .option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", "2")
        .load()
    )
    run_available_now(frame.select("rocketmq_topic", "broker", "topic", "payload"), tmp_path)
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert as_stored(rows) == Counter(stored)
