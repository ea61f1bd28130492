"""The MQTT side of rocketmq_path.py: its loads (`Load`), where a system's runs go (`Target`),
and each run with the CPU of every process involved: the users' load (Debian's mosquitto_pub -l
and mosquitto_sub -C, as a user would run them) and a loadgen run; also the warm-up that lasts
until a RocketMQ broker's JIT has gone quiet, the brokers' idle CPU, and Mosquitto's own word on
messages it dropped."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import IO, Any

from tests.bench.harness.common import HOST, log
from tests.bench.harness.loadgen import run_loadgen
from tests.bench.harness.procfs import (
    CpuWindow,
    children_cpu_s,
    jvm_jit_cpu,
    pid_readers,
    proc_cpu,
    role_usage,
)

MOSQUITTO_PUB = "/usr/bin/mosquitto_pub"
MOSQUITTO_SUB = "/usr/bin/mosquitto_sub"
SEQ_DIGITS = 8  # every payload line starts with its sequence number
CONNECT_WAIT_S = 10.0
SUBSCRIBE_TIMEOUT_S = 15.0
IDLE_S = 2.0  # as the loadgen's -idle
PUB_GRACE_S = 5.0


@dataclass(frozen=True)
class Load:
    """One load: the users' (mosquitto_pub/-sub) or a loadgen run; `java_inflight` is the
    number of sends in flight of its Java equivalent (None: it has none); `rate` > 0 is the
    fixed publish rate (msg/s) of a latency load, which its Java equivalent keeps too."""

    key: str
    title: str
    kind: str  # "users" | "loadgen"
    size: int
    timeout_s: float
    count: int = 0
    args: dict[str, str] = field(default_factory=dict)
    java_inflight: int | None = None
    mode: str = "throughput"  # "throughput" | "latency"
    rate: int = 0  # msg/s, latency loads; 0: as fast as the window allows

    def info(self) -> dict[str, Any]:
        return asdict(self)


def payload_file(directory: Path, size: int, count: int) -> Path:
    """`count` lines for mosquitto_pub -l, each the sequence number (8 digits) and 'x' up to
    `size` characters, then a newline: mosquitto_pub sends each line without its newline, so
    every message is exactly `size` bytes."""
    path = directory / f"payload-{size}B-{count}.txt"
    if not path.is_file():
        pad = "x" * (size - SEQ_DIGITS)
        path.write_text("".join(f"{i:0{SEQ_DIGITS}d}{pad}\n" for i in range(count)))
    return path


@dataclass
class Reaped:
    """A child process waited for by a thread of its own, with os.wait4: when it exited and the
    CPU it used (its rusage). kill() signals it through a pidfd, so never another process that
    got its PID after it was reaped."""

    proc: subprocess.Popen[bytes]
    pidfd: int = -1
    exited_at: float | None = None
    cpu_s: float = 0.0
    status: int | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.pidfd = os.pidfd_open(self.proc.pid)
        threading.Thread(target=self._wait, daemon=True).start()

    def _wait(self) -> None:
        _, status, usage = os.wait4(self.proc.pid, 0)
        self.exited_at = time.monotonic()
        self.cpu_s = usage.ru_utime + usage.ru_stime
        self.status = os.waitstatus_to_exitcode(status)
        self.proc.returncode = self.status  # Popen must not wait for it again
        self.done.set()

    def kill(self) -> None:
        if not self.done.is_set():
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        self.done.wait(10)
        with contextlib.suppress(OSError):
            os.close(self.pidfd)


def tcp_established(pid: int, port: int) -> bool:
    """Whether process `pid` has an established TCP connection to HOST:port (its socket inodes
    in /proc/PID/fd against /proc/net/tcp)."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "01" and int(f[2].split(":")[1], 16) == port and f[9] in inodes:
                return True
    return False


