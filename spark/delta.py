"""The BI tables' format: Delta Lake. How the jobs' session gets it, and how the jobs write and
read a table.

A Delta table is a folder of Parquet files and a transaction log (`_delta_log/`) naming which
files make up each version. A write adds a version in one atomic step, so a reader sees a
table as it was before a write or after it, never half of one; a write that replaces rows
(a back-fill, a day of `availability` recomputed) is one such step too. Every table is
partitioned by a date, and small files are compacted as they accumulate (auto compaction after
a write; `OPTIMIZE` does it at once). Table layouts: docs/spark.md.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

DELTA_VERSION = "4.4.0"
"""Delta Lake's release for Spark 4.2 (the `pyspark` the project pins)."""

ARTIFACT = f"io.delta:delta-spark_4.2_2.13:{DELTA_VERSION}"
"""Delta's Maven coordinate; `spark.jars.packages` resolves it from Maven Central when the
jars are not in the local cache."""

SESSION_SETTINGS = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # A partition's small files (one or a few per micro-batch) are compacted once 50 of them
    # have accumulated, by the write that reached that number.
    "spark.databricks.delta.autoCompact.enabled": "true",
    # Reading a table's log is a Spark job of this many tasks. The BI tables' logs are small
    # (checkpointed every 10 commits, their files compacted), and Delta's default of 50 tasks
    # cost each micro-batch's write 5 s on two cores instead of 0.25-0.75 s.
    "spark.databricks.delta.snapshotPartitions": "1",
}
"""What a session needs to read and write Delta tables, set unless the user set them."""


def cache_dir() -> Path:
    """Where `deploy/spark/fetch-delta.sh` (run by `make install-spark`) puts Delta's jars."""
    given = os.environ.get("DELTA_CACHE_DIR")
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mqtt-bridge" / f"delta-{DELTA_VERSION}"


def jar_settings() -> dict[str, str]:
    """`spark.jars` naming the cached jars when they are there, else `spark.jars.packages`
    (Spark downloads Delta and what it needs from Maven Central at start)."""
    jars = sorted(str(p) for p in cache_dir().glob(f"*-{DELTA_VERSION}.jar"))
    if len(jars) >= 2 and (cache_dir() / ".complete").exists():
        return {"spark.jars": ",".join(jars)}
    return {"spark.jars.packages": ARTIFACT}


# --- writing -------------------------------------------------------------------------------


def append_batch(frame: DataFrame, path: str, partition: str, app_id: str, batch_id: int) -> None:
    """A micro-batch's rows appended as one version, at most once: Delta records `batch_id`
    for `app_id` in the same commit, and skips a write of a batch id it has recorded (a batch
    Spark replays after a crash)."""
    (
        frame.write.format("delta")
        .mode("append")
        .partitionBy(partition)
        .option("txnAppId", app_id)
        .option("txnVersion", batch_id)
        .save(path)
    )


def ensure_table(spark: SparkSession, path: str, schema: StructType, partition: str) -> None:
    """An empty table of `schema` at `path` unless one is there, so that a stream can read it
    before anything was written."""
    if read(spark, path) is None:
        empty = spark.createDataFrame([], schema)
        empty.write.format("delta").mode("append").partitionBy(partition).save(path)


def replace_table(frame: DataFrame, path: str, partition: str) -> None:
    """The whole table replaced by `frame` in one version (its schema too). An empty frame
    leaves an empty table with the frame's columns."""
    (
        frame.write.format("delta")
        .mode("overwrite")
        .option("overwriteSchema", "true")
        .partitionBy(partition)
        .save(path)
    )


def replace_partitions(frame: DataFrame, path: str, partition: str, values: list[str]) -> None:
    """The rows whose `partition` is one of `values` replaced by `frame` in one version; a
    value `frame` has no rows for is left empty. `frame` must hold only such rows."""
    quoted = ", ".join("'" + value.replace("'", "''") + "'" for value in values)
    (
        frame.write.format("delta")
        .mode("overwrite")
        .option("replaceWhere", f"{partition} IN ({quoted})")
        .partitionBy(partition)
        .save(path)
    )


def query_app_id(spark: SparkSession, checkpoint: str, table: str) -> str:
    """The id under which a streaming query's foreachBatch writes record their batch ids in
    `table`: the query's id, which Spark keeps in its checkpoint (`metadata`) from its first
    start, with the table's name. A new checkpoint is a new query whose batch ids start again
    at 0: the id changes with it, so none of its batches is taken for one already written."""
    line = spark.read.text(f"{checkpoint}/metadata").first()
    if line is None:
        raise RuntimeError(f"no streaming query metadata in {checkpoint}")
    return f"{json.loads(line[0])['id']}:{table}"


# --- reading -------------------------------------------------------------------------------


def read(spark: SparkSession, path: str) -> DataFrame | None:
    """The table's newest version, or None where no table has been written."""
    try:
        return spark.read.format("delta").load(path)
    except AnalysisException as exc:
        if _not_a_table(exc):
            return None
        raise


def _not_a_table(exc: AnalysisException) -> bool:
    text = str(exc)
    return (
        "PATH_NOT_FOUND" in text
        or "DELTA_MISSING_DELTA_TABLE" in text
        or ("is not a Delta table" in text)
    )


class TableState(NamedTuple):
    """Where a table stands: its newest version, when that was committed (UTC), how many files
    it reads, the newest event time (or date) it holds (None when empty), and the columns it
    is partitioned by."""

    name: str
    version: int
    committed: datetime
    files: int
    newest: str | None
    partitioned_by: tuple[str, ...]


def table_state(spark: SparkSession, name: str, path: str, time_column: str) -> TableState | None:
    """The state of the table at `path`, None where none was written. Each query writes its
    tables on its own trigger, so the tables stand at different points: comparing their
    `newest` shows how far each is behind the others."""
    frame = read(spark, path)
    if frame is None:
        return None
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").first()
    assert detail is not None and history is not None
    newest = frame.agg(F.max(time_column)).first()
    stamp = newest[0] if newest is not None else None
    if isinstance(stamp, datetime):
        stamp = stamp.isoformat()
    committed = history["timestamp"]
    return TableState(
        name,
        int(history["version"]),
        committed.replace(tzinfo=UTC) if committed.tzinfo is None else committed,
        int(detail["numFiles"]),
        None if stamp is None else str(stamp),
        tuple(detail["partitionColumns"]),
    )
