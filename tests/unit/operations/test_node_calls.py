"""Signed node-to-node admin calls (`bridge.operations.node_calls`), with literals: what a node
accepts, and that each fault is refused with a message naming it."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.operations.node_calls import (
    CALLER_HEADER,
    MAX_NONCES,
    NONCE_HEADER,
    SIGNATURE_HEADER,
    TARGET_HEADER,
    TIMESTAMP_HEADER,
    NodeCallRefused,
    NodeCallVerifier,
    admin_call_keys,
    is_node_call,
    sign_call,
)

OLD, NEW, STRANGER = b"o" * 32, b"n" * 32, b"s" * 32
NOW = 1_790_000_000.0
PATH = "/api/v1/search/clients?q=dev-&limit=10"
NONCE = "0123456789abcdef0123456789abcdef"


def signed(
    secret: bytes = OLD,
    *,
    method: str = "GET",
    path: str = PATH,
    body: bytes = b"",
    caller: str = "a",
    target: str = "b",
    now: float = NOW,
    nonce: str | None = None,
) -> dict[str, str]:
    """The headers node `caller` sends: a call signed with `secret` (defaults: a GET search)."""
    (key,) = admin_call_keys([secret])
    return sign_call(key, method, path, body, caller, target, now, nonce)


def verifier(*secrets: bytes, node_id: str = "b", max_nonces: int = MAX_NONCES) -> NodeCallVerifier:
    """Node `node_id`'s check of calls, accepting `secrets` (default: `OLD` alone)."""
    return NodeCallVerifier(node_id, admin_call_keys(secrets or (OLD,)), max_nonces=max_nonces)


def refusal(
    check: NodeCallVerifier,
    headers: dict[str, str],
    *,
    method: str = "GET",
    path_qs: str = PATH,
    body: bytes = b"",
    now: float = NOW,
) -> str:
    """The message of the refusal of this call (it must be refused)."""
    with pytest.raises(NodeCallRefused) as caught:
        check.verify(method, path_qs, body, headers, now)
    return str(caught.value)


def test_a_call_signed_with_the_cluster_secret_names_its_caller() -> None:
    headers = signed()
    assert verifier().verify("GET", PATH, b"", headers, NOW + 2) == "a"
    assert headers[CALLER_HEADER] == "a" and headers[TARGET_HEADER] == "b"
    assert headers[TIMESTAMP_HEADER] == str(int(NOW))
    assert len(headers[NONCE_HEADER]) == 32 and len(headers[SIGNATURE_HEADER]) == 64


def test_a_signature_is_never_the_secret_or_the_key_and_each_call_has_its_own_nonce() -> None:
    first, second = signed(), signed()
    assert first[NONCE_HEADER] != second[NONCE_HEADER]
    assert first[SIGNATURE_HEADER] != second[SIGNATURE_HEADER]
    (key,) = admin_call_keys([OLD])
    for value in first.values():
        assert OLD.decode() not in value and key.hex() not in value


def test_a_call_signed_with_another_secret_is_refused() -> None:
    assert "wrong signature" in refusal(verifier(), signed(STRANGER))


def test_during_rotation_a_call_signed_with_either_secret_is_accepted() -> None:
    check = verifier(NEW, OLD)
    assert check.verify("GET", PATH, b"", signed(OLD), NOW) == "a"
    assert check.verify("GET", PATH, b"", signed(NEW), NOW) == "a"
    assert "wrong signature" in refusal(check, signed(STRANGER))


def test_the_first_secret_signs() -> None:
    new_key, old_key = admin_call_keys([NEW, OLD])
    headers = sign_call(new_key, "GET", PATH, b"", "a", "b", NOW)
    assert verifier(NEW).verify("GET", PATH, b"", headers, NOW) == "a"
    assert "wrong signature" in refusal(verifier(OLD), headers)
    assert old_key != new_key


@pytest.mark.parametrize(
    "call",
    [
        {"path_qs": "/api/v1/search/clients?q=dev-&limit=1000"},
        {"path_qs": "/api/v1/search/subscriptions?q=dev-&limit=10"},
        {"method": "DELETE"},
        {"body": b"{}"},
    ],
    ids=["query", "path", "method", "body"],
)
def test_an_altered_request_is_refused(call: dict[str, Any]) -> None:
    assert "wrong signature" in refusal(verifier(), signed(), **call)


