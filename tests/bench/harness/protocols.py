"""run_bench.py's protocol comparison (issue 16: "v5 clients must cost no more than 10% over
3.1.1 on the same scenarios"): the same loads with MQTT 3.1.1 and MQTT 5.0 clients against one
broker, one protocol right after the other, in rounds (every other round in the opposite
protocol order, so that a drift in the machine's load favours neither); then, per broker, each
figure for each protocol with its ratio to 3.1.1, and the 10% target checked on our bridge.

The loads (keys `pv_*`, 100-byte payloads) are loadgen runs with `-protocol 4` or `-protocol 5`
(always the raw client: paho.mqtt.golang speaks 3.1.1 only; `5p` adds `-props`: a Content
Type and a User Property on every PUBLISH) and the users' load, mosquitto_pub/mosquitto_sub
with `-V 311` or `-V 5` (pathruns.users_run; `5p`: the same two properties with `-D`)."""

from __future__ import annotations

import argparse
import shlex
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from tests.bench.harness.common import Budget, log, tail
from tests.bench.harness.loadgen import loadgen_args, run_loadgen
from tests.bench.harness.pathruns import users_run
from tests.bench.harness.processes import Broker
from tests.bench.harness.procfs import (
    CpuWindow,
    machine_busy_s,
    proc_group_cpu,
    session_pids,
)
from tests.bench.harness.report import (
    MISSING,
    ReportSection,
    fmt_ratio,
    md_table,
    plain_table,
    result_value,
)
from tests.bench.harness.versus import record_usage

PV_BROKERS = ("ours", "mosquitto")
BASE = "4"  # the protocol the others are divided by
TARGET = 1.10  # issue 16: a v5 client costs at most 10% more than a 3.1.1 one
SIZE = 100
BUSY_OTHERS_PERCENT = 50.0  # other work on the box above this: the run competed for the cores


@dataclass(frozen=True)
class Protocol:
    label: str
    loadgen: dict[str, str]  # loadgen flags
    version: tuple[str, ...]  # mosquitto_pub/-sub flags
    pub_args: tuple[str, ...] = ()  # mosquitto_pub only


PROTOCOLS = {
    "4": Protocol("3.1.1", {"-protocol": "4"}, ("-V", "311")),
    "5": Protocol("5.0", {"-protocol": "5"}, ("-V", "5")),
    "5p": Protocol(
        "5.0+props",
        {"-protocol": "5", "-props": "true"},
        ("-V", "5"),
        (
            *("-D", "publish", "content-type", "application/octet-stream"),
            *("-D", "publish", "user-property", "source", "loadgen"),
        ),
    ),
}

RATE = ("msgs/s", "msgs_per_s", True)
P50 = ("p50 ms", "latency.p50_ms", False)
P99 = ("p99 ms", "latency.p99_ms", False)
CPU = ("broker µs/msg", "broker_us_per_msg", False)
# The users' load: the rate mosquitto_pub got its messages acknowledged (above msgs/s: delivery
# fell behind).
SENT = ("pub msgs/s", "publish_rate", True)


@dataclass(frozen=True)
class ProtocolLoad:
    """One load of the comparison, run once per protocol and round."""

    key: str
    title: str
    kind: str  # "loadgen" | "users"
    mode: str  # "throughput" | "latency"
    qos: int
    timeout_s: float
    args: dict[str, str] = field(default_factory=dict)  # loadgen flags, without -protocol
    count: int = 0  # the users' load: messages

    def metrics(self) -> list[tuple[str, str, bool]]:
        """(label, path in a run's result, higher_is_better)."""
        if self.mode == "latency":
            return [P50, P99, CPU]
        if self.kind == "users":
            return [RATE, SENT, CPU]
        if self.args.get("-stamp") == "true":
            return [RATE, P50, P99, CPU]
        return [RATE, CPU]

    def judged(self) -> list[str]:
        """The metrics the 10% target is checked on: the rate of a throughput load (the p50 of
        the fixed-rate one) and the broker's CPU per message."""
        return [P50[0] if self.mode == "latency" else RATE[0], CPU[0]]


