"""The cluster benchmark's report: the 3-node cluster against one Mosquitto, the scaling of the
same workload over 1, 2 and 3 nodes, where the CPU went in every run, and the incidents in the
node logs; printed and written as JSON and Markdown."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.bench.harness.cluster import INCIDENT, NODE_IDS, ClusterScenario
from tests.bench.harness.common import log, write_results
from tests.bench.harness.report import (
    completed,
    fmt_pct,
    fmt_ratio,
    fmt_val,
    log_section,
    md_table,
    payload_label,
    plain_table,
    rate_not_held,
    result_value,
)

RESULT_PREFIX = "cluster-bench"


def describe(sc: ClusterScenario, r: dict[str, Any]) -> str:
    """The progress lines of one run: its figures, then where the CPU went."""
    errs = r.get("errors") or []
    err = f"  ERRORS: {'; '.join(errs)}" if errs else ""
    if not completed(r):
        return f"{sc.key:<22} FAILED{err}"
    busy = ", ".join(
        f"{role} {pct:.0f}%" for role, pct in r["cpu_percent"].items() if role != "machine"
    )
    lat = r.get("latency") or {}
    if sc.mode == "throughput":
        lost = f" lost {r['lost']:,}" if r.get("lost") else ""
        latp = f" p50 {lat.get('p50_ms', 0):.1f} p99 {lat.get('p99_ms', 0):.1f} ms" if lat else ""
        head = (
            f"{sc.key:<22} {r['msgs_per_s']:>9,.0f} msg/s{latp} delivered {r['delivered']:,}/"
            f"{r['expected']:,}{lost} ({r['stop_reason']})"
        )
    else:
        head = (
            f"{sc.key:<22} p50 {lat.get('p50_ms', 0):.2f} p90 {lat.get('p90_ms', 0):.2f} "
            f"p99 {lat.get('p99_ms', 0):.2f} max {lat.get('max_ms', 0):.1f} ms "
            f"({lat.get('samples', 0):,} samples, lost {r.get('lost', 0)}, "
            f"late sends {r.get('late_sends', 0)})"
        )
    return f"{head}\n{'':<26}cpu: {busy}{err}"


def result_of(results: dict[str, Any], where: str, key: str) -> dict[str, Any]:
    """`where`: "mosquitto" or a node count ("1", "2", "3")."""
    if where == "mosquitto":
        return dict(results.get("mosquitto", {}).get("scenarios", {}).get(key, {}))
    stages = results.get("cluster", {}).get("stages", {})
    return dict(stages.get(where, {}).get("scenarios", {}).get(key, {}))


def notes(sc: ClusterScenario, runs: dict[str, dict[str, Any]]) -> str:
    """What the notes column says about the runs of one scenario (cluster and Mosquitto, or
    each node count)."""
    out = []
    for name, r in runs.items():
        if r.get("skipped"):
            out.append(f"{name}: skipped")
            continue
        if not r:
            out.append(f"{name}: not run")
            continue
        if r.get("errors"):
            out.append(f"{name}: error")
        n_incidents = sum(
            1
            for lines in (r.get("node_log") or {}).values()
            for line in lines
            if INCIDENT.search(line)
        )
        if n_incidents:
            out.append(f"{name}: {n_incidents} incident(s) in node logs")
        if sc.mode == "throughput":
            if r.get("lost"):
                out.append(f"{name} lost {r['lost']:,}")
            if r.get("stop_reason") not in (None, "complete"):
                out.append(f"{name} stopped: {r['stop_reason']}")
        elif rate_not_held(r):
            out.append(f"{name}: rate not held ({r['late_sends']:,} late sends)")
    return "; ".join(out)


def comparison_rows(
    scenarios: list[ClusterScenario], results: dict[str, Any]
) -> list[dict[str, Any]]:
    """3-node cluster vs Mosquitto: one row per scenario and metric."""
    top = str(len(NODE_IDS))
    rows = []
    for sc in scenarios:
        ours, mosq = result_of(results, top, sc.key), result_of(results, "mosquitto", sc.key)
        for label, path, higher in sc.metrics():
            a, b = result_value(ours, path), result_value(mosq, path)
            rows.append(
                {
                    "scenario": sc.key,
                    "title": sc.title,
                    "payload_bytes": sc.size,
                    "metric": label,
                    "higher_is_better": higher,
                    "cluster": a,
                    "mosquitto": b,
                    "ratio": a / b if a is not None and b else None,
                    "notes": notes(sc, {"cluster": ours, "mosquitto": mosq}),
                }
            )
    return rows


def scaling_rows(scenarios: list[ClusterScenario], results: dict[str, Any]) -> list[dict[str, Any]]:
    """Delivered msg/s of each scaling workload with 1, 2, 3 nodes, the ratio to 1 node, and
    Mosquitto's."""
    rows = []
    for sc in (s for s in scenarios if s.scaling):
        runs = {f"{n} node(s)": result_of(results, str(n), sc.key) for n in (1, 2, 3)}
        runs["mosquitto"] = result_of(results, "mosquitto", sc.key)
        rate = {name: result_value(r, "msgs_per_s") for name, r in runs.items()}
        one = rate["1 node(s)"]
        rows.append(
            {
                "scenario": sc.key,
                "title": f"QoS{sc.qos} 10 pubs -> 10 subs via HAProxy",
                "payload_bytes": sc.size,
                "msgs_per_s": {n: rate[f"{n} node(s)"] for n in ("1", "2", "3")},
                "ratio_to_1_node": {
                    n: (rate[f"{n} node(s)"] / one if one and rate[f"{n} node(s)"] else None)
                    for n in ("2", "3")
                },
                "mosquitto": rate["mosquitto"],
                "notes": notes(sc, runs),
            }
        )
    return rows


