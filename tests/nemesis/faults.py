"""The faults the nemesis injects into a running `NemesisCluster`, each a begin and an end.

A fault's `begin` breaks something now and `end` repairs it; between them the cluster runs on
under load. Nothing is restarted by hand: after `end` the cluster must serve again by itself.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass

from .cluster import NemesisCluster


@dataclass(frozen=True)
class Fault:
    name: str
    what: str
    """What happens, as docs/operations.md's table says it."""
    begin: Callable[[NemesisCluster], None]
    end: Callable[[NemesisCluster], None]


def _heal(cluster: NemesisCluster) -> None:
    cluster.net.heal()


def _cut(host: str, other: str) -> Callable[[NemesisCluster], None]:
    return lambda cluster: cluster.net.cut(host, other)


def _isolate(host: str) -> Callable[[NemesisCluster], None]:
    return lambda cluster: cluster.net.isolate(host)


def _split(side: list[str], other_side: list[str]) -> Callable[[NemesisCluster], None]:
    return lambda cluster: cluster.net.split(side, other_side)


def _node_pid(node_id: str) -> Callable[[NemesisCluster], int]:
    return lambda cluster: cluster.nodes[node_id].pid


def _broker_pid(cluster: NemesisCluster) -> int:
    assert cluster.mq is not None
    pid = cluster.mq.pid("broker")
    assert pid is not None, "the broker is not running"
    return pid


def _redis_master_pid(cluster: NemesisCluster) -> int:
    """The PID of the server that is master now (a failover may have moved the role)."""
    assert cluster.redis is not None
    pid = cluster.redis.master().pid
    assert pid is not None, "no Redis master is running"
    return pid


class _Pause:
    """SIGSTOP of a process at begin, SIGCONT of that same process at end."""

    def __init__(self, pid_of: Callable[[NemesisCluster], int]) -> None:
        self.pid_of = pid_of
        self.paused: int | None = None

    def begin(self, cluster: NemesisCluster) -> None:
        self.paused = self.pid_of(cluster)
        os.kill(self.paused, signal.SIGSTOP)

    def end(self, cluster: NemesisCluster) -> None:
        if self.paused is not None:
            os.kill(self.paused, signal.SIGCONT)
            self.paused = None


def _pause(name: str, what: str, pid_of: Callable[[NemesisCluster], int]) -> Fault:
    pause = _Pause(pid_of)
    return Fault(name, what, pause.begin, pause.end)


FAULTS: dict[str, Fault] = {
    fault.name: fault
    for fault in (
        Fault(
            "node-cut-from-redis",
            "n1 cannot reach Redis; its clients and its peer links stay up",
            _cut("n1", "redis"),
            _heal,
        ),
        Fault(
            "node-cut-from-rocketmq",
            "n1 cannot reach the NameServer or the broker; its clients stay connected",
            _cut("n1", "mq"),
            _heal,
        ),
        Fault(
            "node-cut-from-one-peer",
            "n1 and n2 cannot reach each other; both reach everything else",
            _cut("n1", "n2"),
            _heal,
        ),
        Fault(
            "node-isolated",
            "n1 reaches nothing: not Redis, RocketMQ, its peers nor the balancer",
            _isolate("n1"),
            _heal,
        ),
        Fault(
            "cluster-split-in-halves",
            "n1 with the broker on one side, n2 and n3 with Redis on the other; clients reach all",
            _split(["n1", "mq"], ["n2", "n3", "redis"]),
            _heal,
        ),
        _pause(
            "node-paused", "n1 frozen (SIGSTOP) past node_timeout, then resumed", _node_pid("n1")
        ),
        _pause("broker-paused", "the RocketMQ broker frozen (SIGSTOP), then resumed", _broker_pid),
        _pause(
            "redis-paused", "the Redis master frozen (SIGSTOP), then resumed", _redis_master_pid
        ),
    )
}
