#!/usr/bin/env python3
"""Issue 18: one node on its embedded store delivers at least Mosquitto's throughput while still
fsyncing. Our broker on its defaults (embedded store, fsync'd group commit) against Debian's
Mosquitto (stock config plus persistence, as run_bench.py starts it), in one invocation:

    .venv/bin/python tests/bench/single_node.py [--quick] [--rounds N] [--ours-cmd '...']

Each round starts each broker fresh (a new temp dir, data dir and port), in the order of
--brokers (ours, mosquitto, then again), gives it an unreported warm-up, runs every load against
it, reads its RSS and stops it. Every load uses 100-byte payloads:

- the users' load: Debian's `mosquitto_pub -l` -> `mosquitto_sub` with the clients' defaults
  (MQTT 3.1.1, 20 QoS 1 messages in flight), QoS 0 and QoS 1, 1 -> 1;
- the loadgen (tests/bench/loadgen) with `-window 20`: QoS 0 and QoS 1 1 -> 1, QoS 0 fan-out
  1 -> 10 (deliveries/s), latency at a fixed 1,000 msg/s at QoS 0 and QoS 1 (p50, p99).

Printed and written to <results-dir>/single_node.{json,md}: per figure, each broker's best round
and the ratio ours/Mosquitto (also per round), with the brokers' CPU seconds per 100,000 QoS 1
messages and their RSS after a round's runs; then the issue's targets, each with its range over
the rounds. See tests/bench/README.md, "Single node against Mosquitto (issue 18)".
"""

# The loads, figures, targets and command line; the runs themselves are the harness's
# (protocols.py's loadgen and users' load runs, with the clients' default protocol).

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.harness.common import (
    HOST,
    begin,
    free_port,
    log,
    matching,
    tail,
    tool_versions,
    utc_now,
    write_results,
)
from tests.bench.harness.loadgen import (
    add_loadgen_options,
    build_loadgen,
    loadgen_args,
    run_loadgen,
)
from tests.bench.harness.processes import (
    Broker,
    add_ours_cmd_option,
    ours_broker,
    stock_mosquitto,
    stopped_at_exit,
)
from tests.bench.harness.procfs import loadavg, log_meta, proc_rss_mb, run_meta
from tests.bench.harness.protocols import (
    SIZE,
    Protocol,
    ProtocolLoad,
    describe_run,
    loadgen_run,
    log_watch,
    problems,
    users_load_run,
)
from tests.bench.harness.report import (
    MISSING,
    fmt_ratio,
    log_section,
    md_table,
    plain_table,
    rate_not_held,
    result_value,
)

NAME = "single_node"
BROKER_NAMES = ("ours", "mosquitto")
WINDOW = 20  # QoS 1 messages in flight: libmosquitto's default, so the loadgen's too
RATE = 1000  # msg/s of the latency loads
# No -V, no -protocol: both tools speak their default, MQTT 3.1.1.
CLIENTS_DEFAULT = Protocol("3.1.1", {}, ())


# --------------------------------------------------------------------------- loads


def build_loads(quick: bool) -> list[ProtocolLoad]:
    """The loads of a round, in the order they run."""
    if quick:
        users_n, users_cap = 20_000, 30.0
        dur, cap, idle = 3.0, 6.0, "1s"
        n0, nfan, n1 = 50_000, 10_000, 20_000
        lat_dur, lat_cap = 2.0, 6.0
    else:
        # Debian's mosquitto_pub 2.0.11 -l -q 1 stops reading its input early on longer files
        # (after 3,400 to 34,000 of 100,000 or 200,000 lines, against Mosquitto as against us):
        # 50,000 lines are sent whole.
        users_n, users_cap = 50_000, 60.0
        dur, cap, idle = 15.0, 20.0, "2s"
        n0, nfan, n1 = 200_000, 50_000, 100_000
        lat_dur, lat_cap = 5.0, 12.0

    def users(qos: int) -> ProtocolLoad:
        title = f"users' load QoS {qos}: mosquitto_pub -l -> mosquitto_sub"
        return ProtocolLoad(
            f"users_qos{qos}_1to1", title, "users", "throughput", qos, users_cap, count=users_n
        )

    def tp(key: str, title: str, qos: int, count: int, subs: int = 1) -> ProtocolLoad:
        args = loadgen_args(
            "throughput",
            qos,
            size=SIZE,
            count=count,
            subs=subs,
            duration=dur,
            timeout=cap,
            idle=idle,
            window=WINDOW,
        )
        return ProtocolLoad(key, title, "loadgen", "throughput", qos, cap, args)

    def lat(qos: int) -> ProtocolLoad:
        args = loadgen_args(
            "latency", qos, size=SIZE, rate=RATE, duration=lat_dur, timeout=lat_cap, window=WINDOW
        )
        title = f"loadgen QoS {qos} latency @ {RATE:,} msg/s"
        return ProtocolLoad(f"lg_lat_qos{qos}", title, "loadgen", "latency", qos, lat_cap, args)

    return [
        users(0),
        users(1),
        tp("lg_tp_qos0_1to1", "loadgen QoS 0 1 -> 1", 0, n0),
        tp("lg_tp_qos1_1to1", "loadgen QoS 1 1 -> 1", 1, n1),
        tp("lg_tp_qos0_1to10", "loadgen QoS 0 fan-out 1 -> 10", 0, nfan, subs=10),
        lat(0),
        lat(1),
    ]


