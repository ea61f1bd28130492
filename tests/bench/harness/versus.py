"""Brokers side by side (run_bench.py): one broker at a time through a list of scenarios, with
the broker's (and RocketMQ's) CPU and RSS, the loadgen's and the rest of the machine's over
every run; then one comparison row per scenario and metric with the ratio to Mosquitto, the CPU
and RSS table of the RocketMQ set and the issue's targets, printed and written as JSON and
Markdown."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from tests.bench.harness.common import HOST, Budget, log, tail, write_results
from tests.bench.harness.loadgen import Scenario, run_loadgen
from tests.bench.harness.processes import Broker
from tests.bench.harness.procfs import (
    CpuWindow,
    loadavg,
    machine_busy_s,
    proc_cpu,
    proc_group_cpu,
    proc_rss_mb,
)
from tests.bench.harness.report import (
    MISSING,
    ReportSection,
    completed,
    fmt_pct,
    fmt_ratio,
    fmt_val,
    get_path,
    log_section,
    md_table,
    payload_label,
    plain_table,
    rate_not_held,
    result_value,
)
from tests.bench.harness.rocketmq import ROCKETMQ_VARIANT, RocketMQBridge


@dataclass(frozen=True)
class BrokerScenario(Scenario):
    """A scenario of the side-by-side comparison and the brokers it runs on."""

    subs: int
    # "main": the original ours-vs-Mosquitto set; "rocketmq": the QoS 1 set that also runs
    # on ours-rocketmq (throughput runs record latency too, loadgen -stamp).
    group: str = "main"
    brokers: tuple[str, ...] = ("ours", "mosquitto")
    pubs: int = 1


# (title, scenario key, path in its result, higher_is_better, target value)
Target = tuple[str, str, str, bool, float]

# --------------------------------------------------------------------------- running


def bench_broker(
    b: Broker,
    scenarios: list[BrokerScenario],
    loadgen: Path,
    client: str,
    warmups: list[dict[str, str]],
    budget_s: float,
    more: Mapping[str, Callable[[Broker], dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """Start `b`, run the unreported warm-ups, then every scenario for it within the budget
    (counted once it accepts connections); the results, per scenario. Then each of `more`
    (further runs with a budget of their own, e.g. the protocol comparison), its result under
    its key. Raises if it does not start; the caller stops it."""
    out: dict[str, Any] = {
        "status": "ok",
        "command": shlex.join(b.cmd),
        "port": b.port,
        "scenarios": {},
        "errors": [],
    }
    if "config" in b.extra:
        out["config"] = b.extra["config"]
    scenarios = [sc for sc in scenarios if b.name in sc.brokers]
    rmq = b if isinstance(b, RocketMQBridge) else None
    log(f"\n=== {b.name}: {shlex.join(b.cmd)}")
    t_start = time.monotonic()
    try:
        b.start()
    finally:
        if rmq is not None:
            out["rocketmq"] = rmq.info()
    b.wait_ready()
    assert b.proc is not None
    pgid = b.proc.pid
    log(f"    listening on {HOST}:{b.port} (pid {pgid})")
    # The budget counts from here: RocketMQ's start-up (ours-rocketmq) is not part of it.
    budget = Budget(budget_s)
    for i, wa in enumerate(warmups):
        res, _ = run_loadgen(loadgen, b.port, wa, client, 30)
        if res.get("errors"):
            log(f"    warm-up {i} reported: {res['errors']}")
        elif rmq is not None:
            log(f"    warm-up {i}: {res.get('msgs_per_s', 0):,.0f} msg/s")
    for sc in scenarios:
        if skipped := budget.skip(sc.key, sc.timeout_s):
            out["scenarios"][sc.key] = skipped
            continue
        if not b.alive():
            out["scenarios"][sc.key] = {"skipped": "broker is not running"}
            log(f"    {sc.key:<22} skipped (broker died)")
            continue
        rpid = rmq.rocketmq_pid() if rmq is not None else None
        window = CpuWindow(
            {
                "machine": machine_busy_s,
                "broker": partial(proc_group_cpu, pgid),
                "rocketmq": partial(proc_cpu, rpid),
            }
        )
        res, cmd = run_loadgen(loadgen, b.port, sc.args, client, sc.timeout_s + 20)
        window.close()
        res["loadgen_cmd"] = shlex.join(cmd)
        record_usage(res, window, pgid, rpid)
        out["scenarios"][sc.key] = res
        log("    " + describe(sc, res))
        if not b.alive():
            msg = (
                f"{b.name} died during {sc.key} (code {b.proc.returncode}); "
                f"log tail:\n{tail(b.log_path)}"
            )
            out["errors"].append(msg)
            log("    " + msg)
    for key, runs in (more or {}).items():
        out[key] = runs(b)
    out["wall_s"] = round(time.monotonic() - t_start, 1)
    return out


def record_usage(res: dict[str, Any], window: CpuWindow, pgid: int, rpid: int | None) -> None:
    """Add the broker's CPU and RSS (and the RocketMQ broker JVM's, its own process outside the
    bridge's group), the machine's and the other processes' CPU over the run to its result."""
    broker = window.used("broker") or 0.0
    res["broker_cpu_s"] = round(broker, 3)
    res["broker_cpu_percent"] = round(window.percent(broker), 1)
    res["broker_rss_mb"] = proc_rss_mb(pgid)
    rocketmq = window.used("rocketmq")
    if rpid is not None and rocketmq is not None:
        res["rocketmq_cpu_s"] = round(rocketmq, 3)
        res["rocketmq_cpu_percent"] = round(window.percent(rocketmq), 1)
        res["rocketmq_rss_mb"] = proc_rss_mb(rpid)
    # Whole machine (2 cores = 200%) and what other processes used meanwhile: the noise.
    machine = window.used("machine") or 0.0
    ours_s = broker + (res.get("rocketmq_cpu_s") or 0.0)
    res["machine_cpu_percent"] = round(window.percent(machine), 1)
    others = machine - ours_s - float(res.get("loadgen_cpu_s") or 0.0)
    res["others_cpu_percent"] = round(max(0.0, window.percent(others)), 1)
    res["loadavg_after"] = loadavg()


