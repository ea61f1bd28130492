"""SCRAM-SHA-256 (bridge.access.scram): the server against RFC 7677's test vector and against an
independent client (scramp), its refusals, and the credentials `python -m bridge.passwd` stores
for file users (Redis users: tests/integration/test_scram_redis.py)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import io
import sys

import pytest
import scramp
from hypothesis import given
from hypothesis import strategies as st

from bridge.access import AccessControl, passwd
from bridge.access import scram as scram_module
from bridge.access.auth import AuthResult, PasswordFile
from bridge.access.hashes import AuthConfigError, hash_password
from bridge.access.scram import (
    ScramCredential,
    ScramError,
    ScramServer,
    ScramState,
    fake_credential,
    make_credential,
    saslprep,
)
from bridge.config import Config

KEY = b"decoy key of the tests"

# RFC 7677 section 3: user "user", password "pencil".
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_SERVER_FIRST = (
    b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
)
RFC_CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def rfc_server() -> ScramServer:
    return ScramServer(KEY, server_nonce=RFC_SERVER_NONCE)


def client_final(password: str, gs2_header: str, client_first_bare: str, server_first: bytes):
    """A client-final-message computed from RFC 5802's formulas (an independent client for the
    cases scramp does not send: the "y" flag, an authzid)."""
    fields = dict(item.split("=", 1) for item in server_first.decode().split(","))
    salted = hashlib.pbkdf2_hmac(
        "sha256", password.encode(), base64.b64decode(fields["s"]), int(fields["i"])
    )
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    binding = base64.b64encode(gs2_header.encode()).decode()
    without_proof = f"c={binding},r={fields['r']}"
    auth_message = f"{client_first_bare},{server_first.decode()},{without_proof}"
    signature = hmac.digest(hashlib.sha256(client_key).digest(), auth_message.encode(), "sha256")
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()


def exchange_with_scramp(server: ScramServer, credential, username: str, password: str) -> bytes:
    """Run a whole exchange between `server` and scramp's client; returns the server-final
    message after scramp checked the server's signature in it."""
    client = scramp.ScramClient(["SCRAM-SHA-256"], username, password)
    assert server.client_first(client.get_client_first().encode()) == username
    client.set_server_first(server.server_first(credential).decode())
    final = server.client_final(client.get_client_final().encode())
    client.set_server_final(final.decode())  # raises unless the server proved the key too
    return final


# -- RFC 7677 test vector ------------------------------------------------------------------


def test_rfc7677_vector_produces_the_rfc_server_messages():
    credential = make_credential("pencil", 4096, RFC_SALT)
    server = rfc_server()
    assert server.client_first(RFC_CLIENT_FIRST) == "user"
    assert server.state is ScramState.CREDENTIAL
    assert server.server_first(credential) == RFC_SERVER_FIRST
    assert server.client_final(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL
    assert server.authenticated and server.username == "user"


def test_rfc7677_vector_fails_with_another_password():
    server = rfc_server()
    server.client_first(RFC_CLIENT_FIRST)
    server.server_first(make_credential("pencils", 4096, RFC_SALT))
    with pytest.raises(ScramError) as failed:
        server.client_final(RFC_CLIENT_FINAL)
    assert failed.value.server_error == "invalid-proof"
    assert server.state is ScramState.FAILED and not server.authenticated


# -- credentials ---------------------------------------------------------------------------


def test_credential_matches_scramp_and_round_trips_through_its_text_form():
    salt, stored_key, server_key, iterations = scramp.ScramMechanism().make_auth_info(
        "pencil", iteration_count=4096, salt=RFC_SALT
    )
    credential = make_credential("pencil", salt=RFC_SALT)
    assert credential == ScramCredential(salt, iterations, stored_key, server_key)
    text = credential.encode()
    assert text.startswith("scram-sha-256$4096$W22ZaJ0SNY7soEsUEjb6gQ==$")
    assert ":" not in text and " " not in text
    assert ScramCredential.parse(text) == credential


def test_new_credentials_have_fresh_salts():
    one, two = make_credential("same"), make_credential("same")
    assert len(one.salt) == 16 and one.salt != two.salt and one.stored_key != two.stored_key


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("scrypt$4096$AAAAAAAAAAA=$AA==$AA==", "form"),
        ("scram-sha-256$4096$AAAAAAAAAAA=$AA==", "form"),
        ("scram-sha-256$4k$AAAAAAAAAAA=$" + "A" * 44 + "$" + "A" * 44, "decimal"),
        ("scram-sha-256$1000$AAAAAAAAAAA=$" + "A" * 44 + "$" + "A" * 44, "iteration count"),
        ("scram-sha-256$4096$AAAA$" + "A" * 44 + "$" + "A" * 44, "salt is too short"),
        ("scram-sha-256$4096$AAAAAAAAAAA=$AAAA$" + "A" * 44, "32 bytes"),
        ("scram-sha-256$4096$AAAAAAAAAAA=$" + "!" * 44 + "$" + "A" * 44, "base64"),
    ],
)
def test_malformed_credentials_are_refused_saying_why(text, message):
    with pytest.raises(ValueError, match=message):
        ScramCredential.parse(text)