# --------------------------------------------------------------------------- figures


@dataclass(frozen=True)
class Figure:
    """One row of the table: the number at `path` of one load's result, times `scale`; with
    no `load`, the broker's RSS after a round's runs."""

    key: str
    title: str
    load: str
    path: str
    higher: bool  # higher is better
    unit: str
    digits: int = 0
    scale: float = 1.0

    def fmt(self, v: float | None) -> str:
        return MISSING if v is None else f"{v:,.{self.digits}f}"

    def fmt_unit(self, v: float | None) -> str:
        return f"{self.fmt(v)} {self.unit}"


def rate(key: str, title: str, load: str, unit: str = "msg/s") -> Figure:
    return Figure(key, title, load, "msgs_per_s", True, unit)


def cpu_per_100k(key: str, title: str, load: str) -> Figure:
    """The broker's CPU seconds per 100,000 messages (its µs per message / 10)."""
    return Figure(key, title, load, "broker_us_per_msg", False, "s/100k msgs", 2, 0.1)


FIGURES = [
    rate("users_qos0", "users' load QoS 0 1 -> 1", "users_qos0_1to1"),
    rate("users_qos1", "users' load QoS 1 1 -> 1", "users_qos1_1to1"),
    rate("lg_qos0", "loadgen QoS 0 1 -> 1", "lg_tp_qos0_1to1"),
    rate("lg_qos1", "loadgen QoS 1 1 -> 1", "lg_tp_qos1_1to1"),
    rate("lg_fanout", "loadgen QoS 0 fan-out 1 -> 10", "lg_tp_qos0_1to10", "deliveries/s"),
    *(
        Figure(
            f"lat_qos{q}_{p}",
            f"loadgen QoS {q} @ {RATE:,} msg/s {p}",
            f"lg_lat_qos{q}",
            f"latency.{p}_ms",
            False,
            "ms",
            3,
        )
        for q in (0, 1)
        for p in ("p50", "p99")
    ),
    cpu_per_100k("cpu_users_qos1", "broker CPU, users' load QoS 1", "users_qos1_1to1"),
    cpu_per_100k("cpu_lg_qos1", "broker CPU, loadgen QoS 1 1 -> 1", "lg_tp_qos1_1to1"),
    Figure("rss", "broker RSS after a round's runs", "", "rss_mib", False, "MiB", 1),
]


@dataclass(frozen=True)
class Goal:
    """A target of issue 18: the per-round ratio ours/Mosquitto of a figure (`relative`) or our
    own figure, at least `limit` where higher is better, else at most."""

    figure: str
    relative: bool
    limit: float


TARGETS = [
    Goal("users_qos0", True, 1.0),
    Goal("users_qos1", True, 1.0),
    Goal("lg_qos0", True, 1.0),
    Goal("lg_qos1", True, 1.0),
    Goal("lg_fanout", True, 1.0),
    Goal("cpu_users_qos1", True, 1.5),
    Goal("cpu_lg_qos1", True, 1.5),
    Goal("lat_qos1_p50", False, 0.4),
    Goal("rss", False, 40.0),
]


def round_value(rnd: dict[str, Any], fig: Figure) -> float | None:
    """The figure in one broker's round; None if that run failed, was skipped or not run."""
    if not fig.load:
        return rnd.get("rss_mib")
    res = rnd["runs"].get(fig.load)
    if not res or res.get("errors") or res.get("skipped"):
        return None
    v = result_value(res, fig.path)
    return None if v is None else v * fig.scale


