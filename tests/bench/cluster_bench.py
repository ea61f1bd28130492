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
import contextlib
import datetime as dt
import json
import os
import platform
import re
import resource
import shlex
import shutil
import signal
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
    MOSQUITTO_BIN,
    REPO,
    first_line,
    free_port,
    log,
    on_sigterm,
    run_text,
    tail,
)
from tests.bench.harness.loadgen import (
    add_loadgen_options,
    build_loadgen,
    loadgen_args,
    run_loadgen,
)
from tests.bench.harness.processes import Broker, stock_mosquitto
from tests.bench.harness.procfs import loadavg, machine_busy_s, proc_cpu, proc_rss_mb
from tests.bench.harness.report import fmt_ratio, fmt_val, get_path, payload_label, plain_table
from tests.bench.harness.rocketmq import DEFAULT_ROCKETMQ_JAVA_OPTS, is_rocketmq_jvm
from tests.support.haproxy import LocalHAProxy
from tests.support.redis import LocalRedis
from tests.support.rocketmq import LocalRocketMQ

CLUSTER_NAME = "bench"
NODE_IDS = ("node1", "node2", "node3")
RESULT_PREFIX = "cluster-bench"
# Pause between the last SUBACK and the first publish (loadgen -settle), see the docstring.
SETTLE = "500ms"
LINK_WAIT_S = 20.0
NODE_STOP_GRACE_S = 12.0  # a stopping node drains for up to drain_timeout (5 s) first


# --------------------------------------------------------------------------- scenarios


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    route: str  # "x": pubs -> node1, subs -> node2/node3; "lb": every client through HAProxy
    mode: str  # "throughput" | "latency"
    qos: int
    size: int
    args: dict[str, str]
    timeout_s: float
    # Also run on 1 and 2 nodes: the workload of the scaling table.
    scaling: bool = False

    def metrics(self) -> list[tuple[str, str, bool]]:
        """(label, path in the loadgen result, higher_is_better)."""
        if self.mode == "latency":
            return [
                ("p50 ms", "latency.p50_ms", False),
                ("p90 ms", "latency.p90_ms", False),
                ("p99 ms", "latency.p99_ms", False),
                ("max ms", "latency.max_ms", False),
            ]
        if self.qos == 0:
            return [("msgs/s", "msgs_per_s", True)]
        # QoS 1: the publishers' stored-and-acknowledged rate too (deliveries may lag behind
        # it), and the publish->receive latency under full load (queueing, not per message).
        return [
            ("msgs/s", "msgs_per_s", True),
            ("pub msgs/s", "publish_rate", True),
            ("p50 ms", "latency.p50_ms", False),
            ("p99 ms", "latency.p99_ms", False),
        ]


ROUTE_TITLES = {"x": "cross-node (pubs node1, subs node2/3)", "lb": "via HAProxy"}