def test_saslprep_maps_and_refuses_as_rfc4013_says():
    assert saslprep("I\u00adX", allow_unassigned=False) == "IX"  # soft hyphen mapped to nothing
    assert saslprep("user", allow_unassigned=False) == "user"
    assert saslprep("USER", allow_unassigned=False) == "USER"  # case is kept
    assert saslprep("\u00aa", allow_unassigned=False) == "a"  # NFKC
    assert saslprep("\u2168", allow_unassigned=False) == "IX"
    assert saslprep("a\u00a0b", allow_unassigned=False) == "a b"  # non-ASCII space
    with pytest.raises(ValueError, match="prohibited"):
        saslprep("\u0007", allow_unassigned=False)
    with pytest.raises(ValueError, match="right-to-left"):
        saslprep("\u0627\u0031", allow_unassigned=False)
    with pytest.raises(ValueError, match="unassigned"):
        saslprep("\u0221", allow_unassigned=False)
    assert saslprep("\u0221", allow_unassigned=True) == "\u0221"  # query strings may


def test_password_is_saslprepped_and_one_saslprep_refuses_is_used_as_is():
    assert make_credential("I\u00adX", salt=RFC_SALT) == make_credential("IX", salt=RFC_SALT)
    assert make_credential("a\u0007b", salt=RFC_SALT) != make_credential("ab", salt=RFC_SALT)


# -- exchanges -----------------------------------------------------------------------------


def test_full_exchange_with_the_scramp_client():
    credential = make_credential("s3cret ✓")
    server = ScramServer(KEY)
    final = exchange_with_scramp(server, credential, "alice", "s3cret ✓")
    assert final.startswith(b"v=")
    assert server.authenticated and server.username == "alice"


def test_server_nonces_are_random_and_extend_the_clients():
    firsts = []
    for _ in range(2):
        server = ScramServer(KEY)
        server.client_first(b"n,,n=alice,r=clientnonce")
        firsts.append(server.server_first(make_credential("pw", salt=RFC_SALT)).decode())
    nonces = [first.split(",")[0].removeprefix("r=") for first in firsts]
    assert all(n.startswith("clientnonce") and len(n) >= len("clientnonce") + 24 for n in nonces)
    assert nonces[0] != nonces[1]


def test_wrong_password_fails_with_invalid_proof():
    server = ScramServer(KEY)
    with pytest.raises(ScramError) as failed:
        exchange_with_scramp(server, make_credential("right"), "alice", "wrong")
    assert failed.value.server_error == "invalid-proof"
    assert not server.authenticated


def test_unknown_user_gets_a_stable_fake_salt_and_fails_like_a_wrong_password():
    known = make_credential("pw")
    answers = {}
    for name, credential in (("alice", known), ("mallory", None), ("mallory", None)):
        server = ScramServer(KEY, server_nonce="fixed")
        server.client_first(b"n,,n=" + name.encode() + b",r=abc")
        answers.setdefault(name, []).append(server.server_first(credential))
    # Same shape as a real user's answer, and the same salt on every attempt (as a real user).
    assert len(answers["mallory"][0]) == len(answers["alice"][0])
    assert answers["mallory"][0] == answers["mallory"][1]
    assert b",i=4096" in answers["mallory"][0]
    other = ScramServer(KEY)
    other.client_first(b"n,,n=mallor,r=abc")
    assert other.server_first(None).split(b",")[1] != answers["mallory"][0].split(b",")[1]

    with pytest.raises(ScramError) as wrong_password:
        exchange_with_scramp(ScramServer(KEY), known, "alice", "guess")
    with pytest.raises(ScramError) as unknown_user:
        exchange_with_scramp(ScramServer(KEY), None, "mallory", "guess")
    assert unknown_user.value.server_error == wrong_password.value.server_error
    assert str(unknown_user.value) == str(wrong_password.value)


