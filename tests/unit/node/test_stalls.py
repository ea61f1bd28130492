"""Noticing a pause of the process (`bridge.node.stalls`): who is asked, how often, with what."""

from __future__ import annotations

from bridge.node.stalls import StallWatch


def test_an_unwatched_node_never_takes_a_gap_for_a_pause() -> None:
    stalls = StallWatch()
    assert not 1e9 - stalls.ticked > stalls.limit
    assert stalls.stalled(1e9) is False


def test_a_pause_is_told_its_length_once_however_many_connections_notice_it() -> None:
    told: list[float] = []
    stalls = StallWatch()
    stalls.watch(100.0, 1.0, lambda gap: told.append(gap) is None)
    stalls.tick(100.5)
    assert 103.0 - stalls.ticked > stalls.limit and stalls.stalled(103.0)
    assert told == [2.5]
    assert not 103.2 - stalls.ticked > stalls.limit  # the next connection's check passes


def test_the_watchers_answer_says_whether_the_node_stopped_serving() -> None:
    stalls = StallWatch()
    stalls.watch(0.0, 1.0, lambda gap: gap > 5.0)
    assert not stalls.stalled(2.0)
    assert stalls.stalled(8.0)
