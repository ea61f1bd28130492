"""Peer links over mutual TLS with a cluster CA, without a shared secret: nodes holding
certificates of the CA link and carry messages; a certificate of another CA, or none, gets no
link; a certificate of the cluster CA claiming another node's id gets no link either. Every
refusal is logged with the remote address."""

from __future__ import annotations

import contextlib
import socket
import ssl
from pathlib import Path

import pytest

from bridge.cluster import wire
from bridge.cluster.wire import encode
from tests.support.certs import issue, make_ca, write
from tests.support.clients import paho_client
from tests.support.cluster import ClusterLauncher, wait_for_route

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(180)]


def tls_settings(directory: Path, node_id: str, ca_path: Path, ca: object) -> list[str]:
    cert, key = write(directory, node_id, issue(ca, node_id))  # type: ignore[arg-type]
    return [
        "cluster_secret=",  # TLS alone authenticates these links
        f"peer_tls_certfile={cert}",
        f"peer_tls_keyfile={key}",
        f"peer_tls_cafile={ca_path}",
    ]


def client_context(
    ca_path: Path, cert: Path | None = None, key: Path | None = None
) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca_path))
    context.check_hostname = False
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


def test_nodes_with_certificates_of_the_cluster_ca_link_and_strangers_do_not(
    cluster: ClusterLauncher, tmp_path: Path
) -> None:
    ca = make_ca("cluster CA")
    ca_path, _ = write(tmp_path, "ca", ca)
    a = cluster.start("a", *tls_settings(tmp_path, "a", ca_path, ca))
    b = cluster.start("b", *tls_settings(tmp_path, "b", ca_path, ca), "peer_handshake_timeout=2")
    cluster.wait_linked()
    with paho_client(b.port) as sub, paho_client(a.port) as pub:
        sub.client.subscribe("tls/#", 0)
        wait_for_route(lambda p: pub.client.publish("tls/probe", p), sub)

    port = cluster.peer_ports["b"]
    # A certificate of another CA: the TLS handshake fails, logged by the node.
    other = make_ca("some other CA")
    cert, key = write(tmp_path, "rogue", issue(other, "a"))
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        try:
            with client_context(ca_path, cert, key).wrap_socket(raw) as tls:
                tls.sendall(encode(wire.AddFilters(("#",))))
                while chunk := tls.recv(4096):
                    received += chunk
        except (ssl.SSLError, OSError):
            pass  # refused during or right after the handshake, as TLS 1.3 may report it
    assert received == b""
    b.wait_for_log("TLS handshake with 127.0.0.1:")
    # A real certificate of the cluster CA, for node "c", claiming to be "a".
    cert, key = write(tmp_path, "c", issue(ca, "c"))
    received = b""
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    with client_context(ca_path, cert, key).wrap_socket(raw) as tls:
        tls.sendall(encode(wire.Hello(wire.VERSION, "a", "x", b"n" * 32)))
        tls.sendall(encode(wire.AddFilters(("#",))))
        with contextlib.suppress(OSError):  # closed by an abort: a reset
            while chunk := tls.recv(4096):
                received += chunk
    decoder = wire.PeerDecoder()
    decoder.receive_data(received)
    assert [type(f).__name__ for f in decoder.frames()] == ["Hello"]
    b.wait_for_log("its certificate names ['c'], not a")
    assert "Traceback" not in b.log_text()