def test_unknown_user_fails_even_if_the_fake_credential_matched(monkeypatch):
    # Nobody knows a password for the fake credential; if somebody did, still no login.
    monkeypatch.setattr(scram_module, "fake_credential", lambda *args: make_credential("pw"))
    with pytest.raises(ScramError, match="wrong proof"):
        exchange_with_scramp(ScramServer(KEY), None, "mallory", "pw")


def test_fake_credentials_depend_on_name_and_key():
    fake = fake_credential("mallory", KEY, 4096)
    assert fake == fake_credential("mallory", KEY, 4096)
    assert fake.salt != fake_credential("mallory", b"other key", 4096).salt
    assert fake.salt != fake_credential("mallorz", KEY, 4096).salt
    assert (len(fake.salt), len(fake.stored_key), len(fake.server_key)) == (16, 32, 32)


def test_tampered_nonce_in_client_final_fails():
    credential = make_credential("pw")
    client = scramp.ScramClient(["SCRAM-SHA-256"], "alice", "pw")
    server = ScramServer(KEY)
    server.client_first(client.get_client_first().encode())
    client.set_server_first(server.server_first(credential).decode())
    final = client.get_client_final()
    c, r, p = final.split(",")
    with pytest.raises(ScramError, match="nonce"):
        server.client_final(f"{c},{r}x,{p}".encode())
    assert not server.authenticated


def test_server_nonce_replaced_by_the_client_fails():
    server = ScramServer(KEY, server_nonce="serverpart")
    server.client_first(b"n,,n=alice,r=clientpart")
    first = server.server_first(make_credential("pw"))
    forged = first.replace(b"serverpart", b"attackerpart")
    with pytest.raises(ScramError, match="nonce"):
        server.client_final(client_final("pw", "n,,", "n=alice,r=clientpart", forged))


def test_channel_binding_request_is_refused():
    server = ScramServer(KEY)
    with pytest.raises(ScramError, match="channel binding is not supported") as refused:
        server.client_first(b"p=tls-server-end-point,,n=alice,r=abc")
    assert refused.value.server_error == "channel-binding-not-supported"
    assert server.state is ScramState.FAILED


def test_client_that_could_bind_but_thinks_we_cannot_is_accepted():
    credential = make_credential("pw")
    server = ScramServer(KEY)
    server.client_first(b"y,,n=alice,r=abc")
    first = server.server_first(credential)
    assert server.client_final(client_final("pw", "y,,", "n=alice,r=abc", first)).startswith(b"v=")


def test_channel_binding_data_must_repeat_the_gs2_header():
    server = ScramServer(KEY)
    server.client_first(b"y,,n=alice,r=abc")
    first = server.server_first(make_credential("pw"))
    with pytest.raises(ScramError) as failed:
        server.client_final(client_final("pw", "n,,", "n=alice,r=abc", first))
    assert failed.value.server_error == "channel-bindings-dont-match"


def test_authzid_must_name_the_user_itself():
    credential = make_credential("pw")
    server = ScramServer(KEY)
    server.client_first(b"n,a=alice,n=alice,r=abc")
    first = server.server_first(credential)
    server.client_final(client_final("pw", "n,a=alice,", "n=alice,r=abc", first))
    assert server.authenticated
    with pytest.raises(ScramError, match="another user"):
        ScramServer(KEY).client_first(b"n,a=admin,n=alice,r=abc")


def test_user_names_are_unescaped_and_saslprepped():
    assert ScramServer(KEY).client_first(b"n,,n=a=2Cb=3Dc,r=abc") == "a,b=c"
    assert ScramServer(KEY).client_first("n,,n=bj\u00f6rn\u00a0k,r=abc".encode()) == "bj\u00f6rn k"
    with pytest.raises(ScramError) as bad_escape:
        ScramServer(KEY).client_first(b"n,,n=a=41,r=abc")
    assert bad_escape.value.server_error == "invalid-encoding"
    with pytest.raises(ScramError) as control:
        ScramServer(KEY).client_first(b"n,,n=a\x07b,r=abc")
    assert control.value.server_error == "invalid-username-encoding"
    with pytest.raises(ScramError, match="empty user name"):
        ScramServer(KEY).client_first("n,,n=\u00ad,r=abc".encode())


