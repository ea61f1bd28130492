"""The cluster under test of cluster_bench.py: Redis, RocketMQ, bridge nodes joined as one
cluster and HAProxy in front, started and stopped together; the CPU of each of its processes
over a loadgen run; and the nodes' logs, read after every run so that each warning, error and
traceback is attributed to the run during which it appeared."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import secrets
import shlex
import subprocess
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from tests.bench.harness.common import HOST, first_line, free_port, log, run_text, tail, venv_python
from tests.bench.harness.loadgen import Scenario, run_loadgen
from tests.bench.harness.processes import Broker
from tests.bench.harness.procfs import (
    CpuWindow,
    children_cpu_s,
    loadavg,
    machine_busy_s,
    proc_cpu,
    proc_rss_mb,
)
from tests.bench.harness.rocketmq import ROCKETMQ_VERSION, local_rocketmq, stop_rocketmq
from tests.support.haproxy import LocalHAProxy
from tests.support.redis import LocalRedis

CLUSTER_NAME = "bench"
NODE_IDS = ("node1", "node2", "node3")
LINK_WAIT_S = 20.0
NODE_STOP_GRACE_S = 12.0  # a stopping node drains for up to drain_timeout (5 s) first


@dataclass(frozen=True)
class ClusterScenario(Scenario):
    """A scenario of the cluster benchmark: where its clients connect, and whether it is also
    run on 1 and 2 nodes."""

    route: str  # "x": pubs -> node1, subs -> node2/node3; "lb": every client through HAProxy
    # Also run on 1 and 2 nodes: the workload of the scaling table.
    scaling: bool = False


class BenchCluster:
    """Redis, RocketMQ, bridge nodes and HAProxy under one temp dir.

    start() brings up Redis and RocketMQ; add_node() starts the next node of NODE_IDS, waits
    until every node has a peer link to every other one, then (re)configures HAProxy with all
    nodes and waits until it sees them UP. stop() stops everything, each step even if the one
    before failed; LocalRedis, LocalRocketMQ and LocalHAProxy also kill their processes at
    interpreter exit as a last resort.
    """

    def __init__(self, workdir: Path, java_opts: str, settings: tuple[str, ...] = ()) -> None:
        self.workdir = workdir
        self.java_opts = java_opts
        self.settings = settings
        """`--set` options every node gets after the cluster's own (an A/B of one setting)."""
        self.redis = LocalRedis(workdir / "redis")
        self.mq = local_rocketmq(workdir / "rocketmq", java_opts, "SYNC_FLUSH")
        self.lb: LocalHAProxy | None = None
        self.nodes: dict[str, Broker] = {}
        self.start_s: dict[str, float] = {}
        self.secret_file = workdir / "cluster.secret"
        """The cluster secret the nodes prove on their peer links (made by `start`, 0600)."""

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.secret_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32) + "\n")
        t0 = time.monotonic()
        self.redis.start()
        self.start_s["redis"] = time.monotonic() - t0
        log(f"    Redis up on {self.redis.addr} in {self.start_s['redis']:.1f} s")
        log(
            f"    starting RocketMQ {ROCKETMQ_VERSION} (namesrv {self.mq.namesrv_addr}, "
            f"SYNC_FLUSH, ROCKETMQ_JAVA_OPTS={self.java_opts!r}) ..."
        )
        t0 = time.monotonic()
        self.mq.start()
        self.start_s["rocketmq"] = time.monotonic() - t0
        log(f"    RocketMQ up in {self.start_s['rocketmq']:.1f} s")

    def node_command(self, node_id: str, port: int) -> list[str]:
        """The command line of one node: the cluster settings of tests/support/cluster.py
        (without its shortened fault-test timeouts), everything else at its default."""
        settings = [
            "store=rocketmq",
            f"rocketmq_namesrv={self.mq.namesrv_addr}",
            f"rocketmq_namespace={CLUSTER_NAME}",
            f"redis_url={self.redis.url}",
            f"cluster_name={CLUSTER_NAME}",
            f"node_id={node_id}",
            "peer_listen=127.0.0.1:0",
            f"cluster_secret_file={self.secret_file}",
            *self.settings,
        ]
        cmd = [
            venv_python(),
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
                "version": ROCKETMQ_VERSION,
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
                    stop_rocketmq(self.mq)
                finally:
                    self.redis.kill()

    def _stop_nodes(self) -> None:
        running = [n for n in self.nodes.values() if n.alive() and n.proc is not None]
        for node in running:
            node.terminate()
        deadline = time.monotonic() + NODE_STOP_GRACE_S
        for node in running:
            assert node.proc is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        for node in self.nodes.values():
            node.stop()  # SIGKILL to what is left of its process group; closes the log


# --------------------------------------------------------------------------- measuring


def measured_run(
    loadgen: Path, port: int, args: dict[str, str], timeout_s: float, roles: dict[str, list[int]]
) -> dict[str, Any]:
    """One loadgen run, with the CPU of every role over it (`cpu_s`, `cpu_percent`: % of one
    core), the loadgen's, the machine's and the rest ("others") over the same wall time. A
    process that is gone at either end is left out of its role's figure."""
    per_pid = {
        f"{role}/{pid}": partial(proc_cpu, pid) for role, pids in roles.items() for pid in pids
    }
    # Local time, as in the node logs' timestamps.
    started_at = dt.datetime.now().isoformat(sep=" ", timespec="milliseconds")
    window = CpuWindow({**per_pid, "machine": machine_busy_s, "loadgen": children_cpu_s})
    res, cmd = run_loadgen(loadgen, port, args, "raw", timeout_s + 20)
    window.close()
    cpu_s = {
        role: sum(used for pid in pids if (used := window.used(f"{role}/{pid}")) is not None)
        for role, pids in roles.items()
    }
    cpu_s["loadgen"] = window.used("loadgen") or 0.0
    machine = window.used("machine") or 0.0
    cpu_s["others"] = max(0.0, machine - sum(cpu_s.values()))
    cpu_s["machine"] = machine
    res["loadgen_cmd"] = shlex.join(cmd)
    res["started_at"] = started_at
    res["run_wall_s"] = round(window.wall, 2)
    res["cpu_s"] = {role: round(v, 3) for role, v in cpu_s.items()}
    res["cpu_percent"] = {role: round(window.percent(v), 1) for role, v in cpu_s.items()}
    res["loadavg_after"] = loadavg()
    return res


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
