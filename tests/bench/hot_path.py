"""In-process benchmark of the publish/deliver hot path: a real node, the network taken out.

Run: ``.venv/bin/python tests/bench/hot_path.py [--scenarios qos1,qos0,fanout] [--rounds N]``;
another worktree's code: ``env PYTHONPATH=<worktree> .venv/bin/python -P tests/bench/hot_path.py``
(`bridge` is imported normally: the first on the path is measured, the header names it).

Each round builds a node as ``python -m bridge`` does (`Server`, its `FileLogStore` in a temp dir,
fsync on unless ``--fsync off``, uvloop) minus its listeners, and drives it through real
`Connection` objects on a `FakeTransport`: packets encoded with the project's codec go in through
``data_received``, what the node writes is read back with the project's `Decoder`. Scenarios
(100-byte payloads, MQTT 3.1.1): ``qos1``, one publisher keeping ``--window`` (20, as
mosquitto_pub) PUBLISHes unacknowledged -> one QoS 1 subscriber that PUBACKs each message;
``qos0``, one publisher (20 PUBLISHes per read) -> one subscriber at QoS 0; ``fanout``, the
same to 10 subscribers (figures per published message).

After an unmeasured warm-up, ``--count`` messages: wall seconds, msg/s, CPU per message of the
event-loop thread (``time.thread_time``) and of the process (``time.process_time``: adds the
store's writer thread), both without the harness's own decoding and checking (shown apart).
Every subscriber must get every message once and in order within ``--timeout``, else the run is
FAILED and the exit status 1.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import pstats
import statistics
import sys
import tempfile
import time
from argparse import ArgumentParser, Namespace
from collections.abc import Callable
from cProfile import Profile
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import uvloop

import bridge
from bridge.checks import load_config
from bridge.config import Config
from bridge.listeners.connection import Connection
from bridge.listeners.server import Server
from bridge.mqtt import codec
from bridge.mqtt.codec import Decoder
from bridge.mqtt.packets import Connack, Connect, Puback, Publish, Suback, Subscribe, Subscription
from bridge.node import Node

TOPIC = "bench/hot-path/t"
PAYLOAD_SIZE = 100
QOS0_BATCH = 20
WARMUP = 2_000
SCENARIOS = {"qos1": (1, 1, 50_000), "qos0": (0, 1, 100_000), "fanout": (0, 10, 100_000)}
"""Name -> (QoS of the publishes and subscriptions, subscribers, default message count)."""


class HarnessCpu:
    """Loop-thread CPU the harness spends on its own work (decoding what the node wrote,
    checking it, building PUBACKs), subtracted from the broker's figures."""

    def __init__(self) -> None:
        self.seconds = self._start = 0.0

    def __enter__(self) -> None:
        self._start = time.thread_time()

    def __exit__(self, *_exc: object) -> None:
        self.seconds += time.thread_time() - self._start


class FakeTransport:
    """What `Connection` uses of a socket transport. Keeps what the node writes; `wait` returns
    once something was written or reading resumed; `close` reports the loss as a socket does."""

    def __init__(self, protocol: Connection, peer: tuple[str, int]) -> None:
        self.protocol = protocol
        self.peer = peer
        self.chunks: list[bytes] = []
        self.reading = True
        self.closing = False
        self.on_write: Callable[[], None] | None = None
        self._waiter: asyncio.Future[None] | None = None

    def write(self, data: bytes) -> None:
        self.chunks.append(data)
        self._wake()
        if self.on_write is not None:
            self.on_write()

    async def wait(self) -> None:
        if not self.chunks:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.peer if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0  # never over the high-water mark: QoS 0 is never dropped as a slow consumer

    def can_write_eof(self) -> bool:
        return False  # close at once rather than linger a second for the client's last bytes

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True
        self._wake()

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)


PUBACKS = [b""] + [codec.encode(Puback(pid)) for pid in range(1, 65536)]


def packet_id(seq: int) -> int:
    return seq % 65535 + 1


