"""Who a session belongs to (`bridge.access.ownership`): the identity a CONNECT acts as, and
whether it may take a session bound to another."""

from __future__ import annotations

from bridge.access.ownership import ANONYMOUS, describe, identity_of, refusal


def test_a_user_and_no_user_are_identities_when_the_node_authenticates():
    assert identity_of("alice", authenticating=True) == "user:alice"
    assert identity_of(None, authenticating=True) == ANONYMOUS
    # An empty user name is a user name (MQTT allows it), not the absence of one.
    assert identity_of("", authenticating=True) == "user:"


def test_a_node_that_authenticates_nobody_binds_nothing():
    assert identity_of("alice", authenticating=False) is None
    assert refusal("user:alice", identity_of("mallory", authenticating=False)) is None


def test_only_the_identity_a_session_is_bound_to_may_take_it():
    assert refusal("user:alice", "user:alice") is None
    assert refusal("anonymous", "anonymous") is None
    assert refusal("user:alice", "user:mallory") is not None
    assert refusal("user:alice", ANONYMOUS) is not None
    assert refusal(ANONYMOUS, "user:alice") is not None


def test_an_unbound_session_may_be_taken_by_any_identity():
    assert refusal(None, "user:mallory") is None
    assert refusal(None, ANONYMOUS) is None


def test_a_refusal_names_the_refused_identity_escaped_and_never_the_owner():
    why = refusal("user:alice", "user:mal\nlory")
    assert why is not None
    assert "alice" not in why
    assert "'mal\\nlory'" in why
    assert describe("user:alice") == "user 'alice'"
    assert describe(ANONYMOUS) == "anonymous"