class OutputSink:
    """Reads a child's stdout in a thread of its own: every byte, and when the last of it came
    (the arrival of the last message a subscriber printed)."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.chunks: list[bytes] = []
        self.last_at: float | None = None
        self.closed = threading.Event()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[bytes]) -> None:
        while chunk := os.read(stream.fileno(), 1 << 16):
            self.chunks.append(chunk)
            self.last_at = time.monotonic()
        self.closed.set()

    def lines(self) -> list[bytes]:
        return b"".join(self.chunks).splitlines()


def users_run(
    *,
    pub_port: int,
    sub_port: int,
    size: int,
    count: int,
    timeout_s: float,
    roles: dict[str, list[int]],
    workdir: Path,
    settle_s: float = 0.0,
    jit_pid: int | None = None,
    version: tuple[str, ...] = (),
    pub_args: tuple[str, ...] = (),
    qos: int = 1,
) -> dict[str, Any]:
    """The users' load: `count` messages of `size` bytes at `qos` (default 1) from
    `mosquitto_pub -q QOS -l` (libmosquitto's default of 20 in flight at QoS 1) to
    `mosquitto_sub -q QOS -C count`. `version`
    (e.g. ("-V", "5")) goes to both clients, `pub_args` (e.g. MQTT 5.0 properties, -D ...)
    to mosquitto_pub; by default neither is given (the clients' default, MQTT 3.1.1).

    The subscriber's session is persistent (-c, a fixed id): a first mosquitto_sub subscribes
    and exits on the SUBACK (-E), then, `settle_s` later, the measured one resumes the session,
    so no message can be published before the subscription exists. The run ends when the
    subscriber has all messages, when nothing arrived for IDLE_S after the publisher had every
    message acknowledged ("idle": some were dropped, as QoS 0 may be), or at `timeout_s`.
    Delivered msg/s = distinct messages received / (publisher start -> arrival of the last
    one); `missing` = count - distinct messages received."""
    tag = uuid.uuid4().hex[:10]
    topic, sub_id = f"bench/path/{tag}", f"path-sub-{tag}"
    base = ["-h", HOST, *version, "-q", str(qos), "-t", topic]
    subscribe = [MOSQUITTO_SUB, *base, "-p", str(sub_port), "-c", "-i", sub_id]
    subprocess.run([*subscribe, "-E"], check=True, capture_output=True, timeout=SUBSCRIBE_TIMEOUT_S)
    time.sleep(settle_s)  # a cluster copies the subscription to the other nodes meanwhile
    sub_cmd = [*subscribe, "-C", str(count), "-W", str(int(timeout_s) + 5)]
    pub_cmd = [MOSQUITTO_PUB, *base, "-p", str(pub_port), "-i", f"path-pub-{tag}", *pub_args, "-l"]
    err_path = workdir / f"users-{tag}.err"
    payload = payload_file(workdir, size, count)  # written before the clock starts
    res: dict[str, Any] = {
        "size": size,
        "count": count,
        "commands": {"sub": shlex.join(sub_cmd), "pub": shlex.join(pub_cmd)},
    }
    with err_path.open("wb") as err:
        popen = subprocess.Popen(
            sub_cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err
        )
        assert popen.stdout is not None
        sink, sub = OutputSink(popen.stdout), Reaped(popen)
        pub: Reaped | None = None
        try:
            wait_connected(sub, sub_port, err_path)
            window = CpuWindow({**pid_readers(roles), "jit": partial(jvm_jit_cpu, jit_pid)})
            started = time.monotonic()
            with payload.open("rb") as lines:
                pub = Reaped(subprocess.Popen(pub_cmd, stdin=lines, stdout=err, stderr=err))
            res["stop_reason"] = wait_delivered(sub, pub, sink, started + timeout_s)
            pub.done.wait(PUB_GRACE_S)  # its last PUBACKs and DISCONNECT, after the last delivery
        finally:
            for proc in (sub, pub):
                if proc is not None:
                    proc.kill()
    window.close()
    sink.closed.wait(5)
    received = sink.lines()
    delivered = len({line[:SEQ_DIGITS] for line in received})
    last = sink.last_at or started
    acked_at = pub.exited_at if pub.status == 0 else None
    res.update(
        delivered=delivered,
        duplicates=len(received) - delivered,
        wrong_size=sum(1 for line in received if len(line) != size),
        missing=count - delivered,
        elapsed_s=round(last - started, 3),
        # mosquitto_pub exits once every message is acknowledged: the rate it got through.
        publish_rate=round(count / max(1e-9, acked_at - started)) if acked_at else None,
        msgs_per_s=round(delivered / max(1e-9, last - started)),
        pub_status=pub.status,
        **role_usage(
            window, roles, delivered, {"mosquitto_pub": pub.cpu_s, "mosquitto_sub": sub.cpu_s}
        ),
    )
    errors = []  # missing messages are a result: report() decides what they mean
    if acked_at is None:
        errors.append(f"mosquitto_pub exit {pub.status}: {err_path.read_text()[-300:]}")
    if res["wrong_size"]:
        errors.append(f"{res['wrong_size']} messages not of {size} bytes")
    if errors:
        res["errors"] = errors
    err_path.unlink(missing_ok=True)
    return res


def wait_connected(sub: Reaped, port: int, err_path: Path) -> None:
    """Until the subscriber's TCP connection to `port` is up: messages published from then on
    reach its session while it resumes it."""
    deadline = time.monotonic() + CONNECT_WAIT_S
    while not tcp_established(sub.proc.pid, port):
        if sub.done.is_set() or time.monotonic() > deadline:
            raise RuntimeError(f"mosquitto_sub did not connect: {err_path.read_text()[-300:]}")
        time.sleep(0.01)


def wait_delivered(sub: Reaped, pub: Reaped, sink: OutputSink, deadline: float) -> str:
    """How the run ended: "complete" (the subscriber exited with all its messages), "idle"
    (nothing new for IDLE_S after the publisher was done) or "timeout"."""
    while not sub.done.wait(0.05):
        now = time.monotonic()
        if now > deadline:
            return "timeout"
        if pub.done.is_set() and now - max(sink.last_at or 0.0, pub.exited_at or 0.0) > IDLE_S:
            return "idle"
    return "complete" if sub.status == 0 else f"subscriber exit {sub.status}"


def mosquitto_drops(log_path: Path) -> Callable[[str], dict[str, Any]]:
    """A hook for after each run: whether Mosquitto's own log says, since the last call, that it
    dropped messages for a client (a QoS 1 queue over its stock max_queued_messages, 1000)."""
    offset = 0

    def after_run(key: str) -> dict[str, Any]:
        nonlocal offset
        try:
            with log_path.open("rb") as f:
                f.seek(offset)
                text = f.read()
        except OSError:
            return {}
        offset += len(text)
        return {"broker_dropped": True} if b"Outgoing messages are being dropped" in text else {}

    return after_run


def loadgen_run(
    loadgen: Path,
    port: int,
    args: dict[str, str],
    timeout_s: float,
    roles: dict[str, list[int]],
    jit_pid: int | None = None,
) -> dict[str, Any]:
    """One loadgen run with the CPU of `roles`, the loadgen's own (its rusage) and the broker
    JVM's JIT over it."""
    readers: dict[str, Callable[[], float | None]] = {
        **pid_readers(roles),
        "loadgen": children_cpu_s,
        "jit": partial(jvm_jit_cpu, jit_pid),
    }
    window = CpuWindow(readers)
    res, cmd = run_loadgen(loadgen, port, args, "raw", timeout_s + 20)
    window.close()
    res["loadgen_cmd"] = shlex.join(cmd)
    delivered = int(res.get("delivered") or 0)
    res.update(role_usage(window, roles, delivered, {"loadgen": window.used("loadgen") or 0.0}))
    return res


def warm_up(
    step: Callable[[], dict[str, Any]], broker_pid: int | None, max_s: float, min_steps: int = 2
) -> list[dict[str, Any]]:
    """Run `step` (an unreported run) again and again until the broker JVM's JIT compiler
    threads used less than 5% of the broker's CPU over the last step, or `max_s` is spent:
    a broker still compiling costs more CPU per message than it will. What each step saw."""
    began = time.monotonic()
    steps: list[dict[str, Any]] = []
    while True:
        window = CpuWindow(
            {"broker": partial(proc_cpu, broker_pid), "jit": partial(jvm_jit_cpu, broker_pid)}
        )
        res = step()
        window.close()
        broker, jit = window.used("broker") or 0.0, window.used("jit") or 0.0
        steps.append(
            {
                "msgs_per_s": res.get("msgs_per_s"),
                "broker_cpu_s": round(broker, 2),
                "jit_cpu_s": round(jit, 2),
                "errors": res.get("errors"),
            }
        )
        log(
            f"    warm-up {len(steps)}: {res.get('msgs_per_s') or 0:,.0f} msg/s, broker "
            f"{window.percent(broker):.0f}% of a core, its JIT {window.percent(jit):.0f}%"
        )
        quiet = broker > 0 and jit < 0.05 * broker
        if (len(steps) >= min_steps and quiet) or time.monotonic() - began >= max_s:
            return steps


def idle_cpu(
    roles: dict[str, list[int]], seconds: float, jit_pid: int | None = None
) -> dict[str, float]:
    """% of a core each role uses with no load, over `seconds` (what a broker burns polling);
    with `jit_pid`, also "rocketmq_jit": that JVM's compiler threads (still compiling after a
    warm-up)."""
    readers: dict[str, Callable[[], float | None]] = {
        **pid_readers(roles),
        "jit": partial(jvm_jit_cpu, jit_pid),
    }
    window = CpuWindow(readers)
    time.sleep(seconds)
    window.close()
    usage = role_usage(window, roles, 0)
    out = {role: pct for role, pct in usage["cpu_percent"].items() if role in roles}
    if "jit_cpu_s" in usage:
        out["rocketmq_jit"] = round(window.percent(usage["jit_cpu_s"]), 1)
    return out


@dataclass
class Target:
    """Where the runs of one MQTT system go and what is measured."""

    pub_port: int
    sub_port: int
    roles: Callable[[], dict[str, list[int]]]
    alive: Callable[[], list[str]]  # what died
    jit_pid: int | None = None
    after_run: Callable[[str], dict[str, Any]] | None = None  # e.g. node log problems

    def loadgen_args(self, args: dict[str, str]) -> dict[str, str]:
        if self.pub_port == self.sub_port:
            return args
        pub, sub = f"{HOST}:{self.pub_port}", f"{HOST}:{self.sub_port}"
        return {**args, "-pub-addr": pub, "-sub-addr": sub}


def mqtt_run(
    target: Target, load: Load, loadgen: Path, workdir: Path, settle_s: float
) -> dict[str, Any]:
    """One run of `load` against an MQTT system: the users' load or a loadgen run, then the
    target's after-run hook."""
    if load.kind == "users":
        res = users_run(
            pub_port=target.pub_port,
            sub_port=target.sub_port,
            size=load.size,
            count=load.count,
            timeout_s=load.timeout_s,
            roles=target.roles(),
            workdir=workdir,
            settle_s=settle_s,
            jit_pid=target.jit_pid,
        )
    else:
        args = target.loadgen_args(load.args)
        res = loadgen_run(
            loadgen, target.pub_port, args, load.timeout_s, target.roles(), target.jit_pid
        )
    if target.after_run is not None:
        res.update(target.after_run(load.key))
    return res
