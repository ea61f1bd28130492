"""The RocketMQ client's credentials and TLS from a node's settings: `rocketmq_security(config)`
builds them, and is the check that they can work (`ConfigError` names the setting)."""

from __future__ import annotations

from pathlib import Path

from bridge.settings import Config, ConfigError
from bridge.storage.rocketmq.acl import Credentials
from bridge.storage.rocketmq.tls import TlsOptions, TlsOptionsError


def rocketmq_security(config: Config) -> tuple[Credentials | None, TlsOptions | None]:
    """(Credentials or None, TlsOptions or None) of the RocketMQ client from the settings;
    ConfigError names the setting that cannot work (credentials half given, an unusable file)."""
    credentials = None
    secret_key = _rocketmq_secret_key(config)
    if config.rocketmq_access_key or secret_key:
        if not config.rocketmq_access_key:
            raise ConfigError("rocketmq_access_key: rocketmq_secret_key is set, the user is not")
        if not secret_key:
            raise ConfigError("rocketmq_secret_key: rocketmq_access_key is set, its key is not")
        credentials = Credentials(config.rocketmq_access_key, secret_key)
    tls = None
    files = ("rocketmq_tls_cafile", "rocketmq_tls_certfile", "rocketmq_tls_keyfile")
    if config.rocketmq_tls:
        tls = TlsOptions(
            cafile=config.rocketmq_tls_cafile,
            certfile=config.rocketmq_tls_certfile,
            keyfile=config.rocketmq_tls_keyfile,
            verify_hostname=config.rocketmq_tls_verify_hostname,
        )
        try:
            tls.context()
        except TlsOptionsError as exc:
            raise ConfigError(f"rocketmq_tls_{exc}") from None
    else:
        for name in files:
            if getattr(config, name):
                raise ConfigError(f"{name}: set rocketmq_tls = true to use it")
    return credentials, tls


def _rocketmq_secret_key(config: Config) -> str:
    """rocketmq_secret_key, or the secret read from rocketmq_secret_key_file."""
    path = config.rocketmq_secret_key_file
    if not path:
        return config.rocketmq_secret_key
    if config.rocketmq_secret_key:
        raise ConfigError("rocketmq_secret_key and rocketmq_secret_key_file: set one, not both")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"rocketmq_secret_key_file: cannot read {path}: {exc}") from None
    for line in text.splitlines():
        if line.strip() and not line.strip().startswith("#"):
            return line.strip()
    raise ConfigError(f"rocketmq_secret_key_file: {path} holds no secret")
