"""The cluster tests use the session's Redis and RocketMQ fixtures from tests/conftest.py, and
`cluster`: a launcher of nodes of one cluster on them, every node killed after the test."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.support.cluster import ClusterLauncher
from tests.support.processes import BridgeProcess
from tests.support.redis import LocalRedis
from tests.support.rocketmq import ExternalRocketMQ, LocalRocketMQ


@pytest.fixture
def cluster(
    bridge_factory: Callable[..., BridgeProcess],
    rocketmq: LocalRocketMQ | ExternalRocketMQ,
    redis_server: LocalRedis,
) -> Iterator[ClusterLauncher]:
    launcher = ClusterLauncher(
        bridge_factory, rocketmq.namesrv_addr, tuple(redis_server.bridge_settings())
    )
    yield launcher
    launcher.stop_all()
