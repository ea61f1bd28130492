"""The deploy/redis and deploy/haproxy scripts start real servers that behave as a bridge
cluster needs: Redis keeps acknowledged writes across kill -9 (AOF), Sentinel promotes the
replica when asked or when the master dies, and HAProxy spreads MQTT's long-lived TCP
connections over the nodes and steers clients away from a node that fails.

Every test stops all the processes it starts (the session's redis_server excepted).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from redis.sentinel import Sentinel

from bridge.cluster.redis_access import RedisAccess
from bridge.cluster.registry import RedisRegistry, redis_client
from bridge.storage.base import StoreUnavailable
from tests.support.haproxy import LocalHAProxy
from tests.support.redis import SCRIPTS, LocalRedis, LocalSentinelRedis, run_and_collect
from tests.support.rocketmq import free_port_block
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

MASTER_NAME = "mqtt-bridge"


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _replicates(server: LocalRedis, master: LocalRedis) -> bool:
    """Whether server is an in-sync replica of master."""
    with server.client() as client:
        info = client.info("replication")
    synced = (
        info["role"] == "slave"
        and info["master_port"] == master.port
        and info["master_link_status"] == "up"
    )
    return synced


# -- Redis ------------------------------------------------------------------------------------


def test_redis_answers_on_loopback_with_aof_on_and_no_snapshots(redis_server: LocalRedis) -> None:
    with redis.Redis.from_url(redis_server.url, decode_responses=True) as client:
        assert client.ping()
        client.set("deploy:hello", "world")
        assert client.get("deploy:hello") == "world"
        config = {key: client.config_get(key)[key] for key in ("appendonly", "appendfsync", "save")}
        assert config == {"appendonly": "yes", "appendfsync": "everysec", "save": ""}
        assert client.config_get("bind")["bind"] == "127.0.0.1"
        assert client.config_get("dir")["dir"] == str(redis_server.data_dir)
    assert redis_server.pid is not None
    assert (redis_server.data_dir / "appendonlydir").is_dir()


def test_status_reports_a_running_server_and_fails_once_it_is_stopped(tmp_path: Path) -> None:
    server = LocalRedis(tmp_path / "redis")
    with server:
        status = subprocess.run(
            [str(SCRIPTS / "status.sh"), str(server.data_dir)], capture_output=True, text=True
        )
        assert status.returncode == 0, status.stderr
        assert f"pid {server.pid}, {server.addr}, role=master" in status.stdout
    status = subprocess.run(
        [str(SCRIPTS / "status.sh"), str(server.data_dir)], capture_output=True, text=True
    )
    assert status.returncode == 1
    assert server.pid is None and not _port_open(server.port)


@pytest.mark.fault
@pytest.mark.parametrize("appendfsync", ["everysec", "always"])
def test_acknowledged_writes_survive_kill_9_and_restart(tmp_path: Path, appendfsync: str) -> None:
    """kill -9 skips every shutdown step; what Redis acknowledged is in the AOF regardless
    (written before the reply; appendfsync only decides when it is fsynced to the disk)."""
    with LocalRedis(tmp_path / "redis", appendfsync=appendfsync) as server:
        with server.client() as client:
            assert client.config_get("appendfsync")["appendfsync"] == appendfsync
            with client.pipeline(transaction=False) as pipe:
                for i in range(2000):
                    pipe.set(f"key:{i}", i)
                pipe.rpush("list", *range(100))
                pipe.execute()
        killed_pid = server.pid
        server.kill()
        assert server.pid is None and not _port_open(server.port)

        server.restart()
        assert server.pid not in (None, killed_pid)
        with server.client() as client:
            assert client.dbsize() == 2001
            assert client.get("key:1999") == "1999"
            assert client.lrange("list", 0, -1) == [str(i) for i in range(100)]
        assert "DB loaded from append only file" in server.log_tail(lines=200)


ZOMBIE_LEADER = """
import ctypes, socket, threading, time
server = socket.create_server(("127.0.0.1", 0))
print(server.getsockname()[1], flush=True)
threading.Thread(target=time.sleep, args=(120,)).start()
ctypes.CDLL(None).pthread_exit(None)  # the main thread ends; the other holds the socket
"""


@pytest.mark.parametrize("deploy", ["redis", "haproxy"])
def test_a_process_counts_as_running_while_a_thread_holds_its_files_after_its_main_thread_ended(
    deploy: str,
) -> None:
    """Killed, Redis's main thread turns zombie before a background thread in an fsync has
    closed the process's files: `kill.sh` and `stop.sh` must wait for every thread, or the port
    is still open when they return (a CI run of the kill -9 test above saw just that)."""
    lib = SCRIPTS.parent / deploy / "lib.sh"

    def alive(pid: int) -> bool:
        check = subprocess.run(["bash", "-c", f'. "{lib}"; alive {pid}'], check=False)
        return check.returncode == 0

    def main_thread_state(pid: int) -> str:
        ps = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True)
        return ps.stdout.strip()

    with subprocess.Popen(
        [sys.executable, "-c", ZOMBIE_LEADER], stdout=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None
            port = int(proc.stdout.readline())
            wait_until(lambda: main_thread_state(proc.pid).startswith("Z"), 10, "a zombie")
            assert _port_open(port)
            assert alive(proc.pid)
            proc.kill()
            wait_until(lambda: not alive(proc.pid), 10, "every thread gone")
            assert not _port_open(port)
        finally:
            proc.kill()


def test_start_fails_clearly_when_the_port_is_taken(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", free_port_block())) as squatter:
        port = squatter.getsockname()[1]
        server = LocalRedis(tmp_path / "redis", port)
        with pytest.raises(RuntimeError, match=f"port {port} is taken by another process"):
            server.start()
        assert server.pid is None


# -- Sentinel ---------------------------------------------------------------------------------


def test_sentinel_failover_promotes_the_replica_and_the_new_master_accepts_writes(
    tmp_path: Path,
) -> None:
    with LocalSentinelRedis(tmp_path / "sentinel", MASTER_NAME) as group:
        first, replica = group.servers
        assert group.master_addr() == first.addr
        with first.client() as client:
            client.set("written-before", "failover")
            assert client.wait(1, 5000) == 1  # the replica has it

        assert group.failover(timeout=20) == replica.addr
        assert group.master() is replica
        with replica.client() as client:
            assert client.get("written-before") == "failover"
            client.set("written-after", "failover")

        # A client that asks the Sentinels finds the new master.
        sentinel = Sentinel(
            [("127.0.0.1", int(addr.rpartition(":")[2])) for addr in group.sentinels],
            socket_timeout=2,
            decode_responses=True,
        )
        master = sentinel.master_for(MASTER_NAME, socket_timeout=2)
        try:
            assert master.get("written-after") == "failover"
            assert master.set("written-via-sentinel", "yes")
        finally:
            master.close()
            for client in sentinel.sentinels:
                client.close()


@pytest.mark.fault
def test_sentinels_fail_over_on_their_own_when_the_master_is_killed(tmp_path: Path) -> None:
    with LocalSentinelRedis(tmp_path / "sentinel", MASTER_NAME) as group:
        first, replica = group.servers
        with first.client() as client:
            client.set("written-before", "crash")
            assert client.wait(1, 5000) == 1

        killed = group.kill_master()
        assert killed is first and first.pid is None
        began = time.monotonic()
        # down-after-milliseconds is 2 s; the vote and the promotion take a few more.
        assert group.wait_for_new_master(first.addr, timeout=20) == replica.addr
        print(f"\nautomatic failover took {time.monotonic() - began:.1f} s after kill -9")
        with replica.client() as client:
            assert client.get("written-before") == "crash"

        # The crashed server comes back as a replica of the new master (start.sh --replicaof).
        first.replicaof = replica.addr
        first.restart()
        wait_until(
            lambda: _replicates(first, replica),
            15,
            "restarted server replicating",
            retrying=(redis.RedisError,),
        )


# -- HAProxy ----------------------------------------------------------------------------------


class _NameHandler(socketserver.StreamRequestHandler):
    server: EchoNode

    def handle(self) -> None:
        self.server.connections.add(self.connection)
        try:
            for line in self.rfile:
                self.wfile.write(f"{self.server.name} ".encode() + line)
        except OSError:
            pass  # the balancer or the test closed the connection
        finally:
            self.server.connections.discard(self.connection)


class EchoNode(socketserver.ThreadingTCPServer):
    """A stand-in for a bridge node behind the balancer: it answers every line with its name
    and the line, so a client can tell which node serves its connection."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, name: str) -> None:
        self.name = name
        self.connections: set[socket.socket] = set()
        super().__init__(("127.0.0.1", free_port_block()), _NameHandler)
        self.addr = f"127.0.0.1:{self.server_address[1]}"
        self._thread = threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def stop_listening(self) -> None:
        """Refuse new connections but keep the open ones: a node that hangs, failing its
        health checks, while its clients' connections stay up."""
        if self._thread.is_alive():
            self.shutdown()
            self._thread.join()
        self.server_close()

    def kill(self) -> None:
        """Close the listener and every connection, as kill -9 of a node does."""
        self.stop_listening()
        for conn in list(self.connections):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def node() -> Iterator[Callable[[str], EchoNode]]:
    """Start EchoNodes by name; all are killed after the test."""
    nodes: list[EchoNode] = []

    def start(name: str) -> EchoNode:
        nodes.append(EchoNode(name))
        return nodes[-1]

    yield start
    for each in nodes:
        each.kill()


