"""Real Redis for tests, started by the deploy/redis scripts: one server, or a Sentinel group.

    with LocalRedis(tmp_path / "redis") as server:      # a free loopback port unless given
        with server.client() as r:
            r.set("k", "v")
        server.kill()                                   # SIGKILL by PID
        server.restart()                                # same port and data dir: AOF reloaded

    group = LocalSentinelRedis(tmp_path / "sentinel").start()
    group.sentinels                                     # ["127.0.0.1:P", ...] for clients
    group.failover()                                    # returns the new master's "host:port"
    group.stop()

On another address, e.g. inside a network namespace (`ip netns add`, root only) that other
namespaces reach over a veth: `LocalRedis(dir, host="10.213.0.11", netns="db")`, the same for
LocalSentinel and LocalSentinelRedis. Every script runs there (`ip netns exec`), so the server
does too, and every address the object gives out is `host`'s.

Access: `LocalRedis(dir, auth=RedisAuth(password="pw"))` starts it with `requirepass`;
`RedisAuth(password=..., username="app", user_rules="~mqtt:* ...")` with an ACL user (the default
user off); `RedisAuth(tls=make_tls_files(dir))` TLS-only; `RedisAuth(sentinel_password=...)` gives
a Sentinel group's Sentinels their own password. `client()` logs in with them, `url` carries
the password in its user part, `bridge_settings()` gives a node the same as `redis_*` settings.

Every process is also killed by PID when its object is garbage collected or the interpreter
exits (weakref.finalize), so an interrupted or failing test leaves no server behind.
"""

from __future__ import annotations

import asyncio
import gc
import subprocess
import time
import traceback
import warnings
import weakref
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, Self, TypeVar
from urllib.parse import quote

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.support.redis_auth import NO_AUTH, RedisAuth
from tests.support.rocketmq import free_port_block
from tests.support.scripts import DEPLOY, log_tail, recorded_pid, run_script
from tests.support.waiting import wait_until

SCRIPTS = DEPLOY / "redis"
# Time a start script may take beyond its own start-up timeout: installing the Debian packages
# on a machine that lacks them (`make test-deps` does that up front).
INSTALL_ALLOWANCE = 300.0
# Written by LocalSentinelRedis to prove that a new master accepts writes.
WRITE_PROBE_KEY = "local-sentinel-redis:write-probe"

T = TypeVar("T")


def connect(addr: str, **kwargs: Any) -> redis.Redis:
    """A redis-py client for "host:port" that gives up at once instead of retrying with backoff
    (the right thing for polling). Strings are decoded unless decode_responses=False."""
    host, _, port = addr.rpartition(":")
    options: dict[str, Any] = {
        "socket_timeout": 2,
        "socket_connect_timeout": 2,
        "retry": Retry(NoBackoff(), 0),
        "decode_responses": True,
    }
    return redis.Redis(host=host, port=int(port), **(options | kwargs))


