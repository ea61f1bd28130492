"""A real RocketMQ (NameServer + brokers) for tests, driven by the deploy/rocketmq scripts.

    mq = LocalRocketMQ(tmp_path / "rocketmq").start()   # free loopback ports unless given
    mq.create_topic("factory")
    mq.admin("sendMessage", "-t", "factory", "-p", "hello")
    mq.kill_broker(); mq.start_broker()                  # fault tests: kill -9, restart
    mq.stop()

Several broker groups, each with a slave (deploy/rocketmq's RMQ_GROUPS / RMQ_SLAVES):

    mq = LocalRocketMQ(tmp_path / "rocketmq", groups=2, slaves=1).start()
    mq.broker_addrs()                 # {("broker-a", 0): "127.0.0.1:P", ("broker-a", 1): ...}
    mq.kill_broker("broker-b", 1); mq.start_broker("broker-b", 1)
    mq.add_group("broker-c")          # one more group on the running NameServer
    mq.set_write_permission("broker-a", False)   # brokerPermission 4: read only

On another address, e.g. inside a network namespace (`ip netns add`, root only) that other
namespaces reach over a veth: every script runs there (`ip netns exec`), so the JVMs do too,
and every address this object gives out is `host`'s:

    mq = LocalRocketMQ(tmp_path / "rocketmq", host="10.213.0.11", netns="mq").start()

A secured instance (deploy/rocketmq's ROCKETMQ_ACL / ROCKETMQ_TLS): brokers that authenticate
every request, NameServer and brokers that speak TLS only; `credentials` and `tls_options` are
what a client needs to talk to it:

    mq = LocalRocketMQ(tmp_path / "rocketmq", acl=True, tls=True, tls_client_auth=True).start()
    RocketMQClient(mq.namesrv_addr, ..., credentials=mq.credentials, tls=mq.tls_options)

`ExternalRocketMQ` stands for a NameServer the tests did not start ($ROCKETMQ_NAMESRV). Which
instance a test gets, the nodes it starts on one and the messages it sends with mqadmin are
`tests.support.rocketmq_use`'s. Start-up fetches the jars once (Maven, ~90 MB, cached under
~/.cache/mqtt-bridge).
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import subprocess
import sys
import weakref
from pathlib import Path

from bridge.storage.rocketmq import Credentials, TlsOptions
from tests.support.ports import can_bind, free_port_block
from tests.support.scripts import in_netns

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "rocketmq"
CLUSTER = "DefaultCluster"
GROUP_PORT_STEP = 20
"""Group i's master listens on broker_port + 20*i (deploy/rocketmq/env.sh) ..."""
SLAVE_PORT_OFFSET = 10
"""... and its slave 10 above its master."""
BROKER_PORT_OFFSETS = (-2, 0, 1)
"""A broker binds listenPort-2 (fast channel), listenPort and listenPort+1 (HA)."""
SHARED_ENV = "TESTS_SHARED_ROCKETMQ"
"""Set by a pytest-xdist controller that started one RocketMQ for all its workers."""
PERM_READ_WRITE = 6
PERM_READ = 4


def group_name(index: int) -> str:
    """The brokerName of group `index` (0-based), as deploy/rocketmq names it: broker-a, ..."""
    if not 0 <= index < 26:
        raise ValueError(f"group index {index} out of 0..25")
    return f"broker-{chr(ord('a') + index)}"


def group_index(name: str) -> int:
    """The index of group `name` (broker-a -> 0, broker-b -> 1, ...)."""
    prefix, _, letter = name.rpartition("-")
    if prefix != "broker" or len(letter) != 1 or not "a" <= letter <= "z":
        raise ValueError(f"not a broker group name (broker-a ... broker-z): {name!r}")
    return ord(letter) - ord("a")


def broker_role(group: str, broker_id: int) -> str:
    """The name deploy/rocketmq gives that broker's files ({role}.pid, logs/{role}.out, ...)."""
    return "broker" if (group_index(group), broker_id) == (0, 0) else f"{group}-{broker_id}"


