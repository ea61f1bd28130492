"""Signing RocketMQ requests (bridge/storage/rocketmq/acl.py), the client's TLS options
(tls.py) and the settings that carry both.

The known vectors were computed by RocketMQ 5.3.3's own client: `AclClientRPCHook` on a
`RemotingCommand` with these extFields and body, run with the jars deploy/rocketmq/fetch.sh
caches (the snippet is in the docstring of the first test).
The real broker accepting our signatures is proven by tests/rocketmq/test_acl_tls.py.
"""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.checks import check_config
from bridge.config import Config, ConfigError
from bridge.redact import shown
from bridge.storage.rocketmq import rocketmq_security
from bridge.storage.rocketmq.acl import (
    ACCESS_KEY,
    SECURITY_TOKEN,
    SIGNATURE,
    Credentials,
    RequestSigner,
    authentication_hint,
)
from bridge.storage.rocketmq.connection import RemotingError
from bridge.storage.rocketmq.messages import encode_properties
from bridge.storage.rocketmq.sendframe import SendFrames
from bridge.storage.rocketmq.tls import TlsOptions, TlsOptionsError
from bridge.storage.rocketmq.wire import ResponseCode, decode_command

PROPS = "KEYS\x01k1\x02TAGS\x01factory/line1/press3\x02"


def test_signatures_match_those_rocketmq_s_java_client_computes() -> None:
    """Vectors from RocketMQ 5.3.3 (Java 17, jars of deploy/rocketmq/fetch.sh):

    RemotingCommand r = RemotingCommand.createRequestCommand(10, null);
    r.addExtField("b", "factory"); r.addExtField("a", "mqtt-bridge");
    r.addExtField("i", "KEYS\\u0001k1\\u0002TAGS\\u0001factory/line1/press3\\u0002");
    r.setBody("payload \\u00e9".getBytes(UTF_8));
    new AclClientRPCHook(new SessionCredentials("rocketmq", "12345678"))
        .doBeforeRequest("x", r);                  // Signature XyxYRe3MMK/Mmg4ltYxgOgvWQ/Q=
    RemotingCommand t = RemotingCommand.createRequestCommand(34, null);
    t.addExtField("consumerGroup", "g\\u00fc");
    new AclClientRPCHook(new SessionCredentials("ak", "sk", "tok"))
        .doBeforeRequest("x", t);                  // Signature xDBpbvmixcH+Um/HxkarKzxUTZE=
    """
    fields = {"b": "factory", "a": "mqtt-bridge", "i": PROPS}
    RequestSigner(Credentials("rocketmq", "12345678")).sign(fields, "payload é".encode())
    assert fields == {
        "a": "mqtt-bridge",
        "b": "factory",
        "i": PROPS,
        ACCESS_KEY: "rocketmq",
        SIGNATURE: "XyxYRe3MMK/Mmg4ltYxgOgvWQ/Q=",
    }
    with_token = RequestSigner(Credentials("ak", "sk", "tok")).signed({"consumerGroup": "gü"})
    assert with_token == {
        "consumerGroup": "gü",
        ACCESS_KEY: "ak",
        SECURITY_TOKEN: "tok",
        SIGNATURE: "xDBpbvmixcH+Um/HxkarKzxUTZE=",
    }


def test_signing_again_replaces_the_old_signature_rather_than_signing_it() -> None:
    signer = RequestSigner(Credentials("rocketmq", "12345678"))
    once = signer.signed({"b": "factory", "a": "mqtt-bridge", "i": PROPS}, "payload é".encode())
    twice = signer.signed(once, "payload é".encode())
    assert twice == once


def test_the_signature_covers_values_and_body_but_not_the_names_of_the_fields() -> None:
    signer = RequestSigner(Credentials("u", "s"))
    base = signer.signed({"a": "1", "b": "2"}, b"x")[SIGNATURE]
    assert signer.signed({"a": "1", "b": "3"}, b"x")[SIGNATURE] != base
    assert signer.signed({"a": "1", "b": "2"}, b"y")[SIGNATURE] != base
    # Same values in the same key order: the same signature (RocketMQ signs values only).
    assert signer.signed({"c": "1", "d": "2"}, b"x")[SIGNATURE] == base
    assert (
        RequestSigner(Credentials("u", "other")).signed({"a": "1", "b": "2"}, b"x")[SIGNATURE]
        != base
    )