@pytest.fixture
def connect() -> Iterator[Callable[[int], socket.socket]]:
    """Open TCP connections to 127.0.0.1:port; all are closed after the test."""
    sockets: list[socket.socket] = []

    def open_connection(port: int) -> socket.socket:
        sockets.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        return sockets[-1]

    yield open_connection
    for sock in sockets:
        sock.close()


def _served_by(sock: socket.socket) -> str:
    """The name of the node that answers on this connection."""
    sock.sendall(b"ping\n")
    reply = b""
    while not reply.endswith(b"\n"):
        chunk = sock.recv(256)
        if not chunk:
            raise ConnectionError("the balancer closed the connection")
        reply += chunk
    name, _, echoed = reply.decode().partition(" ")
    assert echoed == "ping\n"
    return name


def _closed_by_peer(sock: socket.socket) -> bool:
    """Wait (up to the socket's timeout) for the other side to close the connection."""
    try:
        return sock.recv(256) == b""
    except ConnectionResetError:
        return True


def test_haproxy_spreads_connections_over_the_backends_by_least_connections(
    tmp_path: Path, node: Callable[[str], EchoNode], connect: Callable[[int], socket.socket]
) -> None:
    a, b = node("a"), node("b")
    with LocalHAProxy(tmp_path / "haproxy", None, [a.addr, b.addr]) as lb:
        served = [_served_by(connect(lb.frontend_port)) for _ in range(6)]
        assert Counter(served) == {"a": 3, "b": 3}
        # Until its first check a node shows "UP 1/2"; the health checks pass.
        lb.wait_for_status(a.addr, "UP", timeout=5)
        lb.wait_for_status(b.addr, "UP", timeout=5)