@pytest.mark.parametrize("header", [CALLER_HEADER, TIMESTAMP_HEADER, NONCE_HEADER])
def test_an_altered_header_is_refused(header: str) -> None:
    headers = signed()
    headers[header] = {
        CALLER_HEADER: "c",
        TIMESTAMP_HEADER: str(int(NOW) + 1),
        NONCE_HEADER: "f" * 32,
    }[header]
    assert "wrong signature" in refusal(verifier(), headers)


def test_a_body_is_covered_by_its_hash() -> None:
    body = b'{"topic": "a/b"}'
    headers = signed(method="POST", body=body)
    assert verifier().verify("POST", PATH, body, headers, NOW) == "a"


@pytest.mark.parametrize("skew", [-31.0, 31.0, 3600.0])
def test_a_call_signed_outside_the_window_is_refused(skew: float) -> None:
    message = refusal(verifier(), signed(), now=NOW + skew)
    assert "30 s either way" in message


def test_a_call_at_the_edge_of_the_window_is_accepted() -> None:
    assert verifier().verify("GET", PATH, b"", signed(now=NOW - 30), NOW) == "a"
    assert verifier().verify("GET", PATH, b"", signed(now=NOW + 30), NOW) == "a"


def test_a_replayed_call_is_refused_while_its_timestamp_is_acceptable() -> None:
    check = verifier()
    headers = signed()
    assert check.verify("GET", PATH, b"", headers, NOW) == "a"
    assert "replayed" in refusal(check, headers, now=NOW + 1)
    assert "replayed" in refusal(check, headers, now=NOW + 30)
    # After the window it is refused as expired, and its nonce is no longer held.
    assert "either way" in refusal(check, headers, now=NOW + 31)
    check.verify("GET", PATH, b"", signed(now=NOW + 40), NOW + 40)
    assert check.remembered == 1


def test_a_call_signed_for_another_node_is_refused() -> None:
    message = refusal(verifier(node_id="b"), signed(target="impostor"))
    assert message == "node call signed for node 'impostor', but this is node 'b'"


def test_a_call_missing_headers_names_them() -> None:
    headers = signed()
    del headers[SIGNATURE_HEADER], headers[NONCE_HEADER]
    message = refusal(verifier(), headers)
    assert NONCE_HEADER in message and SIGNATURE_HEADER in message
    assert "node call without" in refusal(verifier(), {CALLER_HEADER: "a"})


def test_malformed_fields_are_refused_before_any_signature_is_computed() -> None:
    for header, value, fault in (
        (TIMESTAMP_HEADER, "soon", "Unix time"),
        (NONCE_HEADER, "abc", "32 lowercase hex"),
        (SIGNATURE_HEADER, "Z" * 64, "64 lowercase hex"),
    ):
        headers = {**signed(), header: value}
        assert fault in refusal(verifier(), headers)


def test_a_node_without_a_cluster_secret_accepts_no_node_call() -> None:
    check = NodeCallVerifier("b", ())
    assert "no cluster secret" in refusal(check, signed())


def test_remembered_nonces_are_bounded_and_a_full_table_refuses_until_they_expire() -> None:
    check = verifier(max_nonces=3)
    for n in range(3):
        check.verify("GET", PATH, b"", signed(nonce=f"{n:032x}"), NOW)
    assert "more than 3 node calls" in refusal(check, signed(nonce="f" * 32))
    later = NOW + 31
    assert check.verify("GET", PATH, b"", signed(nonce="f" * 32, now=later), later) == "a"
    assert check.remembered == 1


def test_a_refused_call_does_not_use_up_its_nonce() -> None:
    check = verifier()
    forged = {**signed(nonce=NONCE), SIGNATURE_HEADER: "0" * 64}
    assert "wrong signature" in refusal(check, forged)
    assert check.verify("GET", PATH, b"", signed(nonce=NONCE), NOW) == "a"


def test_any_node_call_header_marks_a_request_as_a_node_call() -> None:
    assert not is_node_call({"Authorization": "Bearer x"})
    for name in signed():
        assert is_node_call({name: "x"})


def test_fields_with_line_breaks_cannot_be_signed_or_accepted() -> None:
    with pytest.raises(ValueError, match="line breaks"):
        signed(caller="a\nb")
    headers = {**signed(), CALLER_HEADER: "a\nb"}
    assert "line breaks" in refusal(verifier(), headers)
