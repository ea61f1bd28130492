"""`QueueEnds`, what the RocketMQ store knows of each queue's end: it only grows by what is
learned and confirmed, and a correction after counting ahead never hides a message confirmed
while the read that proved it was waiting."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bridge.storage.rocketmq.queues import QueueEnds


def test_a_correction_sets_back_an_end_counted_ahead() -> None:
    ends = QueueEnds()
    ends.note("q", 10)
    ends.count_stored(["q"], 100)  # its SEND_OK came after a read had learned 10 already
    assert ends.end("q") == 11
    ends.correct("q", 10, seen=11)
    assert ends.end("q") == 10


def test_a_correction_is_dropped_when_a_message_was_confirmed_during_the_read() -> None:
    ends = QueueEnds()
    ends.note("q", 10)
    ends.count_stored(["q"], 100)
    seen = ends.end("q")  # 11: the read waits for offset 10
    ends.count_stored(["q"], 100)  # confirmed meanwhile; dispatched after the broker answered
    ends.correct("q", 10, seen=seen)
    assert ends.end("q") == 12  # the reader keeps looking: the message at 10 is coming


@given(st.lists(st.one_of(st.integers(0, 50).map(lambda n: ("note", n)), st.just(("count", 1)))))
def test_notes_and_counts_never_move_an_end_back(steps: list[tuple[str, int]]) -> None:
    ends = QueueEnds()
    last = 0
    for kind, value in steps:
        if kind == "note":
            ends.note("q", value)
        else:
            ends.count_stored(["q"], 10)
        assert ends.end("q") >= last
        last = ends.end("q")


@given(st.permutations(["held", "k1", "k2"]))
def test_an_own_message_a_held_read_brought_is_counted_once_whatever_comes_first(
    order: list[str],
) -> None:
    """A read held at the queue's end is answered as the broker dispatches, before or after
    the SEND_OK of this store's own messages (k1, k2): the end is the true end either way,
    never one past it for a message both noted and counted."""
    ends = QueueEnds()
    ends.note("q", 5)
    for event in order:
        if event == "held":
            ends.seen("q", ["other", "k1", "k2"], 8)  # someone else's at 5, ours at 6 and 7
        else:
            ends.count_stored(["q", "p"], 100, event)
    assert ends.end("q") == 8
    assert ends.end("p") == 2  # not held: counted as before
