"""The server side of SCRAM-SHA-256 (RFC 5802, RFC 7677): pure, no I/O.

One `ScramServer` carries one exchange, in the order of the messages on the wire:

    exchange = ScramServer(decoy_key)              # AccessControl.new_scram_exchange() makes one
    username = exchange.client_first(data)         # client-first-message -> the user to look up
    reply = exchange.server_first(credential)      # the user's ScramCredential, or None: unknown
    final = exchange.client_final(data)            # client-final-message -> server-final (v=...)
    exchange.authenticated, exchange.username      # True, the user it proved to be

Anything wrong in what the client sent (a malformed message, a channel binding request, a
wrong nonce, a wrong proof, a call out of order) raises `ScramError`, whose `server_error` is
RFC 5802's `server-error-value`; the exchange is then over (`state` FAILED) and the client is
not authenticated. Wrong password and unknown user fail the same way: for an unknown user
`server_first(None)` answers with a fake credential derived from the user name and the decoy
key (the same salt on every attempt, like a real user's), so the exchange does not tell which
users exist.

Channel binding is not offered (no SCRAM-SHA-256-PLUS): gs2 flags "n" and "y" are accepted,
"p=..." is refused. An authorization identity ("a=") is accepted only when it names the user
itself. User names are unescaped ("=2C" is ",", "=3D" is "=", any other "=" is refused) and then
prepared with SASLprep (RFC 4013, the full profile, via the standard library's `stringprep`
tables) as a query string; a name SASLprep refuses or empties is refused.

`ScramCredential` is what the server stores per user (salt, iteration count, StoredKey,
ServerKey): enough to check a proof, not enough to log in as the user. `make_credential`
derives it from a password (SASLprep'd as a stored string; a password SASLprep refuses is used
as its UTF-8 bytes, as PostgreSQL does).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import stringprep
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

MECHANISM = "SCRAM-SHA-256"
"""The SASL mechanism name (the MQTT 5.0 Authentication Method)."""
SCHEME = "scram-sha-256"
"""The first field of a stored credential."""
DEFAULT_ITERATIONS = 4096
MIN_ITERATIONS = 4096  # RFC 7677 section 4: at least 4096
MAX_ITERATIONS = 10_000_000  # every login costs the client this many HMACs
SALT_BYTES = 16
KEY_BYTES = 32  # SHA-256
MIN_SALT_BYTES = 8
NONCE_BYTES = 18  # 24 base64url characters


class ScramError(Exception):
    """The client's SCRAM message is wrong or the proof does not match: the exchange failed.

    `server_error` is RFC 5802's server-error-value (e.g. "invalid-proof"), which a server may
    send back as `e=<value>`; it never says whether the user exists."""

    def __init__(self, message: str, server_error: str = "other-error") -> None:
        super().__init__(message)
        self.server_error = server_error


# -- SASLprep (RFC 4013) -------------------------------------------------------------------

_PROHIBITED: tuple[Callable[[str], bool], ...] = (
    stringprep.in_table_c12,  # non-ASCII space (mapped to U+0020 before this check)
    stringprep.in_table_c21_c22,  # control characters
    stringprep.in_table_c3,  # private use
    stringprep.in_table_c4,  # non-character code points
    stringprep.in_table_c5,  # surrogates
    stringprep.in_table_c6,  # inappropriate for plain text
    stringprep.in_table_c7,  # inappropriate for canonical representation
    stringprep.in_table_c8,  # change display properties or deprecated
    stringprep.in_table_c9,  # tagging characters
)


def saslprep(text: str, *, allow_unassigned: bool) -> str:
    """`text` prepared by SASLprep (RFC 4013 over RFC 3454's Unicode 3.2 tables): non-ASCII
    spaces become spaces, characters "mapped to nothing" go, NFKC; prohibited characters, bad
    bidirectional text and (unless `allow_unassigned`, i.e. a query string) code points
    unassigned in Unicode 3.2 raise ValueError."""
    mapped = "".join(
        " " if stringprep.in_table_c12(ch) else ch for ch in text if not stringprep.in_table_b1(ch)
    )
    prepared = unicodedata.ucd_3_2_0.normalize("NFKC", mapped)
    for ch in prepared:
        if any(prohibited(ch) for prohibited in _PROHIBITED):
            raise ValueError(f"character U+{ord(ch):04X} is prohibited by SASLprep")
        if not allow_unassigned and stringprep.in_table_a1(ch):
            raise ValueError(f"character U+{ord(ch):04X} is unassigned in Unicode 3.2")
    if any(stringprep.in_table_d1(ch) for ch in prepared):
        if any(stringprep.in_table_d2(ch) for ch in prepared):
            raise ValueError("mixes right-to-left and left-to-right characters")
        if not (stringprep.in_table_d1(prepared[0]) and stringprep.in_table_d1(prepared[-1])):
            raise ValueError("right-to-left text must start and end with such a character")
    return prepared


def _password_bytes(password: str) -> bytes:
    try:
        return saslprep(password, allow_unassigned=False).encode("utf-8")
    except ValueError:
        return password.encode("utf-8")


# -- credentials -----------------------------------------------------------------------------


def _hmac(key: bytes, message: bytes) -> bytes:
    return hmac.digest(key, message, "sha256")


def _b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _b64decode(text: str) -> bytes:
    """Strict standard base64; ValueError if `text` is not."""
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise ValueError("not valid base64") from None


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """What the server keeps to check a SCRAM-SHA-256 login (RFC 5802 section 3): the salt and
    iteration count the client derives its keys with, StoredKey = H(ClientKey) and ServerKey.
    A stolen credential allows guessing the password offline (PBKDF2 at `iterations`), not
    logging in directly."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    def encode(self) -> str:
        """The storage form, `scram-sha-256$<iterations>$<salt>$<StoredKey>$<ServerKey>` (base64;
        no `:`, so it fits a password file line)."""
        fields = (self.salt, self.stored_key, self.server_key)
        return "$".join([SCHEME, str(self.iterations), *map(_b64encode, fields)])

    @classmethod
    def parse(cls, text: str) -> ScramCredential:
        """Read the storage form; ValueError says what is wrong."""
        parts = text.strip().split("$")
        if len(parts) != 5 or parts[0] != SCHEME:
            raise ValueError(
                f"SCRAM credential is not in the form {SCHEME}$<iterations>$<salt>$<StoredKey>"
                "$<ServerKey>"
            )
        count = parts[1]
        if not (count.isascii() and count.isdigit() and len(count) <= 9):
            raise ValueError("SCRAM iteration count must be a decimal integer")
        try:
            salt, stored_key, server_key = (_b64decode(part) for part in parts[2:])
        except ValueError:
            raise ValueError("SCRAM salt or key is not valid base64") from None
        return _checked(salt, int(count), stored_key, server_key)


def _checked(salt: bytes, iterations: int, stored_key: bytes, server_key: bytes) -> ScramCredential:
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(
            f"SCRAM iteration count {iterations} is not within {MIN_ITERATIONS}..{MAX_ITERATIONS}"
        )
    if len(salt) < MIN_SALT_BYTES:
        raise ValueError(f"SCRAM salt is too short ({len(salt)} bytes, at least {MIN_SALT_BYTES})")
    if len(stored_key) != KEY_BYTES or len(server_key) != KEY_BYTES:
        raise ValueError(f"SCRAM StoredKey and ServerKey must be {KEY_BYTES} bytes each")
    return ScramCredential(salt, iterations, stored_key, server_key)


def make_credential(
    password: str, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None
) -> ScramCredential:
    """The credential for `password` (a fresh random salt unless given). Costs `iterations`
    PBKDF2-HMAC-SHA-256 rounds, about 2-5 ms at the default 4096."""
    if salt is None:
        salt = secrets.token_bytes(SALT_BYTES)
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"iterations must be within {MIN_ITERATIONS}..{MAX_ITERATIONS}")
    salted = hashlib.pbkdf2_hmac("sha256", _password_bytes(password), salt, iterations)
    client_key = _hmac(salted, b"Client Key")
    server_key = _hmac(salted, b"Server Key")
    return _checked(salt, iterations, hashlib.sha256(client_key).digest(), server_key)


