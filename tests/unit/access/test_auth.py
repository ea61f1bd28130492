"""Authentication: scrypt hashes, the password file and its verification cache."""

from __future__ import annotations

import asyncio
import base64
import re

import pytest

from bridge.access import AccessControl, hashes
from bridge.access.auth import AuthResult, PasswordFile
from bridge.access.hashes import AuthConfigError, hash_password, parse_hash, verify_password
from bridge.checks import load_config
from bridge.config import Config, ConfigError
from bridge.mqtt.packets import ConnackCode

FAST = {"n": 2**10, "r": 8, "p": 1}  # cheap parameters: tests need speed, not resistance


class Clock:
    """A settable clock for the cache TTL."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def scrypt_calls(monkeypatch):
    """Count the scrypt computations of bridge.access.hashes."""
    calls = []
    real = hashes._scrypt

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(hashes, "_scrypt", counting)
    return calls


def write_users(path, users, header="# users\n\n"):
    lines = [f"{name}:{hash_password(password, **FAST)}\n" for name, password in users.items()]
    path.write_text(header + "".join(lines))
    path.chmod(0o600)
    return path


@pytest.fixture
def pwfile(tmp_path):
    return write_users(tmp_path / "passwd", {"alice": "wonderland", "bob": "builder"})


# -- hashes ----------------------------------------------------------------------------------


def test_hash_and_verify_round_trip():
    stored = hash_password("s3cret ✓", **FAST)
    assert stored.startswith("scrypt$1024$8$1$")
    assert verify_password(stored, "s3cret ✓".encode())
    parsed = parse_hash(stored)
    assert len(parsed.salt) == 16 and len(parsed.digest) == 32


def test_salts_differ_so_equal_passwords_hash_differently():
    assert hash_password("same", **FAST) != hash_password("same", **FAST)


def test_new_hashes_are_argon2id_at_a_moderate_cost():
    stored = hash_password("x")  # one real-cost hash
    assert stored.startswith("$argon2id$v=19$m=19456,t=2,p=1$")
    assert isinstance(parse_hash(stored), hashes.Argon2Hash)
    assert verify_password(stored, b"x")
    assert not verify_password(stored, b"y")


def test_argon2_and_scrypt_users_live_in_one_file(tmp_path):
    path = tmp_path / "passwd"
    path.write_text(f"new:{hash_password('argon')}\nold:{hash_password('scrypt', **FAST)}\n")
    path.chmod(0o600)
    users = PasswordFile(path)
    assert users.authenticate("c", "new", b"argon") is AuthResult.ACCEPTED
    assert users.authenticate("c", "old", b"scrypt") is AuthResult.ACCEPTED
    assert users.authenticate("c", "new", b"scrypt") is AuthResult.BAD_CREDENTIALS


@pytest.mark.parametrize(
    ("stored", "message"),
    [
        ("$argon2id$v=19$m=19456,t=2,p=1$short", "not a valid"),
        ("$argon2id$v=19$m=4194304,t=2,p=1$c2FsdHNhbHRzYWx0$" + "A" * 43, "exceeds the limit"),
        ("$argon2id$v=19$m=19456,t=99,p=1$c2FsdHNhbHRzYWx0$" + "A" * 43, "exceeds the limit"),
        ("$argon2d$v=19$m=19456,t=2,p=1$c2FsdHNhbHRzYWx0$" + "A" * 43, "argon2id"),
    ],
)
def test_malformed_or_too_costly_argon2_hash_is_refused(stored, message):
    with pytest.raises(AuthConfigError, match=message):
        parse_hash(stored)


def test_wrong_password_is_rejected():
    stored = hash_password("right", **FAST)
    assert not verify_password(stored, b"wrong")
    assert not verify_password(stored, b"")
    assert not verify_password(stored, b"right\n")


def test_tampered_hash_is_rejected():
    stored = hash_password("right", **FAST)
    prefix, digest = stored.rsplit("$", 1)
    raw = bytearray(base64.b64decode(digest))
    raw[0] ^= 1
    assert not verify_password(f"{prefix}${base64.b64encode(bytes(raw)).decode()}", b"right")
    scheme, n, r, p, salt, digest = stored.split("$")
    other_salt = base64.b64encode(b"\x00" * 16).decode()
    assert not verify_password("$".join([scheme, n, r, p, other_salt, digest]), b"right")
    assert not verify_password("$".join([scheme, "2048", r, p, salt, digest]), b"right")


@pytest.mark.parametrize(
    ("stored", "message"),
    [
        ("plain", "form"),
        ("bcrypt$1024$8$1$AAAAAAAAAAA=$" + "A" * 44, "form"),
        ("scrypt$1000$8$1$AAAAAAAAAAA=$" + "A" * 44, "power of two"),
        ("scrypt$x$8$1$AAAAAAAAAAA=$" + "A" * 44, "decimal"),
        ("scrypt$1024$0$1$AAAAAAAAAAA=$" + "A" * 44, "r must be"),
        ("scrypt$1073741824$8$1$AAAAAAAAAAA=$" + "A" * 44, "MiB"),
        ("scrypt$1024$8$1$not base64!$" + "A" * 44, "salt is not valid base64"),
        ("scrypt$1024$8$1$AAAA$" + "A" * 44, "salt is too short"),
        ("scrypt$1024$8$1$AAAAAAAAAAA=$AAAA", "hash length"),
    ],
)
def test_malformed_hash_raises_a_clear_error(stored, message):
    with pytest.raises(AuthConfigError, match=message):
        verify_password(stored, b"x")


def test_hash_password_refuses_bad_cost():
    with pytest.raises(AuthConfigError):
        hash_password("x", n=1000)


# -- authenticators --------------------------------------------------------------------------


def test_result_values_are_connack_codes():
    assert AuthResult.ACCEPTED.connack_code == ConnackCode.ACCEPTED == 0
    assert AuthResult.BAD_CREDENTIALS.connack_code == ConnackCode.BAD_USERNAME_OR_PASSWORD == 4
    assert AuthResult.NOT_AUTHORIZED.connack_code == ConnackCode.NOT_AUTHORIZED == 5


def access_result(access, username, password, cert_cn=None):
    """What the node's access control answers a CONNECT (result only)."""
    return asyncio.run(access.authenticate("c", username, password, cert_cn))[0]


