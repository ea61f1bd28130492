"""What a setting looks like when it is shown: secrets never leave the process in the clear.

`--print-config`, the admin API's view of the configuration and log lines that name a backend's
address all show settings through `shown`, so a password in a setting or inside a URL's user
part is replaced by `***` in one place. A setting that holds a secret is listed in
`SECRET_SETTINGS`; a URL setting's password is masked wherever the URL is shown.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

MASK = "***"

SECRET_SETTINGS: frozenset[str] = frozenset(
    {
        "admin_token",
        "cluster_secret",
        "rocketmq_secret_key",
        "redis_password",
        "redis_sentinel_password",
    }
)
"""Settings whose whole value is a secret: shown as `***` when set, `''` when empty."""

URL_SETTINGS: frozenset[str] = frozenset({"redis_url", "metering_redis_url"})
"""Settings holding a URL that may carry `user:password@`: the password is masked."""


def redact_url(url: str) -> str:
    """`url` with the password of its user part masked (`redis://u:***@host:6379/0`); a URL
    without a password, or a value that is no URL, comes back unchanged."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return MASK if "@" in url else url
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{user}:{MASK}@{host}"
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def shown(name: str, value: Any) -> Any:
    """The value of setting `name` as it may be printed or served."""
    if name in SECRET_SETTINGS:
        return MASK if value else value
    if name in URL_SETTINGS and isinstance(value, str):
        return redact_url(value)
    return value
