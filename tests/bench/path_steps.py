"""Where a QoS 1 message's time goes on the RocketMQ path, step by step, read off the wire.

The issue-43 question: the gateway cluster's median latency at 1,000 msg/s is above RocketMQ's
own Java client's on the same broker; which steps are ours? This script runs the latency load of
rocketmq_path.py (loadgen, QoS 1, 2 KB, paced at `--rate`, publisher on node1, subscriber on
node2 of a 3-node cluster; and the Java producer and push consumer on a broker of their own)
while tcpdump captures the loopback interface, then follows every message through the capture
by the first 16 bytes of its payload (the loadgen's and the Java client's stamps are unique):

    publish in      the PUBLISH from the publisher has reached node1
    send            node1's SEND_MESSAGE_V2 carrying it, to the broker
    send_ok         the broker's answer to that send (same opaque)
    puback          node1's PUBACK to the publisher
    wake            node1's first peer-link frame to node2 after send_ok
    pull            node2's pull whose answer first carried the message
    pulled          that answer
    deliver         node2's PUBLISH of it to the subscriber

Every time is the moment the capture saw a frame's last byte, on one clock (the kernel's), so
the steps of different processes (publisher, both nodes, the broker, subscriber) compare. The
Java client's messages are followed from its send to the consumer's pull answer; what each
JVM does before it sends and after the answer is in its own latency figure, not on the wire.

    .venv/bin/python tests/bench/path_steps.py [--rate 1000] [--seconds 5] [--only cluster,java]
        [--set rocketmq_held_reads=0] [--inflight 20]

`make path-steps STEPS_ARGS="..."` installs tcpdump first; the capture needs root. `--set`
gives every node a setting (an A/B of it); `--inflight N` replaces the paced load by the users'
load (N unacknowledged, as fast as they are acknowledged). Prints a table per system (median
and p90 of each step, in ms), the pull answers by status and the CPU of every process per
message; writes <results>/path_steps.json. Bounded: one run per system, every process stopped
in a `finally`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bridge.storage.rocketmq.messages import decode_messages
from bridge.storage.rocketmq.wire import RemotingCommand, decode_command
from tests.bench.harness.cluster import BenchCluster
from tests.bench.harness.common import log
from tests.bench.harness.javaclient import JavaClients, ensure_client
from tests.bench.harness.loadgen import build_loadgen, loadgen_args, run_loadgen
from tests.bench.harness.pathruns import Target, loadgen_run, warm_up
from tests.bench.harness.pcap import Stream, read_streams
from tests.bench.harness.procfs import CpuWindow, pid_readers, role_usage
from tests.bench.harness.rocketmq import local_rocketmq, stop_rocketmq
from tests.bench.rocketmq_path import SETTLE, WINDOW, mqtt_warmup_args

SEND_MESSAGE_V2 = 310
PULL_MESSAGE = 11
STAMP = 16
"""Bytes at the start of a payload that name one message (loadgen: its clock and sequence;
the Java client: its sequence and wall clock)."""
PULL_STATUS = {0: "found", 19: "not found yet", 20: "retry", 21: "offset moved"}
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Trace:
    """When each step of one message was seen (ns), by step name."""

    t: dict[str, int] = field(default_factory=dict)

    def first(self, step: str, t_ns: int) -> None:
        if step not in self.t or t_ns < self.t[step]:
            self.t[step] = t_ns


# --------------------------------------------------------------------------- frames


def mqtt_frames(stream: Stream) -> list[tuple[int, int, int, bytes]]:
    """(time, packet type, flags, body) of each MQTT packet in the stream."""
    data, pos, out = stream.data, 0, []
    while pos + 2 <= len(data):
        i, length, shift = pos + 1, 0, 0
        while i < len(data):
            b = data[i]
            length |= (b & 0x7F) << shift
            shift += 7
            i += 1
            if b < 0x80:
                break
        end = i + length
        if end > len(data):
            break
        out.append((stream.time_at(end - 1), data[pos] >> 4, data[pos] & 0x0F, bytes(data[i:end])))
        pos = end
    return out


def publish_of(flags: int, body: bytes) -> tuple[int | None, bytes]:
    """(packet id, payload's stamp) of an MQTT 3.1.1 PUBLISH body."""
    topic_len = int.from_bytes(body[0:2], "big")
    pos = 2 + topic_len
    packet_id = None
    if (flags >> 1) & 3:
        packet_id = int.from_bytes(body[pos : pos + 2], "big")
        pos += 2
    return packet_id, body[pos : pos + STAMP]


def rocketmq_frames(stream: Stream) -> list[tuple[int, RemotingCommand]]:
    """(time, command) of each remoting frame in the stream."""
    data, pos, out = stream.data, 0, []
    while pos + 4 <= len(data):
        length = int.from_bytes(data[pos : pos + 4], "big")
        end = pos + 4 + length
        if end > len(data):
            break
        out.append((stream.time_at(end - 1), decode_command(bytes(data[pos + 4 : end]))))
        pos = end
    return out


def peer_frames(stream: Stream) -> list[int]:
    """The time of each peer-link frame in the stream (u32 length, then the frame)."""
    data, pos, out = stream.data, 0, []
    while pos + 4 <= len(data):
        end = pos + 4 + int.from_bytes(data[pos : pos + 4], "big")
        if end > len(data):
            break
        out.append(stream.time_at(end - 1))
        pos = end
    return out


def broker_steps(
    streams: dict[Any, Stream], broker_port: int, traces: dict[bytes, Trace]
) -> Counter[str]:
    """Fill in send, send_ok, pull and pulled from every connection to the broker; count the
    pull answers by status. A message not yet in `traces` (the Java client's) is added."""
    statuses: Counter[str] = Counter()
    for (src, dst), stream in streams.items():
        if dst[1] != broker_port:
            continue
        answers = streams.get((dst, src))
        by_opaque = {
            cmd.opaque: (t, cmd)
            for t, cmd in (rocketmq_frames(answers) if answers is not None else [])
            if cmd.is_response
        }
        for t, cmd in rocketmq_frames(stream):
            answer = by_opaque.get(cmd.opaque)
            if cmd.code == SEND_MESSAGE_V2:
                trace = traces.setdefault(cmd.body[:STAMP], Trace())
                trace.first("send", t)
                if answer is not None and answer[1].code == 0:
                    trace.first("send_ok", answer[0])
            elif cmd.code == PULL_MESSAGE and answer is not None:
                statuses[PULL_STATUS.get(answer[1].code, str(answer[1].code))] += 1
                if answer[1].code != 0:
                    continue
                for message in decode_messages(answer[1].body):
                    pulled = traces.get(message.body[:STAMP])
                    if pulled is not None and answer[0] < pulled.t.get("pulled", 1 << 62):
                        pulled.t["pulled"] = answer[0]
                        pulled.t["pull"] = t
    return statuses


# --------------------------------------------------------------------------- capture


class Capture:
    """tcpdump on `lo`, nanosecond timestamps, written to `path`; `stop()` returns its count
    of packets the kernel dropped (a capture that dropped some is reported as such)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.dropped = -1
        self.proc = subprocess.Popen(
            [
                "tcpdump",
                "-i",
                "lo",
                "-n",
                "-B",
                "65536",
                "--time-stamp-precision=nano",
                "-w",
                str(path),
                "tcp",
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stderr is not None
        line = self.proc.stderr.readline()
        if "listening on" not in line:
            self.proc.kill()
            raise RuntimeError(f"tcpdump did not start: {line.strip()}")

    def __enter__(self) -> Capture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()  # also when the run under capture failed: tcpdump never outlives it

    def stop(self) -> int:
        if self.proc.returncode is not None:
            return self.dropped
        self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        found = re.search(r"(\d+) packets? dropped by kernel", err or "")
        self.dropped = int(found.group(1)) if found else -1
        return self.dropped


def sockets_of_pids() -> dict[tuple[str, int], int]:
    """(address, port) -> the PID holding that end of an established TCP connection."""
    out = subprocess.run(
        ["ss", "-tnpH", "state", "established"], capture_output=True, text=True, check=False
    ).stdout
    owner: dict[tuple[str, int], int] = {}
    for line in out.splitlines():
        fields = line.split()
        pid = re.search(r"pid=(\d+)", line)
        if len(fields) < 3 or pid is None:
            continue
        host, _, port = fields[2].rpartition(":")
        owner[(host, int(port))] = int(pid.group(1))
    return owner


# --------------------------------------------------------------------------- systems


def trace_cluster(args: argparse.Namespace, loadgen: Path, tmp: Path) -> dict[str, Any]:
    cluster = BenchCluster(tmp / "cluster", args.rocketmq_java_opts, tuple(args.set))
    try:
        cluster.start()
        for _ in range(3):
            cluster.add_node()
        node1, node2 = cluster.nodes["node1"], cluster.nodes["node2"]
        assert node1.proc is not None and node2.proc is not None
        broker_pid = cluster.mq.pid("broker")
        target = Target(node1.port, node2.port, cluster.cpu_pids, cluster.dead_nodes, broker_pid)
        warm = target.loadgen_args(mqtt_warmup_args(False, 10, 5))
        warm_up(lambda: loadgen_run(loadgen, node1.port, warm, 20, {}), broker_pid, 60)
        if args.inflight:
            # The users' load: as many unacknowledged as mosquitto_pub keeps, as fast as the
            # acknowledgements come (payloads stamped as the latency mode's).
            run = target.loadgen_args(
                loadgen_args(
                    "throughput",
                    1,
                    size=args.size,
                    count=args.count,
                    duration=args.seconds,
                    timeout=args.seconds + 20,
                    window=args.inflight,
                    flags={"-settle": SETTLE, "-stamp": "true"},
                )
            )
        else:
            run = target.loadgen_args(
                loadgen_args(
                    "latency",
                    1,
                    size=args.size,
                    rate=args.rate,
                    duration=args.seconds,
                    timeout=args.seconds + 20,
                    window=WINDOW,
                    flags={"-settle": SETTLE},
                )
            )
        pcap = tmp / "cluster.pcap"
        owners: dict[tuple[str, int], int] = {}
        result: dict[str, Any] = {}

        def load() -> None:
            result.update(run_loadgen(loadgen, node1.port, run, "raw", args.seconds + 40)[0])

        roles = cluster.cpu_pids()
        with Capture(pcap) as capture:
            window = CpuWindow(pid_readers(roles))
            runner = threading.Thread(target=load)
            runner.start()
            time.sleep(min(2.0, args.seconds / 2))
            owners = sockets_of_pids()
            runner.join()
            window.close()
            dropped = capture.stop()
        broker_port = int(cluster.mq.broker_addr.rpartition(":")[2])
        steps = cluster_steps(
            pcap, owners, node1.proc.pid, node2.proc.pid, node1.port, node2.port, broker_port
        )
        steps["loadgen"] = {
            k: result.get(k) for k in ("latency", "msgs_per_s", "delivered", "errors")
        }
        usage = role_usage(window, roles, int(result.get("delivered") or 0))
        steps["cpu_us_per_msg"] = usage.get("us_per_msg")
        steps["dropped_by_kernel"] = dropped
        return steps
    finally:
        cluster.stop()


def cluster_steps(
    pcap: Path,
    owners: dict[tuple[str, int], int],
    pid1: int,
    pid2: int,
    port1: int,
    port2: int,
    broker_port: int,
) -> dict[str, Any]:
    streams = read_streams(pcap)
    traces: dict[bytes, Trace] = {}
    pubacks: dict[int, list[int]] = {}
    for (src, dst), stream in streams.items():
        if dst[1] == port1:
            for t, kind, flags, body in mqtt_frames(stream):
                if kind == 3:
                    packet_id, stamp = publish_of(flags, body)
                    trace = traces.setdefault(stamp, Trace())
                    trace.first("publish in", t)
                    trace.t["packet id"] = packet_id or 0
        elif src[1] == port1:
            for t, kind, _, body in mqtt_frames(stream):
                if kind == 4:
                    pubacks.setdefault(int.from_bytes(body[0:2], "big"), []).append(t)
    for (src, _), stream in streams.items():
        if src[1] == port2:
            for t, kind, flags, body in mqtt_frames(stream):
                if kind == 3:
                    delivered = traces.get(publish_of(flags, body)[1])
                    if delivered is not None:
                        delivered.first("deliver", t)
    statuses = broker_steps(streams, broker_port, traces)
    wakes = sorted(
        t
        for (src, dst), stream in streams.items()
        if owners.get(src) == pid1
        and owners.get(dst) == pid2
        and broker_port not in (src[1], dst[1])
        and port2 != dst[1]
        for t in peer_frames(stream)
    )
    for trace in traces.values():
        if "publish in" not in trace.t:
            continue
        after = [t for t in pubacks.get(trace.t["packet id"], []) if t > trace.t["publish in"]]
        if after:
            trace.t["puback"] = min(after)
        if "send_ok" in trace.t:
            i = next((t for t in wakes if t >= trace.t["send_ok"]), None)
            if i is not None:
                trace.t["wake"] = i
    complete = [tr.t for tr in traces.values() if "publish in" in tr.t and "deliver" in tr.t]
    intervals = [
        ("publish in -> send", "publish in", "send"),
        ("send -> send_ok (broker)", "send", "send_ok"),
        ("send_ok -> puback", "send_ok", "puback"),
        ("publish in -> puback", "publish in", "puback"),
        ("send_ok -> wake (node1)", "send_ok", "wake"),
        ("wake -> pull (node2)", "wake", "pull"),
        ("send_ok -> pull", "send_ok", "pull"),
        ("pull -> pulled (broker)", "pull", "pulled"),
        ("pulled -> deliver (node2)", "pulled", "deliver"),
        ("send -> pulled", "send", "pulled"),
        ("publish in -> deliver", "publish in", "deliver"),
    ]
    return {
        "messages": len(complete),
        "steps": summarize(complete, intervals),
        "pull_answers": dict(statuses),
        "pulls_before_send_ok": sum(
            1 for t in complete if "pull" in t and "send_ok" in t and t["pull"] < t["send_ok"]
        ),
    }


def trace_java(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    mq = local_rocketmq(tmp / "rocketmq", args.rocketmq_java_opts, "SYNC_FLUSH")
    clients: JavaClients | None = None
    try:
        classpath = ensure_client(args.java_cache_dir)
        mq.start()
        clients = JavaClients(mq, classpath, args.client_java_opts, tmp)
        broker_pid = mq.pid("broker")

        def java(duration: float, rate: float, inflight: int = WINDOW, count: int = 0) -> Any:
            assert clients is not None
            return clients.run(
                size=args.size,
                count=count or (1_000_000 if not rate else int(rate * duration)),
                inflight=inflight,
                duration_s=duration,
                timeout_s=duration + 30,
                roles={},
                rate=rate,
            )

        warm_up(lambda: java(5, 0), broker_pid, 60)
        pcap = tmp / "java.pcap"
        with Capture(pcap) as capture:
            if args.inflight:  # the users' load: as fast as the sends are confirmed
                result = java(args.seconds, 0, args.inflight, args.count)
            else:
                result = java(args.seconds, args.rate)
            dropped = capture.stop()
        traces: dict[bytes, Trace] = {}
        statuses = broker_steps(read_streams(pcap), int(mq.broker_addr.rpartition(":")[2]), traces)
        complete = [tr.t for tr in traces.values() if "send" in tr.t and "pulled" in tr.t]
        intervals = [
            ("send -> send_ok (broker)", "send", "send_ok"),
            ("send -> pull", "send", "pull"),
            ("pull -> pulled (broker)", "pull", "pulled"),
            ("send -> pulled", "send", "pulled"),
        ]
        return {
            "messages": len(complete),
            "steps": summarize(complete, intervals),
            "pull_answers": dict(statuses),
            "java_latency": result.get("latency"),
            "java_msgs_per_s": result.get("msgs_per_s"),
            "dropped_by_kernel": dropped,
        }
    finally:
        try:
            if clients is not None:
                clients.stop()
        finally:
            stop_rocketmq(mq)


def summarize(
    traces: list[dict[str, int]], intervals: list[tuple[str, str, str]]
) -> dict[str, dict[str, float]]:
    """Median, p90 and count of each interval (ms) over the messages that have both ends; an
    interval can be negative (a pull sent before the send's answer)."""
    out: dict[str, dict[str, float]] = {}
    for name, a, b in intervals:
        values = sorted((t[b] - t[a]) / 1e6 for t in traces if a in t and b in t)
        if not values:
            continue
        out[name] = {
            "p50": round(statistics.median(values), 3),
            "p90": round(values[int(0.9 * (len(values) - 1))], 3),
            "n": len(values),
        }
    return out


def print_system(name: str, res: dict[str, Any]) -> None:
    log(f"\n=== {name}: {res.get('messages', 0):,} messages followed end to end")
    for step, v in res.get("steps", {}).items():
        log(f"    {step:<28} p50 {v['p50']:7.3f} ms   p90 {v['p90']:7.3f} ms   ({v['n']:,})")
    log(f"    pull answers: {res.get('pull_answers')}")
    for key in (
        "pulls_before_send_ok",
        "loadgen",
        "cpu_us_per_msg",
        "java_latency",
        "dropped_by_kernel",
    ):
        if key in res:
            log(f"    {key}: {res[key]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--only", default="cluster,java")
    ap.add_argument("--rate", type=int, default=1000, help="msg/s (default %(default)s)")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument(
        "--inflight",
        type=int,
        default=0,
        help="the users' load instead of a paced one: this many unacknowledged, as fast as "
        "they are acknowledged (mosquitto_pub keeps 20), --count messages",
    )
    ap.add_argument("--count", type=int, default=20_000)
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting every cluster node gets (repeatable): an A/B of one setting",
    )
    ap.add_argument("--rocketmq-java-opts", default="-XX:TieredStopAtLevel=4")
    ap.add_argument("--client-java-opts", default="")
    cache = Path.home() / ".cache" / "mqtt-bridge"
    ap.add_argument("--java-cache-dir", type=Path, default=cache)
    ap.add_argument("--cache-dir", type=Path, default=cache)
    ap.add_argument("--results-dir", type=Path, default=ROOT / "tests/bench/results")
    args = ap.parse_args(argv)
    if shutil.which("tcpdump") is None:
        log("tcpdump is not installed (`make path-steps` installs it)")
        return 2
    systems = [s for s in args.only.split(",") if s]
    out: dict[str, Any] = {"rate": args.rate, "seconds": args.seconds, "size": args.size}
    tmp = Path(tempfile.mkdtemp(prefix="mqtt-path-steps-"))
    try:
        for name in systems:
            if name == "cluster":
                out[name] = trace_cluster(args, build_loadgen(args.cache_dir), tmp)
            elif name == "java":
                out[name] = trace_java(args, tmp)
            else:
                ap.error(f"unknown system {name!r}")
            print_system(name, out[name])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        (args.results_dir / "path_steps.json").write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
