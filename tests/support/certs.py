"""A throw-away cluster CA and node certificates for peer-link TLS tests (cryptography)."""

from __future__ import annotations

import datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

Pair = tuple[x509.Certificate, ec.EllipticCurvePrivateKey]


def make_ca(name: str) -> Pair:
    """A self-signed CA certificate and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    return _sign(name, key, None, ca=True), key


def issue(ca: Pair, name: str) -> Pair:
    """A certificate named `name` (CN and DNS alt name) for both ends of a peer link."""
    key = ec.generate_private_key(ec.SECP256R1())
    return _sign(name, key, ca, ca=False), key


def write(directory: Path, stem: str, pair: Pair) -> tuple[Path, Path]:
    """`stem.pem` and `stem.key` under `directory`."""
    cert_path, key_path = directory / f"{stem}.pem", directory / f"{stem}.key"
    cert_path.write_bytes(pair[0].public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        pair[1].private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def _sign(
    name: str, key: ec.EllipticCurvePrivateKey, issuer: Pair | None, *, ca: bool
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
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
    if not ca:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            False,
        ).add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), False)
    return builder.sign(issuer[1] if issuer else key, hashes.SHA256())
