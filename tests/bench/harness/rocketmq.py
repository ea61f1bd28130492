"""RocketMQ in the benches: a LocalRocketMQ (tests/support/rocketmq.py) with the JVM options
of a benchmark, its stop that leaves no JVM behind, the broker's own counters, and
`RocketMQBridge`, our broker on ``store=rocketmq`` together with the RocketMQ it needs
(run_bench.py's ``ours-rocketmq``)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from tests.bench.harness.common import first_line, log, run_text
from tests.bench.harness.processes import Broker, ours_command
from tests.support.rocketmq import LocalRocketMQ, probe

ROCKETMQ_VERSION = "5.3.3"
# deploy/rocketmq/env.sh runs the JVMs with the C1 JIT only (fast start-up for tests) and
# recommends full tiered compilation for benchmarks; ROCKETMQ_JAVA_OPTS is appended last.
DEFAULT_ROCKETMQ_JAVA_OPTS = "-XX:TieredStopAtLevel=4"
ROCKETMQ_VARIANT = "ours-rocketmq"
# Appended to the bridge's command line for the ours-rocketmq variant.
ROCKETMQ_BRIDGE_ARGS = "--set store=rocketmq --set rocketmq_namesrv={namesrv}"
GET_BROKER_RUNTIME_INFO = 28  # RequestCode


def add_rocketmq_option(ap: argparse.ArgumentParser, jvms: str = "the RocketMQ JVMs") -> None:
    """--rocketmq-java-opts: ROCKETMQ_JAVA_OPTS for the JVMs a bench starts."""
    ap.add_argument(
        "--rocketmq-java-opts",
        default=DEFAULT_ROCKETMQ_JAVA_OPTS,
        help=f"ROCKETMQ_JAVA_OPTS for {jvms} (default: %(default)s)",
    )


def local_rocketmq(workdir: Path, java_opts: str, flush_disk_type: str) -> LocalRocketMQ:
    """A LocalRocketMQ under `workdir` whose JVMs get `java_opts` (not started yet)."""
    os.environ["ROCKETMQ_JAVA_OPTS"] = java_opts  # read by LocalRocketMQ._env()
    return LocalRocketMQ(workdir, flush_disk_type=flush_disk_type)


def is_rocketmq_jvm(pid: int) -> bool:
    try:
        return b"org.apache.rocketmq." in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def stop_rocketmq(mq: LocalRocketMQ) -> None:
    """stop.sh --kill (SIGKILL: the instance is thrown away), then SIGKILL by PID any of its
    JVMs still running, also when stop.sh failed: a bench never leaves RocketMQ behind."""
    pids = [mq.pid(role) for role in ("broker", "namesrv")]
    try:
        mq.stop(graceful=False)
    except (RuntimeError, OSError) as e:
        log(f"    RocketMQ stop.sh failed ({e}); killing by PID")
    finally:
        for pid in pids:
            if pid is not None and is_rocketmq_jvm(pid):
                log(f"    RocketMQ JVM {pid} still running after stop.sh; SIGKILL")
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)


def broker_counters(mq: LocalRocketMQ) -> tuple[int, int]:
    """(messages stored, commit-log bytes) since the broker started."""
    code, body = probe.request(mq.broker_addr, GET_BROKER_RUNTIME_INFO, timeout=10.0)
    if code != 0:
        raise RuntimeError(f"GET_BROKER_RUNTIME_INFO answered code {code}")
    table = json.loads(body)["table"]
    return int(table["putMessageTimesTotal"]), int(table["commitLogMaxOffset"])


class RocketMQBridge(Broker):
    """The bridge with store=rocketmq, plus the LocalRocketMQ it needs.

    start() starts RocketMQ (NameServer + broker, SYNC_FLUSH) under the broker's temp dir
    first, then the bridge; stop() stops the bridge, then RocketMQ (stop_rocketmq). LocalRocketMQ
    also registers a finalizer that runs at interpreter exit.
    """

    def __init__(self, tmp: Path, port: int, template: str, java_opts: str) -> None:
        self.mq = local_rocketmq(tmp / "rocketmq", java_opts, "SYNC_FLUSH")
        self.java_opts = java_opts
        extra = ROCKETMQ_BRIDGE_ARGS.format(namesrv=self.mq.namesrv_addr)
        cmd = ours_command(f"{template} {extra}", tmp, port)
        super().__init__(ROCKETMQ_VARIANT, cmd, tmp, tmp / "ours-rocketmq.log", port)
        self.extra["more_logs"] = {
            "rocketmq-broker.log": self.mq.log_dir / "broker.log",
            "rocketmq-broker.out": self.mq.log_dir / "broker.out",
        }
        self.start_s: float | None = None

    def start(self) -> None:
        log(
            f"    starting RocketMQ {ROCKETMQ_VERSION} (namesrv {self.mq.namesrv_addr}, broker "
            f"{self.mq.broker_addr}, SYNC_FLUSH, ROCKETMQ_JAVA_OPTS={self.java_opts!r}) ..."
        )
        t0 = time.monotonic()
        self.mq.start()
        self.start_s = time.monotonic() - t0
        log(
            f"    RocketMQ started in {self.start_s:.1f} s (broker pid {self.mq.pid('broker')}, "
            f"namesrv pid {self.mq.pid('namesrv')})"
        )
        super().start()

    def rocketmq_pid(self) -> int | None:
        return self.mq.pid("broker")

    def info(self) -> dict[str, Any]:
        """What was started, for the JSON results."""
        return {
            "version": ROCKETMQ_VERSION,
            "namesrv": self.mq.namesrv_addr,
            "broker": self.mq.broker_addr,
            "flush_disk_type": self.mq.flush_disk_type,
            "java_opts": self.java_opts,
            "java": first_line(run_text(["java", "-version"])),
            "start_s": None if self.start_s is None else round(self.start_s, 1),
            "broker_pid": self.mq.pid("broker"),
            "namesrv_pid": self.mq.pid("namesrv"),
        }

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            stop_rocketmq(self.mq)
