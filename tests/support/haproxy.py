"""A real HAProxy for tests, started by the deploy/haproxy scripts: L4 balancing of MQTT.

    lb = LocalHAProxy(tmp_path / "haproxy", None, ["127.0.0.1:P1", "127.0.0.1:P2"]).start()
    lb.frontend_port                       # clients connect here
    lb.wait_for_status("127.0.0.1:P1", "DOWN")
    lb.reload(["127.0.0.1:P2", "127.0.0.1:P3"])   # new node list, no connection dropped
    lb.stop()

The master process (and every worker, old ones included) is also stopped when the object is
garbage collected or the interpreter exits (weakref.finalize).
"""

from __future__ import annotations

import socket
import subprocess
import time
import weakref
from collections.abc import Sequence
from pathlib import Path

from tests.support.rocketmq import free_port_block
from tests.support.scripts import DEPLOY, log_tail, recorded_pid, run_script, running

SCRIPTS = DEPLOY / "haproxy"
BACKEND = "bridge_nodes"  # the backend section deploy/haproxy writes


class LocalHAProxy:
    """HAProxy on 127.0.0.1:frontend_port (a free port when None) balancing TCP connections
    over backends ("host:port"), with config, PID, runtime socket and log in data_dir."""

    def __init__(
        self,
        data_dir: Path | str,
        frontend_port: int | None,
        backends: Sequence[str],
        *,
        start_timeout: float = 10.0,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.frontend_port = frontend_port or free_port_block()
        self.backends = list(backends)
        self.start_timeout = start_timeout
        self._finalizer = weakref.finalize(self, _stop_quietly, self.data_dir)

    @property
    def pid(self) -> int | None:
        """PID of the master process (it stays across reloads); None when not running."""
        return recorded_pid(self.data_dir / "haproxy.pid", str(self.data_dir / "haproxy.cfg"))

    def processes(self) -> list[int]:
        """PIDs of every process running this balancer's config: master, worker, and workers
        left from reloads that still serve old connections."""
        marker = str(self.data_dir / "haproxy.cfg")
        pids = [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]
        return [pid for pid in pids if running(pid, marker)]

    def start(self) -> LocalHAProxy:
        """Start it; return once the frontend listens."""
        try:
            self._script("start.sh", str(self.frontend_port), *self.backends)
        except RuntimeError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop master and all workers (clients are disconnected)."""
        self._script("stop.sh")

    def reload(self, backends: Sequence[str]) -> None:
        """Balance new connections over `backends` from now on; connections already open stay
        with the worker that has them. Returns once the new worker runs."""
        self._script("reload.sh", *backends)
        self.backends = list(backends)

    def server_status(self) -> dict[str, str]:
        """Health of each node as HAProxy sees it ("UP", "DOWN", ...), keyed "host:port"."""
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(str(self.data_dir / "haproxy.sock"))
            sock.sendall(b"show stat\n")
            with sock.makefile(encoding="utf-8") as stream:
                reply = stream.read()
        header, *rows = reply.lstrip("# ").splitlines()
        columns = header.split(",")
        status = {}
        for row in rows:
            fields = dict(zip(columns, row.split(","), strict=False))
            if fields.get("pxname") == BACKEND and fields["svname"] != "BACKEND":
                status[fields["svname"]] = fields["status"]
        return status

    def wait_for_status(self, backend: str, status: str, timeout: float = 10.0) -> None:
        """Wait until HAProxy's health checks report `status` for `backend`."""
        deadline = time.monotonic() + timeout
        while (seen := self.server_status().get(backend)) != status:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{backend} is {seen}, not {status}, after {timeout} s")
            time.sleep(0.05)

    def log_tail(self, lines: int = 30) -> str:
        return log_tail(self.data_dir / "haproxy.log", lines)

    def __enter__(self) -> LocalHAProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _script(self, name: str, *args: str) -> str:
        return run_script(
            SCRIPTS / name,
            str(self.data_dir),
            *args,
            timeout=self.start_timeout + 300,  # + a first `apt-get install haproxy`
            env={
                "HAPROXY_BIND": "127.0.0.1",
                "HAPROXY_START_TIMEOUT": str(int(self.start_timeout)),
            },
        )


def _stop_quietly(data_dir: Path) -> None:
    if (data_dir / "haproxy.pid").exists():
        subprocess.run(
            [str(SCRIPTS / "stop.sh"), str(data_dir)], capture_output=True, check=False, timeout=60
        )
