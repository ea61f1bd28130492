#!/usr/bin/env python3
"""How soon a persistent session that resumes on another node gets what it is owed.

Run from the repository root (``make bench`` does this)::

    .venv/bin/python tests/bench/resume_moves.py [--moves 100] [--brokers cluster,mosquitto]

A device behind the L4 balancer reconnects wherever the balancer sends it. Each move takes the
session ("mover", MQTT 5.0, Session Expiry 3600, one QoS 2 subscription) to the next node of a
3-node cluster (Redis, RocketMQ 5.3.3 SYNC_FLUSH, the nodes at their default settings, as
``cluster_bench.py`` starts them), and times two things from the CONNACK of the resume:

- **backlog**: while the session was offline on node N, a publisher on node N+1 published 3
  QoS 1 messages; the session resumes on node N+2: time to the first of them;
- **in flight**: the session then publishes one QoS 1 message to its own filter, receives it
  without acknowledging, drops the connection and resumes on the next node: time to the
  redelivery (DUP).

The same sequence on one Mosquitto (Debian, stock settings with persistence) is the baseline:
there every resume is on the node that held the session. Printed: p50/p90/p99/max per kind and
broker, and the CPU the brokers spent per move (all bridge nodes, or Mosquitto; RocketMQ and
Redis are not counted). Bounded: ``--moves`` moves, a 10 s wait per message, a time budget of
``--budget`` seconds per broker; everything started is stopped in a ``finally``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bridge.mqtt.packets import Puback, Publish, Subscription
from bridge.mqtt.properties import PropertyId
from tests.bench.harness.cluster import BenchCluster
from tests.bench.harness.common import free_port, log
from tests.bench.harness.processes import stock_mosquitto
from tests.bench.harness.procfs import proc_cpu
from tests.bench.harness.rocketmq import add_rocketmq_option
from tests.support.mqtt5 import RawClient5

KEEP = {PropertyId.SESSION_EXPIRY_INTERVAL: 3600}
WAIT_S = 10.0


def resume(port: int) -> tuple[RawClient5, float]:
    """Resume "mover" on `port`: the connection and the time of its CONNACK."""
    client = RawClient5(port, timeout=WAIT_S)
    connack = client.connect("mover", False, properties=KEEP)
    assert connack.return_code == 0 and connack.session_present, connack
    return client, time.monotonic()


def first_publish(client: RawClient5, since: float) -> tuple[Publish, float]:
    """The next PUBLISH on `client` and the seconds from `since` to it."""
    while True:
        packet = client.recv(WAIT_S)
        if isinstance(packet, Publish):
            return packet, time.monotonic() - since


def run_moves(ports: list[int], moves: int, budget_s: float) -> dict[str, list[float]]:
    """`moves` moves of the session over `ports` (one port: every resume on the same broker)."""
    times: dict[str, list[float]] = {"backlog": [], "in flight": [], "no DUP": []}
    """Seconds to the first message after a resume; "no DUP": redeliveries without the DUP flag
    (the resuming node did not learn that the message had been sent: MQTT-3.3.1-1)."""
    first = RawClient5(ports[0])
    first.connect("mover", True, properties=KEEP)
    assert first.subscribe_many(Subscription("mover/#", 1)) == [1]
    first.disconnect()
    publishers = []
    for i, port in enumerate(ports):
        pub = RawClient5(port, timeout=WAIT_S)
        pub.connect(f"mover-pub-{i}")
        publishers.append(pub)
    time.sleep(1.0)  # the filter has reached every node (SUBACK does not mean that yet)
    deadline = time.monotonic() + budget_s
    packet_id = 0
    try:
        for move in range(moves):
            if time.monotonic() > deadline:
                log(f"    time budget spent after {move} moves")
                break
            n = len(ports)
            for i in range(3):
                packet_id = packet_id % 60000 + 1
                publishers[(move + 1) % n].publish(f"mover/b{move}", b"b%d" % i, 1, packet_id)
            client, connacked = resume(ports[(move + 2) % n])
            got, took = first_publish(client, connacked)
            times["backlog"].append(took)
            client.send(Puback(got.packet_id or 0))
            for _ in range(2):
                rest, _ = first_publish(client, connacked)
                client.send(Puback(rest.packet_id or 0))
            client.send(Publish(f"mover/f{move}", b"flight", 1, False, packet_id=1))
            own, _ = first_publish(client, connacked)  # received, not acknowledged
            assert own.payload == b"flight", own
            client.close()
            client, connacked = resume(ports[move % n])
            again, took = first_publish(client, connacked)
            assert again.payload == b"flight", again
            times["in flight"].append(took)
            if not again.dup:
                times["no DUP"].append(took)
            client.send(Puback(again.packet_id or 0))
            client.disconnect()
    finally:
        for pub in publishers:
            pub.close()
    return times


def percentiles(values: list[float]) -> str:
    if not values:
        return "no samples"
    ms = sorted(v * 1000 for v in values)
    cuts = statistics.quantiles(ms, n=100, method="inclusive") if len(ms) > 1 else ms * 99
    return (
        f"n={len(ms):4d}  p50 {cuts[49]:7.1f} ms  p90 {cuts[89]:7.1f} ms  "
        f"p99 {cuts[98]:7.1f} ms  max {ms[-1]:7.1f} ms"
    )


def measured(
    name: str, pids: list[int], go: Callable[[], dict[str, list[float]]], moves_done: list[int]
) -> None:
    before = sum(proc_cpu(pid) or 0.0 for pid in pids)
    times = go()
    spent = sum(proc_cpu(pid) or 0.0 for pid in pids) - before
    done = len(times["backlog"])
    moves_done.append(done)
    for kind in ("backlog", "in flight"):
        print(f"{name:10s} {kind:9s} {percentiles(times[kind])}")
    print(f"{name:10s} redeliveries without DUP: {len(times['no DUP'])}")
    if done:
        print(f"{name:10s} broker CPU {spent / done * 1000:.1f} ms per move ({done} moves)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--moves", type=int, default=100)
    ap.add_argument("--budget", type=float, default=300.0, help="seconds per broker")
    ap.add_argument("--brokers", default="cluster,mosquitto")
    add_rocketmq_option(ap)
    args = ap.parse_args()
    brokers = args.brokers.split(",")
    done: list[int] = []
    with tempfile.TemporaryDirectory(prefix="resume-moves-") as tmp:
        work = Path(tmp)
        if "cluster" in brokers:
            cluster = BenchCluster(work / "cluster", args.rocketmq_java_opts)
            try:
                cluster.start()
                for _ in range(3):
                    cluster.add_node()
                nodes = list(cluster.nodes.values())
                pids = [n.proc.pid for n in nodes if n.proc is not None]
                ports = [n.port for n in nodes]
                log(f"    {args.moves} moves over 3 nodes ...")
                measured("cluster", pids, lambda: run_moves(ports, args.moves, args.budget), done)
            finally:
                cluster.stop()
        if "mosquitto" in brokers:
            port = free_port()
            mosquitto = stock_mosquitto(work / "mosquitto", port)
            try:
                mosquitto.start()
                mosquitto.wait_ready()
                pid = mosquitto.proc.pid if mosquitto.proc is not None else 0
                log(f"    {args.moves} resumes on one Mosquitto ...")
                measured(
                    "mosquitto", [pid], lambda: run_moves([port], args.moves, args.budget), done
                )
            finally:
                mosquitto.stop()
    return 0 if done and all(done) else 1


if __name__ == "__main__":
    sys.exit(main())
