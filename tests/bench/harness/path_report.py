"""rocketmq_path.py's loads and report: the four systems side by side for every load, where the
CPU went per delivered message, and the headline ratio (the RocketMQ broker's CPU per message
through the gateway cluster / per message between RocketMQ's own Java producer and consumer);
printed and written as JSON and Markdown."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from tests.bench.harness.common import log, write_results
from tests.bench.harness.pathruns import Load
from tests.bench.harness.report import (
    MISSING,
    fmt_ratio,
    fmt_val,
    get_path,
    log_section,
    md_table,
    payload_label,
    plain_table,
)

SYSTEMS = {
    "mosquitto": "Mosquitto (Debian), stock config plus persistence",
    "bridge": "one bridge on its embedded store (python -m bridge)",
    "cluster": "3 bridge nodes on RocketMQ (SYNC_FLUSH), pubs on node1, subs on node2",
    "java": "RocketMQ's Java client (producer + push consumer), same RocketMQ config",
}
# Roles (processes) by what they are, for the CPU table.
GATEWAY = ("mosquitto", "bridge", "node1", "node2", "node3")
TOOLS = ("mosquitto_pub", "mosquitto_sub", "loadgen", "producer", "consumer")
SUPPORT = ("namesrv", "redis", "haproxy")


def completed(r: dict[str, Any]) -> bool:
    return "delivered" in r and not r.get("skipped")


def describe(system: str, load: Load, r: dict[str, Any]) -> str:
    """The progress line of one run."""
    errs = r.get("errors") or []
    err = f"  ERRORS: {'; '.join(errs)}" if errs else ""
    if not completed(r):
        return f"{load.key:<15} FAILED{err}"
    us = r.get("us_per_msg") or {}
    cpu = ", ".join(f"{role} {v:.0f}" for role, v in us.items() if v is not None)
    lat = r.get("latency") or {}
    if load.mode == "latency":
        head = (
            f"p50 {lat.get('p50_ms', 0):.2f} p90 {lat.get('p90_ms', 0):.2f} "
            f"p99 {lat.get('p99_ms', 0):.2f} max {lat.get('max_ms', 0):.1f} ms, "
            f"{r.get('delivered', 0):,} received (late sends {r.get('late_sends', 0)}"
            + (f", max {r['max_inflight']} in flight" if "max_inflight" in r else "")
            + ")"
        )
    else:
        lost = r.get("missing", r.get("lost")) or 0
        head = (
            f"{r.get('msgs_per_s') or 0:>8,.0f} msg/s delivered, "
            f"{r.get('publish_rate') or 0:,.0f} sent/s, {r['delivered']:,} delivered"
            + (f", {lost:,} missing" if lost else "")
            + (f" p50 {lat['p50_ms']:.1f} ms" if lat.get("p50_ms") is not None else "")
        )
    return f"{load.key:<15} {head}\n{'':<20}CPU µs/msg: {cpu}{err}"


# --------------------------------------------------------------------------- picking


def runs_of(systems: dict[str, Any], name: str, key: str) -> list[dict[str, Any]]:
    return list(systems.get(name, {}).get("runs", {}).get(key, []))


def chosen(runs: list[dict[str, Any]], load: Load) -> dict[str, Any]:
    """The run the tables show: the median (the lower one of an even count) by delivered msg/s,
    or by p50 for a latency load, among completed runs; {} if none completed."""
    done = [r for r in runs if completed(r)]
    if not done:
        return {}
    path = "latency.p50_ms" if load.mode == "latency" else "msgs_per_s"
    value = statistics.median_low(get_path(r, path) or 0.0 for r in done)
    return next(r for r in done if (get_path(r, path) or 0.0) == value)


def status_note(name: str, runs: list[dict[str, Any]], system: dict[str, Any]) -> list[str]:
    """What the notes say about one system's runs of one load."""
    if not system:
        return []
    if not runs:
        return [f"{name}: failed" if system.get("status") == "failed" else f"{name}: not run"]
    out = []
    for r in runs:
        lost = r.get("missing", r.get("lost"))
        if r.get("skipped"):
            out.append(f"{name}: skipped")
        elif r.get("errors") and not completed(r):
            out.append(f"{name}: error")
        elif lost:
            why = " (dropped: max_queued_messages)" if r.get("broker_dropped") else ""
            out.append(f"{name} {lost:,} missing{why}")
    if len([r for r in runs if completed(r)]) > 1:
        rates = [r.get("msgs_per_s") or 0 for r in runs if completed(r)]
        out.append(f"{name} rounds: " + " / ".join(f"{v:,.0f}" for v in rates))
    return out