def describe(sc: BrokerScenario, r: dict[str, Any]) -> str:
    """The progress line of one run."""
    errs = r.get("errors") or []
    err = f"  ERRORS: {'; '.join(errs)}" if errs else ""
    if not completed(r):
        return f"{sc.key:<24} FAILED{err}"
    rmq = (
        f" rocketmq {r['rocketmq_cpu_percent']:.0f}% ({r.get('rocketmq_rss_mb') or 0:.0f} MB)"
        if "rocketmq_cpu_percent" in r
        else ""
    )
    lat = r.get("latency") or {}
    if sc.mode == "throughput":
        lost = f" lost {r['lost']}" if r.get("lost") else ""
        latp = f" p50 {lat.get('p50_ms', 0):.2f} p99 {lat.get('p99_ms', 0):.2f} ms" if lat else ""
        return (
            f"{sc.key:<24} {r['msgs_per_s']:>11,.0f} msg/s{latp}  delivered {r['delivered']:,}/"
            f"{r['expected']:,}{lost} in {r['elapsed_s']:.2f}s ({r['stop_reason']}) "
            f"cpu loadgen {r['loadgen_cpu_percent']:.0f}% broker "
            f"{r['broker_cpu_percent']:.0f}%{rmq}{err}"
        )
    return (
        f"{sc.key:<24} p50 {lat.get('p50_ms', 0):.3f} p90 {lat.get('p90_ms', 0):.3f} "
        f"p99 {lat.get('p99_ms', 0):.3f} max {lat.get('max_ms', 0):.3f} ms  "
        f"({lat.get('samples', 0):,} samples, lost {r.get('lost', 0)}, "
        f"late sends {r.get('late_sends', 0)}) cpu broker {r['broker_cpu_percent']:.0f}%"
        f"{rmq}{err}"
    )