def test_fields_are_signed_in_java_string_order_not_python_code_point_order() -> None:
    """Java's TreeMap orders by UTF-16 code units: U+FF5E sorts after U+1F600 there."""
    signer = RequestSigner(Credentials("u", "s"))
    fields = {"\uff5e": "x", "\U0001f600": "y"}
    java_order = signer.signature_after_prefix([b"y", b"x"], b"")
    signed = signer.signed(fields)
    # AccessKey sorts first in both orders, and signature_after_prefix starts after it.
    assert signed[SIGNATURE] == java_order


@given(
    st.text(min_size=1, max_size=40),
    st.integers(0, 7),
    st.dictionaries(
        st.text(
            st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"),
            min_size=1,
            max_size=8,
        ),
        st.text(
            st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"),
            min_size=1,
            max_size=20,
        ),
        max_size=4,
    ),
    st.integers(0, 2**45),
    st.binary(max_size=64),
    st.booleans(),
)
def test_a_signed_prebuilt_send_frame_carries_the_signature_of_its_own_fields(
    topic: str, queue_id: int, props: dict[str, str], born: int, body: bytes, token: bool
) -> None:
    """The hot path signs from its cached pieces; decoding its frame and signing the decoded
    fields the generic way must give the same Signature."""
    credentials = Credentials("rocketmq", "s3cret", "tok" if token else "")
    frames = SendFrames("mqtt-bridge", signer=RequestSigner(credentials))
    frame = frames.frame(5, topic, queue_id, encode_properties(props), born, body)
    command = decode_command(frame[4:])
    assert command.ext_fields[ACCESS_KEY] == "rocketmq"
    assert command.ext_fields.get(SECURITY_TOKEN, "") == credentials.security_token
    unsigned = {k: v for k, v in command.ext_fields.items() if k != SIGNATURE}
    expected = RequestSigner(credentials).signed(unsigned, body)[SIGNATURE]
    assert command.ext_fields[SIGNATURE] == expected


def test_an_unsigned_prebuilt_send_frame_has_no_credential_fields() -> None:
    frame = SendFrames("g").frame(1, "t", 0, "", 0, b"x")
    assert not {ACCESS_KEY, SIGNATURE} & set(decode_command(frame[4:]).ext_fields)


def test_the_secret_key_is_never_in_the_repr_of_credentials() -> None:
    assert "hunter2" not in repr(Credentials("rocketmq", "hunter2"))


def test_empty_credentials_are_refused() -> None:
    with pytest.raises(ValueError, match="access key"):
        Credentials("", "s")
    with pytest.raises(ValueError, match="secret key"):
        Credentials("u", "")


@pytest.mark.parametrize(
    ("remark", "setting"),
    [
        ("check signature failed.", "rocketmq_secret_key: the broker refused the signature"),
        ("username cannot be null.", "rocketmq_access_key: the broker requires credentials"),
        ("User:bob is not found.", "rocketmq_access_key: the broker knows no such user"),
        ("User:bob is disabled.", "rocketmq_access_key: the broker has disabled this user"),
        (
            "User:bob has no permission to access Topic:factory from 127.0.0.1, no matched "
            "policies.",
            "rocketmq_access_key: the broker's ACL does not allow this user",
        ),
    ],
)
def test_a_broker_refusing_credentials_is_an_error_that_starts_with_the_setting_to_fix(
    remark: str, setting: str
) -> None:
    error = RemotingError(ResponseCode.NO_PERMISSION, remark, addr="127.0.0.1:1", request=10)
    assert str(error).startswith(setting)
    assert remark in str(error)
    assert error.authentication_refused