SCALING_HEAD = [
    "workload",
    "payload",
    "1 node",
    "2 nodes",
    "3 nodes",
    "2/1",
    "3/1",
    "mosquitto",
    "3 nodes/mosq",
    "notes",
]


def scaling_cells(r: dict[str, Any]) -> list[str]:
    """A scaling row's cells (SCALING_HEAD)."""
    rate, three, mosq = r["msgs_per_s"], r["msgs_per_s"]["3"], r["mosquitto"]
    return [
        r["title"],
        payload_label(r["payload_bytes"]),
        *(fmt_val(rate[n], "msgs/s") for n in ("1", "2", "3")),
        *(fmt_ratio(r["ratio_to_1_node"][n]) for n in ("2", "3")),
        fmt_val(mosq, "msgs/s"),
        fmt_ratio(three / mosq if three and mosq else None),
        r["notes"],
    ]


CPU_ROLES = [
    *NODE_IDS,
    "rocketmq",
    "namesrv",
    "haproxy",
    "redis",
    "mosquitto",
    "loadgen",
    "others",
    "machine",
]
CPU_HEAD = ["run", "scenario", "msgs/s", *CPU_ROLES, "µs CPU/msg"]


def cpu_rows(scenarios: list[ClusterScenario], results: dict[str, Any]) -> list[list[str]]:
    """CPU (% of one core over the run) by process, every cluster and Mosquitto run; the last
    column is the CPU of the brokers' processes (bridges, RocketMQ, NameServer, HAProxy, Redis;
    or Mosquitto) per delivered message, for the throughput runs."""
    body = []
    for where in ("1", "2", "3", "mosquitto"):
        for sc in scenarios:
            r = result_of(results, where, sc.key)
            if "cpu_percent" not in r:
                continue
            pct = r["cpu_percent"]
            broker_s = sum(
                v for k, v in r["cpu_s"].items() if k not in ("loadgen", "others", "machine")
            )
            delivered = r.get("delivered") or 0
            per_msg = (
                f"{1e6 * broker_s / delivered:.0f}"
                if sc.mode == "throughput" and delivered
                else "—"
            )
            rate = result_value(r, "msgs_per_s") if sc.mode == "throughput" else None
            cells = [
                "mosquitto" if where == "mosquitto" else f"{where} node(s)",
                sc.key,
                fmt_val(rate, "msgs/s"),
            ]
            body.append([*cells, *(fmt_pct(pct.get(role)) for role in CPU_ROLES), per_msg])
    return body


COMPARISON_HEAD = ["scenario", "payload", "metric", "3 nodes", "mosquitto", "cluster/mosq", "notes"]


def comparison_cells(r: dict[str, Any]) -> list[str]:
    """A comparison row's cells (COMPARISON_HEAD)."""
    return [
        r["title"],
        payload_label(r["payload_bytes"]),
        r["metric"],
        fmt_val(r["cluster"], r["metric"]),
        fmt_val(r["mosquitto"], r["metric"]),
        fmt_ratio(r["ratio"]),
        r["notes"],
    ]


