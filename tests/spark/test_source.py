"""The `rocketmq` data source against a real bridge, a real RocketMQ and a local Spark.

Messages go in over MQTT (paho, MQTT 5) through a bridge with store=rocketmq; Spark reads them
back with `spark.read` / `spark.readStream`. Every test uses a first MQTT level of its own, so
its own RocketMQ topic on the session's broker.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import Row, SparkSession
from pyspark.sql.streaming import StreamingQuery

from bridge.storage import FileLogStore, Message, metadata
from tests.spark.conftest import (
    produce_backend_message,
    publish_all,
    run_available_now,
    unique,
)
from tests.support.processes import BridgeProcess
from tests.support.rocketmq import CLUSTER, LocalRocketMQ
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(300)]


def source(spark: SparkSession, nameserver: str, **options: str):  # type: ignore[no-untyped-def]
    return spark.read.format("rocketmq").option("nameserver", nameserver).options(**options)


def count_when_stored(spark: SparkSession, nameserver: str, expected: int, **options: str) -> int:
    """Row count once it reaches `expected` (QoS 0 messages are stored without being awaited)."""
    counts: list[int] = []

    def reached() -> bool:
        counts.append(source(spark, nameserver, **options).load().count())
        return counts[-1] >= expected

    wait_until(reached, 30, f"{expected} stored messages")
    return counts[-1]


def test_batch_read_returns_every_stored_message_with_its_mqtt_fields(
    spark: SparkSession, rocketmq, rocketmq_bridge: BridgeProcess
) -> None:
    top = unique("src")
    publisher = unique("dev-")
    publish_all(
        rocketmq_bridge.port,
        [
            (f"{top}/line1/m1", b"one", 1),
            (f"{top}/line1/m2", b"\x00\xffbinary", 2),
            (f"{top}/line2/m1", b"", 1),
            (f"{top}/line2/m2", b"zero", 0),
        ],
        client_id=publisher,
    )
    ns = rocketmq.namesrv_addr
    produce_backend_message(ns, f"{top}/backend", b"from a backend", {"unit": "kg", "n": "7"})
    assert count_when_stored(spark, ns, 5, topics=top) == 5
    rows = {r.topic: r for r in source(spark, ns, topics=top).load().collect()}
    backend = rows.pop(f"{top}/backend")
    assert backend.properties == {"unit": "kg", "n": "7"}
    assert bytes(backend.payload) == b"from a backend" and backend.qos == 1
    assert set(rows) == {f"{top}/line1/m1", f"{top}/line1/m2", f"{top}/line2/m1", f"{top}/line2/m2"}
    first = rows[f"{top}/line1/m1"]
    assert bytes(first.payload) == b"one"
    assert first.qos == 1 and first.retain is False
    assert first.properties == {}
    assert bytes(rows[f"{top}/line1/m2"].payload) == b"\x00\xffbinary"
    assert rows[f"{top}/line1/m2"].qos == 2
    assert bytes(rows[f"{top}/line2/m1"].payload) == b""  # RocketMQ's placeholder body hidden
    assert rows[f"{top}/line2/m2"].qos == 0
    for row in rows.values():
        assert row.publisher == publisher
        assert row.node and row.key and row.broker
        assert row.rocketmq_topic == top
        assert row.store_time >= row.publish_time.replace(microsecond=0)
    keys = [r.key for r in rows.values()]
    assert len(set(keys)) == 4
    places = [(r.broker, r.queue, r.offset) for r in rows.values()]
    assert len(set(places)) == 4


def test_topic_filter_selects_rows_by_exact_topic_and_by_wildcards(
    spark: SparkSession, rocketmq, rocketmq_bridge: BridgeProcess
) -> None:
    top = unique("flt")
    topics = [f"{top}/a/1", f"{top}/a/2", f"{top}/b/1", f"{top}/a/1", f"{top}/a/1/deep"]
    publish_all(rocketmq_bridge.port, [(t, t.encode()) for t in topics])
    ns = rocketmq.namesrv_addr
    expected = {
        f"{top}/a/1": 2,  # exact: pushed to the broker as a tag
        f"{top}/a/+": 3,
        f"{top}/+/1": 3,
        f"{top}/#": 5,
        f"{top}/a/#": 4,
    }
    for topic_filter, count in expected.items():
        rows = source(spark, ns, topicFilter=topic_filter).load().collect()
        assert len(rows) == count, topic_filter
    # The RocketMQ topic comes from the filter's first level; `topics` names it explicitly.
    assert source(spark, ns, topics=top, topicFilter="+/b/1").load().count() == 1


def test_offsets_and_timestamps_bound_a_batch_read(
    spark: SparkSession, rocketmq, rocketmq_bridge: BridgeProcess
) -> None:
    top = unique("rng")
    ns = rocketmq.namesrv_addr
    publish_all(rocketmq_bridge.port, [(f"{top}/x", b"early-%d" % i) for i in range(6)])
    time.sleep(0.05)
    cut = int(time.time() * 1000)
    time.sleep(0.05)
    publish_all(rocketmq_bridge.port, [(f"{top}/x", b"late-%d" % i) for i in range(5)])
    early = source(spark, ns, topics=top, endingTimestamp=str(cut)).load().collect()
    late = source(spark, ns, topics=top, startingTimestamp=str(cut)).load().collect()
    assert sorted(bytes(r.payload) for r in early) == sorted(b"early-%d" % i for i in range(6))
    assert sorted(bytes(r.payload) for r in late) == sorted(b"late-%d" % i for i in range(5))

    # The offsets just past the early messages, as JSON, start where the timestamp did.
    ends: dict[str, int] = {}
    for row in early:
        place = f"{row.broker}:{row.queue}"
        ends[place] = max(ends.get(place, 0), row.offset + 1)
    starting = "{" + f'"{top}": {{' + ", ".join(f'"{q}": {o}' for q, o in ends.items()) + "}}"
    from_json = source(spark, ns, topics=top, startingOffsets=starting).load().collect()
    assert sorted(bytes(r.payload) for r in from_json) == sorted(b"late-%d" % i for i in range(5))
    latest = source(spark, ns, topics=top, startingOffsets="latest").load().count()
    assert latest == 0

    # minPartitions splits the queues' ranges into that many tasks at least, rows unchanged.
    split = source(spark, ns, topics=top, minPartitions="8").load()
    assert split.rdd.getNumPartitions() >= 8
    assert sorted(bytes(r.payload) for r in split.collect()) == sorted(
        [b"early-%d" % i for i in range(6)] + [b"late-%d" % i for i in range(5)]
    )


def test_a_batch_read_of_a_secured_rocketmq_signs_and_speaks_tls_and_names_a_wrong_secret_key(
    spark: SparkSession, secured_rocketmq: LocalRocketMQ
) -> None:
    """Options accessKey, secretKey, tls, tlsCaFile, tlsCertFile/tlsKeyFile (the servers
    require client certificates): the driver (queues, offsets) and the
    executors (pulls) use them; a wrong secretKey fails the query naming the option."""
    mq = secured_rocketmq
    top = unique("sec")
    security = {"credentials": mq.credentials, "tls": mq.tls_options}
    for i in range(3):
        produce_backend_message(mq.namesrv_addr, f"{top}/line/m{i}", b"v%d" % i, {}, **security)
    options = {
        "topicFilter": f"{top}/#",
        "accessKey": mq.acl_user,
        "secretKey": mq.acl_password,
        "tls": "true",
        "tlsCaFile": mq.tls_cafile,
        "tlsCertFile": mq.tls_client_cert[0],
        "tlsKeyFile": mq.tls_client_cert[1],
    }
    rows = source(spark, mq.namesrv_addr, **options).load().collect()
    assert sorted((r.topic, bytes(r.payload)) for r in rows) == [
        (f"{top}/line/m{i}", b"v%d" % i) for i in range(3)
    ]
    wrong = dict(options, secretKey="not-the-key")
    with pytest.raises(Exception, match="option secretKey: rocketmq_secret_key: the broker") as e:
        source(spark, mq.namesrv_addr, **wrong).load().collect()
    assert mq.acl_password not in str(e.value)


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        ({}, "nameserver"),
        ({"nameserver": "127.0.0.1:1", "topicFilter": "a/#/b"}, "topicFilter"),
        ({"nameserver": "127.0.0.1:1", "maxMessagesPerTrigger": "5"}, "maxMessagesPerTrigger"),
        ({"nameserver": "127.0.0.1:1", "startingOffsets": "soonest"}, "startingOffsets"),
        ({"nameserver": "127.0.0.1:1", "startingOffsets": '{"t": {"b:0": 1.5}}'}, "Offsets"),
        ({"nameserver": "127.0.0.1:1", "pullBatchSize": "0"}, "pullBatchSize"),
        ({"nameserver": "127.0.0.1:1", "path": "/tmp"}, "exactly one"),
    ],
)
def test_bad_options_are_refused_with_a_message_naming_the_option(
    spark: SparkSession, options: dict[str, str], complaint: str
) -> None:
    with pytest.raises(Exception, match=complaint):
        spark.read.format("rocketmq").options(**options).load().count()


def test_a_stream_takes_at_most_max_messages_per_trigger_and_resumes_from_its_checkpoint(
    spark: SparkSession, rocketmq, rocketmq_bridge: BridgeProcess, tmp_path: Path
) -> None:
    top = unique("stm")
    ns = rocketmq.namesrv_addr
    publish_all(rocketmq_bridge.port, [(f"{top}/m", b"a%d" % i) for i in range(30)])

    def run_once() -> list[int]:
        frame = (
            spark.readStream.format("rocketmq")
            .option("nameserver", ns)
            .option("topics", top)
            .option("startingOffsets", "earliest")
            .option("maxMessagesPerTrigger", "7")
            .load()
        )
        query = run_available_now(frame.select("payload", "broker", "queue", "offset"), tmp_path)
        progress.extend(query.recentProgress)
        return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]

    progress: list = []
    first = run_once()
    assert sum(first) == 30 and max(first) <= 7
    # Each batch's progress shows the newest offsets (reportLatestOffset) past its own end.
    (batch, *_) = (p["sources"][0] for p in progress if p["numInputRows"])
    available = sum(json.loads(batch["latestOffset"])[top].values())
    assert available == 30 > sum(json.loads(batch["endOffset"])[top].values())
    publish_all(rocketmq_bridge.port, [(f"{top}/m", b"b%d" % i) for i in range(12)])
    second = run_once()
    assert sum(second) == 12 and max(second) <= 7
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    payloads = Counter(bytes(r.payload) for r in rows)
    expected = {b"a%d" % i for i in range(30)} | {b"b%d" % i for i in range(12)}
    assert set(payloads) == expected and set(payloads.values()) == {1}
    assert len({(r.broker, r.queue, r.offset) for r in rows}) == 42


def test_the_embedded_store_log_is_read_by_the_same_source(
    spark: SparkSession, bridge_factory: Callable[..., BridgeProcess], tmp_path: Path
) -> None:
    # Without client events, the log holds exactly the messages published below (the node's
    # $SYS/.../connected events would be stored too, and read like any message).
    bridge = bridge_factory("client_events=false")
    publisher = unique("emb-")
    publish_all(
        bridge.port,
        [("plant/a", b"1", 1), ("plant/b", b"2", 2), ("other/c", b"3", 1)],
        client_id=publisher,
    )
    data = str(bridge.data_dir)
    rows = spark.read.format("rocketmq").load(data).collect()
    assert sorted((r.topic, bytes(r.payload), r.qos) for r in rows) == [
        ("other/c", b"3", 1),
        ("plant/a", b"1", 1),
        ("plant/b", b"2", 2),
    ]
    assert {r.publisher for r in rows} == {publisher}
    assert {r.broker for r in rows} == {"embedded"}
    filtered = spark.read.format("rocketmq").option("topicFilter", "plant/+").load(data)
    assert filtered.count() == 2

    def stream_once() -> int:
        frame = (
            spark.readStream.format("rocketmq")
            .option("path", data)
            .option("startingOffsets", "earliest")
            .option("maxMessagesPerTrigger", "2")
            .load()
        )
        query = run_available_now(frame.select("topic", "offset"), tmp_path)
        return sum(p["numInputRows"] for p in query.recentProgress)

    assert stream_once() == 3
    publish_all(bridge.port, [("plant/d", b"4"), ("plant/e", b"5")])
    assert stream_once() == 2
    offsets = [r.offset for r in spark.read.parquet(str(tmp_path / "out")).collect()]
    assert len(offsets) == len(set(offsets)) == 5


V5_METADATA = metadata.from_publish(
    {
        0x01: 1,
        0x02: 600,
        0x03: "application/json",
        0x08: "replies/dev-7",
        0x09: b"\x00req-7",
        0x26: [("unit", "kg"), ("line", "L1"), ("unit", "g")],
    }
)
V5_COLUMNS = {
    "payload_format": 1,
    "message_expiry": 600,
    "content_type": "application/json",
    "response_topic": "replies/dev-7",
    "correlation_data": b"\x00req-7",
    "properties": {"unit": "kg", "line": "L1"},
    "user_properties": [("unit", "kg"), ("line", "L1"), ("unit", "g")],
}


def v5_columns(row: Row) -> dict[str, object]:
    return {
        "payload_format": row.payload_format,
        "message_expiry": row.message_expiry,
        "content_type": row.content_type,
        "response_topic": row.response_topic,
        "correlation_data": None if row.correlation_data is None else bytes(row.correlation_data),
        "properties": row.properties,
        "user_properties": [(p.name, p.value) for p in row.user_properties],
    }


def test_mqtt5_metadata_is_read_into_columns_of_its_own_from_rocketmq_and_the_embedded_log(
    spark: SparkSession, rocketmq, tmp_path: Path
) -> None:
    top = unique("v5")
    ns = rocketmq.namesrv_addr
    produce_backend_message(ns, f"{top}/cmd", b"{}", V5_METADATA)
    produce_backend_message(ns, f"{top}/plain", b"x", {})
    rows = {r.topic: r for r in source(spark, ns, topics=top).load().collect()}
    assert v5_columns(rows[f"{top}/cmd"]) == V5_COLUMNS
    plain = v5_columns(rows[f"{top}/plain"])
    assert plain == dict.fromkeys(V5_COLUMNS) | {"properties": {}, "user_properties": []}

    async def write_log() -> None:
        store = FileLogStore(tmp_path / "data")
        await store.open()
        try:
            await store.append(Message("plant/a", b"{}", properties=V5_METADATA), [])
        finally:
            await store.close()

    asyncio.run(write_log())
    [row] = spark.read.format("rocketmq").load(str(tmp_path / "data")).collect()
    assert v5_columns(row) == V5_COLUMNS


def test_a_stream_whose_topic_was_recreated_fails_naming_the_queue_or_reads_it_again(
    spark: SparkSession, rocketmq, bridge_factory: Callable[..., BridgeProcess], tmp_path: Path
) -> None:
    """The topic is deleted and created again on the broker (offsets start over at 0) between
    two runs of a stream on one checkpoint: with failOnDataLoss the run fails naming the queue
    that went back; without it the queue is read again from its start, nothing skipped."""
    top = unique("reset")
    ns = rocketmq.namesrv_addr
    rocketmq.create_topic(top, queues=1)
    bridge_settings = ("store=rocketmq", f"rocketmq_namesrv={ns}", f"rocketmq_namespace={top}")
    first_bridge = bridge_factory(*bridge_settings)
    publish_all(first_bridge.port, [(f"{top}/m", b"old%d" % i) for i in range(5)])
    first_bridge.kill()

    def run_once(fail_on_data_loss: str) -> StreamingQuery:
        frame = (
            spark.readStream.format("rocketmq")
            .option("nameserver", ns)
            .option("topics", top)
            .option("startingOffsets", "earliest")
            .option("failOnDataLoss", fail_on_data_loss)
            .load()
        )
        return run_available_now(frame.select("payload", "queue", "offset"), tmp_path)

    assert sum(p["numInputRows"] for p in run_once("true").recentProgress) == 5
    rocketmq.admin("deleteTopic", "-t", top, "-c", CLUSTER)
    rocketmq.create_topic(top, queues=1)
    second_bridge = bridge_factory(*bridge_settings)
    publish_all(second_bridge.port, [(f"{top}/m", b"new%d" % i) for i in range(3)])

    with pytest.raises(Exception, match=r"went back from 5 to 3"):
        run_once("true")
    run_once("false")

    payloads = sorted(bytes(r.payload) for r in spark.read.parquet(str(tmp_path / "out")).collect())
    assert payloads == sorted([b"old%d" % i for i in range(5)] + [b"new%d" % i for i in range(3)])
