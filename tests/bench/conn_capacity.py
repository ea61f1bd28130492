#!/usr/bin/env python3
"""Connection capacity: how many idle MQTT connections one server process holds and what each
costs in resident memory, our bridge side by side with Mosquitto.

Run from the repository root (``make bench`` does this)::

    .venv/bin/python tests/bench/conn_capacity.py [--max-connections 19000] [--servers ours]

For each server in turn: start it on a free 127.0.0.1 port, read its VmRSS (/proc/PID/status)
as the baseline, then open connections in steps (1k, 5k, 10k, then the maximum) with the Go load
generator in idle mode (CONNECT with clean session and keepalive 600 s, wait for every CONNACK,
then hold the connection without traffic). After each step it waits ``--settle`` seconds and
reads VmRSS again. At the end every held connection must answer a PINGREQ, so the figures are
those of live connections. Then the clients send DISCONNECT, and the RSS after that is recorded
too (memory the server keeps after its clients are gone), with the peak (VmHWM).

KiB per connection is reported two ways: (RSS - baseline) / connections, the figure of the
issue's target, and the marginal (RSS - RSS of the previous step) / new connections, which leaves
out one-time costs of the first connections (imports, caches, table growth).

Limits this works within: a process may hold at most 20,000 open files (the server holds one
socket per connection itself), so the client side is split over several loadgen processes of at
most ``--per-process`` connections each; the connections are spread round-robin over several
source addresses (127.0.0.2, .3, ...) so that no single address runs out of ephemeral ports
(Linux gives each local address its own ``ip_local_port_range``). Every step is capped in time
(``--step-timeout``), every loadgen process has a hard deadline, and the servers and clients are
always stopped.

Prints a table and writes tests/bench/results/conn-capacity.{json,md} plus the servers' logs.
The exit status is 1 if a server failed to start, refused or dropped connections, or died;
missing the memory target is a result, not an error.
"""

from __future__ import annotations

import argparse
import math
import resource
import shlex
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.harness.common import (
    HOST,
    free_port,
    log,
    on_sigterm,
    tail,
    tool_versions,
    utc_now,
    write_results,
)
from tests.bench.harness.idle_fleet import ClientFleet, local_port_range, merge
from tests.bench.harness.loadgen import IDLE_KEEPALIVE_S, add_loadgen_options, build_loadgen
from tests.bench.harness.processes import (
    MOSQUITTO_INTERNAL_LOG,
    Broker,
    mosquitto_broker,
    ours_broker,
    stopped_at_exit,
)
from tests.bench.harness.procfs import loadavg, open_files, proc_cpu, proc_status_kib, run_meta
from tests.bench.harness.report import md_table, plain_table

DEFAULT_MAX = 19_000
DEFAULT_STEPS = "1000,5000,10000"
DEFAULT_SOURCES = "127.0.0.2,127.0.0.3,127.0.0.4,127.0.0.5"
# Connections per loadgen process: far below the 20,000 open files a process may hold.
DEFAULT_PER_PROCESS = 8_000
SERVER_NAMES = ("ours", "ours-asyncio", "mosquitto")
DEFAULT_SERVERS = "ours,mosquitto"
OURS_CMD = (
    "{python} -m bridge --listen {host}:{port} --data-dir {data_dir} --log-level warning "
    "--set max_connections=0"
)
# `bridge.__main__` runs on uvloop when it can import it; hiding the module makes it fall back
# to asyncio's own event loop, which is what `ours-asyncio` measures.
OURS_ASYNCIO_CMD = (
    '{python} -c \'import sys; sys.modules["uvloop"] = None; '
    "from bridge.__main__ import main; sys.exit(main())' "
    "--listen {host}:{port} --data-dir {data_dir} --log-level warning --set max_connections=0"
)
TARGET_KIB_PER_CONN = 3.0  # issue 18's target at ~19k connections
# Files a server needs besides its client sockets (listener, epoll, store, logs, stdio).
SERVER_SPARE_FILES = 200
CLIENT_SPARE_FILES = 100


