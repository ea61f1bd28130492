"""The cluster's shared secret: how a node reads it and the keys derived from it.

One secret proves membership of the cluster. It is never used directly: each use gets its own key
derived with HMAC-SHA-256 (`derive_key(secret, PEER_LINK)`, `derive_key(secret, ADMIN_CALLS)`),
so a key that leaks from one use (say, a captured admin call) says nothing about another.

Rotation without downtime: a node holds a list of secrets, the first of which it proves itself
with; it accepts proof made with any of them. The operator adds the new secret as a second line
on every node, then moves it first on every node, then removes the old line.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

MIN_SECRET_CHARS = 32
"""A secret shorter than this is refused: 32 hex characters are 128 bits."""

PEER_LINK = "peer-link"
"""The purpose of the key that authenticates peer links' handshakes."""
ADMIN_CALLS = "admin-calls"
"""The purpose of the key that signs node-to-node admin API calls."""


class CredentialError(Exception):
    """The cluster secret is missing, unreadable or too short; the message names the setting."""


def _checked(secret: str, where: str) -> bytes:
    if len(secret) < MIN_SECRET_CHARS:
        raise CredentialError(
            f"{where}: the cluster secret must be at least {MIN_SECRET_CHARS} characters "
            f"(got {len(secret)}); `openssl rand -hex 32` makes one"
        )
    return secret.encode()


def read_cluster_secrets(value: str, path: str) -> tuple[bytes, ...]:
    """The node's cluster secrets, the one it proves itself with first.

    `value` is the `cluster_secret` setting (one secret, or several separated by commas);
    `path` the `cluster_secret_file` setting (one secret a line; blank lines and `#` comments
    ignored). Both empty: an empty tuple (the caller decides whether that is allowed)."""
    if value and path:
        raise CredentialError("cluster_secret and cluster_secret_file: set one, not both")
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CredentialError(f"cluster_secret_file: cannot read {path}: {exc}") from None
        lines = [line.strip() for line in text.splitlines()]
        secrets = [line for line in lines if line and not line.startswith("#")]
        if not secrets:
            raise CredentialError(f"cluster_secret_file: {path} holds no secret")
        return tuple(_checked(s, "cluster_secret_file") for s in secrets)
    if value:
        return tuple(_checked(s.strip(), "cluster_secret") for s in value.split(","))
    return ()


def derive_key(secret: bytes, purpose: str) -> bytes:
    """The key for one use of the cluster secret (HMAC-SHA-256 of the purpose)."""
    return hmac.new(secret, b"mqtt-bridge/" + purpose.encode(), hashlib.sha256).digest()