def test_haproxy_disconnects_the_clients_of_a_backend_that_fails_health_checks(
    tmp_path: Path, node: Callable[[str], EchoNode], connect: Callable[[int], socket.socket]
) -> None:
    a, b = node("a"), node("b")
    with LocalHAProxy(tmp_path / "haproxy", None, [a.addr, b.addr]) as lb:
        clients = {_served_by(sock): sock for sock in (connect(lb.frontend_port) for _ in "ab")}
        assert clients.keys() == {"a", "b"}

        a.stop_listening()  # a's connection stays up; only the health checks fail
        lb.wait_for_status(a.addr, "DOWN", timeout=10)
        # on-marked-down shutdown-sessions: the client is cut off, so it reconnects elsewhere.
        assert _closed_by_peer(clients["a"])
        assert _served_by(clients["b"]) == "b"
        assert {_served_by(connect(lb.frontend_port)) for _ in range(4)} == {"b"}


@pytest.mark.fault
def test_haproxy_sends_new_connections_to_the_surviving_backend_after_one_is_killed(
    tmp_path: Path, node: Callable[[str], EchoNode], connect: Callable[[int], socket.socket]
) -> None:
    a, b = node("a"), node("b")
    with LocalHAProxy(tmp_path / "haproxy", None, [a.addr, b.addr]) as lb:
        clients = {_served_by(sock): sock for sock in (connect(lb.frontend_port) for _ in "ab")}
        assert clients.keys() == {"a", "b"}
        a.kill()
        assert _closed_by_peer(clients["a"])
        # At once, before the health checks notice: a refused connection is redispatched.
        began = time.monotonic()
        assert [_served_by(connect(lb.frontend_port)) for _ in range(4)] == ["b"] * 4
        print(f"\n4 connections right after the kill: {time.monotonic() - began:.2f} s")
        lb.wait_for_status(a.addr, "DOWN", timeout=10)
        assert [_served_by(connect(lb.frontend_port)) for _ in range(4)] == ["b"] * 4


