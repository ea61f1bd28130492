"""Password hashes: the stored forms, hashing a password, verifying one, and the cache of
verifications that passed.

New hashes are Argon2id (argon2-cffi, the reference implementation's bindings), stored in the
standard PHC form `$argon2id$v=19$m=19456,t=2,p=1$<salt>$<hash>`: 19 MiB and two passes, OWASP's
recommended minimum, about 20-50 ms of CPU per verification. Files written before still verify:
`scrypt$N$r$p$<salt base64>$<hash base64>` hashes (the standard library's `hashlib.scrypt`). Either
cost is expensive enough to make offline guessing of a stolen file slow, cheap enough for a
broker. Because it would be paid again by every reconnect of every client (a reconnect storm after
a network blip means thousands at once), successful verifications are remembered for `cache_ttl`
seconds (`VerifiedCache`).

A stored hash is validated when it is read (`parse_hash`), cost limits included, so a typo in a
file cannot make every CONNECT allocate gigabytes; verifying never raises for a wrong password.
Unknown users are checked against a decoy of the same cost (`decoy_like`), so that they take as
long as known ones. Where the hashes are kept (the password file, the users in the cluster's
Redis) is `bridge.access.auth` and `bridge.access.control`.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bridge.access.ttlcache import TTLCache

SCHEME = "scrypt"
DEFAULT_N = 2**14
DEFAULT_R = 8
DEFAULT_P = 1
SALT_BYTES = 16
HASH_BYTES = 32
# Limits on the cost parameters accepted from a file: a typo such as N=2**30 must not make every
# CONNECT allocate gigabytes. 128 MiB per verification is eight times the default.
MAX_SCRYPT_MEMORY = 128 * 1024 * 1024
MAX_P = 16
ARGON2_TIME_COST = 2
ARGON2_MEMORY_KIB = 19 * 1024
ARGON2_PARALLELISM = 1
MAX_ARGON2_MEMORY_KIB = MAX_SCRYPT_MEMORY // 1024
MAX_ARGON2_TIME_COST = 10
DEFAULT_CACHE_TTL = 60.0
DEFAULT_CACHE_SIZE = 100_000


class AuthConfigError(ValueError):
    """A password file or stored hash is unusable; the message says where and why."""


@dataclass(frozen=True, slots=True)
class ScryptHash:
    """A parsed `scrypt$N$r$p$salt$hash` string."""

    n: int
    r: int
    p: int
    salt: bytes
    digest: bytes

    def encode(self) -> str:
        """The storage form, `scrypt$N$r$p$<salt b64>$<hash b64>`."""
        salt = base64.b64encode(self.salt).decode("ascii")
        digest = base64.b64encode(self.digest).decode("ascii")
        return f"{SCHEME}${self.n}${self.r}${self.p}${salt}${digest}"


def _check_cost(n: int, r: int, p: int) -> None:
    if n < 2 or n & (n - 1):
        raise AuthConfigError(f"scrypt N must be a power of two >= 2, got {n}")
    if r < 1 or not 1 <= p <= MAX_P:
        raise AuthConfigError(f"scrypt r must be >= 1 and p within 1..{MAX_P}, got r={r} p={p}")
    if _scrypt_memory(n, r, p) > MAX_SCRYPT_MEMORY:
        raise AuthConfigError(
            f"scrypt cost N={n} r={r} p={p} needs more than "
            f"{MAX_SCRYPT_MEMORY // (1024 * 1024)} MiB per verification"
        )


def _scrypt_memory(n: int, r: int, p: int) -> int:
    # What OpenSSL allocates: the V array (128 * r * (N + 2)) plus the B blocks (128 * r * p).
    return 128 * r * (n + 2) + 128 * r * p


def _b64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise AuthConfigError(f"{what} is not valid base64") from None


@dataclass(frozen=True, slots=True)
class Argon2Hash:
    """A validated Argon2 hash in PHC form (`$argon2id$v=19$m=...,t=...,p=...$salt$hash`)."""

    encoded: str

    def encode(self) -> str:
        """The storage form (as read)."""
        return self.encoded


StoredHash = ScryptHash | Argon2Hash


@functools.cache
def _argon2() -> Any:
    """argon2-cffi's hasher with the module's cost. Imported on first use: a node whose clients
    never present a password does not hold it (0.9 MiB)."""
    import argon2

    return argon2.PasswordHasher(
        time_cost=ARGON2_TIME_COST, memory_cost=ARGON2_MEMORY_KIB, parallelism=ARGON2_PARALLELISM
    )


def _parse_argon2(stored: str) -> Argon2Hash:
    import argon2
    from argon2.exceptions import InvalidHashError

    try:
        params = argon2.extract_parameters(stored)
    except (InvalidHashError, ValueError):
        raise AuthConfigError("hash is not a valid $argon2id$... PHC string") from None
    if params.type not in (argon2.Type.ID, argon2.Type.I):
        raise AuthConfigError("argon2 hash must be argon2id (or argon2i)")
    if params.memory_cost > MAX_ARGON2_MEMORY_KIB or params.time_cost > MAX_ARGON2_TIME_COST:
        raise AuthConfigError(
            f"argon2 cost m={params.memory_cost} KiB t={params.time_cost} exceeds the limit "
            f"(m <= {MAX_ARGON2_MEMORY_KIB} KiB, t <= {MAX_ARGON2_TIME_COST})"
        )
    if params.salt_len < 8 or not 16 <= params.hash_len <= 64:
        raise AuthConfigError("argon2 salt shorter than 8 bytes or hash not within 16..64 bytes")
    return Argon2Hash(stored)


def parse_hash(stored: str) -> StoredHash:
    """Parse and validate a stored hash, or raise AuthConfigError saying what is wrong."""
    stored = stored.strip()
    if stored.startswith("$argon2"):
        return _parse_argon2(stored)
    parts = stored.split("$")
    if len(parts) != 6 or parts[0] != SCHEME:
        raise AuthConfigError(
            "hash is neither $argon2id$... nor in the form scrypt$N$r$p$<salt>$<hash>"
        )
    if not all(part.isascii() and part.isdigit() and len(part) <= 10 for part in parts[1:4]):
        raise AuthConfigError("scrypt N, r and p must be decimal integers")
    n, r, p = (int(part) for part in parts[1:4])
    _check_cost(n, r, p)
    salt = _b64(parts[4], "salt")
    digest = _b64(parts[5], "hash")
    if len(salt) < 8:
        raise AuthConfigError(f"salt is too short ({len(salt)} bytes, at least 8)")
    if not 16 <= len(digest) <= 64:
        raise AuthConfigError(f"hash length {len(digest)} bytes is not within 16..64")
    return ScryptHash(n, r, p, salt, digest)


def _scrypt(password: bytes, salt: bytes, n: int, r: int, p: int, dklen: int) -> bytes:
    """The one place scrypt runs (tests count calls by replacing this function)."""
    maxmem = _scrypt_memory(n, r, p) + 1024 * 1024
    return hashlib.scrypt(password, salt=salt, n=n, r=r, p=p, maxmem=maxmem, dklen=dklen)


def hash_password(
    password: str | bytes,
    *,
    n: int | None = None,
    r: int = DEFAULT_R,
    p: int = DEFAULT_P,
) -> str:
    """Hash `password` (str is UTF-8 encoded) with a fresh random salt, in the storage form.

    Argon2id with the module's cost (19 MiB, t=2) unless an scrypt cost `n` is given (then
    `scrypt$N$r$p$...`; N=2**14, r=8, p=1 is 16 MiB, ~10-50 ms).
    """
    secret = password.encode("utf-8") if isinstance(password, str) else password
    if n is None:
        return _argon2_hash(secret)
    _check_cost(n, r, p)
    salt = secrets.token_bytes(SALT_BYTES)
    return ScryptHash(n, r, p, salt, _scrypt(secret, salt, n, r, p, HASH_BYTES)).encode()


def _argon2_hash(secret: bytes) -> str:
    hashed: str = _argon2().hash(secret)
    return hashed


def _argon2_verify(encoded: str, password: bytes) -> bool:
    """The one place Argon2 verifies (tests count calls by replacing this function)."""
    from argon2.exceptions import InvalidHashError, VerificationError

    try:
        return bool(_argon2().verify(encoded, password))
    except (VerificationError, InvalidHashError):
        return False


def verify(stored: StoredHash, password: bytes) -> bool:
    """Whether `password` matches `stored` (constant-time comparison of the digests)."""
    if isinstance(stored, Argon2Hash):
        return _argon2_verify(stored.encoded, password)
    computed = _scrypt(password, stored.salt, stored.n, stored.r, stored.p, len(stored.digest))
    return hmac.compare_digest(computed, stored.digest)


def decoy_like(stored: StoredHash | None) -> StoredHash:
    """A hash no password matches, as costly to check as `stored` (Argon2 if None): unknown users
    are checked against it so that they take as long as known ones."""
    if isinstance(stored, ScryptHash):
        return ScryptHash(
            stored.n,
            stored.r,
            stored.p,
            secrets.token_bytes(SALT_BYTES),
            secrets.token_bytes(len(stored.digest)),
        )
    return Argon2Hash(_argon2_hash(secrets.token_bytes(16)))


class VerifiedCache:
    """Remembers successful (user name, password) verifications for `ttl` seconds, bounded in
    size. Keys hold an HMAC of the password under a per-process key, not the password or a plain
    hash of it, so a memory dump yields nothing to guess offline. Thread-safe."""

    def __init__(
        self,
        ttl: float = DEFAULT_CACHE_TTL,
        size: int = DEFAULT_CACHE_SIZE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lock = threading.Lock()
        self._key = secrets.token_bytes(32)
        self._entries: TTLCache[tuple[str, bytes], bool] = TTLCache(ttl, size, clock)
        self.generation = 0
        """Bumped by `clear`: a verification that started before must not be remembered."""

    def key(self, username: str, password: bytes) -> tuple[str, bytes]:
        """The cache key of a credential pair."""
        return username, hmac.digest(self._key, password, "sha256")

    def hit(self, key: tuple[str, bytes]) -> bool:
        """Whether this pair was verified less than `ttl` seconds ago."""
        with self._lock:
            return self._entries.get(key) is not None

    def remember(self, key: tuple[str, bytes], generation: int) -> None:
        """Remember a successful verification that began at `generation`."""
        with self._lock:
            if generation == self.generation:  # else the users changed meanwhile
                self._entries.put(key, True)

    def clear(self) -> None:
        """Forget everything (the users or their passwords changed)."""
        with self._lock:
            self._entries.clear()
            self.generation += 1

    def __len__(self) -> int:
        return len(self._entries)


def verify_password(stored: str, password: bytes) -> bool:
    """True if `password` matches the stored hash (constant-time comparison).

    Raises AuthConfigError (a ValueError) if `stored` is not a valid hash at all.
    """
    return verify(parse_hash(stored), password)