def test_user_name_with_comma_and_equals_through_scramp():
    server = ScramServer(KEY)
    exchange_with_scramp(server, make_credential("pw"), "a,b=c", "pw")
    assert server.username == "a,b=c"


@pytest.mark.parametrize(
    "message",
    [
        b"",
        b"n,,",
        b"n,n=alice,r=abc",
        b"x,,n=alice,r=abc",
        b"n,,m=ext,n=alice,r=abc",
        b"n,,n=alice",
        b"n,,r=abc,n=alice",
        b"n,,n=alice,r=",
        b"n,,n=alice,r=a\x01b",
        b"n,,n=alice,r=caf\xc3\xa9",
        b"n,,n=\xff,r=abc",
        b"n,b=bob,n=alice,r=abc",
    ],
)
def test_malformed_client_first_is_refused(message):
    server = ScramServer(KEY)
    with pytest.raises(ScramError):
        server.client_first(message)
    assert server.state is ScramState.FAILED


def test_mandatory_extension_is_refused():
    with pytest.raises(ScramError) as failed:
        ScramServer(KEY).client_first(b"n,,m=ext,n=alice,r=abc")
    assert failed.value.server_error == "extensions-not-supported"


@pytest.mark.parametrize(
    "message",
    [
        b"",
        b"c=biws",
        b"c=biws,r=abcsrv",
        b"r=abcsrv,c=biws,p=AAAA",
        b"c=biws,r=abcsrv,p=!!!!",
        b"c=b iws,r=abcsrv,p=" + base64.b64encode(bytes(32)),
        b"c=biws,r=abcsrv,p=" + base64.b64encode(bytes(31)),
        b"c=biws,r=abcsrv,x=1",
        b"\xff",
    ],
)
def test_malformed_client_final_is_refused(message):
    server = ScramServer(KEY, server_nonce="srv")
    server.client_first(b"n,,n=alice,r=abc")
    server.server_first(make_credential("pw"))
    with pytest.raises(ScramError):
        server.client_final(message)
    assert server.state is ScramState.FAILED


def test_calls_out_of_order_fail_and_a_failed_exchange_stays_failed():
    server = ScramServer(KEY)
    with pytest.raises(ScramError, match="awaiting client-first"):
        server.client_final(RFC_CLIENT_FINAL)
    with pytest.raises(ScramError, match="failed"):
        server.client_first(RFC_CLIENT_FIRST)
    done = rfc_server()
    done.client_first(RFC_CLIENT_FIRST)
    done.server_first(make_credential("pencil", salt=RFC_SALT))
    done.client_final(RFC_CLIENT_FINAL)
    with pytest.raises(ScramError, match="succeeded"):  # a replayed final is not a new login
        done.client_final(RFC_CLIENT_FINAL)
    assert not done.authenticated


@given(st.binary(max_size=200))
def test_any_client_first_parses_or_raises_scram_error(data):
    server = ScramServer(KEY)
    try:
        username = server.client_first(data)
    except ScramError:
        assert server.state is ScramState.FAILED
    else:
        assert username and server.state is ScramState.CREDENTIAL


PW_CREDENTIAL = make_credential("pw", salt=RFC_SALT)  # made once: PBKDF2 costs milliseconds


@given(st.binary(max_size=200))
def test_any_client_final_without_the_proof_raises_scram_error(data):
    server = ScramServer(KEY, server_nonce="srv")
    server.client_first(b"n,,n=alice,r=abc")
    server.server_first(PW_CREDENTIAL)
    with pytest.raises(ScramError):
        server.client_final(data)


# -- credentials in the password file --------------------------------------------------------


@pytest.fixture
def fast_hashes(monkeypatch):
    """Cheap scrypt hashes for the passwd runs (SCRAM credentials keep their real 4096)."""
    monkeypatch.setattr(passwd, "hash_password", lambda pw: hash_password(pw, n=2**10))


def passwd_add(monkeypatch, path, username, password, *options):
    monkeypatch.setattr(sys, "stdin", io.StringIO(password + "\n"))
    argv = [str(path), "add", username, "--password-stdin", *options]
    assert passwd.main(argv) == 0