def test_haproxy_reload_changes_the_backends_without_dropping_open_connections(
    tmp_path: Path, node: Callable[[str], EchoNode], connect: Callable[[int], socket.socket]
) -> None:
    a, b = node("a"), node("b")
    lb = LocalHAProxy(tmp_path / "haproxy", None, [a.addr])
    with lb:
        master = lb.pid
        on_a = connect(lb.frontend_port)
        assert _served_by(on_a) == "a"

        lb.reload([a.addr, b.addr])  # a node joins
        assert lb.pid == master
        assert _served_by(on_a) == "a"
        assert {_served_by(connect(lb.frontend_port)) for _ in range(2)} == {"a", "b"}

        lb.reload([b.addr])  # a leaves: new clients go to b, a's clients stay until they quit
        assert {_served_by(connect(lb.frontend_port)) for _ in range(3)} == {"b"}
        assert _served_by(on_a) == "a"
    # stop.sh ends every worker, including those kept for the connections of earlier configs.
    assert lb.pid is None and lb.processes() == []
    assert _closed_by_peer(on_a)


@pytest.mark.fault
def test_a_deposed_master_refusing_writes_for_want_of_replicas_sends_writes_to_the_new_one(
    tmp_path: Path,
) -> None:
    """The Redis failover of the nemesis: the master is frozen, the Sentinels promote a replica
    and point the other at it, and the old master wakes up still believing it leads. With
    REDIS_MIN_REPLICAS=1 it refuses writes (NOREPLICAS) instead of taking ones no replica will
    ever have; the registry's client, still connected to it, asks the Sentinels again on that
    refusal and writes to the new master, where before it failed until a Sentinel got round to
    demoting the old one (up to 10 s later)."""
    with LocalSentinelRedis(
        tmp_path / "sentinel", MASTER_NAME, replicas=2, min_replicas=1
    ) as group:
        first = group.servers[0]
        access = RedisAccess(sentinels=",".join(group.sentinels), master_name=MASTER_NAME)

        async def main() -> None:
            registry = RedisRegistry(redis_client(access), "deposed", "n1", wait_replicas=1)
            try:
                assert await registry.claim("device", False) is not None  # connected to `first`
                os.kill(first.pid or 0, signal.SIGSTOP)
                try:
                    new = await asyncio.to_thread(group.wait_for_new_master, first.addr, 20)
                    wait_until(
                        lambda: _failover_done(group, new),
                        20,
                        "the failover finished: every Sentinel names the new master, whose "
                        "replica follows it",
                        retrying=(redis.RedisError,),
                    )
                finally:
                    os.kill(first.pid or 0, signal.SIGCONT)
                with first.client() as old:
                    assert old.info("replication")["role"] == "master"  # not demoted yet
                    with pytest.raises(redis.ResponseError, match="NOREPLICAS"):
                        old.set("taken-by-the-deposed-master", "1")
                try:
                    claim = await registry.claim("device", False)
                except StoreUnavailable as exc:
                    # The retried pipeline reached the new master, which has not got the
                    # registry's scripts (they are not replicated): the next call loads them.
                    assert "No matching script" in str(exc), exc
                    claim = await registry.claim("device", False)
                assert claim is not None and claim.previous_node == "n1"
            finally:
                await registry.close()

        run_and_collect(main())


