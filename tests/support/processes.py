"""Start and stop real server processes for tests: bridge nodes and Mosquitto.

Every process is started in its own process group and killed by PID when the test ends; tests
never leave servers behind.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.support.ports import free_port, free_ports

REPO = Path(__file__).resolve().parents[2]

__all__ = ["free_port", "free_ports"]


def wait_for_port(
    port: int,
    timeout: float = 15.0,
    proc: subprocess.Popen | None = None,
    host: str = "127.0.0.1",
) -> None:
    """Block until host:port accepts a connection, or raise with the reason."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout} s")


def terminate(proc: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
    """SIGTERM and wait for an orderly exit; SIGKILL after `timeout` seconds."""
    if proc is None or proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout)


class BridgeProcess:
    """One `python -m bridge` node on a loopback port, with its data dir and log file.
    `host` and `wrap` put it elsewhere: the address it listens on, and the command its own runs
    under (`ip netns exec NS` for a node in a network namespace of its own)."""

    def __init__(
        self,
        data_dir: Path,
        *settings: str,
        port: int | None = None,
        host: str = "127.0.0.1",
        wrap: Sequence[str] = (),
    ) -> None:
        self.data_dir = data_dir
        self.host = host
        self.wrap = list(wrap)
        self.port = port or free_port()
        self.settings = list(settings)
        self.log_path = data_dir.parent / f"bridge-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> BridgeProcess:
        """Start the node and wait until it accepts connections on its MQTT port and, when one
        is set, on its admin port: the node opens the admin API after its MQTT listeners, so a
        test that reads the API right after connecting would otherwise race the node's start."""
        args = [
            *self.wrap,
            sys.executable,
            "-m",
            "bridge",
            "--listen",
            f"{self.host}:{self.port}",
            "--data-dir",
            str(self.data_dir),
            "--log-level",
            "debug",
        ]
        for setting in self.settings:
            args += ["--set", setting]
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child process
        self.proc = subprocess.Popen(
            args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        wait_for_port(self.port, proc=self.proc, host=self.host)
        for setting in self.settings:
            name, _, value = setting.partition("=")
            if name == "admin_listen" and value.rpartition(":")[2] not in ("", "0"):
                admin_host, _, admin_port = value.rpartition(":")
                wait_for_port(int(admin_port), proc=self.proc, host=admin_host or self.host)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL: the node dies with no chance to flush anything."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM and wait for an orderly shutdown (SIGKILL after 10 s)."""
        terminate(self.proc)

    def log_text(self) -> str:
        """Everything the node has logged so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_for_log(self, needle: str, timeout: float = 5.0) -> str:
        """Wait until the node's log contains `needle`; return the log."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log_text()
            if needle in text:
                return text
            time.sleep(0.05)
        raise AssertionError(f"{needle!r} not in bridge log:\n{self.log_text()[-3000:]}")


class MosquittoProcess:
    """Debian's mosquitto broker on a loopback port with its own config and persistence dir."""

    def __init__(self, work_dir: Path, port: int | None = None) -> None:
        self.work_dir = work_dir
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> MosquittoProcess:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        conf = self.work_dir / "mosquitto.conf"
        conf.write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\n"
            f"persistence true\npersistence_location {self.work_dir}/\n"
            f"log_dest file {self.work_dir}/mosquitto.log\n"
        )
        binary = "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else "mosquitto"
        self.proc = subprocess.Popen(
            [binary, "-c", str(conf)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_for_port(self.port, proc=self.proc)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


@contextmanager
def bridge_nodes(base: Path) -> Iterator[Callable[..., BridgeProcess]]:
    """Start bridge nodes with data under `base` (`start(*settings, data_dir=None, port=None,
    start=True)`); when the block ends all are killed by PID, and any traceback in a node's
    log fails it, whatever the test asserted (an exception that escaped into the event loop, a
    failed background task)."""
    started: list[BridgeProcess] = []

    def start(
        *settings: str, data_dir: Path | None = None, port: int | None = None, start: bool = True
    ) -> BridgeProcess:
        node = BridgeProcess(data_dir or base / f"node{len(started)}", *settings, port=port)
        started.append(node)
        return node.start() if start else node

    try:
        yield start
    finally:
        for node in started:
            node.kill()
    for node in started:
        text = node.log_text()
        assert "Traceback" not in text, (
            f"node on port {node.port} logged a traceback:\n{text[-4000:]}"
        )


def require_loopback_alias(reason: str) -> None:
    """A test that needs 127.0.0.2 as a second source address cannot run: under CI (where every
    Linux loopback answers the whole 127.0.0.0/8) that is a broken machine and fails loudly;
    elsewhere the test is skipped, saying why."""
    import pytest

    if os.environ.get("CI"):
        pytest.fail(f"CI: {reason}", pytrace=False)
    pytest.skip(reason)
