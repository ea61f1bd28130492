"""The BI jobs on a real Spark standalone cluster, submitted as a user does.

deploy/spark starts a master and a worker from PySpark's own distribution, each in its own JVM;
the worker starts the executors, each a JVM of its own with its Python workers; the jobs go
through deploy/spark/submit.sh (spark-submit, the packages shipped as --py-files) and read a
RocketMQ of two broker groups, filled through a bridge.

The stream job loses an executor (kill -9: the worker starts another and Spark runs the lost
tasks again), then its driver (kill -9 of spark-submit's process group, mid-stream); a second
run on the same checkpoints finishes what is stored. Every table must then equal the
independent calculation of `factory_day`, nothing lost or counted twice. A back-fill on the
cluster gives the same tables. A stranger without the cluster's secret gets nothing from the
master.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bridge.storage.rocketmq.groups import BrokerGroups
from bridge.storage.rocketmq.mapping import rocketmq_topic
from tests.spark.conftest import publish_all, unique
from tests.spark.factory_day import (
    CALENDAR_ARGS,
    actual_tables,
    expected_tables,
    telemetry,
    without_open_minute,
)
from tests.spark.job_process import commits, kill_group, wait_for
from tests.support.ports import free_port
from tests.support.processes import BridgeProcess
from tests.support.rocketmq import LocalRocketMQ

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(1500)]

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "spark"


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int]]:
    """A master and one worker (deploy/spark/start.sh): their data folder and the master's
    port. Stopped (workers, their executors, the master) by deploy/spark/stop.sh."""
    data, port = tmp_path_factory.mktemp("spark-standalone"), free_port()
    env = {**os.environ, "SPARK_WORKER_CORES": "2", "SPARK_WORKER_MEMORY": "2g"}
    try:
        started = subprocess.run(
            [DEPLOY / "start.sh", data, str(port), "1"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert started.returncode == 0, f"start.sh failed:\n{started.stdout}\n{started.stderr}"
        yield data, port
    finally:
        subprocess.run([DEPLOY / "stop.sh", data], check=False, timeout=120)


def submit(cluster: Path, log: Path, *job: str) -> subprocess.Popen:
    """A job of spark/jobs.py through deploy/spark/submit.sh, in its own process group (the
    spark-submit JVM and the Python driver it starts)."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            [DEPLOY / "submit.sh", cluster, *job],
            stdout=subprocess.DEVNULL,
            stderr=out,
            start_new_session=True,
        )