# --------------------------------------------------------------------------- comparing


def scenario_result(brokers: dict[str, Any], name: str, key: str) -> dict[str, Any]:
    return dict(brokers.get(name, {}).get("scenarios", {}).get(key, {}))


def comparison_rows(
    scenarios: list[BrokerScenario], brokers: dict[str, Any]
) -> list[dict[str, Any]]:
    """One row per scenario and metric, with every broker that runs the scenario.

    Keys: the broker names (value or None), `ratio` (ours / mosquitto) and, for the
    rocketmq group, `ratio_rocketmq` (ours-rocketmq / mosquitto).
    """
    rows = []
    for sc in scenarios:
        res = {name: scenario_result(brokers, name, sc.key) for name in sc.brokers}
        for label, path, higher in sc.metrics():
            vals = {name: result_value(r, path) for name, r in res.items()}
            mosq = vals.get("mosquitto")
            ratios = {
                name: (v / mosq if v is not None and mosq else None) for name, v in vals.items()
            }
            row: dict[str, Any] = {
                "scenario": sc.key,
                "group": sc.group,
                "title": sc.title,
                "payload_bytes": sc.size,
                "metric": label,
                "higher_is_better": higher,
                **vals,
                "ratio": ratios.get("ours"),
                "notes": "; ".join(notes(sc, res, brokers)),
            }
            if sc.group == "rocketmq":
                row["ratio_rocketmq"] = ratios.get(ROCKETMQ_VARIANT)
            rows.append(row)
    return rows


def notes(sc: BrokerScenario, res: dict[str, dict[str, Any]], brokers: dict[str, Any]) -> list[str]:
    """What the Notes column says about the brokers' runs of one scenario."""
    out = []
    if sc.mode == "throughput":
        for name, r in res.items():
            if r.get("lost"):
                out.append(f"{name} lost {r['lost']:,}")
            if r.get("stop_reason") not in (None, "complete"):
                out.append(f"{name} stopped: {r['stop_reason']}")
    else:
        for name, r in res.items():
            if rate_not_held(r):
                # The publisher fell behind its schedule (QoS 1 window full): the rate
                # was not held, so this is not latency "at" that rate.
                out.append(f"{name}: rate not held ({r['late_sends']:,} late sends)")
    for name, r in res.items():
        if name in brokers and not r:
            out.append(f"{name}: not run ({brokers[name].get('status', '?')})")
        elif r.get("errors"):
            out.append(f"{name}: error")
        elif r.get("skipped"):
            out.append(f"{name}: skipped")
    return out


# (key in the row, text heading, Markdown heading)
MAIN_COLUMNS = [
    ("ours", "ours", "Ours"),
    ("mosquitto", "mosquitto", "Mosquitto"),
    ("ratio", "ours/mosq", "Ours/Mosquitto"),
]
ROCKETMQ_COLUMNS = [
    (ROCKETMQ_VARIANT, "ours-rocketmq", "Ours (RocketMQ)"),
    ("mosquitto", "mosquitto", "Mosquitto"),
    ("ratio_rocketmq", "rmq/mosq", "Ours (RocketMQ)/Mosquitto"),
    ("ours", "ours (filelog)", "Ours (embedded store)"),
]


def comparison_cells(r: dict[str, Any], columns: list[tuple[str, str, str]]) -> list[str]:
    return [
        r["title"],
        payload_label(r["payload_bytes"]),
        r["metric"],
        *(
            fmt_ratio(r.get(key)) if key.startswith("ratio") else fmt_val(r.get(key), r["metric"])
            for key, _, _ in columns
        ),
        r["notes"],
    ]


