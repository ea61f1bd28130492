"""The TLS, WebSocket and secure WebSocket listeners of a real bridge process, with paho-mqtt
and raw TLS sockets as clients and certificates the test makes (a CA, a server certificate for
127.0.0.1/localhost, client certificates from that CA and from another one)."""

from __future__ import annotations

import datetime
import ipaddress
import queue
import socket
import ssl
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from paho.mqtt.enums import CallbackAPIVersion

from bridge.mqtt import codec
from bridge.mqtt.codec import Decoder
from bridge.mqtt.packets import Connack, ConnackCode, Connect, Pingreq, Pingresp
from tests.support.clients import stop_paho
from tests.support.processes import REPO, BridgeProcess, free_port, free_ports, wait_for_port

pytestmark = pytest.mark.integration

TIMEOUT = 10.0

# -- certificates --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Certs:
    """PEM files: `ca` signs the server, `device` (CN device-7) and `neighbour` (CN device-8);
    `rogue` (also CN device-7) comes from another CA the bridge does not trust."""

    ca: Path
    server: Path
    server_key: Path
    device: Path
    device_key: Path
    rogue: Path
    rogue_key: Path
    neighbour: Path
    neighbour_key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _issue(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
    extensions: list[tuple[x509.ExtensionType, bool]],
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    issuer_name = issuer[0].subject if issuer else _name(subject)
    signing_key = issuer[1] if issuer else key
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signing_key.public_key()), False
        )
    )
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical)
    return builder.sign(signing_key, hashes.SHA256())