# --------------------------------------------------------------------------- tables

MAIN_METRICS = {
    "throughput": [("msgs/s", "msgs_per_s"), ("sent/s", "publish_rate")],
    "latency": [(f"{q} ms", f"latency.{q}_ms") for q in ("p50", "p90", "p99", "max")],
}


def main_rows(loads: list[Load], systems: dict[str, Any]) -> list[list[str]]:
    """Load x metric, one column per system; Java only where the load has an equivalent (its
    title says with how many sends in flight)."""
    body = []
    for load in loads:
        picked = {name: chosen(runs_of(systems, name, load.key), load) for name in SYSTEMS}
        notes: list[str] = []
        for name in SYSTEMS:
            if name != "java" or load.java_inflight is not None:
                notes += status_note(name, runs_of(systems, name, load.key), systems.get(name, {}))
        for i, (label, path) in enumerate(MAIN_METRICS[load.mode]):
            cells = []
            for name in SYSTEMS:
                v = get_path(picked[name], path) if picked[name] else None
                cells.append(fmt_val(v, label))
            title = load.title if i == 0 else ""
            body.append(
                [title, payload_label(load.size), label, *cells, "; ".join(notes) if i == 0 else ""]
            )
    return body


def role_sum(us: dict[str, Any], roles: tuple[str, ...]) -> float | None:
    vals = [v for role, v in us.items() if role in roles and v is not None]
    return sum(vals) if vals else None


def cpu_rows(loads: list[Load], systems: dict[str, Any]) -> list[list[str]]:
    """Per system and load: delivered msg/s and CPU µs per delivered message, by kind of
    process; the JIT's share of the broker's CPU; the other work on the box."""
    body = []
    for name in SYSTEMS:
        for load in loads:
            r = chosen(runs_of(systems, name, load.key), load)
            if not r:
                continue
            us = r.get("us_per_msg") or {}
            server = [v for role, v in us.items() if role not in TOOLS and v is not None]
            jit, broker = r.get("jit_cpu_s"), (r.get("cpu_s") or {}).get("rocketmq")
            body.append(
                [
                    name,
                    load.key,
                    fmt_val(r.get("msgs_per_s"), "/s"),
                    fmt_us(role_sum(us, GATEWAY)),
                    fmt_us(us.get("rocketmq")),
                    fmt_us(role_sum(us, SUPPORT)),
                    fmt_us(sum(server) if server else None),
                    fmt_us(role_sum(us, TOOLS)),
                    f"{100 * jit / broker:.0f}%" if jit is not None and broker else MISSING,
                    f"{(r.get('cpu_percent') or {}).get('others', 0):.0f}%",
                ]
            )
    return body


CPU_HEAD = [
    "system",
    "load",
    "msgs/s",
    "gateway µs",
    "RocketMQ µs",
    "namesrv+redis+haproxy µs",
    "server side µs",
    "load tools µs",
    "broker JIT",
    "others %core",
]


def fmt_us(v: float | None) -> str:
    return MISSING if v is None else f"{v:,.0f}"