def build_protocol_loads(quick: bool) -> list[ProtocolLoad]:
    if quick:
        dur, cap, idle = 3.0, 6.0, "1s"
        n0, nfan, n1 = 30_000, 5_000, 10_000
        lat_dur, lat_cap, users_n, users_cap = 2.0, 6.0, 3_000, 10.0
    else:
        dur, cap, idle = 10.0, 15.0, "2s"
        n0, nfan, n1 = 100_000, 20_000, 30_000
        lat_dur, lat_cap, users_n, users_cap = 4.0, 10.0, 5_000, 30.0

    def tp(key: str, title: str, qos: int, count: int, **kw: Any) -> ProtocolLoad:
        flags = {"-stamp": "true"} if qos else {}
        args = loadgen_args(
            "throughput", qos, size=SIZE, count=count, duration=dur, timeout=cap, idle=idle, **kw
        )
        return ProtocolLoad(
            f"pv_{key}_100B", title, "loadgen", "throughput", qos, cap, args | flags
        )

    return [
        tp("tp_qos0_1to1", "QoS0 1 pub -> 1 sub", 0, n0),
        tp("tp_qos0_1to10", "QoS0 fan-out 1 pub -> 10 subs (deliveries)", 0, nfan, subs=10),
        tp("tp_qos1_w20", "QoS1 1 -> 1, 20 in flight (users' default)", 1, n1, window=20),
        tp("tp_qos1_w100", "QoS1 1 -> 1, window 100 (loadgen's)", 1, n1, window=100),
        ProtocolLoad(
            "pv_lat_qos1_100B",
            "QoS1 latency @ 1000 msg/s",
            "loadgen",
            "latency",
            1,
            lat_cap,
            loadgen_args("latency", 1, size=SIZE, rate=1000, duration=lat_dur, timeout=lat_cap),
        ),
        ProtocolLoad(
            "pv_users_qos1_100B",
            "users' load: mosquitto_pub -l -> mosquitto_sub, QoS1",
            "users",
            "throughput",
            1,
            users_cap,
            count=users_n,
        ),
    ]


def add_protocol_options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--protocols",
        default="4,5",
        help="MQTT versions of the protocol comparison (pv_* scenarios, on ours and "
        "mosquitto): 4 = 3.1.1, 5 = 5.0, 5p = 5.0 with a Content Type and a User Property on "
        "every PUBLISH; 'none' leaves the comparison out (default: %(default)s)",
    )
    ap.add_argument(
        "--protocol-rounds",
        type=int,
        default=None,
        help="rounds of the protocol comparison; tables show each figure's best round "
        "(default 2, quick 1)",
    )
    ap.add_argument(
        "--protocol-budget",
        type=float,
        default=None,
        help="seconds per broker for the protocol comparison (default 180, quick 60)",
    )


