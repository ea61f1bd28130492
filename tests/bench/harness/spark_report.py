"""The Spark benchmark's report: batch read rates, end-to-end delays, micro-batch durations and
CPU per process as plain-text tables, printed and written as spark-bench.{json,md} with the
summary block for docs/performance.md. There is no Mosquitto counterpart, so no ratio."""

from __future__ import annotations

import json
from typing import Any

from tests.bench.harness.common import RESULTS_DIR, log
from tests.bench.harness.report import fmt_rate, fmt_s, plain_table
from tests.bench.harness.spark import GOAL_S, TRIGGER_S, WATERMARK_S, ReadResult

RESULT_PREFIX = "spark-bench"


def read_table(results: list[ReadResult]) -> str:
    """The batch reads as a plain-text table."""
    runs = max(len(r.seconds) for r in results)
    head = ["read", "partitions", *(f"run {i + 1} msg/s" for i in range(runs)), "median msg/s"]
    body = [
        [
            r.name,
            str(r.partitions) if r.partitions is not None else "?",
            *(fmt_rate(v) for v in r.rates()),
            fmt_rate(r.median_rate()),
        ]
        for r in results
    ]
    return plain_table(head, body, right=set(range(1, len(head))))


def backfill_table(runs: list[dict[str, Any]]) -> str:
    """The timed back-fills as a plain-text table (msg/s over wall time, and over the job's own
    time where spark-submit's start-up is in the wall time)."""
    count = max(len(r["seconds"]) for r in runs)
    head = ["back-fill", *(f"run {i + 1} msg/s" for i in range(count)), "median msg/s",
            "median, job's own time"]  # fmt: skip
    body = [
        [
            r["where"],
            *(fmt_rate(r["messages"] / s) if s else "failed" for s in r["seconds"]),
            fmt_rate(r["median_rate"]),
            fmt_rate(r["median_job_rate"]),
        ]
        for r in runs
    ]
    return plain_table(head, body, right=set(range(1, len(head))))


def batch_table(batches: dict[str, dict[str, Any]]) -> str:
    """Micro-batch durations per query as a plain-text table."""
    head = ["query", "batches", "p50 s", "p95 s", "max s"]
    body = [
        [q, str(s["count"]), *(fmt_s(s[k], 1) for k in ("p50", "p95", "max"))]
        for q, s in batches.items()
    ]
    return plain_table(head, body, right={1, 2, 3, 4})


def delay_table(delays: dict[str, dict[str, Any]]) -> str:
    """The end-to-end delays as a plain-text table."""
    head = ["rows", "count", "p50 s", "p95 s", "p99 s", "max s", f"≤ {GOAL_S:.0f} s"]
    body = [
        [
            name,
            str(s["count"]),
            *(fmt_s(s[k]) for k in ("p50", "p95", "p99", "max")),
            "—" if s["within"] is None else f"{100 * s['within']:.1f}%",
        ]
        for name, s in delays.items()
    ]
    return plain_table(head, body, right=set(range(1, len(head))))


def cpu_table(cpu: dict[str, float | None], window: float) -> str:
    """CPU seconds per process over the end-to-end window, and as % of one core."""
    head = ["process", "CPU s", "% of one core"]
    body = [
        [name, fmt_s(v, 1), "—" if v is None else f"{100 * v / window:.0f}%"]
        for name, v in cpu.items()
    ]
    return plain_table(head, body, right={1, 2})


