"""Retained messages (`bridge.node.retained`): changed only once durable, announced to peers."""

from __future__ import annotations

from bridge.node.retained import RetainedMessages
from bridge.state import KIND_RETAINED, decode_message
from bridge.storage import Message


def test_the_durable_record_is_built_without_changing_the_map():
    retained = RetainedMessages()
    (update,) = retained.updates(Message("s/1", b"on", 1, True))
    assert update.kind == KIND_RETAINED and update.key == "s/1"
    assert decode_message(update.value).payload == b"on"
    assert "s/1" not in retained, "asking for the record must not act"
    (clear,) = retained.updates(Message("s/1", b"", 1, True))
    assert clear.value is None


def test_apply_sets_and_an_empty_payload_clears_and_peers_are_told_both():
    retained = RetainedMessages()
    told: list[tuple[str, bytes]] = []
    retained.announce = lambda topic, record: told.append((topic, record))
    retained.apply(Message("s/1", b"on", 1, True))
    assert retained["s/1"].payload == b"on"
    retained.apply(Message("s/1", b"", 1, True))
    assert "s/1" not in retained
    assert [t for t, _ in told] == ["s/1", "s/1"]
    assert decode_message(told[0][1]).payload == b"on" and told[1][1] == b""


def test_in_memory_statistics_are_neither_announced_nor_counted_as_published():
    retained = RetainedMessages()
    retained.announce = lambda topic, record: (_ for _ in ()).throw(AssertionError(topic))
    retained.keep_in_memory(Message("$SYS/brokers/n1/uptime", b"5", 0, True))
    assert len(retained) == 1 and retained.published_count() == 0


def test_peers_and_a_full_reload_replace_entries():
    retained = RetainedMessages()
    retained.from_peer("a", retained.updates(Message("a", b"1", 1, True))[0].value or b"")
    assert retained["a"].payload == b"1"
    retained.from_peer("a", b"")
    assert "a" not in retained
    retained.restore({"b": retained.updates(Message("b", b"2", 0, True))[0].value or b""})
    assert list(retained) == ["b"]


def test_matching_gives_each_message_once_with_the_highest_granted_qos():
    retained = RetainedMessages()
    for topic in ("a/b", "a/c", "x"):
        retained.apply(Message(topic, b"p", 2, True))
    found = {m.topic: qos for m, qos in retained.matching([("a/+", 0), ("a/b", 2), ("#", 1)])}
    assert found == {"a/b": 2, "a/c": 1, "x": 1}
