"""Node-to-node admin calls on a real node (real Redis, real RocketMQ): an impostor who writes a
member with its own admin address into the registry receives no operator token from the fan-out
or from a forwarded client lookup, and what it does receive is refused by every real node; a
real node accepts a signed call once and only on the routes the fan-out uses."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import redis

from tests.support.admin_http import (
    TOKEN,
    AdminHttp,
    node_call_headers,
    start_cluster_admin_node,
)
from tests.support.cluster import ClusterLauncher
from tests.support.redis import LocalRedis

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(180)]

IMPOSTOR = "impostor"
"""Sorts before the real node's id, so the real node waits to be dialled instead of dialling."""
REAL = "z"


@dataclass
class Captured:
    """One request the impostor's admin server received."""

    method: str
    path: str
    headers: dict[str, str]


@dataclass
class ImpostorServer:
    """What the impostor's HTTP server received, in order."""

    port: int = 0
    requests: list[Captured] = field(default_factory=list)
    arrived: threading.Condition = field(default_factory=threading.Condition)

    def wait_for(self, count: int, timeout: float = 10.0) -> list[Captured]:
        """Until `count` requests arrived; all of them."""
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.requests) >= count, timeout), (
                self.requests
            )
            return list(self.requests)


@contextmanager
def impostor_server() -> Iterator[ImpostorServer]:
    """An HTTP server on a free loopback port that records every request and answers 503."""
    seen = ImpostorServer()

    class Handler(BaseHTTPRequestHandler):
        def _record(self) -> None:
            with seen.arrived:
                seen.requests.append(Captured(self.command, self.path, dict(self.headers)))
                seen.arrived.notify_all()
            body = json.dumps({"error": "impostor"}).encode()
            self.send_response(503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_DELETE = _record

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    seen.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@contextmanager
def registry(redis_server: LocalRedis) -> Iterator[redis.Redis]:
    """A Redis client of the cluster's registry, closed after use."""
    client = redis.Redis.from_url(redis_server.url, socket_timeout=5)
    try:
        yield client
    finally:
        client.close()


def register_impostor(client: redis.Redis, cluster: ClusterLauncher, admin: str) -> None:
    """Write a member `IMPOSTOR`, alive for ten minutes, whose admin API is at `admin`."""
    prefix = cluster.name
    until = int((time.time() + 600) * 1000)
    client.zadd(f"{prefix}:nodes", {IMPOSTOR: until})
    client.hset(f"{prefix}:nodeinfo", IMPOSTOR, json.dumps({"role": "bridge", "admin": admin}))


def replayed(api: AdminHttp, captured: Captured) -> tuple[int, dict[str, str]]:
    """Send what the impostor captured, its node-call headers unchanged, to a real node."""
    headers = {k: v for k, v in captured.headers.items() if k.lower().startswith("x-bridge-")}
    path = captured.path.removeprefix("/api/v1")
    status, body, _ = api.request(captured.method, path, token=None, headers=headers)
    return status, body


def test_the_fan_out_sends_an_impostor_no_token_and_nothing_a_real_node_accepts(
    cluster: ClusterLauncher, redis_server: LocalRedis
) -> None:
    node, api = start_cluster_admin_node(cluster, REAL)
    with impostor_server() as impostor, registry(redis_server) as client:
        register_impostor(client, cluster, f"127.0.0.1:{impostor.port}")
        # The console's totals ask every member, the impostor included.
        stats = api.wait_for("/stats", lambda d: any(n["id"] == IMPOSTOR for n in d["nodes"]))
        assert stats["complete"] is False
        (fan_out,) = impostor.wait_for(1)
        # A client the registry says the impostor holds: its lookup is forwarded there.
        client.hset(f"{cluster.name}:c:ghost", mapping={"node": IMPOSTOR, "epoch": 1})
        status, answer = api.get("/clients/ghost")
        assert status == 503 and IMPOSTOR in answer["error"], answer
        forwarded = impostor.wait_for(2)[1]

    for captured in (fan_out, forwarded):
        names = {name.lower() for name in captured.headers}
        assert "authorization" not in names, captured
        assert not any(TOKEN in value for value in captured.headers.values()), captured
        assert captured.headers["X-Bridge-Forwarded-By"] == REAL
        assert captured.headers["X-Bridge-Target"] == IMPOSTOR
    assert (fan_out.method, fan_out.path) == ("GET", "/api/v1/stats")
    assert (forwarded.method, forwarded.path) == ("GET", "/api/v1/clients/ghost")

    # What the impostor holds is bound to the impostor: no real node takes it.
    for captured in (fan_out, forwarded):
        status, refused = replayed(api, captured)
        assert status == 401, refused
        assert refused["error"] == (
            f"node call refused: node call signed for node {IMPOSTOR!r}, but this is node {REAL!r}"
        )
    node.wait_for_log("refused a node call GET /api/v1/stats")


def test_a_real_node_accepts_a_signed_call_once_and_only_where_the_fan_out_calls(
    cluster: ClusterLauncher,
) -> None:
    node, api = start_cluster_admin_node(cluster, REAL)
    signed = node_call_headers("GET", "/search/clients?q=dev", "y", REAL)
    status, answer, _ = api.request("GET", "/search/clients?q=dev", token=None, headers=signed)
    assert (status, answer) == (200, {"items": []})
    status, again, response = api.request(
        "GET", "/search/clients?q=dev", token=None, headers=signed
    )
    assert status == 401 and "replayed (nonce seen before)" in again["error"]
    assert response.getheader("WWW-Authenticate", "").startswith("BridgeNodeSignature")

    # The signature covers the query: the same headers on another search are refused.
    fresh = node_call_headers("GET", "/search/clients?q=dev", "y", REAL)
    status, altered, _ = api.request("GET", "/search/clients?q=de", token=None, headers=fresh)
    assert status == 401 and "wrong signature" in altered["error"]

    # A route the fan-out never calls accepts no node call, even a well-signed one.
    nodes = node_call_headers("GET", "/nodes", "y", REAL)
    status, refused, _ = api.request("GET", "/nodes", token=None, headers=nodes)
    assert status == 401 and refused["error"] == (
        "node call refused: GET /api/v1/nodes does not accept node calls"
    )
    # Refusals in a burst are logged once, then counted.
    lines = [line for line in node.log_text().splitlines() if "refused a node call" in line]
    assert len(lines) == 1, lines
