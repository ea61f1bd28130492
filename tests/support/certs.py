"""Throw-away certificates for TLS tests (cryptography): a CA and the certificates it signs.

    ca = make_ca("cluster CA"); write(tmp_path, "node1", issue(ca, "node1"))   # peer links
    files = make_tls_files(tmp_path / "tls")   # ca.pem, server.pem/.key, client.pem/.key

Every certificate is valid from an hour ago for a day; keys are P-256, written 0600.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

Pair = tuple[x509.Certificate, ec.EllipticCurvePrivateKey]

BOTH_USAGES = (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH)


@dataclass(frozen=True)
class TLSFiles:
    """Paths of a CA certificate and of a server and a client certificate it signed."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_ca(name: str) -> Pair:
    """A self-signed CA certificate and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    return _sign(name, key, None), key


def issue(
    ca: Pair,
    name: str,
    *,
    dns: tuple[str, ...] | None = None,
    ips: tuple[str, ...] = (),
    usages: tuple[x509.ObjectIdentifier, ...] = BOTH_USAGES,
) -> Pair:
    """A certificate with common name `name`, signed by `ca`; its alt names are `dns` (default:
    `name`) and `ips`. By default it serves both ends of a link (server and client usage)."""
    key = ec.generate_private_key(ec.SECP256R1())
    alt_names: list[x509.GeneralName] = [x509.DNSName(d) for d in (name,) if dns is None]
    alt_names += [x509.DNSName(d) for d in dns or ()]
    alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    return _sign(name, key, ca, alt_names=alt_names, usages=usages), key


def write(directory: Path, stem: str, pair: Pair) -> tuple[Path, Path]:
    """`stem.pem` and `stem.key` (0600) under `directory`."""
    cert_path, key_path = directory / f"{stem}.pem", directory / f"{stem}.key"
    cert_path.write_bytes(pair[0].public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        pair[1].private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    return cert_path, key_path


def make_tls_files(directory: Path, ca_name: str = "test CA") -> TLSFiles:
    """Write a fresh CA, a server certificate (SAN 127.0.0.1, localhost) and a client one it
    signed into `directory`. Redis uses its server certificate as a client one too (replication,
    Sentinels), so the server's carries both usages."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = make_ca(ca_name)
    ca_path = directory / "ca.pem"
    ca_path.write_bytes(ca[0].public_bytes(serialization.Encoding.PEM))
    server_cert, server_key = write(
        directory, "server", issue(ca, "127.0.0.1", dns=("localhost",), ips=("127.0.0.1",))
    )
    client_cert, client_key = write(
        directory,
        "client",
        issue(ca, "mqtt-bridge", usages=(ExtendedKeyUsageOID.CLIENT_AUTH,)),
    )
    return TLSFiles(ca_path, server_cert, server_key, client_cert, client_key)


def _sign(
    name: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: Pair | None,
    *,
    alt_names: list[x509.GeneralName] | None = None,
    usages: tuple[x509.ObjectIdentifier, ...] = (),
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    ca = issuer is None
    signer_key = issuer[1] if issuer else key
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer[0].subject if issuer else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        ).add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
    else:
        builder = (
            builder.add_extension(x509.ExtendedKeyUsage(list(usages)), False)
            .add_extension(x509.SubjectAlternativeName(alt_names or []), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(signer_key.public_key()), False
            )
        )
    return builder.sign(signer_key, hashes.SHA256())
