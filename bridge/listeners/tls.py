"""TLS for the `tls_listen` and `wss_listen` listeners: the server's SSL context, built once from
the settings, and the verified client certificate's CN of a connection.

Every fault in the certificate, key or CA files becomes a `TLSConfigError` naming the setting and
the file, raised at start-up (`Server.check`) so a node never runs with a listener it cannot serve.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bridge.config import Config

CLIENT_CERT_MODES = {
    "none": ssl.CERT_NONE,
    "optional": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}


class TLSConfigError(ValueError):
    """A TLS file cannot be used; the message names the setting, the file and why."""


def _read_pem(setting: str, path: str, marker: str, what: str) -> None:
    """Fail with a message naming the file if it cannot be read or holds no `what`."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as exc:
        raise TLSConfigError(f"{setting} {path}: cannot read it: {exc.strerror}") from None
    if marker not in text:
        raise TLSConfigError(f"{setting} {path}: no PEM {what} in it")


def server_context(config: Config) -> ssl.SSLContext | None:
    """The SSL context of the TLS and WSS listeners (TLS 1.2 or later; client certificates
    checked against `tls_cafile` as `tls_client_cert` says), or None when neither is configured.
    Raises TLSConfigError for a missing, unreadable or mismatched file."""
    if not (config.tls_listen or config.wss_listen):
        return None
    certfile, keyfile = config.tls_certfile, config.tls_keyfile
    _read_pem("tls_certfile", certfile, "-----BEGIN CERTIFICATE-----", "certificate")
    _read_pem("tls_keyfile", keyfile, "PRIVATE KEY-----", "private key")

    def refuse_encrypted_key() -> bytes:
        # Without a callback OpenSSL would prompt for a passphrase on the terminal.
        raise TLSConfigError(
            f"tls_keyfile {keyfile}: the key is encrypted; give an unencrypted key"
        )

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certfile, keyfile, password=refuse_encrypted_key)
    except ssl.SSLError as exc:
        raise TLSConfigError(
            f"tls_certfile {certfile} / tls_keyfile {keyfile}: cannot load the certificate and "
            f"key: {exc.reason or exc}"
        ) from None
    context.verify_mode = CLIENT_CERT_MODES[config.tls_client_cert]
    if context.verify_mode != ssl.CERT_NONE:
        cafile = config.tls_cafile
        _read_pem("tls_cafile", cafile, "-----BEGIN CERTIFICATE-----", "certificate")
        try:
            context.load_verify_locations(cafile=cafile)
        except ssl.SSLError as exc:
            raise TLSConfigError(
                f"tls_cafile {cafile}: cannot load the CA certificates: {exc.reason or exc}"
            ) from None
    return context


def peer_cert_cn(transport: Any) -> str | None:
    """The subject CN of the client certificate the TLS handshake verified on `transport`, or
    None (plain TCP, no certificate sent, or no CN). The first CN counts, as in Mosquitto."""
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return None
    cert = ssl_object.getpeercert()
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None