def marginal_us(r: dict[str, Any], idle: dict[str, float]) -> float | None:
    """The broker's µs per message without its JIT compiler threads (a warm-up artefact) and
    without what it burns when idle (its polling loops: the idle rate, JIT excluded, over the
    run's wall time): the part that grows with the message rate."""
    cpu, jit = get_path(r, "cpu_s.rocketmq"), get_path(r, "jit_cpu_s") or 0.0
    delivered = get_path(r, "delivered")
    if cpu is None or not delivered or "rocketmq" not in idle:
        return None
    idle_pct = max(0.0, idle["rocketmq"] - idle.get("rocketmq_jit", 0.0))
    return max(0.0, cpu - jit - idle_pct / 100 * float(r["run_wall_s"])) / delivered * 1e6


HEADLINE_PAIRS = [
    # (cluster load, Java load, what is compared)
    ("users_100B", "users_100B", "users' load 100 B, 20 in flight"),
    ("users_2KB", "users_2KB", "users' load 2 KB, 20 in flight"),
    ("lg_1to1_2KB", "lg_1to1_2KB", "loadgen 1 -> 1 2 KB, window 100 / Java 100 in flight"),
    ("lg_10to10_2KB", "lg_1to1_2KB", "loadgen 10 pairs 2 KB (up to 1,000 in flight) / Java 100"),
    ("lg_lat_2KB", "lg_lat_2KB", "latency load 2 KB, both paced at 1,000 msg/s"),
]


def headline_rows(loads: list[Load], systems: dict[str, Any]) -> list[dict[str, Any]]:
    """Broker CPU per delivered message through the gateway cluster / per message of the Java
    producer + consumer, total and marginal."""
    by_key = {load.key: load for load in loads}
    idle = {name: systems.get(name, {}).get("idle_cpu_percent") or {} for name in SYSTEMS}
    rows = []
    for gw_key, java_key, title in HEADLINE_PAIRS:
        if gw_key not in by_key or java_key not in by_key:
            continue
        gw = chosen(runs_of(systems, "cluster", gw_key), by_key[gw_key])
        jv = chosen(runs_of(systems, "java", java_key), by_key[java_key])
        g_us = (gw.get("us_per_msg") or {}).get("rocketmq") if gw else None
        j_us = (jv.get("us_per_msg") or {}).get("rocketmq") if jv else None
        g_m, j_m = marginal_us(gw, idle["cluster"]), marginal_us(jv, idle["java"])
        rows.append(
            {
                "compared": title,
                "cluster_load": gw_key,
                "java_load": java_key,
                "cluster_msgs_per_s": gw.get("msgs_per_s") if gw else None,
                "java_msgs_per_s": jv.get("msgs_per_s") if jv else None,
                "cluster_broker_us": g_us,
                "java_broker_us": j_us,
                "ratio": g_us / j_us if g_us is not None and j_us else None,
                "cluster_broker_marginal_us": g_m,
                "java_broker_marginal_us": j_m,
                "marginal_ratio": g_m / j_m if g_m is not None and j_m else None,
            }
        )
    return rows


HEADLINE_HEAD = [
    "compared",
    "cluster msg/s",
    "Java msg/s",
    "broker µs/msg cluster",
    "broker µs/msg Java",
    "ratio",
    "marginal cluster",
    "marginal Java",
    "marginal ratio",
]


def headline_cells(h: dict[str, Any]) -> list[str]:
    return [
        h["compared"],
        fmt_val(h["cluster_msgs_per_s"], "/s"),
        fmt_val(h["java_msgs_per_s"], "/s"),
        fmt_us(h["cluster_broker_us"]),
        fmt_us(h["java_broker_us"]),
        fmt_ratio(h["ratio"]),
        fmt_us(h["cluster_broker_marginal_us"]),
        fmt_us(h["java_broker_marginal_us"]),
        fmt_ratio(h["marginal_ratio"]),
    ]


# --------------------------------------------------------------------------- report

