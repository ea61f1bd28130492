"""Fixtures of the Spark tests: one local Spark session for the session, MQTT publishing helpers.

Spark runs in local mode with this interpreter as its Python workers; it reads the real RocketMQ
of the `rocketmq` fixture (deploy/rocketmq) through the `rocketmq` data source.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from spark.session import spark_session
from tests.support.clients import stop_paho
from tests.support.processes import BridgeProcess
from tests.support.rocketmq import LocalRocketMQ


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = spark_session("tests")
    try:
        yield session
    finally:
        session.stop()


def run_available_now(frame: DataFrame, out: Path) -> StreamingQuery:
    """Write a streaming frame to parquet under `out` (data and checkpoint) with the
    availableNow trigger; return the finished query (it must end, without an error)."""
    query = (
        frame.writeStream.format("parquet")
        .option("path", str(out / "out"))
        .option("checkpointLocation", str(out / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(180), "the availableNow query did not finish"
    assert query.exception() is None
    return query


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="package")
def two_groups(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRocketMQ]:
    """A RocketMQ of two broker groups (broker-a, broker-b), started once for the Spark tests
    that need one (~30 s on two cores): they run one after another on one worker."""
    mq = LocalRocketMQ(tmp_path_factory.mktemp("rocketmq-groups"), groups=2, timer=False)
    mq.start()
    try:
        yield mq
    finally:
        mq.stop(graceful=False)


@pytest.fixture
def rocketmq_bridge(bridge_factory: Callable[..., BridgeProcess], rocketmq) -> BridgeProcess:
    """A bridge storing into the session's RocketMQ (its own light-queue namespace)."""
    return bridge_factory(
        "store=rocketmq",
        f"rocketmq_namesrv={rocketmq.namesrv_addr}",
        f"rocketmq_namespace={unique('sp')}",
    )


Publication = tuple[str, bytes] | tuple[str, bytes, int]


def publish_all(port: int, messages: Sequence[Publication], client_id: str | None = None) -> None:
    """Publish over MQTT 3.1.1 (QoS 1 unless given), each acknowledged before the next is sent,
    so all are stored when this returns (QoS 0 ones are stored without being awaited)."""
    client = paho.Client(
        CallbackAPIVersion.VERSION2,
        client_id=client_id or unique("pub-"),
        protocol=paho.MQTTv311,
    )
    connected = threading.Event()
    client.on_connect = lambda *_args: connected.set()
    client.connect("127.0.0.1", port, 30)
    client.loop_start()
    try:
        assert connected.wait(15), f"could not connect to the bridge on port {port}"
        for item in messages:
            topic, payload = item[0], item[1]
            qos = item[2] if len(item) > 2 else 1  # type: ignore[misc]
            info = client.publish(topic, payload, qos=qos)
            info.wait_for_publish(30)
            assert info.is_published(), f"publish to {topic} was not acknowledged"
    finally:
        client.disconnect()
        stop_paho(client)


def produce_backend_message(
    nameserver: str,
    topic: str,
    payload: bytes,
    properties: dict[str, str],
    **security: Any,
) -> None:
    """Send a message straight into RocketMQ as a backend does, with the bridge's mapping:
    `properties` is the stored MQTT 5 metadata (`bridge.storage.metadata`: user properties by
    name, the rest under NUL keys), sent as `mqtt.user.<name>`, `mqtt.content_type`, ...
    `security`: the client's `credentials` and `tls` for a secured RocketMQ."""
    from bridge.storage.base import Message
    from bridge.storage.rocketmq.client import RocketMQClient
    from bridge.storage.rocketmq.mapping import to_rocketmq

    message = Message(
        topic=topic, payload=payload, qos=1, key=unique("backend-"), properties=properties
    )
    rmq_topic, tag, key, props, body = to_rocketmq(message, ())

    async def send() -> None:
        async with RocketMQClient(
            nameserver, client_id=unique("t-"), producer_group="tests", **security
        ) as c:
            await c.send(rmq_topic, body, tags=tag, keys=key, properties=props)

    asyncio.run(send())