def build_scenarios(quick: bool) -> list[Scenario]:
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
    out: list[Scenario] = []
    for route in ("x", "lb"):
        for qos in (0, 1):
            for size in (100, 2048):
                sz = payload_label(size).replace(" ", "")
                out.append(
                    Scenario(
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
                Scenario(
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


# --------------------------------------------------------------------------- the cluster


class BenchCluster:
    """Redis, RocketMQ, bridge nodes and HAProxy under one temp dir.

    start() brings up Redis and RocketMQ; add_node() starts the next node of NODE_IDS, waits
    until every node has a peer link to every other one, then (re)configures HAProxy with all
    nodes and waits until it sees them UP. stop() stops everything, each step even if the one
    before failed; LocalRedis, LocalRocketMQ and LocalHAProxy also kill their processes at
    interpreter exit as a last resort.
    """

    def __init__(self, workdir: Path, java_opts: str) -> None:
        self.workdir = workdir
        self.java_opts = java_opts
        self.redis = LocalRedis(workdir / "redis")
        os.environ["ROCKETMQ_JAVA_OPTS"] = java_opts  # read by LocalRocketMQ._env()
        self.mq = LocalRocketMQ(workdir / "rocketmq", flush_disk_type="SYNC_FLUSH")
        self.lb: LocalHAProxy | None = None
        self.nodes: dict[str, Broker] = {}
        self.start_s: dict[str, float] = {}

    def start(self) -> None:
        t0 = time.monotonic()
        self.redis.start()
        self.start_s["redis"] = time.monotonic() - t0
        log(f"    Redis up on {self.redis.addr} in {self.start_s['redis']:.1f} s")
        log(
            f"    starting RocketMQ 5.3.3 (namesrv {self.mq.namesrv_addr}, SYNC_FLUSH, "
            f"ROCKETMQ_JAVA_OPTS={self.java_opts!r}) ..."
        )
        t0 = time.monotonic()
        self.mq.start()
        self.start_s["rocketmq"] = time.monotonic() - t0
        log(f"    RocketMQ up in {self.start_s['rocketmq']:.1f} s")

    def node_command(self, node_id: str, port: int) -> list[str]:
        """The command line of one node: the cluster settings of tests/support/cluster.py
        (without its shortened fault-test timeouts), everything else at its default."""
        python = REPO / ".venv" / "bin" / "python"
        settings = [
            "store=rocketmq",
            f"rocketmq_namesrv={self.mq.namesrv_addr}",
            f"rocketmq_namespace={CLUSTER_NAME}",
            f"redis_url={self.redis.url}",
            f"cluster_name={CLUSTER_NAME}",
            f"node_id={node_id}",
            "peer_listen=127.0.0.1:0",
        ]
        cmd = [
            str(python if python.exists() else sys.executable),
            "-m",
            "bridge",
            "--listen",
            f"{HOST}:{port}",
            "--data-dir",
            str(self.workdir / node_id / "data"),
            # info: the "peer link to X up" lines add_node() waits for.
            "--log-level",
            "info",
        ]
        for setting in settings:
            cmd += ["--set", setting]
        return cmd

    def add_node(self) -> Broker:
        node_id = NODE_IDS[len(self.nodes)]
        (self.workdir / node_id / "data").mkdir(parents=True)
        port = free_port()
        node = Broker(
            node_id,
            self.node_command(node_id, port),
            self.workdir / node_id,
            self.workdir / f"{node_id}.log",
            port,
        )
        self.nodes[node_id] = node
        t0 = time.monotonic()
        node.start()
        node.wait_ready()
        self.wait_linked()
        backends = [f"{HOST}:{n.port}" for n in self.nodes.values()]
        if self.lb is None:
            self.lb = LocalHAProxy(self.workdir / "haproxy", None, backends).start()
        else:
            self.lb.reload(backends)
        for backend in backends:
            self.lb.wait_for_status(backend, "UP")
        assert node.proc is not None
        log(
            f"    {node_id} up on {HOST}:{port} (pid {node.proc.pid}), linked to "
            f"{len(self.nodes) - 1} peer(s), HAProxy {HOST}:{self.lb.frontend_port} -> "
            f"{len(backends)} node(s) in {time.monotonic() - t0:.1f} s"
        )
        return node

    def wait_linked(self) -> None:
        """Until every node logged "peer link to X up" for every other node."""
        deadline = time.monotonic() + LINK_WAIT_S
        for node_id, node in self.nodes.items():
            for other in self.nodes:
                needle = f"peer link to {other} up"
                while other != node_id and needle not in node.log_path.read_text(errors="replace"):
                    if not node.alive() or time.monotonic() > deadline:
                        raise RuntimeError(
                            f"{node_id}: no {needle!r} within {LINK_WAIT_S:.0f} s; log tail:\n"
                            f"{tail(node.log_path)}"
                        )
                    time.sleep(0.1)

    def dead_nodes(self) -> list[str]:
        """Nodes whose process has exited (the runs after that are skipped)."""
        return [node_id for node_id, node in self.nodes.items() if not node.alive()]

    def cpu_pids(self) -> dict[str, list[int]]:
        """The processes whose CPU is measured, by role."""
        assert self.lb is not None
        roles = {node_id: [n.proc.pid] for node_id, n in self.nodes.items() if n.proc}
        for role, pid in (
            ("rocketmq", self.mq.pid("broker")),
            ("namesrv", self.mq.pid("namesrv")),
            ("redis", self.redis.pid),
        ):
            roles[role] = [pid] if pid is not None else []
        roles["haproxy"] = self.lb.processes()
        return roles

    def rss_mb(self) -> dict[str, float | None]:
        """Resident memory of the nodes and the RocketMQ broker (its mapped commit log
        included): a node whose peer-link buffers grow shows here."""
        pids = {node_id: n.proc.pid for node_id, n in self.nodes.items() if n.proc}
        pids["rocketmq"] = self.mq.pid("broker")
        return {role: proc_rss_mb(pid) if pid else None for role, pid in pids.items()}

    def info(self) -> dict[str, Any]:
        """What was started, for the JSON results."""
        return {
            "cluster_name": CLUSTER_NAME,
            "redis": self.redis.url,
            "rocketmq": {
                "version": "5.3.3",
                "namesrv": self.mq.namesrv_addr,
                "flush_disk_type": self.mq.flush_disk_type,
                "java_opts": self.java_opts,
                "java": first_line(run_text(["java", "-version"])),
            },
            "haproxy": {
                "frontend_port": self.lb.frontend_port if self.lb else None,
                "balance": "leastconn",
                "version": first_line(run_text(["haproxy", "-v"])),
            },
            "start_s": {k: round(v, 1) for k, v in self.start_s.items()},
            "nodes": {
                node_id: {"port": n.port, "command": shlex.join(n.cmd)}
                for node_id, n in self.nodes.items()
            },
        }

    def logs(self) -> dict[str, Path]:
        """Every log worth keeping next to the results, by the name to give it there."""
        out = {f"{node_id}.log": n.log_path for node_id, n in self.nodes.items()}
        out["rocketmq-broker.log"] = self.mq.log_dir / "broker.log"
        out["redis.log"] = self.redis.data_dir / "redis.log"
        out["haproxy.log"] = self.workdir / "haproxy" / "haproxy.log"
        return out

    def stop(self) -> None:
        """Nodes first (SIGTERM to all at once, SIGKILL after NODE_STOP_GRACE_S), then HAProxy,
        RocketMQ (SIGKILL: the instance is thrown away) and Redis."""
        try:
            self._stop_nodes()
        finally:
            try:
                if self.lb is not None:
                    self.lb.stop()
            finally:
                try:
                    self._stop_rocketmq()
                finally:
                    self.redis.kill()

    def _stop_nodes(self) -> None:
        running = [n for n in self.nodes.values() if n.alive() and n.proc is not None]
        for node in running:
            assert node.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + NODE_STOP_GRACE_S
        for node in running:
            assert node.proc is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        for node in self.nodes.values():
            node.stop()  # SIGKILL to what is left of its process group; closes the log

    def _stop_rocketmq(self) -> None:
        pids = [self.mq.pid(role) for role in ("broker", "namesrv")]
        try:
            self.mq.stop(graceful=False)
        except (RuntimeError, OSError) as e:
            log(f"    RocketMQ stop.sh failed ({e}); killing by PID")
        finally:
            for pid in pids:
                if pid is not None and is_rocketmq_jvm(pid):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)


# --------------------------------------------------------------------------- measuring


def cpu_seconds(roles: dict[str, list[int]]) -> dict[str, dict[int, float]]:
    """CPU seconds so far of every process of every role, per PID (a process that is gone reads
    as missing and is left out of the deltas)."""
    out: dict[str, dict[int, float]] = {}
    for role, pids in roles.items():
        out[role] = {}
        for pid in pids:
            cpu = proc_cpu(pid)
            if cpu is not None:
                out[role][pid] = cpu
    return out


def children_cpu_s() -> float:
    """CPU of every child process the harness has waited for: the loadgen runs."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def measured_run(
    loadgen: Path, port: int, args: dict[str, str], timeout_s: float, roles: dict[str, list[int]]
) -> dict[str, Any]:
    """One loadgen run, with the CPU of every role over it (`cpu_s`, `cpu_percent`: % of one
    core), the loadgen's, the machine's and the rest ("others") over the same wall time."""
    before = cpu_seconds(roles)
    started_at = dt.datetime.now().isoformat(sep=" ", timespec="milliseconds")
    m0, child0, w0 = machine_busy_s(), children_cpu_s(), time.monotonic()
    res, cmd = run_loadgen(loadgen, port, args, "raw", timeout_s + 20)
    m1, child1, w1 = machine_busy_s(), children_cpu_s(), time.monotonic()
    after = cpu_seconds(roles)
    wall = max(w1 - w0, 1e-9)
    cpu_s = {
        role: sum(v - before[role][pid] for pid, v in after[role].items() if pid in before[role])
        for role in roles
    }
    cpu_s["loadgen"] = child1 - child0
    cpu_s["others"] = max(0.0, (m1 - m0) - sum(cpu_s.values()))
    cpu_s["machine"] = m1 - m0
    res["loadgen_cmd"] = shlex.join(cmd)
    # Local time, as in the node logs' timestamps.
    res["started_at"] = started_at
    res["run_wall_s"] = round(wall, 2)
    res["cpu_s"] = {role: round(v, 3) for role, v in cpu_s.items()}
    res["cpu_percent"] = {role: round(100 * v / wall, 1) for role, v in cpu_s.items()}
    res["loadavg_after"] = loadavg()
    return res


def describe(sc: Scenario, r: dict[str, Any]) -> str:
    errs = r.get("errors") or []
    err = f"  ERRORS: {'; '.join(errs)}" if errs else ""
    if "fatal" in r or "delivered" not in r:
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


LOG_PROBLEM = re.compile(r" (WARNING|ERROR|CRITICAL) |^Traceback")
# A malfunction of the cluster, not a legal reaction to load (which dropping QoS 0 messages for a
# client that does not keep up is): a peer link that timed out or broke, a live node declared
# dead, an error or a traceback.
INCIDENT = re.compile(
    r"peer link to \S+ (closed|lost)|is dead: taking over| (ERROR|CRITICAL) |^Traceback"
)
# At shutdown the links close by design: then only errors count.
SHUTDOWN_INCIDENT = re.compile(r" (ERROR|CRITICAL) |^Traceback")


class LogWatcher:
    """Reads what the nodes logged since the last call, so that every warning, error and
    traceback is attributed to the run during which it appeared and reported, not hidden."""

    def __init__(self, nodes: dict[str, Broker]) -> None:
        self.nodes = nodes
        self.offsets: dict[str, int] = {}
        self.incidents: list[dict[str, str]] = []
        self.problem_lines = 0

    def collect(self, run: str, incident: re.Pattern[str] = INCIDENT) -> dict[str, list[str]]:
        """Problem lines per node since the last call (at most 20 each); incidents among them
        are also kept in `incidents` with the run's name."""
        out: dict[str, list[str]] = {}
        for node_id, node in self.nodes.items():
            try:
                with node.log_path.open("rb") as f:
                    f.seek(self.offsets.get(node_id, 0))
                    # Whole lines only: the node may be writing one right now.
                    text = f.read().rpartition(b"\n")[0]
            except OSError:
                continue
            if text:
                self.offsets[node_id] = self.offsets.get(node_id, 0) + len(text) + 1
            lines = [
                line
                for line in text.decode(errors="replace").splitlines()
                if LOG_PROBLEM.search(line)
            ]
            self.problem_lines += len(lines)
            self.incidents += [
                {"run": run, "node": node_id, "line": line[:300]}
                for line in lines
                if incident.search(line)
            ]
            if lines:
                out[node_id] = [line[:300] for line in lines[:20]]
        return out


def log_summary(problems: dict[str, list[str]]) -> str:
    """One line per node: how many problem lines, the first three distinct messages."""
    out = []
    for node_id, lines in problems.items():
        seen = list(dict.fromkeys(line.split(": ", 1)[-1] for line in lines))
        out.append(f"{node_id} logged {len(lines)}: " + " | ".join(seen[:3]))
    return "; ".join(out)


def loadgen_target(sc: Scenario, cluster: BenchCluster) -> tuple[int, dict[str, str]]:
    """The port for -addr and the loadgen arguments of `sc` on the cluster as it is now."""
    assert cluster.lb is not None
    if sc.route == "lb":
        return cluster.lb.frontend_port, sc.args
    ports = [n.port for n in cluster.nodes.values()]
    subs = ",".join(f"{HOST}:{p}" for p in ports[1:])
    return ports[0], {**sc.args, "-pub-addr": f"{HOST}:{ports[0]}", "-sub-addr": subs}


def run_cluster(
    cluster: BenchCluster,
    scenarios: list[Scenario],
    loadgen: Path,
    quick: bool,
    budget_s: float,
    watcher: LogWatcher,
) -> dict[str, Any]:
    """Start the cluster and run the stages; results per node count. Raises on a failure to
    start; the caller stops the cluster."""
    out: dict[str, Any] = {"status": "ok", "stages": {}, "errors": []}
    cluster.start()
    t_ready = time.monotonic()
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
            if time.monotonic() - t_ready + sc.timeout_s > budget_s:
                stage[sc.key] = {"skipped": f"time budget of {budget_s:.0f} s used up"}
                log(f"    {sc.key:<22} skipped (time budget)")
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
    workdir: Path, scenarios: list[Scenario], loadgen: Path, nodelay: bool, budget_s: float
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
        t_ready = time.monotonic()
        run_loadgen(loadgen, b.port, MOSQUITTO_WARMUP, "raw", 30)
        for sc in scenarios:
            if time.monotonic() - t_ready + sc.timeout_s > budget_s:
                out["scenarios"][sc.key] = {"skipped": f"time budget of {budget_s:.0f} s used up"}
                log(f"    {sc.key:<22} skipped (time budget)")
                continue
            if not b.alive():
                out["errors"].append(f"mosquitto died; log tail:\n{tail(b.log_path)}")
                break
            res = measured_run(loadgen, b.port, sc.args, sc.timeout_s, {"mosquitto": [b.proc.pid]})
            out["scenarios"][sc.key] = res
            log("    " + describe(sc, res))
    finally:
        b.stop()
    out["logs"] = {"mosquitto.log": b.log_path, "mosquitto-internal.log": b.extra["internal_log"]}
    return out


# --------------------------------------------------------------------------- reporting


def result_of(results: dict[str, Any], where: str, key: str) -> dict[str, Any]:
    """`where`: "mosquitto" or a node count ("1", "2", "3")."""
    if where == "mosquitto":
        return dict(results.get("mosquitto", {}).get("scenarios", {}).get(key, {}))
    stages = results.get("cluster", {}).get("stages", {})
    return dict(stages.get(where, {}).get("scenarios", {}).get(key, {}))


def value(r: dict[str, Any], path: str) -> float | None:
    if "fatal" in r or "delivered" not in r:
        return None
    return get_path(r, path)


def notes(sc: Scenario, runs: dict[str, dict[str, Any]]) -> str:
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
        else:
            samples = (r.get("latency") or {}).get("samples")
            if samples and (r.get("late_sends") or 0) > samples / 10:
                out.append(f"{name}: rate not held ({r['late_sends']:,} late sends)")
    return "; ".join(out)


def comparison_rows(scenarios: list[Scenario], results: dict[str, Any]) -> list[dict[str, Any]]:
    """3-node cluster vs Mosquitto: one row per scenario and metric."""
    top = str(len(NODE_IDS))
    rows = []
    for sc in scenarios:
        ours, mosq = result_of(results, top, sc.key), result_of(results, "mosquitto", sc.key)
        for label, path, higher in sc.metrics():
            a, b = value(ours, path), value(mosq, path)
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


def scaling_rows(scenarios: list[Scenario], results: dict[str, Any]) -> list[dict[str, Any]]:
    """Delivered msg/s of each scaling workload with 1, 2, 3 nodes, the ratio to 1 node, and
    Mosquitto's."""
    rows = []
    for sc in (s for s in scenarios if s.scaling):
        runs = {f"{n} node(s)": result_of(results, str(n), sc.key) for n in (1, 2, 3)}
        runs["mosquitto"] = result_of(results, "mosquitto", sc.key)
        rate = {name: value(r, "msgs_per_s") for name, r in runs.items()}
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


def cpu_rows(scenarios: list[Scenario], results: dict[str, Any]) -> list[list[str]]:
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
            rate = value(r, "msgs_per_s") if sc.mode == "throughput" else None
            cells = [
                "mosquitto" if where == "mosquitto" else f"{where} node(s)",
                sc.key,
                fmt_val(rate, "msgs/s"),
            ]
            for role in CPU_ROLES:
                v = pct.get(role)
                cells.append(f"{v:.0f}%" if isinstance(v, int | float) else "—")
            body.append([*cells, per_msg])
    return body


COMPARISON_HEAD = ["scenario", "payload", "metric", "3 nodes", "mosquitto", "cluster/mosq", "notes"]


def comparison_cells(r: dict[str, Any]) -> list[str]:
    return [
        r["title"],
        payload_label(r["payload_bytes"]),
        r["metric"],
        fmt_val(r["cluster"], r["metric"]),
        fmt_val(r["mosquitto"], r["metric"]),
        fmt_ratio(r["ratio"]),
        r["notes"],
    ]


def md_table(head: list[str], body: list[list[str]], right: set[int]) -> list[str]:
    align = ["---:" if i in right else "---" for i in range(len(head))]
    return [
        "| " + " | ".join(head) + " |",
        "|" + "|".join(align) + "|",
        *("| " + " | ".join(row) + " |" for row in body),
    ]


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
    ap.add_argument(
        "--rocketmq-java-opts",
        default=DEFAULT_ROCKETMQ_JAVA_OPTS,
        help="ROCKETMQ_JAVA_OPTS for the RocketMQ JVMs (default: %(default)s)",
    )
    add_loadgen_options(ap)
    args = ap.parse_args(argv)
    args.broker_list = [b.strip() for b in args.brokers.split(",") if b.strip()]
    if not args.broker_list or set(args.broker_list) - {"cluster", "mosquitto"}:
        ap.error("--brokers: choose from cluster, mosquitto")
    if args.budget is None:
        args.budget = 120.0 if args.quick else 330.0
    return args


def keep_logs(logs: dict[str, Path | str], results_dir: Path) -> None:
    for name, src in logs.items():
        if Path(src).is_file():
            with contextlib.suppress(OSError):
                shutil.copyfile(src, results_dir / f"{RESULT_PREFIX}-{name}")


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
        command = shlex.join([sys.executable, *sys.argv])
    else:
        command = shlex.join([sys.executable, str(Path(__file__)), *argv])
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    t0 = time.monotonic()
    meta: dict[str, Any] = {
        "command": command,
        "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "loadavg_start": loadavg(),
        "cpu_count": os.cpu_count(),
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
        "versions": {
            "mosquitto": first_line(run_text([MOSQUITTO_BIN, "-h"])),
            "go": run_text(["go", "version"]),
            "python": platform.python_version(),
        },
        "quick": args.quick,
        "mosquitto_set_tcp_nodelay": args.mosquitto_nodelay,
        "settle": SETTLE,
    }
    log(f"command: {command}")
    log(f"cpus:    {meta['cpu_count']} ({meta['platform']}), load average {loadavg()}")
    loadgen = args.loadgen or build_loadgen(args.cache_dir)
    meta["loadgen"] = str(loadgen)
    scenarios = build_scenarios(args.quick)
    if args.scenarios:
        wanted = [w.strip() for w in args.scenarios.split(",") if w.strip()]
        scenarios = [s for s in scenarios if any(w in s.key for w in wanted)]
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
                keep_logs(cluster.logs(), args.results_dir)
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
            keep_logs(results["mosquitto"].pop("logs"), args.results_dir)
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

    meta["finished_at"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    meta["wall_s"] = round(time.monotonic() - t0, 1)
    meta["loadavg_end"] = loadavg()
    comparison = comparison_rows(scenarios, results)
    scaling = scaling_rows(scenarios, results)
    cpu = cpu_rows(scenarios, results)
    doc = {
        "meta": meta,
        "results": results,
        "comparison": comparison,
        "scaling": scaling,
    }
    (args.results_dir / f"{RESULT_PREFIX}.json").write_text(json.dumps(doc, indent=2) + "\n")
    (args.results_dir / f"{RESULT_PREFIX}.md").write_text(
        markdown(meta, comparison, scaling, cpu, incidents)
    )

    log("")
    log("3-node cluster vs one Mosquitto (x_: pubs on node1, subs on node2/3; lb_: via HAProxy):")
    log(plain_table(COMPARISON_HEAD, [comparison_cells(r) for r in comparison], right={3, 4, 5}))
    if scaling:
        log("")
        log("scaling via HAProxy, delivered msg/s:")
        log(plain_table(SCALING_HEAD, [scaling_cells(r) for r in scaling], set(range(2, 9))))
    if cpu:
        log("")
        log("CPU (% of one core over each run; machine 200% = both cores), µs broker CPU/msg:")
        log(plain_table(CPU_HEAD, cpu, right=set(range(2, len(CPU_HEAD)))))
    if incidents:
        log("")
        log("cluster incidents in the node logs (run: node: line):")
        for i in incidents:
            log(f"  {i['run']}: {i['node']}: {i['line']}")
    log("")
    log(
        f"wrote {args.results_dir / (RESULT_PREFIX + '.json')} and "
        f"{args.results_dir / (RESULT_PREFIX + '.md')} (total {meta['wall_s']:.0f} s)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