def test_authentication_off_accepts_everyone():
    allow = AccessControl(Config())
    assert access_result(allow, None, None) is AuthResult.ACCEPTED
    assert access_result(allow, "anyone", b"anything") is AuthResult.ACCEPTED
    assert access_result(allow, "anyone", None) is AuthResult.ACCEPTED


def test_password_file_results(pwfile):
    users = PasswordFile(pwfile)
    assert users.usernames == ["alice", "bob"]
    assert users.authenticate("c1", "alice", b"wonderland") is AuthResult.ACCEPTED
    assert users.authenticate("c2", "bob", b"builder") is AuthResult.ACCEPTED
    assert users.authenticate("c1", "alice", b"builder") is AuthResult.BAD_CREDENTIALS
    assert users.authenticate("c1", "mallory", b"wonderland") is AuthResult.BAD_CREDENTIALS
    assert users.authenticate("c1", "alice", None) is AuthResult.BAD_CREDENTIALS
    assert users.authenticate("c1", "", b"") is AuthResult.BAD_CREDENTIALS
    assert users.authenticate("c1", None, None) is AuthResult.NOT_AUTHORIZED


def test_anonymous_allowed_but_given_credentials_must_be_right(pwfile):
    users = PasswordFile(pwfile, allow_anonymous=True)
    assert users.authenticate("c", None, None) is AuthResult.ACCEPTED
    assert users.authenticate("c", "alice", b"wonderland") is AuthResult.ACCEPTED
    assert users.authenticate("c", "alice", b"nope") is AuthResult.BAD_CREDENTIALS
    assert users.authenticate("c", "mallory", b"x") is AuthResult.BAD_CREDENTIALS
    assert users.authenticate("c", "alice", None) is AuthResult.BAD_CREDENTIALS
    assert users.authenticate("c", None, b"pw-without-user") is AuthResult.BAD_CREDENTIALS


