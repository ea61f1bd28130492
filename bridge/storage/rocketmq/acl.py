"""Request signing for a RocketMQ cluster with authentication on (ACL). Pure: no I/O.

RocketMQ's clients authenticate every remoting request on its own, with no handshake: the
request carries the user's `AccessKey` (and, for temporary credentials, a `SecurityToken`) in its
extFields, and a `Signature` over the request. What is signed (RocketMQ 5.3.3,
`AclClientRPCHook.doBeforeRequest` and `AclUtils.combineRequestContent` on the client,
`DefaultAuthenticationContextBuilder.build` and `DefaultAuthenticationHandler` on the broker):

1. every extFields value but the Signature's, AccessKey and SecurityToken included, in the
   order of their keys (Java `String` order, i.e. by UTF-16 code unit), joined without
   separators and encoded as UTF-8;
2. followed by the body's bytes;
3. HMAC-SHA1 of that with the SecretKey (UTF-8) as the key, Base64 (standard alphabet, with
   padding) as the Signature value.

The keys themselves, the request code and the opaque are not signed. The broker recomputes
the signature with the password it stores for AccessKey and compares (constant time); it
answers NO_PERMISSION (16) with the reason as the remark when that fails. The NameServer does
not authenticate in 5.3.3; this client signs its requests too (as the Java client does), so a
NameServer that starts checking finds them signed.

`RequestSigner` keeps the HMAC's SHA-1 states already keyed (the inner one also fed with the
AccessKey and token, which sort before every lower-case header field) and copies them per
request: signing a send costs two copies, two `update`s and two digests.
`authentication_hint` tells the broker's refusals of credentials from its other NO_PERMISSION
answers, so that errors (connection.py's `RemotingError`) name the setting to fix.
"""

from __future__ import annotations

import binascii
import hashlib
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = [
    "ACCESS_KEY",
    "SECURITY_TOKEN",
    "SIGNATURE",
    "Credentials",
    "RequestSigner",
    "authentication_hint",
]

ACCESS_KEY: Final = "AccessKey"
SECURITY_TOKEN: Final = "SecurityToken"
SIGNATURE: Final = "Signature"


@dataclass(frozen=True, slots=True)
class Credentials:
    """A RocketMQ user's AccessKey (user name) and SecretKey (password), and an optional
    SecurityToken (temporary credentials). The secret never shows in `repr`."""

    access_key: str
    secret_key: str = field(repr=False)
    security_token: str = ""

    def __post_init__(self) -> None:
        if not self.access_key:
            raise ValueError("the access key is empty")
        if not self.secret_key:
            raise ValueError("the secret key is empty")


def _java_order(key: str) -> bytes:
    """Sort key equal to Java's `String.compareTo` (UTF-16 code units), which the broker's
    `TreeMap` uses; differs from Python's code-point order only beyond the BMP."""
    return key.encode("utf-16-be", "surrogatepass")


_SHA1_BLOCK: Final = 64


class RequestSigner:
    """Signs requests with one user's credentials (see the module docstring).

    HMAC-SHA1 is computed from two SHA-1 states keyed once (RFC 2104: the key XOR ipad, the key
    XOR opad), copied per request: cheaper than copying an `hmac.HMAC`, which wraps the same
    two states in Python."""

    __slots__ = ("_inner", "_outer", "_prefixed", "access_key", "prefix_fields", "security_token")

    def __init__(self, credentials: Credentials) -> None:
        self.access_key = credentials.access_key
        self.security_token = credentials.security_token
        key = credentials.secret_key.encode()
        if len(key) > _SHA1_BLOCK:
            key = hashlib.sha1(key).digest()
        key = key.ljust(_SHA1_BLOCK, b"\0")
        self._inner = hashlib.sha1(bytes(b ^ 0x36 for b in key))
        self._outer = hashlib.sha1(bytes(b ^ 0x5C for b in key))
        self.prefix_fields: dict[str, str] = {ACCESS_KEY: self.access_key}
        """The fields this signer adds before signing."""
        if self.security_token:
            self.prefix_fields[SECURITY_TOKEN] = self.security_token
        self._prefixed = self._inner.copy()
        # "AccessKey" < "SecurityToken" < any lower-case key: the order of the send header.
        for name in sorted(self.prefix_fields, key=_java_order):
            self._prefixed.update(self.prefix_fields[name].encode())

    def _signature(self, inner: Any) -> str:
        outer = self._outer.copy()
        outer.update(inner.digest())
        return binascii.b2a_base64(outer.digest(), newline=False).decode("ascii")

    def sign(self, ext_fields: MutableMapping[str, str], body: bytes = b"") -> None:
        """Add AccessKey (and SecurityToken) and the Signature to `ext_fields` in place."""
        ext_fields.pop(SIGNATURE, None)
        ext_fields.update(self.prefix_fields)
        inner = self._inner.copy()
        for name in sorted(ext_fields, key=_java_order):
            inner.update(ext_fields[name].encode())
        inner.update(body)
        ext_fields[SIGNATURE] = self._signature(inner)

    def signed(self, ext_fields: Mapping[str, str] | None, body: bytes = b"") -> dict[str, str]:
        """A signed copy of `ext_fields` (see `sign`)."""
        fields = dict(ext_fields or {})
        self.sign(fields, body)
        return fields

    def signature_after_prefix(self, values: Iterable[bytes], body: bytes) -> str:
        """The Signature of a request whose other fields' values, in key order, are `values`,
        all of whose keys sort after the AccessKey and SecurityToken (true of every lower-case
        key, like the send header's one-letter names): the hot path's shortcut."""
        inner = self._prefixed.copy()
        inner.update(b"".join(values))
        inner.update(body)
        return self._signature(inner)


# The broker's remarks (RocketMQ 5.3.3: DefaultAuthenticationHandler and
# AbstractAuthenticationStrategy for authentication, AclAuthorizationHandler for authorization)
# and the setting each points at.
_REMARK_SETTINGS: Final = (
    ("check signature failed", "secret_key", "the broker refused the signature"),
    ("username cannot be null", "access_key", "the broker requires credentials"),
    ("is not found", "access_key", "the broker knows no such user"),
    ("is disabled", "access_key", "the broker has disabled this user"),
    ("authentication failed", "access_key", "the broker refused the credentials"),
    ("has no permission to access", "access_key", "the broker's ACL does not allow this user"),
)


def authentication_hint(remark: str) -> tuple[str, str] | None:
    """For the remark of a NO_PERMISSION answer: ("access_key" or "secret_key", what went
    wrong) when the broker refused the user (unknown, wrong signature, or not allowed by its
    ACL to use that topic or group); None for other refusals (a broker or topic not taking
    writes, which is about the broker, not the user)."""
    lowered = remark.lower()
    for needle, setting, summary in _REMARK_SETTINGS:
        if needle in lowered:
            return setting, summary
    return None