def _failover_done(group: LocalSentinelRedis, addr: str) -> bool:
    """Every Sentinel's SENTINEL MASTERS names `addr` (the leader keeps naming the old master
    there until it has reconfigured the replicas), and `addr` has a replica connected."""
    for sentinel in group.sentinel_processes:
        with sentinel.client() as client:
            master = client.sentinel_master(MASTER_NAME)
        if f"{master['ip']}:{master['port']}" != addr:
            return False
    server = next(s for s in group.servers if s.addr == addr)
    with server.client() as client:
        return int(client.info("replication").get("connected_slaves", 0)) >= 1


def _judged_down(group: LocalSentinelRedis) -> bool:
    """Whether some Sentinel takes the master for objectively down."""
    for sentinel in group.sentinel_processes:
        with sentinel.client() as client:
            if "o_down" in str(client.sentinel_master(MASTER_NAME)["flags"]):
                return True
    return False


@pytest.mark.fault
def test_no_claim_is_confirmed_by_a_master_that_wakes_up_while_it_is_being_deposed(
    tmp_path: Path,
) -> None:
    """The nemesis's QoS 2 messages delivered twice: the master, frozen, wakes up just as the
    Sentinels judge it down. While they promote one replica, the other still follows it and
    answers WAIT, so the claims it takes count as written, until that replica is pointed at
    the new master and they are gone. The registry's client follows the Sentinels' events and
    writes nothing to a master they are deposing: every claim it confirmed is on the new one."""
    with LocalSentinelRedis(
        tmp_path / "sentinel", MASTER_NAME, replicas=2, min_replicas=1
    ) as group:
        first = group.servers[0]
        access = RedisAccess(sentinels=",".join(group.sentinels), master_name=MASTER_NAME)

        async def main() -> tuple[list[str], list[str]]:
            registry = RedisRegistry(redis_client(access), "rollback", "n1", wait_replicas=1)
            confirmed: list[str] = []
            try:
                assert await registry.claim("before", False) is not None
                await asyncio.sleep(0.5)  # subscribed to the Sentinels' events meanwhile
                os.kill(first.pid or 0, signal.SIGSTOP)
                try:
                    await asyncio.to_thread(
                        wait_until,
                        lambda: _judged_down(group),
                        20,
                        "a Sentinel judging the master down",
                        retrying=(redis.RedisError,),
                    )
                finally:
                    os.kill(first.pid or 0, signal.SIGCONT)
                for number in range(400):  # about 4 s of claims, through the failover
                    with contextlib.suppress(StoreUnavailable):
                        await registry.claim(f"device-{number}", False)
                        confirmed.append(f"device-{number}")
                    await asyncio.sleep(0.01)
                new = await asyncio.to_thread(group.wait_for_new_master, first.addr, 20)
                await asyncio.to_thread(
                    wait_until,
                    lambda: _failover_done(group, new),
                    20,
                    "every Sentinel naming the new master, its replica following it",
                    retrying=(redis.RedisError,),
                )
                server = next(s for s in group.servers if s.addr == new)
                with server.client() as client:
                    missing = [c for c in confirmed if not client.exists(registry.client_key(c))]
            finally:
                await registry.close()
            return confirmed, missing

        confirmed, missing = run_and_collect(main())
        assert confirmed, "no claim got through after the failover"
        assert not missing, f"{len(missing)} of {len(confirmed)} confirmed claims rolled back"
