"""Strangers on the peer port: they speak the real peer framing and try what owned a cluster
before links were authenticated (subscribe to `#`, inject a message and a retained value, kick a
client with `Release`). Each is refused before the node acts on a frame, and logged; nobody gets
a message, injects one or kicks a client. An authenticated member cannot release a client the
registry does not say it owns. A cluster member without a secret or peer TLS does not start."""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from bridge.cluster import wire
from bridge.cluster.credential import PEER_LINK, derive_key
from bridge.cluster.handshake import NONCE_BYTES, Handshake, Role
from bridge.cluster.wire import PeerDecoder, PeerProtocolError, encode
from tests.support.clients import PahoClient, paho_client
from tests.support.cluster import ClusterLauncher, wait_for_route
from tests.support.processes import REPO, BridgeProcess, free_port
from tests.support.redis import LocalRedis
from tests.support.tcpproxy import TcpProxy

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(180)]

ATTACK = (
    encode(wire.AddFilters(("#",)))
    + encode(wire.Forward("factory/line1/press3", b"injected", 0))
    + encode(wire.Retained("$SYS/broker/version", b"injected"))
    + encode(wire.Release(1, "victim", 2**64 - 1))
)
"""What a stranger sends once it believes it is linked: everything it must not get away with."""


@dataclass
class Intruder:
    """A raw TCP connection to a node's peer port, speaking the real framing."""

    port: int
    sock: socket.socket = field(init=False)

    def __post_init__(self) -> None:
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)

    def send(self, data: bytes) -> None:
        # The node may have closed the link already: what the test expects (see `received`).
        with contextlib.suppress(OSError):
            self.sock.sendall(data)

    def handshake_as(self, node_id: str, boot_id: str, key: bytes) -> None:
        """Run the dialer's side of the handshake as `node_id`, proving with `key`."""
        hs = Handshake(Role.DIALER, node_id, boot_id, (key,), secrets.token_bytes(NONCE_BYTES))
        self.send(hs.data_to_send())
        while hs.peer_hello is None:
            hs.receive_data(self.sock.recv(4096))
            hs.next_event()
        self.send(hs.data_to_send())

    def received(self, timeout: float = 5.0) -> tuple[list[str], bool]:
        """The frame types the node sent until it closed the link or `timeout` passed, and
        whether it closed it."""
        decoder = PeerDecoder()
        deadline = time.monotonic() + timeout
        closed = False
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                break
            except OSError:
                closed = True
                break
            if not data:
                closed = True
                break
            decoder.receive_data(data)
        try:
            frames = [type(f).__name__ for f in decoder.frames()]
        except PeerProtocolError:
            frames = ["<not a frame>"]
        self.sock.close()
        return frames, closed


@dataclass
class Victim:
    """A client on the node under attack, and whether it was disconnected."""

    client: PahoClient
    lost: threading.Event


@pytest.fixture
def victim_cluster(
    cluster: ClusterLauncher,
) -> Iterator[tuple[BridgeProcess, BridgeProcess, TcpProxy]]:
    """Nodes a and b, a dialing b through a proxy that records a's side of the handshake; b's
    handshake deadline is 1 s."""
    a = cluster.start("a")
    b_peer = cluster.peer_ports["b"] = free_port()
    proxy = TcpProxy(b_peer).start()
    try:
        b = cluster.start("b", f"peer_advertise=127.0.0.1:{proxy.port}", "peer_handshake_timeout=1")
        cluster.wait_linked()
        yield a, b, proxy
    finally:
        proxy.stop()


def registry_boot(redis_server: LocalRedis, cluster: ClusterLauncher, node_id: str) -> str:
    redis = redis_server.client()
    try:
        return str(json.loads(redis.hget(f"{cluster.name}:nodeinfo", node_id))["boot"])
    finally:
        redis.close()


