"""Fixtures of the interop tests: the client libraries as parameters, one bridge node for the
single-node scenarios (TCP and WebSocket listeners) and one 3-node cluster behind HAProxy for
the kill -9 scenario, each started once per module and killed by PID at its end."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.interop.driver import Driver
from tests.support.admin_http import CLUSTER_SECRET, TOKEN, AdminHttp
from tests.support.cluster import ClusterLauncher
from tests.support.haproxy import LocalHAProxy
from tests.support.processes import BridgeProcess, bridge_nodes, free_port, wait_for_port
from tests.support.redis import LocalRedis
from tests.support.rocketmq import ExternalRocketMQ, LocalRocketMQ


@dataclass(frozen=True)
class Client:
    """A client library and the transport it is asked to use."""

    library: str
    transport: str = "tcp"

    def url(self, host_port: str, ws_host_port: str | None = None) -> str:
        if self.transport == "ws":
            assert ws_host_port is not None
            return f"ws://{ws_host_port}/mqtt"
        return f"mqtt://{host_port}"


CLIENTS = {
    "mqttjs-tcp": Client("node"),
    "mqttjs-ws": Client("node", "ws"),
    "paho-java": Client("java"),
    "paho-go": Client("go"),
    "rumqttc": Client("rust"),
}


@pytest.fixture(params=list(CLIENTS.values()), ids=list(CLIENTS))
def client(request: pytest.FixtureRequest) -> Client:
    return request.param


@pytest.fixture
def drivers(client: Client, tmp_path: Path) -> Iterator[Callable[[str], Driver]]:
    """Start drivers of the test's library (`drivers("sub")`); all are stopped at the end."""
    started: list[Driver] = []

    def start(name: str) -> Driver:
        driver = Driver.start(client.library, tmp_path / "drivers", name)
        started.append(driver)
        return driver

    yield start
    for driver in started:
        driver.close()


@pytest.fixture
def topic(client: Client) -> str:
    """A topic of the test's own: tests share their node."""
    return f"interop/{client.library}-{client.transport}/{uuid.uuid4().hex[:8]}"


@dataclass
class SingleNode:
    node: BridgeProcess
    ws_port: int

    def url(self, client: Client) -> str:
        return client.url(f"127.0.0.1:{self.node.port}", f"127.0.0.1:{self.ws_port}")


@pytest.fixture(scope="module")
def single_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SingleNode]:
    """One bridge on the embedded store, MQTT over TCP and over WebSocket."""
    ws_port = free_port()
    with bridge_nodes(tmp_path_factory.mktemp("interop-node")) as start:
        node = start(f"ws_listen=127.0.0.1:{ws_port}")
        wait_for_port(ws_port, proc=node.proc)
        yield SingleNode(node, ws_port)


@dataclass
class BalancedCluster:
    """Three nodes over Redis and RocketMQ, each with MQTT over TCP and over WebSocket, their
    admin APIs, and an HAProxy in front of each kind of listener."""

    launcher: ClusterLauncher
    admin: dict[str, AdminHttp]
    ports: dict[str, dict[str, int]]
    """Node id -> transport ("tcp", "ws") -> the node's port."""
    balancers: dict[str, LocalHAProxy]
    """Transport -> the HAProxy balancing over the nodes' listeners of it."""

    def url(self, client: Client) -> str:
        """Where the client connects: the balancer of its transport."""
        port = self.balancers[client.transport].frontend_port
        return client.url(f"127.0.0.1:{port}", f"127.0.0.1:{port}")

    def node_url(self, node_id: str, client: Client) -> str:
        """One node's own listener for the client's transport (no balancer)."""
        port = self.ports[node_id][client.transport]
        return client.url(f"127.0.0.1:{port}", f"127.0.0.1:{port}")

    def node_of(self, client_id: str) -> str:
        """The id of the node the client is connected to (asked of every node's admin API)."""
        for node_id, api in self.admin.items():
            if self.launcher.nodes[node_id].proc.poll() is not None:
                continue
            status, body, _ = api.request("GET", "/clients?limit=1000")
            assert status == 200, body
            if any(c["client_id"] == client_id and c["connected"] for c in body["items"]):
                return node_id
        raise AssertionError(f"{client_id} is connected to no node")

    def start(self, node_id: str) -> None:
        """Start node `node_id` on its ports (new ones the first time); return once it links
        to the other running nodes and every balancer sees it up."""
        ports = self.ports.setdefault(node_id, {"tcp": free_port(), "ws": free_port()})
        api = self.admin.setdefault(node_id, AdminHttp(free_port()))
        node = self.launcher.start(
            node_id,
            f"ws_listen=127.0.0.1:{ports['ws']}",
            f"admin_listen=127.0.0.1:{api.port}",
            f"admin_token={TOKEN}",
            f"cluster_secret={CLUSTER_SECRET}",
            port=ports["tcp"],
        )
        wait_for_port(api.port, proc=node.proc)
        self.launcher.wait_linked()
        for transport, balancer in self.balancers.items():
            balancer.wait_for_status(f"127.0.0.1:{ports[transport]}", "UP", timeout=20)


@pytest.fixture(scope="module")
def balanced_cluster(
    tmp_path_factory: pytest.TempPathFactory,
    rocketmq: LocalRocketMQ | ExternalRocketMQ,
    redis_server: LocalRedis,
) -> Iterator[BalancedCluster]:
    work = tmp_path_factory.mktemp("interop-cluster")
    with bridge_nodes(work) as start:
        launcher = ClusterLauncher(
            start, rocketmq.namesrv_addr, tuple(redis_server.bridge_settings())
        )
        cluster = BalancedCluster(launcher, {}, {}, {})
        node_ids = ("n1", "n2", "n3")
        try:
            for node_id in node_ids:
                cluster.start(node_id)
            for transport in ("tcp", "ws"):
                backends = [f"127.0.0.1:{cluster.ports[n][transport]}" for n in node_ids]
                balancer = LocalHAProxy(work / f"haproxy-{transport}", None, backends)
                cluster.balancers[transport] = balancer.start()
                for backend in backends:
                    balancer.wait_for_status(backend, "UP", timeout=20)
            yield cluster
        finally:
            for balancer in cluster.balancers.values():
                balancer.stop()
            launcher.stop_all()