def comparison_text(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> str:
    head = ["scenario", "payload", "metric", *(c[1] for c in columns), "notes"]
    body = [comparison_cells(r, columns) for r in rows]
    return plain_table(head, body, right=set(range(3, 3 + len(columns))))


def comparison_md(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> list[str]:
    head = ["Scenario", "Payload", "Metric", *(c[2] for c in columns), "Notes"]
    body = [comparison_cells(r, columns) for r in rows]
    return md_table(head, body, right=set(range(3, 3 + len(columns))))


RESOURCE_HEAD = [
    "scenario",
    "payload",
    "rmq: bridge CPU",
    "rmq: RocketMQ CPU",
    "rmq: loadgen CPU",
    "rmq: bridge RSS MB",
    "rmq: RocketMQ RSS MB",
    "ours (filelog) CPU",
    "rmq: other processes CPU",
    "mosquitto CPU",
    "mosq: loadgen CPU",
]


def resource_rows(scenarios: list[BrokerScenario], brokers: dict[str, Any]) -> list[list[str]]:
    """CPU (% of one core over the scenario) and RSS after it, rocketmq group."""

    def mb(r: dict[str, Any], key: str) -> str:
        v = r.get(key)
        return f"{v:.0f}" if isinstance(v, int | float) else MISSING

    body = []
    for sc in scenarios:
        if sc.group != "rocketmq":
            continue
        rq = scenario_result(brokers, ROCKETMQ_VARIANT, sc.key)
        mo = scenario_result(brokers, "mosquitto", sc.key)
        ou = scenario_result(brokers, "ours", sc.key)
        body.append(
            [
                sc.title,
                payload_label(sc.size),
                fmt_pct(rq.get("broker_cpu_percent")),
                fmt_pct(rq.get("rocketmq_cpu_percent")),
                fmt_pct(rq.get("loadgen_cpu_percent")),
                mb(rq, "broker_rss_mb"),
                mb(rq, "rocketmq_rss_mb"),
                fmt_pct(ou.get("broker_cpu_percent")),
                fmt_pct(rq.get("others_cpu_percent")),
                fmt_pct(mo.get("broker_cpu_percent")),
                fmt_pct(mo.get("loadgen_cpu_percent")),
            ]
        )
    return body


def target_rows(brokers: dict[str, Any], targets: list[Target]) -> list[dict[str, Any]]:
    """The targets against the ours-rocketmq figures; met only if measured."""
    out = []
    for title, key, path, higher, target in targets:
        r = scenario_result(brokers, ROCKETMQ_VARIANT, key)
        v = None if not completed(r) or r.get("errors") else get_path(r, path)
        if v is None:
            status = "not measured"
        else:
            ok = v >= target if higher else v <= target
            status = "met" if ok else "not met"
        unit = "msg/s" if higher else "ms"
        shown = MISSING if v is None else (f"{v:,.0f} {unit}" if higher else f"{v:.3f} {unit}")
        if not higher and rate_not_held(r):
            shown += " (rate not held)"
        out.append({"target": title, "scenario": key, "value": v, "shown": shown, "status": status})
    return out


# --------------------------------------------------------------------------- reporting


def markdown(
    meta: dict[str, Any],
    rows: list[dict[str, Any]],
    resources: list[list[str]],
    targets: list[dict[str, Any]],
) -> str:
    out = [
        f"Benchmark run {meta['finished_at']} on {meta['cpu_count']} CPU(s) "
        f"({meta['platform']}), load generator: Go `{meta['loadgen_client']}` client"
        f"{' (quick mode)' if meta['quick'] else ''}.",
        "",
        f"- command: `{meta['command']}`",
        f"- mosquitto: {meta['versions']['mosquitto']}; go: {meta['versions']['go']}; "
        f"python: {meta['versions']['python']}",
        "- throughput = messages received per second by all subscribers (first send to "
        "last receive); latency = publish->receive at a fixed rate; ratio = ours / Mosquitto "
        "(throughput: >1 is better; latency: <1 is better)",
        "- Mosquitto config: stock defaults plus persistence; "
        + (
            "`set_tcp_nodelay true`"
            if meta["mosquitto_set_tcp_nodelay"]
            else "`set_tcp_nodelay false` (its default: Nagle on, which inflates its QoS0 "
            "latency tail and 2 KB latency; see tests/bench/README.md)"
        ),
    ]
    rmq = meta.get("rocketmq")
    if rmq:
        out.append(
            f"- RocketMQ {rmq.get('version')} ({rmq.get('flush_disk_type')}, "
            f"ROCKETMQ_JAVA_OPTS=`{rmq.get('java_opts')}`, {rmq.get('java')}), started in "
            f"{rmq.get('start_s')} s, on the same machine"
        )
    main_rows = [r for r in rows if r["group"] == "main"]
    rmq_rows = [r for r in rows if r["group"] == "rocketmq"]
    if main_rows:
        out += ["", *comparison_md(main_rows, MAIN_COLUMNS)]
    if rmq_rows:
        out += [
            "",
            "QoS 1 through RocketMQ (`ours-rocketmq`: the bridge with `store=rocketmq`); "
            "throughput runs also give p50/p99 publish->receive latency under full load; "
            "10 -> 10 = 10 publisher -> subscriber pairs, each pair on its own topic; "
            "msgs/s = messages delivered per second, pub msgs/s = messages the publishers got "
            "through (stored and acknowledged) per second:",
            "",
            *comparison_md(rmq_rows, ROCKETMQ_COLUMNS),
        ]
    if resources:
        out += [
            "",
            "CPU (% of one core, averaged over the scenario) and RSS after it:",
            "",
            *md_table(RESOURCE_HEAD, resources, set(range(2, len(RESOURCE_HEAD)))),
        ]
    if targets:
        out += ["", "| Target (ours-rocketmq) | Measured | Status |", "|---|---:|---|"]
        out += [f"| {t['target']} | {t['shown']} | {t['status']} |" for t in targets]
    return "\n".join(out) + "\n"


def report(
    meta: dict[str, Any],
    scenarios: list[BrokerScenario],
    results: dict[str, Any],
    targets: list[Target] | None,
    results_dir: Path,
    sections: Sequence[ReportSection] = (),
) -> None:
    """Write latest.json and latest.md and print the tables; `targets` (None: the RocketMQ set
    was not run) also adds the CPU/RSS table of that set; each of `sections` (e.g. the
    protocol comparison) adds its part to the JSON, the Markdown and the printed tables."""
    rows = comparison_rows(scenarios, results)
    resources = resource_rows(scenarios, results) if targets is not None else []
    checked = target_rows(results, targets) if targets is not None else []
    doc = {
        "meta": meta,
        "brokers": results,
        "comparison": rows,
        "targets": checked,
        **{sec.key: sec.doc for sec in sections},
    }
    md = "\n".join([markdown(meta, rows, resources, checked), *(s.markdown for s in sections)])
    wrote = write_results(results_dir, "latest", doc, md)

    main_rows = [r for r in rows if r["group"] == "main"]
    rmq_rows = [r for r in rows if r["group"] == "rocketmq"]
    if main_rows:
        log("")
        log(comparison_text(main_rows, MAIN_COLUMNS))
    if rmq_rows:
        log_section(
            "QoS 1 set (rq_*): ours-rocketmq = the bridge with store=rocketmq; 10->10 = 10 "
            "publisher->subscriber pairs, a topic per pair; msgs/s = delivered, pub msgs/s = "
            "published (stored and acknowledged)",
            comparison_text(rmq_rows, ROCKETMQ_COLUMNS),
        )
    if resources:
        log_section(
            "CPU (% of one core over the scenario) and RSS (MB) after it:",
            plain_table(RESOURCE_HEAD, resources, right=set(range(2, len(RESOURCE_HEAD)))),
        )
    if checked:
        lines = [f"  {t['target']:<78} {t['shown']:>14}  {t['status']}" for t in checked]
        log_section("targets (ours-rocketmq):", "\n".join(lines))
    for sec in sections:
        log("")
        log(sec.text)
    log("")
    log(
        "ratio = ours (or ours-rocketmq) / mosquitto: for msgs/s higher is better, for latency "
        "(ms) lower is better."
    )
    log(f"{wrote} (total {meta['wall_s']:.0f} s)")
