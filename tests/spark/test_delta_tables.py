"""The BI tables as Delta tables (spark/delta.py), on the local Spark session: a replayed
micro-batch is written once, a reader never sees half of a replaced table, small files are
compacted, and the tables say where they stand."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark import delta


def rows(spark: SparkSession, n: int, day: str = "2026-03-08", files: int = 1) -> DataFrame:
    frame = spark.range(n).withColumn("date", F.lit(day))
    return frame.repartition(files)


def checkpoint(tmp_path: Path, name: str, query_id: str) -> Path:
    """A streaming checkpoint's `metadata`, as Spark writes it at a query's first start."""
    ck = tmp_path / name
    ck.mkdir()
    (ck / "metadata").write_text(json.dumps({"id": query_id}) + "\n")
    return ck


def test_a_replayed_micro_batch_is_appended_once_and_a_new_checkpoints_batch_zero_is_not_skipped(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = str(tmp_path / "telemetry")
    first = delta.query_app_id(spark, str(checkpoint(tmp_path, "ck1", "q-1")), "telemetry")
    assert first == "q-1:telemetry"
    delta.append_batch(rows(spark, 10), path, "date", first, 0)
    delta.append_batch(rows(spark, 10), path, "date", first, 1)
    # Spark replays batch 1 after a crash that came after its commit: nothing is added.
    delta.append_batch(rows(spark, 10), path, "date", first, 1)
    assert spark.read.format("delta").load(path).count() == 20
    # A fresh checkpoint is a new query, whose batch ids start at 0 again: they count.
    second = delta.query_app_id(spark, str(checkpoint(tmp_path, "ck2", "q-2")), "telemetry")
    delta.append_batch(rows(spark, 5), path, "date", second, 0)
    assert spark.read.format("delta").load(path).count() == 25


def test_a_reader_sees_the_old_table_or_the_new_one_while_a_back_fill_replaces_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = str(tmp_path / "line_minute")
    delta.replace_table(rows(spark, 2_000, files=8), path, "date")
    seen: list[int] = []
    done = threading.Event()

    def read_meanwhile() -> None:
        # Bounded: the replacements below take seconds, not minutes.
        for _ in range(500):
            seen.append(spark.read.format("delta").load(path).count())
            if done.is_set():
                return

    reader = threading.Thread(target=read_meanwhile)
    reader.start()
    try:
        for _ in range(3):
            delta.replace_table(rows(spark, 3_000, "2026-03-09", files=8), path, "date")
            delta.replace_table(rows(spark, 2_000, files=8), path, "date")
    finally:
        done.set()
        reader.join(120)
    assert seen and set(seen) <= {2_000, 3_000}, sorted(set(seen))


def test_replacing_days_of_a_table_leaves_the_other_days_and_empties_a_day_without_rows(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = str(tmp_path / "availability")
    days = ["2026-03-07", "2026-03-08", "2026-03-09"]
    delta.replace_partitions(
        rows(spark, 4, days[0]).union(rows(spark, 4, days[1])), path, "date", days[:2]
    )
    # A recompute of the 8th and 9th: the 8th now has 6 rows, the 9th none; the 7th stays.
    delta.replace_partitions(rows(spark, 6, days[1]), path, "date", days[1:])
    counts = {r["date"]: r["count"] for r in
              spark.read.format("delta").load(path).groupBy("date").count().collect()}  # fmt: skip
    assert counts == {days[0]: 4, days[1]: 6}


def test_small_files_of_micro_batches_are_compacted_as_they_accumulate(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = str(tmp_path / "quarantine")
    key = "spark.databricks.delta.autoCompact.minNumFiles"
    spark.conf.set(key, "4")  # the default, 50, in fewer writes
    try:
        for batch in range(6):
            delta.append_batch(rows(spark, 10), path, "date", "q:quarantine", batch)
    finally:
        spark.conf.unset(key)
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()
    assert detail is not None and detail["numFiles"] < 4, detail["numFiles"]
    assert detail["partitionColumns"] == ["date"]
    assert spark.read.format("delta").load(path).count() == 60


def test_a_table_never_written_reads_as_none_and_a_written_one_says_where_it_stands(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = str(tmp_path / "telemetry")
    assert delta.read(spark, path) is None
    assert delta.table_state(spark, "telemetry", path, "ts") is None
    frame = spark.createDataFrame(
        [("2026-03-08", "2026-03-08 05:00:00"), ("2026-03-08", "2026-03-08 05:00:07")],
        "date STRING, ts STRING",
    ).withColumn("ts", F.to_timestamp("ts"))
    delta.append_batch(frame.coalesce(1), path, "date", "q:telemetry", 0)
    delta.append_batch(frame.coalesce(1), path, "date", "q:telemetry", 1)
    state = delta.table_state(spark, "telemetry", path, "ts")
    assert state is not None
    assert (state.version, state.files, state.newest) == (1, 2, "2026-03-08T05:00:07")