def report(
    meta: dict[str, Any],
    scenarios: list[ClusterScenario],
    results: dict[str, Any],
    incidents: list[dict[str, str]],
    results_dir: Path,
) -> None:
    """Write cluster-bench.json and cluster-bench.md and print the tables."""
    comparison = comparison_rows(scenarios, results)
    scaling = scaling_rows(scenarios, results)
    cpu = cpu_rows(scenarios, results)
    doc = {
        "meta": meta,
        "results": results,
        "comparison": comparison,
        "scaling": scaling,
    }
    md = markdown(meta, comparison, scaling, cpu, incidents)
    wrote = write_results(results_dir, RESULT_PREFIX, doc, md)

    log_section(
        "3-node cluster vs one Mosquitto (x_: pubs on node1, subs on node2/3; lb_: via HAProxy):",
        plain_table(COMPARISON_HEAD, [comparison_cells(r) for r in comparison], right={3, 4, 5}),
    )
    if scaling:
        log_section(
            "scaling via HAProxy, delivered msg/s:",
            plain_table(SCALING_HEAD, [scaling_cells(r) for r in scaling], set(range(2, 9))),
        )
    if cpu:
        log_section(
            "CPU (% of one core over each run; machine 200% = both cores), µs broker CPU/msg:",
            plain_table(CPU_HEAD, cpu, right=set(range(2, len(CPU_HEAD)))),
        )
    if incidents:
        lines = [f"  {i['run']}: {i['node']}: {i['line']}" for i in incidents]
        log_section("cluster incidents in the node logs (run: node: line):", "\n".join(lines))
    log("")
    log(f"{wrote} (total {meta['wall_s']:.0f} s)")


def markdown(
    meta: dict[str, Any],
    comparison: list[dict[str, Any]],
    scaling: list[dict[str, Any]],
    cpu: list[list[str]],
    incidents: list[dict[str, str]],
) -> str:
    info = meta.get("cluster") or {}
    rmq = info.get("rocketmq") or {}
    out = [
        f"Cluster benchmark run {meta['finished_at']} on {meta['cpu_count']} CPU(s) "
        f"({meta['platform']}){' (quick mode)' if meta['quick'] else ''}, "
        f"load average {meta['loadavg_start']} at the start, {meta['loadavg_end']} at the end.",
        "",
        f"- command: `{meta['command']}`",
        f"- cluster: 3 bridge nodes (`store=rocketmq`, Redis registry, defaults otherwise), "
        f"RocketMQ {rmq.get('version')} ({rmq.get('flush_disk_type')}, "
        f"ROCKETMQ_JAVA_OPTS=`{rmq.get('java_opts')}`), "
        f"{(info.get('haproxy') or {}).get('version')} (L4, leastconn); all on this machine",
        f"- mosquitto: {meta['versions']['mosquitto']}, stock config plus persistence, "
        f"`set_tcp_nodelay {'true' if meta['mosquitto_set_tcp_nodelay'] else 'false'}`, "
        "clients connected directly",
        "- x_ = publishers on node1, subscribers on node2/node3 (every message crosses nodes); "
        "lb_ = every client through HAProxy; 10 -> 10 = 10 publisher -> subscriber pairs, a "
        "topic per pair; msgs/s = delivered per second; ratio cluster/mosquitto: >1 better for "
        "msgs/s, <1 better for latency",
    ]
    if comparison:
        out += [
            "",
            *md_table(
                COMPARISON_HEAD,
                [comparison_cells(r) for r in comparison],
                {3, 4, 5},
            ),
        ]
    if scaling:
        out += [
            "",
            "Scaling, same workload via HAProxy with 1, 2, 3 nodes (delivered msg/s):",
            "",
            *md_table(SCALING_HEAD, [scaling_cells(r) for r in scaling], set(range(2, 9))),
        ]
    if cpu:
        out += [
            "",
            "CPU by process (% of one core over the run; machine = all busy CPU, 200% = both "
            "cores; others = machine minus the listed processes) and broker CPU per delivered "
            "message:",
            "",
            *md_table(CPU_HEAD, cpu, set(range(2, len(CPU_HEAD)))),
        ]
    if incidents:
        out += ["", "Cluster incidents in the node logs (run: node: line):", ""]
        out += [f"- {i['run']}: {i['node']}: `{i['line']}`" for i in incidents]
    return "\n".join(out) + "\n"