def best(values: list[float | None], higher: bool) -> float | None:
    """The best round: other work on the box only ever makes a run slower or dearer."""
    vals = [v for v in values if v is not None]
    return (max(vals) if higher else min(vals)) if vals else None


def load_notes(load_key: str, results: dict[str, list[dict[str, Any]]]) -> list[str]:
    """What the rounds of one load had to say, per broker: messages lost (QoS 0 may drop them;
    Mosquitto drops QoS 1 above max_queued_messages), runs that timed out, latency runs that did
    not hold their rate, errors and skipped runs."""
    out = []
    for broker, rounds in results.items():
        runs = [rnd["runs"].get(load_key) or {} for rnd in rounds]
        if any(r.get("lost") for r in runs):
            lost = "/".join(f"{r.get('lost') or 0:,}" for r in runs)
            out.append(f"{broker} lost {lost}")
        for n, r in enumerate(runs, 1):
            if r.get("stop_reason") == "timeout":
                out.append(f"{broker} r{n}: timeout")
            if rate_not_held(r):
                out.append(f"{broker} r{n}: rate not held ({r['late_sends']:,} late sends)")
            if r.get("errors"):
                out.append(f"{broker} r{n}: error")
            elif r.get("skipped") or not r:
                out.append(f"{broker} r{n}: not run")
    return out