def test_intruders_on_the_peer_port_get_nothing_inject_nothing_kick_nobody_and_are_logged(
    cluster: ClusterLauncher,
    victim_cluster: tuple[BridgeProcess, BridgeProcess, TcpProxy],
    redis_server: LocalRedis,
) -> None:
    _a, b, proxy = victim_cluster
    port = cluster.peer_ports["b"]
    key = derive_key(cluster.secret.encode(), PEER_LINK)
    wrong_key = derive_key(secrets.token_hex(32).encode(), PEER_LINK)
    transcript = bytes(proxy.sent[0])  # a's Hello and Proof on its real link to b
    decoder = PeerDecoder()
    decoder.receive_data(transcript)
    assert [type(f).__name__ for f in decoder.frames()][:2] == ["Hello", "Proof"]
    a_boot = registry_boot(redis_server, cluster, "a")
    lost = threading.Event()
    with (
        paho_client(b.port, client_id="victim") as victim,
        paho_client(b.port) as watcher,
        paho_client(b.port) as publisher,
    ):
        victim.client.on_disconnect = lambda *_args: lost.set()
        watcher.client.subscribe("#", 0)
        wait_for_route(lambda p: publisher.client.publish("probe/x", p), watcher)

        def attack(
            needle: str,
            opening: bytes = b"",
            *,
            as_node: tuple[str, str, bytes] | None = None,
            then: bytes = ATTACK,
        ) -> None:
            intruder = Intruder(port)
            if as_node is not None:
                intruder.handshake_as(*as_node)
            intruder.send(opening + then)
            for i in range(5):  # what a node forwarding to the intruder would send it
                publisher.client.publish("factory/line1/press3", f"real-{i}")
            frames, closed = intruder.received()
            assert closed, f"{needle}: the node kept the link open"
            assert set(frames) <= {"Hello"}, f"{needle}: the intruder got {frames}"
            b.wait_for_log(needle)

        no_proof = encode(wire.Hello(wire.VERSION, "a", "forged", secrets.token_bytes(32)))
        attack("expected Proof, got AddFilters", no_proof)
        attack("wrong proof of the cluster secret", as_node=("a", a_boot, wrong_key))
        attack("wrong proof of the cluster secret", transcript)  # replayed: b's nonce is new
        assert b.log_text().count("wrong proof of the cluster secret") == 2
        # Insiders holding the secret, claiming another node's identity:
        attack("the registry shows boot", as_node=("a", "made-up-boot", key))
        attack("a live link of that node is up", as_node=("a", a_boot, key))
        attack("lists no live member", as_node=("mallory", "m1", key))
        attack("no authenticated handshake within 1 s", then=b"")
        big = (64 * 1024 * 1024).to_bytes(4, "big") + b"\x04"
        attack("a frame of 67108864 bytes before the handshake", big)
        got = [m.payload for m in watcher.drain(100, timeout=1.0)]
        assert b"injected" not in got
        with paho_client(b.port) as late:  # a retained value would reach a new subscriber
            late.client.subscribe("$SYS/broker/version", 0)
            retained = [m.payload for m in late.drain(5, timeout=1.0)]
        assert b"injected" not in retained
        assert not lost.is_set(), "the victim was disconnected"
        assert victim.client.is_connected()
    log = b.log_text()
    assert log.count("refused peer link from 127.0.0.1:") >= 8
    assert log.count("peer link to a up") == 1, "a's real link was replaced"
    assert "Traceback" not in log


def test_a_release_from_a_member_that_does_not_own_the_client_is_refused(
    cluster: ClusterLauncher, redis_server: LocalRedis
) -> None:
    b = cluster.start("b")
    with contextlib.closing(redis_server.client()) as redis:
        # A member of the cluster (it holds the secret and heartbeats) that never took the client.
        now_ms = int(redis.time()[0]) * 1000
        redis.zadd(f"{cluster.name}:nodes", {"0-rogue": now_ms + 30_000})
        info = {"peer": "127.0.0.1:1", "boot": "r1", "role": "notify", "features": []}
        redis.hset(f"{cluster.name}:nodeinfo", "0-rogue", json.dumps(info))
        lost = threading.Event()
        with paho_client(b.port, client_id="victim", clean_session=False) as victim:
            victim.client.on_disconnect = lambda *_args: lost.set()
            epoch = int(redis.hget(f"{cluster.name}:c:victim", "epoch"))
            intruder = Intruder(cluster.peer_ports["b"])
            key = derive_key(cluster.secret.encode(), PEER_LINK)
            intruder.handshake_as("0-rogue", "r1", key)
            b.wait_for_log("peer link to 0-rogue up")
            intruder.send(encode(wire.Release(7, "victim", epoch)))
            b.wait_for_log("refused Release of client victim from node 0-rogue")
            frames, _closed = intruder.received(timeout=1.0)
            assert "Released" in frames  # answered "nothing held here": the asker does not hang
            assert not lost.wait(0.5) and victim.client.is_connected()
    assert "the registry names b as the client's owner" in b.log_text()


def test_a_cluster_member_without_a_secret_or_peer_tls_refuses_to_start() -> None:
    name = f"t{uuid.uuid4().hex[:8]}"
    settings = ["store=rocketmq", "redis_url=redis://127.0.0.1:1/0", f"cluster_name={name}"]
    args = [sys.executable, "-m", "bridge"]
    for setting in settings:
        args += ["--set", setting]
    for program in (args, [sys.executable, "-m", "notify", *args[3:]]):
        result = subprocess.run(program, cwd=REPO, capture_output=True, text=True, timeout=60)
        assert result.returncode == 2, result.stderr
        assert "configuration error: cluster_secret_file:" in result.stderr
        assert "peer_tls_certfile" in result.stderr
        assert "Traceback" not in result.stderr
