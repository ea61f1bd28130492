"""The admin listener against an attacker, on a real node: no request path reaches the file
system (the console's files are an allow-list built at start-up), request bodies are bounded in
size and nesting, slow or idle sockets are closed (`admin_header_timeout`,
`admin_keepalive_timeout`), and the anonymous /ready names the component that is down without
its exception text. Every refusal is a 4xx JSON answer, and the node logs no traceback
(`bridge_factory` checks its log after each test)."""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.integration.admin_http import TOKEN, AdminHttp, start_admin_node
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