# --------------------------------------------------------------------------- servers


def make_server(name: str, tmp: Path, port: int) -> Broker:
    if name == "mosquitto":
        # No connection limit and no persistence: nothing but the connections.
        settings = [
            "max_connections -1",
            "allow_anonymous true",
            "persistence false",
            f"log_dest file {tmp / MOSQUITTO_INTERNAL_LOG}",
            # Not "notice": that would log every one of the connections.
            "log_type error",
            "log_type warning",
        ]
        return mosquitto_broker(tmp, port, settings)
    return ours_broker(tmp, port, OURS_ASYNCIO_CMD if name == "ours-asyncio" else OURS_CMD, name)


# --------------------------------------------------------------------------- one server


@dataclass
class Step:
    connections: int
    rss_kib: int
    kib_per_conn: float
    marginal_kib_per_conn: float
    connect_s: float
    conns_per_s: float
    server_cpu_us_per_conn: float | None
    server_files: int | None
    connack_p99_ms_max: float
    loadgen_rss_kib: int


@dataclass
class ServerRun:
    name: str
    command: str
    status: str = "ok"
    baseline_rss_kib: int | None = None
    steps: list[Step] = field(default_factory=list)
    ping: dict[str, Any] = field(default_factory=dict)
    rss_after_close_kib: int | None = None
    peak_rss_kib: int | None = None  # VmHWM at the end: includes the disconnect storm
    errors: list[str] = field(default_factory=list)
    config: str | None = None
    loadgen_commands: list[str] = field(default_factory=list)


def measure_server(
    b: Broker, loadgen: Path, steps: list[int], args: argparse.Namespace
) -> ServerRun:
    """Start `b`, open the connections step by step, measure, ping, disconnect. Errors go into
    the result (the caller stops the server)."""
    run = ServerRun(b.name, shlex.join(b.cmd), config=b.extra.get("config"))
    log(f"\n=== {b.name}: {run.command}")
    b.start()
    b.wait_ready()
    assert b.proc is not None
    pid = b.proc.pid
    time.sleep(args.settle)
    run.baseline_rss_kib = proc_status_kib(pid, "VmRSS")
    log(f"    listening on {HOST}:{b.port} (pid {pid}), baseline VmRSS {run.baseline_rss_kib} KiB")
    fleet = ClientFleet(loadgen, b.port, args, b.name, b.workdir)
    run.loadgen_commands = [shlex.join(p.cmd) for p in fleet.procs]
    try:
        _open_steps(run, b, pid, fleet, steps, args)
        if b.alive() and run.steps and not run.errors:
            _ping(run, fleet)
        closed = merge(fleet.run(["close"] * len(fleet.procs)))
        if closed["failed"]:
            log(f"    {closed['failed']} DISCONNECTs failed: {closed['errors'][:3]}")
        time.sleep(args.settle)
        run.rss_after_close_kib = proc_status_kib(pid, "VmRSS")
        run.peak_rss_kib = proc_status_kib(pid, "VmHWM")
        if run.rss_after_close_kib is not None:
            log(
                f"    after every client disconnected: VmRSS {run.rss_after_close_kib} KiB "
                f"(peak VmHWM {run.peak_rss_kib} KiB)"
            )
    finally:
        fleet.kill()
    if not b.alive():
        run.errors.append(
            f"{b.name} died (exit code {b.proc.returncode}); log tail:\n{tail(b.log_path)}"
        )
    if run.errors:
        run.status = "failed"
    return run


