"""The client side of a connection-capacity run (`tests/bench/conn_capacity.py`): many idle MQTT
connections held by several Go loadgen processes, none of them holding more than it may open files
for, every step split evenly over them and run on all of them at once, and their replies summed.

A process may hold at most 20,000 open files, so the connections are spread over processes of at
most `per_process` each, and over several source addresses so that no address runs out of
ephemeral ports (Linux gives each local address its own `ip_local_port_range`).
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Any

from tests.bench.harness.loadgen import LoadgenProcess, idle_command

REPLY_GRACE_S = 15.0
"""How much longer than its own step cap a loadgen may take to answer."""


def local_port_range() -> int:
    """How many ephemeral ports one local address has (ip_local_port_range)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(high) - int(low) + 1
    except (OSError, ValueError):
        return 28_232  # Linux's default range, 32768-60999


class ClientFleet:
    """The client side: enough loadgen processes that none holds more than `per_process`
    connections; every step is split evenly over them and runs on all of them at once."""

    def __init__(
        self, loadgen: Path, port: int, args: argparse.Namespace, tag: str, workdir: Path
    ) -> None:
        count = math.ceil(args.max_connections / args.per_process)
        self.step_timeout = args.step_timeout
        self.procs: list[LoadgenProcess] = []
        try:
            for i in range(count):
                cmd = idle_command(
                    loadgen,
                    port,
                    args.sources,
                    args.step_timeout,
                    args.client_timeout,
                    client_id=f"cap{os.getpid()}-{tag}-p{i}",
                    concurrency=args.concurrency,
                )
                self.procs.append(LoadgenProcess(cmd, workdir / f"loadgen-{i}.err"))
        except BaseException:
            self.kill()
            raise

    def shares(self, total: int) -> list[int]:
        """How many of `total` connections each process holds."""
        n = len(self.procs)
        return [total // n + (1 if i < total % n else 0) for i in range(n)]

    def run(self, commands: list[str]) -> list[dict[str, Any]]:
        """Send commands[i] to process i, all at once, and collect every reply."""
        for proc, command in zip(self.procs, commands, strict=True):
            proc.send(command)
        return [proc.reply(self.step_timeout + REPLY_GRACE_S) for proc in self.procs]

    def rss_kib(self) -> int:
        return sum(p.rss_kib() or 0 for p in self.procs)

    def kill(self) -> None:
        for proc in self.procs:
            proc.kill()


def merge(replies: list[dict[str, Any]]) -> dict[str, Any]:
    """The sum of the processes' replies to one command, and their errors."""
    failed_by: dict[str, int] = {}
    errors: list[str] = []
    for r in replies:
        for kind, n in (r.get("failed_by") or {}).items():
            failed_by[kind] = failed_by.get(kind, 0) + n
        errors += r.get("errors") or []
    return {
        "ok": sum(r.get("ok", 0) for r in replies),
        "failed": sum(r.get("failed", 0) for r in replies),
        "held": sum(r.get("held", 0) for r in replies),
        "failed_by": failed_by,
        "errors": errors[:20],
        "answered": all("op" in r for r in replies),
        "latency_p99_ms_max": max(
            ((r.get("latency") or {}).get("p99_ms", 0.0) for r in replies), default=0.0
        ),
    }
