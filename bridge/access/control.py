"""Access control of a node: who may connect (authentication) and what they may do (ACL).

Sources, combined:

* users: the password file (`password_file`), the cluster's Redis (`auth_redis`, hash
  `<cluster>:users`, user name -> hash) and, on TLS listeners, a verified client certificate whose
  CN is taken as the user name (`tls_cn_as_username`);
* SCRAM-SHA-256 credentials (MQTT 5.0 enhanced authentication) of the same users: the third field
  of a password file line, the hash `<cluster>:users:scram` in Redis (`scram_credential`);
* ACL rules: the rules file (`acl_file`) first, then the rules in the cluster's Redis (`acl_redis`,
  list `<cluster>:acl`), in order (syntax: `bridge.access.acl`).

A SCRAM exchange is run by the connection: `new_scram_exchange()` makes the pure state machine
(`bridge.access.scram.ScramServer`), `scram_credential(username)` looks the user up between its
first two steps. Unknown users get a fake credential derived from a key the cluster's nodes share
(`<cluster>:scram-decoy-key` in Redis, else one per process), so no node tells them apart.

Files are re-read on SIGHUP (`reload`). Whoever changes the users or rules in Redis
(`python -m bridge.passwd redis://...`, `python -m bridge.aclctl`) publishes on the channel
`<cluster>:access-changed`; every node listens, re-reads the Redis rules and forgets its cached
password verifications and ACL decisions at once. After the listening connection was lost (Redis
restarted or failed over) a node re-reads everything, since a change may have been missed.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from bridge.access.acl import Acl, AclError, Rule, parse_rules
from bridge.access.auth import AuthResult, PasswordFile, parse_redis_scram_value
from bridge.access.clientids import ClientIdPrefixes
from bridge.access.hashes import AuthConfigError, VerifiedCache, decoy_like, parse_hash, verify
from bridge.access.login_guard import FailedLogins
from bridge.access.login_queue import Lane, LoginQueue, lowest_cpu_priority
from bridge.access.scram import DEFAULT_ITERATIONS, ScramCredential, ScramServer

if TYPE_CHECKING:
    from bridge.settings import Config

from bridge.access.watch import follow_changes, stop_following
from bridge.cluster.redis_errors import redis_errors

log = logging.getLogger("bridge.access")


def users_key(cluster: str) -> str:
    """The Redis hash of user name -> password hash."""
    return f"{cluster}:users"


def scram_key(cluster: str) -> str:
    """The Redis hash of user name -> SCRAM-SHA-256 credential (`auth.redis_scram_value`)."""
    return f"{cluster}:users:scram"


def scram_decoy_key(cluster: str) -> str:
    """The Redis string holding the key of unknown users' fake SCRAM credentials."""
    return f"{cluster}:scram-decoy-key"


def acl_key(cluster: str) -> str:
    """The Redis list of ACL rule lines."""
    return f"{cluster}:acl"


def changed_channel(cluster: str) -> str:
    """The Redis channel on which changes to users or rules are announced."""
    return f"{cluster}:access-changed"


