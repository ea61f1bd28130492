"""A local Spark session with the `rocketmq` source registered, as the jobs and tests use it."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from spark.source import RocketMQDataSource


def spark_session(
    app: str = "factory-bi",
    *,
    master: str = "local[2]",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A Spark session (local mode by default) that can read `format("rocketmq")`.

    Python workers run this interpreter, so they import the same packages (the bridge's remoting
    client, pyarrow). Times are UTC: device timestamps are epoch milliseconds, and shifts and
    minutes in the tables are cut in UTC unless a job says otherwise.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.appName(app)
        .master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    session.dataSource.register(RocketMQDataSource)
    return session