def _open_steps(
    run: ServerRun,
    b: Broker,
    pid: int,
    fleet: ClientFleet,
    steps: list[int],
    args: argparse.Namespace,
) -> None:
    assert run.baseline_rss_kib is not None
    held, prev_rss = 0, run.baseline_rss_kib
    for target in steps:
        before, after = fleet.shares(held), fleet.shares(target)
        cpu0 = proc_cpu(pid)
        t0 = time.monotonic()
        replies = fleet.run([f"open {a - p}" for p, a in zip(before, after, strict=True)])
        elapsed = time.monotonic() - t0
        cpu1 = proc_cpu(pid)
        res = merge(replies)
        new = res["ok"]
        if not b.alive():
            run.errors.append(f"{b.name} died while opening connections {held}..{target}")
            return
        if not res["answered"] or res["failed"]:
            what = (
                f"{res['failed']} of {target - held} connections failed ({res['failed_by']})"
                if res["answered"]
                else "a loadgen process did not answer"
            )
            run.errors.append(
                f"{b.name}: {what} while going from {held} to {target} connections; "
                f"first errors: {res['errors'][:5]}"
            )
            log("    ERROR: " + run.errors[-1])
            return
        held += new
        time.sleep(args.settle)
        rss = proc_status_kib(pid, "VmRSS")
        if rss is None:
            run.errors.append(f"{b.name} died after opening {held} connections")
            return
        step = Step(
            connections=held,
            rss_kib=rss,
            kib_per_conn=(rss - run.baseline_rss_kib) / held,
            marginal_kib_per_conn=(rss - prev_rss) / new,
            connect_s=round(elapsed, 3),
            conns_per_s=new / elapsed,
            server_cpu_us_per_conn=(
                (cpu1 - cpu0) * 1e6 / new if cpu0 is not None and cpu1 is not None else None
            ),
            server_files=open_files(pid),
            connack_p99_ms_max=res["latency_p99_ms_max"],
            loadgen_rss_kib=fleet.rss_kib(),
        )
        run.steps.append(step)
        prev_rss = rss
        log(
            f"    {held:>6,} connections: VmRSS {rss / 1024:8.1f} MiB, "
            f"{step.kib_per_conn:6.2f} KiB/conn (marginal {step.marginal_kib_per_conn:6.2f}), "
            f"{step.conns_per_s:8,.0f} conn/s, server {step.server_files} files"
        )


def _ping(run: ServerRun, fleet: ClientFleet) -> None:
    """Every held connection must answer a PINGREQ: the connections are really alive."""
    res = merge(fleet.run(["ping"] * len(fleet.procs)))
    run.ping = res
    expected = run.steps[-1].connections
    log(
        f"    PINGREQ on all {expected:,} connections: {res['ok']:,} PINGRESP, "
        f"{res['failed']:,} failed (slowest process p99 {res['latency_p99_ms_max']:.2f} ms)"
    )
    if not res["answered"] or res["ok"] != expected:
        run.errors.append(
            f"{run.name}: only {res['ok']} of {expected} connections answered PINGREQ "
            f"({res['failed_by']}); first errors: {res['errors'][:5]}"
        )


# --------------------------------------------------------------------------- reporting

TABLE_HEAD = [
    "server",
    "connections",
    "VmRSS MiB",
    "KiB/conn",
    "marginal KiB/conn",
    "conn/s",
    "server CPU us/conn",
    "server files",
]


def table_rows(runs: list[ServerRun]) -> list[list[str]]:
    rows = []
    for run in runs:
        if run.baseline_rss_kib is not None:
            rows.append([run.name, "0", f"{run.baseline_rss_kib / 1024:.1f}", *["—"] * 5])
        for s in run.steps:
            cpu = s.server_cpu_us_per_conn
            rows.append(
                [
                    run.name,
                    f"{s.connections:,}",
                    f"{s.rss_kib / 1024:.1f}",
                    f"{s.kib_per_conn:.2f}",
                    f"{s.marginal_kib_per_conn:.2f}",
                    f"{s.conns_per_s:,.0f}",
                    "—" if cpu is None else f"{cpu:.0f}",
                    str(s.server_files),
                ]
            )
    return rows


