#!/usr/bin/env python3
"""Issue 36: "the per-delivery ACL check costs under 5% of QoS 1 throughput with 1,000 rules,
and nothing when no rule applies". One bridge, started three ways in one invocation:

    .venv/bin/python tests/bench/acl_delivery.py [--quick] [--rounds N] [--ours-cmd '...']

- `none`: no password file, no ACL (the base of the ratios);
- `acl`: a password file and an ACL file of 1,000 rules: 999 `allow user:uNNN all
  devices/uNNN/#` for other users, then `allow anonymous all bench/#`, the one rule that grants
  the benchmark's clients (anonymous clients stay allowed, `allow_anonymous true`: the loadgen
  sends no user name). Last in the file, so every uncached decision reads all 1,000 rules. No
  deny rule applies: every filter is answered whole, deliveries ask nothing;
- `acl-reload`: started like `acl`, then, before the warm-up, the ACL file is rewritten with a
  deny rule in place of one of the 999 (`deny all subscribe bench/+/private`: it applies to every
  client and shares no topic with the benchmark's) and the bridge gets a SIGHUP. The rules'
  generation changes, so each session's filters are judged anew under rules with a deny rule
  that applies to its client (`bridge/access/reads.py`: it shares no topic with the filter, so
  the filter is answered whole and its deliveries go unchecked).

Per way and round: a fresh bridge (own temp dir and port), an unreported QoS 1 warm-up, then
the load: loadgen QoS 1 1 -> 1, 100-byte payloads, 20 in flight (libmosquitto's default),
`-stamp` for publish->receive latency, bounded by a count, a publish phase and a hard cap.
Every round runs the three ways back to back, each round in a rotated order, so a drift in
the machine's load favours none. Printed and written to <results-dir>/acl_delivery.{json,md}:
per way the median over the rounds of msg/s, p50/p90/p99 and the bridge's CPU µs per message,
and the ratio to `none` per round (median, min..max). See tests/bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.harness.common import (
    HOST,
    begin,
    free_port,
    log,
    tail,
    utc_now,
    venv_python,
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
    stopped_at_exit,
)
from tests.bench.harness.procfs import loadavg, log_meta, run_meta
from tests.bench.harness.protocols import (
    Protocol,
    ProtocolLoad,
    describe_run,
    loadgen_run,
    log_watch,
    problems,
)
from tests.bench.harness.report import MISSING, log_section, md_table, plain_table, result_value

NAME = "acl_delivery"
SIZE = 100
WINDOW = 20  # QoS 1 messages in flight: libmosquitto's default
RULES = 1_000
BASE = "none"
TARGET = 0.95  # issue 36: at most 5% of the QoS 1 throughput
CLIENTS_DEFAULT = Protocol("3.1.1", {}, ())
GRANT = "allow anonymous all bench/#"
NARROW_DENY = "deny all subscribe bench/+/private"
BENCH_USER, BENCH_PASSWORD = "bench", "bench-password"


@dataclass(frozen=True)
class Way:
    """One way of starting the bridge: with the ACL or without, and whether the rules are
    changed (SIGHUP) before the runs."""

    key: str
    title: str
    acl: bool
    reload: bool


WAYS = [
    Way("none", "no password file, no ACL", False, False),
    Way("acl", f"password file + {RULES:,} rules, none denies", True, False),
    Way("acl-reload", "the same, then SIGHUP: a deny rule applies to every client", True, True),
]

# (label, path in a run's result, higher is better, digits)
FIGURES = [
    ("msg/s", "msgs_per_s", True, 0),
    ("p50 ms", "latency.p50_ms", False, 3),
    ("p90 ms", "latency.p90_ms", False, 3),
    ("p99 ms", "latency.p99_ms", False, 3),
    ("bridge µs/msg", "broker_us_per_msg", False, 1),
]


def acl_lines(deny: bool) -> list[str]:
    """The 1,000 rules: 999 for other users (or 998 and the narrow deny), then the grant."""
    others = [f"allow user:u{i:03d} all devices/u{i:03d}/#" for i in range(RULES - 1)]
    if deny:
        others[-1] = NARROW_DENY
    return [*others, GRANT]


def write_access_files(tmp: Path) -> tuple[Path, Path]:
    """A password file with one user (made with the project's own `bridge.access.passwd`) and
    the ACL file of `acl_lines`."""
    passwd, acl = tmp / "passwd", tmp / "acl"
    subprocess.run(
        [
            venv_python(),
            "-m",
            "bridge.access.passwd",
            str(passwd),
            "add",
            BENCH_USER,
            "--password-stdin",
        ],
        input=BENCH_PASSWORD + "\n",
        text=True,
        check=True,
        capture_output=True,
        timeout=60,
    )
    acl.write_text("\n".join(acl_lines(deny=False)) + "\n")
    return passwd, acl


def build_load(quick: bool) -> ProtocolLoad:
    count, dur, cap = (20_000, 4.0, 8.0) if quick else (150_000, 10.0, 15.0)
    args = loadgen_args(
        "throughput",
        1,
        size=SIZE,
        count=count,
        duration=dur,
        timeout=cap,
        idle="2s",
        window=WINDOW,
        flags={"-stamp": "true"},
    )
    title = f"loadgen QoS 1 1 -> 1, {SIZE} B, {WINDOW} in flight"
    return ProtocolLoad("qos1_w20", title, "loadgen", "throughput", 1, cap, args)


# --------------------------------------------------------------------------- running


def reload_rules(b: Broker, acl: Path) -> None:
    """Rewrite the ACL file with the narrow deny rule and SIGHUP the bridge; raise if it logged
    an error or died."""
    assert b.proc is not None
    acl.write_text("\n".join(acl_lines(deny=True)) + "\n")
    watch = log_watch(b)
    os.kill(b.proc.pid, signal.SIGHUP)
    time.sleep(0.5)  # the reload runs on the event loop; 1,000 lines take milliseconds
    if not b.alive() or [ln for ln in watch() if "WARNING" not in ln]:
        raise RuntimeError(f"reload failed; log tail:\n{tail(b.log_path)}")


def run_way(
    way: Way, rnd: int, load: ProtocolLoad, loadgen: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """One way in one round: a fresh bridge, the rules (re)loaded as the way says, a warm-up,
    the load; stopped however it ends, its log kept next to the results."""
    tmp = Path(tempfile.mkdtemp(prefix=f"mqtt-bench-acl-{way.key}-"))
    template = args.ours_cmd
    acl = tmp / "acl"
    if way.acl:
        passwd, acl = write_access_files(tmp)
        template += (
            f" --set password_file={shlex.quote(str(passwd))} --set allow_anonymous=true"
            f" --set acl_file={shlex.quote(str(acl))}"
        )
    b = ours_broker(tmp, free_port(), template)
    out: dict[str, Any] = {"way": way.key, "round": rnd, "command": shlex.join(b.cmd)}
    out["errors"] = []
    log(f"  round {rnd}, {way.key}: {out['command']}")
    with stopped_at_exit(b, tmp, args.results_dir, f"{NAME}-{way.key}-r{rnd}-"):
        try:
            b.start()
            b.wait_ready()
            if way.reload:
                reload_rules(b, acl)
            watch = log_watch(b)
            n = 3_000 if args.quick else 10_000
            warm = loadgen_args(
                "throughput", 1, size=SIZE, count=n, duration="4s", timeout="8s", window=WINDOW
            )
            res, _ = run_loadgen(loadgen, b.port, warm, "raw", 30)
            if errors := res.get("errors") or [ln for ln in watch() if "WARNING" not in ln]:
                out["errors"].append(f"warm-up: {errors}")
            res = loadgen_run(b, load, CLIENTS_DEFAULT, loadgen)
            if lines := watch():
                res["broker_log"] = lines
            out["errors"] += problems(b.name, load, res)
            out["run"] = res
            log("    " + describe_run(way.key, res))
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            out["errors"].append(str(e))
            log(f"    ERROR: {e}")
    return out


# --------------------------------------------------------------------------- reporting


def value(run: dict[str, Any] | None, path: str) -> float | None:
    if not run or run.get("errors") or "run" not in run:
        return None
    return result_value(run["run"], path)


def rows(results: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per way and figure: every round's value, their median, and the ratio to `none` of the
    same round (median, min, max)."""
    out = []
    for way in WAYS:
        for label, path, higher, digits in FIGURES:
            vals = [value(r, path) for r in results.get(way.key, [])]
            base = [value(r, path) for r in results.get(BASE, [])]
            ratios = [v / b for v, b in zip(vals, base, strict=False) if v is not None and b]
            good = [v for v in vals if v is not None]
            out.append(
                {
                    "way": way.key,
                    "figure": label,
                    "higher_is_better": higher,
                    "digits": digits,
                    "rounds": vals,
                    "median": statistics.median(good) if good else None,
                    "ratios": ratios,
                    "ratio_median": statistics.median(ratios) if ratios else None,
                }
            )
    return out


def cells(rs: list[dict[str, Any]]) -> list[list[str]]:
    body = []
    for r in rs:
        d = r["digits"]
        ratios = r["ratios"]
        spread = f"{min(ratios):.3f} .. {max(ratios):.3f}" if len(ratios) > 1 else ""
        body.append(
            [
                r["way"],
                r["figure"],
                MISSING if r["median"] is None else f"{r['median']:,.{d}f}",
                "/".join(MISSING if v is None else f"{v:,.{d}f}" for v in r["rounds"]),
                "" if r["way"] == BASE or r["ratio_median"] is None else f"{r['ratio_median']:.3f}",
                "" if r["way"] == BASE else spread,
            ]
        )
    return body


def target_lines(rs: list[dict[str, Any]]) -> list[str]:
    out = []
    for r in rs:
        if r["way"] == BASE or r["figure"] != "msg/s":
            continue
        m = r["ratio_median"]
        status = "not measured" if m is None else ("met" if m >= TARGET else "not met")
        shown = MISSING if m is None else f"{m:.3f}"
        out.append(f"{r['way']}: msg/s against none >= {TARGET:.2f} (median of rounds): {shown}")
        out[-1] += f"  {status}"
    return out


HEAD = ["way", "figure", "median", "per round", "/none (median)", "/none min .. max"]


def report(meta: dict[str, Any], results: dict[str, list[dict[str, Any]]], out_dir: Path) -> None:
    rs = rows(results)
    body = cells(rs)
    targets = target_lines(rs)
    caption = (
        f"ACL on the delivery path, {meta['load']['title']}, {meta['rounds']} round(s): median "
        "over the rounds, and the ratio to `none` of the same round"
    )
    ways = [f"- `{w.key}`: {w.title}" for w in WAYS]
    md = [
        f"ACL on the delivery path (issue 36), run {meta['finished_at']} on "
        f"{meta['cpu_count']} CPU(s)" + (" (quick mode)." if meta["quick"] else "."),
        "",
        f"- command: `{meta['command']}`",
        *ways,
        "",
        caption + ":",
        "",
        *md_table(HEAD, body, {2, 4}),
        "",
        *(f"- {t}" for t in targets),
    ]
    doc = {"meta": meta, "ways": results, "figures": rs, "targets": targets}
    wrote = write_results(out_dir, NAME, doc, "\n".join(md) + "\n")
    log_section(caption, plain_table(HEAD, body, {2, 4}))
    log_section("targets (issue 36):", "\n".join(f"  {t}" for t in targets))
    log(f"\n{wrote} (total {meta['wall_s']:.0f} s)")


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="small counts, a smoke run")
    ap.add_argument("--rounds", type=int, default=3, help="rounds (default: %(default)s)")
    add_ours_cmd_option(ap)
    add_loadgen_options(ap)
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args, command, t0 = begin(str(Path(__file__)), argv, parse_args)
    load = build_load(args.quick)
    meta: dict[str, Any] = run_meta(
        command,
        quick=args.quick,
        rounds=args.rounds,
        host=HOST,
        ways={w.key: w.title for w in WAYS},
        acl_rules=acl_lines(deny=False)[-3:],
        reload_rules=acl_lines(deny=True)[-3:],
        load={"title": load.title, "loadgen_args": load.args},
    )
    log_meta(meta)
    loadgen = args.loadgen or build_loadgen(args.cache_dir)
    meta["loadgen"] = str(loadgen)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict[str, Any]]] = {w.key: [] for w in WAYS}
    for rnd in range(1, args.rounds + 1):
        shift = (rnd - 1) % len(WAYS)
        for way in WAYS[shift:] + WAYS[:shift]:
            results[way.key].append(run_way(way, rnd, load, loadgen, args))
    meta["finished_at"] = utc_now()
    meta["wall_s"] = round(time.monotonic() - t0, 1)
    meta["loadavg_end"] = loadavg()
    report(meta, results, args.results_dir)
    return 1 if any(r["errors"] for rs in results.values() for r in rs) else 0


if __name__ == "__main__":
    sys.exit(main())
