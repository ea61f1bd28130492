"""The admin API's test client and node starters, for tests/integration's test_admin_*.py,
tests/cluster's test_admin_cluster.py and every other test that asks a node's admin API: the
fixed admin token and cluster secret, the packet size limit of the `admin_node` fixture
(tests/integration/conftest.py), AdminHttp, a blocking JSON client of one node's admin API,
start_admin_node and start_cluster_admin_node."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from bridge.operations.admin import API_PREFIX
from bridge.operations.node_calls import admin_call_keys, sign_call
from tests.support.processes import BridgeProcess, free_port, wait_for_port

if TYPE_CHECKING:
    from tests.support.cluster import ClusterLauncher

TOKEN = "admin-test-token-7f3a9c"
CLUSTER_SECRET = "admin-tests-cluster-secret-5d1e08b2c4"
"""The cluster secret of the nodes `start_cluster_admin_node` starts (they sign node calls)."""
MAX_PACKET = 4096


class AdminHttp:
    """A blocking client of one node's admin API; every answer must be JSON (except metrics)."""

    def __init__(self, port: int, token: str | None = TOKEN) -> None:
        self.port = port
        self.token = token

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        token: str | None = "",
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any, http.client.HTTPResponse]:
        """(status, decoded JSON body, response) of `method API_PREFIX+path`. `token` "" means
        this client's token, None no Authorization header."""
        sent = dict(headers or {})
        token = self.token if token == "" else token
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=15)
        try:
            conn.request(method, API_PREFIX + path, body=body, headers=sent)
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        content_type = response.getheader("Content-Type", "")
        if content_type.startswith("application/json"):
            return response.status, json.loads(raw), response
        assert path == "/metrics" and response.status == 200, (response.status, raw[:300])
        return response.status, raw.decode(), response

    def get(self, path: str, **kw: Any) -> tuple[int, Any]:
        status, data, _ = self.request("GET", path, **kw)
        return status, data

    def delete(self, path: str, **kw: Any) -> tuple[int, Any]:
        status, data, _ = self.request("DELETE", path, **kw)
        return status, data

    def post(self, path: str, payload: Any, **kw: Any) -> tuple[int, Any]:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        status, data, _ = self.request(
            "POST", path, body, headers={"Content-Type": "application/json"}, **kw
        )
        return status, data

    def client(self, client_id: str) -> tuple[int, Any]:
        return self.get(f"/clients/{quote(client_id, safe='')}")

    def wait_for(
        self, path: str, check: Callable[[Any], bool], timeout: float = 10.0
    ) -> dict[str, Any]:
        """GET `path` until it answers 200 and `check(body)` holds; the body."""
        deadline = time.monotonic() + timeout
        status, data = self.get(path)
        while not (status == 200 and check(data)):
            assert time.monotonic() < deadline, f"{path}: still {status} {data}"
            time.sleep(0.1)
            status, data = self.get(path)
        return data


def node_call_headers(method: str, path: str, caller: str, target: str) -> dict[str, str]:
    """The headers of a call node `caller` signs with `CLUSTER_SECRET` for `method
    API_PREFIX+path` (no body) on node `target`: what a member sends in the fan-out."""
    (key,) = admin_call_keys([CLUSTER_SECRET.encode()])
    return sign_call(key, method, API_PREFIX + path, b"", caller, target, time.time())


def start_admin_node(
    bridge_factory: Callable[..., BridgeProcess], *settings: str
) -> tuple[BridgeProcess, AdminHttp]:
    port = free_port()
    node = bridge_factory(f"admin_listen=127.0.0.1:{port}", *settings)
    wait_for_port(port, proc=node.proc)
    return node, AdminHttp(port)


def start_cluster_admin_node(
    cluster: ClusterLauncher, node_id: str, *extra: str
) -> tuple[BridgeProcess, AdminHttp]:
    """Node `node_id` of `cluster` with its admin API (token `TOKEN`, cluster secret
    `CLUSTER_SECRET`) answering."""
    port = free_port()
    node = cluster.start(
        node_id,
        f"admin_listen=127.0.0.1:{port}",
        f"admin_token={TOKEN}",
        f"cluster_secret={CLUSTER_SECRET}",
        *extra,
    )
    wait_for_port(port, proc=node.proc)
    return node, AdminHttp(port)
