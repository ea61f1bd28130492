"""The admin listener against an attacker, on a real node: no request path reaches the file
system (the console's files are an allow-list built at start-up), request bodies are bounded in
size and nesting, slow or idle sockets are closed (`admin_header_timeout`,
`admin_keepalive_timeout`), and the anonymous /ready names the component that is down without
its exception text. Every refusal is a 4xx JSON answer, and the node logs no traceback
(`bridge_factory` checks its log after each test)."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.integration.admin_http import AdminHttp

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
