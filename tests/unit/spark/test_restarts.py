"""The streaming job's restart policy: waits that double while failures follow one another, a
limit within a window, and failures older than the window forgotten."""

from __future__ import annotations

from spark.restarts import RestartPolicy


def test_waits_double_while_failures_follow_one_another_up_to_the_cap() -> None:
    policy = RestartPolicy(limit=10, window_s=600.0, first_wait_s=2.0, max_wait_s=20.0)
    waits = [policy.failed(now) for now in (0.0, 3.0, 8.0, 17.0, 34.0, 55.0)]
    assert waits == [2.0, 4.0, 8.0, 16.0, 20.0, 20.0]


def test_the_job_gives_up_on_one_failure_more_than_the_limit_within_the_window() -> None:
    policy = RestartPolicy(limit=3, window_s=100.0)
    assert all(policy.failed(now) is not None for now in (0.0, 10.0, 20.0))
    assert policy.failed(30.0) is None


def test_failures_older_than_the_window_no_longer_count() -> None:
    policy = RestartPolicy(limit=2, window_s=100.0, first_wait_s=1.0)
    assert policy.failed(0.0) == 1.0
    assert policy.failed(50.0) == 2.0
    # The first failure is 100 s old now: this is the second within the window, not the third.
    assert policy.failed(100.0) == 2.0
    # A job that fails once a day runs for ever.
    assert all(policy.failed(100.0 + day * 86_400.0) == 1.0 for day in range(1, 30))
