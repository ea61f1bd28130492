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
    pytest.mark.timeout(240),
]

BEFORE_S = 3.0
HOLD_S = 10.0
"""Longer than node_timeout (6 s): the cluster has to act on each fault."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NemesisCluster]:
    work: Path = tmp_path_factory.mktemp("nemesis")
    cluster = NemesisCluster(work).start()
    try:
        yield cluster
    finally:
        cluster.stop()


KNOWN = {
    "redis-paused": "found by this harness, not fixed yet: the will of a client that died just "
    "after the Redis master froze is never published; its store on the node neither completes "
    "nor fails (no retry is logged), while the node's other Redis writes fail and recover",
}
"""Faults whose run fails today for the reason given: strict, so a fix shows as a failure of
this mark until the entry goes."""


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=KNOWN[n])) if n in KNOWN else n
        for n in FAULTS
    ],
)
def test_fault_loses_nothing_acknowledged_and_never_serves_a_client_twice(
    cluster: NemesisCluster, name: str
) -> None:
    result = run(cluster, [(FAULTS[name], BEFORE_S, HOLD_S)], tag=name.replace("-", "")[:12])
    print(f"\n{name}: {result.report()}")
    assert result.verdict.ok, f"{result.report()}\n{cluster.logs()}"
    assert result.recovery_s <= 2 * NODE_TIMEOUT, result.report()
