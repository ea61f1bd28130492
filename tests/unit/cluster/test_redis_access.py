"""How Redis clients are built from the settings, and what a refusal says (no server needed)."""

from __future__ import annotations

import re
import ssl
from pathlib import Path

import pytest
from redis.asyncio.sentinel import MasterNotFoundError
from redis.exceptions import AuthenticationError, ConnectionError, ResponseError, TimeoutError

from bridge.checks import load_config
from bridge.cluster.redis_access import RedisAccess, RedisSetupError, explain
from bridge.config import Config, ConfigError
from bridge.redact import shown

CLUSTER = {"store": "rocketmq", "redis_url": "redis://127.0.0.1:6379/0"}


def test_the_password_file_s_first_line_is_the_password(tmp_path: Path) -> None:
    path = tmp_path / "pw"
    path.write_text("s3cret\nignored\n")
    config = Config(redis_url="redis://h:1/0", redis_password_file=str(path))
    assert RedisAccess.from_config(config).server_options()["password"] == "s3cret"


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "redis_password_file: cannot read"), ("\n", "redis_password_file: .* no password")],
)
def test_an_unusable_password_file_is_refused_naming_the_setting(
    tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "pw"
    if content is not None:
        path.write_text(content)
    with pytest.raises(RedisSetupError, match=message):
        RedisAccess.from_config(Config(redis_password_file=str(path)))


def test_tls_turns_a_redis_url_into_rediss_and_passes_the_files() -> None:
    access = RedisAccess(
        url="redis://h:1/0", tls=True, tls_cafile="ca", tls_certfile="c", tls_keyfile="k"
    )
    assert access.tls_url() == "rediss://h:1/0"
    options = access.server_options()
    assert (options["ssl_ca_certs"], options["ssl_certfile"], options["ssl_keyfile"]) == (
        "ca",
        "c",
        "k",
    )
    assert RedisAccess(url="rediss://h:1/0").uses_tls
    assert "ssl_ca_certs" not in RedisAccess(url="redis://h:1/0").server_options()


def test_the_sentinels_get_their_own_credentials_and_the_servers_theirs() -> None:
    access = RedisAccess(sentinels="a:1,b:2", username="u", password="p", sentinel_password="sp")
    assert access.sentinel_hosts() == [("a", 1), ("b", 2)]
    assert (access.server_options()["username"], access.server_options()["password"]) == ("u", "p")
    assert access.sentinel_options()["password"] == "sp"
    assert "username" not in access.sentinel_options()


def test_the_command_line_tools_read_the_settings_from_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "pw"
    path.write_text("from-file\n")
    access = RedisAccess.from_environment(
        "redis://h:1/0",
        {
            "MQTT_BRIDGE_REDIS_USERNAME": "tool",
            "MQTT_BRIDGE_REDIS_PASSWORD_FILE": str(path),
            "MQTT_BRIDGE_REDIS_TLS": "yes",
        },
    )
    assert (access.username, access.password, access.uses_tls) == ("tool", "from-file", True)
    with pytest.raises(RedisSetupError, match="redis_tls: expected true/false"):
        RedisAccess.from_environment("redis://h:1/0", {"MQTT_BRIDGE_REDIS_TLS": "maybe"})


@pytest.mark.parametrize(
    ("error", "access", "message"),
    [
        (AuthenticationError("Authentication required."), RedisAccess(), "redis_password: .* none"),
        (
            AuthenticationError("invalid username-password pair"),
            RedisAccess(password="x"),
            "redis_password: Redis refused",
        ),
        (
            AuthenticationError("invalid username-password pair"),
            RedisAccess(username="u", password="x"),
            "redis_username/redis_password: .* user 'u'",
        ),
        (
            AuthenticationError("invalid username-password pair"),
            RedisAccess(url="redis://:wrong@h:1/0"),
            "redis_url: Redis refused the user:password in the URL",
        ),
        (
            ResponseError("NOPERM this user has no permissions to run the 'time' command"),
            RedisAccess(username="u", password="x"),
            "redis_username: Redis user 'u' may not",
        ),
        (
            MasterNotFoundError("No master found for 'm' : <..> - auth:AuthenticationError"),
            RedisAccess(sentinels="a:1", sentinel_password="x"),
            "redis_sentinel_password: the Sentinels refused",
        ),
        (
            MasterNotFoundError("No master found for 'm' : <..> - auth:AuthenticationError"),
            RedisAccess(sentinels="a:1"),
            "redis_sentinel_password: .* none is set",
        ),
        (
            ConnectionError("Error 1 connecting: [SSL: CERTIFICATE_VERIFY_FAILED] failed"),
            RedisAccess(tls=True),
            "redis_tls_cafile:",
        ),
        (
            ConnectionError("Error while reading: (104, 'Connection reset by peer')"),
            RedisAccess(tls=True),
            "redis_tls_certfile/redis_tls_keyfile:",
        ),
        (
            # The same refusal when the first command went out before the server's alert
            # (seen in CI under load).
            ConnectionError("Connection closed by the server before write"),
            RedisAccess(tls=True),
            "redis_tls_certfile/redis_tls_keyfile:",
        ),
    ],
)
def test_a_refusal_is_explained_by_the_setting_to_fix(
    error: Exception, access: RedisAccess, message: str
) -> None:
    reason = explain(error, access)
    assert reason is not None
    assert re.search(message, reason), reason


def test_redis_being_down_is_no_setting_s_fault() -> None:
    assert (
        explain(ConnectionError("Error 111 connecting. Connection refused."), RedisAccess()) is None
    )
    assert explain(TimeoutError("Timeout reading from socket"), RedisAccess()) is None
    error = ConnectionError("handshake")
    error.__context__ = ssl.SSLError("WRONG_VERSION_NUMBER")
    assert explain(error, RedisAccess(tls=True)) is not None


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"redis_password": "a", "redis_password_file": "f"}, "set one, not both"),
        ({"redis_tls_cafile": "ca"}, "redis_tls_cafile: needs redis_tls"),
        ({"redis_tls": "true", "redis_tls_certfile": "c"}, "set both or neither"),
        ({"redis_sentinel_password": "x"}, "only used with redis_sentinels"),
        ({"redis_url": "127.0.0.1:6379"}, "redis_url: must start with redis://"),
        (
            {"redis_url": "redis://:pw@h:1/0", "redis_password": "pw"},
            "redis_url carries a password and redis_password",
        ),
    ],
)
def test_redis_settings_that_cannot_work_are_refused_at_load(
    settings: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(env={}, overrides=CLUSTER | settings)


def test_the_redis_passwords_are_masked_wherever_settings_are_shown() -> None:
    assert shown("redis_password", "s3cret") == "***"
    assert shown("redis_sentinel_password", "s3cret") == "***"
    assert shown("redis_password_file", "/etc/pw") == "/etc/pw"