def test_unknown_user_costs_a_decoy_scrypt_run(pwfile, scrypt_calls):
    users = PasswordFile(pwfile)
    assert users.authenticate("c", "mallory", b"x") is AuthResult.BAD_CREDENTIALS
    assert len(scrypt_calls) == 1  # same work as a known user: no timing oracle for names
    assert users.authenticate("c", "alice", None) is AuthResult.BAD_CREDENTIALS
    assert users.authenticate("c", None, None) is AuthResult.NOT_AUTHORIZED
    assert len(scrypt_calls) == 1


def test_file_format_comments_blank_lines_crlf_and_whitespace(tmp_path):
    stored = hash_password("pw", **FAST)
    path = tmp_path / "passwd"
    path.write_bytes(
        f"# comment\r\n\r\n   # indented comment\n  \t\ncarol : {stored} \r\n"
        f"dave:with:colons:{stored}\n".encode()
    )
    users = PasswordFile(path)
    assert users.usernames == ["carol", "dave:with:colons"]
    assert users.authenticate("c", "carol", b"pw") is AuthResult.ACCEPTED
    assert users.authenticate("c", "dave:with:colons", b"pw") is AuthResult.ACCEPTED


def test_empty_file_rejects_every_user(tmp_path):
    path = tmp_path / "passwd"
    path.write_text("# nobody yet\n")
    users = PasswordFile(path, allow_anonymous=True)
    assert users.authenticate("c", "alice", b"x") is AuthResult.BAD_CREDENTIALS
    assert users.authenticate("c", None, None) is AuthResult.ACCEPTED


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("no-colon-here", "expected username:hash"),
        (":scrypt$1024$8$1$AAAAAAAAAAA=$" + "A" * 44, "empty user name"),
        ("eve:plaintext", "form"),
        ("eve:scrypt$1024$8$1$AAAAAAAAAAA=$", "hash length"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, line, message):
    path = write_users(tmp_path / "passwd", {"alice": "pw"})
    with path.open("a") as fh:
        fh.write(line + "\n")
    with pytest.raises(AuthConfigError, match=rf"^{re.escape(str(path))}:4: .*{message}"):
        PasswordFile(path)


def test_duplicate_user_and_bad_encoding_are_errors(tmp_path):
    stored = hash_password("pw", **FAST)
    path = tmp_path / "passwd"
    path.write_text(f"alice:{stored}\n#\nalice:{stored}\n")
    with pytest.raises(AuthConfigError, match=r":3: duplicate user 'alice' \(first on line 1\)"):
        PasswordFile(path)
    path.write_bytes(b"# ok\n\xff\xfe:x\n")
    with pytest.raises(AuthConfigError, match=r":2: not valid UTF-8"):
        PasswordFile(path)


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(AuthConfigError, match=r"cannot read password file .*missing"):
        PasswordFile(tmp_path / "missing")


def test_reload_picks_up_changes_and_clears_the_cache(pwfile, scrypt_calls):
    users = PasswordFile(pwfile)
    assert users.authenticate("c", "alice", b"wonderland") is AuthResult.ACCEPTED
    assert users.authenticate("c", "alice", b"wonderland") is AuthResult.ACCEPTED
    assert len(scrypt_calls) == 1
    write_users(pwfile, {"alice": "new-password", "carol": "pw"})
    # Until reloaded, the old file (and the cache) still apply.
    assert users.authenticate("c", "alice", b"wonderland") is AuthResult.ACCEPTED
    users.reload()
    assert users.usernames == ["alice", "carol"]
    assert users.authenticate("c", "alice", b"wonderland") is AuthResult.BAD_CREDENTIALS
    assert users.authenticate("c", "alice", b"new-password") is AuthResult.ACCEPTED
    assert users.authenticate("c", "carol", b"pw") is AuthResult.ACCEPTED
    assert users.authenticate("c", "bob", b"builder") is AuthResult.BAD_CREDENTIALS


def test_failed_reload_keeps_the_previous_users(pwfile):
    users = PasswordFile(pwfile)
    pwfile.write_text("broken line\n")
    with pytest.raises(AuthConfigError, match=":1:"):
        users.reload()
    assert users.authenticate("c", "alice", b"wonderland") is AuthResult.ACCEPTED