class Client:
    """A client as the node sees it (a real `Connection` on a `FakeTransport`) and the checks
    of what it receives: as a subscriber, every message once and in order, PUBACKed at QoS 1."""

    def __init__(self, node: Node, client_id: str, port: int, harness: HarnessCpu) -> None:
        self.client_id = client_id
        self.harness = harness
        self.conn = Connection(node)
        self.transport = FakeTransport(self.conn, ("127.0.0.1", port))
        self.conn.connection_made(self.transport)  # type: ignore[arg-type]
        self.decoder = Decoder()
        self.errors: list[str] = []
        self.qos = 0
        self.expected = 0
        self.target = 0
        self.done: asyncio.Future[None] | None = None
        self._reading = False

    def received(self) -> list[Any]:
        self.decoder.feed(b"".join(self.transport.chunks))
        self.transport.chunks.clear()
        return self.decoder.packets()

    def error(self, text: str) -> None:
        if len(self.errors) < 3:
            self.errors.append(f"{self.client_id}: {text}")

    async def exchange(self, packet: Any, accepted: Any) -> None:
        """Send `packet`; raise unless the node's answer equals `accepted`."""
        self.conn.data_received(codec.encode(packet))
        while not self.transport.chunks or not (answers := self.received()):
            await self.transport.wait()
        if answers[0] != accepted:
            raise RuntimeError(f"{self.client_id}: {packet!r:.60} answered {answers[0]}")

    async def connect(self) -> None:
        await self.exchange(Connect(self.client_id, clean_session=True), Connack(0, False))

    async def subscribe(self, qos: int) -> None:
        await self.exchange(Subscribe(1, [Subscription(TOPIC, qos)]), Suback(1, [qos]))
        self.qos = qos
        self.transport.on_write = self._written

    def expect_until(self, target: int) -> asyncio.Future[None]:
        self.target = target
        self.done = asyncio.get_running_loop().create_future()
        return self.done

    def _written(self) -> None:
        if not self._reading:  # as a socket read: what arrived until the loop gets to us
            self._reading = True
            asyncio.get_running_loop().call_soon(self._read)

    def _read(self) -> None:
        self._reading = False
        acks = []
        with self.harness:
            for packet in self.received():
                seq = int(packet.payload[:8]) if type(packet) is Publish else -1
                if seq != self.expected or packet.qos != self.qos:
                    self.error(f"expected message {self.expected}, got {packet!r:.70}")
                    self.expected = max(self.expected, seq + 1)
                    continue
                self.expected += 1
                if self.qos:
                    acks.append(PUBACKS[packet.packet_id])
        if acks:
            self.conn.data_received(b"".join(acks))
        if self.expected >= self.target and self.done is not None and not self.done.done():
            self.done.set_result(None)


def encode_publishes(qos: int, total: int) -> list[bytes]:
    """Every PUBLISH of a round, encoded before it starts (QoS 0: `QOS0_BATCH` per read)."""
    payloads = [f"{i:08d}".encode().ljust(PAYLOAD_SIZE, b"x") for i in range(total)]
    if qos:
        return [
            codec.encode(Publish(TOPIC, p, 1, packet_id=packet_id(i)))
            for i, p in enumerate(payloads)
        ]
    single = [codec.encode(Publish(TOPIC, data)) for data in payloads]
    return [b"".join(single[i : i + QOS0_BATCH]) for i in range(0, total, QOS0_BATCH)]


async def publish_qos1(pub: Client, data: list[bytes], first: int, stop: int, window: int) -> None:
    """Keep `window` PUBLISHes unacknowledged, as mosquitto_pub does with max_inflight."""
    sent = acked = first
    while acked < stop:
        while sent < stop and sent - acked < window and pub.transport.reading:
            pub.conn.data_received(data[sent])
            sent += 1
        await pub.transport.wait()
        with pub.harness:
            for packet in pub.received():
                if type(packet) is not Puback or packet.packet_id != packet_id(acked):
                    pub.error(f"expected PUBACK {packet_id(acked)}, got {packet!r:.70}")
                acked += 1


