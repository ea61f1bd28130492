"""The admin HTTP API against a real bridge process: the API as a whole. The probes (/health,
/ready) without a token, the token rules on every protected endpoint, JSON errors for unknown
routes and methods, the OpenAPI document against the application's routes and real answers,
/metrics behind the token unless public, the generated token file, and /ready during a drain
(in process, where the drain can be held open).

The endpoint groups are in test_admin_clients.py (/nodes, /connections/count, /clients) and
test_admin_messages.py (/subscriptions, /retained, /publish); the client in
tests/support/admin_http.py, the fixtures in conftest.py."""

from __future__ import annotations

import asyncio
import gc
import http.client
import json
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest

from bridge.checks import load_config
from bridge.config import Config
from bridge.listeners.server import Server
from bridge.operations.admin import API_PREFIX, ROUTES, AdminAPI
from tests.support.admin_http import TOKEN, AdminHttp, node_call_headers, start_admin_node
from tests.support.clients import RawClient
from tests.support.processes import BridgeProcess, free_port, wait_for_port

pytestmark = pytest.mark.integration


def example_path(route_path: str) -> str:
    """A concrete path for a route, its parameters filled in."""
    return re.sub(r"\{[^}]+\}", "x", route_path)


# -- probes, token, errors, the OpenAPI document ---------------------------------------------------


def test_health_and_ready_answer_without_a_token(api: AdminHttp) -> None:
    status, health = api.get("/health", token=None)
    assert status == 200 and health["status"] == "ok" and health["node"]
    status, ready = api.get("/ready", token=None)
    assert status == 200 and ready == {"status": "ready", "node": health["node"]}
    assert api.get("/health?verbose=1", token=None)[0] == 400


def test_every_protected_endpoint_refuses_a_missing_or_wrong_token(api: AdminHttp) -> None:
    protected = [r for r in ROUTES if not r.public]
    assert protected
    for route in protected:
        path = example_path(route.path)
        for token, error in ((None, "missing bearer token"), ("wrong", "invalid bearer token")):
            status, data, response = api.request(route.method, path, b"{}", token=token)
            assert status == 401, (route, token, data)
            assert data == {"error": error}
            assert response.getheader("WWW-Authenticate", "").startswith("Bearer")
        status, data, _ = api.request(
            route.method, path, headers={"Authorization": f"Basic {TOKEN}"}, token=None
        )
        assert status == 401, (route, data)
        status, data, _ = api.request(route.method, path, token=TOKEN + "x")
        assert status == 401, (route, data)


def test_unknown_routes_and_methods_answer_json_errors(api: AdminHttp) -> None:
    assert api.get("/no/such/thing") == (
        404,
        {"error": f"no such endpoint: {API_PREFIX}/no/such/thing"},
    )
    status, data, response = api.request("PUT", "/publish")
    assert status == 405 and "PUT" in data["error"]
    assert response.getheader("Allow") == "POST"
    status, data, _ = api.request("POST", "/clients")
    assert status == 405 and set(data) == {"error"}
    conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=10)
    conn.request("GET", "/", headers={"Authorization": f"Bearer {TOKEN}"})
    response = conn.getresponse()
    assert response.status == 404
    assert json.loads(response.read()) == {"error": "no such endpoint: /"}
    conn.close()


def test_a_node_without_a_cluster_secret_refuses_every_node_call(api: AdminHttp) -> None:
    signed = node_call_headers("GET", "/stats", "a", "b")
    status, body, _ = api.request("GET", "/stats", token=None, headers=signed)
    assert status == 401 and body["error"] == (
        "node call refused: this node has no cluster secret: it accepts no node calls"
    )
    # With the operator's token beside it, it is still judged as a node call, and refused.
    assert api.request("GET", "/stats", headers=signed)[0] == 401