def _usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _make_ca(cn: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _issue(
        cn,
        key,
        None,
        [(x509.BasicConstraints(ca=True, path_length=0), True), (_usage(ca=True), True)],
    )
    return cert, key


def _leaf(
    cn: str,
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    purpose: x509.ObjectIdentifier,
    san: list[x509.GeneralName] | None = None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    extensions: list[tuple[x509.ExtensionType, bool]] = [
        (x509.BasicConstraints(ca=False, path_length=None), True),
        (_usage(ca=False), True),
        (x509.ExtendedKeyUsage([purpose]), False),
    ]
    if san:
        extensions.append((x509.SubjectAlternativeName(san), False))
    return _issue(cn, key, ca, extensions), key


def _write(
    directory: Path, name: str, pair: tuple[x509.Certificate, ec.EllipticCurvePrivateKey]
) -> tuple[Path, Path]:
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}.key"
    cert_path.write_bytes(pair[0].public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        pair[1].private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    directory = tmp_path_factory.mktemp("certs")
    ca = _make_ca("bridge test CA")
    other_ca = _make_ca("some other CA")
    san = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    ca_path, _ = _write(directory, "ca", ca)
    server = _write(
        directory, "server", _leaf("localhost", ca, ExtendedKeyUsageOID.SERVER_AUTH, san)
    )
    device = _write(directory, "device", _leaf("device-7", ca, ExtendedKeyUsageOID.CLIENT_AUTH))
    rogue = _write(directory, "rogue", _leaf("device-7", other_ca, ExtendedKeyUsageOID.CLIENT_AUTH))
    neighbour = _write(
        directory, "neighbour", _leaf("device-8", ca, ExtendedKeyUsageOID.CLIENT_AUTH)
    )
    return Certs(ca_path, *server, *device, *rogue, *neighbour)


# -- a bridge with every listener ----------------------------------------------------------------


@dataclass
class Listeners:
    """A running bridge and the port of each of its listeners, by transport kind."""

    node: BridgeProcess
    ports: dict[str, int]


def start_with_every_listener(
    factory: Callable[..., BridgeProcess], certs: Certs, *settings: str
) -> Listeners:
    """A bridge listening for MQTT over TCP, TLS, WebSocket and secure WebSocket."""
    tcp, tls, ws, wss = free_ports(4)
    ports = {"tls": tls, "ws": ws, "wss": wss}
    node = factory(
        f"tls_listen=127.0.0.1:{ports['tls']}",
        f"ws_listen=127.0.0.1:{ports['ws']}",
        f"wss_listen=127.0.0.1:{ports['wss']}",
        f"tls_certfile={certs.server}",
        f"tls_keyfile={certs.server_key}",
        f"tls_cafile={certs.ca}",
        *settings,
        port=tcp,
    )
    for port in ports.values():
        wait_for_port(port, timeout=TIMEOUT, proc=node.proc)
    node.wait_for_log("listening for MQTT over secure WebSocket")
    return Listeners(node, {"tcp": node.port, **ports})


# -- clients -------------------------------------------------------------------------------------


class Client:
    """A connected paho-mqtt client (MQTT 3.1.1) over one transport kind (tcp, tls, ws, wss),
    its network loop in a thread; every wait is bounded."""

    def __init__(
        self,
        listeners: Listeners,
        kind: str,
        certs: Certs,
        *,
        client_id: str | None = None,
        clean_session: bool = True,
        client_cert: tuple[Path, Path] | None = None,
    ) -> None:
        self.paho = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id or f"{kind}-{uuid.uuid4().hex[:8]}",
            clean_session=clean_session,
            protocol=paho.MQTTv311,
            transport="websockets" if kind in ("ws", "wss") else "tcp",
        )
        if kind in ("ws", "wss"):
            self.paho.ws_set_options(path="/mqtt")
        if kind in ("tls", "wss"):
            cert, key = client_cert or (None, None)
            self.paho.tls_set(
                ca_certs=str(certs.ca),
                certfile=str(cert) if cert else None,
                keyfile=str(key) if key else None,
            )
        self.messages: queue.Queue[paho.MQTTMessage] = queue.Queue()
        self.connected = threading.Event()
        self.connack: list[tuple[Any, bool]] = []
        self.subacks: dict[int, threading.Event] = {}
        self.paho.on_connect = self._on_connect
        self.paho.on_subscribe = self._on_subscribe
        self.paho.on_message = lambda _c, _u, message: self.messages.put(message)
        self.paho.connect("127.0.0.1", listeners.ports[kind], keepalive=30)
        self.paho.loop_start()
        assert self.connected.wait(TIMEOUT), f"no CONNACK over {kind}"

    def _on_connect(self, _c: Any, _u: Any, flags: Any, reason: Any, _p: Any) -> None:
        self.connack.append((reason, flags.session_present))
        self.connected.set()

    def _on_subscribe(self, _c: Any, _u: Any, mid: int, _codes: Any, _p: Any) -> None:
        self.subacks.setdefault(mid, threading.Event()).set()

    def subscribe(self, topic_filter: str, qos: int) -> None:
        result, mid = self.paho.subscribe(topic_filter, qos)
        assert result == paho.MQTT_ERR_SUCCESS and mid is not None
        assert self.subacks.setdefault(mid, threading.Event()).wait(TIMEOUT), "no SUBACK"

    def publish(self, topic: str, payload: bytes, qos: int) -> None:
        """Publish and wait until the handshake of `qos` is complete."""
        info = self.paho.publish(topic, payload, qos)
        info.wait_for_publish(TIMEOUT)
        assert info.is_published(), f"QoS {qos} publish to {topic} not completed"

    def get(self) -> paho.MQTTMessage:
        return self.messages.get(timeout=TIMEOUT)

    def close(self) -> None:
        try:
            self.paho.disconnect()
        finally:
            stop_paho(self.paho)


@contextmanager
def connected(listeners: Listeners, kind: str, certs: Certs, **options: Any) -> Iterator[Client]:
    client = Client(listeners, kind, certs, **options)
    try:
        assert client.connack[0][0] == 0, client.connack
        yield client
    finally:
        client.close()


def tls_socket(port: int, certs: Certs, client_cert: tuple[Path, Path] | None) -> ssl.SSLSocket:
    """A TLS connection to 127.0.0.1:port that trusts the test CA (raises if the handshake
    fails on our side)."""
    context = ssl.create_default_context(cafile=str(certs.ca))
    if client_cert is not None:
        context.load_cert_chain(str(client_cert[0]), str(client_cert[1]))
    raw = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    try:
        return context.wrap_socket(raw, server_hostname="localhost")
    except BaseException:
        raw.close()
        raise


def tls_connect(
    port: int, certs: Certs, client_cert: tuple[Path, Path] | None, client_id: str
) -> Connack:
    """CONNECT (no user name, no password) over raw TLS; the CONNACK. Raises ssl.SSLError or
    ConnectionError when the server refuses the TLS connection instead."""
    with tls_socket(port, certs, client_cert) as sock:
        sock.sendall(codec.encode(Connect(client_id)))
        decoder = Decoder()
        while True:
            data = sock.recv(4096)  # a TLS 1.3 server refuses the client cert only now
            if not data:
                raise ConnectionError("server closed the TLS connection without a CONNACK")
            decoder.feed(data)
            packets = decoder.packets()
            if packets:
                assert isinstance(packets[0], Connack), packets
                return packets[0]


# -- round trips ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["tls", "ws", "wss"])
def test_publish_subscribe_round_trip_at_qos_0_1_2(bridge_factory, certs, kind):
    listeners = start_with_every_listener(bridge_factory, certs)
    with (
        connected(listeners, kind, certs) as subscriber,
        connected(listeners, kind, certs) as publisher,
    ):
        for qos in (0, 1, 2):
            subscriber.subscribe(f"rt/{qos}", qos)
            payload = f"over {kind} at QoS {qos}".encode() * 50
            publisher.publish(f"rt/{qos}", payload, qos)
            message = subscriber.get()
            assert (message.topic, message.payload, message.qos) == (f"rt/{qos}", payload, qos)


def test_messages_cross_between_tcp_tls_ws_and_wss_clients(bridge_factory, certs):
    listeners = start_with_every_listener(bridge_factory, certs)
    kinds = ["tcp", "tls", "ws", "wss"]
    subscribers = [Client(listeners, kind, certs) for kind in kinds]
    try:
        for subscriber in subscribers:
            subscriber.subscribe("cross/#", 1)
        for kind in kinds:
            with connected(listeners, kind, certs) as publisher:
                publisher.publish(f"cross/{kind}", f"from {kind}".encode(), 1)
        for kind, subscriber in zip(kinds, subscribers, strict=True):
            got = sorted(subscriber.get().payload for _ in kinds)
            assert got == sorted(f"from {k}".encode() for k in kinds), f"subscriber on {kind}"
    finally:
        for subscriber in subscribers:
            subscriber.close()


def test_persistent_session_resumed_over_another_transport_gets_what_queued_offline(
    bridge_factory, certs
):
    listeners = start_with_every_listener(bridge_factory, certs)
    with connected(listeners, "wss", certs, client_id="roamer", clean_session=False) as roamer:
        roamer.subscribe("fleet/roamer/#", 1)
    with connected(listeners, "tcp", certs) as publisher:
        for i in range(3):
            publisher.publish(f"fleet/roamer/{i}", f"queued {i}".encode(), 1)
    with connected(listeners, "tls", certs, client_id="roamer", clean_session=False) as roamer:
        assert roamer.connack[0][1] is True, "session_present"
        assert [roamer.get().payload for _ in range(3)] == [b"queued 0", b"queued 1", b"queued 2"]
    with connected(listeners, "ws", certs, client_id="roamer", clean_session=False) as roamer:
        assert roamer.connack[0][1] is True, "session_present"


# -- client certificates -------------------------------------------------------------------------


def test_required_client_certificate_refuses_none_and_a_foreign_ca_and_accepts_ours(
    bridge_factory, certs
):
    listeners = start_with_every_listener(bridge_factory, certs, "tls_client_cert=required")
    tls_port = listeners.ports["tls"]
    for refused in (None, (certs.rogue, certs.rogue_key)):
        with pytest.raises((ssl.SSLError, ConnectionError)):
            tls_connect(tls_port, certs, refused, "refused")
    device = (certs.device, certs.device_key)
    assert tls_connect(tls_port, certs, device, "device-7").return_code == ConnackCode.ACCEPTED
    with connected(listeners, "wss", certs, client_cert=device) as client:
        client.subscribe("wss/cert", 0)


def test_certificate_cn_is_the_user_name_and_a_tls_client_without_one_gets_connack_5(
    bridge_factory, certs
):
    # Needs the node to authenticate `Connection.cert_cn` when tls_cn_as_username is set.
    listeners = start_with_every_listener(
        bridge_factory,
        certs,
        "tls_client_cert=optional",
        "tls_cn_as_username=true",
        "allow_anonymous=false",
    )
    tls_port = listeners.ports["tls"]
    device = (certs.device, certs.device_key)
    assert tls_connect(tls_port, certs, device, "with-cert").return_code == ConnackCode.ACCEPTED
    connack = tls_connect(tls_port, certs, None, "no-cert")
    assert connack.return_code == ConnackCode.NOT_AUTHORIZED


def test_a_certificate_identity_owns_its_connection_and_another_certificate_is_refused(
    bridge_factory, certs
):
    listeners = start_with_every_listener(
        bridge_factory,
        certs,
        "tls_client_cert=optional",
        "tls_cn_as_username=true",
        "allow_anonymous=false",
    )
    tls_port = listeners.ports["tls"]
    with tls_socket(tls_port, certs, (certs.device, certs.device_key)) as owner:
        owner.sendall(codec.encode(Connect("press-3")))
        decoder = Decoder()
        decoder.feed(owner.recv(4096))
        (connack,) = decoder.packets()
        assert connack.return_code == ConnackCode.ACCEPTED
        neighbour = (certs.neighbour, certs.neighbour_key)
        refused = tls_connect(tls_port, certs, neighbour, "press-3")
        assert refused.return_code == ConnackCode.NOT_AUTHORIZED
        owner.sendall(codec.encode(Pingreq()))
        decoder.feed(owner.recv(4096))
        assert [type(p) for p in decoder.packets()] == [Pingresp]
    refusal = "its session belongs to user 'device-7', not to user 'device-8'"
    assert refusal in listeners.node.log_text()


# -- configuration and HTTP faults ---------------------------------------------------------------


def run_bridge_check(tmp_path: Path, *settings: str) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "bridge", "--listen", f"127.0.0.1:{free_port()}"]
    args += ["--data-dir", str(tmp_path / "data")]
    for setting in settings:
        args += ["--set", setting]
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=60)


