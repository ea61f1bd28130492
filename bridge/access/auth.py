"""Client authentication: who may CONNECT.

Authentication turns the ClientId, user name and password of a CONNECT into an `AuthResult`,
whose value is the MQTT 3.1.1 CONNACK return code to answer with. Here: the hashes, their cache,
and `PasswordFile`, which checks user names and passwords against a file of salted hashes, one
`username:hash` per line (see `python -m bridge.passwd` to maintain it). `bridge.access` puts the
sources together (the file, the users kept in the cluster's Redis, client certificates) and is
what the node asks.

A line may end in a third field, the user's SCRAM-SHA-256 credential
(`username:hash:scram-sha-256$...`, `bridge.access.scram`), which `python -m bridge.passwd add`
writes with the hash: the password hash cannot serve SCRAM, which needs keys derived with
PBKDF2. Lines without it still load and still authenticate with user name and password; their
users cannot log in with SCRAM. (A bridge older than the field refuses such a file, naming the
line.) Redis users keep the credential in a second hash (`redis_scram_value`).

New hashes are Argon2id (argon2-cffi, the reference implementation's bindings), stored in the
standard PHC form `$argon2id$v=19$m=19456,t=2,p=1$<salt>$<hash>`: 19 MiB and two passes, OWASP's
recommended minimum, about 20-50 ms of CPU per verification. Files written before still verify:
`scrypt$N$r$p$<salt base64>$<hash base64>` hashes (the standard library's `hashlib.scrypt`). Either
cost is expensive enough to make offline guessing of a stolen file slow, cheap enough for a
broker. Because it would be paid again by every reconnect of every client (a reconnect storm after
a network blip means thousands at once), successful verifications are remembered for `cache_ttl`
seconds (`VerifiedCache`).

`authenticate` is synchronous and, on a cache miss, CPU-bound for tens of milliseconds; callers on
an event loop should run it in a small dedicated thread pool (both hash functions release the GIL).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import logging
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, NamedTuple

from bridge.access.scram import DEFAULT_ITERATIONS, ScramCredential
from bridge.access.scram import SCHEME as SCRAM_SCHEME
from bridge.access.ttlcache import TTLCache
from bridge.mqtt.packets import ConnackCode

log = logging.getLogger("bridge.auth")

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


class AuthResult(Enum):
    """The outcome of authenticating a CONNECT; the value is its MQTT 3.1.1 CONNACK return code."""

    ACCEPTED = ConnackCode.ACCEPTED
    BAD_CREDENTIALS = ConnackCode.BAD_USERNAME_OR_PASSWORD
    NOT_AUTHORIZED = ConnackCode.NOT_AUTHORIZED
    UNAVAILABLE = ConnackCode.SERVER_UNAVAILABLE

    @property
    def connack_code(self) -> ConnackCode:
        """The CONNACK return code to send (0 accepted, 3 the user store is unreachable, 4 bad
        user name or password, 5 not authorized)."""
        return ConnackCode(self.value)


# -- hashes ----------------------------------------------------------------------------------


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


def _verify(stored: StoredHash, password: bytes) -> bool:
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
    return _verify(parse_hash(stored), password)


# -- password file ---------------------------------------------------------------------------


def _is_skipped(line: str) -> bool:
    text = line.strip()
    return not text or text.startswith("#")


class PasswordEntry(NamedTuple):
    """One user of a password file: the name, the password hash and, if the line has one, the
    SCRAM-SHA-256 credential."""

    username: str
    stored: StoredHash
    scram: ScramCredential | None


def parse_scram(text: str) -> ScramCredential:
    """A stored SCRAM credential (`scram-sha-256$...`), or AuthConfigError saying what is wrong."""
    try:
        return ScramCredential.parse(text)
    except ValueError as exc:
        raise AuthConfigError(str(exc)) from None


def parse_line(line: str) -> PasswordEntry | None:
    """Parse one password file line, `username:hash[:scram-sha-256$...]`: None for a blank line or
    comment, else the entry.

    The user name is everything before the hash's `:` (hashes and SCRAM credentials contain
    none), whitespace-stripped. Raises AuthConfigError (without a location) for a malformed line.
    """
    if _is_skipped(line):
        return None
    rest, sep, last = line.rpartition(":")
    scram = None
    if sep and last.strip().startswith(SCRAM_SCHEME + "$"):
        scram = parse_scram(last)
        line = rest
    username, sep, stored = line.rpartition(":")
    username = username.strip()
    if not sep:
        raise AuthConfigError("expected username:hash")
    if not username:
        raise AuthConfigError("empty user name")
    return PasswordEntry(username, parse_hash(stored), scram)


def parse_password_file(path: str | os.PathLike[str]) -> dict[str, PasswordEntry]:
    """Read a password file into {username: entry}; AuthConfigError names `file:line` on errors."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise AuthConfigError(f"cannot read password file {path}: {exc.strerror}") from None
    users: dict[str, PasswordEntry] = {}
    first_seen: dict[str, int] = {}
    for number, raw in enumerate(data.splitlines(), start=1):
        try:
            line = raw.decode("utf-8")
            entry = parse_line(line)
        except UnicodeDecodeError:
            raise AuthConfigError(f"{path}:{number}: not valid UTF-8") from None
        except AuthConfigError as exc:
            raise AuthConfigError(f"{path}:{number}: {exc}") from None
        if entry is None:
            continue
        username = entry.username
        if username in users:
            first = first_seen[username]
            raise AuthConfigError(
                f"{path}:{number}: duplicate user {username!r} (first on line {first})"
            )
        users[username] = entry
        first_seen[username] = number
    return users


