"""RocketMQ's official Java client as a fixed-count producer and consumer (rocketmq_path.py):
tests/bench/java/PathClient.java, built with javac against the RocketMQ 5.3.3 jars (cached by a
hash of its source and the JDK), its two JVMs driven over stdin/stdout, and one run of them
with the CPU of every process involved.

RocketMQ's own benchmark classes do not fit this comparison: the example Consumer has no
message count and starts from the group's last offset (messages sent before its rebalance are
skipped), and it reports a TPS per interval, not when the last of N messages arrived.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import queue
import shlex
import shutil
import subprocess
import threading
import time
import uuid
from functools import partial
from pathlib import Path
from typing import IO, Any

from tests.bench.harness.common import BENCH_DIR, log, run_text
from tests.bench.harness.procfs import CpuWindow, jvm_jit_cpu, pid_readers, role_usage
from tests.bench.harness.producer import java_bin, java_client_command, rocketmq_lib
from tests.support.rocketmq import LocalRocketMQ

CLIENT_SRC = BENCH_DIR / "java" / "PathClient.java"
CLIENT_MAIN = "PathClient"
TOPIC_QUEUES = 4  # the broker's defaultTopicQueueNums, as auto-created topics get
READY_TIMEOUT_S = 90.0  # two JVMs starting on a loaded 2-core machine
EXIT_GRACE_S = 10.0
CONSUMER_IDLE_S = 2.0  # as the loadgen's -idle: nothing new for this long after the last send


def ensure_client(cache_root: Path) -> str:
    """Classpath of PathClient, compiled into cache_root on first use (and again whenever its
    source or the JDK changes)."""
    lib = rocketmq_lib()
    h = hashlib.sha256(CLIENT_SRC.read_bytes())
    h.update(run_text([java_bin("javac"), "-version"]).encode())
    classes = cache_root / f"path-client-{h.hexdigest()[:16]}"
    classpath = f"{classes}:{lib}/*"
    if (classes / f"{CLIENT_MAIN}.class").is_file():
        return classpath
    tmp = cache_root / f".path-client-build-{uuid.uuid4().hex[:8]}"
    log(f"compiling {CLIENT_SRC.name} -> {classes}")
    try:
        subprocess.run(
            [java_bin("javac"), "-nowarn", "-d", str(tmp), "-cp", f"{lib}/*", str(CLIENT_SRC)],
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
        )
        shutil.rmtree(classes, ignore_errors=True)
        tmp.replace(classes)
    except subprocess.CalledProcessError as e:
        raise RuntimeError(f"javac {CLIENT_SRC} failed:\n{e.stdout}{e.stderr}") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return classpath


class ClientJVM:
    """One PathClient JVM: its JSON lines arrive on a queue (read by a thread), commands go to
    its stdin; kill() stops it by PID."""

    def __init__(self, name: str, cmd: list[str], log_path: Path) -> None:
        self.name = name
        self.cmd = cmd
        self.log_path = log_path
        self._log: IO[str] = log_path.open("a")  # a replaced JVM logs after the one before
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            bufsize=1,
            start_new_session=True,  # a terminal's Ctrl-C reaches us only; we stop it by PID
        )
        self._events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._log.write(line)
            with contextlib.suppress(json.JSONDecodeError):
                event = json.loads(line)
                if isinstance(event, dict):
                    self._events.put(event)
        self._events.put(None)

    def event(self, name: str, timeout: float) -> dict[str, Any]:
        """The next event `name`; raises if the JVM reports an error, exits or is late."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                ev = self._events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(
                    f"Java {self.name}: no {name!r} within {timeout:.0f} s; log {self.log_path}"
                ) from None
            if ev is None:
                raise RuntimeError(
                    f"Java {self.name} (pid {self.proc.pid}) exited with code {self.proc.wait()} "
                    f"before {name!r}; log {self.log_path}"
                )
            if ev.get("event") == "error":
                raise RuntimeError(f"Java {self.name}: {'; '.join(ev.get('errors', []))}")
            if ev.get("event") == name:
                return ev

    def send(self, line: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()

    def stop(self) -> None:
        """Ask it to exit (it shuts its client down), SIGKILL by PID after EXIT_GRACE_S."""
        self.send("exit")
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=EXIT_GRACE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
        self._log.close()


def client_command(java_opts: str, classpath: str, mq: LocalRocketMQ, role: str) -> list[str]:
    """The command line of the producer or consumer JVM; its client logs go to the RocketMQ
    data dir, as producer.py's Producer's do."""
    return [
        *java_client_command(java_opts, classpath, mq, mq.data_dir / "home"),
        CLIENT_MAIN,
        role,
        mq.namesrv_addr,
    ]


class JavaClients:
    """A producer JVM and a consumer JVM that serve every run against one RocketMQ, so that all
    runs but the first measure clients whose JIT is warm. A run that fails replaces both (they
    may be mid-run or gone); stop() ends both (by PID if they do not exit when asked)."""

    def __init__(self, mq: LocalRocketMQ, classpath: str, java_opts: str, logs_dir: Path) -> None:
        self.mq = mq
        self.commands_of = {
            role: client_command(java_opts, classpath, mq, role) for role in ("produce", "consume")
        }
        self.logs_dir = logs_dir
        self.restarts = 0
        self._start()

    def _start(self) -> None:
        self.producer = ClientJVM(
            "producer", self.commands_of["produce"], self.logs_dir / "java-producer.log"
        )
        try:
            self.consumer = ClientJVM(
                "consumer", self.commands_of["consume"], self.logs_dir / "java-consumer.log"
            )
        except OSError:
            self.producer.stop()
            raise

    def commands(self) -> dict[str, str]:
        return {
            "producer": shlex.join(self.producer.cmd),
            "consumer": shlex.join(self.consumer.cmd),
        }

    def stop(self) -> None:
        try:
            self.producer.stop()
        finally:
            self.consumer.stop()

    def run(self, **run: Any) -> dict[str, Any]:
        """One run (`_run`'s keyword arguments); after a failure the clients are replaced for
        the next runs."""
        try:
            return self._run(**run)
        except (RuntimeError, KeyError, OSError):
            self.stop()
            self.restarts += 1
            self._start()
            raise

    def _run(
        self,
        *,
        size: int,
        count: int,
        inflight: int,
        duration_s: float,
        timeout_s: float,
        roles: dict[str, list[int]],
        jit_pid: int | None = None,
        rate: float = 0,
    ) -> dict[str, Any]:
        """One run on a new topic (TOPIC_QUEUES queues) and consumer group: once both clients
        are ready, `count` messages of `size` bytes, until the consumer has every message sent
        or `timeout_s`. `rate` 0: `inflight` synchronous sends in flight, publish phase capped at
        `duration_s`; `rate` > 0: paced at `rate` msg/s for `duration_s` (the loadgen's latency
        mode), asynchronous sends, at most `inflight` unacknowledged. CPU of `roles` and both
        JVMs over that window, and of the JIT of the JVM `jit_pid` (the broker)."""
        topic = f"PathBench_{uuid.uuid4().hex[:12]}"
        self.producer.send(
            f"run {topic} {TOPIC_QUEUES} {size} {count} {inflight} {duration_s} {timeout_s} {rate}"
        )
        self.producer.event("ready", READY_TIMEOUT_S)  # the topic exists and has its route
        self.consumer.send(f"run {topic} {TOPIC_QUEUES} {count} {CONSUMER_IDLE_S} {timeout_s + 10}")
        self.consumer.event("ready", READY_TIMEOUT_S)
        all_roles = {
            **roles,
            "producer": [self.producer.proc.pid],
            "consumer": [self.consumer.proc.pid],
        }
        window = CpuWindow({**pid_readers(all_roles), "jit": partial(jvm_jit_cpu, jit_pid)})
        go_ns = time.time_ns()  # the wall clock: the consumer reports its last arrival on it
        self.producer.send("go")
        sent = self.producer.event("done", timeout_s + 30)
        self.consumer.send(f"expect {sent['sent']}")
        got = self.consumer.event("done", timeout_s + 30)
        window.close()
        delivered = int(got["received"])
        send_s = max(1e-9, (sent["end_ns"] - sent["start_ns"]) / 1e9)
        res: dict[str, Any] = {
            "size": size,
            "count": count,
            "inflight": inflight,
            "rate": rate,
            "topic": topic,
            "sent": int(sent["sent"]),
            "send_failed": int(sent["failed"]),
            "send_errors": sent.get("errors", []),
            "delivered": delivered,
            "duplicates": int(got["duplicates"]),
            "missing": max(0, int(sent["sent"]) - delivered),
            "stop_reason": got["stop_reason"],
            "publish_rate": round(int(sent["sent"]) / send_s),
            "msgs_per_s": round(delivered / max(1e-9, (got["last_wall_ns"] - go_ns) / 1e9))
            if delivered
            else 0,
            "late_sends": int(sent["late"]),  # paced: sends more than 1 ms behind the schedule
            "max_inflight": int(sent["max_inflight"]),
            "latency": got["latency"],
            **role_usage(window, all_roles, delivered),
        }
        errors = []
        if res["send_failed"]:
            errors.append(f"{res['send_failed']} sends failed ({'; '.join(res['send_errors'])})")
        if res["stop_reason"] != "complete":
            errors.append(f"consumer stopped: {res['stop_reason']}")
        if errors:
            res["errors"] = errors
        return res
