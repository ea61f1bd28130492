"""The servers of `python -m spark.demo`: child processes in process groups of their own, free
loopback ports, a RocketMQ run by deploy/rocketmq's scripts, a bridge, and one MQTT publish.

Every failure the demo expects (a port taken, a server that does not come up) is a `DemoError`
with a one-line reason; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Final

from bridge.mqtt import codec
from bridge.mqtt.packets import Connack, ConnackCode, Connect, Disconnect, Puback

REPO: Final = Path(__file__).resolve().parents[1]
ROCKETMQ_SCRIPTS: Final = REPO / "deploy" / "rocketmq"
RMQ_START_TIMEOUT: Final = 180.0
BRIDGE_START_TIMEOUT: Final = 30.0
STOP_TIMEOUT: Final = 20.0
"""Seconds a process group has after SIGTERM before SIGKILL."""
PUBLISH_TIMEOUT: Final = 15.0


_ERROR_LINE: Final = re.compile(r"Error|Exception|error:|ERROR")


class DemoError(Exception):
    """An expected failure (a port taken, a server that does not start); `str` is one line."""


def _group_alive(pgid: int) -> bool:
    """Whether any process of group `pgid` is still running (zombies do not count)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


class Child:
    """A child process in a process group of its own (a terminal's Ctrl-C reaches only the demo,
    which stops its children in order), its output in a log file."""

    def __init__(self, name: str, args: list[str], log_path: Path) -> None:
        self.name = name
        self.args = args
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Child:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.args,
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def exited(self) -> int | None:
        """The exit status once the process has exited, else None."""
        return None if self.proc is None else self.proc.poll()

    def reason(self) -> str:
        """The last line of the log that reads like an error (else its last line), short."""
        lines = self.log_path.read_text(errors="replace").strip().splitlines()[-300:]
        errors = [
            line
            for line in lines
            if _ERROR_LINE.search(line) and not line.startswith(("\t", "  ", "Caused by"))
        ]
        text = (errors or lines or ["(no output)"])[-1].strip()
        text = re.sub(r" \[id = [^\]]*\]", "", text)  # Spark's query and run ids
        return text if len(text) <= 240 else text[:237] + "..."

    def failure(self, what: str) -> DemoError:
        """`what`, with the exit status, the log and the reason found in it."""
        return DemoError(f"{what} (exit {self.exited()}; log {self.log_path}): {self.reason()}")

    def stop(self) -> None:
        """SIGTERM to the process itself (a Spark driver then stops its queries between
        micro-batches, and its JVM and Python workers end with it), SIGKILL to the whole group
        if anything is left after STOP_TIMEOUT. SIGTERM to the group would stop the JVM under
        the driver's feet."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        with contextlib.suppress(ProcessLookupError):
            os.kill(pgid, signal.SIGTERM)
        if self._wait_gone(pgid):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        self._wait_gone(pgid)

    def _wait_gone(self, pgid: int) -> bool:
        deadline = time.monotonic() + STOP_TIMEOUT
        while time.monotonic() < deadline:
            assert self.proc is not None
            self.proc.poll()  # reap the leader, else it stays a member as a zombie
            if not _group_alive(pgid):
                return True
            time.sleep(0.1)
        return False


def can_bind(port: int) -> bool:
    """Whether nothing holds `port` on 127.0.0.1 now."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(taken: set[int], offsets: tuple[int, ...] = (0,)) -> int:
    """A port P with P+offset free on 127.0.0.1 and not in `taken` for every offset; below
    Linux's ephemeral range (32768+), so client connections do not take it in the meantime."""
    rng = random.Random()
    for _ in range(500):
        port = rng.randrange(20000, 32000)
        wanted = {port + off for off in offsets}
        if not wanted & taken and all(can_bind(p) for p in wanted):
            taken |= wanted
            return port
    raise DemoError(f"no free loopback port block {offsets} found")


def start_bridge(port: int, data_dir: Path, namesrv: str, log_path: Path) -> Child:
    """A bridge on 127.0.0.1:`port` storing into the RocketMQ at `namesrv`, once it listens."""
    command = [
        sys.executable, "-m", "bridge",
        "--listen", f"127.0.0.1:{port}",
        "--data-dir", str(data_dir),
        "--set", "store=rocketmq",
        "--set", f"rocketmq_namesrv={namesrv}",
    ]  # fmt: skip
    bridge = Child("the bridge", command, log_path).start()
    wait_for_port(port, bridge, BRIDGE_START_TIMEOUT)
    return bridge


