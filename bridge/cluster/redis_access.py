"""How every Redis client of the product connects: credentials, TLS and Sentinel, in one place.

The registry, metering, notify and the command-line tools (`bridge.passwd`, `bridge.aclctl`)
all build their redis-py clients here from the same `redis_*` settings, so a Redis that asks
for a password, an ACL user or TLS is reached the same way by all of them:

* `redis_username` / `redis_password` (or `redis_password_file`): the Redis servers' user
  (Redis 6 ACL; empty user name: `default`, the `requirepass` user).
* `redis_sentinel_username` / `redis_sentinel_password` (or `redis_sentinel_password_file`):
  the Sentinels' own, which may differ
  (a Sentinel has its own `requirepass`).
* `redis_tls` (or a `rediss://` URL) with `redis_tls_cafile`, `redis_tls_certfile`,
  `redis_tls_keyfile`: TLS to the servers and to the Sentinels.

A password given in a URL's user part (`redis://user:pw@host`) wins over the settings for that
URL. Passwords are never put in a message: `RedisSetupError` names the setting to fix, and a
URL is only ever shown through `bridge.redact.redact_url`.

redis-py is imported inside the functions that build clients: a node on the embedded defaults
imports this module's error class without paying for redis-py.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    import redis
    from redis import asyncio as aioredis

ENV_PREFIX = "MQTT_BRIDGE_"

ACCESS_SETTINGS = (
    "redis_username",
    "redis_password",
    "redis_password_file",
    "redis_sentinel_username",
    "redis_sentinel_password",
    "redis_sentinel_password_file",
    "redis_tls",
    "redis_tls_cafile",
    "redis_tls_certfile",
    "redis_tls_keyfile",
)
"""The settings this module reads, besides the addresses (redis_url, redis_sentinels)."""


class RedisSetupError(Exception):
    """Redis cannot be used as configured (refused credentials, a TLS failure, an unreadable
    password file); the message names the setting to fix and never holds a secret."""


@dataclass(frozen=True, slots=True)
class RedisAccess:
    """Where a Redis is and how to prove who we are to it: built from the settings once, then
    handed to `async_client` / `sync_client`."""

    url: str = ""
    sentinels: str = ""
    master_name: str = "mqtt-bridge"
    timeout: float = 3.0
    username: str = ""
    password: str = ""
    sentinel_username: str = ""
    sentinel_password: str = ""
    tls: bool = False
    tls_cafile: str = ""
    tls_certfile: str = ""
    tls_keyfile: str = ""

    @classmethod
    def from_config(cls, config: Any, url: str | None = None) -> RedisAccess:
        """The access of a node's `Config` (its `redis_*` settings); `url` replaces redis_url
        (metering's own Redis) and then no Sentinel is used. Raises RedisSetupError if the
        password file cannot be read."""
        return cls(
            url=config.redis_url if url is None else url,
            sentinels="" if url is not None else config.redis_sentinels,
            master_name=config.redis_master_name,
            timeout=config.redis_timeout,
            username=config.redis_username,
            password=_password(config.redis_password, config.redis_password_file, "redis_password"),
            sentinel_username=config.redis_sentinel_username,
            sentinel_password=_password(
                config.redis_sentinel_password,
                config.redis_sentinel_password_file,
                "redis_sentinel_password",
            ),
            tls=config.redis_tls,
            tls_cafile=config.redis_tls_cafile,
            tls_certfile=config.redis_tls_certfile,
            tls_keyfile=config.redis_tls_keyfile,
        )

    @classmethod
    def from_environment(
        cls, url: str, environ: Mapping[str, str] | None = None, timeout: float = 5.0
    ) -> RedisAccess:
        """The access of a command-line tool given `url`: the same settings as a node's, read
        from `MQTT_BRIDGE_REDIS_*` environment variables (e.g. MQTT_BRIDGE_REDIS_PASSWORD_FILE).
        Raises RedisSetupError for a bad value or an unreadable password file."""
        env = os.environ if environ is None else environ

        def get(name: str) -> str:
            return env.get(ENV_PREFIX + name.upper(), "").strip()

        tls_text = get("redis_tls").lower()
        if tls_text not in ("", "0", "1", "true", "false", "yes", "no", "on", "off"):
            raise RedisSetupError(f"redis_tls: expected true/false, got {tls_text!r}")
        return cls(
            url=url,
            timeout=timeout,
            username=get("redis_username"),
            password=_password(
                env.get(ENV_PREFIX + "REDIS_PASSWORD", ""),
                get("redis_password_file"),
                "redis_password",
            ),
            tls=tls_text in ("1", "true", "yes", "on"),
            tls_cafile=get("redis_tls_cafile"),
            tls_certfile=get("redis_tls_certfile"),
            tls_keyfile=get("redis_tls_keyfile"),
        )

    @property
    def uses_tls(self) -> bool:
        """TLS to every server (and Sentinel): `redis_tls` or a `rediss://` URL."""
        return self.tls or self.url.startswith("rediss://")

    def server_options(self) -> dict[str, Any]:
        """redis-py connection keywords for the Redis servers: credentials and TLS."""
        options: dict[str, Any] = {
            "socket_timeout": self.timeout,
            "socket_connect_timeout": self.timeout,
        }
        if self.username:
            options["username"] = self.username
        if self.password:
            options["password"] = self.password
        return options | self._tls_options()

    def sentinel_options(self) -> dict[str, Any]:
        """redis-py connection keywords for the Sentinels: their own credentials, the same TLS."""
        options: dict[str, Any] = {
            "socket_timeout": self.timeout,
            "socket_connect_timeout": self.timeout,
        }
        if self.sentinel_username:
            options["username"] = self.sentinel_username
        if self.sentinel_password:
            options["password"] = self.sentinel_password
        if self.uses_tls:  # a plain redis-py client: TLS is asked for by name here
            options["ssl"] = True
        return options | self._tls_options()

    def sentinel_hosts(self) -> list[tuple[str, int]]:
        """The Sentinels' addresses of `redis_sentinels` ("host:port,...")."""
        hosts = []
        for part in self.sentinels.split(","):
            host, _, port = part.strip().rpartition(":")
            hosts.append((host or "127.0.0.1", int(port)))
        return hosts

    def tls_url(self) -> str:
        """`url` with the `rediss` scheme when TLS is on (redis-py picks TLS by the scheme)."""
        if self.uses_tls and self.url.startswith("redis://"):
            parts = urlsplit(self.url)
            return urlunsplit(("rediss", *parts[1:]))
        return self.url

    def _tls_options(self) -> dict[str, Any]:
        if not self.uses_tls:
            return {}
        options: dict[str, Any] = {"ssl_cert_reqs": "required"}
        if self.tls_cafile:
            options["ssl_ca_certs"] = self.tls_cafile
        if self.tls_certfile:
            options["ssl_certfile"] = self.tls_certfile
            options["ssl_keyfile"] = self.tls_keyfile or None
        return options


def _password(value: str, path: str, name: str) -> str:
    """The password of setting `name` or the first line of the file of `{name}_file`."""
    if value and path:
        raise RedisSetupError(f"{name} and {name}_file: set one, not both")
    if not path:
        return value
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8"
        raise RedisSetupError(f"{name}_file: cannot read {path}: {reason}") from None
    password = text.splitlines()[0].strip() if text.strip() else ""
    if not password:
        raise RedisSetupError(f"{name}_file: {path} holds no password")
    return password


def async_client(
    access: RedisAccess, *, watch_failovers: bool = False, **extra: Any
) -> aioredis.Redis:
    """A redis-py asyncio client: through Sentinel when `access.sentinels` is set (it follows
    a failover to the new master), else to `access.url`. `extra` adds connection keywords
    (retries). `watch_failovers`: with Sentinel, no command goes to a master the Sentinels are
    deposing (`bridge.cluster.failover_watch`; the registry's writes)."""
    from redis import asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.asyncio.sentinel import Sentinel
    from redis.backoff import NoBackoff

    from bridge.cluster.sentinel_follow import FollowingConnection, FollowingSSLConnection

    if access.sentinels:
        # One try per Sentinel: asking the next one is the retry, and redis-py's default
        # backoff spent most of a minute on Sentinels that refuse the password.
        sentinel_options = access.sentinel_options() | {"retry": Retry(NoBackoff(), 0)}
        sentinel = Sentinel(access.sentinel_hosts(), sentinel_kwargs=sentinel_options)
        options = access.server_options() | extra
        # A deposed master refusing writes for want of replicas is let go of at once
        # (`bridge.cluster.sentinel_follow`).
        options["connection_class"] = (
            FollowingSSLConnection if access.uses_tls else FollowingConnection
        )
        if watch_failovers:
            from bridge.cluster.failover_watch import FailoverWatch

            options["failover_watch"] = FailoverWatch(
                access.master_name, access.sentinel_hosts(), access.sentinel_options()
            )
        return sentinel.master_for(access.master_name, **options)
    return aioredis.Redis.from_url(access.tls_url(), **(access.server_options() | extra))


async def close_client(client: aioredis.Redis) -> None:
    """Close `client` with its connections and, when it follows a master through Sentinels, its
    connections to the Sentinels too. A client made by `master_for` does not own its pool, so
    closing the client alone leaves the pool's connections to the master open."""
    await client.aclose()
    await client.connection_pool.disconnect()
    watch = client.connection_pool.connection_kwargs.get("failover_watch")
    if watch is not None:
        await watch.stop()
    manager = getattr(client.connection_pool, "sentinel_manager", None)
    for sentinel in getattr(manager, "sentinels", ()):
        await sentinel.aclose()


def sync_client(access: RedisAccess, **extra: Any) -> redis.Redis:
    """A blocking redis-py client for `access.url` (the command-line tools)."""
    import redis

    try:
        return redis.Redis.from_url(access.tls_url(), **(access.server_options() | extra))
    except ValueError as exc:
        raise RedisSetupError(f"bad Redis URL: {_without_url(exc)}") from None


def _without_url(exc: BaseException) -> str:
    """redis-py's message of a bad URL, which may quote the URL (and its password)."""
    text = str(exc)
    return text.split("://")[0].rsplit(" ", 1)[0] if "://" in text else text


def explain(exc: BaseException, access: RedisAccess) -> str | None:
    """What a failure to use Redis says about the settings: a message naming the setting to
    fix, or None when it is no configuration problem (Redis down, a time-out)."""
    import ssl

    from redis.exceptions import AuthenticationError, ResponseError

    # redis-py's repr of an error is its category ("network:MasterNotFoundError"): the types
    # and the messages of the error and of what caused it tell what happened.
    text = " ".join(
        f"{type(e).__name__}: {e}" for e in (exc, exc.__cause__, exc.__context__) if e is not None
    )
    via_sentinel = bool(access.sentinels) and "master" in str(exc).lower() and "found" in str(exc)
    if via_sentinel and ("AuthenticationError" in text or "NOAUTH" in text or "WRONGPASS" in text):
        if not access.sentinel_password:
            return (
                "redis_sentinel_password: the Sentinels require a password and none is set (NOAUTH)"
            )
        names = "redis_sentinel_username/" if access.sentinel_username else ""
        return f"{names}redis_sentinel_password: the Sentinels refused the credentials (WRONGPASS)"
    refused = isinstance(exc, AuthenticationError) or (
        isinstance(exc, ResponseError) and ("NOAUTH" in str(exc) or "WRONGPASS" in str(exc))
    )
    if refused or "WRONGPASS" in text or "NOAUTH" in text:
        if not access.password and _url_password(access.url):
            # redis-py lets the URL's user part win over the settings.
            return "redis_url: Redis refused the user:password in the URL (WRONGPASS)"
        if not access.password:
            return "redis_password: Redis requires a password and none is set (NOAUTH)"
        if access.username:
            return (
                "redis_username/redis_password: Redis refused the credentials of user "
                f"{access.username!r} (WRONGPASS: wrong password, or no such user enabled)"
            )
        return "redis_password: Redis refused the credentials (WRONGPASS)"
    denied = "NOPERM" in str(exc) or "can't run this command" in str(exc)  # in a script
    if isinstance(exc, ResponseError) and denied:
        user = access.username or "default"
        return (
            f"redis_username: Redis user {user!r} may not run a command or touch a key the node "
            "needs (NOPERM; docs/operations.md gives the ACL)"
        )
    if "SSL" in text or isinstance(exc.__context__, ssl.SSLError):
        return _tls_failure(text)
    closed = "reset by peer" in text or "closed by the server" in text
    if access.uses_tls and not access.tls_certfile and closed:
        # TLS 1.3: a server that wants a client certificate says so after the client's side
        # of the handshake is done, often as a bare reset, or as the end of the connection
        # when the client's first command is written before the server's alert arrives.
        return (
            "redis_tls_certfile/redis_tls_keyfile: Redis closed the TLS connection; it may "
            "want a client certificate (tls-auth-clients)"
        )
    return None


def _url_password(url: str) -> bool:
    """Whether `url` carries a password in its user part."""
    try:
        return bool(urlsplit(url).password)
    except ValueError:
        return False


def _tls_failure(text: str) -> str:
    """The setting behind a failed TLS handshake with Redis."""
    lowered = text.lower()
    if "certificate_verify_failed" in lowered or "hostname mismatch" in lowered:
        return (
            "redis_tls_cafile: Redis's certificate is not trusted (CERTIFICATE_VERIFY_FAILED: "
            "signed by another CA, or not issued for the address dialled)"
        )
    if "certificate required" in lowered or "bad certificate" in lowered or "unknown ca" in lowered:
        return (
            "redis_tls_certfile/redis_tls_keyfile: Redis wants a client certificate its CA "
            "signed (tls-auth-clients)"
        )
    if "wrong_version_number" in lowered or "record layer" in lowered:
        return "redis_tls: Redis does not speak TLS on that port (WRONG_VERSION_NUMBER)"
    return "redis_tls: the TLS handshake with Redis failed"


async def check(client: aioredis.Redis, access: RedisAccess) -> None:
    """PING through `client` at start-up; a refusal that the settings explain raises
    RedisSetupError (others, Redis being down, are left to the caller's retries)."""
    from redis.exceptions import RedisError

    try:
        await client.ping()
    except (RedisError, OSError) as exc:
        reason = explain(exc, access)
        if reason is not None:
            raise RedisSetupError(reason) from None
        raise