MAIN_CAPTION = (
    "Same QoS 1 load on four systems (the median round; msgs/s = delivered per second, "
    "sent/s = acknowledged per second):"
)
CPU_CAPTION = (
    "CPU µs per delivered message (gateway = Mosquitto, the bridge or the 3 nodes; server side "
    "= everything but the load tools; broker JIT = the RocketMQ JVM's compiler threads' share "
    "of its CPU in the run; others = other work on the box, % of one core):"
)
HEADLINE_CAPTION = (
    "Headline: RocketMQ broker CPU per message delivered through the gateway cluster / per "
    "message between the Java producer and consumer (marginal = without the broker's JIT and "
    "its idle burn):"
)


def failures(systems: dict[str, Any]) -> list[str]:
    """Why the exit status is 1: failed systems, runs with errors or missing messages."""
    out = []
    for name, s in systems.items():
        out += [f"{name}: {e}" for e in s.get("errors", [])]
        for key, runs in s.get("runs", {}).items():
            for r in runs:
                lost = r.get("missing", r.get("lost"))
                if r.get("errors"):
                    out.append(f"{name} {key} round {r.get('round')}: {'; '.join(r['errors'])}")
                elif lost and name != "mosquitto":
                    # QoS 1 messages that never arrived. Mosquitto drops them by design above
                    # its stock max_queued_messages: a result, shown in the notes.
                    out.append(f"{name} {key} round {r.get('round')}: {lost:,} missing")
    return out


def report(
    meta: dict[str, Any],
    loads: list[Load],
    systems: dict[str, Any],
    results_dir: Path,
    name: str,
) -> bool:
    """Print the tables, write name.json and name.md; True if something failed."""
    head = ["load", "payload", "metric", *SYSTEMS, "notes"]
    main = main_rows(loads, systems)
    cpu = cpu_rows(loads, systems)
    headline = headline_rows(loads, systems)
    right_main = set(range(3, 3 + len(SYSTEMS)))
    right_cpu = set(range(2, len(CPU_HEAD)))
    right_head = set(range(1, len(HEADLINE_HEAD)))
    problems = failures(systems)
    users_count = meta["loads"].get("users_2KB", {}).get("count", 0)
    md = [
        f"`rocketmq_path.py` run {meta['finished_at']} on {meta['cpu_count']} CPU(s) "
        f"({meta['platform']}), {meta['rounds']} round(s){' (quick)' if meta['quick'] else ''}, "
        f"{meta['wall_s']:.0f} s in total.",
        "",
        f"- command: `{meta['command']}`",
        *(f"- {n}: {SYSTEMS[n]}" for n in meta["systems"]),
        f"- RocketMQ JVMs: `{meta['rocketmq_java_opts']}`; {meta['versions'].get('java')}",
        f"- users' load: {users_count:,} messages per run, each line of `mosquitto_pub -l`'s "
        "input exactly 100 or 2,048 characters (sent without its newline), `mosquitto_sub -c` "
        "with a fixed id (persistent session, subscribed before the publisher starts)",
        "",
        MAIN_CAPTION,
        "",
        *md_table(head, main, right_main),
        "",
        CPU_CAPTION,
        "",
        *md_table(CPU_HEAD, cpu, right_cpu),
        "",
        HEADLINE_CAPTION,
        "",
        *md_table(HEADLINE_HEAD, [headline_cells(h) for h in headline], right_head),
    ]
    if problems:
        md += ["", "Problems:", "", *(f"- {p}" for p in problems)]
    doc = {"meta": meta, "systems": systems, "headline": headline}
    wrote = write_results(results_dir, name, doc, "\n".join(md) + "\n")
    log_section(MAIN_CAPTION, plain_table(head, main, right_main))
    log_section(CPU_CAPTION, plain_table(CPU_HEAD, cpu, right_cpu) if cpu else "(no run)")
    log_section(
        HEADLINE_CAPTION,
        plain_table(HEADLINE_HEAD, [headline_cells(h) for h in headline], right_head),
    )
    for p in problems:
        log(f"PROBLEM: {p}")
    log("")
    log(f"{wrote} (total {meta['wall_s']:.0f} s)")
    return bool(problems)
