#!/usr/bin/env python3
"""SUBSCRIBE latency in a 3-node cluster: what the peers' confirmation of a new filter adds.

    .venv/bin/python tests/bench/subscribe_latency.py [--count 300] [--rounds 3]

Starts Redis, RocketMQ 5.3.3 and three bridge nodes as one cluster (`BenchCluster` of
cluster_bench.py: store=rocketmq, every other setting at its default), except that node2 runs
with `interest_confirm_timeout=0` (SUBACK without waiting for the peers, as before the
confirmation existed). One client on node1 and one on node2 then send SUBSCRIBEs of fresh
filters (QoS 1, a new filter each time, so every one is new interest the peers must confirm on
node1), one at a time, alternating between the two nodes, and time each from the SUBSCRIBE
written to the SUBACK read. Each round prints p50, p90, p99 and max of both sides and the
ratio confirmed/unconfirmed of p50 and p99; the summary is the median over the rounds with
their spread. A SUBSCRIBE also reads the new queue's end from RocketMQ (both sides alike).

Bounded: `--count` SUBSCRIBEs per side and round (after 20 of warm-up per side), each waiting at
most 5 s for its SUBACK; everything started is stopped in a `finally`. The nodes' logs are
checked for peers that did not confirm in time (a link closed for it would be a fault here).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bridge.mqtt.packets import Suback, Subscribe, Subscription
from tests.bench.harness.cluster import BenchCluster
from tests.bench.harness.common import begin, log
from tests.bench.harness.procfs import loadavg
from tests.bench.harness.rocketmq import add_rocketmq_option
from tests.support.clients import RawClient

UNCONFIRMED_NODE = "node2"


class LatencyCluster(BenchCluster):
    """`BenchCluster` whose node2 answers SUBACK without the peers' confirmation."""

    def node_command(self, node_id: str, port: int) -> list[str]:
        cmd = super().node_command(node_id, port)
        if node_id == UNCONFIRMED_NODE:
            cmd += ["--set", "interest_confirm_timeout=0"]
        return cmd


def subscribe_ms(client: RawClient, packet_id: int, topic_filter: str) -> float:
    """Milliseconds from writing one SUBSCRIBE to reading its SUBACK."""
    started = time.perf_counter()
    client.send(Subscribe(packet_id, [Subscription(topic_filter, 1)]))
    suback = client.recv(5)
    took = (time.perf_counter() - started) * 1000
    assert isinstance(suback, Suback) and list(suback.return_codes) == [1], suback
    return took


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def figures(values: list[float]) -> dict[str, float]:
    return {
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": max(values),
    }


def one_round(cluster: BenchCluster, count: int, warmup: int) -> dict[str, dict[str, float]]:
    """`count` timed SUBSCRIBEs per side, alternating; fresh clients and filters."""
    run = uuid.uuid4().hex[:8]
    clients = {
        side: RawClient(cluster.nodes[node].port, timeout=5)
        for side, node in (("confirmed", "node1"), ("unconfirmed", UNCONFIRMED_NODE))
    }
    try:
        for side, client in clients.items():
            assert client.connect(f"sublat-{side}-{run}").return_code == 0
        times: dict[str, list[float]] = {side: [] for side in clients}
        for i in range(warmup + count):
            for side, client in clients.items():
                took = subscribe_ms(client, i % 65535 + 1, f"sublat/{run}/{side}/{i}")
                if i >= warmup:
                    times[side].append(took)
        return {side: figures(values) for side, values in times.items()}
    finally:
        for client in clients.values():
            client.close()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=300, help="timed SUBSCRIBEs per side and round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds (>= 3 for a median ratio)")
    ap.add_argument("--warmup", type=int, default=20, help="untimed SUBSCRIBEs per side first")
    add_rocketmq_option(ap)
    args = ap.parse_args(argv)
    if not 0 < args.count <= 5000 or not 0 < args.rounds <= 20:
        ap.error("--count in 1..5000, --rounds in 1..20")
    return args


def main(argv: list[str] | None = None) -> int:
    args, command, _t0 = begin(str(Path(__file__)), argv, parse_args)
    log(f"command: {command}")
    log(f"load average {loadavg()}")
    tmp = Path(tempfile.mkdtemp(prefix="mqtt-bench-sublat-"))
    cluster = LatencyCluster(tmp, args.rocketmq_java_opts)
    rounds: list[dict[str, dict[str, float]]] = []
    try:
        cluster.start()
        for _ in range(3):
            cluster.add_node()
        for number in range(1, args.rounds + 1):
            result = one_round(cluster, args.count, args.warmup)
            rounds.append(result)
            log(f"round {number} ({args.count} SUBSCRIBEs per side), ms:")
            for side, fig in result.items():
                log(
                    f"  {side:<12} p50 {fig['p50']:6.2f}  p90 {fig['p90']:6.2f}  "
                    f"p99 {fig['p99']:6.2f}  max {fig['max']:7.2f}"
                )
        timeouts = sum(
            node.log_path.read_text(errors="replace").count("did not confirm interest")
            for node in cluster.nodes.values()
        )
    finally:
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"\nsummary over {len(rounds)} rounds (median [min..max]), ms:")
    for side in ("confirmed", "unconfirmed"):
        for key in ("p50", "p99"):
            values = [r[side][key] for r in rounds]
            log(
                f"  {side:<12} {key} {statistics.median(values):6.2f} "
                f"[{min(values):.2f}..{max(values):.2f}]"
            )
    for key in ("p50", "p99"):
        ratios = [r["confirmed"][key] / r["unconfirmed"][key] for r in rounds]
        log(
            f"  ratio confirmed/unconfirmed {key}: {statistics.median(ratios):.2f} "
            f"[{min(ratios):.2f}..{max(ratios):.2f}]"
        )
    log(f"peers that did not confirm in time: {timeouts}")
    log(f"load average {loadavg()}")
    return 1 if timeouts else 0


if __name__ == "__main__":
    sys.exit(main())
