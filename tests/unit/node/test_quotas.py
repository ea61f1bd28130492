"""The pure counters behind the quotas (`bridge.node.quotas`): what a Tally counts when things are
kept, replaced and removed, and which limit `fault_adding` names."""

from __future__ import annotations

from bridge.node.quotas import (
    Quota,
    Tally,
    awaiting_rel_fault,
    kept_size,
    subscription_fault,
    will_fault,
)
from bridge.node.retained import RetainedMessages
from bridge.node.retained_copies import RetainedCopies
from bridge.state import encode_message
from bridge.storage.base import Message

NAMES = ("count", "bytes", "count_each", "bytes_each")


def test_a_tally_counts_adds_replacements_and_removals_in_total_and_per_owner() -> None:
    tally = Tally()
    tally.add("a", "alice", 10)
    tally.add("b", "alice", 5)
    tally.add("c", "bob", 7)
    assert (tally.count, tally.bytes) == (3, 22)
    assert tally.of("alice") == (2, 15)
    tally.add("a", "bob", 1)  # replaced by another owner
    assert (tally.count, tally.bytes) == (3, 13)
    assert tally.of("alice") == (1, 5) and tally.of("bob") == (2, 8)
    tally.remove("b")
    tally.remove("missing")
    assert tally.of("alice") == (0, 0) and (tally.count, tally.bytes) == (2, 8)
    tally.clear()
    assert (tally.count, tally.bytes, tally.of("bob")) == (0, 0, (0, 0))


def test_fault_adding_names_the_first_limit_a_new_thing_would_pass() -> None:
    tally = Tally()
    tally.add("a", "alice", 10)
    tally.add("b", "bob", 10)
    assert tally.fault_adding("c", "carol", 10, Quota(2, names=NAMES)) == "count=2 reached"
    assert "bytes=25" in (tally.fault_adding("c", "carol", 6, Quota(0, 25, names=NAMES)) or "")
    fault = tally.fault_adding("c", "alice", 1, Quota(0, 0, 1, names=NAMES))
    assert fault == "count_each=1 reached by 'alice'"
    fault = tally.fault_adding("c", "alice", 11, Quota(0, 0, 0, 20, names=NAMES))
    assert fault is not None and fault.startswith("bytes_each=20")
    assert tally.fault_adding("c", "carol", 10, Quota(3, 30, 1, 10, names=NAMES)) is None


def test_replacing_ones_own_thing_counts_only_the_difference_in_bytes() -> None:
    tally = Tally()
    tally.add("a", "alice", 10)
    full = Quota(1, 10, 1, 10, names=NAMES)
    assert tally.fault_adding("a", "alice", 10, full) is None
    assert tally.fault_adding("a", "alice", 11, full) is not None
    # Taking over another's topic is one more for the new owner, none more in total.
    assert tally.fault_adding("a", "bob", 5, full) is None
    assert tally.fault_adding("a", "bob", 5, Quota(1, 10, 0, 4, names=NAMES)) is not None


def test_zero_leaves_a_limit_off() -> None:
    tally = Tally()
    for i in range(100):
        tally.add(str(i), "alice", 1000)
    assert tally.fault_adding("new", "alice", 10**9, Quota()) is None


def test_the_single_limits_refuse_only_past_the_limit() -> None:
    assert subscription_fault(2, 3) is None
    assert subscription_fault(3, 3) == "max_subscriptions_per_client=3 filters held already"
    assert awaiting_rel_fault(1, 2) is None
    assert "max_awaiting_rel=2" in (awaiting_rel_fault(2, 2) or "")
    assert will_fault(100, 100) is None
    assert "max_will_bytes=100" in (will_fault(101, 100) or "")
    assert kept_size("é/x", b"12345") == 5 + 4


def _message(topic: str, payload: bytes, publisher: str) -> Message:
    return Message(topic, payload, 1, True, publisher, f"k-{topic}", 0, "n", {})


def test_retained_messages_tally_what_they_keep_from_clients_peers_and_the_store() -> None:
    quota = Quota(2, 0, 1, 0, names=NAMES)
    retained = RetainedMessages(quota)
    retained.apply(_message("a", b"xx", "alice"))
    assert retained.fault_setting("a", "alice", b"yyy") is None  # replacing her own
    assert retained.fault_setting("b", "alice", b"y") == "count_each=1 reached by 'alice'"
    retained.from_peer("b", encode_message(_message("b", b"yy", "bob")))
    assert retained.fault_setting("c", "carol", b"z") == "count=2 reached"
    retained.apply(_message("a", b"", "alice"))  # cleared
    assert retained.fault_setting("c", "carol", b"z") is None
    retained.keep_in_memory(_message("$SYS/x", b"1", "node"))  # the node's own: not counted
    assert retained.tally.count == 1
    retained.restore({"d": encode_message(_message("d", b"dddd", "dave"))})
    assert (retained.tally.count, retained.tally.bytes, retained.tally.of("bob")) == (1, 5, (0, 0))


def test_a_retained_copy_counts_as_unsent_until_the_clients_cursor_passes_the_queues_end() -> None:
    copies = RetainedCopies()
    copy = ("key-1", 1, ())
    assert not copies.unsent("c", copy, {"c:c": 0})
    copies.queued("c", copy, {"c:c": 3})
    assert copies.unsent("c", copy, {"c:c": 3})
    assert not copies.unsent("c", ("key-1", 2, ()), {"c:c": 3})  # another QoS: another copy
    assert not copies.unsent("c", copy, {})  # no cursor: it may start past the copy
    copies.prune("c", {"c:c": 3})
    assert len(copies) == 1
    copies.prune("c", {"c:c": 4})  # sent: a later SUBSCRIBE stores a fresh copy
    assert len(copies) == 0 and not copies.unsent("c", copy, {"c:c": 4})
    copies.queued("c", copy, {"c:c": 4})
    copies.drop("c", copy)
    copies.queued("d", copy, {"c:d": 0})
    copies.forget("d")
    assert len(copies) == 0
