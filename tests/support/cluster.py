"""Start bridge nodes as one cluster for tests: store=rocketmq, a Redis registry, peer links.

Each `ClusterLauncher` gets its own `cluster_name` (Redis key prefix) and RocketMQ namespace, so
tests sharing the session's Redis and RocketMQ never see each other's sessions or queues.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.clients import PahoClient
from tests.support.processes import REPO, BridgeProcess, free_port

FAST = ("node_timeout=3", "interest_grace=1", "takeover_timeout=3")
"""Quicker failure detection than the defaults, so fault tests stay short."""


class ClusterLauncher:
    """Starts nodes of one cluster through `bridge_factory` (which kills them after the test)."""

    def __init__(
        self,
        bridge_factory: Callable[..., BridgeProcess],
        namesrv: str,
        redis_settings: tuple[str, ...],
    ) -> None:
        self.bridge_factory = bridge_factory
        self.name = f"t{uuid.uuid4().hex[:8]}"
        self.secret = secrets.token_hex(32)
        """The cluster secret every node of this launcher proves on its peer links."""
        self.namesrv = namesrv
        self.redis_settings = redis_settings
        self.nodes: dict[str, BridgeProcess] = {}
        self.peer_ports: dict[str, int] = {}
        self.notifiers: list[NotifyProcess] = []

    def settings(self, node_id: str, *extra: str, peer_port: int = 0) -> list[str]:
        return [
            "store=rocketmq",
            f"rocketmq_namesrv={self.namesrv}",
            f"rocketmq_namespace={self.name}",
            f"cluster_name={self.name}",
            f"node_id={node_id}",
            f"peer_listen=127.0.0.1:{peer_port}",
            f"cluster_secret={self.secret}",
            *self.redis_settings,
            *FAST,
            *extra,
        ]

    def start(self, node_id: str, *extra: str, port: int | None = None, **kw: Any) -> BridgeProcess:
        """Start node `node_id` (ids sort in dial order: the smaller one dials)."""
        peer_port = self.peer_ports.setdefault(node_id, free_port())
        node = self.bridge_factory(
            *self.settings(node_id, *extra, peer_port=peer_port), port=port, **kw
        )
        self.nodes[node_id] = node
        return node

    def start_notify(self, node_id: str, work_dir: Path, *extra: str) -> NotifyProcess:
        """Start `python -m notify` as member `node_id` of this cluster (`stop_all` kills it)."""
        settings = [s for s in self.settings(node_id, *extra) if not s.startswith("node_id=")]
        notifier = NotifyProcess(work_dir, node_id, settings).start()
        self.notifiers.append(notifier)
        return notifier

    def stop_all(self) -> None:
        """Kill what this launcher started beyond bridge nodes (bridge_factory kills those)."""
        for notifier in self.notifiers:
            notifier.kill()

    def wait_linked(self, timeout: float = 20.0) -> None:
        """Until every running node logged a link to every other running node."""
        running = {n: p for n, p in self.nodes.items() if p.proc and p.proc.poll() is None}
        for node_id, node in running.items():
            for other in running:
                if other != node_id:
                    node.wait_for_log(f"peer link to {other} up", timeout)


def wait_for_route(
    publish: Callable[[str], None], subscriber: PahoClient, timeout: float = 15.0
) -> None:
    """Publish QoS 0 probes (through `publish(payload)`) until `subscriber` receives one: the
    subscription has reached the publishing node. Probes received are consumed."""
    deadline = time.monotonic() + timeout
    token = uuid.uuid4().hex
    while time.monotonic() < deadline:
        publish(f"probe-{token}")
        try:
            msg = subscriber.get(timeout=0.2)
        except Exception:
            continue
        if msg.payload.decode().startswith("probe-"):
            # Later probes may still arrive: let them, then drop them.
            time.sleep(0.3)
            while not subscriber.messages.empty():
                subscriber.messages.get_nowait()
            return
    raise AssertionError(f"no probe reached the subscriber in {timeout} s")


class NotifyProcess:
    """`python -m notify` with its log file; killed by PID."""

    def __init__(self, work_dir: Path, node_id: str, settings: list[str]) -> None:
        self.work_dir = work_dir
        self.node_id = node_id
        self.settings = settings
        self.log_path = work_dir / f"notify-{node_id}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> NotifyProcess:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        args = [sys.executable, "-m", "notify", "--data-dir", str(self.work_dir / self.node_id)]
        args += ["--node-id", self.node_id, "--log-level", "debug"]
        for setting in self.settings:
            args += ["--set", setting]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_for_log(self, needle: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.log_text():
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"notify exited:\n{self.log_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{needle!r} not in notify log:\n{self.log_text()[-3000:]}")
            time.sleep(0.05)
