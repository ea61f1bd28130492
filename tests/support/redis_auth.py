"""How a test Redis asks its clients to prove themselves: a password, an ACL user, TLS, the
Sentinels' own password; and the same as redis-py keywords, deploy/redis script settings and
bridge node settings (`tests.support.redis` starts the servers)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.certs import TLSFiles


@dataclass(frozen=True)
class RedisAuth:
    """How a test Redis (or Sentinel group) asks its clients to prove themselves."""

    password: str = ""
    """The servers' password: `requirepass`, or the ACL user's when `username` is set."""
    username: str = ""
    """An ACL user created with `user_rules`; the default user is switched off."""
    user_rules: str = "~* &* +@all"
    tls: TLSFiles | None = None
    """TLS only, clients need a certificate the CA signed (`tls-auth-clients yes`)."""
    sentinel_password: str = ""
    """The Sentinels' own password (LocalSentinelRedis)."""

    def server_options(self) -> dict[str, Any]:
        """redis-py keywords that log in to the servers."""
        options: dict[str, Any] = self.tls_options()
        if self.username:
            options["username"] = self.username
        if self.password:
            options["password"] = self.password
        return options

    def sentinel_options(self) -> dict[str, Any]:
        """redis-py keywords that log in to the Sentinels."""
        options: dict[str, Any] = self.tls_options()
        if self.sentinel_password:
            options["password"] = self.sentinel_password
        return options

    def tls_options(self) -> dict[str, Any]:
        """redis-py keywords of TLS with the client certificate (none without TLS)."""
        if self.tls is None:
            return {}
        return {
            "ssl": True,
            "ssl_ca_certs": str(self.tls.ca),
            "ssl_certfile": str(self.tls.client_cert),
            "ssl_keyfile": str(self.tls.client_key),
        }

    def script_env(self, secrets_dir: Path) -> dict[str, str]:
        """The deploy/redis scripts' access settings; password files written to secrets_dir."""
        env: dict[str, str] = {}
        secrets_dir.mkdir(parents=True, exist_ok=True)
        for name, secret in (
            ("REDIS_PASSWORD_FILE", self.password),
            ("REDIS_SENTINEL_PASSWORD_FILE", self.sentinel_password),
        ):
            if secret:
                path = secrets_dir / name.lower()
                path.write_text(secret + "\n")
                path.chmod(0o600)
                env[name] = str(path)
        if self.username:
            env["REDIS_USER"] = self.username
            env["REDIS_USER_RULES"] = self.user_rules
        if self.tls is not None:
            env["REDIS_TLS_CERT_FILE"] = str(self.tls.server_cert)
            env["REDIS_TLS_KEY_FILE"] = str(self.tls.server_key)
            env["REDIS_TLS_CA_FILE"] = str(self.tls.ca)
        return env

    def bridge_settings(self, secrets_dir: Path) -> list[str]:
        """`NAME=VALUE` settings that give a bridge node this access (the password in a file
        of secrets_dir, never on the command line); the address settings are the caller's."""
        settings = []
        if self.username:
            settings.append(f"redis_username={self.username}")
        if self.password:
            path = secrets_dir / "bridge-redis-password"
            path.write_text(self.password + "\n")
            path.chmod(0o600)
            settings.append(f"redis_password_file={path}")
        if self.tls is not None:
            settings += [
                "redis_tls=true",
                f"redis_tls_cafile={self.tls.ca}",
                f"redis_tls_certfile={self.tls.client_cert}",
                f"redis_tls_keyfile={self.tls.client_key}",
            ]
        return settings


NO_AUTH = RedisAuth()
