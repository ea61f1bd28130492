"""The listeners' guards on a real bridge process: failed TLS handshakes (plain TCP bytes on the
TLS port, a client that does not trust the server's certificate, on tls_listen and wss_listen)
are counted and logged at most once per `tls_failure_log_interval`, with the number suppressed;
and WebSocket upgrades from a browser page of another origin get HTTP 403 and a log line, while
clients without Origin, pages of the same host and allowed origins are upgraded."""

from __future__ import annotations

import base64
import os
import socket
import ssl
import time
from collections.abc import Callable

import pytest

from tests.integration.test_listeners import TIMEOUT, Certs, connected, start_with_every_listener
from tests.integration.test_listeners import certs as certs  # the fixture
from tests.support.admin_http import TOKEN, AdminHttp
from tests.support.processes import BridgeProcess, free_port, wait_for_port

pytestmark = pytest.mark.integration

FAILED = "TLS handshake with 127.0.0.1:"


def metric(api: AdminHttp, name: str) -> float:
    status, text = api.get("/metrics")
    assert status == 200
    for line in text.splitlines():
        if line.startswith(f"mqtt_bridge_{name} "):
            return float(line.split()[1])
    raise AssertionError(f"mqtt_bridge_{name} not in /metrics")


def wait_metric(api: AdminHttp, name: str, value: float, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while (seen := metric(api, name)) != value:
        assert time.monotonic() < deadline, f"mqtt_bridge_{name} is {seen}, not {value}"
        time.sleep(0.1)


def admin(bridge_factory: Callable[..., BridgeProcess], *settings: str) -> Callable[..., object]:
    """`bridge_factory` with the admin API added to every node it starts; `.api` after."""
    port = free_port()

    def factory(*more: str, **kw: object) -> BridgeProcess:
        node = bridge_factory(
            f"admin_listen=127.0.0.1:{port}", f"admin_token={TOKEN}", *settings, *more, **kw
        )
        wait_for_port(port, proc=node.proc)
        return node

    factory.api = AdminHttp(port)  # type: ignore[attr-defined]
    return factory


def plain_bytes_to(port: int) -> None:
    """What a client that forgot TLS sends: an MQTT CONNECT in clear text."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        sock.sendall(b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00")
        sock.settimeout(TIMEOUT)
        try:
            while sock.recv(4096):
                pass
        except OSError:
            pass  # reset by the server: what we expect


def distrustful_client_to(port: int) -> None:
    """A TLS client that trusts only the system CAs, not the test CA of the server."""
    context = ssl.create_default_context()
    with (
        socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as raw,
        pytest.raises(ssl.SSLCertVerificationError),
    ):
        context.wrap_socket(raw, server_hostname="localhost")


def test_failed_tls_handshakes_are_counted_and_logged_once_per_interval_with_the_rest_counted(
    bridge_factory: Callable[..., BridgeProcess], certs: Certs
) -> None:
    factory = admin(bridge_factory, "tls_failure_log_interval=3")
    listeners = start_with_every_listener(factory, certs)
    api: AdminHttp = factory.api  # type: ignore[attr-defined]
    node = listeners.node
    plain_bytes_to(listeners.ports["tls"])
    distrustful_client_to(listeners.ports["tls"])
    plain_bytes_to(listeners.ports["wss"])
    wait_metric(api, "tls_handshake_failures_total", 3)
    # start_with_every_listener's probes of the two ports opened and closed: not failures.
    assert metric(api, "tls_handshakes_abandoned_total") == 2
    lines = [line for line in node.log_text().splitlines() if FAILED in line]
    assert len(lines) == 1, lines  # the first; the two after it within 3 s are only counted
    assert "WARNING bridge.tls" in lines[0] and "more failed" not in lines[0]
    time.sleep(3.2)
    distrustful_client_to(listeners.ports["wss"])
    wait_metric(api, "tls_handshake_failures_total", 4)
    text = node.wait_for_log("(2 more failed since the last line)")
    lines = [line for line in text.splitlines() if FAILED in line]
    assert len(lines) == 2 and "unknown ca" in lines[1].lower(), lines
    # Good clients are served as before, on both TLS listeners.
    for kind in ("tls", "wss"):
        with connected(listeners, kind, certs) as client:
            client.subscribe(f"after/{kind}", 1)
    assert metric(api, "tls_handshake_failures_total") == 4


def test_a_tls_client_that_never_finishes_its_handshake_is_dropped_and_counted(
    bridge_factory: Callable[..., BridgeProcess], certs: Certs
) -> None:
    factory = admin(bridge_factory, "connect_timeout=1")
    listeners = start_with_every_listener(factory, certs)
    api: AdminHttp = factory.api  # type: ignore[attr-defined]
    with socket.create_connection(("127.0.0.1", listeners.ports["tls"]), timeout=TIMEOUT) as sock:
        sock.settimeout(TIMEOUT)
        assert sock.recv(100) == b"", "the server should close a silent TLS connection"
    wait_metric(api, "tls_handshake_failures_total", 1)
    listeners.node.wait_for_log("SSL handshake is taking longer than 1.0 seconds")


# -- WebSocket Origin ------------------------------------------------------------------------------


def upgrade(port: int, origin: str | None, host: str) -> str:
    """Send a WebSocket upgrade for /mqtt; the status line of the answer."""
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [
        "GET /mqtt HTTP/1.1",
        f"Host: {host}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
        "Sec-WebSocket-Protocol: mqtt",
    ]
    if origin is not None:
        lines.append(f"Origin: {origin}")
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        sock.settimeout(TIMEOUT)
        answer = b""
        while b"\r\n" not in answer:
            data = sock.recv(4096)
            if not data:
                break
            answer += data
    return answer.split(b"\r\n", 1)[0].decode()


def test_websocket_upgrades_from_other_origins_get_403_and_a_log_line(
    bridge_factory: Callable[..., BridgeProcess], certs: Certs
) -> None:
    factory = admin(bridge_factory, "ws_allowed_origins=https://console.example")
    listeners = start_with_every_listener(factory, certs)
    api: AdminHttp = factory.api  # type: ignore[attr-defined]
    port = listeners.ports["ws"]
    host = f"127.0.0.1:{port}"
    switching = "HTTP/1.1 101 Switching Protocols"
    assert upgrade(port, None, host) == switching  # paho, devices: no Origin
    assert upgrade(port, "http://127.0.0.1:18083", host) == switching  # the same host
    assert upgrade(port, "https://console.example", host) == switching  # allowed
    assert upgrade(port, "https://evil.example", host) == "HTTP/1.1 403 Forbidden"
    assert upgrade(port, "null", host) == "HTTP/1.1 403 Forbidden"
    line = listeners.node.wait_for_log("HTTP 403: Origin 'https://evil.example' not allowed")
    assert "ws_allowed_origins" in line
    assert metric(api, "websocket_origin_refused_total") == 2
    # The browser-less clients of every listener are served as before.
    with connected(listeners, "ws", certs) as client:
        client.subscribe("origin/ok", 0)
