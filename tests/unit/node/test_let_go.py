"""The state of sessions a node let go (`bridge.node.let_go`): bounded, oldest dropped first."""

from __future__ import annotations

from bridge.node.let_go import LetGo


def test_the_oldest_state_is_dropped_first_when_over_the_bound() -> None:
    kept = LetGo(max_bytes=10)
    kept.keep("a", b"1234")
    kept.keep("b", b"5678")
    kept.keep("c", b"90ab")
    assert len(kept) == 2 and kept.pop("a") == b"" and kept.pop("b") == b"5678"


def test_a_state_kept_again_replaces_the_older_one_and_its_bytes() -> None:
    kept = LetGo(max_bytes=8)
    kept.keep("a", b"12345678")
    kept.keep("a", b"12")
    kept.keep("b", b"345678")
    assert kept.pop("a") == b"12" and kept.pop("b") == b"345678" and len(kept) == 0


def test_nothing_is_kept_of_a_clean_session_or_of_one_larger_than_the_bound() -> None:
    kept = LetGo(max_bytes=4)
    kept.keep("clean", b"")
    kept.keep("huge", b"12345")
    assert len(kept) == 0