class _RedisProcess:
    """A redis-server or redis-sentinel whose data dir and PID deploy/redis's scripts manage."""

    start_script: str

    def __init__(
        self,
        data_dir: Path | str,
        port: int | None,
        start_timeout: float,
        auth: RedisAuth,
        host: str,
        netns: str | None,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port = port or free_port_block()
        self.start_timeout = start_timeout
        self.auth = auth
        self.host = host
        self.netns = netns
        # kill.sh works by PID, from any namespace.
        self._finalizer = weakref.finalize(self, _kill_quietly, self.data_dir)

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """PID of the running process; None when it is not running."""
        return recorded_pid(self.data_dir / "redis.pid", "redis")

    def start(self) -> Self:
        """Start it; return once it answers PING (a server: with its AOF loaded)."""
        try:
            self._script(
                self.start_script,
                *self._start_args(),
                timeout=self.start_timeout + INSTALL_ALLOWANCE,
            )
        except RuntimeError:
            self.kill()
            raise
        return self

    def stop(self) -> None:
        """SIGTERM and wait until it is gone (a server writes out its AOF first)."""
        self._script("stop.sh", str(self.data_dir), timeout=60)

    def status(self) -> str:
        """What deploy/redis/status.sh prints for it, logged in with `auth` (it raises
        RuntimeError when the process is not running or not answering)."""
        return self._script("status.sh", str(self.data_dir), timeout=30)

    def kill(self) -> None:
        """SIGKILL by PID, a crash: no shutdown, no final fsync. Waits until it is gone."""
        self._script("kill.sh", str(self.data_dir), timeout=60)

    def client(self, **kwargs: Any) -> redis.Redis:
        """A redis-py client for this process (see connect), logged in with `auth`; close it,
        e.g. with `with`."""
        return connect(self.addr, **(self._login() | kwargs))

    def _login(self) -> dict[str, Any]:
        return self.auth.server_options()

    def log_tail(self, lines: int = 30) -> str:
        return log_tail(self.data_dir / "redis.log", lines)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _start_args(self) -> list[str]:
        raise NotImplementedError

    def _env(self) -> dict[str, str]:
        return {
            "REDIS_HOST": self.host,
            "REDIS_START_TIMEOUT": str(int(self.start_timeout)),
        } | self.auth.script_env(self.data_dir.parent / f"{self.data_dir.name}-secrets")

    def _script(self, name: str, *args: str, timeout: float) -> str:
        return run_script(SCRIPTS / name, *args, timeout=timeout, env=self._env(), netns=self.netns)


def _kill_quietly(data_dir: Path) -> None:
    if (data_dir / "redis.pid").exists():
        subprocess.run(
            [str(SCRIPTS / "kill.sh"), str(data_dir)], capture_output=True, check=False, timeout=60
        )


class LocalRedis(_RedisProcess):
    """One redis-server (deploy/redis/start.sh), its AOF, log and PID in data_dir.

    appendfsync: "everysec" (fsync once a second) or "always" (before every reply).
    replicaof: "host:port" of a master to replicate.
    min_replicas: as a master, refuse writes with fewer replicas connected (REDIS_MIN_REPLICAS).
    host: the address it binds to (REDIS_HOST); netns: the network namespace it runs in, which
    must hold host (None: this process's).
    """

    start_script = "start.sh"

    def __init__(
        self,
        data_dir: Path | str,
        port: int | None = None,
        *,
        replicaof: str | None = None,
        appendfsync: str = "everysec",
        min_replicas: int = 0,
        start_timeout: float = 30.0,
        auth: RedisAuth = NO_AUTH,
        host: str = "127.0.0.1",
        netns: str | None = None,
    ) -> None:
        super().__init__(data_dir, port, start_timeout, auth, host, netns)
        self.replicaof = replicaof
        self.appendfsync = appendfsync
        self.min_replicas = min_replicas

    @property
    def url(self) -> str:
        """`redis://[user:password@]HOST:PORT/0` (`rediss://` with TLS, whose files the
        URL cannot carry: see bridge_settings)."""
        scheme = "rediss" if self.auth.tls is not None else "redis"
        login = ""
        if self.auth.password:
            login = f"{quote(self.auth.username, safe='')}:{quote(self.auth.password, safe='')}@"
        return f"{scheme}://{login}{self.addr}/0"

    @property
    def bare_url(self) -> str:
        """The URL without credentials (they come from settings: bridge_settings)."""
        scheme = "rediss" if self.auth.tls is not None else "redis"
        return f"{scheme}://{self.addr}/0"

    def bridge_settings(self) -> list[str]:
        """`NAME=VALUE` settings for a bridge node using this Redis: its bare URL and the
        access settings (the password in a 0600 file)."""
        secrets = self.data_dir.parent / f"{self.data_dir.name}-secrets"
        return [f"redis_url={self.bare_url}", *self.auth.bridge_settings(secrets)]

    def restart(self) -> Self:
        """Stop it if it runs, then start it again on the same port and data dir, which reloads
        the AOF: what a server kept survives. After kill(), this is the recovery after a crash."""
        self.stop()
        return self.start()

    def _start_args(self) -> list[str]:
        args = [str(self.data_dir), str(self.port)]
        if self.replicaof:
            args += ["--replicaof", self.replicaof]
        return args

    def _env(self) -> dict[str, str]:
        return super()._env() | {
            "REDIS_APPENDFSYNC": self.appendfsync,
            "REDIS_MIN_REPLICAS": str(self.min_replicas),
        }


class LocalSentinel(_RedisProcess):
    """One redis-sentinel (deploy/redis/start-sentinel.sh) watching master_name; host and netns
    as for LocalRedis."""

    start_script = "start-sentinel.sh"

    def __init__(
        self,
        data_dir: Path | str,
        port: int | None,
        master_name: str,
        master_addr: str,
        *,
        quorum: int = 2,
        down_after_ms: int = 2000,
        start_timeout: float = 30.0,
        auth: RedisAuth = NO_AUTH,
        host: str = "127.0.0.1",
        netns: str | None = None,
    ) -> None:
        super().__init__(data_dir, port, start_timeout, auth, host, netns)
        self.master_name = master_name
        self.master_addr = master_addr
        self.quorum = quorum
        self.down_after_ms = down_after_ms

    def _start_args(self) -> list[str]:
        return [
            str(self.data_dir),
            str(self.port),
            self.master_name,
            self.master_addr,
            str(self.quorum),
        ]

    def _env(self) -> dict[str, str]:
        return super()._env() | {"REDIS_SENTINEL_DOWN_AFTER_MS": str(self.down_after_ms)}

    def _login(self) -> dict[str, Any]:
        return self.auth.sentinel_options()


class LocalSentinelRedis:
    """A Sentinel-managed Redis: a master, one replica and three Sentinels with quorum 2, the
    smallest group that survives losing the master or one Sentinel. All of them on `host`
    (default the loopback) and in network namespace `netns` (as for LocalRedis).

    replicas: how many replicas the first master has (2 keep a replica confirming writes
    through a failover: the Sentinels point the other one at the new master at once).
    min_replicas: each server, as a master, refuses writes with fewer replicas connected (set
    it to the bridges' redis_wait_replicas).

    Roles move with failovers: master_addr() asks the Sentinels who leads now and master()
    returns that server. servers[0] is the first master, servers[1:] its replicas.
    """

    def __init__(
        self,
        data_dir: Path | str,
        master_name: str = "mqtt-bridge",
        *,
        down_after_ms: int = 2000,
        replicas: int = 1,
        min_replicas: int = 0,
        start_timeout: float = 30.0,
        auth: RedisAuth = NO_AUTH,
        host: str = "127.0.0.1",
        netns: str | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.master_name = master_name
        self.start_timeout = start_timeout
        self.auth = auth
        base = free_port_block(tuple(range(replicas + 4)))
        first = LocalRedis(
            self.data_dir / "redis-0",
            base,
            min_replicas=min_replicas,
            start_timeout=start_timeout,
            auth=auth,
            host=host,
            netns=netns,
        )
        self.servers = [first] + [
            LocalRedis(
                self.data_dir / f"redis-{i}",
                base + i,
                replicaof=first.addr,
                min_replicas=min_replicas,
                start_timeout=start_timeout,
                auth=auth,
                host=host,
                netns=netns,
            )
            for i in range(1, replicas + 1)
        ]
        self.sentinel_processes = [
            LocalSentinel(
                self.data_dir / f"sentinel-{i}",
                base + replicas + 1 + i,
                master_name,
                first.addr,
                down_after_ms=down_after_ms,
                start_timeout=start_timeout,
                auth=auth,
                host=host,
                netns=netns,
            )
            for i in range(3)
        ]

    @property
    def sentinels(self) -> list[str]:
        """The Sentinels' "host:port" addresses, for clients that follow failovers."""
        return [sentinel.addr for sentinel in self.sentinel_processes]

    def bridge_settings(self) -> list[str]:
        """`NAME=VALUE` settings for a bridge node using this group through its Sentinels,
        with the servers' and the Sentinels' credentials (passwords in 0600 files)."""
        secrets = self.data_dir / "bridge-secrets"
        secrets.mkdir(parents=True, exist_ok=True)
        settings = [
            f"redis_sentinels={','.join(self.sentinels)}",
            f"redis_master_name={self.master_name}",
            *self.auth.bridge_settings(secrets),
        ]
        if self.auth.sentinel_password:
            path = secrets / "sentinel-password"
            path.write_text(self.auth.sentinel_password + "\n")
            path.chmod(0o600)
            settings.append(f"redis_sentinel_password_file={path}")
        return settings

    def start(self) -> LocalSentinelRedis:
        """Start all five; return once the replica is in sync and every Sentinel knows the
        replica and the two other Sentinels (before that, a failover cannot be authorized)."""
        try:
            for server in self.servers:
                server.start()
            wait_until(
                self._replica_in_sync,
                self.start_timeout,
                "replica in sync with master",
                retrying=(redis.RedisError,),
            )
            for sentinel in self.sentinel_processes:
                sentinel.start()
            wait_until(
                self._sentinels_ready,
                self.start_timeout,
                "every Sentinel knows the replica and the two other Sentinels",
                retrying=(redis.RedisError,),
            )
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the Sentinels first (no failover while the servers go), then the servers."""
        for process in [*self.sentinel_processes, *self.servers]:
            process.stop()

    def __enter__(self) -> LocalSentinelRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def master_addr(self) -> str:
        """The current master's "host:port", as the first Sentinel that answers reports it."""
        reports = self._reported_masters()
        if not reports:
            raise RuntimeError(f"no running Sentinel reports a master for {self.master_name!r}")
        return reports[0]

    def master(self) -> LocalRedis:
        """The server that is the master now."""
        addr = self.master_addr()
        for server in self.servers:
            if server.addr == addr:
                return server
        raise RuntimeError(f"the Sentinels report {addr} as master, which is none of ours")

    def failover(self, timeout: float = 30.0) -> str:
        """SENTINEL FAILOVER: promote the replica. Returns the new master's "host:port" once
        every running Sentinel reports it and it accepts a write."""
        old = self.master_addr()

        def request() -> bool:
            # Refused with NOGOODSLAVE until the Sentinel has fresh news of the replica, or
            # INPROG during another failover: wait_until retries a RedisError.
            with self._sentinel_client() as sentinel:
                return bool(sentinel.sentinel_failover(self.master_name))

        wait_until(
            request, timeout, "a Sentinel accepting SENTINEL FAILOVER", retrying=(redis.RedisError,)
        )
        return self.wait_for_new_master(old, timeout)

    def kill_master(self) -> LocalRedis:
        """SIGKILL the current master; the Sentinels fail over after down_after_ms (see
        wait_for_new_master). Returns the killed server. To bring it back as a replica, set
        its replicaof to the new master and restart() it (the Sentinels would also convert a
        returning master, but only ~10 s after they see it)."""
        server = self.master()
        server.kill()
        return server

    def wait_for_new_master(self, old_addr: str, timeout: float = 30.0) -> str:
        """Wait until every running Sentinel reports the same master other than old_addr and
        that server accepts a write (WRITE_PROBE_KEY); return its "host:port"."""

        def new_master() -> str | None:
            reports = self._reported_masters()
            running = sum(1 for sentinel in self.sentinel_processes if sentinel.pid is not None)
            if len(reports) != running or len(set(reports)) != 1 or reports[0] == old_addr:
                return None
            with connect(reports[0], **self.auth.server_options()) as client:
                client.set(WRITE_PROBE_KEY, time.time())  # ReadOnlyError while still a replica
            return reports[0]

        return wait_until(
            new_master,
            timeout,
            f"a new master instead of {old_addr}",
            retrying=(redis.RedisError,),
        )

    # -- internals ------------------------------------------------------------------------
    def _sentinel_client(self) -> redis.Redis:
        running = [s for s in self.sentinel_processes if s.pid is not None]
        if not running:
            raise RuntimeError("no Sentinel is running")
        return running[0].client()

    def _reported_masters(self) -> list[str]:
        """The master address of each running Sentinel that answers, in Sentinel order."""
        reports = []
        for sentinel in self.sentinel_processes:
            if sentinel.pid is None:
                continue
            try:
                with sentinel.client() as client:
                    reply = client.sentinel_get_master_addr_by_name(self.master_name)
            except redis.RedisError:
                continue
            if reply:
                reports.append(f"{reply[0]}:{reply[1]}")
        return reports

    def _replica_in_sync(self) -> bool:
        for replica in self.servers[1:]:
            with replica.client() as client:
                if client.info("replication").get("master_link_status") != "up":
                    return False
        return True

    def _sentinels_ready(self) -> bool:
        for sentinel in self.sentinel_processes:
            with sentinel.client() as client:
                master = client.sentinel_master(self.master_name)
                replicas = client.sentinel_slaves(self.master_name)
            usable = [
                r
                for r in replicas
                if not r["is_sdown"]
                and not r["is_disconnected"]
                and r.get("master-link-status") == "ok"
            ]
            if master["num-other-sentinels"] != 2 or len(usable) < len(self.servers) - 1:
                return False
        return True


def run_and_collect(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coro)` for a test that uses redis-py's asyncio client in the test process,
    then the garbage its loop left collected here, its ResourceWarnings ignored.

    redis-py closes a connection it gave up on (a refused password, an error read from a
    Sentinel) without waiting for its transport to finish closing (`disconnect(nowait=True)`).
    Once `asyncio.run` has closed the loop that transport never finishes, and the collector
    reports it as an unclosed socket in whichever later, unrelated test it happens to run in
    (filterwarnings = error): seen in full runs, never in the test alone.

    An exception the coroutine raises holds, through its traceback's frames, the loop and the
    connections it failed on, and an exception raised in an `except` block sits in a cycle with
    its own frame. Those frames' locals are cleared before collecting here; otherwise the
    connections outlive this call and reach the collector in pytest's next phase instead."""
    try:
        return asyncio.run(coro)
    except BaseException as exc:
        _clear_frames(exc)
        raise
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()


def _clear_frames(exc: BaseException) -> None:
    """Clear the locals of the finished frames in `exc`'s traceback and in those of the
    exceptions it was raised from or during (frames still running are left as they are)."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        pending += [current.__cause__, current.__context__]
        pending += getattr(current, "exceptions", ())
