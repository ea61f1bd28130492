"""Shared fixtures: real bridge processes on loopback ports, cleaned up after every test; one
RocketMQ and one Redis for the session, started on first use. Every test also fails when an
event loop in this process reported an unhandled error while it ran (tests/support/loop_guard.py)
and when a bridge it started logged a traceback (`bridge_factory`)."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import pytest
from hypothesis import HealthCheck, settings

from tests.support.clients import close_all_raw_clients
from tests.support.processes import BridgeProcess, bridge_nodes
from tests.support.redis import LocalRedis, RedisAuth
from tests.support.rocketmq import SHARED_ENV, ExternalRocketMQ, LocalRocketMQ
from tests.support.rocketmq_use import rocketmq_for_tests

pytest_plugins = ["tests.support.loop_guard"]

# A property holds or not whatever the machine's load: no example fails for taking longer than
# hypothesis's default 200 ms, and no test for generating slowly (timings are never pass/fail).
settings.register_profile(
    "suite", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "suite"))

# The tests' Spark JVMs (the session's, and those of the jobs and the demo they start) live for
# seconds to a minute: C1-only JIT and the serial collector cut their CPU by a third (measured on
# tests/spark/test_jobs.py, 194 -> 134 CPU seconds) without changing what they compute. A Python
# worker Spark starts has 15 s by default to connect back and authenticate, which a JVM on a
# machine busy with the other workers' servers has missed ("Python worker failed to connect
# back"): 120 s here. C1-only JIT reserves 48 MiB for compiled code, which a job writing Delta
# tables fills ("CodeCache is full. Compiler has been disabled"): 128 MiB.
os.environ.setdefault(
    "PYSPARK_SUBMIT_ARGS",
    "--driver-java-options"
    " '-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:ReservedCodeCacheSize=128m'"
    " --conf spark.python.authenticate.socketTimeout=120s pyspark-shell",
)


def _interrupted(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt("SIGTERM")


def pytest_configure(config: pytest.Config) -> None:
    """A test run stopped with SIGTERM (a CI timeout, `kill`) ends like one stopped with Ctrl-C:
    pytest unwinds the fixtures, so the servers they started (RocketMQ, Redis, bridges) are
    stopped by PID instead of being left running.

    A pytest-xdist controller starts the one RocketMQ its workers' `rocketmq` fixtures share
    (each test keeps to names of its own on it, as tests in one process always have): one
    broker's memory and start-up instead of one per worker. If it cannot start, each worker
    tries its own and the tests that need it fail saying why."""
    signal.signal(signal.SIGTERM, _interrupted)
    if _runs_workers(config) and not os.environ.get("ROCKETMQ_NAMESRV"):
        data_dir = Path(tempfile.mkdtemp(prefix="rocketmq-shared-"))
        mq = LocalRocketMQ(data_dir)
        try:
            mq.start()
        except RuntimeError:
            mq.stop(graceful=False)
            shutil.rmtree(data_dir, ignore_errors=True)
            return
        config.stash[_SHARED_ROCKETMQ] = mq
        os.environ[SHARED_ENV] = mq.shared_spec()


def pytest_unconfigure(config: pytest.Config) -> None:
    mq = config.stash.get(_SHARED_ROCKETMQ, None)
    if mq is not None:
        os.environ.pop(SHARED_ENV, None)
        mq.stop(graceful=False)
        shutil.rmtree(mq.data_dir, ignore_errors=True)


def _runs_workers(config: pytest.Config) -> bool:
    """Whether this process is a pytest-xdist controller about to start workers."""
    return bool(getattr(config.option, "numprocesses", 0)) and not hasattr(config, "workerinput")


_SHARED_ROCKETMQ = pytest.StashKey[LocalRocketMQ]()


FIRST = ("tests/spark/test_demo.py", "tests/spark/", "tests/nemesis/", "tests/faults/",
         "tests/rocketmq/", "tests/spark/test_cluster.py", "tests/interop/", "tests/release/",
         "tests/cluster/", "tests/integration/", "tests/storage/", "tests/")  # fmt: skip
"""Where a module's tests come in the run (by the longest of these its path starts with): the
folders whose modules wait longest first (the Spark tests take a quarter of an hour), so that
under pytest-xdist the long ones start at once and the many short unit-test modules fill the
workers at the end. Within the Spark tests' worker the demo comes first and the standalone
cluster (seven JVMs) last."""


def _rank(item: pytest.Item) -> int:
    path = item.nodeid.split("::", 1)[0]
    matches = [(len(prefix), i) for i, prefix in enumerate(FIRST) if path.startswith(prefix)]
    return max(matches)[1] if matches else len(FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules in the order of `FIRST` (a stable sort: each module's tests stay together and in
    their order, so its module-scoped servers start once)."""
    items.sort(key=_rank)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Under pytest-xdist (`make test` runs `-n`) a module's tests run on one worker, in order,
    so its module-scoped servers start once; the Spark tests that use the session's Spark
    share one worker and so one Spark JVM (the demo starts its own). Modules are handed out in
    the order of the collection (`FIRST`), not by their number of tests. (pytest-xdist's own
    `--dist loadgroup` cannot express this with pytest 9, which no longer lets a plugin rename a
    test's node id.)

    Every Spark module runs on that one worker, the demo (with servers of its own) too: two
    streaming jobs side by side, each with several queries triggering every second, ask more than
    two cores, and their Python workers then miss Spark's fixed 10 s to connect back until the
    jobs fail or time out."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            if path.startswith("tests/spark/"):
                return "tests/spark"
            return path

    return ByModule(config, log)


@pytest.fixture(scope="session")
def rocketmq(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[LocalRocketMQ | ExternalRocketMQ]:
    """One real RocketMQ (NameServer + broker) for the whole test session, started on first use
    by deploy/rocketmq's scripts (or $ROCKETMQ_NAMESRV). Tests that kill the broker start their
    own. Never skipped: if it cannot start, the tests that need it fail saying why."""
    with rocketmq_for_tests(tmp_path_factory.mktemp("rocketmq-session")) as mq:
        yield mq


@pytest.fixture(scope="session")
def secured_rocketmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRocketMQ]:
    """One RocketMQ with authentication on and TLS only, client certificates required
    (deploy/rocketmq's ROCKETMQ_ACL=1, ROCKETMQ_TLS=1, ROCKETMQ_TLS_CLIENT_AUTH=1) for the whole
    session, started on first use; its `credentials` and `tls_options` are what a client needs.
    Local even when $ROCKETMQ_NAMESRV is set."""
    mq = LocalRocketMQ(
        tmp_path_factory.mktemp("rocketmq-secured"),
        acl=True,
        tls=True,
        tls_client_auth=True,
        timer=False,
    )
    mq.start()
    try:
        yield mq
    finally:
        mq.stop(graceful=False)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRedis]:
    """One redis-server (AOF on, loopback, a free port) for the whole session, started on
    first use by deploy/redis/start.sh. Never skipped: when Redis cannot start, the tests that
    need it fail saying why. Tests that kill or restart Redis start their own.

    It requires a password, as a production Redis should: `client()` and `url` carry it, and
    nodes get it through `bridge_settings()` (a password file, never the command line)."""
    server = LocalRedis(
        tmp_path_factory.mktemp("redis-session"), auth=RedisAuth(password=secrets.token_hex(16))
    )
    try:
        server.start()
    except RuntimeError as exc:
        pytest.fail(f"Redis could not be started by deploy/redis/start.sh:\n{exc}", pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def _close_raw_clients() -> Iterator[None]:
    yield
    close_all_raw_clients()


@pytest.fixture
def bridge_factory(tmp_path: Path) -> Iterator[Callable[..., BridgeProcess]]:
    """Start bridge nodes (`factory(*settings, data_dir=None)`); all are killed at the end and
    a traceback in any node's log fails the test (`bridge_nodes`)."""
    with bridge_nodes(tmp_path) as factory:
        yield factory


@pytest.fixture
def bridge(bridge_factory: Callable[..., BridgeProcess]) -> BridgeProcess:
    """One running bridge node with default settings."""
    return bridge_factory()
