"""Client authentication: who may CONNECT.

Authentication turns the ClientId, user name and password of a CONNECT into an `AuthResult`,
whose value is the MQTT 3.1.1 CONNACK return code to answer with. Here: `PasswordFile`, which
checks user names and passwords against a file of salted hashes, one `username:hash` per line
(see `python -m bridge.passwd` to maintain it). `bridge.access` puts the sources together (the
file, the users kept in the cluster's Redis, client certificates) and is what the node asks.

A line may end in a third field, the user's SCRAM-SHA-256 credential
(`username:hash:scram-sha-256$...`, `bridge.access.scram`), which `python -m bridge.passwd add`
writes with the hash: the password hash cannot serve SCRAM, which needs keys derived with
PBKDF2. Lines without it still load and still authenticate with user name and password; their
users cannot log in with SCRAM. (A bridge older than the field refuses such a file, naming the
line.) Redis users keep the credential in a second hash (`redis_scram_value`).

How a password is hashed and verified, and the cache of verifications, is `bridge.access.hashes`.

`authenticate` is synchronous and, on a cache miss, CPU-bound for tens of milliseconds; callers on
an event loop should run it in a small dedicated thread pool (both hash functions release the GIL).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import NamedTuple

from bridge.access.hashes import (
    DEFAULT_CACHE_SIZE,
    DEFAULT_CACHE_TTL,
    AuthConfigError,
    StoredHash,
    VerifiedCache,
    decoy_like,
    parse_hash,
    verify,
)
from bridge.access.scram import DEFAULT_ITERATIONS, ScramCredential
from bridge.access.scram import SCHEME as SCRAM_SCHEME
from bridge.mqtt.packets import ConnackCode

log = logging.getLogger("bridge.auth")


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
                verify(decoy, password)
            return AuthResult.BAD_CREDENTIALS
        if not verify(entry.stored, password):
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
