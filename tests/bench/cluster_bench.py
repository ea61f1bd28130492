#!/usr/bin/env python3
"""Cluster benchmark: three bridge nodes behind HAProxy, side by side with one Mosquitto, and the
same workload on 1, 2 and 3 nodes.

Run from the repository root (``make bench`` does this)::

    .venv/bin/python tests/bench/cluster_bench.py [--quick] [--brokers cluster,mosquitto]

What it starts, all on 127.0.0.1 free ports under one temp dir: Redis (``LocalRedis``, the
cluster registry), RocketMQ 5.3.3 (``LocalRocketMQ``, SYNC_FLUSH, full JIT), bridge nodes joined
as one cluster the way ``tests/support/cluster.py`` configures them (``store=rocketmq``,
``redis_url``, ``cluster_name``, ``rocketmq_namespace``, ``node_id``, ``peer_listen``; every
other setting at its default) and HAProxy in front (``LocalHAProxy``: L4, ``balance
leastconn``). Then Mosquitto alone, with the same workloads.

Stages, one cluster that grows like ``deploy/cluster/add-node.sh`` grows it (each new node
links to the others through Redis, then HAProxy reloads with it):

1. node1 behind HAProxy: the scaling workloads (the ``lb_`` throughput runs);
2. node1 + node2: the scaling workloads again;
3. node1 + node2 + node3: every scenario. The scaling workloads of this stage give the 3-node
   figure of the scaling table.

Scenarios (``x_``: cross-node, publishers connect straight to node1 and subscribers to node2 and
node3, so every message crosses a node boundary; ``lb_``: every client through HAProxy). With
equal connection counts, HAProxy's leastconn hands consecutive connections to the nodes in turn,
so the order of the connects decides which pairs share a node: with all subscribers first, 10
pairs would all be local on 2 nodes and all split on 3. The ``lb_`` runs therefore connect
subscriber i and publisher i one after the other (loadgen ``-interleave``): with 2 or more nodes
every pair is split over two nodes, as in the ``x_`` runs, and the scaling table compares like
with like.

- 10 -> 10 QoS 0 and QoS 1 throughput (10 publisher -> subscriber pairs, a topic per pair, as in
  run_bench.py's ``rq_tp_qos1_10to10``), 100 B and 2 KB; the QoS 1 runs stamp every payload;
- QoS 0 and QoS 1 latency at a fixed 1,000 msg/s, 2 KB (as ``rq_lat_qos1_2KB``).

QoS 0 crosses nodes over the peer links; QoS 1 goes through RocketMQ and the subscriber's node
is woken. Every loadgen run pauses ``-settle`` after the last SUBACK before publishing: the
cluster replicates subscriptions to the other nodes asynchronously, and the measurement is of
the steady state, not of that propagation.

CPU per process is read from ``/proc/PID/stat`` (utime + stime, all threads) before and after
every run: each bridge node, the RocketMQ broker and NameServer JVMs, HAProxy (master and
workers), Redis; the loadgen from the harness's RUSAGE_CHILDREN over the same window; the
machine's busy time from ``/proc/stat``, and the rest of it as "others" (other work on the box).
With two shared cores that table says where the CPU went, and so what limits scaling here.

Prints tables and writes tests/bench/results/cluster-bench.{json,md} plus every process's log
(cluster-bench-*.log). Bounded: message counts, loadgen hard caps, a time budget for the cluster
and one for Mosquitto after which remaining runs are skipped; every process started is stopped
in a ``finally`` (also on Ctrl-C and SIGTERM). The exit status is 1 if something failed to start,
a run reported an error, QoS 1 lost messages, or a node died or logged an incident during the
runs (an error, a traceback, a peer link that broke or timed out, a live node declared dead):
every warning a node logs is shown under the run during which it appeared.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.harness.cluster import (
    NODE_IDS,
    SHUTDOWN_INCIDENT,
    BenchCluster,
    ClusterScenario,
    LogWatcher,
    log_summary,
    measured_run,
)
from tests.bench.harness.cluster_report import RESULT_PREFIX, describe, report
from tests.bench.harness.common import (
    HOST,
    Budget,
    begin,
    copy_logs,
    free_port,
    log,
    matching,
    tail,
    tool_versions,
    utc_now,
)
from tests.bench.harness.loadgen import (
    add_loadgen_options,
    build_loadgen,
    loadgen_args,
    run_loadgen,
)
from tests.bench.harness.processes import stock_mosquitto
from tests.bench.harness.procfs import loadavg, run_meta
from tests.bench.harness.report import payload_label
from tests.bench.harness.rocketmq import add_rocketmq_option

# Pause between the last SUBACK and the first publish (loadgen -settle), see the docstring.
SETTLE = "500ms"


# --------------------------------------------------------------------------- scenarios


ROUTE_TITLES = {"x": "cross-node (pubs node1, subs node2/3)", "lb": "via HAProxy"}


def build_scenarios(quick: bool) -> list[ClusterScenario]:
    if quick:
        tp_dur, tp_timeout, tp_idle = 3.0, 10.0, "1s"
        counts = {0: 30_000, 1: 5_000}
        lat_dur, lat_timeout = 2.0, 6.0
    else:
        # Hard cap well above the publish phase: QoS 1 delivery lags behind publishing (its
        # backlog drains after the last publish).
        tp_dur, tp_timeout, tp_idle = 10.0, 20.0, "2s"
        counts = {0: 300_000, 1: 60_000}
        lat_dur, lat_timeout = 5.0, 12.0
    out: list[ClusterScenario] = []
    for route in ("x", "lb"):
        for qos in (0, 1):
            for size in (100, 2048):
                sz = payload_label(size).replace(" ", "")
                out.append(
                    ClusterScenario(
                        key=f"{route}_tp_qos{qos}_10to10_{sz}",
                        title=f"{ROUTE_TITLES[route]}: QoS{qos} 10 pubs -> 10 subs, topic per pair",
                        route=route,
                        mode="throughput",
                        qos=qos,
                        size=size,
                        timeout_s=tp_timeout,
                        scaling=route == "lb",
                        args=loadgen_args(
                            "throughput",
                            qos,
                            pubs=10,
                            subs=10,
                            size=size,
                            count=counts[qos],
                            duration=tp_dur,
                            timeout=tp_timeout,
                            idle=tp_idle,
                            flags={
                                "-pairs": "true",
                                "-settle": SETTLE,
                                **({"-interleave": "true"} if route == "lb" else {}),
                                **({"-stamp": "true"} if qos == 1 else {}),
                            },
                        ),
                    )
                )
        for qos in (0, 1):
            out.append(
                ClusterScenario(
                    key=f"{route}_lat_qos{qos}_2KB",
                    title=f"{ROUTE_TITLES[route]}: QoS{qos} latency @ 1000 msg/s",
                    route=route,
                    mode="latency",
                    qos=qos,
                    size=2048,
                    timeout_s=lat_timeout,
                    args=loadgen_args(
                        "latency",
                        qos,
                        size=2048,
                        rate=1000,
                        duration=lat_dur,
                        timeout=lat_timeout,
                        flags={"-settle": SETTLE},
                    ),
                )
            )
    return out


def cluster_warmup_args(quick: bool, seconds: int) -> dict[str, str]:
    """QoS 1 10 -> 10 pairs, 2 KB, through HAProxy: runs RocketMQ's send path until the JIT has
    compiled it (a cold JVM is several times slower for its first seconds) and exercises a node
    that was just added before it is measured."""
    return loadgen_args(
        "throughput",
        1,
        pubs=10,
        subs=10,
        size=2048,
        count=5000 if quick else 100_000,
        duration=f"{seconds}s",
        timeout=f"{seconds + 6}s",
        flags={"-pairs": "true", "-settle": SETTLE},
    )


MOSQUITTO_WARMUP = loadgen_args(
    "throughput",
    1,
    pubs=10,
    subs=10,
    size=2048,
    count=20_000,
    duration="3s",
    timeout="8s",
    flags={"-pairs": "true"},
)


def loadgen_target(sc: ClusterScenario, cluster: BenchCluster) -> tuple[int, dict[str, str]]:
    """The port for -addr and the loadgen arguments of `sc` on the cluster as it is now."""
    assert cluster.lb is not None
    if sc.route == "lb":
        return cluster.lb.frontend_port, sc.args
    ports = [n.port for n in cluster.nodes.values()]
    subs = ",".join(f"{HOST}:{p}" for p in ports[1:])
    return ports[0], {**sc.args, "-pub-addr": f"{HOST}:{ports[0]}", "-sub-addr": subs}


def run_cluster(
    cluster: BenchCluster,
    scenarios: list[ClusterScenario],
    loadgen: Path,
    quick: bool,
    budget_s: float,
    watcher: LogWatcher,
) -> dict[str, Any]:
    """Start the cluster and run the stages; results per node count. Raises on a failure to
    start; the caller stops the cluster."""
    out: dict[str, Any] = {"status": "ok", "stages": {}, "errors": []}
    cluster.start()
    budget = Budget(budget_s)
    for n_nodes in range(1, len(NODE_IDS) + 1):
        cluster.add_node()
        warm_s = (5 if quick else 8) if n_nodes == 1 else 3
        assert cluster.lb is not None
        res, _ = run_loadgen(
            loadgen, cluster.lb.frontend_port, cluster_warmup_args(quick, warm_s), "raw", 30
        )
        log(
            f"    warm-up ({n_nodes} node(s), QoS 1 2 KB 10 pairs via HAProxy): "
            f"{res.get('msgs_per_s', 0):,.0f} msg/s {'; '.join(res.get('errors') or [])}"
        )
        if problems := watcher.collect(f"{n_nodes} node(s): start and warm-up"):
            log(f"{'':<26}node logs: {log_summary(problems)}")
        stage: dict[str, Any] = {}
        out["stages"][str(n_nodes)] = {"nodes": list(cluster.nodes), "scenarios": stage}
        todo = [sc for sc in scenarios if n_nodes == len(NODE_IDS) or sc.scaling]
        for sc in todo:
            if skipped := budget.skip(sc.key, sc.timeout_s):
                stage[sc.key] = skipped
                continue
            dead = cluster.dead_nodes()
            if dead:
                stage[sc.key] = {"skipped": f"node(s) {', '.join(dead)} not running"}
                log(f"    {sc.key:<22} skipped ({', '.join(dead)} died)")
                continue
            port, args = loadgen_target(sc, cluster)
            res = measured_run(loadgen, port, args, sc.timeout_s, cluster.cpu_pids())
            res["rss_mb_after"] = cluster.rss_mb()
            res["node_log"] = watcher.collect(f"{n_nodes} node(s): {sc.key}")
            stage[sc.key] = res
            log("    " + describe(sc, res))
            if res["node_log"]:
                log(f"{'':<26}node logs: {log_summary(res['node_log'])}")
        for node_id in cluster.dead_nodes():
            assert cluster.nodes[node_id].proc is not None
            msg = (
                f"{node_id} died (code {cluster.nodes[node_id].proc.returncode}); log tail:\n"
                f"{tail(cluster.nodes[node_id].log_path)}"
            )
            out["errors"].append(msg)
            log("    " + msg)
            return out
    return out


def run_mosquitto(
    workdir: Path, scenarios: list[ClusterScenario], loadgen: Path, nodelay: bool, budget_s: float
) -> dict[str, Any]:
    """Every scenario once against one Mosquitto (clients connect to it directly: it has no
    nodes to cross or balance over)."""
    b = stock_mosquitto(workdir, free_port(), nodelay)
    out: dict[str, Any] = {
        "status": "ok",
        "command": shlex.join(b.cmd),
        "config": b.extra["config"],
        "scenarios": {},
        "errors": [],
    }
    try:
        b.start()
        b.wait_ready()
        assert b.proc is not None
        log(f"    listening on {HOST}:{b.port} (pid {b.proc.pid})")
        budget = Budget(budget_s)
        run_loadgen(loadgen, b.port, MOSQUITTO_WARMUP, "raw", 30)
        for sc in scenarios:
            if skipped := budget.skip(sc.key, sc.timeout_s):
                out["scenarios"][sc.key] = skipped
                continue
            if not b.alive():
                out["errors"].append(f"mosquitto died; log tail:\n{tail(b.log_path)}")
                break
            res = measured_run(loadgen, b.port, sc.args, sc.timeout_s, {"mosquitto": [b.proc.pid]})
            out["scenarios"][sc.key] = res
            log("    " + describe(sc, res))
    finally:
        b.stop()
    out["logs"] = b.logs()
    return out


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--brokers",
        default="cluster,mosquitto",
        help="comma-separated, from cluster and mosquitto (default: %(default)s)",
    )
    ap.add_argument("--quick", action="store_true", help="small counts, smoke run")
    ap.add_argument(
        "--scenarios",
        default="",
        help="comma-separated substrings; run only matching scenario keys",
    )
    ap.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds for the cluster's runs, counted once RocketMQ is up, after which the "
        "remaining runs are skipped (default 330, quick 120); Mosquitto gets a third of it",
    )
    ap.add_argument(
        "--mosquitto-nodelay",
        action="store_true",
        help="add `set_tcp_nodelay true` to Mosquitto's config (default: stock, Nagle on)",
    )
    add_rocketmq_option(ap)
    add_loadgen_options(ap)
    args = ap.parse_args(argv)
    args.broker_list = [b.strip() for b in args.brokers.split(",") if b.strip()]
    if not args.broker_list or set(args.broker_list) - {"cluster", "mosquitto"}:
        ap.error("--brokers: choose from cluster, mosquitto")
    if args.budget is None:
        args.budget = 120.0 if args.quick else 330.0
    return args


def main(argv: list[str] | None = None) -> int:
    args, command, t0 = begin(str(Path(__file__)), argv, parse_args)
    meta: dict[str, Any] = run_meta(
        command,
        versions=tool_versions(python_path=False),
        quick=args.quick,
        mosquitto_set_tcp_nodelay=args.mosquitto_nodelay,
        settle=SETTLE,
    )
    log(f"command: {command}")
    log(f"cpus:    {meta['cpu_count']} ({meta['platform']}), load average {loadavg()}")
    loadgen = args.loadgen or build_loadgen(args.cache_dir)
    meta["loadgen"] = str(loadgen)
    scenarios = matching(build_scenarios(args.quick), args.scenarios)
    meta["scenarios"] = {s.key: {"title": s.title, "loadgen_args": s.args} for s in scenarios}
    args.results_dir.mkdir(parents=True, exist_ok=True)

    results: dict[str, Any] = {}
    incidents: list[dict[str, str]] = []
    failed = False
    if "cluster" in args.broker_list:
        log("\n=== cluster: Redis + RocketMQ + bridge nodes behind HAProxy")
        tmp = Path(tempfile.mkdtemp(prefix="mqtt-bench-cluster-"))
        cluster = BenchCluster(tmp, args.rocketmq_java_opts)
        watcher = LogWatcher(cluster.nodes)
        try:
            results["cluster"] = run_cluster(
                cluster, scenarios, loadgen, args.quick, args.budget, watcher
            )
        except (RuntimeError, OSError, TimeoutError) as e:
            results["cluster"] = {"status": "failed", "errors": [str(e)], "stages": {}}
            log(f"    ERROR: {e}")
        finally:
            try:
                meta["cluster"] = cluster.info()
                cluster.stop()
            finally:
                watcher.collect("shutdown", SHUTDOWN_INCIDENT)
                copy_logs(cluster.logs(), args.results_dir, f"{RESULT_PREFIX}-")
                shutil.rmtree(tmp, ignore_errors=True)
        incidents = watcher.incidents
        results["cluster"]["node_log_incidents"] = incidents
        results["cluster"]["node_log_problem_lines"] = watcher.problem_lines
    if "mosquitto" in args.broker_list:
        log("\n=== mosquitto (one broker, clients connect directly)")
        tmp = Path(tempfile.mkdtemp(prefix="mqtt-bench-cluster-mosquitto-"))
        try:
            results["mosquitto"] = run_mosquitto(
                tmp, scenarios, loadgen, args.mosquitto_nodelay, args.budget / 3
            )
            copy_logs(results["mosquitto"].pop("logs"), args.results_dir, f"{RESULT_PREFIX}-")
        except (RuntimeError, OSError) as e:
            results["mosquitto"] = {"status": "failed", "errors": [str(e)], "scenarios": {}}
            log(f"    ERROR: {e}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    for name, part in results.items():
        runs = [r for stage in part.get("stages", {}).values() for r in stage["scenarios"].values()]
        runs += list(part.get("scenarios", {}).values())
        if part.get("errors") or any(r.get("errors") for r in runs):
            failed = True
        if any(r.get("qos") == 1 and r.get("lost") for r in runs):
            log(f"{name}: QoS 1 messages lost (see the notes)")
            failed = True
    if incidents:
        log(f"cluster: {len(incidents)} incident(s) in the node logs (listed below)")
        failed = True

    meta["finished_at"] = utc_now()
    meta["wall_s"] = round(time.monotonic() - t0, 1)
    meta["loadavg_end"] = loadavg()
    report(meta, scenarios, results, incidents, args.results_dir)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