async def publish_qos0(pub: Client, batches: list[bytes], first: int, stop: int) -> None:
    """One read of `QOS0_BATCH` PUBLISHes per loop turn, while the node reads."""
    for index in range(first // QOS0_BATCH, -(-stop // QOS0_BATCH)):
        while not pub.transport.reading:
            await pub.transport.wait()
        pub.conn.data_received(batches[index])
        await asyncio.sleep(0)


@dataclass
class Round:
    """One measured run: seconds of wall time, of CPU of the loop thread and of the process
    (both without the harness's), of CPU of the harness."""

    messages: int
    seconds: tuple[float, ...]
    error: str = ""

    @classmethod
    def median(cls, rounds: list[Round]) -> Round:
        """Each figure's median over `rounds`, and every round's errors."""
        columns = zip(*(r.seconds for r in rounds), strict=True)
        seconds = tuple(statistics.median(column) for column in columns)
        return cls(rounds[0].messages, seconds, "; ".join(r.error for r in rounds if r.error))

    def line(self, label: str) -> str:
        wall, *cpu = self.seconds
        per_msg = "".join(f" {s * 1e6 / self.messages:>8.1f}" for s in cpu)
        status = f"FAILED: {self.error}" if self.error else "ok"
        rate = self.messages / wall
        return f"{label:<16} {self.messages:>8,} {wall:>7.2f} {rate:>9,.0f}{per_msg}  {status}"


HEADER = "{:<16} {:>8} {:>7} {:>9} {:>8} {:>8} {:>8}".format(
    "run", "msgs", "wall s", "msg/s", "loop µs", "proc µs", "harn µs"
)


def make_config(data_dir: str, args: Namespace) -> Config:
    """The settings of `python -m bridge --data-dir DIR --set ...`, without the environment's."""
    overrides: dict[str, object] = dict(item.split("=", 1) for item in args.set)
    overrides.update(listen=["127.0.0.1:0"], data_dir=data_dir, fsync=args.fsync == "on")
    overrides.update(log_level=args.log_level, node_id="hot-path")
    config = load_config(None, env={}, overrides=overrides)
    config.listen = []  # validated with one, started with none: the clients are in-process
    return config


async def run_round(
    name: str, args: Namespace, packets: list[bytes], profiler: Profile | None
) -> Round:
    """A fresh node and clients, the warm-up, one measured run; everything closed after."""
    qos, subscribers, default_count = SCENARIOS[name]
    count = args.count or default_count
    with tempfile.TemporaryDirectory(prefix="hot-path-") as data_dir:
        server = Server(make_config(data_dir, args))
        await server.start()
        try:
            harness = HarnessCpu()
            node = server.node
            pub = Client(node, "pub", 10000, harness)
            await pub.connect()
            subs = [Client(node, f"sub{i}", 10001 + i, harness) for i in range(subscribers)]
            for sub in subs:
                await sub.connect()
                await sub.subscribe(qos)

            async def flow(first: int, stop: int) -> None:
                done = [sub.expect_until(stop) for sub in subs]
                if qos:
                    send = publish_qos1(pub, packets, first, stop, args.window)
                else:
                    send = publish_qos0(pub, packets, first, stop)
                await asyncio.gather(send, *done)

            await asyncio.wait_for(flow(0, WARMUP), args.timeout)
            harness.seconds = 0.0
            error = ""
            wall, thread, process = time.perf_counter(), time.thread_time(), time.process_time()
            if profiler is not None:
                profiler.enable()
            try:
                await asyncio.wait_for(flow(WARMUP, WARMUP + count), args.timeout)
            except TimeoutError:
                got = min(sub.expected for sub in subs) - WARMUP
                error = f"timeout after {args.timeout:.0f} s: {got:,} of {count:,} delivered"
            finally:
                if profiler is not None:
                    profiler.disable()
            thread = time.thread_time() - thread - harness.seconds
            process = time.process_time() - process - harness.seconds
            wall = time.perf_counter() - wall
            errors = [e for client in [pub, *subs] for e in client.errors]
            error = "; ".join([error, *errors] if error else errors)
            return Round(count, (wall, thread, process, harness.seconds), error)
        finally:
            await server.shutdown()
            if left := asyncio.all_tasks() - {asyncio.current_task()}:
                print(f"  note: {len(left)} tasks left after the node's shutdown: {left}")


def one_round(name: str, args: Namespace, packets: list[bytes], profiler: Profile | None) -> Round:
    try:
        return uvloop.run(run_round(name, args, packets, profiler))
    finally:
        gc.unfreeze()  # Server.start froze what the round had built; let it go
        gc.collect()


def parse_args(argv: list[str] | None) -> Namespace:
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--scenarios", default=",".join(SCENARIOS), help="comma-separated, of the default")
    add("--count", type=int, default=0, help="messages (default 50,000 qos1, 100,000 others)")
    add("--window", type=int, default=20, help="qos1: PUBLISHes in flight (default 20)")
    add("--fsync", choices=["on", "off"], default="on", help="the store's fsync (default on)")
    add("--rounds", type=int, default=1, help="rounds per scenario, each on a fresh node")
    add("--timeout", type=float, default=30.0, help="seconds a measured run may take")
    add("--profile", metavar="FILE", help="cProfile an extra round into FILE (pstats)")
    add("--set", action="append", default=[], metavar="NAME=VALUE", help="a node setting")
    add("--log-level", default="error", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)
    args.names = [name for name in args.scenarios.split(",") if name]
    unknown = [name for name in args.names if name not in SCENARIOS]
    if unknown or not args.names:
        parser.error(f"unknown scenarios {unknown}; known: {', '.join(SCENARIOS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    where = f"bridge from {Path(bridge.__file__).parent}, Python {sys.version.split()[0]}"
    print(f"{where}, uvloop {version('uvloop')}, fsync {args.fsync}, window {args.window}")
    print(
        "µs: CPU per message of the loop thread and of the process (store writer included), "
        "without the harness's (harn)\n" + HEADER
    )
    failed = False
    for name in args.names:
        qos, _, default_count = SCENARIOS[name]
        packets = encode_publishes(qos, WARMUP + (args.count or default_count))
        rounds = []
        for index in range(args.rounds):
            rounds.append(one_round(name, args, packets, None))
            print(rounds[-1].line(f"{name} #{index + 1}"), flush=True)
        failed |= any(r.error for r in rounds)
        if len(rounds) > 1:
            print(Round.median(rounds).line(f"{name} median"))
        if args.profile:
            profiler = Profile()
            result = one_round(name, args, packets, profiler)
            print(result.line(f"{name} profiled"))
            failed |= bool(result.error)
            path = Path(args.profile)
            if len(args.names) > 1:
                path = path.with_name(f"{path.stem}.{name}{path.suffix}")
            profiler.dump_stats(path)
            print(f"profile of one {name} round written to {path}; top 30 by tottime:")
            pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(30)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