def report(meta: dict[str, Any], results: dict[str, Any], send_window: int) -> None:
    """Print the tables and the summary block; write spark-bench.{json,md}."""
    md = [
        f"Spark benchmark (tests/bench/spark_bench.py) {meta['started_at']}, {meta['cpus']} "
        f"CPUs shared with other work, load average {meta['loadavg_start']} at the start and "
        f"{meta['loadavg_end']} at the end.",
        "",
        f"- command: `{meta['command']}`",
        "- no ratio: Mosquitto has no counterpart of a Spark source",
    ]
    if "backfills" in results:
        table = backfill_table(results["backfills"])
        messages = results["backfills"][0]["messages"]
        log(f"\nback-fill of {messages:,} stored messages (spark.jobs backfill, every table):")
        log(table)
        md += ["", f"Back-fill of {messages:,} stored messages, every BI table:", "", "```",
               table, "```"]  # fmt: skip
    if "reads" in results:
        p, w = results["produce"], results["filelog_write"]
        reads = [
            ReadResult(r["name"], r["partitions"], r["seconds"], r["rows"])
            for r in results["reads"]
        ]
        table = read_table(reads)
        log("\nbatch reads into the noop sink (msg/s; run 1 follows a count() warm-up):")
        log(table)
        md += [
            f"- produced {p['sent']:,} telemetry messages into RocketMQ at {p['rate']:,.0f} msg/s "
            f"({send_window} sends in flight, one client); FileLogStore wrote them at "
            f"{w['rate']:,.0f} msg/s; payloads {p['payload_bytes'] / max(1, p['sent']):.0f} B "
            "on average (spark.telemetry.Device)",
            "",
            "```",
            table,
            "```",
        ]
    if "e2e" in results:
        e = results["e2e"]
        log(f"\nend to end (device publish -> row in the table), {e['window_s']:.0f} s window:")
        log(f"    simulator: {e['simulator_summary']}")
        log(
            f"    telemetry: {e['telemetry_rows']:,} rows ({e['telemetry_distinct']:,} distinct "
            f"device/seq) in {e['telemetry_files']} files from {e['devices_seen']} devices; "
            f"acked by the bridge: {e['acked']}; missing before a device's first row: "
            f"{e['missing_at_start']}"
        )
        delays = delay_table(e["delays"])
        log(delays)
        log(
            f"    micro-batches longer than the {TRIGGER_S} s trigger (Spark's 'falling behind' "
            f"warning, all queries): {e['batches_behind']}, slowest "
            f"{e['slowest_behind_s']:.1f} s"
        )
        batches = batch_table(e["batches"])
        log("micro-batch durations in the window (checkpoint offsets/N -> commits/N):")
        log(batches)
        ingest = e["ingest"]
        log(
            f"    of which publish -> stored in RocketMQ (store_time - ts): p50 "
            f"{fmt_s(ingest['p50'], 3)} s, p95 {fmt_s(ingest['p95'], 3)} s, "
            f"max {fmt_s(ingest['max'], 3)} s"
        )
        log(
            f"    line_minute: a minute is appended only after the watermark ({WATERMARK_S} s of "
            "device time) passes its end, so it lags by design (≈ watermark + trigger)"
        )
        cpu = cpu_table(e["cpu_s"], e["window_s"])
        log(
            "CPU over the window (stream job = driver JVM + Python workers; "
            "machine 200% = both cores):"
        )
        log(cpu)
        log(
            f"    load average {e['load_start']} at the start of the window, "
            f"{e['load_end']} at the end"
        )
        md += [
            "",
            f"End to end: `{e['simulator_command']}` against a bridge (store=rocketmq) and "
            f"`{e['job_command']}` (job start-up {e['job_start_s']:.0f} s); "
            f"{e['telemetry_rows']:,} telemetry rows, load average {e['load_start']} -> "
            f"{e['load_end']}:",
            "",
            "```",
            delays,
            "",
            cpu,
            "",
            batches,
            "```",
            "",
            f"Micro-batches longer than the trigger: {e['batches_behind']} (slowest "
            f"{e['slowest_behind_s']:.1f} s). A line_minute row is appended once the watermark "
            f"({WATERMARK_S} s) passes its minute's end: it lags by design.",
        ]
    if "error" in results:
        md += ["", f"Error: {results['error']}"]
    text = "\n".join(md) + "\n"
    log(f"\ncpus {meta['cpus']}, load average {meta['loadavg_start']} -> {meta['loadavg_end']}, "
        f"total {meta['wall_s']:.0f} s")  # fmt: skip
    log("There is no Mosquitto equivalent of a Spark source, so no ratio is printed.")
    log("\n--- summary for docs/performance.md ---")
    log(text.rstrip())
    (RESULTS_DIR / f"{RESULT_PREFIX}.md").write_text(text)
    doc = {"meta": meta, "results": results}
    (RESULTS_DIR / f"{RESULT_PREFIX}.json").write_text(
        json.dumps(doc, indent=2, default=str) + "\n"
    )