def scram_login(access: AccessControl, username: str, password: str) -> bool:
    """A SCRAM login through the access front door, as the connection code runs it."""

    async def run() -> bool:
        server = access.new_scram_exchange()
        client = scramp.ScramClient(["SCRAM-SHA-256"], username, password)
        name = server.client_first(client.get_client_first().encode())
        credential = await access.scram_credential(name)
        client.set_server_first(server.server_first(credential).decode())
        try:
            client.set_server_final(
                server.client_final(client.get_client_final().encode()).decode()
            )
        except ScramError:
            return False
        return server.authenticated

    return asyncio.run(run())


def test_passwd_add_stores_a_scram_credential_found_by_the_lookup(
    tmp_path, monkeypatch, fast_hashes
):
    path = tmp_path / "passwd"
    passwd_add(monkeypatch, path, "alice", "wonderland")
    line = path.read_text().splitlines()[0]
    assert line.startswith("alice:scrypt$") and ":scram-sha-256$4096$" in line

    access = AccessControl(Config(password_file=str(path)))
    credential = asyncio.run(access.scram_credential("alice"))
    assert credential is not None and credential.iterations == 4096
    assert scram_login(access, "alice", "wonderland")
    assert not scram_login(access, "alice", "looking-glass")
    assert not scram_login(access, "mallory", "wonderland")
    assert asyncio.run(access.scram_credential("mallory")) is None
    result, _ = asyncio.run(access.authenticate("c", "alice", b"wonderland"))
    assert result is AuthResult.ACCEPTED  # the plain path reads the same line

    passwd_add(monkeypatch, path, "alice", "looking-glass")  # a new password replaces both
    access = AccessControl(Config(password_file=str(path)))
    assert scram_login(access, "alice", "looking-glass")
    assert not scram_login(access, "alice", "wonderland")


def test_no_scram_option_and_old_lines_keep_the_plain_path_only(tmp_path, monkeypatch, fast_hashes):
    path = tmp_path / "passwd"
    path.write_text(f"# written before SCRAM\nold:{hash_password('pw', n=2**10)}\n")
    passwd_add(monkeypatch, path, "nosc", "pw", "--no-scram")
    assert path.read_text().splitlines()[2].count(":") == 1

    access = AccessControl(Config(password_file=str(path)))
    for name in ("old", "nosc"):
        assert asyncio.run(access.scram_credential(name)) is None
        assert not scram_login(access, name, "pw")
        assert asyncio.run(access.authenticate("c", name, b"pw"))[0] is AuthResult.ACCEPTED


def test_file_line_with_colons_in_the_name_and_a_scram_field(tmp_path):
    credential = make_credential("pw")
    path = tmp_path / "passwd"
    path.write_text(f"dave:x:y : {hash_password('pw', n=2**10)} : {credential.encode()} \n")
    users = PasswordFile(path)
    assert users.usernames == ["dave:x:y"]
    assert users.scram_credential("dave:x:y") == credential
    assert users.authenticate("c", "dave:x:y", b"pw") is AuthResult.ACCEPTED


def test_malformed_scram_field_names_file_and_line(tmp_path):
    path = tmp_path / "passwd"
    stored = hash_password("pw", n=2**10)
    path.write_text(f"# users\nalice:{stored}:scram-sha-256$4096$AAAA$AA==$AA==\n")
    with pytest.raises(AuthConfigError, match=r"passwd:2: SCRAM salt is too short"):
        PasswordFile(path)


def test_file_decoy_uses_the_files_iteration_count(tmp_path):
    path = tmp_path / "passwd"
    stored = hash_password("pw", n=2**10)
    path.write_text(f"alice:{stored}:{make_credential('pw', iterations=8192).encode()}\n")
    access = AccessControl(Config(password_file=str(path)))
    server = access.new_scram_exchange()
    server.client_first(b"n,,n=mallory,r=abc")
    assert server.server_first(None).endswith(b",i=8192")


def test_passwd_help_says_who_can_use_scram(capsys):
    assert passwd.main(["passwords", "add", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--no-scram" in help_text
    assert "fail SCRAM logins as not authorized" in help_text


def test_passwd_warns_when_scram_could_not_find_the_name(
    tmp_path, monkeypatch, fast_hashes, capsys
):
    path = tmp_path / "passwd"
    passwd_add(monkeypatch, path, "plain", "pw")
    assert capsys.readouterr().err == ""
    passwd_add(monkeypatch, path, "\u2168", "pw")  # ROMAN NUMERAL NINE: SASLprep makes it "IX"
    assert "SCRAM logins will not find it" in capsys.readouterr().err