def fake_credential(username: str, key: bytes, iterations: int) -> ScramCredential:
    """A credential for a user that does not exist: derived from the name and a secret key, so
    every attempt for the same name gets the same salt (as a real user does), and no proof
    matches it (its StoredKey is not the hash of anything the client knows)."""
    name = username.encode("utf-8")
    return ScramCredential(
        salt=_hmac(key, b"salt\0" + name)[:SALT_BYTES],
        iterations=iterations,
        stored_key=_hmac(key, b"stored-key\0" + name),
        server_key=_hmac(key, b"server-key\0" + name),
    )


# -- the exchange ----------------------------------------------------------------------------


class ScramState(Enum):
    """Where one exchange stands: what it expects next."""

    CLIENT_FIRST = "awaiting client-first-message"
    CREDENTIAL = "awaiting the user's credential (server_first)"
    CLIENT_FINAL = "awaiting client-final-message"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ScramError("message is not valid UTF-8", "invalid-encoding") from None


def _unescape_saslname(value: str) -> str:
    """RFC 5802 saslname: "=2C" is ",", "=3D" is "=", any other "=" is an error."""
    pieces = value.split("=")
    out = [pieces[0]]
    for piece in pieces[1:]:
        code, rest = piece[:2], piece[2:]
        if code not in ("2C", "3D"):
            raise ScramError("user name has an '=' that is not =2C or =3D", "invalid-encoding")
        out.append(("," if code == "2C" else "=") + rest)
    return "".join(out)