def executors(cluster: Path) -> list[int]:
    """PIDs of the executor JVMs the cluster's worker runs."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
            if b"CoarseGrainedExecutorBackend" not in command:
                continue
            where = (entry / "cwd").resolve()  # the worker starts it in its app's folder
        except OSError:
            continue
        if where.is_relative_to(cluster):
            found.append(int(entry.name))
    return found


STRANGER = """
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("spark://127.0.0.1:{port}").appName("stranger").getOrCreate()
print("rows:", spark.range(10).count())
"""


@pytest.fixture
def published(
    bridge_factory: Callable[..., BridgeProcess], two_groups: LocalRocketMQ
) -> tuple[str, list[tuple[str, bytes]], list[dict]]:
    bridge = bridge_factory(
        "store=rocketmq",
        f"rocketmq_namesrv={two_groups.namesrv_addr}",
        f"rocketmq_namespace={unique('sc')}",
    )
    # Two sites, whose RocketMQ topics (their first levels) the bridge stores on different
    # groups: line L1 at the first, line L2 (and the device with the fast clock) at the second.
    site_a = unique("cla")
    site_b = next(
        site for site in (unique("clb") for _ in range(200)) if group_of(site) != group_of(site_a)
    )
    messages, valid = telemetry(site_a)
    messages = [
        (topic if "/L1/" in topic else site_b + topic[len(site_a) :], payload)
        for topic, payload in messages
    ]
    publish_all(bridge.port, messages, client_id=unique("plant-gw-"))
    return "+", messages, valid


def group_of(site: str) -> str | None:
    """The broker group the bridge stores the topics of `site` on (`BrokerGroups.pick`)."""
    return BrokerGroups().pick(rocketmq_topic(site), ("broker-a", "broker-b"))


def test_jobs_on_a_standalone_cluster_lose_no_row_to_a_killed_executor_or_driver(
    spark: SparkSession,
    two_groups: LocalRocketMQ,
    standalone: tuple[Path, int],
    published: tuple[str, list[tuple[str, bytes]], list[dict]],
    tmp_path: Path,
) -> None:
    cluster, port = standalone
    top, messages, valid = published
    source = ["--nameserver", two_groups.namesrv_addr, "--topic-filter", f"{top}/+/+/telemetry",
              *CALENDAR_ARGS]  # fmt: skip
    brokers = (
        spark.read.format("rocketmq")
        .option("nameserver", two_groups.namesrv_addr)
        .option("topicFilter", f"{top}/+/+/telemetry")
        .load()
        .agg(F.collect_set("broker"))
        .first()[0]
    )
    assert sorted(brokers) == ["broker-a", "broker-b"], "the messages are on both groups"

    # A stranger, meanwhile: an application without the secret is refused by the master.
    stranger_script = tmp_path / "stranger.py"
    stranger_script.write_text(STRANGER.format(port=port))
    spark_submit = Path(sys.executable).parent / "spark-submit"
    stranger_log = tmp_path / "stranger.log"
    with open(stranger_log, "wb") as out:
        stranger = subprocess.Popen(
            [spark_submit, "--master", f"spark://127.0.0.1:{port}", stranger_script],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    out, ck, log = tmp_path / "bi", tmp_path / "ck", tmp_path / "stream.log"
    stream = [*source, "--out", str(out), "--checkpoint", str(ck)]
    per_trigger = 40
    job = submit(cluster, log, "stream", *stream, "--trigger", "1",
                 "--max-per-trigger", str(per_trigger))  # fmt: skip
    try:
        wait_for(lambda: commits(ck, "intervals") >= 1, 600, "a committed micro-batch", job, log)
        lost = executors(cluster)
        assert lost, "no executor JVM of the cluster's worker"
        os.kill(lost[0], signal.SIGKILL)
        done = commits(ck, "intervals")
        wait_for(
            lambda: commits(ck, "intervals") > done and executors(cluster),
            480,
            "a micro-batch on the executor that replaced the killed one",
            job,
            log,
        )
        assert lost[0] not in executors(cluster)
    finally:
        kill_group(job)  # the driver, mid-stream
    done = commits(ck, "intervals")
    assert done * per_trigger < len(messages), "the job was not stopped part-way"
    rerun = submit(cluster, log, "stream", *stream, "--available-now")
    try:
        assert rerun.wait(600) == 0, log.read_text(errors="replace")[-3000:]
    finally:
        kill_group(rerun)
    expected = expected_tables(valid, messages)
    actual = actual_tables(spark, out)
    streamed = dict(expected, line_minute=without_open_minute(expected["line_minute"]))
    for name, table in streamed.items():
        assert actual[name] == table, name

    backfill = submit(cluster, log, "backfill", *source, "--out", str(tmp_path / "bf"))
    try:
        assert backfill.wait(600) == 0, log.read_text(errors="replace")[-3000:]
    finally:
        kill_group(backfill)
    actual = actual_tables(spark, tmp_path / "bf")
    for name, table in expected.items():
        assert actual[name] == table, name

    # The executors ran in the worker's JVMs, with the packages spark-submit shipped them.
    shipped = list((cluster / "work-1").glob("app-*/*/factory-bi.zip"))
    assert len({p.parent.parent for p in shipped}) == 3, shipped  # three applications

    try:
        assert stranger.wait(300) != 0
    finally:
        kill_group(stranger)
    said = stranger_log.read_text(errors="replace")
    assert "SaslMessage" in said or "Authentication" in said, said[-2000:]
    assert "rows:" not in said
