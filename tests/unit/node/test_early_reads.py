"""Rewinding readers after a failed write took back messages they could already read."""

from __future__ import annotations

from bridge.node.early_reads import rewind
from bridge.session import Session


def session(client_id: str, **cursors: int) -> Session:
    s = Session(client_id, persistent=True)
    s.cursors = dict(cursors)
    return s


def test_only_cursors_past_the_new_end_go_back_and_their_sessions_are_reported() -> None:
    ahead = session("ahead", q=7, other=3)
    ahead.resend_below = {"q": 6, "other": 2}
    behind = session("behind", q=4)
    unrelated = session("unrelated", other=9)
    moved: list[str] = []
    count = rewind([ahead, behind, unrelated], {"q": 5}, lambda s: moved.append(s.client_id))
    assert count == 1 and moved == ["ahead"]
    assert ahead.cursors == {"q": 5, "other": 3}
    # What now sits at offset 5 was never sent to it: no DUP flag on its first send.
    assert ahead.resend_below == {"q": 5, "other": 2}
    assert behind.cursors == {"q": 4}
    assert unrelated.cursors == {"other": 9}


def test_a_session_reading_several_rewound_queues_is_reported_once() -> None:
    s = session("s", a=3, b=8)
    moved: list[str] = []
    assert rewind([s], {"a": 1, "b": 2}, lambda x: moved.append(x.client_id)) == 1
    assert moved == ["s"] and s.cursors == {"a": 1, "b": 2}


def test_a_cursor_at_the_new_end_stays() -> None:
    s = session("s", q=5)
    assert rewind([s], {"q": 5}, lambda x: None) == 0
    assert s.cursors == {"q": 5}
