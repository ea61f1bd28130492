"""The nemesis history checker finds each kind of wrong it is meant to find, and nothing in a
history where all went well."""

from __future__ import annotations

from tests.nemesis.history import History, check


def _history() -> History:
    """Publisher p (QoS 1 on connection 0, QoS 2 on connection 1), subscriber s on connection 2."""
    history = History(["s"])
    for client in ("p", "p", "s"):
        index = history.opened(client, client, 0.0)
        history.connacked(index, False, 0.1)
    for n, (payload, qos, connection) in enumerate([("a", 1, 0), ("b", 1, 0), ("c", 2, 1)]):
        history.published(payload, "p", qos, connection, 1.0 + n)
        history.acknowledged(payload, 1.5 + n)
    return history


def _deliver(history: History, *payloads: str) -> None:
    for n, payload in enumerate(payloads):
        history.delivered("s", payload, 2, 5.0 + n)


def test_a_history_where_everything_arrived_once_in_order_passes() -> None:
    history = _history()
    _deliver(history, "a", "b", "c", "a")  # QoS 1 may come twice
    verdict = check(history)
    assert verdict.ok, verdict.details()
    assert (verdict.acknowledged, verdict.delivered) == (3, 4)


def test_an_acknowledged_message_never_delivered_is_lost() -> None:
    history = _history()
    history.published("d", "p", 1, 0, 9.0)  # never acknowledged: not owed to anyone
    _deliver(history, "a", "c")
    verdict = check(history)
    assert verdict.lost == {"s": ["b"]} and verdict.never_acknowledged == 1
    assert not verdict.ok


def test_qos2_delivered_twice_is_found_and_qos1_twice_is_not() -> None:
    history = _history()
    _deliver(history, "a", "a", "b", "c", "c")
    assert check(history).qos2_twice == {"s": ["c"]}


def test_messages_of_one_connection_delivered_reversed_are_out_of_order() -> None:
    history = _history()
    _deliver(history, "b", "a", "c")
    assert check(history).out_of_order == {"s": [("b", "a")]}


def test_a_resent_message_may_overtake() -> None:
    history = _history()
    history.published("a", "p", 1, 0, 4.0)  # resent after a reconnect
    _deliver(history, "b", "a", "c")
    assert check(history).ok


def test_an_old_connection_answered_after_a_take_over_is_a_split_brain() -> None:
    history = _history()
    _deliver(history, "a", "b", "c")
    old = history.opened("r", "r", 10.0)
    history.connacked(old, True, 10.1)
    new = history.opened("r", "r/roam", 11.0)
    history.connacked(new, True, 11.1)
    history.answered(old, 11.0, 11.05)  # asked before the take-over: fine
    assert check(history).ok
    history.answered(old, 11.2, 11.3)  # asked after it and answered: served twice
    verdict = check(history)
    assert len(verdict.split_brain) == 1 and "r/roam" in verdict.split_brain[0]


def test_wills_must_match_the_abandoned_connections() -> None:
    history = _history()
    _deliver(history, "a", "b", "c")
    history.abandon("w1")
    history.will("w1")
    assert check(history, ["w1", "w2"]).ok
    history.will("w2")  # disconnected cleanly: no will
    history.will("w1")  # a second will of one death
    assert check(history, ["w1", "w2"]).wills_wrong == {"w1": (1, 2), "w2": (0, 1)}


def test_a_persistent_session_gone_when_its_client_came_back_is_a_lost_session() -> None:
    history = _history()
    _deliver(history, "a", "b", "c")
    first = history.opened("s", "s", 10.0)
    history.connacked(first, True, 10.1)
    assert check(history).ok  # subscribers' first CONNACK above had no session: a new one
    again = history.opened("s", "s", 12.0)
    history.connacked(again, False, 12.1)
    verdict = check(history)
    assert verdict.sessions_lost == ["s"] and not verdict.ok
