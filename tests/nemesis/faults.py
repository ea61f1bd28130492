"""The faults the nemesis injects into a running `NemesisCluster`, each a begin and an end.

A fault's `begin` breaks something now and `end` repairs it; between them the cluster runs on
under load. Nothing is restarted by hand: after `end` the cluster must serve again by itself.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.support.disks import fill

from .cluster import NemesisCluster
from .net import Network


@dataclass(frozen=True)
class Fault:
    name: str
    what: str
    """What happens, as docs/operations.md's table says it."""
    begin: Callable[[NemesisCluster], None]
    end: Callable[[NemesisCluster], None]


class _Cut:
    """Network cuts made at begin (by `make`, which returns them) and undone at end: the
    cuts of other faults running at the same time stay."""

    def __init__(self, make: Callable[[Network], list[frozenset[str]]]) -> None:
        self.make = make
        self.pairs: list[frozenset[str]] = []

    def begin(self, cluster: NemesisCluster) -> None:
        self.pairs = self.make(cluster.net)

    def end(self, cluster: NemesisCluster) -> None:
        pairs, self.pairs = self.pairs, []
        cluster.net.uncut(pairs)


def _cut(name: str, what: str, make: Callable[[Network], list[frozenset[str]]]) -> Fault:
    cut = _Cut(make)
    return Fault(name, what, cut.begin, cut.end)


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


class _DiskFull:
    """A file that fills the broker's disk to `FULL` at begin, removed at end."""

    FULL = 0.95
    """Past RocketMQ's diskSpaceWarningLevelRatio (90%): the broker refuses messages. The
    5% left is far more than the load writes while the fault lasts, so the broker's mapped
    files never meet a disk that is really full."""

    def __init__(self) -> None:
        self.filler: Path | None = None

    def begin(self, cluster: NemesisCluster) -> None:
        assert cluster.broker_disk is not None
        stat = os.statvfs(cluster.broker_disk)
        total = stat.f_blocks * stat.f_frsize
        self.filler = fill(cluster.broker_disk, int(total * (1 - self.FULL)), "nemesis-filler")

    def end(self, cluster: NemesisCluster) -> None:
        if self.filler is not None:
            self.filler.unlink(missing_ok=True)
            self.filler = None


HOUR = 3600


def _clock_ahead(cluster: NemesisCluster) -> None:
    cluster.set_clock(HOUR)


def _clock_back(cluster: NemesisCluster) -> None:
    cluster.set_clock(0)


def _disk_full(name: str, what: str) -> Fault:
    full = _DiskFull()
    return Fault(name, what, full.begin, full.end)


def _pause(name: str, what: str, pid_of: Callable[[NemesisCluster], int]) -> Fault:
    pause = _Pause(pid_of)
    return Fault(name, what, pause.begin, pause.end)


FAULTS: dict[str, Fault] = {
    fault.name: fault
    for fault in (
        _cut(
            "node-cut-from-redis",
            "n1 cannot reach Redis; its clients and its peer links stay up",
            lambda net: [net.cut("n1", "redis")],
        ),
        _cut(
            "node-cut-from-rocketmq",
            "n1 cannot reach the NameServer or the broker; its clients stay connected",
            lambda net: [net.cut("n1", "mq")],
        ),
        _cut(
            "node-cut-from-one-peer",
            "n1 and n2 cannot reach each other; both reach everything else",
            lambda net: [net.cut("n1", "n2")],
        ),
        _cut(
            "node-cut-from-cluster",
            "n1 reaches neither Redis nor its peers; its clients and the broker still reach it",
            lambda net: [net.cut("n1", "redis"), net.cut("n1", "n2"), net.cut("n1", "n3")],
        ),
        _cut(
            "node-isolated",
            "n1 reaches nothing: not Redis, RocketMQ, its peers nor the balancer",
            lambda net: net.isolate("n1"),
        ),
        _cut(
            "cluster-split-in-halves",
            "n1 with the broker on one side, n2 and n3 with Redis on the other; clients reach all",
            lambda net: net.split(["n1", "mq"], ["n2", "n3", "redis"]),
        ),
        _pause(
            "node-paused", "n1 frozen (SIGSTOP) past node_timeout, then resumed", _node_pid("n1")
        ),
        _pause("broker-paused", "the RocketMQ broker frozen (SIGSTOP), then resumed", _broker_pid),
        _pause(
            "redis-paused", "the Redis master frozen (SIGSTOP), then resumed", _redis_master_pid
        ),
        Fault(
            "node-clock-jump",
            "n1's wall clock jumps an hour forward, and an hour back at the end",
            _clock_ahead,
            _clock_back,
        ),
        _disk_full(
            "broker-disk-full",
            "the broker's disk filled to 95% (it refuses messages past 90%), then freed",
        ),
    )
}
