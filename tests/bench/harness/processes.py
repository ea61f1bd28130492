"""Server processes the benches start: each in a session of its own (so its process group is
its PID), its output in a log file, waited for until it accepts connections and stopped by its
process group, never by name. Also how Mosquitto and our bridge are configured and started."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.bench.harness.common import HOST, MOSQUITTO_BIN, REPO, copy_logs, tail, venv_python
from tests.bench.harness.procfs import session_pids

PORT_WAIT_S = 15.0
MOSQUITTO_INTERNAL_LOG = "mosquitto-internal.log"


def signal_group(pgid: int, sig: int) -> None:
    """Send `sig` to a process group this script created; a group already gone is fine."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def kill_session(sid: int) -> None:
    """SIGKILL every process left in a session this script started, by PID."""
    for pid in session_pids(sid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


@dataclass
class Broker:
    """One server process (a broker, a cluster node) on HOST:port: its command, work dir and
    log file, and the process once started. `extra` carries what the results record about it
    (its config, further logs)."""

    name: str
    cmd: list[str]
    workdir: Path
    log_path: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None
    log_file: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def start(self) -> None:
        self.log_file = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.cmd,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout: float = PORT_WAIT_S) -> None:
        """Until the port accepts a connection; raise with the log tail if the process exits
        first or the port stays closed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                rc = self.proc.returncode if self.proc else None
                raise RuntimeError(
                    f"{self.name} exited with code {rc} before accepting connections; "
                    f"log tail:\n{tail(self.log_path)}"
                )
            with (
                contextlib.suppress(OSError),
                socket.create_connection((HOST, self.port), timeout=0.5),
            ):
                return
            time.sleep(0.1)
        raise RuntimeError(
            f"{self.name} did not accept connections on {HOST}:{self.port} within "
            f"{timeout:.0f} s; log tail:\n{tail(self.log_path)}"
        )

    def terminate(self) -> None:
        """SIGTERM to its process group, without waiting (to stop several at once)."""
        if self.alive() and self.proc is not None:
            signal_group(self.proc.pid, signal.SIGTERM)

    def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL after 5 s; closes the log."""
        p = self.proc
        if p is not None and p.poll() is None:
            # The broker runs in its own session, so its pgid is its pid:
            # signal only the group we created.
            signal_group(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                signal_group(p.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=5)
        elif p is not None:
            # Leader gone; make sure no child of it lingers in the group.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
        if self.log_file is not None:
            self.log_file.close()
            self.log_file = None

    def logs(self) -> dict[str, Path]:
        """Its logs worth keeping, by file name: its output, Mosquitto's own log, and any
        `more_logs` (e.g. RocketMQ's)."""
        out = {self.log_path.name: self.log_path}
        if self.extra.get("internal_log"):
            internal = Path(self.extra["internal_log"])
            out[internal.name] = internal
        out.update(self.extra.get("more_logs", {}))
        return out


@contextlib.contextmanager
def stopped_at_exit(b: Broker, tmp: Path, results_dir: Path, prefix: str) -> Iterator[Broker]:
    """When the block ends, however it ends: stop `b`, copy its logs to results_dir (named
    prefix + file name) for post-mortems and delete its temp dir."""
    try:
        yield b
    finally:
        try:
            b.stop()
        finally:
            copy_logs(b.logs(), results_dir, prefix)
            shutil.rmtree(tmp, ignore_errors=True)


def mosquitto_broker(tmp: Path, port: int, settings: list[str]) -> Broker:
    """Mosquitto on HOST:port with the config lines `settings` after its listener line; its own
    log is `tmp/MOSQUITTO_INTERNAL_LOG` (for a `log_dest file` line), its output mosquitto.log."""
    lines = [f"listener {port} {HOST}", *settings]
    if os.geteuid() == 0:
        # As root Mosquitto drops to the "mosquitto" user, which cannot write
        # to our temp dir; stay as the invoking user instead.
        lines.append("user root")
    conf = tmp / "mosquitto.conf"
    conf.write_text("\n".join(lines) + "\n")
    b = Broker("mosquitto", [MOSQUITTO_BIN, "-c", str(conf)], tmp, tmp / "mosquitto.log", port)
    b.extra["config"] = conf.read_text()
    b.extra["internal_log"] = tmp / MOSQUITTO_INTERNAL_LOG
    return b


def stock_mosquitto(tmp: Path, port: int, nodelay: bool = False) -> Broker:
    """Mosquitto as the throughput and latency comparisons run it: stock defaults plus
    persistence (see tests/bench/README.md, "Brokers as started")."""
    data = tmp / "data"
    data.mkdir(parents=True, exist_ok=True)
    settings = [
        "allow_anonymous true",
        "persistence true",
        f"persistence_location {data}/",
        f"log_dest file {tmp / MOSQUITTO_INTERNAL_LOG}",
        "log_type error",
        "log_type warning",
        "log_type notice",
        # Defaults kept on purpose (documented in README): autosave_interval
        # 1800, max_inflight_messages 20, max_queued_messages 1000 and
        # set_tcp_nodelay false (Nagle on, unlike asyncio's sockets).
    ]
    if nodelay:
        settings.append("set_tcp_nodelay true")
    return mosquitto_broker(tmp, port, settings)


OURS_CMD = "{python} -m bridge --listen {host}:{port} --data-dir {data_dir} --log-level warning"


def add_ours_cmd_option(ap: argparse.ArgumentParser) -> None:
    """--ours-cmd: the command template our broker is started with (see ours_command)."""
    ap.add_argument(
        "--ours-cmd",
        default=OURS_CMD,
        help="command to start our broker; placeholders {python} {host} {port} "
        "{data_dir} {repo} (default: %(default)s)",
    )


def ours_command(template: str, tmp: Path, port: int) -> list[str]:
    """Our broker's command line from a template with the placeholders {python} (the repo's
    .venv Python), {host}, {port}, {data_dir} (tmp/data, created here) and {repo}."""
    data = tmp / "data"
    data.mkdir(parents=True, exist_ok=True)
    cmd_s = template.format(
        python=shlex.quote(venv_python()),
        host=HOST,
        port=port,
        data_dir=shlex.quote(str(data)),
        repo=shlex.quote(str(REPO)),
    )
    return shlex.split(cmd_s)


def ours_broker(tmp: Path, port: int, template: str, name: str = "ours") -> Broker:
    """Our broker from a command template (see ours_command), logging to tmp/<name>.log."""
    return Broker(name, ours_command(template, tmp, port), tmp, tmp / f"{name}.log", port)