def _attribute(field: str, name: str, message: str) -> str:
    if not field.startswith(name + "="):
        raise ScramError(f"{message}: expected '{name}=' in {field[:20]!r}", "invalid-encoding")
    return field[len(name) + 1 :]


def _check_nonce(nonce: str) -> None:
    # printable = %x21-2B / %x2D-7E: visible ASCII except ","
    if not nonce or any(not 0x21 <= ord(ch) <= 0x7E for ch in nonce):
        raise ScramError("nonce is empty or not printable ASCII", "invalid-encoding")


class ScramServer:
    """The server's side of one SCRAM-SHA-256 exchange (see the module docstring for the calls).

    `decoy_key` and `decoy_iterations` make the fake credential of unknown users (the node's
    `AccessControl` holds the key, shared by the cluster's nodes through Redis). `server_nonce`
    fixes the server's half of the nonce, for tests; by default it is 18 random bytes from
    `secrets`, base64url encoded.
    """

    def __init__(
        self,
        decoy_key: bytes,
        *,
        decoy_iterations: int = DEFAULT_ITERATIONS,
        server_nonce: str | None = None,
    ) -> None:
        if server_nonce is None:
            server_nonce = secrets.token_urlsafe(NONCE_BYTES)
        _check_nonce(server_nonce)
        self._decoy_key = decoy_key
        self._decoy_iterations = decoy_iterations
        self._server_nonce = server_nonce
        self.state = ScramState.CLIENT_FIRST
        self.username: str | None = None
        """The prepared user name from client-first (the one to look up and act as)."""
        self._gs2_header = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self._credential: ScramCredential | None = None
        self._known_user = False

    @property
    def authenticated(self) -> bool:
        """Whether the client proved it knows the password of `username`."""
        return self.state is ScramState.SUCCEEDED

    def _expect(self, state: ScramState) -> None:
        if self.state is not state:
            current = self.state
            self.state = ScramState.FAILED
            raise ScramError(f"unexpected message: the exchange is {current.value}")

    def client_first(self, data: bytes) -> str:
        """Read the client-first-message; returns the (prepared) user name to look up."""
        self._expect(ScramState.CLIENT_FIRST)
        try:
            username = self._read_client_first(_decode(data))
        except ScramError:
            self.state = ScramState.FAILED
            raise
        self.username = username
        self.state = ScramState.CREDENTIAL
        return username

    def _read_client_first(self, text: str) -> str:
        parts = text.split(",", 2)
        if len(parts) != 3:
            raise ScramError("client-first-message: no gs2 header", "invalid-encoding")
        flag, authzid, bare = parts
        if flag.startswith("p="):
            raise ScramError(
                "channel binding is not supported (SCRAM-SHA-256-PLUS is not offered)",
                "channel-binding-not-supported",
            )
        if flag not in ("n", "y"):
            raise ScramError("client-first-message: gs2 flag must be n or y", "invalid-encoding")
        fields = bare.split(",")
        if fields[0].startswith("m="):
            raise ScramError("mandatory extension not supported", "extensions-not-supported")
        if len(fields) < 2:
            raise ScramError("client-first-message: expected n=...,r=...", "invalid-encoding")
        name = _unescape_saslname(_attribute(fields[0], "n", "client-first-message"))
        nonce = _attribute(fields[1], "r", "client-first-message")
        _check_nonce(nonce)
        try:
            username = saslprep(name, allow_unassigned=True)
        except ValueError as exc:
            raise ScramError(f"user name: {exc}", "invalid-username-encoding") from None
        if not username:
            raise ScramError("empty user name", "invalid-username-encoding")
        if authzid:
            acting_as = _unescape_saslname(_attribute(authzid, "a", "gs2 header"))
            if acting_as not in (name, username):
                raise ScramError("acting as another user (authzid) is not supported")
        self._gs2_header = f"{flag},{authzid},"
        self._client_first_bare = bare
        self._nonce = nonce + self._server_nonce
        return username

    def server_first(self, credential: ScramCredential | None) -> bytes:
        """The server-first-message, for the credential of `username` (None: the user does not
        exist or has no SCRAM credential; the exchange goes on with a fake one and fails at
        the proof, as a wrong password does)."""
        self._expect(ScramState.CREDENTIAL)
        self._known_user = credential is not None
        if credential is None:
            assert self.username is not None
            credential = fake_credential(self.username, self._decoy_key, self._decoy_iterations)
        self._credential = credential
        salt = _b64encode(credential.salt)
        self._server_first = f"r={self._nonce},s={salt},i={credential.iterations}"
        self.state = ScramState.CLIENT_FINAL
        return self._server_first.encode("utf-8")

    def client_final(self, data: bytes) -> bytes:
        """Check the client-final-message; returns the server-final-message (`v=...`), or raises
        ScramError (bad proof, unknown user, nonce or channel binding mismatch, malformed)."""
        self._expect(ScramState.CLIENT_FINAL)
        try:
            reply = self._check_client_final(_decode(data))
        except ScramError:
            self.state = ScramState.FAILED
            raise
        self.state = ScramState.SUCCEEDED
        return reply

    def _check_client_final(self, text: str) -> bytes:
        without_proof, sep, proof_field = text.rpartition(",")
        fields = without_proof.split(",")
        if not sep or len(fields) < 2:
            raise ScramError("client-final-message: expected c=...,r=...,p=...", "invalid-encoding")
        binding = _attribute(fields[0], "c", "client-final-message")
        nonce = _attribute(fields[1], "r", "client-final-message")
        proof_text = _attribute(proof_field, "p", "client-final-message")
        try:
            binding_data = _b64decode(binding)
            proof = _b64decode(proof_text)
        except ValueError:
            raise ScramError("c= or p= is not valid base64", "invalid-encoding") from None
        if binding_data != self._gs2_header.encode("utf-8"):
            raise ScramError(
                "channel binding data differs from the gs2 header", "channel-bindings-dont-match"
            )
        if not hmac.compare_digest(nonce.encode("utf-8"), self._nonce.encode("utf-8")):
            raise ScramError("nonce does not match the one of this exchange")
        credential = self._credential
        assert credential is not None
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}"
        signature = _hmac(credential.stored_key, auth_message.encode("utf-8"))
        if len(proof) != len(signature):
            raise ScramError("proof has the wrong length", "invalid-proof")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        matches = hmac.compare_digest(hashlib.sha256(client_key).digest(), credential.stored_key)
        if not (matches and self._known_user):
            raise ScramError("wrong proof: wrong password or no such user", "invalid-proof")
        server_signature = _hmac(credential.server_key, auth_message.encode("utf-8"))
        return f"v={_b64encode(server_signature)}".encode("ascii")