def test_cache_skips_scrypt_until_the_ttl_expires(pwfile, scrypt_calls):
    clock = Clock()
    users = PasswordFile(pwfile, cache_ttl=60.0, clock=clock)
    assert users.authenticate("c", "alice", b"wonderland") is AuthResult.ACCEPTED
    assert len(scrypt_calls) == 1
    for _ in range(100):  # a reconnect storm
        assert users.authenticate("c", "alice", b"wonderland") is AuthResult.ACCEPTED
    assert len(scrypt_calls) == 1
    clock.now += 59.9
    assert users.authenticate("c", "alice", b"wonderland") is AuthResult.ACCEPTED
    assert len(scrypt_calls) == 1
    clock.now += 0.2  # past the TTL of the first verification
    assert users.authenticate("c", "alice", b"wonderland") is AuthResult.ACCEPTED
    assert len(scrypt_calls) == 2
    assert users.authenticate("c", "alice", b"wonderland") is AuthResult.ACCEPTED
    assert len(scrypt_calls) == 2


def test_cache_is_per_user_and_password_and_never_caches_failures(pwfile, scrypt_calls):
    users = PasswordFile(pwfile, clock=Clock())
    assert users.authenticate("c", "alice", b"wonderland") is AuthResult.ACCEPTED
    assert users.authenticate("c", "alice", b"wrong") is AuthResult.BAD_CREDENTIALS
    assert users.authenticate("c", "alice", b"wrong") is AuthResult.BAD_CREDENTIALS
    assert users.authenticate("c", "bob", b"wonderland") is AuthResult.BAD_CREDENTIALS
    assert len(scrypt_calls) == 4
    assert users.authenticate("c", "alice", b"wonderland") is AuthResult.ACCEPTED
    assert len(scrypt_calls) == 4


def test_verified_lately_answers_from_the_cache_without_hashing(pwfile, scrypt_calls):
    clock = Clock()
    users = PasswordFile(pwfile, cache_ttl=60.0, clock=clock)
    assert not users.verified_lately("alice", b"wonderland")
    assert users.authenticate("c", "alice", b"wonderland") is AuthResult.ACCEPTED
    assert users.verified_lately("alice", b"wonderland")
    assert not users.verified_lately("alice", b"wrong")
    assert len(scrypt_calls) == 1
    clock.now += 60.1
    assert not users.verified_lately("alice", b"wonderland")


def test_cache_can_be_disabled_and_is_bounded(pwfile, scrypt_calls):
    users = PasswordFile(pwfile, cache_ttl=0)
    users.authenticate("c", "alice", b"wonderland")
    users.authenticate("c", "alice", b"wonderland")
    assert len(scrypt_calls) == 2
    users = PasswordFile(pwfile, cache_size=1, clock=Clock())
    users.authenticate("c", "alice", b"wonderland")
    users.authenticate("c", "bob", b"builder")  # evicts alice
    assert len(users.cache) == 1
    users.authenticate("c", "alice", b"wonderland")
    assert len(scrypt_calls) == 5


def test_access_control_from_the_settings(pwfile):
    assert not AccessControl(Config()).authenticating
    with pytest.raises(ConfigError, match="needs a password_file"):
        load_config(env={}, overrides={"allow_anonymous": "false"})
    strict = AccessControl(Config(password_file=str(pwfile), allow_anonymous=False))
    assert isinstance(strict.password_file, PasswordFile)
    assert access_result(strict, None, None) is AuthResult.NOT_AUTHORIZED
    assert access_result(strict, "alice", b"wonderland") is AuthResult.ACCEPTED
    by_default = AccessControl(Config(password_file=str(pwfile)))
    assert access_result(by_default, None, None) is AuthResult.NOT_AUTHORIZED
    lenient = AccessControl(Config(password_file=str(pwfile), allow_anonymous=True))
    assert access_result(lenient, None, None) is AuthResult.ACCEPTED
    certified = AccessControl(
        Config(tls_cn_as_username=True, tls_client_cert="required", allow_anonymous=False)
    )
    assert asyncio.run(certified.authenticate("c", None, None, "device-7")) == (
        AuthResult.ACCEPTED,
        "device-7",
    )
    assert access_result(certified, None, None) is AuthResult.NOT_AUTHORIZED


def test_world_readable_file_is_warned_about(pwfile, caplog):
    pwfile.chmod(0o644)
    with caplog.at_level("WARNING", logger="bridge.auth"):
        PasswordFile(pwfile)
    assert "chmod 600" in caplog.text