def test_openapi_document_describes_exactly_the_routes_of_the_application(api: AdminHttp) -> None:
    status, spec = api.get("/openapi.json", token=None)
    assert status == 200 and spec["openapi"].startswith("3.1")
    assert spec["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    app = AdminAPI(SimpleNamespace(config=Config())).app  # type: ignore[arg-type]
    in_app = set()
    for route in app.router.routes():
        if route.method == "HEAD":
            continue  # aiohttp adds HEAD to every GET
        path = re.sub(r"\{(\w+)(:[^}]*)?\}", r"{\1}", route.resource.canonical)
        if path.startswith(API_PREFIX + "/"):  # not the console's static files (/console/)
            in_app.add((route.method, path))
    methods = {"get", "put", "post", "delete", "patch", "head", "options"}
    in_spec = {
        (method.upper(), path)
        for path, operations in spec["paths"].items()
        for method in operations
        if method in methods
    }
    assert in_app == in_spec
    assert len(in_app) == len([r for r in ROUTES if r.prefix == API_PREFIX])
    public = {(r.method, API_PREFIX + r.path) for r in ROUTES if r.public}
    node_callable = {
        (r.method, API_PREFIX + re.sub(r"\{(\w+)(:[^}]*)?\}", r"{\1}", r.path))
        for r in ROUTES
        if r.node_calls
    }
    signed = {
        (method.upper(), path)
        for path, operations in spec["paths"].items()
        for method, operation in operations.items()
        if {"nodeSignature": []} in operation.get("security", [])
    }
    assert signed == node_callable  # other members call exactly these
    assert ("GET", f"{API_PREFIX}/stats") in signed and ("GET", f"{API_PREFIX}/nodes") not in signed
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            assert "200" in operation["responses"], (method, path)
            declared = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
            assert declared == set(re.findall(r"\{(\w+)\}", path)), (method, path)
            if (method.upper(), path) in public:
                assert operation["security"] == []
            else:
                assert "401" in operation["responses"], (method, path)
    publish = spec["paths"][f"{API_PREFIX}/publish"]["post"]
    assert publish["requestBody"]["content"]["application/json"]["schema"]
    for ref in re.findall(r'"\$ref": "#/([^"]+)"', json.dumps(spec)):
        target = spec
        for part in ref.split("/"):
            target = target[part]  # every reference resolves


def test_json_answers_are_described_by_the_documents_schemas(
    api: AdminHttp, mqtt_port: int
) -> None:
    """The top-level fields of real answers are the ones the OpenAPI schemas require."""
    schemas = api.get("/openapi.json", token=None)[1]["components"]["schemas"]
    client = RawClient(mqtt_port)
    client.connect("described")
    answers = {
        "Client": api.get("/clients/described")[1],
        "ClientSummary": api.get("/clients")[1]["items"][0],
        "Kicked": api.delete("/clients/described")[1],
        "Health": api.get("/health")[1],
        "NodeList": api.get("/nodes")[1],
        "Node": api.get("/nodes")[1]["nodes"][0],
        "ConnectionCount": api.get("/connections/count")[1],
        "ClientPage": api.get("/clients")[1],
        "SubscriptionPage": api.get("/subscriptions")[1],
        "RetainedPage": api.get("/retained")[1],
        "PublishResult": api.post("/publish", {"topic": "s/t", "payload": "p", "retain": True})[1],
        "Error": api.get("/clients/none")[1],
    }
    for name, answer in answers.items():
        assert set(answer) == set(schemas[name]["properties"]), name
    retained = api.get("/retained/s/t")[1]
    described = set(schemas["RetainedSummary"]["properties"])
    for part in schemas["RetainedMessage"]["allOf"][1:]:
        described |= set(part["properties"])
    assert set(retained) == described


def test_metrics_need_the_token_unless_public(
    api: AdminHttp, bridge_factory: Callable[..., BridgeProcess]
) -> None:
    assert api.get("/metrics", token=None)[0] == 401
    status, data = api.get("/metrics")
    # 404 until the server provides `metrics_text`, then the text exposition.
    assert (status, data) == (404, {"error": "metrics are not available on this node"}) or (
        status == 200 and isinstance(data, str)
    )
    _, public = start_admin_node(bridge_factory, f"admin_token={TOKEN}")
    assert public.get("/metrics", token=None)[0] in (200, 404)


def test_a_generated_token_is_written_mode_0600_and_never_logged(
    bridge_factory: Callable[..., BridgeProcess], tmp_path: Path
) -> None:
    data_dir = tmp_path / "generated"
    port = free_port()
    node = bridge_factory(f"admin_listen=127.0.0.1:{port}", data_dir=data_dir)
    wait_for_port(port, proc=node.proc)
    token_file = data_dir / "admin-token"
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
    token = token_file.read_text().strip()
    assert len(token) >= 32
    api = AdminHttp(port, token)
    assert api.get("/nodes")[0] == 200
    assert api.get("/nodes", token=TOKEN)[0] == 401
    api.post("/publish", {"topic": "t", "payload": "x"})
    log = node.wait_for_log("admin API token generated into")
    assert str(token_file) in log
    assert token not in log
    node.stop()
    assert token not in node.log_text()


# -- readiness during a drain ----------------------------------------------------------------------


def test_ready_answers_503_while_the_node_drains(tmp_path: Path) -> None:
    """In process: the drain (here: closing the store) is held open until /ready was asked, so
    the 503 is seen every time, not only when a request happens to land in a short window."""
    admin_port = free_port()
    config = load_config(
        env={},
        overrides={
            "listen": [f"127.0.0.1:{free_port()}"],
            "data_dir": str(tmp_path / "data"),
            "admin_listen": f"127.0.0.1:{admin_port}",
            "admin_token": TOKEN,
        },
    )
    base = f"http://127.0.0.1:{admin_port}{API_PREFIX}"

    async def status_of(http: aiohttp.ClientSession, path: str) -> tuple[int, Any]:
        async with http.get(base + path) as response:
            return response.status, await response.json()

    async def scenario() -> None:
        server = Server(config)
        await server.start()
        node_stop = server.node.stop
        draining = asyncio.Event()
        release = asyncio.Event()

        async def held_stop() -> None:
            draining.set()
            await release.wait()
            await node_stop()

        server.node.stop = held_stop  # type: ignore[method-assign]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            assert (await status_of(http, "/ready"))[0] == 200
            shutdown = asyncio.get_running_loop().create_task(server.shutdown())
            try:
                await asyncio.wait_for(draining.wait(), 10)
                status, body = await status_of(http, "/ready")
                assert status == 503 and body["status"] == "not ready" and body["error"]
                assert (await status_of(http, "/health"))[0] == 200
            finally:
                release.set()
                await asyncio.wait_for(shutdown, 20)
            with pytest.raises(aiohttp.ClientConnectionError):
                await status_of(http, "/health")

    thresholds = gc.get_threshold()
    try:
        asyncio.run(scenario())
    finally:
        gc.unfreeze()  # Server.start froze this test process's heap
        gc.set_threshold(*thresholds)