def load_acl_file(path: str) -> list[Rule]:
    """The rules of an ACL file; AclError names the file and line of a bad rule."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        raise AclError(f"cannot read ACL file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise AclError(f"ACL file {path} is not valid UTF-8") from None
    return parse_rules(lines, path)


HASH_THREADS = 2
"""Threads that run password hashes (each check takes one for tens of milliseconds)."""


class UserStoreUnavailable(Exception):
    """The user could not be looked up (Redis unreachable): answer "server unavailable"."""


class AccessControl:
    """The authentication and authorisation in force on a node, and where they come from."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.password_file: PasswordFile | None = None
        if config.password_file:
            self.password_file = PasswordFile(
                config.password_file,
                allow_anonymous=config.anonymous_allowed,
                cache_ttl=config.auth_cache_ttl,
            )
        self.redis: Any = None
        """The cluster's Redis client, set by `start` when a Redis source is configured."""
        self._redis_cache = VerifiedCache(config.auth_cache_ttl)
        self._redis_decoy = None if not config.auth_redis else decoy_like(None)
        self._scram_decoy_key = secrets.token_bytes(32)
        self._file_rules: list[Rule] | None = (
            load_acl_file(config.acl_file) if config.acl_file else None
        )
        self._redis_rules: list[Rule] = []
        self.authenticating = config.has_user_source
        # With users, client events (addresses, user names) are not for every user: without an
        # ACL nobody subscribes to them (docs/decisions.md, "Access").
        self.acl = Acl(
            self._combined_rules(),
            cache_ttl=config.acl_cache_ttl,
            private_client_events=self.authenticating,
        )
        self.client_ids = ClientIdPrefixes(self.acl.rules or ())
        """The ClientId prefixes the rules bind to users (`bridge.access.clientids`)."""
        self.rules_changed: Callable[[], None] | None = None
        """Called once new rules are in force (set by the node: it disconnects the clients
        whose ClientId they refuse)."""
        # Password hashes are slow on purpose and release the GIL: a small pool bounds their CPU,
        # and the queue in front of it bounds the checks that wait, fairly across addresses.
        # Addresses whose logins failed lately get a lane of their own, on a thread the OS runs
        # last: their flood of wrong passwords cannot slow the logins of other addresses.
        self._pool = ThreadPoolExecutor(max_workers=HASH_THREADS, thread_name_prefix="auth")
        self._failing_pool = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="auth-failing", initializer=lowest_cpu_priority
        )
        longest = min(config.login_failure_delay_max, config.connect_timeout / 2)
        self.failed_logins = FailedLogins(min(config.login_failure_delay, longest), longest)
        """Failed logins by address: how long the next refusal of each waits, and which
        addresses are failing (their checks take the failing lane)."""
        queued, per_address = config.login_queue, config.login_queue_per_address
        self.checks = LoginQueue(
            Lane(self._pool, HASH_THREADS, queued, per_address),
            Lane(self._failing_pool, 1, queued, per_address),
            self.failed_logins,
        )
        """The password checks running and waiting (`bridge.access.login_queue`)."""
        self._listener: asyncio.Task[None] | None = None

    def _combined_rules(self) -> list[Rule] | None:
        if self._file_rules is None and not self.config.acl_redis:
            return None
        return [*(self._file_rules or ()), *self._redis_rules]

    def describe(self) -> str:
        """One line for the start-up log."""
        if not self.authenticating:
            auth = "authentication OFF: any client may connect, with any or no credentials"
        else:
            sources = [
                name
                for name, on in (
                    (f"password file {self.config.password_file}", self.config.password_file),
                    ("Redis users", self.config.auth_redis),
                    ("client certificate CN", self.config.tls_cn_as_username),
                )
                if on
            ]
            anonymous = "allowed" if self.config.anonymous_allowed else "refused"
            auth = f"authentication by {', '.join(sources)}; anonymous clients {anonymous}"
        if self.acl.rules is None:
            acl = "ACL off: every client may publish and subscribe to every topic"
            if self.acl.private_client_events:
                acl += " but the $SYS client events"
        else:
            acl = f"ACL: {len(self.acl.rules)} rules, no match denies"
        return f"{auth}; {acl}"

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self, redis: Any) -> None:
        """Read the Redis rules and listen for changes (if a Redis source is configured); with
        the cluster's Redis, take the cluster's key for fake SCRAM credentials."""
        if redis is not None and self.scram_available:
            await self._share_scram_decoy_key(redis)
        if not (self.config.auth_redis or self.config.acl_redis):
            return
        self.redis = redis
        await self._load_redis_rules()
        self._listener = asyncio.get_running_loop().create_task(self._listen())

    async def _share_scram_decoy_key(self, redis: Any) -> None:
        """Use the key stored in Redis (the first node to start stores one), so every node
        answers an unknown user with the same fake salt, as it would for a real user."""
        key = scram_decoy_key(self.config.cluster_name)
        try:
            await redis.set(key, secrets.token_hex(32), nx=True)
            shared = await redis.get(key)
        except redis_errors(OSError) as exc:
            log.warning("SCRAM decoy key not shared through Redis, using this node's: %s", exc)
            return
        if shared:
            self._scram_decoy_key = bytes(shared)

    async def stop(self) -> None:
        await stop_following(self._listener)
        self._pool.shutdown(wait=False)
        self._failing_pool.shutdown(wait=False)

    def reload(self) -> list[str]:
        """SIGHUP: re-read the password and ACL files; returns the errors (a bad file keeps the
        previous contents in force)."""
        errors: list[str] = []
        if self.password_file is not None:
            try:
                self.password_file.reload()
            except AuthConfigError as exc:
                errors.append(f"password file not reloaded, the previous users stay: {exc}")
        if self.config.acl_file:
            try:
                self._file_rules = load_acl_file(self.config.acl_file)
                self._put_in_force()
                log.info("ACL file %s: %d rules", self.config.acl_file, len(self._file_rules))
            except AclError as exc:
                errors.append(f"ACL file not reloaded, the previous rules stay: {exc}")
        return errors

    def _put_in_force(self) -> None:
        """The file's and Redis's rules, combined, become the ACL in force."""
        rules = self._combined_rules()
        self.acl.replace(rules)
        self.client_ids = ClientIdPrefixes(rules or ())
        if self.rules_changed is not None:
            self.rules_changed()

    def clientid_refusal(self, client_id: str, username: str | None) -> str | None:
        """Why the rules refuse `client_id` to a client logged in as `username` (a ClientId
        prefix bound to another user, or one it is bound to that the ClientId is not under);
        None if they do not."""
        return self.client_ids.refusal(client_id, username)

    async def _load_redis_rules(self) -> None:
        if not self.config.acl_redis:
            return
        raw = await self.redis.lrange(acl_key(self.config.cluster_name), 0, -1)
        lines = [item.decode("utf-8", "replace") for item in raw]
        try:
            rules = parse_rules(lines, acl_key(self.config.cluster_name))
        except AclError as exc:
            log.error("ACL rules in Redis not applied, the previous rules stay: %s", exc)
            return
        self._redis_rules = rules
        self._put_in_force()
        log.info("ACL rules from Redis: %d", len(rules))

    async def changed(self) -> None:
        """Users or rules in Redis changed: forget cached verifications, re-read the rules."""
        self._redis_cache.clear()
        try:
            await self._load_redis_rules()
        except redis_errors() as exc:
            # Rules stay as they were; the listener re-reads them when Redis is back.
            log.warning("ACL rules in Redis not re-read: %s", exc)

    async def _listen(self) -> None:
        async def subscribed(first: bool) -> None:
            if not first:
                await self.changed()  # changes may have been missed while cut off

        async def changed() -> None:
            log.info("access rules changed in Redis: reloading")
            await self.changed()

        channel = changed_channel(self.config.cluster_name)
        await follow_changes(self.redis, channel, "access", subscribed, changed)

    # -- decisions ------------------------------------------------------------------------------

    async def authenticate(
        self,
        client_id: str,
        username: str | None,
        password: bytes | None,
        cert_cn: str | None = None,
        *,
        source: str = "",
        wanted: Callable[[], bool] | None = None,
    ) -> tuple[AuthResult, str | None]:
        """Check a CONNECT: the result and the user name the client acts as. A password check
        waits its turn among those of other `source` addresses; raises LoginsBusy when too
        many wait, or when `wanted()` is false once its turn comes (the client left)."""
        config = self.config
        if cert_cn is not None and config.tls_cn_as_username:
            return AuthResult.ACCEPTED, cert_cn
        if not self.authenticating:
            return AuthResult.ACCEPTED, username
        checked = await self._check_password(client_id, username, password, source, wanted)
        return checked, username

    async def _check_password(
        self,
        client_id: str,
        username: str | None,
        password: bytes | None,
        source: str,
        wanted: Callable[[], bool] | None,
    ) -> AuthResult:
        config = self.config
        if username is None:
            if password is not None:
                return AuthResult.BAD_CREDENTIALS
            return AuthResult.ACCEPTED if config.anonymous_allowed else AuthResult.NOT_AUTHORIZED
        if password is None:
            return AuthResult.BAD_CREDENTIALS
        users = self.password_file
        if users is not None and (users.has_user(username) or not config.auth_redis):
            if users.verified_lately(username, password):
                return AuthResult.ACCEPTED  # no hash to compute: no turn to wait for
            return await self.checks.run(
                source, users.authenticate, client_id, username, password, wanted=wanted
            )
        if config.auth_redis and self.redis is not None:
            return await self._check_redis_user(username, password, source, wanted)
        return AuthResult.BAD_CREDENTIALS

    async def _check_redis_user(
        self, username: str, password: bytes, source: str, wanted: Callable[[], bool] | None
    ) -> AuthResult:
        cache = self._redis_cache
        key = cache.key(username, password)
        if cache.hit(key):
            return AuthResult.ACCEPTED  # checked before any queue, as for the password file
        generation = cache.generation
        try:
            raw = await self.redis.hget(users_key(self.config.cluster_name), username)
        except redis_errors(OSError) as exc:
            log.warning("user %r not checked, Redis unavailable: %s", username, exc)
            return AuthResult.UNAVAILABLE
        if raw is None:
            decoy = self._redis_decoy
            if decoy is not None:
                await self.checks.run(source, verify, decoy, password, wanted=wanted)
            return AuthResult.BAD_CREDENTIALS
        try:
            stored = parse_hash(raw.decode("utf-8", "replace"))
        except AuthConfigError as exc:
            log.error("user %r in Redis has an unusable hash: %s", username, exc)
            return AuthResult.BAD_CREDENTIALS
        if not await self.checks.run(source, verify, stored, password, wanted=wanted):
            return AuthResult.BAD_CREDENTIALS
        cache.remember(key, generation)
        return AuthResult.ACCEPTED

    # -- SCRAM-SHA-256 ---------------------------------------------------------------------------

    @property
    def scram_available(self) -> bool:
        """Whether a user source that can hold SCRAM credentials (the password file, Redis users)
        is configured. Without one, a SCRAM login has nobody to match."""
        return bool(self.config.password_file or self.config.auth_redis)

    def new_scram_exchange(self, *, server_nonce: str | None = None) -> ScramServer:
        """A fresh SCRAM-SHA-256 exchange whose unknown users get this cluster's fake credential
        (`server_nonce` fixes the server's nonce, for tests)."""
        users = self.password_file
        iterations = DEFAULT_ITERATIONS if users is None else users.scram_iterations
        return ScramServer(
            self._scram_decoy_key, decoy_iterations=iterations, server_nonce=server_nonce
        )

    async def scram_credential(self, username: str) -> ScramCredential | None:
        """The user's SCRAM-SHA-256 credential, from the source `authenticate` would ask (the
        password file if it names the user, else Redis users); None if the user is unknown or
        has none. Raises UserStoreUnavailable when Redis cannot be asked.

        Read afresh every time (the file's users are in memory; Redis is one round trip), so a
        changed or removed user takes effect at once, with no cache to forget."""
        config = self.config
        users = self.password_file
        if users is not None and (users.has_user(username) or not config.auth_redis):
            return users.scram_credential(username)
        if config.auth_redis and self.redis is not None:
            return await self._redis_scram_credential(username)
        return None

    async def _redis_scram_credential(self, username: str) -> ScramCredential | None:
        cluster = self.config.cluster_name
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hget(users_key(cluster), username)
                pipe.hget(scram_key(cluster), username)
                stored, scram = await pipe.execute()
        except redis_errors(OSError) as exc:
            log.warning("user %r not looked up, Redis unavailable: %s", username, exc)
            raise UserStoreUnavailable(str(exc)) from None
        if stored is None or scram is None:
            return None
        try:
            return parse_redis_scram_value(
                scram.decode("utf-8", "replace"), stored.decode("utf-8", "replace")
            )
        except AuthConfigError as exc:
            log.error("user %r in Redis has an unusable SCRAM credential: %s", username, exc)
            return None