def summary_lines(runs: list[ServerRun], max_connections: int) -> list[str]:
    """The comparison at the largest step and the issue's target for our bridge."""
    last = {r.name: r.steps[-1] for r in runs if r.steps}
    out = []
    mosq = last.get("mosquitto")
    for name, s in last.items():
        if name != "mosquitto" and mosq is not None and mosq.kib_per_conn > 0:
            out.append(
                f"{name}/mosquitto at {s.connections:,} connections: "
                f"{s.kib_per_conn / mosq.kib_per_conn:.1f}x the memory per connection"
            )
    ours = last.get("ours")
    if ours is None:
        status = "not measured"
    elif ours.connections < max_connections:
        status = f"not measured (only {ours.connections:,} connections held)"
    else:
        verdict = "met" if ours.kib_per_conn <= TARGET_KIB_PER_CONN else "not met"
        status = f"{verdict}: {ours.kib_per_conn:.2f} KiB at {ours.connections:,} connections"
    out.append(f"target (ours): <= {TARGET_KIB_PER_CONN:g} KiB VmRSS per idle connection: {status}")
    return out


def markdown(meta: dict[str, Any], runs: list[ServerRun], summary: list[str]) -> str:
    out = [
        f"Connection capacity, run {meta['finished_at']} on {meta['cpu_count']} CPU(s) "
        f"({meta['platform']}): idle MQTT 3.1.1 connections (clean session, keepalive "
        f"{IDLE_KEEPALIVE_S} s) held by one server process; KiB/conn = (VmRSS - baseline) / "
        "connections, marginal = growth since the previous step / new connections.",
        "",
        f"- command: `{meta['command']}`",
        f"- mosquitto: {meta['versions']['mosquitto']}; python: {meta['versions']['python']}",
        "",
        *md_table(TABLE_HEAD, table_rows(runs), set(range(1, len(TABLE_HEAD)))),
        "",
        *(f"- {line}" for line in summary),
    ]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--servers",
        default=DEFAULT_SERVERS,
        help="comma-separated servers to measure, in order, from "
        f"{', '.join(SERVER_NAMES)} (ours-asyncio: the bridge on asyncio's event loop "
        "instead of uvloop) (default: %(default)s)",
    )
    ap.add_argument(
        "--max-connections",
        type=int,
        default=DEFAULT_MAX,
        help="connections of the last step (default: %(default)s)",
    )
    ap.add_argument(
        "--steps",
        default=DEFAULT_STEPS,
        help="comma-separated connection counts before the maximum; counts at or above it "
        "are ignored (default: %(default)s)",
    )
    ap.add_argument(
        "--sources",
        default=DEFAULT_SOURCES,
        help="comma-separated loopback addresses the clients connect from, round-robin "
        "(default: %(default)s)",
    )
    ap.add_argument(
        "--per-process",
        type=int,
        default=DEFAULT_PER_PROCESS,
        help="most connections one loadgen process holds (default: %(default)s)",
    )
    ap.add_argument(
        "--concurrency",
        type=int,
        default=32,
        help="connections each loadgen process opens at once (default: %(default)s)",
    )
    ap.add_argument("--settle", type=float, default=2.0, help="seconds to wait before reading RSS")
    ap.add_argument(
        "--step-timeout",
        type=float,
        default=60.0,
        help="seconds one step (open, ping, close) may take (default: %(default)s)",
    )
    add_loadgen_options(ap)
    args = ap.parse_args(argv)
    args.server_list = [n.strip() for n in args.servers.split(",") if n.strip()]
    bad = [n for n in args.server_list if n not in SERVER_NAMES]
    if bad or not args.server_list:
        ap.error(f"unknown server(s) {bad}; choose from {', '.join(SERVER_NAMES)}")
    try:
        steps = {int(s) for s in args.steps.split(",") if s.strip()}
    except ValueError:
        ap.error(f"--steps: {args.steps!r} is not a list of integers")
    args.step_list = sorted(s for s in steps if 0 < s < args.max_connections)
    args.step_list.append(args.max_connections)
    args.source_list = [s.strip() for s in args.sources.split(",") if s.strip()]
    if args.max_connections < 1 or args.per_process < 1 or args.concurrency < 1:
        ap.error("--max-connections, --per-process and --concurrency must be positive")
    if not args.source_list or not all(s.startswith("127.") for s in args.source_list):
        ap.error("--sources must be loopback (127.x.y.z) addresses")
    check_limits(ap, args)
    # Every step and the final ping and close, with slack: then the loadgens end themselves.
    args.client_timeout = int((len(args.step_list) + 2) * (args.step_timeout + args.settle) + 60)
    return args


