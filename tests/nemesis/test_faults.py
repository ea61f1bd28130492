"""Each fault the nemesis knows, once, on one shared cluster in network namespaces, under QoS 1
and QoS 2 load with persistent sessions, a roaming subscriber that takes its session over from
node to node, and will clients of which one dies during the fault. Judged from the clients'
histories: nothing acknowledged lost, no QoS 2 twice, one publisher's order kept, no ClientId
served by two connections at once, wills exactly once, and every node serving again within
2 x node_timeout of the fault's end (plus the client's own reconnect)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .cluster import NODE_TIMEOUT, NemesisCluster
from .faults import FAULTS
from .scenario import run

pytestmark = [
    pytest.mark.fault,
    pytest.mark.rocketmq,
    pytest.mark.nemesis,
    pytest.mark.timeout(300),
]

BEFORE_S = 2.0
HOLD_S = 8.0
"""Longer than node_timeout (6 s): the cluster has to act on each fault."""
TAIL_S = 3.0
"""Load after the cluster serves again, before the clients finish."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NemesisCluster]:
    work: Path = tmp_path_factory.mktemp("nemesis")
    cluster = NemesisCluster(work).start()
    try:
        yield cluster
    finally:
        cluster.stop()


KNOWN: dict[str, str] = {}
"""Faults whose run breaks a rule today, in some runs, for the reason given (none now): reported
as an expected failure when it does (only a broken rule counts as one: a cluster that does not
start fails the test), and as passing when that run did not hit it."""


class RuleBroken(AssertionError):
    """The history broke a rule, or the cluster served again too late."""


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.xfail(strict=False, raises=RuleBroken, reason=KNOWN[n]))
        if n in KNOWN
        else n
        for n in FAULTS
    ],
)
def test_fault_loses_nothing_acknowledged_and_never_serves_a_client_twice(
    cluster: NemesisCluster, name: str
) -> None:
    result = run(
        cluster, [(FAULTS[name], BEFORE_S, HOLD_S)], tag=name.replace("-", "")[:12], tail_s=TAIL_S
    )
    print(f"\n{name}: {result.report()}")
    if not result.verdict.ok:
        raise RuleBroken(f"{result.report()}\n{cluster.logs()}")
    if result.recovery_s > 2 * NODE_TIMEOUT:
        raise RuleBroken(f"served again too late:\n{result.report()}")
