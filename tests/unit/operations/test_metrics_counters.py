"""The node's counters: the hot ones are native ints, read like every other counter."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bridge.counters import HOT_COUNTERS, Metrics

names = st.sampled_from([*HOT_COUNTERS, "dropped_no_subscriber", "acl_denied_publish"])


@given(st.lists(st.tuples(names, st.integers(min_value=0, max_value=10**12)), max_size=40))
def test_every_counter_reads_back_what_was_added_whether_hot_or_not(adds):
    metrics = Metrics()
    expected: dict[str, int] = {}
    for name, amount in adds:
        metrics.inc(name, amount)
        expected[name] = expected.get(name, 0) + amount
    snapshot = metrics.snapshot()
    for name in {*HOT_COUNTERS, *expected}:
        assert metrics.get(name) == expected.get(name, 0)
        assert snapshot.get(name, 0) == expected.get(name, 0)
    assert set(HOT_COUNTERS) <= set(snapshot), "the hot counters are always reported"


def test_a_publish_is_counted_under_its_qos():
    metrics = Metrics()
    for qos in (0, 1, 1, 2, 2, 2):
        metrics.received(qos)
    assert [metrics.get(f"messages_in_qos{q}") for q in range(3)] == [1, 2, 3]
    metrics.messages_out_qos1 += 5
    metrics.bytes_out += 7
    assert metrics.snapshot()["messages_out_qos1"] == 5
    assert metrics.get("bytes_out") == 7
    assert "bytes_out" not in metrics._named, "a hot counter lives outside the dict"
