"""The Spark half of `python -m spark.demo`, once the stream has stopped: the back-fill, the
comparison of its tables with the stream's, the tables themselves and the throughput chart.

It runs in the demo's own process with one Spark session (one JVM start instead of three for
separate `spark.jobs backfill` and `show` processes); each step is bounded by cancelling its
Spark jobs when it overruns.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType

from spark.demo_clock import CLOCK_LINE
from spark.demo_servers import DemoError
from spark.job_config import ALL_TABLES, JobConfig
from spark.jobs import read_table, run_backfill, show_tables
from spark.shifts import Shifts
from spark.telemetry import TOPIC_PREFIX

STEP_TIMEOUT: Final = 300.0
"""Bound of each Spark step (back-fill, comparison, show, chart data)."""
SHOW_ROWS: Final = 15
RELATIVE_TOLERANCE: Final = 1e-9
"""Doubles are equal within this: sums of the same numbers in another order (the stream sums
per micro-batch, the back-fill all at once) may differ in the last bits."""


@contextlib.contextmanager
def spark_deadline(spark: SparkSession, seconds: float, what: str) -> Iterator[None]:
    """Bound a Spark step: its jobs are cancelled after `seconds`, and the step then fails with
    a DemoError instead of hanging."""
    expired = threading.Event()

    def cancel() -> None:
        expired.set()
        spark.sparkContext.cancelAllJobs()

    timer = threading.Timer(seconds, cancel)
    timer.daemon = True
    timer.start()
    try:
        yield
    except Exception:
        if expired.is_set():
            raise DemoError(f"{what} did not finish within {seconds:.0f} s") from None
        raise
    finally:
        timer.cancel()


def comparable(frame: DataFrame | None, name: str, open_minute: datetime) -> DataFrame | None:
    """The rows of a table both jobs must agree on: without line ZZ (the clock message, whose
    minute the stream never closes) and without minutes the watermark has not closed."""
    if frame is None:
        return None
    if "line" in frame.columns:
        frame = frame.where(F.col("line") != CLOCK_LINE)
    elif "topic" in frame.columns:
        frame = frame.where(~F.col("topic").startswith(f"{TOPIC_PREFIX}/{CLOCK_LINE}/"))
    if name == "line_minute":
        frame = frame.where(F.col("minute") < F.lit(open_minute))
    return frame


def differences(ours: DataFrame, theirs: DataFrame) -> tuple[int, int]:
    """(rows only in `ours`, rows only in `theirs`), comparing doubles within a relative
    RELATIVE_TOLERANCE and every other column exactly."""
    doubles = [f.name for f in ours.schema.fields if isinstance(f.dataType, DoubleType)]
    exact = [c for c in ours.columns if c not in doubles]
    only = (
        ours.select(*exact).exceptAll(theirs.select(*exact)).count(),
        theirs.select(*exact).exceptAll(ours.select(*exact)).count(),
    )
    if not doubles or only != (0, 0):
        return only

    def unmatched(left: DataFrame, right: DataFrame) -> int:
        a, b = left.alias("a"), right.alias("b")
        same = [F.col(f"a.`{c}`").eqNullSafe(F.col(f"b.`{c}`")) for c in exact]
        for c in doubles:
            x, y = F.col(f"a.`{c}`"), F.col(f"b.`{c}`")
            near = F.abs(x - y) <= RELATIVE_TOLERANCE * F.greatest(F.lit(1.0), F.abs(y))
            same.append(x.eqNullSafe(y) | F.coalesce(near, F.lit(False)))
        condition = same[0]
        for term in same[1:]:
            condition &= term
        return a.join(b, condition, "left_anti").count()

    return unmatched(ours, theirs), unmatched(theirs, ours)


def compare_tables(
    spark: SparkSession, stream: JobConfig, backfill: JobConfig, watermark_ms: int
) -> bool:
    """Print, per table, both row counts and whether the rows are the same (as multisets);
    True when every table agrees."""
    open_minute = datetime.fromtimestamp(watermark_ms // 60_000 * 60, tz=UTC)
    print(f"  {'table':<16} {'stream':>8} {'back-fill':>10}  rows (line {CLOCK_LINE} left out)")
    all_equal = True
    for name in ALL_TABLES:
        ours = comparable(read_table(spark, stream, name), name, open_minute)
        theirs = comparable(read_table(spark, backfill, name), name, open_minute)
        count_ours = ours.count() if ours is not None else 0
        count_theirs = theirs.count() if theirs is not None else 0
        if ours is None or theirs is None:
            verdict = "identical (empty)" if count_ours == count_theirs == 0 else "DIFFERENT"
        elif sorted(ours.columns) != sorted(theirs.columns):
            verdict = f"DIFFERENT columns: {ours.columns} vs {theirs.columns}"
        else:
            only_ours, only_theirs = differences(ours, theirs.select(*ours.columns))
            verdict = (
                "identical"
                if only_ours == only_theirs == 0
                else f"DIFFERENT: {only_ours} rows only in the stream, "
                f"{only_theirs} only in the back-fill"
            )
        all_equal &= verdict.startswith("identical")
        print(f"  {name:<16} {count_ours:>8} {count_theirs:>10}  {verdict}", flush=True)
    return all_equal


def plot_throughput(minutes: pd.DataFrame, path: Path, shifts: Shifts) -> Path:
    """Good parts (top) and scrap rate (bottom) per production line and minute of device time,
    with the shift changes marked, as a PNG. Line ZZ (the clock message) is left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    rows = minutes[minutes["line"] != CLOCK_LINE]
    good = rows.pivot_table(index="minute", columns="line", values="good", aggfunc="sum")
    scrap = rows.pivot_table(index="minute", columns="line", values="scrap_rate", aggfunc="mean")
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    for line in sorted(good.columns):
        top.plot(good.index, good[line], marker=".", label=line)
        if line in scrap.columns:
            bottom.plot(scrap.index, scrap[line] * 100, marker=".", label=line)
    top.set_title("Factory throughput per line and minute (device time)")
    top.set_ylabel("good parts per minute")
    bottom.set_ylabel("scrap rate (%)")
    bottom.set_xlabel("minute of device time (UTC)")
    bottom.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M"))
    first, last = good.index.min(), good.index.max()
    for axes in (top, bottom):
        for begin_ms, _, number in shifts.boundaries(_ms(first), _ms(last) + 1):
            if begin_ms > _ms(first):
                when = pd.Timestamp(begin_ms, unit="ms")
                axes.axvline(when, color="grey", linestyle="--", linewidth=1)
                if axes is top:
                    axes.annotate(
                        f"shift {number} starts",
                        (when, 1.0),
                        xycoords=("data", "axes fraction"),
                        xytext=(4, -12),
                        textcoords="offset points",
                        color="grey",
                    )
        axes.grid(True, alpha=0.3)
        axes.legend(title="line", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def _ms(minute: pd.Timestamp) -> int:
    """Epoch ms of a naive timestamp read from Spark (UTC, the session's time zone)."""
    return int(minute.tz_localize("UTC").timestamp() * 1000)


@contextlib.contextmanager
def stderr_to(log_path: Path) -> Iterator[None]:
    """Point file descriptor 2 at `log_path` while the block runs: a JVM started inside keeps
    it for good, so Spark's start-up warnings and its workers' output go to the log, not to
    the demo's terminal."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(log_path, "ab") as log:
            os.dup2(log.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def report(work: Path, nameserver: str, watermark_ms: int, step: Callable[[str], None]) -> bool:
    """Back-fill, compare, show, chart (steps 5 to 7 of the demo); True when the stream's and
    the back-fill's tables agree."""
    from spark.session import spark_session

    log_path = work / "logs" / "spark.log"
    step(
        f"starting a Spark session for the back-fill, the comparison and the chart (log {log_path})"
    )
    with stderr_to(log_path):
        spark = spark_session("factory-bi-demo", conf={"spark.ui.showConsoleProgress": "false"})
    try:
        stream = JobConfig(out=str(work / "tables"), nameserver=nameserver)
        backfill = JobConfig(out=str(work / "backfill"), nameserver=nameserver)
        step(f"back-fill of every stored message into {backfill.out}")
        with spark_deadline(spark, STEP_TIMEOUT, "the back-fill"):
            counts = run_backfill(spark, backfill, None, None)
        step("back-fill done: " + ", ".join(f"{name} {n}" for name, n in counts.items()))
        step("comparing the stream's tables with the back-fill's")
        with spark_deadline(spark, STEP_TIMEOUT, "the comparison"):
            equal = compare_tables(spark, stream, backfill, watermark_ms)
        step(
            "stream and back-fill agree on every table"
            if equal
            else "stream and back-fill DIFFER (see above)"
        )
        step(f"the stream's tables (python -m spark.jobs show --out {stream.out} --rows 15):")
        with spark_deadline(spark, STEP_TIMEOUT, "showing the tables"):
            show_tables(spark, stream, SHOW_ROWS)
        with spark_deadline(spark, STEP_TIMEOUT, "reading line_minute"):
            table = read_table(spark, stream, "line_minute")
            if table is None:
                raise DemoError("the stream wrote no line_minute rows; nothing to chart")
            minutes = table.toPandas()
        path = plot_throughput(minutes, work / "throughput.png", stream.shifts)
        step(f"chart: {path}")
        return equal
    finally:
        with contextlib.suppress(Exception):
            spark.stop()
