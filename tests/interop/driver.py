"""The Python side of the driver protocol (tests/interop/README.md): one client library's driver
process, driven by commands, its events collected.

    with Driver.start("go", log_dir) as client:
        client.connect(url, "c1", version=5)
        client.subscribe("a/#", qos=1)
        client.publish("a/b", "hello", qos=1)
        assert client.messages(1)[0]["payload"] == "hello"
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from tests.interop import build

LIBRARIES = ("node", "java", "go", "rust")
"""The drivers, by folder: MQTT.js, Eclipse Paho Java, Eclipse Paho Go, rumqttc."""

COMMAND_TIMEOUT = 10.0
"""Seconds a command may take by default (the driver's own timeout is the same, in ms)."""


class DriverError(AssertionError):
    """A command the driver answered with ok: false (the library refused or failed)."""


class Driver:
    """One driver process. Commands are sent one at a time and wait for their result; events
    (messages, connection lost and back) are queued as they come."""

    def __init__(self, library: str, proc: subprocess.Popen[bytes], stderr_path: Path) -> None:
        self.library = library
        self.proc = proc
        self.stderr_path = stderr_path
        self._next_id = 0
        self._results: queue.Queue[dict[str, Any]] = queue.Queue()
        self._events: list[dict[str, Any]] = []
        self._arrived = threading.Condition()
        self.stray: list[str] = []
        """Lines on stdout that were not JSON objects: a driver bug, reported by `close`."""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @classmethod
    def start(cls, library: str, log_dir: Path, name: str = "") -> Driver:
        """Start the library's built driver (tests/interop/build.py), stderr into log_dir."""
        log_dir.mkdir(parents=True, exist_ok=True)
        stderr_path = log_dir / f"{library}-{name or 'driver'}-{time.monotonic_ns()}.stderr"
        with open(stderr_path, "wb") as stderr:
            proc = subprocess.Popen(
                build.run_command(library),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                start_new_session=True,
            )
        return cls(library, proc, stderr_path)

    def __enter__(self) -> Driver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").strip()
            if not line:
                continue
            try:
                item = json.loads(line)
            except ValueError:
                self.stray.append(line)
                continue
            if not isinstance(item, dict):
                self.stray.append(line)
            elif "event" in item:
                with self._arrived:
                    self._events.append(item)
                    self._arrived.notify_all()
            else:
                self._results.put(item)

    def stderr(self) -> str:
        """What the driver wrote to stderr so far (its diagnostics), the last 4000 characters."""
        try:
            return self.stderr_path.read_text(errors="replace")[-4000:]
        except FileNotFoundError:
            return ""

    def call(
        self, op: str, *, check: bool = True, timeout: float = COMMAND_TIMEOUT, **fields: Any
    ) -> dict[str, Any]:
        """Send one command and wait for its result; `check` raises DriverError on ok: false."""
        self._next_id += 1
        command = {"op": op, "id": self._next_id, "timeout_ms": int(timeout * 1000), **fields}
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(command).encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise AssertionError(f"{self.library} driver exited:\n{self.stderr()}") from None
        # The driver answers after its own timeout at the latest; a little more for the pipe.
        deadline = time.monotonic() + timeout + 5.0
        while True:
            try:
                result = self._results.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"{self.library} driver never answered {command}:\n{self.stderr()}"
                ) from None
            # An answer to an earlier command that timed out on this side is dropped.
            if result.get("id") == self._next_id:
                break
        if check and not result.get("ok"):
            raise DriverError(f"{self.library}: {op} failed: {result.get('error')} ({command})")
        return result

    def connect(
        self, url: str, client_id: str, *, version: int = 4, clean: bool = True, **options: Any
    ) -> dict[str, Any]:
        return self.call(
            "connect", url=url, client_id=client_id, version=version, clean=clean, **options
        )

    def subscribe(self, topic_filter: str, qos: int, **options: Any) -> list[int]:
        return list(self.call("subscribe", filter=topic_filter, qos=qos, **options)["granted"])

    def publish(self, topic: str, payload: str, qos: int, **options: Any) -> dict[str, Any]:
        return self.call("publish", topic=topic, payload=payload, qos=qos, **options)

    def _take(self, kind: str, count: int, timeout: float) -> list[dict[str, Any]]:
        """Remove and return the first `count` events of `kind`, waiting up to `timeout` s."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while True:
                matching = [e for e in self._events if e["event"] == kind]
                if len(matching) >= count:
                    taken = matching[:count]
                    self._events = [e for e in self._events if not any(e is t for t in taken)]
                    return taken
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"{self.library}: {len(matching)} of {count} {kind} events in "
                        f"{timeout} s: {matching}\n{self.stderr()}"
                    )
                self._arrived.wait(remaining)

    def wait_event(self, kind: str, timeout: float = COMMAND_TIMEOUT) -> dict[str, Any]:
        """The first event of `kind` (connection_lost, reconnected), waiting up to `timeout` s."""
        return self._take(kind, 1, timeout)[0]

    def messages(self, count: int, timeout: float = COMMAND_TIMEOUT) -> list[dict[str, Any]]:
        """The next `count` messages, in the order they arrived."""
        return self._take("message", count, timeout)

    def quiet(self, seconds: float) -> list[dict[str, Any]]:
        """The messages that arrive within `seconds` (to show that nothing more comes)."""
        time.sleep(seconds)
        with self._arrived:
            got = [e for e in self._events if e["event"] == "message"]
            self._events = [e for e in self._events if e["event"] != "message"]
        return got

    def close(self) -> None:
        """Ask the driver to exit; kill it by PID if it does not within 5 s."""
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(b'{"op": "exit", "id": 0}\n')
                self.proc.stdin.close()
                self.proc.wait(5)
            except (BrokenPipeError, subprocess.TimeoutExpired, ValueError):
                pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._reader.join(5)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()
        assert not self.stray, f"{self.library} driver wrote non-JSON lines: {self.stray[:5]}"