def _load_probe():  # type: ignore[no-untyped-def]
    """deploy/rocketmq/probe.py (stdlib remoting client), which is not a package module."""
    spec = importlib.util.spec_from_file_location("rocketmq_probe", DEPLOY / "probe.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


probe = _load_probe()


class LocalRocketMQ:
    """NameServer + broker on `host` (127.0.0.1 unless given) with everything (store, logs,
    PIDs) under data_dir."""

    def __init__(
        self,
        data_dir: Path | str,
        namesrv_port: int | None = None,
        broker_port: int | None = None,
        *,
        flush_disk_type: str = "SYNC_FLUSH",
        start_timeout: float = 90.0,
        groups: int = 1,
        slaves: int = 0,
        spare_groups: int = 0,
        acl: bool = False,
        tls: bool = False,
        tls_client_auth: bool = False,
        timer: bool = True,
        host: str = "127.0.0.1",
        netns: str | None = None,
    ) -> None:
        """`groups` broker groups (broker-a, broker-b, ...), each a master and with `slaves=1`
        a slave. The free ports looked for cover them and `spare_groups` more, for add_group().
        `acl`: brokers authenticate (one super user, `credentials`); `tls`: TLS only, with a
        throw-away CA (`tls_options`); `tls_client_auth`: the servers also require a client
        certificate (`tls_options` has one). `timer=False`: the brokers' timer wheel is off
        (deploy/rocketmq's ROCKETMQ_TIMER=0): an instance no delayed publish uses takes half
        the CPU while idle, which the other tests on two cores get instead. `host`: the
        address the servers bind to and register (deploy/rocketmq's ROCKETMQ_HOST); `netns`:
        the network namespace the scripts, and so the JVMs, run in (it must hold `host`). Free
        ports are looked for on this machine's loopback either way."""
        if not 1 <= groups <= 26 or slaves not in (0, 1) or spare_groups < 0:
            raise ValueError(f"groups must be 1..26 and slaves 0 or 1, not {groups}, {slaves}")
        self.data_dir = Path(data_dir).resolve()
        self.groups = groups
        self.slaves = slaves
        self.spare_groups = spare_groups
        self.broker_port = broker_port or free_port_block(self._port_offsets(groups + spare_groups))
        taken = {self.broker_port + off for off in self._port_offsets(groups + spare_groups)}
        self.namesrv_port = namesrv_port or next(
            port for port in iter(free_port_block, None) if port not in taken
        )
        self.flush_disk_type = flush_disk_type
        self.start_timeout = start_timeout
        self.acl = acl
        self.acl_user = "rocketmq"
        self.acl_password = secrets.token_urlsafe(18) if acl else ""
        self.tls = tls
        self.tls_client_auth = tls and tls_client_auth
        self.timer = timer
        self.host = host
        self.netns = netns
        self._added: list[str] = []
        self._started = False
        # Never leave JVMs behind, even when a test run is interrupted (runs at exit too).
        self._finalizer = weakref.finalize(self, _kill_quietly, self.data_dir, self._env())

    @classmethod
    def shared(cls, spec: str) -> LocalRocketMQ:
        """The RocketMQ another process of this test run started and will stop (the
        pytest-xdist controller, `SHARED_ENV`): used here, never stopped or killed here."""
        data_dir, namesrv_port, broker_port = spec.rsplit(",", 2)
        mq = cls(data_dir, int(namesrv_port), int(broker_port))
        mq._finalizer.detach()
        mq._started = True
        return mq

    def shared_spec(self) -> str:
        """What `shared` needs to use this RocketMQ from another process."""
        return f"{self.data_dir},{self.namesrv_port},{self.broker_port}"

    # -- addresses -------------------------------------------------------------------------
    @property
    def namesrv_addr(self) -> str:
        return f"{self.host}:{self.namesrv_port}"

    @property
    def broker_addr(self) -> str:
        """Group 0's master."""
        return f"{self.host}:{self.broker_port}"

    def group_names(self) -> list[str]:
        """The groups started by start() and those added since, in that order."""
        return [group_name(i) for i in range(self.groups)] + self._added

    def broker_port_of(self, group: str, broker_id: int = 0) -> int:
        return (
            self.broker_port + GROUP_PORT_STEP * group_index(group) + SLAVE_PORT_OFFSET * broker_id
        )

    def broker_addrs(self) -> dict[tuple[str, int], str]:
        """{(group name, broker id): "host:port"} of every broker this instance runs."""
        return {
            (group, broker_id): f"{self.host}:{self.broker_port_of(group, broker_id)}"
            for group in self.group_names()
            for broker_id in range(self.slaves + 1)
        }

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def tls_cafile(self) -> str:
        """The CA the servers' certificates chain to ("" without TLS)."""
        return str(self.data_dir / "tls" / "ca.pem") if self.tls else ""

    @property
    def tls_client_cert(self) -> tuple[str, str]:
        """(certificate, key) files of a client certificate the servers accept ("" without
        `tls_client_auth`)."""
        if not self.tls_client_auth:
            return "", ""
        return str(self.data_dir / "tls" / "client.pem"), str(self.data_dir / "tls" / "client.key")

    @property
    def credentials(self) -> Credentials | None:
        """The super user's credentials (None without ACL)."""
        return Credentials(self.acl_user, self.acl_password) if self.acl else None

    @property
    def tls_options(self) -> TlsOptions | None:
        """What a client needs to connect over TLS (None without TLS)."""
        if not self.tls:
            return None
        certfile, keyfile = self.tls_client_cert
        return TlsOptions(cafile=self.tls_cafile, certfile=certfile, keyfile=keyfile)

    def bridge_settings(self) -> dict[str, str]:
        """The bridge's rocketmq_* settings (MQTT_BRIDGE_* environment) for this instance."""
        settings = {"MQTT_BRIDGE_ROCKETMQ_NAMESRV": self.namesrv_addr}
        if self.acl:
            settings["MQTT_BRIDGE_ROCKETMQ_ACCESS_KEY"] = self.acl_user
            settings["MQTT_BRIDGE_ROCKETMQ_SECRET_KEY"] = self.acl_password
        if self.tls:
            settings["MQTT_BRIDGE_ROCKETMQ_TLS"] = "true"
            settings["MQTT_BRIDGE_ROCKETMQ_TLS_CAFILE"] = self.tls_cafile
        if self.tls_client_auth:
            certfile, keyfile = self.tls_client_cert
            settings["MQTT_BRIDGE_ROCKETMQ_TLS_CERTFILE"] = certfile
            settings["MQTT_BRIDGE_ROCKETMQ_TLS_KEYFILE"] = keyfile
        return settings

    def node_settings(self, secrets_dir: Path) -> list[str]:
        """`NAME=VALUE` settings that give a bridge node this instance's access (as
        `LocalRedis.bridge_settings`): signing and TLS, the secret key in a 0600 file of
        secrets_dir, never on the command line. The NameServer address is the caller's."""
        settings = []
        for name, value in self.bridge_settings().items():
            setting = name.removeprefix("MQTT_BRIDGE_").lower()
            if setting == "rocketmq_namesrv":
                continue
            if setting == "rocketmq_secret_key":
                secrets_dir.mkdir(parents=True, exist_ok=True)
                path = secrets_dir / "bridge-rocketmq-secret-key"
                path.write_text(value + "\n")
                path.chmod(0o600)
                setting, value = "rocketmq_secret_key_file", str(path)
            settings.append(f"{setting}={value}")
        return settings

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

    def kill_broker(self, group: str = "broker-a", broker_id: int = 0) -> None:
        """SIGKILL one broker (default group 0's master) and wait until it is gone."""
        self._script("kill-broker.sh", group, str(broker_id), timeout=60)

    def start_broker(self, group: str = "broker-a", broker_id: int = 0) -> None:
        """Start one broker alone (after kill_broker); return when it is registered again."""
        args = (group, str(broker_id))
        try:
            self._script("start-broker.sh", *args, timeout=self.start_timeout + 60)
        except RuntimeError:
            self._script("kill-broker.sh", *args, timeout=60, check=False)
            raise

    def add_group(self, name: str) -> None:
        """Start one more broker group `name` (broker-b ... broker-z; master, and slave if
        `slaves`) on the running NameServer; return when all of it is registered."""
        index = group_index(name)
        if name in self.group_names():
            raise ValueError(f"group {name} already belongs to this instance")
        if index >= self.groups + self.spare_groups:
            # Its ports were not looked for: check them now rather than fail in the JVM.
            base = self.broker_port_of(name)
            busy = [base + off for off in self._port_offsets(1) if not can_bind(base + off)]
            if busy:
                raise RuntimeError(f"ports {busy} of group {name} are taken")
        self._added.append(name)
        try:
            self._script("add-group.sh", name, timeout=2 * self.start_timeout + 60)
        except RuntimeError:
            for broker_id in range(self.slaves + 1):
                self._script("kill-broker.sh", name, str(broker_id), timeout=60, check=False)
            raise

    def set_write_permission(self, group: str, writable: bool) -> None:
        """Let a group's master take sends (brokerPermission 6) or not (4, read only): mqadmin
        updateBrokerConfig. The broker re-registers at once, so the NameServer's routes show it
        when this returns. A restarted broker is writable again (its conf is rendered anew)."""
        addr = self.broker_addrs()[(group, 0)]
        perm = PERM_READ_WRITE if writable else PERM_READ
        out = self.admin(
            "updateBrokerConfig", "-b", addr, "-k", "brokerPermission", "-v", str(perm)
        )
        if "success" not in out:
            raise RuntimeError(f"setting brokerPermission={perm} on {addr} failed:\n{out}")

    def __enter__(self) -> LocalRocketMQ:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(graceful=False)

    # -- inspection ------------------------------------------------------------------------
    def pid(self, role: str) -> int | None:
        """PID of that JVM if it is running. Roles: 'namesrv', 'broker' (group 0's master),
        GROUP-ID for the other brokers ('broker-b-0', 'broker-a-1'; see broker_role)."""
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
        return probe.brokers(
            self.namesrv_addr, cafile=self.tls_cafile, client_cert=self.tls_client_cert
        )

    def log_tail(self, lines: int = 40) -> str:
        names = ["namesrv.out", "namesrv.log", "broker.out", "broker.log"]
        for group, broker_id in self.broker_addrs():
            role = broker_role(group, broker_id)
            if role != "broker":
                names += [f"{role}.out", f"{role}/broker.log"]
        parts = []
        for name in names:
            path = self.log_dir / name
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"----- {path} -----\n" + "\n".join(text))
        return "\n".join(parts)

    # -- admin tool ------------------------------------------------------------------------
    def admin(self, *args: str, timeout: float = 120) -> str:
        """Run mqadmin (deploy/rocketmq/admin.sh) against this NameServer; return its output.

        mqadmin waits 3-5 s for each answer, which a broker on a machine busy with other tests
        can miss: a command that asks or sets (not `sendMessage`, which could store twice) is
        run again, up to three times in all, when it failed only for such a timeout."""
        for _ in range(2):
            try:
                return self._script("admin.sh", *args, timeout=timeout)
            except RuntimeError as exc:
                if args[:1] == ("sendMessage",) or "RemotingTimeoutException" not in str(exc):
                    raise
        return self._script("admin.sh", *args, timeout=timeout)

    def create_topic(self, name: str, queues: int = 4) -> None:
        out = self.admin(
            "updateTopic", "-t", name, "-c", CLUSTER, "-r", str(queues), "-w", str(queues)
        )
        if "success" not in out:
            raise RuntimeError(f"creating topic {name!r} failed:\n{out}")

    # -- internals -------------------------------------------------------------------------
    def _port_offsets(self, groups: int) -> tuple[int, ...]:
        """Offsets from broker_port of every port `groups` groups bind."""
        return tuple(
            GROUP_PORT_STEP * group + SLAVE_PORT_OFFSET * broker_id + off
            for group in range(groups)
            for broker_id in range(self.slaves + 1)
            for off in BROKER_PORT_OFFSETS
        )

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        for key in [k for k in env if k.startswith("ROCKETMQ_")]:
            if key not in ("ROCKETMQ_CACHE_DIR", "ROCKETMQ_VERSION", "ROCKETMQ_JAVA_OPTS"):
                del env[key]
        env.update(
            ROCKETMQ_DATA_DIR=str(self.data_dir),
            ROCKETMQ_HOST=self.host,
            ROCKETMQ_NAMESRV_PORT=str(self.namesrv_port),
            ROCKETMQ_BROKER_PORT=str(self.broker_port),
            ROCKETMQ_FLUSH_DISK_TYPE=self.flush_disk_type,
            ROCKETMQ_TIMER="1" if self.timer else "0",
            ROCKETMQ_START_TIMEOUT=str(int(self.start_timeout)),
            RMQ_GROUPS=str(self.groups),
            RMQ_SLAVES=str(self.slaves),
            ROCKETMQ_ACL="1" if self.acl else "0",
            ROCKETMQ_TLS="1" if self.tls else "0",
            ROCKETMQ_TLS_CLIENT_AUTH="1" if self.tls_client_auth else "0",
            PYTHON=sys.executable,
        )
        if self.acl:
            env.update(ROCKETMQ_ACL_USER=self.acl_user, ROCKETMQ_ACL_PASSWORD=self.acl_password)
        return env

    def _script(self, name: str, *args: str, timeout: float, check: bool = True) -> str:
        try:
            proc = subprocess.run(
                in_netns(self.netns, DEPLOY / name, *args),
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
    if any(data_dir.glob("*.pid")):
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

    def kill_broker(self, group: str = "broker-a", broker_id: int = 0) -> None:
        raise RuntimeError("cannot kill the broker of an external RocketMQ (ROCKETMQ_NAMESRV)")

    def start_broker(self, group: str = "broker-a", broker_id: int = 0) -> None:
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