def _hash_fingerprint(password_hash: str) -> str:
    digest = hashlib.sha256(password_hash.strip().encode("utf-8")).digest()[:12]
    return base64.b64encode(digest).decode("ascii")


def redis_scram_value(credential: ScramCredential, password_hash: str) -> str:
    """What a Redis user's entry in `<cluster>:users:scram` holds: the SCRAM credential, a space,
    and a fingerprint of the password hash it was made with (its hash field in `<cluster>:users`).
    The fingerprint ties the two: a password later changed by anything that does not write
    SCRAM credentials (an older `bridge.passwd`, a hand-made HSET) voids the old credential."""
    return f"{credential.encode()} {_hash_fingerprint(password_hash)}"


def parse_redis_scram_value(value: str, password_hash: str) -> ScramCredential | None:
    """The credential in a `redis_scram_value`, or None if it was made for another password hash
    than `password_hash`. AuthConfigError if the value is malformed."""
    credential, _, fingerprint = value.strip().partition(" ")
    expected = _hash_fingerprint(password_hash).encode("ascii")
    if not hmac.compare_digest(fingerprint.encode("utf-8"), expected):
        return None
    return parse_scram(credential)


class PasswordFile:
    """Authenticates user name and password against a file of salted hashes.

    * no user name: ACCEPTED if `allow_anonymous`, else NOT_AUTHORIZED;
    * a user name without a password, an unknown user name or a wrong password: BAD_CREDENTIALS
      (also when `allow_anonymous`: credentials that are given must be right).

    The file is read by the constructor and by `reload()`; a malformed file raises AuthConfigError
    then, never during `authenticate`. Successful verifications are cached for `cache_ttl` seconds
    (0 disables the cache), so repeated CONNECTs of a client skip the hash; `reload()` empties the
    cache. `scram_credential` gives a user's SCRAM-SHA-256 credential, if the file has one.
    Thread-safe.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        allow_anonymous: bool = False,
        cache_ttl: float = DEFAULT_CACHE_TTL,
        cache_size: int = DEFAULT_CACHE_SIZE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.allow_anonymous = allow_anonymous
        self.cache = VerifiedCache(cache_ttl, cache_size, clock)
        self._lock = threading.Lock()
        self._users: dict[str, PasswordEntry] = {}
        self._decoy: StoredHash | None = None
        self.scram_iterations = DEFAULT_ITERATIONS
        """The iteration count of the file's (first) SCRAM credentials: unknown users get it too."""
        self.reload()

    @property
    def usernames(self) -> list[str]:
        """The user names in the file, in file order."""
        return list(self._users)

    def has_user(self, username: str) -> bool:
        """Whether the file names this user."""
        return username in self._users

    def reload(self) -> None:
        """Re-read the file and empty the cache. On AuthConfigError the previous users stay."""
        users = parse_password_file(self.path)
        _warn_if_exposed(self.path)
        first = next(iter(users.values()), None)
        decoy = decoy_like(None if first is None else first.stored)
        scram = next((entry.scram for entry in users.values() if entry.scram is not None), None)
        with self._lock:
            self._users = users
            self._decoy = decoy
            self.scram_iterations = DEFAULT_ITERATIONS if scram is None else scram.iterations
            self.cache.clear()
        log.info("password file %s: %d users", self.path, len(users))

    def authenticate(
        self, client_id: str, username: str | None, password: bytes | None
    ) -> AuthResult:
        """Check a CONNECT's credentials (see the class docstring for the rules)."""
        if username is None:
            if password is not None:  # MQTT-3.1.2-22; the codec rejects it before 5.0
                return AuthResult.BAD_CREDENTIALS
            return AuthResult.ACCEPTED if self.allow_anonymous else AuthResult.NOT_AUTHORIZED
        if password is None:
            return AuthResult.BAD_CREDENTIALS
        cache = self.cache
        key = cache.key(username, password)
        if cache.hit(key):
            return AuthResult.ACCEPTED
        with self._lock:
            generation = cache.generation
            entry = self._users.get(username)
            decoy = self._decoy
        if entry is None:
            if decoy is not None:
                _verify(decoy, password)
            return AuthResult.BAD_CREDENTIALS
        if not _verify(entry.stored, password):
            return AuthResult.BAD_CREDENTIALS
        cache.remember(key, generation)
        return AuthResult.ACCEPTED

    def verified_lately(self, username: str, password: bytes) -> bool:
        """Whether this pair passed `authenticate` less than `cache_ttl` seconds ago (a check
        of microseconds: the caller need not queue it for a hashing thread)."""
        cache = self.cache
        return cache.hit(cache.key(username, password))

    def scram_credential(self, username: str) -> ScramCredential | None:
        """The user's SCRAM-SHA-256 credential; None if there is no such user or its line has
        none (written before SCRAM, or with `--no-scram`)."""
        with self._lock:
            entry = self._users.get(username)
        return None if entry is None else entry.scram


def _warn_if_exposed(path: str | os.PathLike[str]) -> None:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if stat.S_IMODE(mode) & 0o077:
        log.warning(
            "password file %s is accessible to group/others (mode %o); chmod 600 it",
            path,
            stat.S_IMODE(mode),
        )
