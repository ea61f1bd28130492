"""The Spark session of the jobs and tests, with the `rocketmq` source registered: local by
default, or on the cluster `spark-submit` names."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark import SparkConf
from pyspark.sql import SparkSession

from spark import delta
from spark.source import RocketMQDataSource

DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    **delta.SESSION_SETTINGS,
}
"""Settings the jobs want unless the user set them (on spark-submit's command line or in its
properties file)."""

LOCAL_DEFAULTS = {"spark.driver.memory": "1g"}
"""Settings of a local session only: on a cluster spark-submit sizes the driver, and its
`--jars` or `--packages` bring Delta Lake (the driver's JVM has started by the time this runs,
too late to add jars to it)."""


def submitted() -> bool:
    """Whether this Python process was started by spark-submit, whose JVM it talks to (and
    which has set the master, the driver's memory and the executors' cores already)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def spark_session(
    app: str = "factory-bi",
    *,
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A Spark session that can read `format("rocketmq")` and read and write Delta tables.

    Started by spark-submit (`spark-submit --master spark://HOST:7077 spark/jobs.py ...`), the
    session runs where spark-submit says, with what it set; only settings it left unset get
    `DEFAULTS`. Otherwise (`python -m spark.jobs`, the tests) it is local (`master`, default
    `local[*]`) and Python workers run this interpreter, so they import the same packages (the
    bridge's remoting client, pyarrow). Times are UTC: device timestamps are epoch
    milliseconds, and shifts and minutes in the tables are cut in UTC unless a job says
    otherwise.
    """
    builder = SparkSession.builder.appName(app)
    settings = dict(DEFAULTS)
    if submitted():
        given = SparkConf()  # spark-submit's settings, read from its JVM
        settings = {key: value for key, value in settings.items() if not given.contains(key)}
        if master:
            builder = builder.master(master)
    else:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        builder = builder.master(master or "local[*]")
        settings.update(LOCAL_DEFAULTS)
        settings.update(delta.jar_settings())
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    session.dataSource.register(RocketMQDataSource)
    return session
