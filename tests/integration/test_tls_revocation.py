"""Certificate revocation lists (`tls_crlfile`): a revoked client certificate fails the TLS
handshake, a good one from the same CA connects; a file that is no CRL stops the start-up."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from bridge.config import Config
from bridge.listeners.tls import TLSConfigError, server_context
from bridge.mqtt.packets import ConnackCode
from tests.integration.test_listeners import (
    Certs,
    _leaf,
    _make_ca,
    _write,
    tls_connect,
)
from tests.support.processes import free_port, wait_for_port


@dataclass(frozen=True)
class RevocationCerts:
    """A CA, its server certificate, a good and a revoked device certificate, and the CRL."""

    certs: Certs
    revoked: tuple[Path, Path]
    crl: Path


@pytest.fixture(scope="module")
def revocation(tmp_path_factory: pytest.TempPathFactory) -> RevocationCerts:
    directory = tmp_path_factory.mktemp("crl")
    ca = _make_ca("revoking CA")
    other_ca = _make_ca("another CA")
    san = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    ca_path, _ = _write(directory, "ca", ca)
    server = _write(
        directory, "server", _leaf("localhost", ca, ExtendedKeyUsageOID.SERVER_AUTH, san)
    )
    good = _write(directory, "good", _leaf("device-good", ca, ExtendedKeyUsageOID.CLIENT_AUTH))
    revoked_pair = _leaf("device-revoked", ca, ExtendedKeyUsageOID.CLIENT_AUTH)
    revoked = _write(directory, "revoked", revoked_pair)
    rogue = _write(directory, "rogue", _leaf("x", other_ca, ExtendedKeyUsageOID.CLIENT_AUTH))
    neighbour = _write(
        directory, "neighbour", _leaf("device-neighbour", ca, ExtendedKeyUsageOID.CLIENT_AUTH)
    )
    now = datetime.datetime.now(datetime.UTC)
    entry = (
        x509.RevokedCertificateBuilder()
        .serial_number(revoked_pair[0].serial_number)
        .revocation_date(now - datetime.timedelta(minutes=5))
        .build()
    )
    crl = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca[0].subject)
        .last_update(now - datetime.timedelta(minutes=10))
        .next_update(now + datetime.timedelta(days=1))
        .add_revoked_certificate(entry)
        .sign(ca[1], hashes.SHA256())
    )
    crl_path = directory / "ca.crl.pem"
    crl_path.write_bytes(crl.public_bytes(serialization.Encoding.PEM))
    return RevocationCerts(Certs(ca_path, *server, *good, *rogue, *neighbour), revoked, crl_path)


def test_a_revoked_client_certificate_is_refused_and_a_good_one_accepted(
    bridge_factory, revocation
):
    certs = revocation.certs
    tls_port = free_port()
    node = bridge_factory(
        f"tls_listen=127.0.0.1:{tls_port}",
        f"tls_certfile={certs.server}",
        f"tls_keyfile={certs.server_key}",
        f"tls_cafile={certs.ca}",
        f"tls_crlfile={revocation.crl}",
        "tls_client_cert=required",
    )
    wait_for_port(tls_port, timeout=10.0, proc=node.proc)
    with pytest.raises((ssl.SSLError, ConnectionError)):
        tls_connect(tls_port, certs, revocation.revoked, "revoked")
    good = (certs.device, certs.device_key)
    assert tls_connect(tls_port, certs, good, "good").return_code == ConnackCode.ACCEPTED
    node.wait_for_log("TLS handshake")


def test_a_crl_file_without_a_crl_is_a_configuration_error_naming_it(revocation):
    certs = revocation.certs
    config = Config(
        tls_listen=["127.0.0.1:8883"],
        tls_certfile=str(certs.server),
        tls_keyfile=str(certs.server_key),
        tls_cafile=str(certs.ca),
        tls_crlfile=str(certs.ca),
        tls_client_cert="required",
    )
    with pytest.raises(TLSConfigError, match=f"tls_crlfile {certs.ca}: no PEM certificate"):
        server_context(config)
    config.tls_crlfile = str(revocation.crl)
    context = server_context(config)
    assert context is not None and context.verify_flags & ssl.VERIFY_CRL_CHECK_LEAF
