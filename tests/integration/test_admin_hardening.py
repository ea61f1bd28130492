"""The admin listener against an attacker, on a real node: no request path reaches the file
system (the console's files are an allow-list built at start-up), request bodies are bounded in
size and nesting, slow or idle sockets are closed (`admin_header_timeout`,
`admin_keepalive_timeout`), and the anonymous /ready names the component that is down without
its exception text. Every refusal is a 4xx JSON answer, and the node logs no traceback
(`bridge_factory` checks its log after each test)."""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import select
import socket
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote

import pytest
from aiohttp.test_utils import TestClient, TestServer

from bridge.config import Config
from bridge.operations.admin import API_PREFIX, AdminAPI
from tests.support.admin_http import TOKEN, AdminHttp, start_admin_node
from tests.support.processes import BridgeProcess

pytestmark = pytest.mark.integration

SECRET = b"<p>operator secret: do not serve</p>"


def raw_get(port: int, path: str) -> tuple[int, bytes]:
    """Status and body of GET `path` sent exactly as given (no client-side normalisation)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        conn.putrequest("GET", path, skip_accept_encoding=True)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


# -- the console's static files ----------------------------------------------------------------


def test_console_paths_that_leave_the_console_directory_get_404_and_no_file(
    api: AdminHttp, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.html"
    secret.write_bytes(SECRET)
    absolute = quote(str(secret), safe="")  # /tmp/.../secret.html as one encoded segment
    dotted = quote("../" * 12 + str(secret).lstrip("/"), safe="")
    attempts = [
        f"/console/{absolute}",
        f"/console/{dotted}",
        f"/console/{dotted.replace('.', '%2E')}",
        "/console/..%2F..%2Fconsole%2Findex.html",
        "/console/..%5C..%5Cconsole%5Cindex.html",
        "/console/%2E%2E%2Fadmin_console.py",
        "/console/index.html%00.js",
        "/console/index.html%2F",
    ]
    for path in attempts:
        status, body = raw_get(api.port, path)
        assert status == 404, (path, status, body[:200])
        assert SECRET not in body and b"<html" not in body.lower(), path
        assert json.loads(body)["error"].startswith("no such console file"), path
    # The console itself is still served, by its own names only.
    assert raw_get(api.port, "/console/index.html")[0] == 200
    assert raw_get(api.port, "/console/app.js")[0] == 200


# -- request bodies ------------------------------------------------------------------------------


def test_a_100000_deep_json_body_is_a_400_naming_the_nesting_not_a_500(
    bridge_factory: Callable[..., BridgeProcess],
) -> None:
    # Default packet size: the publish body limit (~1.4 MB) lets the whole deep body in.
    node, api = start_admin_node(bridge_factory, f"admin_token={TOKEN}")
    deep_array = b"[" * 100_000 + b"]" * 100_000
    status, data = api.post("/publish", deep_array)
    assert (status, data) == (400, {"error": "request body: JSON nested deeper than 32 levels"})
    deep_object = b'{"clientid": ' + b'{"a": ' * 8_000 + b"1" + b"}" * 8_001
    for method, path in (("POST", "/banned"), ("PUT", "/limits")):
        status, data, _ = api.request(method, path, deep_object)
        assert (status, data) == (400, {"error": "request body: JSON nested deeper than 32 levels"})
    # Brackets inside strings are text, not nesting: this body is refused for its topic only.
    status, data = api.post("/publish", {"topic": "a/" + "[" * 5000, "payload": "{" * 1000})
    assert status == 200 or "nested" not in data["error"], data
    assert "Traceback" not in node.log_text()


def test_an_oversized_body_is_a_413_naming_the_limit(api: AdminHttp) -> None:
    big = json.dumps({"topic": "t", "payload": "x" * 200_000}).encode()
    status, data = api.post("/publish", big)
    assert status == 413 and data["error"].startswith("request body:"), data
    status, data = api.post("/banned", {"clientid": "c" * 70_000, "seconds": 5})
    assert status == 413 and "over the limit of 65536" in data["error"], data


# -- slow and idle connections -------------------------------------------------------------------

HEADER_TIMEOUT = 0.5
KEEPALIVE_TIMEOUT = 3.0
BODY_TIMEOUT = 0.5


@pytest.fixture
def strict_api(bridge_factory: Callable[..., BridgeProcess]) -> AdminHttp:
    """A node whose admin listener gives a request head 0.5 s, an idle connection 3 s and a
    request body 0.5 s."""
    _node, api = start_admin_node(
        bridge_factory,
        f"admin_token={TOKEN}",
        f"admin_header_timeout={HEADER_TIMEOUT}",
        f"admin_keepalive_timeout={KEEPALIVE_TIMEOUT}",
        f"admin_body_timeout={BODY_TIMEOUT}",
    )
    return api


def seconds_until_closed(sock: socket.socket, limit: float = 10.0) -> float:
    """Block until the server closes `sock` (reading and dropping any answer); the wait."""
    started = time.monotonic()
    sock.settimeout(limit)
    while sock.recv(4096):
        pass
    return time.monotonic() - started


def test_half_a_request_line_is_closed_after_the_header_timeout(strict_api: AdminHttp) -> None:
    with socket.create_connection(("127.0.0.1", strict_api.port)) as sock:
        sock.sendall(b"GET /api/v1/health HT")
        waited = seconds_until_closed(sock)
    assert waited < HEADER_TIMEOUT + 1.0, waited


def test_a_head_trickled_a_byte_at_a_time_is_closed_after_the_header_timeout(
    strict_api: AdminHttp,
) -> None:
    head = b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", strict_api.port)) as sock:
        for byte in head:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break  # closed (reset) by the node
            # Wait for the close (or pace the next byte): the trickle must not keep it open.
            readable, _, _ = select.select([sock], [], [], 0.1)
            try:
                if readable and not sock.recv(4096):
                    break
            except ConnectionResetError:
                break  # closed by the node with bytes of ours still unread: a reset
        waited = time.monotonic() - started
    assert waited < HEADER_TIMEOUT + 1.0, waited


def test_a_silent_connection_is_closed_after_the_header_timeout(strict_api: AdminHttp) -> None:
    with socket.create_connection(("127.0.0.1", strict_api.port)) as sock:
        waited = seconds_until_closed(sock)
    assert waited < HEADER_TIMEOUT + 1.0, waited


def test_an_idle_keep_alive_connection_is_kept_then_closed_after_the_keepalive_timeout(
    strict_api: AdminHttp,
) -> None:
    with socket.create_connection(("127.0.0.1", strict_api.port)) as sock:
        sock.sendall(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(10)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            answer += sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 200")
        answered = time.monotonic()
        while sock.recv(4096):
            pass
        idle = time.monotonic() - answered
    # Idle between requests is the keep-alive's to limit, not the header timeout's.
    assert KEEPALIVE_TIMEOUT - 0.5 <= idle < KEEPALIVE_TIMEOUT + 3, idle


def test_requests_on_a_kept_connection_are_answered_within_the_timeouts(
    strict_api: AdminHttp,
) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", strict_api.port, timeout=10)
    try:
        for _ in range(3):
            conn.request("GET", "/api/v1/health")
            response = conn.getresponse()
            assert response.status == 200 and json.loads(response.read())["status"] == "ok"
    finally:
        conn.close()


def test_a_stalled_body_is_a_408_after_the_body_timeout(strict_api: AdminHttp) -> None:
    head = (
        f"POST /api/v1/banned HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", strict_api.port)) as sock:
        sock.sendall(head.encode() + b'{"clientid": ')
        sock.settimeout(10)
        started = time.monotonic()
        answer = sock.recv(4096)
        waited = time.monotonic() - started
        while answer and not answer.rstrip().endswith(b"}"):
            answer += sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    body = json.loads(answer.partition(b"\r\n\r\n")[2])
    assert body == {"error": f"request body: not received within {BODY_TIMEOUT:g} s"}
    assert waited < BODY_TIMEOUT + 1.5, waited


def answered_on(sock: socket.socket) -> bytes:
    """GET /health on an open connection, kept alive; the answer's head and body."""
    sock.sendall(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
    sock.settimeout(10)
    answer = b""
    while not answer.rstrip().endswith(b"}"):
        chunk = sock.recv(4096)
        if not chunk:
            break
        answer += chunk
    return answer


def test_connections_past_admin_max_connections_are_closed_on_arrival(
    bridge_factory: Callable[..., BridgeProcess],
) -> None:
    node, api = start_admin_node(bridge_factory, f"admin_token={TOKEN}", "admin_max_connections=2")
    with (
        socket.create_connection(("127.0.0.1", api.port)) as first,
        socket.create_connection(("127.0.0.1", api.port)) as second,
    ):
        # Both answered: both are open on the node and count against the cap.
        assert answered_on(first).startswith(b"HTTP/1.1 200")
        assert answered_on(second).startswith(b"HTTP/1.1 200")
        with socket.create_connection(("127.0.0.1", api.port)) as third:
            assert seconds_until_closed(third) < 2.0  # closed at once, long before 10 s
        node.wait_for_log("admin API: refused a connection: admin_max_connections=2 are open")
    # The two closed: the node takes connections again (once it has seen them go).
    deadline = time.monotonic() + 10
    while True:
        with socket.create_connection(("127.0.0.1", api.port)) as again:
            try:
                if answered_on(again).startswith(b"HTTP/1.1 200"):
                    break
            except ConnectionError:  # refused: reset or closed under the request
                pass
        assert time.monotonic() < deadline, "the node took no connection after the two closed"


def test_malformed_requests_get_400_and_one_log_line_without_a_traceback(
    admin_node: tuple[BridgeProcess, AdminHttp],
) -> None:
    node, api = admin_node
    for raw in (
        b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\nNot A Header\r\n\r\n",
        b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 TLS to a plain port\r\n\r\n",
    ):
        with socket.create_connection(("127.0.0.1", api.port)) as sock:
            sock.sendall(raw)
            sock.settimeout(10)
            answer = sock.recv(4096)
        assert answer.split(b" ", 2)[1] == b"400", answer[:200]
    log = node.wait_for_log("admin API: answered 400 to a malformed request from 127.0.0.1")
    assert "Traceback" not in log and "Error handling request" not in log


# -- /metrics ------------------------------------------------------------------------------------


def test_metrics_behind_the_token_when_not_public_and_open_when_public(
    api: AdminHttp, strict_api: AdminHttp
) -> None:
    # `api`: metrics_public=false; `strict_api`: the default, metrics_public=true.
    assert api.get("/metrics", token=None) == (401, {"error": "missing bearer token"})
    assert api.get("/metrics", token="wrong")[0] == 401
    status, text = api.get("/metrics")
    assert status == 200 and "mqtt_bridge_" in text
    status, text = strict_api.get("/metrics", token=None)
    assert status == 200 and "mqtt_bridge_" in text


# -- /ready --------------------------------------------------------------------------------------

REDIS_SECRET = "redis://:hunter2@10.1.2.3:6379 refused (internal detail)"


class _FailingRedis:
    """A registry Redis whose PING fails with an exception that names internals."""

    def __init__(self) -> None:
        self.up = True

    async def ping(self) -> bool:
        if not self.up:
            raise ConnectionRefusedError(REDIS_SECRET)
        return True


def test_ready_names_the_component_that_is_down_without_its_exception(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """In process: a cluster member's /ready with its registry's Redis up, then down."""
    redis = _FailingRedis()
    cluster = SimpleNamespace(leaving=False, registry=SimpleNamespace(redis=redis))
    served = SimpleNamespace(
        config=Config(admin_token=TOKEN),
        node=SimpleNamespace(node_id="n1", accepting=True),
        cluster=cluster,
    )
    admin = AdminAPI(served)  # type: ignore[arg-type]
    admin.ready = True

    async def scenario() -> list[tuple[int, dict[str, Any]]]:
        answers = []
        async with TestClient(TestServer(admin.app)) as client:
            for up in (True, False):
                redis.up = up
                response = await client.get(f"{API_PREFIX}/ready")
                answers.append((response.status, await response.json()))
        return answers

    with caplog.at_level(logging.WARNING, logger="bridge.admin"):
        (up_status, up_body), (down_status, down_body) = asyncio.run(scenario())
    assert (up_status, up_body) == (200, {"status": "ready", "node": "n1", "redis": "ok"})
    assert down_status == 503
    assert down_body == {
        "status": "not ready",
        "node": "n1",
        "redis": "unavailable",
        "error": "the cluster registry (Redis) is unavailable",
    }
    assert "hunter2" not in json.dumps(down_body)
    assert REDIS_SECRET in caplog.text  # the operator finds the cause in the log
