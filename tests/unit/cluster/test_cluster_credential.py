"""The cluster secret's reading rules, the derived keys, and secrets redacted when shown."""

from __future__ import annotations

import pytest

from bridge.cluster.credential import (
    ADMIN_CALLS,
    PEER_LINK,
    CredentialError,
    derive_key,
    read_cluster_secrets,
)
from bridge.redact import redact_url, shown

SECRET = "a" * 32


def test_secret_file_lists_secrets_in_order_skipping_blanks_and_comments(tmp_path):
    path = tmp_path / "secret"
    path.write_text(f"# rotated 2026-11\n{'n' * 40}\n\n{SECRET}\n")
    assert read_cluster_secrets("", str(path)) == (b"n" * 40, SECRET.encode())


def test_short_missing_or_doubly_set_secret_is_refused_naming_the_setting(tmp_path):
    with pytest.raises(CredentialError, match=r"cluster_secret: .*at least 32"):
        read_cluster_secrets("short", "")
    with pytest.raises(CredentialError, match="cluster_secret_file: cannot read"):
        read_cluster_secrets("", str(tmp_path / "absent"))
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n")
    with pytest.raises(CredentialError, match="holds no secret"):
        read_cluster_secrets("", str(empty))
    with pytest.raises(CredentialError, match="set one, not both"):
        read_cluster_secrets(SECRET, str(empty))
    assert read_cluster_secrets("", "") == ()


def test_each_use_of_the_secret_gets_its_own_key():
    secret = SECRET.encode()
    assert derive_key(secret, PEER_LINK) != derive_key(secret, ADMIN_CALLS)
    assert derive_key(secret, PEER_LINK) != derive_key(b"b" * 32, PEER_LINK)
    assert len(derive_key(secret, PEER_LINK)) == 32


def test_secrets_and_url_passwords_are_masked_when_shown():
    assert shown("admin_token", "tok") == "***"
    assert shown("admin_token", "") == ""
    assert shown("cluster_secret", SECRET) == "***"
    assert (
        shown("redis_url", "redis://app:pw@127.0.0.1:6379/0") == "redis://app:***@127.0.0.1:6379/0"
    )
    assert shown("redis_url", "redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert redact_url("rediss://:pw@[::1]:6380") == "rediss://:***@[::1]:6380"
    assert shown("listen", ["0.0.0.0:1883"]) == ["0.0.0.0:1883"]
