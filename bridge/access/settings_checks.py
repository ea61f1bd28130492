"""Whether the access settings can work: `check_access_settings(config)` raises `ConfigError`
naming the setting and why, before any client is let in.

The access settings are who may log in (users, anonymous clients), how long decisions are cached,
flapping detection, the bounds of what an address that has not logged in may hold and cost, and
the rate and connection limits (the same rules the admin API applies when it changes them).
"""

from __future__ import annotations

from bridge.access.bans import MAX_SECONDS
from bridge.access.ratelimit import LIMIT_NAMES, LimitError, check_limit
from bridge.settings import Config, ConfigError


def check_access_settings(config: Config) -> None:
    """Raise ConfigError for access settings that cannot work, and resolve `allow_anonymous`
    (unset: true without a user source, false with one) once they can."""
    if config.allow_anonymous is False and not config.has_user_source:
        raise ConfigError(
            "allow_anonymous: false needs a password_file, auth_redis or tls_cn_as_username"
        )
    config.allow_anonymous = config.anonymous_allowed
    if (config.auth_redis or config.acl_redis) and not config.clustered:
        raise ConfigError("auth_redis/acl_redis: need the cluster's Redis (redis_url)")
    for name in ("auth_cache_ttl", "acl_cache_ttl"):
        if getattr(config, name) < 0:
            raise ConfigError(f"{name}: must not be negative")
    _check_flapping(config)
    _check_logins(config)
    for name in LIMIT_NAMES:
        try:
            check_limit(name, getattr(config, name))
        except LimitError as exc:
            raise ConfigError(str(exc)) from None


def _check_flapping(config: Config) -> None:
    if config.flapping_max_connects < 0:
        raise ConfigError("flapping_max_connects: must not be negative (0: off)")
    for name in ("flapping_window", "flapping_ban_seconds"):
        value = getattr(config, name)
        if not 0 < value <= MAX_SECONDS:  # also refuses nan
            raise ConfigError(f"{name}: must be a positive number of seconds, got {value}")


def _check_logins(config: Config) -> None:
    """The bounds of what an address that has not logged in may hold and cost."""
    for name in (
        "max_unauthenticated",
        "max_unauthenticated_per_address",
        "login_queue_per_address",
    ):
        if getattr(config, name) < 0:
            raise ConfigError(f"{name}: must not be negative (0: unlimited)")
    for name in ("max_unauthenticated_bytes", "login_queue"):
        if getattr(config, name) < 1:
            raise ConfigError(f"{name}: must be at least 1, got {getattr(config, name)}")
    if not 0 <= config.login_failure_delay <= config.login_failure_delay_max:  # refuses nan
        raise ConfigError(
            "login_failure_delay: 0 to login_failure_delay_max seconds, got "
            f"{config.login_failure_delay}"
        )
