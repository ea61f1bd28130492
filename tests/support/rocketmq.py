"""A real RocketMQ (NameServer + one broker) for tests, driven by the deploy/rocketmq scripts.

    mq = LocalRocketMQ(tmp_path / "rocketmq").start()   # free loopback ports unless given
    mq.create_topic("factory")
    mq.admin("sendMessage", "-t", "factory", "-p", "hello")
    mq.kill_broker(); mq.start_broker()                  # fault tests: kill -9, restart
    mq.stop()

`rocketmq_for_tests(data_dir)` is a context manager for a session fixture: it uses the external
NameServer in $ROCKETMQ_NAMESRV ("host:port") when set, else starts a LocalRocketMQ and always
stops it. Start-up fetches the jars once (Maven, ~90 MB, cached under ~/.cache/mqtt-bridge).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import random
import socket
import subprocess
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "rocketmq"
CLUSTER = "DefaultCluster"


def _load_probe():  # type: ignore[no-untyped-def]
    """deploy/rocketmq/probe.py (stdlib remoting client), which is not a package module."""
    spec = importlib.util.spec_from_file_location("rocketmq_probe", DEPLOY / "probe.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


probe = _load_probe()


def _can_bind(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_block(offsets: tuple[int, ...] = (0,)) -> int:
    """A port P such that P+offset is free on 127.0.0.1 for every offset.

    Chosen below Linux's ephemeral range (32768+) so client connections do not take it later.
    """
    rng = random.Random(os.getpid() ^ int.from_bytes(os.urandom(4), "big"))
    for _ in range(500):
        port = rng.randrange(20000, 32000)
        if all(_can_bind(port + off) for off in offsets):
            return port
    raise RuntimeError(f"no free port block {offsets} found on 127.0.0.1")


class LocalRocketMQ:
    """NameServer + broker on 127.0.0.1 with everything (store, logs, PIDs) under data_dir."""

    def __init__(
        self,
        data_dir: Path | str,
        namesrv_port: int | None = None,
        broker_port: int | None = None,
        *,
        flush_disk_type: str = "SYNC_FLUSH",
        start_timeout: float = 90.0,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.namesrv_port = namesrv_port or free_port_block()
        # The broker binds listenPort-2 (fast channel), listenPort and listenPort+1 (HA).
        self.broker_port = broker_port or free_port_block((-2, 0, 1))
        self.flush_disk_type = flush_disk_type
        self.start_timeout = start_timeout
        self._started = False
        # Never leave JVMs behind, even when a test run is interrupted (runs at exit too).
        self._finalizer = weakref.finalize(self, _kill_quietly, self.data_dir, self._env())

    # -- addresses -------------------------------------------------------------------------
    @property
    def namesrv_addr(self) -> str:
        return f"127.0.0.1:{self.namesrv_port}"

    @property
    def broker_addr(self) -> str:
        return f"127.0.0.1:{self.broker_port}"

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "logs"

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> LocalRocketMQ:
        """Start NameServer and broker; return when the broker is registered."""
        self._started = True
        try:
            self._script("start.sh", timeout=self.start_timeout * 2 + 600)  # + first download
        except RuntimeError:
            self.stop(graceful=False)
            raise
        return self

    def stop(self, graceful: bool = True) -> None:
        """Stop both processes (graceful: SIGTERM, ~20 s for the broker; else SIGKILL)."""
        self._script("stop.sh", *([] if graceful else ["--kill"]), timeout=120)
        self._started = False

    def kill_broker(self) -> None:
        """SIGKILL the broker and wait until it is gone."""
        self._script("kill-broker.sh", timeout=60)

    def start_broker(self) -> None:
        """Start the broker alone (after kill_broker); return when it is registered again."""
        try:
            self._script("start-broker.sh", timeout=self.start_timeout + 60)
        except RuntimeError:
            self._script("kill-broker.sh", timeout=60, check=False)
            raise

    def __enter__(self) -> LocalRocketMQ:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(graceful=False)

    # -- inspection ------------------------------------------------------------------------
    def pid(self, role: str) -> int | None:
        """PID of 'namesrv' or 'broker' if that JVM is running."""
        try:
            pid = int((self.data_dir / f"{role}.pid").read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        return pid if b"org.apache.rocketmq." in cmdline else None

    def rss_mib(self, role: str) -> float | None:
        pid = self.pid(role)
        if pid is None:
            return None
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return None

    def registered_brokers(self) -> list[str]:
        """Broker addresses the NameServer lists (one request, no JVM)."""
        return probe.brokers(self.namesrv_addr)

    def log_tail(self, lines: int = 40) -> str:
        parts = []
        for name in ("namesrv.out", "namesrv.log", "broker.out", "broker.log"):
            path = self.log_dir / name
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"----- {path} -----\n" + "\n".join(text))
        return "\n".join(parts)

    # -- admin tool ------------------------------------------------------------------------
    def admin(self, *args: str, timeout: float = 120) -> str:
        """Run mqadmin (deploy/rocketmq/admin.sh) against this NameServer; return its output."""
        return self._script("admin.sh", *args, timeout=timeout)

    def create_topic(self, name: str, queues: int = 4) -> None:
        out = self.admin(
            "updateTopic", "-t", name, "-c", CLUSTER, "-r", str(queues), "-w", str(queues)
        )
        if "success" not in out:
            raise RuntimeError(f"creating topic {name!r} failed:\n{out}")

    # -- internals -------------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        for key in [k for k in env if k.startswith("ROCKETMQ_")]:
            if key not in ("ROCKETMQ_CACHE_DIR", "ROCKETMQ_VERSION", "ROCKETMQ_JAVA_OPTS"):
                del env[key]
        env.update(
            ROCKETMQ_DATA_DIR=str(self.data_dir),
            ROCKETMQ_NAMESRV_PORT=str(self.namesrv_port),
            ROCKETMQ_BROKER_PORT=str(self.broker_port),
            ROCKETMQ_FLUSH_DISK_TYPE=self.flush_disk_type,
            ROCKETMQ_START_TIMEOUT=str(int(self.start_timeout)),
            PYTHON=sys.executable,
        )
        return env

    def _script(self, name: str, *args: str, timeout: float, check: bool = True) -> str:
        try:
            proc = subprocess.run(
                [str(DEPLOY / name), *args],
                env=self._env(),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as exc:
            if not check:
                return ""
            raise RuntimeError(
                f"{name} {' '.join(args)} timed out after {timeout} s\n{self.log_tail()}"
            ) from exc
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"{name} {' '.join(args)} failed (exit {proc.returncode}):\n"
                f"{proc.stdout}{proc.stderr}\n{self.log_tail()}"
            )
        return proc.stdout


def _kill_quietly(data_dir: Path, env: dict[str, str]) -> None:
    if (data_dir / "namesrv.pid").exists() or (data_dir / "broker.pid").exists():
        subprocess.run(
            [str(DEPLOY / "stop.sh"), "--kill"], env=env, capture_output=True, check=False
        )


class ExternalRocketMQ:
    """A RocketMQ someone else runs (ROCKETMQ_NAMESRV=host:port): no start/stop/kill."""

    def __init__(self, namesrv_addr: str, data_dir: Path | str) -> None:
        self._namesrv_addr = namesrv_addr
        self.data_dir = Path(data_dir).resolve()

    @property
    def namesrv_addr(self) -> str:
        return self._namesrv_addr

    @property
    def broker_addr(self) -> str:
        brokers = probe.brokers(self._namesrv_addr)
        if not brokers:
            raise RuntimeError(f"no broker registered at {self._namesrv_addr}")
        return brokers[0]

    def start(self) -> ExternalRocketMQ:
        self.registered_brokers()  # fail early when unreachable
        return self

    def stop(self, graceful: bool = True) -> None:
        pass

    def kill_broker(self) -> None:
        raise RuntimeError("cannot kill the broker of an external RocketMQ (ROCKETMQ_NAMESRV)")

    def start_broker(self) -> None:
        raise RuntimeError("cannot start the broker of an external RocketMQ (ROCKETMQ_NAMESRV)")

    def registered_brokers(self) -> list[str]:
        return probe.brokers(self._namesrv_addr)

    def admin(self, *args: str, timeout: float = 120) -> str:
        env = dict(os.environ, ROCKETMQ_DATA_DIR=str(self.data_dir))
        env["ROCKETMQ_NAMESRV_ADDR"] = self._namesrv_addr
        proc = subprocess.run(
            [str(DEPLOY / "admin.sh"), *args],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"admin.sh {' '.join(args)} failed:\n{proc.stdout}{proc.stderr}")
        return proc.stdout

    def create_topic(self, name: str, queues: int = 4) -> None:
        out = self.admin(
            "updateTopic", "-t", name, "-c", CLUSTER, "-r", str(queues), "-w", str(queues)
        )
        if "success" not in out:
            raise RuntimeError(f"creating topic {name!r} failed:\n{out}")


@contextlib.contextmanager
def rocketmq_for_tests(data_dir: Path | str) -> Iterator[LocalRocketMQ | ExternalRocketMQ]:
    """The RocketMQ tests talk to: $ROCKETMQ_NAMESRV if set, else a local one (stopped after).

    For a session fixture:
        @pytest.fixture(scope="session")
        def rocketmq(tmp_path_factory):
            with rocketmq_for_tests(tmp_path_factory.mktemp("rocketmq")) as mq:
                yield mq
    """
    external = os.environ.get("ROCKETMQ_NAMESRV")
    if external:
        yield ExternalRocketMQ(external, data_dir).start()
        return
    mq = LocalRocketMQ(data_dir)
    mq.start()
    try:
        yield mq
    finally:
        mq.stop(graceful=False)