def parse_protocols(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """args.protocol_list (the base first; empty: no comparison) and the defaults of the
    comparison's rounds and budget."""
    names = [p.strip() for p in args.protocols.split(",") if p.strip()]
    if names in ([], ["none"]):
        args.protocol_list = []
    elif bad := [p for p in names if p not in PROTOCOLS]:
        ap.error(f"unknown protocol(s) {bad}; choose from {', '.join(PROTOCOLS)} or none")
    elif BASE not in names or len(set(names)) < 2:
        ap.error(f"--protocols needs {BASE} (3.1.1, the base of the ratios) and another")
    else:
        args.protocol_list = [BASE, *dict.fromkeys(p for p in names if p != BASE)]
    if args.protocol_rounds is None:
        args.protocol_rounds = 1 if args.quick else 2
    if args.protocol_budget is None:
        args.protocol_budget = 60.0 if args.quick else 180.0


# --------------------------------------------------------------------------- running


def log_watch(b: Broker) -> Callable[[], list[str]]:
    """What the broker logged since the last call that may be a problem: our bridge's
    warnings, errors and tracebacks; Mosquitto's dropped messages (from its own log)."""
    path = Path(b.extra.get("internal_log") or b.log_path)
    marks = ("dropped",) if b.name == "mosquitto" else ("WARNING", "ERROR", "CRITICAL", "Traceback")
    offset = path.stat().st_size if path.is_file() else 0

    def new_lines() -> list[str]:
        nonlocal offset
        try:
            with path.open("rb") as f:
                f.seek(offset)
                text = f.read()
        except OSError:
            return []
        offset += len(text)
        lines = text.decode(errors="replace").splitlines()
        return [line for line in lines if any(m in line for m in marks)][:20]

    return new_lines


def loadgen_run(b: Broker, load: ProtocolLoad, proto: Protocol, loadgen: Path) -> dict[str, Any]:
    assert b.proc is not None
    pgid = b.proc.pid
    window = CpuWindow({"machine": machine_busy_s, "broker": partial(proc_group_cpu, pgid)})
    res, cmd = run_loadgen(loadgen, b.port, load.args | proto.loadgen, "raw", load.timeout_s + 20)
    window.close()
    res["loadgen_cmd"] = shlex.join(cmd)
    record_usage(res, window, pgid, None)
    if delivered := res.get("delivered"):
        res["broker_us_per_msg"] = round(res["broker_cpu_s"] / delivered * 1e6, 2)
        res["loadgen_us_per_msg"] = round(float(res.get("loadgen_cpu_s") or 0) / delivered * 1e6, 2)
    return res


def users_load_run(b: Broker, load: ProtocolLoad, proto: Protocol) -> dict[str, Any]:
    assert b.proc is not None
    try:
        res = users_run(
            pub_port=b.port,
            sub_port=b.port,
            size=SIZE,
            count=load.count,
            timeout_s=load.timeout_s,
            roles={"broker": session_pids(b.proc.pid) or [b.proc.pid]},
            workdir=b.workdir,
            version=proto.version,
            pub_args=proto.pub_args,
            qos=load.qos,
        )
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        return {"errors": [f"users' load: {e}"]}
    us, pct = res.get("us_per_msg", {}), res.get("cpu_percent", {})
    res.update(
        expected=load.count,
        lost=res.get("missing"),
        broker_us_per_msg=us.get("broker"),
        clients_us_per_msg=round(
            (us.get("mosquitto_pub") or 0) + (us.get("mosquitto_sub") or 0), 1
        ),
        broker_cpu_percent=pct.get("broker"),
        others_cpu_percent=pct.get("others"),
    )
    return res


def problems(broker: str, load: ProtocolLoad, res: dict[str, Any]) -> list[str]:
    """What makes a run count as failed: errors, a bridge that lost QoS 1 messages (Mosquitto
    drops them above max_queued_messages by design, and logs only that) or logged an error."""
    out = list(res.get("errors") or [])
    if broker == "mosquitto":
        return out
    if load.qos and res.get("lost"):
        out.append(f"lost {res['lost']:,} QoS {load.qos} messages")
    return out + [f"broker log: {ln}" for ln in res.get("broker_log", []) if "WARNING" not in ln]


def describe_run(name: str, res: dict[str, Any]) -> str:
    """The progress line of one run."""
    if res.get("skipped"):
        return f"{name:<34} skipped ({res['skipped']})"
    if "delivered" not in res:
        return f"{name:<34} FAILED: {'; '.join(res.get('errors') or [])}"
    lat = res.get("latency") or {}
    parts = [
        f"{res.get('msgs_per_s') or 0:>9,.0f} msg/s",
        f"p50 {lat['p50_ms']:.3f} p99 {lat['p99_ms']:.3f} ms" if lat else "",
        f"broker {res.get('broker_us_per_msg') or 0:.1f} µs/msg "
        f"({res.get('broker_cpu_percent') or 0:.0f}% of a core)",
        f"delivered {res['delivered']:,}/{res.get('expected') or 0:,}",
        f"stop {res['stop_reason']}" if res.get("stop_reason") != "complete" else "",
        f"window {res['window_effective']}" if res.get("window_effective") else "",
        f"others {res.get('others_cpu_percent') or 0:.0f}%",
        f"ERRORS: {'; '.join(res['errors'])}" if res.get("errors") else "",
        f"LOG: {' | '.join(res['broker_log'][:3])}" if res.get("broker_log") else "",
    ]
    return f"{name:<34} " + "  ".join(p for p in parts if p)


def bench_protocols(
    b: Broker,
    *,
    loads: list[ProtocolLoad],
    protocols: list[str],
    loadgen: Path,
    rounds: int,
    budget_s: float,
) -> dict[str, Any]:
    """Every load with every protocol against the running broker `b`, `rounds` times, within
    `budget_s`; after an unreported short QoS 1 run per protocol (the bridge imports and
    warms its 5.0 code on first use). The runs per load and protocol, one per round."""
    out: dict[str, Any] = {"protocols": protocols, "rounds": rounds, "runs": {}, "errors": []}
    labels = ", ".join(PROTOCOLS[p].label for p in protocols)
    log(f"    --- MQTT {labels}: {len(loads)} loads x {rounds} round(s), budget {budget_s:.0f} s")
    watch = log_watch(b)
    budget = Budget(budget_s)
    began = time.monotonic()
    warm = loadgen_args("throughput", 1, size=SIZE, count=3000, duration="3s", timeout="6s")
    for p in protocols:
        res, _ = run_loadgen(loadgen, b.port, warm | PROTOCOLS[p].loadgen, "raw", 30)
        lines = watch()
        if res.get("errors") or lines:
            out.setdefault("warmup", {})[p] = {"errors": res.get("errors"), "broker_log": lines}
            log(f"    warm-up {PROTOCOLS[p].label}: {res.get('errors')} {lines[:3]}")
    for rnd in range(1, rounds + 1):
        for load in loads:
            for p in protocols if rnd % 2 else protocols[::-1]:
                runs = out["runs"].setdefault(load.key, {}).setdefault(p, [])
                name = f"{load.key} {PROTOCOLS[p].label}"
                slack = 10.0 if load.kind == "users" else 0.0  # subscribing, session set-up
                if skipped := budget.skip(name, load.timeout_s + slack):
                    runs.append({"round": rnd, **skipped})
                    continue
                if not b.alive():
                    if not any("died" in e for e in out["errors"]):
                        out["errors"].append(f"{b.name} died; log tail:\n{tail(b.log_path)}")
                    runs.append({"round": rnd, "skipped": "broker is not running"})
                    continue
                if load.kind == "users":
                    res = users_load_run(b, load, PROTOCOLS[p])
                else:
                    res = loadgen_run(b, load, PROTOCOLS[p], loadgen)
                res["round"] = rnd
                if lines := watch():
                    res["broker_log"] = lines
                out["errors"] += [f"{name} round {rnd}: {e}" for e in problems(b.name, load, res)]
                runs.append(res)
                log("    " + describe_run(name, res))
    out["wall_s"] = round(time.monotonic() - began, 1)
    return out


# --------------------------------------------------------------------------- comparing


def usable(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in runs if not r.get("errors") and not r.get("skipped")]


def best(runs: list[dict[str, Any]], path: str, higher: bool) -> float | None:
    """The best round's figure: other work on the box only ever makes a run slower or
    dearer, so the best round is the least disturbed one."""
    vals = [v for r in usable(runs) if (v := result_value(r, path)) is not None]
    return (max(vals) if higher else min(vals)) if vals else None


def round_ratios(by_proto: dict[str, list[dict[str, Any]]], p: str, path: str) -> list[float]:
    """The ratio to the base in each round (the two runs of a round are back to back)."""
    base = {r["round"]: result_value(r, path) for r in usable(by_proto.get(BASE, []))}
    out = []
    for r in usable(by_proto.get(p, [])):
        v, b = result_value(r, path), base.get(r["round"])
        if v is not None and b:
            out.append(v / b)
    return out


def load_notes(broker: str, by_proto: dict[str, list[dict[str, Any]]]) -> list[str]:
    out = []
    for p, runs in by_proto.items():
        label = PROTOCOLS[p].label
        windows = {r["window_effective"] for r in runs if r.get("window_effective")}
        if windows:
            out.append(f"{label}: window {min(windows)} (the server's Receive Maximum)")
        if lost := [f"{r['lost']:,}" for r in runs if r.get("lost")]:
            dropped = " (max_queued_messages)" if broker == "mosquitto" else ""
            out.append(f"{label} lost {'/'.join(lost)}{dropped}")
        out += [f"{label}: {r['stop_reason']}" for r in runs if r.get("stop_reason") == "timeout"]
        if any(r.get("errors") for r in runs):
            out.append(f"{label}: error")
        if any(r.get("skipped") for r in runs):
            out.append(f"{label}: skipped")
        if logged := sum(len(r.get("broker_log", [])) for r in runs):
            out.append(f"{label}: {logged} broker log line(s)")
    busy = max(
        (float(r.get("others_cpu_percent") or 0) for rs in by_proto.values() for r in rs),
        default=0.0,
    )
    if busy >= BUSY_OTHERS_PERCENT:
        out.append(f"others up to {busy:.0f}% of a core")
    return out


def comparison_rows(
    loads: list[ProtocolLoad], results: dict[str, Any], protocols: list[str]
) -> list[dict[str, Any]]:
    """One row per broker, load and metric: the best round of each protocol, the ratios to
    3.1.1 (of the best rounds, and of each round), and the load's notes."""
    rows = []
    for broker, res in results.items():
        pv = res.get("protocols")
        if not pv:
            continue
        for load in loads:
            by_proto = pv["runs"].get(load.key)
            if not by_proto:
                continue
            notes = "; ".join(load_notes(broker, by_proto))
            for label, path, higher in load.metrics():
                vals = {p: best(by_proto.get(p, []), path, higher) for p in protocols}
                base = vals.get(BASE)
                rows.append(
                    {
                        "broker": broker,
                        "scenario": load.key,
                        "title": load.title,
                        "metric": label,
                        "higher_is_better": higher,
                        "values": vals,
                        "ratios": {
                            p: (v / base if v is not None and base else None)
                            for p, v in vals.items()
                            if p != BASE
                        },
                        "round_ratios": {
                            p: round_ratios(by_proto, p, path) for p in protocols if p != BASE
                        },
                        "judged": label in load.judged(),
                        "notes": notes,
                    }
                )
                notes = ""  # once per load
    return rows


def target_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 16's target on our bridge, for MQTT 5.0 ("5") against 3.1.1: each judged figure
    at most 10% worse (a rate at least 1/1.10 of 3.1.1's, a latency or CPU at most 1.10x)."""
    out = []
    for r in rows:
        if r["broker"] != "ours" or not r["judged"]:
            continue
        ratio = r["ratios"].get("5")
        limit = 1 / TARGET if r["higher_is_better"] else TARGET
        if ratio is None:
            status = "not measured"
        elif r["higher_is_better"]:
            status = "met" if ratio >= limit else "not met"
        else:
            status = "met" if ratio <= limit else "not met"
        sign = ">=" if r["higher_is_better"] else "<="
        out.append(
            {
                "scenario": r["scenario"],
                "target": f"{r['title']}: {r['metric']} 5.0/3.1.1 {sign} {limit:.2f}",
                "ratio": ratio,
                "status": status,
            }
        )
    return out


def fmt_figure(v: float | None, label: str) -> str:
    if v is None:
        return MISSING
    if label.endswith("/s"):
        return f"{v:,.0f}"
    return f"{v:.1f}" if label == CPU[0] else f"{v:.3f}"


def table(
    rows: list[dict[str, Any]], protocols: list[str], markdown: bool
) -> tuple[list[str], list[list[str]]]:
    head = ["load" if not markdown else "Load", "metric" if not markdown else "Metric"]
    for p in protocols:
        head.append(PROTOCOLS[p].label)
        if p != BASE:
            head.append(f"{PROTOCOLS[p].label}/3.1.1")
    head += ["Per round", "Notes"] if markdown else ["per round", "notes"]
    body = []
    prev = None
    for r in rows:
        cells = [r["title"] if r["scenario"] != prev else "", r["metric"]]
        prev = r["scenario"]
        for p in protocols:
            cells.append(fmt_figure(r["values"].get(p), r["metric"]))
            if p != BASE:
                cells.append(fmt_ratio(r["ratios"].get(p)))
        cells.append(
            " ".join(
                "/".join(f"{x:.2f}" for x in r["round_ratios"][p])
                for p in protocols
                if p != BASE and len(r["round_ratios"].get(p, [])) > 1
            )
        )
        cells.append(r["notes"])
        body.append(cells)
    return head, body


CAPTION = (
    "MQTT 5.0 vs 3.1.1 clients (pv_*, 100 B; {rounds} round(s), each figure its best round, "
    "'per round' = the ratio of each round's back-to-back runs), {broker}:"
)


def protocol_section(
    loads: list[ProtocolLoad], results: dict[str, Any], protocols: list[str], rounds: int
) -> ReportSection:
    """The comparison's tables (one per broker) and targets: printed, in latest.md and under
    `protocol_comparison` in latest.json."""
    rows = comparison_rows(loads, results, protocols)
    targets = target_rows(rows)
    text: list[str] = []
    md: list[str] = []
    for broker in dict.fromkeys(r["broker"] for r in rows):
        mine = [r for r in rows if r["broker"] == broker]
        head, body = table(mine, protocols, markdown=False)
        right = set(range(2, len(head) - 1))
        caption = CAPTION.format(rounds=rounds, broker=broker)
        text += ["", caption, plain_table(head, body, right)]
        head, body = table(mine, protocols, markdown=True)
        md += ["", caption, "", *md_table(head, body, right)]
    if targets:
        lines = [f"  {t['target']:<78} {fmt_ratio(t['ratio']):>7}  {t['status']}" for t in targets]
        text += ["", "issue 16 target (ours, MQTT 5.0 / 3.1.1, best rounds):", *lines]
        md += ["", "| Target (ours, 5.0/3.1.1) | Ratio | Status |", "|---|---:|---|"]
        md += [f"| {t['target']} | {fmt_ratio(t['ratio'])} | {t['status']} |" for t in targets]
    doc = {"protocols": protocols, "rounds": rounds, "rows": rows, "targets": targets}
    return ReportSection(
        "protocol_comparison", doc, "\n".join(md).lstrip("\n") + "\n", "\n".join(text).strip()
    )