def test_other_no_permission_answers_are_not_blamed_on_the_credentials() -> None:
    remark = "the broker[broker-a] sending message is forbidden"
    assert authentication_hint(remark) is None
    error = RemotingError(ResponseCode.NO_PERMISSION, remark)
    assert not error.authentication_refused
    assert error.refused_credential is None
    assert not str(error).startswith("rocketmq_")


# --- TLS options and the settings ---------------------------------------------------------------


@pytest.fixture(scope="module")
def ca_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ca")
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=test CA", "-keyout", str(path / "ca.key"), "-out", str(path / "ca.pem"),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return path / "ca.pem"


def test_tls_options_make_a_verifying_client_context(ca_file: Path) -> None:
    context = TlsOptions(cafile=str(ca_file)).context()
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname
    assert not TlsOptions(cafile=str(ca_file), verify_hostname=False).context().check_hostname


def test_tls_options_name_the_file_that_cannot_be_used(tmp_path: Path, ca_file: Path) -> None:
    with pytest.raises(TlsOptionsError, match=r"^cafile: cannot load") as missing:
        TlsOptions(cafile=str(tmp_path / "nope.pem")).context()
    assert missing.value.option == "cafile"
    with pytest.raises(TlsOptionsError, match=r"^keyfile: .*needs both"):
        TlsOptions(cafile=str(ca_file), certfile=str(ca_file)).context()
    with pytest.raises(TlsOptionsError, match=r"^certfile: cannot load"):
        TlsOptions(certfile=str(ca_file), keyfile=str(ca_file)).context()


def _config(**settings: object) -> Config:
    return Config(store="rocketmq", **settings)  # type: ignore[arg-type]


def test_settings_give_the_client_its_credentials_and_tls_options(ca_file: Path) -> None:
    config = _config(
        rocketmq_access_key="gw",
        rocketmq_secret_key="k",
        rocketmq_tls=True,
        rocketmq_tls_cafile=str(ca_file),
    )
    check_config(config)
    credentials, tls = rocketmq_security(config)
    assert credentials == Credentials("gw", "k")
    assert tls == TlsOptions(cafile=str(ca_file))
    assert rocketmq_security(_config()) == (None, None)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"rocketmq_access_key": "gw"}, "rocketmq_secret_key: rocketmq_access_key is set"),
        ({"rocketmq_secret_key": "k"}, "rocketmq_access_key: rocketmq_secret_key is set"),
        ({"rocketmq_tls_cafile": "/x.pem"}, "rocketmq_tls_cafile: set rocketmq_tls = true"),
        (
            {"rocketmq_tls": True, "rocketmq_tls_cafile": "/nonexistent/ca.pem"},
            "rocketmq_tls_cafile: cannot load",
        ),
    ],
)
def test_unusable_rocketmq_security_settings_are_refused_naming_the_setting(
    settings: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=f"^{message}"):
        check_config(_config(**settings))


def test_the_secret_key_can_come_from_a_file_and_not_from_both_places(tmp_path: Path) -> None:
    key_file = tmp_path / "rocketmq.key"
    key_file.write_text("# the gateway's RocketMQ key\n\n  s3cret  \n")
    from_file = {"rocketmq_access_key": "gw", "rocketmq_secret_key_file": str(key_file)}
    check_config(_config(**from_file))
    assert rocketmq_security(_config(**from_file))[0] == Credentials("gw", "s3cret")
    with pytest.raises(ConfigError, match=r"^rocketmq_secret_key and rocketmq_secret_key_file"):
        check_config(_config(**from_file, rocketmq_secret_key="other"))
    missing = {"rocketmq_access_key": "gw", "rocketmq_secret_key_file": str(tmp_path / "no")}
    with pytest.raises(ConfigError, match=r"^rocketmq_secret_key_file: cannot read"):
        check_config(_config(**missing))
    key_file.write_text("# nothing\n")
    with pytest.raises(ConfigError, match=r"^rocketmq_secret_key_file: .* holds no secret"):
        check_config(_config(**from_file))


def test_the_secret_key_is_masked_when_the_configuration_is_shown() -> None:
    assert shown("rocketmq_secret_key", "hunter2") == "***"
    assert shown("rocketmq_access_key", "gw") == "gw"