def check_limits(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse up front what cannot work: more files than a process may open, or more
    connections than the source addresses have ephemeral ports."""
    files, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if args.max_connections + SERVER_SPARE_FILES > files:
        ap.error(
            f"--max-connections {args.max_connections}: the server would need about "
            f"{args.max_connections + SERVER_SPARE_FILES} open files; the limit is {files}"
        )
    if args.per_process + CLIENT_SPARE_FILES > files:
        ap.error(f"--per-process {args.per_process}: above the open-file limit {files}")
    ports = local_port_range()
    per_source = math.ceil(args.max_connections / len(args.source_list))
    if per_source > ports * 0.8:
        ap.error(
            f"{per_source} connections per source address, but each has only {ports} ephemeral "
            "ports (some may be in TIME_WAIT from earlier runs): add --sources"
        )


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    command = shlex.join([sys.executable, str(Path(__file__)), *argv])
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    t0 = time.monotonic()
    meta: dict[str, Any] = run_meta(
        command,
        versions=tool_versions(),
        max_connections=args.max_connections,
        steps=args.step_list,
        sources=args.source_list,
        per_process=args.per_process,
        concurrency_per_process=args.concurrency,
        keepalive_s=IDLE_KEEPALIVE_S,
        settle_s=args.settle,
        open_files_limit=resource.getrlimit(resource.RLIMIT_NOFILE)[0],
    )
    log(f"command:   {command}")
    log(f"mosquitto: {meta['versions']['mosquitto']}")
    log(
        f"steps:     {', '.join(f'{s:,}' for s in args.step_list)} connections from "
        f"{', '.join(args.source_list)}, at most {args.per_process:,} per loadgen process"
    )
    loadgen = args.loadgen or build_loadgen(args.cache_dir)
    meta["loadgen"] = str(loadgen)

    runs: list[ServerRun] = []
    args.results_dir.mkdir(parents=True, exist_ok=True)
    for name in args.server_list:
        tmp = Path(tempfile.mkdtemp(prefix=f"mqtt-capacity-{name}-"))
        b = make_server(name, tmp, free_port())
        with stopped_at_exit(b, tmp, args.results_dir, "conn-capacity-"):
            try:
                runs.append(measure_server(b, loadgen, args.step_list, args))
            except (RuntimeError, OSError) as e:
                runs.append(ServerRun(name, shlex.join(b.cmd), status="failed", errors=[str(e)]))
                log(f"    ERROR: {e}")

    meta["finished_at"] = utc_now()
    meta["wall_s"] = round(time.monotonic() - t0, 1)
    meta["loadavg_end"] = loadavg()
    summary = summary_lines(runs, args.max_connections)
    doc = {
        "meta": meta,
        "servers": {r.name: asdict(r) for r in runs},
        "summary": summary,
    }
    wrote = write_results(args.results_dir, "conn-capacity", doc, markdown(meta, runs, summary))

    log("")
    log(plain_table(TABLE_HEAD, table_rows(runs), right=set(range(1, len(TABLE_HEAD)))))
    log("")
    for line in summary:
        log(line)
    failed = [r for r in runs if r.status != "ok"]
    for r in failed:
        log(f"FAILED {r.name}: " + "\n    ".join(r.errors))
    log(f"{wrote} (total {meta['wall_s']:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