def wait_for_port(port: int, child: Child, timeout: float) -> None:
    """Until `child` listens on 127.0.0.1:`port`; a DemoError if it exits or times out first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child.exited() is not None:
            raise child.failure(f"{child.name} exited before listening on 127.0.0.1:{port}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    raise child.failure(f"{child.name} not listening on 127.0.0.1:{port} after {timeout:.0f} s")


class RocketMQ:
    """NameServer and broker started and stopped by deploy/rocketmq's scripts, all their files
    under `data_dir`."""

    def __init__(self, data_dir: Path, namesrv_port: int, broker_port: int) -> None:
        self.data_dir = data_dir
        self.namesrv_port = namesrv_port
        self.broker_port = broker_port

    @property
    def namesrv(self) -> str:
        return f"127.0.0.1:{self.namesrv_port}"

    def _run(self, script: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ROCKETMQ_")}
        for keep in ("ROCKETMQ_CACHE_DIR", "ROCKETMQ_VERSION", "ROCKETMQ_JAVA_OPTS"):
            if keep in os.environ:
                env[keep] = os.environ[keep]
        env.update(
            ROCKETMQ_DATA_DIR=str(self.data_dir),
            ROCKETMQ_NAMESRV_PORT=str(self.namesrv_port),
            ROCKETMQ_BROKER_PORT=str(self.broker_port),
            ROCKETMQ_START_TIMEOUT=str(int(RMQ_START_TIMEOUT / 2)),
            ROCKETMQ_TIMER="0",  # the demo delays nothing: its broker's timer wheel would idle
            PYTHON=sys.executable,
        )
        return subprocess.run(
            [str(ROCKETMQ_SCRIPTS / script), *args],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def start(self) -> None:
        try:
            done = self._run("start.sh", timeout=RMQ_START_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise DemoError(
                f"RocketMQ did not start within {RMQ_START_TIMEOUT:.0f} s "
                f"(logs in {self.data_dir / 'logs'})"
            ) from None
        if done.returncode != 0:
            lines = (done.stderr + done.stdout).strip().splitlines()
            errors = [line for line in lines if "error" in line.lower()] or lines or ["no output"]
            raise DemoError(f"RocketMQ did not start: {errors[0].strip()}")

    def stop(self) -> None:
        """SIGKILL at once (`stop.sh --kill`): the orderly stop takes the broker ~20 s, and with
        SYNC_FLUSH nothing acknowledged is lost either way."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._run("stop.sh", "--kill", timeout=60)


# --- one MQTT message ---------------------------------------------------------------------------


async def _publish_once(
    port: int, topic: str, payload: bytes, client_id: str, timeout: float
) -> None:
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    decoder = codec.Decoder()

    async def next_packet() -> object:
        while True:
            packets = decoder.packets()
            if packets:
                return packets[0]
            data = await reader.read(4096)
            if not data:
                raise ConnectionError("connection closed by the bridge")
            decoder.feed(data)

    try:
        writer.write(codec.encode(Connect(client_id, clean_session=True)))
        connack = await asyncio.wait_for(next_packet(), timeout)
        if not isinstance(connack, Connack) or connack.return_code != ConnackCode.ACCEPTED:
            raise ConnectionError(f"refused: {connack}")
        writer.write(codec.encode_publish(topic, payload, 1, False, False, 1))
        puback = await asyncio.wait_for(next_packet(), timeout)
        if not isinstance(puback, Puback):
            raise ConnectionError(f"expected PUBACK, got {puback}")
        writer.write(codec.encode(Disconnect()))
        await writer.drain()
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def publish_once(port: int, topic: str, payload: bytes, client_id: str) -> None:
    """Publish one QoS 1 message to the broker on 127.0.0.1:`port` and return once it is
    acknowledged (for a bridge: stored). MQTT 3.1.1 through our own codec, as the simulator."""
    try:
        asyncio.run(_publish_once(port, topic, payload, client_id, PUBLISH_TIMEOUT))
    except (OSError, TimeoutError) as exc:
        reason = str(exc) or type(exc).__name__
        raise DemoError(f"could not publish to 127.0.0.1:{port}: {reason}") from None