def test_missing_tls_certfile_exits_2_naming_the_file(tmp_path, certs):
    result = run_bridge_check(
        tmp_path,
        f"tls_listen=127.0.0.1:{free_port()}",
        f"tls_certfile={tmp_path / 'nope.pem'}",
        f"tls_keyfile={certs.server_key}",
    )
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert "configuration error" in line
    assert f"tls_certfile {tmp_path / 'nope.pem'}" in line


def test_key_not_matching_the_certificate_exits_2_naming_both_files(tmp_path, certs):
    result = run_bridge_check(
        tmp_path,
        f"wss_listen=127.0.0.1:{free_port()}",
        f"tls_certfile={certs.server}",
        f"tls_keyfile={certs.device_key}",
    )
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert str(certs.server) in line and str(certs.device_key) in line


def test_client_certificates_without_a_tls_listener_exit_2(tmp_path, certs):
    result = run_bridge_check(
        tmp_path,
        f"ws_listen=127.0.0.1:{free_port()}",
        "tls_client_cert=optional",
        f"tls_cafile={certs.ca}",
    )
    assert result.returncode == 2, result.stderr
    assert "client certificates need tls_listen or wss_listen" in result.stderr


def test_websocket_request_on_another_path_gets_404(bridge_factory, certs):
    listeners = start_with_every_listener(bridge_factory, certs)
    request = (
        "GET /not-mqtt HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\n"
        "Upgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", listeners.ports["ws"]), timeout=TIMEOUT) as sock:
        sock.sendall(request.encode())
        response = b""
        while chunk := sock.recv(4096):  # the bridge closes after the response
            response += chunk
    assert response.startswith(b"HTTP/1.1 404 Not Found\r\n"), response
    listeners.node.wait_for_log("HTTP 404: no WebSocket endpoint at '/not-mqtt'")