def figure_rows(
    figures: list[Figure], results: dict[str, list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """One row per figure: each broker's value in every round and its best round, the ratio
    ours/Mosquitto of the best rounds and of each round, and the notes on the load (on its first
    figure)."""
    rows = []
    noted: set[str] = set()
    for fig in figures:
        per_round = {b: [round_value(rnd, fig) for rnd in rs] for b, rs in results.items()}
        ours, mosq = per_round.get("ours", []), per_round.get("mosquitto", [])
        best_ours, best_mosq = best(ours, fig.higher), best(mosq, fig.higher)
        notes = load_notes(fig.load, results) if fig.load and fig.load not in noted else []
        noted.add(fig.load)
        rows.append(
            {
                "figure": fig.key,
                "title": fig.title,
                "unit": fig.unit,
                "higher_is_better": fig.higher,
                "ours": best_ours,
                "mosquitto": best_mosq,
                "ratio": best_ours / best_mosq if best_ours is not None and best_mosq else None,
                "rounds": per_round,
                "round_ratios": [
                    o / m for o, m in zip(ours, mosq, strict=False) if o is not None and m
                ],
                "notes": "; ".join(notes),
            }
        )
    return rows


def verdict(ok: list[bool]) -> str:
    """A target over the rounds: met in every round, in none, in some, or never measured."""
    if not ok:
        return "not measured"
    if all(ok):
        return "met"
    if not any(ok):
        return "not met"
    return f"met in {sum(ok)} of {len(ok)} rounds"


def target_rows(rows: list[dict[str, Any]], figures: list[Figure]) -> list[dict[str, Any]]:
    """Each target of the issue whose figure was measured: its range over the rounds and whether
    every round met it ("met"), none did ("not met") or some did."""
    by_key = {f.key: f for f in figures}
    row_of = {r["figure"]: r for r in rows}
    out = []
    for goal in TARGETS:
        fig, row = by_key.get(goal.figure), row_of.get(goal.figure)
        if fig is None or row is None:
            continue
        values = row["round_ratios"] if goal.relative else row["rounds"].get("ours", [])
        values = [v for v in values if v is not None]
        sign = ">=" if fig.higher else "<="
        ok = [v >= goal.limit if fig.higher else v <= goal.limit for v in values]
        show: Callable[[float | None], str] = fmt_ratio if goal.relative else fig.fmt_unit
        ends = (min(values), max(values)) if values else ()
        measured = " .. ".join(dict.fromkeys(show(v) for v in ends)) or MISSING
        if goal.relative:
            what = f"ours/Mosquitto {sign} {goal.limit:.1f}x"
        else:
            what = f"ours {sign} {goal.limit:g} {fig.unit}"
        out.append(
            {
                "target": f"{fig.title}: {what}",
                "figure": goal.figure,
                "relative": goal.relative,
                "limit": goal.limit,
                "values": values,
                "measured": measured,
                "status": verdict(ok),
            }
        )
    return out


# --------------------------------------------------------------------------- running


def make_broker(name: str, tmp: Path, port: int, ours_cmd: str) -> Broker:
    return stock_mosquitto(tmp, port) if name == "mosquitto" else ours_broker(tmp, port, ours_cmd)


def run_loads(
    b: Broker, loads: list[ProtocolLoad], loadgen: Path, warmup_n: int, out: dict[str, Any]
) -> None:
    """Against the started broker `b`: the unreported warm-up (QoS 0 and QoS 1, `warmup_n`
    messages each), then every load; its results, errors and RSS afterwards go into `out`."""
    assert b.proc is not None
    log(f"    listening on {HOST}:{b.port} (pid {b.proc.pid})")
    watch = log_watch(b)
    for qos in (0, 1):
        warm = loadgen_args(
            "throughput", qos, size=SIZE, count=warmup_n, duration="3s", timeout="6s", window=WINDOW
        )
        res, _ = run_loadgen(loadgen, b.port, warm, "raw", 30)
        if res.get("errors"):
            out.setdefault("warmup_errors", []).extend(res["errors"])
            log(f"    warm-up QoS {qos}: {res['errors']}")
    if lines := watch():
        out["warmup_log"] = lines
    for load in loads:
        if not b.alive():
            if not out["errors"] or "died" not in out["errors"][-1]:
                out["errors"].append(f"{b.name} died; log tail:\n{tail(b.log_path)}")
            out["runs"][load.key] = {"skipped": "broker is not running"}
            continue
        if load.kind == "users":
            res = users_load_run(b, load, CLIENTS_DEFAULT)
        else:
            res = loadgen_run(b, load, CLIENTS_DEFAULT, loadgen)
        if lines := watch():
            res["broker_log"] = lines
        out["errors"] += [f"{load.key}: {e}" for e in problems(b.name, load, res)]
        out["runs"][load.key] = res
        now = proc_rss_mb(b.proc.pid) if b.alive() else None
        log("    " + describe_run(load.key, res) + (f"  RSS {now:.1f} MiB" if now else ""))
    rss = proc_rss_mb(b.proc.pid) if b.alive() else None
    out["rss_mib"] = None if rss is None else round(rss, 1)
    log(f"    RSS after the runs: {MISSING if rss is None else f'{rss:.1f} MiB'}")


def bench_round(
    name: str, rnd: int, loads: list[ProtocolLoad], loadgen: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """One broker's round: started fresh in a temp dir of its own, warmed up, every load, its
    RSS read, stopped (however the round ends) and its logs kept next to the results."""
    tmp = Path(tempfile.mkdtemp(prefix=f"mqtt-bench-single-{name}-"))
    b = make_broker(name, tmp, free_port(), args.ours_cmd)
    out: dict[str, Any] = {"round": rnd, "command": shlex.join(b.cmd), "runs": {}, "errors": []}
    if "config" in b.extra:
        out["config"] = b.extra["config"]
    log(f"\n=== round {rnd}, {name}: {out['command']}")
    began = time.monotonic()
    with stopped_at_exit(b, tmp, args.results_dir, f"{NAME}-r{rnd}-"):
        try:
            b.start()
            b.wait_ready()
            run_loads(b, loads, loadgen, 2_000 if args.quick else 10_000, out)
        except (RuntimeError, OSError) as e:
            out["errors"].append(str(e))
            log(f"    ERROR: {e}")
    out["wall_s"] = round(time.monotonic() - began, 1)
    return out


# --------------------------------------------------------------------------- reporting

FIGURE_HEAD = ["figure", "unit", "ours", "mosquitto", "ours/mosq", "per round", "notes"]
TARGET_HEAD = ["target", "measured (rounds' range)", "status"]


def figure_cells(rows: list[dict[str, Any]], figures: list[Figure]) -> list[list[str]]:
    by_key = {f.key: f for f in figures}
    return [
        [
            r["title"],
            r["unit"],
            by_key[r["figure"]].fmt(r["ours"]),
            by_key[r["figure"]].fmt(r["mosquitto"]),
            fmt_ratio(r["ratio"]),
            "/".join(f"{x:.2f}" for x in r["round_ratios"]) if len(r["round_ratios"]) > 1 else "",
            r["notes"],
        ]
        for r in rows
    ]


def report(
    meta: dict[str, Any],
    loads: list[ProtocolLoad],
    results: dict[str, list[dict[str, Any]]],
    results_dir: Path,
) -> None:
    """Print the figures and targets tables and write single_node.json and .md."""
    keys = {ld.key for ld in loads}
    figures = [f for f in FIGURES if not f.load or f.load in keys]
    rows = figure_rows(figures, results)
    checked = target_rows(rows, figures)
    body = figure_cells(rows, figures)
    targets = [[t["target"], t["measured"], t["status"]] for t in checked]
    caption = (
        f"Single node, {SIZE} B payloads, {meta['rounds']} round(s): each broker's best round "
        "(rates highest; ms, CPU, RSS lowest); ours/mosq = ratio of the best rounds, per round = "
        "the ratio in each round"
    )
    targets_caption = "targets (issue 18; ratios per round, ours/Mosquitto):"
    md = [
        f"Single node against Mosquitto (issue 18), run {meta['finished_at']} on "
        f"{meta['cpu_count']} CPU(s) ({meta['platform']})"
        + (" (quick mode)." if meta["quick"] else "."),
        "",
        f"- command: `{meta['command']}`",
        f"- mosquitto: {meta['versions']['mosquitto']}; go: {meta['versions']['go']}; "
        f"python: {meta['versions']['python']}",
        "- ours: its defaults (embedded store, fsync'd group commit); Mosquitto: stock config "
        "plus persistence (max_inflight_messages 20, max_queued_messages 1000, Nagle on)",
        f"- users' load: mosquitto_pub -l -> mosquitto_sub (MQTT 3.1.1, 20 in flight); loadgen: "
        f"-window {WINDOW}; latency at {RATE:,} msg/s",
        "",
        caption + ":",
        "",
        *md_table(FIGURE_HEAD, body, {2, 3, 4}),
        "",
        *md_table(TARGET_HEAD, targets, {1}),
    ]
    doc = {"meta": meta, "brokers": results, "figures": rows, "targets": checked}
    wrote = write_results(results_dir, NAME, doc, "\n".join(md) + "\n")
    log_section(caption, plain_table(FIGURE_HEAD, body, {2, 3, 4}))
    log_section(targets_caption, plain_table(TARGET_HEAD, targets, {1}))
    log("")
    log(f"{wrote} (total {meta['wall_s']:.0f} s)")


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="small counts, a smoke run (< 90 s)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds (default: %(default)s)")
    ap.add_argument(
        "--brokers",
        default=",".join(BROKER_NAMES),
        help="comma-separated brokers of a round, in order (default: %(default)s)",
    )
    add_ours_cmd_option(ap)
    ap.add_argument(
        "--scenarios", default="", help="comma-separated substrings; run only matching load keys"
    )
    add_loadgen_options(ap)
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.brokers.split(",") if n.strip()]
    if not names or any(n not in BROKER_NAMES for n in names):
        ap.error(f"--brokers: choose from {', '.join(BROKER_NAMES)}")
    args.broker_list = list(dict.fromkeys(names))
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    args.loads = matching(build_loads(args.quick), args.scenarios)
    if not args.loads:
        keys = ", ".join(ld.key for ld in build_loads(args.quick))
        ap.error(f"--scenarios {args.scenarios!r} matches no load ({keys})")
    return args


def main(argv: list[str] | None = None) -> int:
    args, command, t0 = begin(str(Path(__file__)), argv, parse_args)
    versions = tool_versions()
    loads: list[ProtocolLoad] = args.loads
    meta: dict[str, Any] = run_meta(
        command,
        versions=versions,
        quick=args.quick,
        rounds=args.rounds,
        brokers=args.broker_list,
        payload_bytes=SIZE,
        window=WINDOW,
        loads={
            ld.key: {"title": ld.title, "kind": ld.kind, "qos": ld.qos, "count": ld.count}
            | ({"loadgen_args": ld.args} if ld.args else {})
            for ld in loads
        },
    )
    log_meta(meta)
    loadgen = args.loadgen or build_loadgen(args.cache_dir)
    meta["loadgen"] = str(loadgen)
    log(f"loadgen:   {loadgen}")
    args.results_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in args.broker_list}
    for rnd in range(1, args.rounds + 1):
        for name in args.broker_list:
            results[name].append(bench_round(name, rnd, loads, loadgen, args))
    meta["finished_at"] = utc_now()
    meta["wall_s"] = round(time.monotonic() - t0, 1)
    meta["loadavg_end"] = loadavg()
    report(meta, loads, results, args.results_dir)
    return 1 if any(rnd["errors"] for rounds in results.values() for rnd in rounds) else 0


if __name__ == "__main__":
    sys.exit(main())
