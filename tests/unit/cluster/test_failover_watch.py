"""When the registry's client holds its writes back from a master the Sentinels are deposing
(`bridge.cluster.failover_watch`), from their events."""

from __future__ import annotations

import pytest

from bridge.cluster import failover_watch
from bridge.cluster.failover_watch import FailoverWatch

ODOWN = "master mqtt-bridge 10.0.0.1 6379 #quorum 2/2"
MASTER = "master mqtt-bridge 10.0.0.1 6379"


def test_writes_wait_from_the_first_odown_until_the_switch_to_the_new_master() -> None:
    watch = FailoverWatch("mqtt-bridge")
    assert not watch.suspected and watch.generation == 0
    watch.event("+odown", ODOWN)
    watch.event("+odown", ODOWN)  # the next Sentinel's: the same gate
    assert watch.suspected and watch.generation == 1
    watch.event("+try-failover", MASTER)
    watch.event("-odown", MASTER)  # the old master answers again: the failover goes on
    assert watch.suspected
    watch.event("+switch-master", "mqtt-bridge 10.0.0.1 6379 10.0.0.2 6379")
    assert not watch.suspected and watch.generation == 1


def test_a_master_back_before_any_failover_started_takes_writes_again() -> None:
    watch = FailoverWatch("mqtt-bridge")
    watch.event("+odown", ODOWN)
    watch.event("-odown", MASTER)
    assert not watch.suspected


def test_an_abandoned_failover_reopens_and_the_next_odown_is_a_new_gate() -> None:
    watch = FailoverWatch("mqtt-bridge")
    watch.event("+odown", ODOWN)
    watch.event("+try-failover", MASTER)
    watch.event("-failover-abort-no-good-slave", MASTER)
    assert not watch.suspected
    watch.event("+odown", ODOWN)
    assert watch.suspected and watch.generation == 2


def test_other_masters_events_change_nothing() -> None:
    watch = FailoverWatch("mqtt-bridge")
    watch.event("+odown", "master other 10.0.0.9 6379 #quorum 2/2")
    assert not watch.suspected
    watch.event("+odown", ODOWN)
    watch.event("+switch-master", "other 10.0.0.9 6379 10.0.0.8 6379")
    assert watch.suspected


def test_a_gate_nobody_reopens_opens_by_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(failover_watch.time, "monotonic", lambda: now[0])
    watch = FailoverWatch("mqtt-bridge")
    watch.event("+odown", ODOWN)
    now[0] += failover_watch.GATE_MAX - 1
    assert watch.suspected
    now[0] += 2
    assert not watch.suspected


def test_a_slower_sentinels_news_of_the_deposed_master_does_not_close_writes_again() -> None:
    watch = FailoverWatch("mqtt-bridge")
    watch.event("+odown", ODOWN)
    watch.event("+switch-master", "mqtt-bridge 10.0.0.1 6379 10.0.0.2 6379")
    watch.event("+odown", ODOWN)  # about 10.0.0.1, the old master
    assert not watch.suspected
    watch.event("+odown", "master mqtt-bridge 10.0.0.2 6379 #quorum 2/2")
    assert watch.suspected
