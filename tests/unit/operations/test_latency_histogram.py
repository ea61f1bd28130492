"""The store-latency histogram puts each duration in the bucket Prometheus expects."""

from __future__ import annotations

from bisect import bisect_left

from hypothesis import given
from hypothesis import strategies as st

from bridge.counters import STORE_LATENCY_BUCKETS, LatencyHistogram

_DURATIONS = st.floats(min_value=0.0, max_value=100.0, allow_nan=False) | st.sampled_from(
    STORE_LATENCY_BUCKETS
)


@given(st.lists(_DURATIONS, max_size=50))
def test_each_duration_counts_in_the_first_bucket_not_below_it(durations: list[float]) -> None:
    histogram = LatencyHistogram()
    expected = [0] * (len(STORE_LATENCY_BUCKETS) + 1)
    for seconds in durations:
        histogram.observe(seconds)
        expected[bisect_left(STORE_LATENCY_BUCKETS, seconds)] += 1
    assert histogram.counts == expected
    assert histogram.count == len(durations)
    assert histogram.sum == sum(durations)


def test_a_duration_on_a_bound_counts_in_that_bound_and_beyond_the_last_in_inf() -> None:
    histogram = LatencyHistogram((0.001, 0.01))
    for seconds in (0.001, 0.0011, 0.01, 0.5):
        histogram.observe(seconds)
    assert histogram.cumulative() == [("0.001", 1), ("0.01", 3), ("+Inf", 4)]
