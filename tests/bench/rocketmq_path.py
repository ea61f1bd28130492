#!/usr/bin/env python3
"""The same QoS 1 load, in one invocation on one box, against four systems (issue 14, point 4):

1. ``mosquitto``: Debian's Mosquitto, stock config plus persistence (as run_bench.py runs it);
2. ``bridge``: one bridge on its embedded store (``python -m bridge``, as run_bench.py's ``ours``);
3. ``cluster``: three bridge nodes on RocketMQ 5.3.3 (SYNC_FLUSH, full JIT) with Redis and
   HAProxy (``BenchCluster``, as cluster_bench.py builds it); publishers connect to node1,
   subscribers to node2, so every message crosses nodes;
4. ``java``: no gateway: RocketMQ's official Java client (rocketmq-client 5.3.3) against a
   RocketMQ started the same way (SYNC_FLUSH, same JVM options): a producer JVM sending
   synchronously with a fixed number of sends in flight and a push-consumer JVM
   (tests/bench/java/PathClient.java).

Run from the repository root (``make bench`` does this)::

    .venv/bin/python tests/bench/rocketmq_path.py [--quick] [--rounds 2] [--only cluster,java]

Loads (tests/bench/README.md, "RocketMQ path", says exactly what is sent):

- the users' load: ``mosquitto_sub -q 1 -c -i ID -C N`` and ``mosquitto_pub -q 1 -l`` fed N
  lines (libmosquitto's 20 in flight), 100 B and 2 KB payloads; Java: the same N and size with
  20 sends in flight;
- our loadgen, QoS 1 2 KB: 1 -> 1 and 10 -> 10 (a topic per pair) throughput with a window of
  100, and latency at a fixed 1,000 msg/s; Java: 1 -> 1 with 100 sends in flight, and the
  latency load's equivalent: paced at 1,000 msg/s for as long, asynchronous sends, at most 100
  unacknowledged (the loadgen's window), send -> receive on the wall clock of both JVMs.

Every run records the CPU of every process involved (from /proc, and the load tools' rusage) per
delivered message. The headline: the RocketMQ broker's CPU per message delivered through the
gateway cluster divided by its CPU per message between the Java producer and consumer.

Prints tables, writes tests/bench/results/rocketmq_path.{json,md} and the logs of every
system. Bounded: message counts, per-run caps, a time budget per system; a system that fails
is recorded as failed and the others still run; every process started is stopped in a
``finally`` (also on Ctrl-C and SIGTERM). Exit status 1 if a system failed or a run reported
an error or missing messages.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.harness.cluster import SHUTDOWN_INCIDENT, BenchCluster, LogWatcher, log_summary
from tests.bench.harness.common import (
    HOST,
    Budget,
    begin,
    copy_logs,
    first_line,
    free_port,
    log,
    run_text,
    tool_versions,
    utc_now,
)
from tests.bench.harness.javaclient import JavaClients, ensure_client
from tests.bench.harness.loadgen import add_loadgen_options, build_loadgen, loadgen_args
from tests.bench.harness.path_report import SYSTEMS, describe, report
from tests.bench.harness.pathruns import (
    MOSQUITTO_PUB,
    Load,
    Target,
    idle_cpu,
    loadgen_run,
    mosquitto_drops,
    mqtt_run,
    warm_up,
)
from tests.bench.harness.processes import ours_broker, stock_mosquitto, stopped_at_exit
from tests.bench.harness.procfs import loadavg, run_meta, session_pids
from tests.bench.harness.producer import DEFAULT_PRODUCER_JAVA_OPTS
from tests.bench.harness.rocketmq import add_rocketmq_option, local_rocketmq, stop_rocketmq
from tests.support.rocketmq import LocalRocketMQ

NAME = "rocketmq_path"
OURS_CMD = "{python} -m bridge --listen {host}:{port} --data-dir {data_dir} --log-level warning"
SETTLE = "500ms"  # loadgen -settle: subscriptions reach every node of the cluster first
USERS_INFLIGHT = 20  # libmosquitto's default max_inflight_messages, hence mosquitto_pub's
WINDOW = 100  # the loadgen's QoS 1 window
LAT_RATE = 1000  # msg/s of the latency load


@dataclass(frozen=True)
class Sizing:
    """Counts and caps of one invocation (default or --quick)."""

    users_count: int
    users_timeout_s: float
    tp_count: int
    tp_duration_s: float
    tp_timeout_s: float
    tp_idle: str
    lat_duration_s: float
    lat_timeout_s: float
    warmup_max_s: float  # a RocketMQ broker's warm-up, until its JIT is quiet
    idle_s: float  # RocketMQ's idle CPU, measured after the warm-up
    budget_s: dict[str, float] = field(default_factory=dict)  # per system and round


DEFAULT = Sizing(
    users_count=10_000,
    users_timeout_s=40,
    tp_count=100_000,
    tp_duration_s=10,
    tp_timeout_s=20,
    tp_idle="2s",
    lat_duration_s=5,
    lat_timeout_s=12,
    warmup_max_s=45,
    idle_s=3,
    budget_s={"mosquitto": 60, "bridge": 70, "cluster": 90, "java": 75},
)
QUICK = Sizing(
    users_count=3_000,
    users_timeout_s=10,
    tp_count=10_000,
    tp_duration_s=3,
    tp_timeout_s=8,
    tp_idle="1s",
    lat_duration_s=2,
    lat_timeout_s=6,
    warmup_max_s=15,
    idle_s=2,
    budget_s={"mosquitto": 40, "bridge": 40, "cluster": 45, "java": 45},
)


def build_loads(s: Sizing) -> list[Load]:
    """The loads, in the order each system runs them."""
    loads = [
        Load(
            f"users_{'100B' if size == 100 else '2KB'}",
            "users' load: mosquitto_pub -l, 20 in flight (Java: 20)",
            "users",
            size,
            s.users_timeout_s,
            count=s.users_count,
            java_inflight=USERS_INFLIGHT,
        )
        for size in (100, 2048)
    ]
    for key, title, n in (
        ("lg_1to1_2KB", "loadgen 1 -> 1, window 100 (Java: 100 in flight)", 1),
        ("lg_10to10_2KB", "loadgen 10 -> 10 (a topic per pair), window 100", 10),
    ):
        flags = {"-stamp": "true", "-settle": SETTLE, **({"-pairs": "true"} if n > 1 else {})}
        args = loadgen_args(
            "throughput",
            1,
            pubs=n,
            subs=n,
            size=2048,
            count=s.tp_count,
            duration=s.tp_duration_s,
            timeout=s.tp_timeout_s,
            idle=s.tp_idle,
            window=WINDOW,
            flags=flags,
        )
        java = WINDOW if n == 1 else None
        loads.append(Load(key, title, "loadgen", 2048, s.tp_timeout_s, s.tp_count, args, java))
    lat = loadgen_args(
        "latency",
        1,
        size=2048,
        rate=LAT_RATE,
        duration=s.lat_duration_s,
        timeout=s.lat_timeout_s,
        window=WINDOW,
        flags={"-settle": SETTLE},
    )
    loads.append(
        Load(
            "lg_lat_2KB",
            f"loadgen latency @ {LAT_RATE:,} msg/s (Java: paced, up to 100 in flight)",
            "loadgen",
            2048,
            s.lat_timeout_s,
            count=int(LAT_RATE * s.lat_duration_s),
            args=lat,
            java_inflight=WINDOW,
            mode="latency",
            rate=LAT_RATE,
        )
    )
    return loads


def mqtt_warmup_args(quick: bool, pairs: int, seconds: int) -> dict[str, str]:
    """An unreported QoS 1 2 KB run (connection set-up, imports, a JVM's JIT)."""
    return loadgen_args(
        "throughput",
        1,
        pubs=pairs,
        subs=pairs,
        size=2048,
        count=5_000 if quick else 100_000,
        duration=seconds,
        timeout=seconds + 8,
        flags={"-settle": SETTLE, **({"-pairs": "true"} if pairs > 1 else {})},
    )


# --------------------------------------------------------------------------- one system


def run_loads(
    name: str,
    loads: list[Load],
    rounds: int,
    budget: Budget,
    one: Callable[[Load], dict[str, Any]],
    alive: Callable[[], list[str]],
) -> dict[str, list[dict[str, Any]]]:
    """Every load `rounds` times (round after round, so that noise spreads over all loads),
    within the budget; a run that raises is recorded as failed, the next one still runs."""
    runs: dict[str, list[dict[str, Any]]] = {load.key: [] for load in loads}
    for rnd in range(1, rounds + 1):
        for load in loads:
            if skipped := budget.skip(load.key, load.timeout_s + 5):
                runs[load.key].append(skipped)
                continue
            if dead := alive():
                runs[load.key].append({"skipped": f"{', '.join(dead)} not running"})
                log(f"    {load.key:<15} skipped ({', '.join(dead)} died)")
                continue
            try:
                res = one(load)
            except (RuntimeError, OSError, subprocess.SubprocessError, KeyError) as e:
                res = {"errors": [f"{type(e).__name__}: {e}"]}
            res["round"] = rnd
            runs[load.key].append(res)
            log("    " + describe(name, load, res))
    return runs


FAILURES = (RuntimeError, OSError, subprocess.SubprocessError, TimeoutError, KeyError)


@contextlib.contextmanager
def failure_recorded(out: dict[str, Any]) -> Iterator[None]:
    """A system that fails to start or dies is recorded as failed, with the reason, and the
    next system still runs; what it measured before stays in `out`."""
    try:
        yield
    except FAILURES as e:
        out["status"] = "failed"
        out["errors"].append(f"{type(e).__name__}: {e}")
        log(f"    FAILED: {e}")


def bench_single(name: str, args: argparse.Namespace, env: dict[str, Any]) -> dict[str, Any]:
    """Mosquitto or the bridge on its embedded store: start, warm up, every load, stop."""
    tmp = Path(tempfile.mkdtemp(prefix=f"mqtt-bench-path-{name}-"))
    port = free_port()
    b = stock_mosquitto(tmp, port) if name == "mosquitto" else ours_broker(tmp, port, OURS_CMD)
    out: dict[str, Any] = {"status": "ok", "command": shlex.join(b.cmd), "errors": []}
    if "config" in b.extra:
        out["config"] = b.extra["config"]
    with stopped_at_exit(b, tmp, args.results_dir, f"{NAME}-"), failure_recorded(out):
        b.start()
        b.wait_ready()
        assert b.proc is not None
        pid = b.proc.pid
        log(f"    listening on {HOST}:{port} (pid {pid})")
        warm = loadgen_run(env["loadgen"], port, mqtt_warmup_args(args.quick, 1, 3), 11, {})
        log(f"    warm-up: {warm.get('msgs_per_s') or 0:,.0f} msg/s")
        target = Target(
            port,
            port,
            roles=lambda: {name: session_pids(pid) or [pid]},
            alive=lambda: [] if b.alive() else [name],
            after_run=mosquitto_drops(b.extra["internal_log"]) if name == "mosquitto" else None,
        )
        out["runs"] = run_loads(
            name,
            env["loads"],
            args.rounds,
            Budget(env["sizing"].budget_s[name] * args.rounds),
            lambda load: mqtt_run(target, load, env["loadgen"], tmp, 0.0),
            target.alive,
        )
    return out


def bench_cluster(args: argparse.Namespace, env: dict[str, Any]) -> dict[str, Any]:
    """Three nodes on RocketMQ with Redis and HAProxy: start, warm up, every load, stop."""
    tmp = Path(tempfile.mkdtemp(prefix="mqtt-bench-path-cluster-"))
    cluster = BenchCluster(tmp, args.rocketmq_java_opts)
    watcher = LogWatcher(cluster.nodes)
    out: dict[str, Any] = {"status": "ok", "errors": []}
    try:
        with failure_recorded(out):
            cluster.start()
            for _ in range(3):
                cluster.add_node()
            cluster_runs(cluster, watcher, args, env, out)
    finally:
        try:
            out["info"] = cluster.info()
            cluster.stop()
        finally:
            watcher.collect("shutdown", SHUTDOWN_INCIDENT)
            out["node_log_incidents"] = watcher.incidents
            copy_logs(cluster.logs(), args.results_dir, f"{NAME}-cluster-")
            shutil.rmtree(tmp, ignore_errors=True)
    if watcher.incidents:
        out["errors"].append(f"{len(watcher.incidents)} incident(s) in the node logs")
    return out


def cluster_runs(
    cluster: BenchCluster,
    watcher: LogWatcher,
    args: argparse.Namespace,
    env: dict[str, Any],
    out: dict[str, Any],
) -> None:
    """The cluster's runs: publishers on node1, subscribers on node2, after a warm-up that lasts
    until the broker's JIT is quiet; every warning a node logs is kept with its run."""
    node1, node2 = cluster.nodes["node1"], cluster.nodes["node2"]
    broker_pid = cluster.mq.pid("broker")

    def after_run(key: str) -> dict[str, Any]:
        problems = watcher.collect(key)
        if problems:
            log(f"{'':<20}node logs: {log_summary(problems)}")
        return {"node_log": problems} if problems else {}

    target = Target(
        node1.port, node2.port, cluster.cpu_pids, cluster.dead_nodes, broker_pid, after_run
    )
    warm = target.loadgen_args(mqtt_warmup_args(args.quick, 10, 3 if args.quick else 5))
    out["warmup"] = warm_up(
        lambda: loadgen_run(env["loadgen"], node1.port, warm, 20, {}),
        broker_pid,
        env["sizing"].warmup_max_s,
    )
    watcher.collect("start and warm-up")
    out["idle_cpu_percent"] = idle_cpu(cluster.cpu_pids(), env["sizing"].idle_s, broker_pid)
    log(f"    idle: {fmt_idle(out['idle_cpu_percent'])}")
    out["runs"] = run_loads(
        "cluster",
        env["loads"],
        args.rounds,
        Budget(env["sizing"].budget_s["cluster"] * args.rounds),
        lambda load: mqtt_run(target, load, env["loadgen"], cluster.workdir, 0.5),
        target.alive,
    )


def bench_java(args: argparse.Namespace, env: dict[str, Any]) -> dict[str, Any]:
    """RocketMQ alone with the Java producer and consumer: start, warm up, the loads that have a
    Java equivalent (same size and count, the same number in flight), stop."""
    tmp = Path(tempfile.mkdtemp(prefix="mqtt-bench-path-java-"))
    mq = local_rocketmq(tmp / "rocketmq", args.rocketmq_java_opts, "SYNC_FLUSH")
    clients: JavaClients | None = None
    out: dict[str, Any] = {"status": "ok", "errors": [], "client_java_opts": args.client_java_opts}
    try:
        with failure_recorded(out):
            classpath = ensure_client(args.java_cache_dir)
            log(f"    starting RocketMQ (namesrv {mq.namesrv_addr}, SYNC_FLUSH) ...")
            started = time.monotonic()
            mq.start()
            out["rocketmq_start_s"] = round(time.monotonic() - started, 1)
            log(f"    RocketMQ up in {out['rocketmq_start_s']} s (broker pid {mq.pid('broker')})")
            out["info"] = {
                "namesrv": mq.namesrv_addr,
                "broker": mq.broker_addr,
                "flush_disk_type": mq.flush_disk_type,
                "java_opts": args.rocketmq_java_opts,
            }
            clients = JavaClients(mq, classpath, args.client_java_opts, tmp)
            out["commands"] = clients.commands()
            java_runs(mq, clients, args, env, out)
    finally:
        try:
            if clients is not None:
                out["client_restarts"] = clients.restarts
                clients.stop()
        finally:
            stop_rocketmq(mq)
            logs = {p.name: p for p in tmp.glob("java-*.log")}
            logs["java-rocketmq-broker.log"] = mq.log_dir / "broker.log"
            logs["java-clients-rocketmq.log"] = mq.log_dir / "tools.log"  # the clients' own log
            copy_logs(logs, args.results_dir, f"{NAME}-")
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def java_runs(
    mq: LocalRocketMQ,
    clients: JavaClients,
    args: argparse.Namespace,
    env: dict[str, Any],
    out: dict[str, Any],
) -> None:
    """The Java runs, after a warm-up (2 KB, 100 in flight) that lasts until the broker's JIT
    is quiet; a users' load run sends all its messages, a loadgen equivalent stops publishing
    after the loadgen's publish phase; the latency load's is paced at its rate for as long."""
    broker_pid = mq.pid("broker")

    def roles() -> dict[str, list[int]]:
        pids = {"rocketmq": mq.pid("broker"), "namesrv": mq.pid("namesrv")}
        return {role: [pid] for role, pid in pids.items() if pid is not None}

    def java(load: Load, duration_s: float | None = None) -> dict[str, Any]:
        assert load.java_inflight is not None
        if duration_s is None and load.mode == "latency":
            duration_s = env["sizing"].lat_duration_s
        elif duration_s is None:
            duration_s = env["sizing"].tp_duration_s if load.kind == "loadgen" else load.timeout_s
        return clients.run(
            size=load.size,
            count=load.count,
            inflight=load.java_inflight,
            duration_s=duration_s,
            timeout_s=load.timeout_s,
            roles=roles(),
            jit_pid=broker_pid,
            rate=load.rate,
        )

    warm = Load("warm-up", "", "loadgen", 2048, 20, 100_000, java_inflight=WINDOW)
    out["warmup"] = warm_up(
        lambda: java(warm, 3 if args.quick else 5), broker_pid, env["sizing"].warmup_max_s
    )
    out["idle_cpu_percent"] = idle_cpu(roles(), env["sizing"].idle_s, broker_pid)
    log(f"    idle: {fmt_idle(out['idle_cpu_percent'])}")
    out["runs"] = run_loads(
        "java",
        [load for load in env["loads"] if load.java_inflight is not None],
        args.rounds,
        Budget(env["sizing"].budget_s["java"] * args.rounds),
        java,
        lambda: [] if mq.pid("broker") else ["the RocketMQ broker"],
    )


def fmt_idle(pct: dict[str, float]) -> str:
    return ", ".join(f"{role} {v:.0f}%" for role, v in pct.items()) + " of a core"


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--only",
        default=",".join(SYSTEMS),
        help="comma-separated systems to run, from %(default)s (default: all four)",
    )
    ap.add_argument("--quick", action="store_true", help="small counts and caps: a smoke run")
    ap.add_argument(
        "--rounds", type=int, default=None, help="runs of every load (default 2, quick 1)"
    )
    add_rocketmq_option(ap, "the RocketMQ JVMs of the cluster and of the Java comparison")
    ap.add_argument(
        "--client-java-opts",
        default=DEFAULT_PRODUCER_JAVA_OPTS,
        help="JVM options of the Java producer and consumer (default: %(default)s)",
    )
    ap.add_argument(
        "--java-cache-dir",
        type=Path,
        default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mqtt-bridge",
        help="where PathClient.java is compiled to (default: %(default)s)",
    )
    add_loadgen_options(ap)
    args = ap.parse_args(argv)
    args.systems = [s.strip() for s in args.only.split(",") if s.strip()]
    if not args.systems or set(args.systems) - set(SYSTEMS):
        ap.error(f"--only: choose from {', '.join(SYSTEMS)}")
    args.systems = [s for s in SYSTEMS if s in args.systems]
    if args.rounds is None:
        args.rounds = 1 if args.quick else 2
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args, command, t0 = begin(str(Path(__file__)), argv, parse_args)
    sizing = QUICK if args.quick else DEFAULT
    loads = build_loads(sizing)
    meta: dict[str, Any] = run_meta(
        command,
        versions={
            **tool_versions(python_path=False),
            "mosquitto_clients": next(
                (
                    line
                    for line in run_text([MOSQUITTO_PUB, "--help"]).splitlines()
                    if "version" in line
                ),
                "unknown",
            ),
            "java": first_line(run_text(["java", "-version"])),
        },
        quick=args.quick,
        rounds=args.rounds,
        systems=args.systems,
        rocketmq_java_opts=args.rocketmq_java_opts,
        loads={load.key: load.info() for load in loads},
    )
    log(f"command: {command}")
    log(f"cpus:    {meta['cpu_count']} ({meta['platform']}), load average {loadavg()}")
    args.results_dir.mkdir(parents=True, exist_ok=True)
    env: dict[str, Any] = {"loads": loads, "sizing": sizing, "loadgen": None}
    if set(args.systems) - {"java"}:
        env["loadgen"] = args.loadgen or build_loadgen(args.cache_dir)
        meta["loadgen"] = str(env["loadgen"])

    systems: dict[str, Any] = {}
    for name in args.systems:
        log(f"\n=== {name}: {SYSTEMS[name]}")
        started = time.monotonic()
        try:
            if name == "cluster":
                systems[name] = bench_cluster(args, env)
            elif name == "java":
                systems[name] = bench_java(args, env)
            else:
                systems[name] = bench_single(name, args, env)
        except FAILURES as e:  # before the system's own record of its failure
            systems[name] = {"status": "failed", "errors": [f"{type(e).__name__}: {e}"]}
            log(f"    FAILED: {e}")
        systems[name]["wall_s"] = round(time.monotonic() - started, 1)

    meta["finished_at"] = utc_now()
    meta["wall_s"] = round(time.monotonic() - t0, 1)
    meta["loadavg_end"] = loadavg()
    failed = report(meta, loads, systems, args.results_dir, NAME)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
