"""How tests get a RocketMQ and what they do with it, beside the servers themselves
(`tests.support.rocketmq`: LocalRocketMQ, ExternalRocketMQ):

- which instance: `rocketmq_for_tests(data_dir)` for a session fixture (the external NameServer
  in $ROCKETMQ_NAMESRV, the one a pytest-xdist controller shares, or a local one, always
  stopped), `own_rocketmq(data_dir, **options)` for a test's or module's own,
  `rocketmq_of_its_own_when_shared` for a module that must not share the broker;
- bridge nodes on one: `rocketmq_nodes(bridge_factory, mq, *settings)`;
- a backend's message through RocketMQ's own Java client: `admin_send(mq, *args)` (mqadmin
  sendMessage, tried again after its own timeout without storing twice).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.support.rocketmq import SHARED_ENV, ExternalRocketMQ, LocalRocketMQ

if TYPE_CHECKING:
    from tests.support.processes import BridgeProcess


@contextlib.contextmanager
def own_rocketmq(data_dir: Path | str, **options: Any) -> Iterator[LocalRocketMQ]:
    """A LocalRocketMQ (`options` as its constructor takes them) of the caller's own, apart from
    the session's: for tests that kill its brokers or need another layout. Started, and always
    stopped (SIGKILL) at the end."""
    mq = LocalRocketMQ(data_dir, **options)
    mq.start()
    try:
        yield mq
    finally:
        mq.stop(graceful=False)


@contextlib.contextmanager
def rocketmq_for_tests(data_dir: Path | str) -> Iterator[LocalRocketMQ | ExternalRocketMQ]:
    """The RocketMQ tests talk to: $ROCKETMQ_NAMESRV if set, else a local one (stopped after).

    For a session fixture:
        @pytest.fixture(scope="session")
        def rocketmq(tmp_path_factory):
            with rocketmq_for_tests(tmp_path_factory.mktemp("rocketmq")) as mq:
                yield mq
    """
    external = os.environ.get("ROCKETMQ_NAMESRV")
    if external:
        yield ExternalRocketMQ(external, data_dir).start()
        return
    shared = os.environ.get(SHARED_ENV)
    if shared:
        yield LocalRocketMQ.shared(shared)
        return
    with own_rocketmq(data_dir) as mq:
        yield mq


@contextlib.contextmanager
def rocketmq_of_its_own_when_shared(
    session_mq: LocalRocketMQ | ExternalRocketMQ, data_dir: Path | str
) -> Iterator[LocalRocketMQ | ExternalRocketMQ]:
    """The session's RocketMQ, unless pytest-xdist's workers share it (`SHARED_ENV`): then a
    LocalRocketMQ of the caller's own. For a module whose tests see the whole broker (notify
    reads every topic and counts what it read; a test switches a broker setting) and so must
    not run beside other workers' tests on it."""
    if not os.environ.get(SHARED_ENV):
        yield session_mq
        return
    with own_rocketmq(data_dir) as mq:
        yield mq


def rocketmq_nodes(
    bridge_factory: Callable[..., BridgeProcess],
    mq: LocalRocketMQ | ExternalRocketMQ,
    *settings: str,
) -> Callable[..., BridgeProcess]:
    """What starts a store=rocketmq node on `mq` with `settings` and the call's own; the nodes
    are `bridge_factory`'s, killed at the end of the test (before a fixture's `mq` stops)."""

    def start(*more: str) -> BridgeProcess:
        return bridge_factory(
            "store=rocketmq", f"rocketmq_namesrv={mq.namesrv_addr}", *settings, *more
        )

    return start


ADMIN_SEND_ATTEMPTS = 5
SEND_TIMED_OUT = ("call timeout", "RemotingTimeoutException")
"""What mqadmin prints when its producer gave up waiting (RocketMQ's sendDefaultImpl)."""


def admin_send(
    mq: LocalRocketMQ | ExternalRocketMQ,
    *args: str,
    arrived: Callable[[float], bool] | None = None,
) -> str:
    """`mqadmin sendMessage ARGS` (RocketMQ's own Java client as a backend); returns its output,
    or "" when a send that timed out turned out to have arrived.

    mqadmin's producer gives up after its own 3 s, counted from before its JVM looked up the
    topic's route: on a machine busy with other tests its cold start can use them up, before or
    after the broker stored the message (CI saw three cold starts in a row leave the route
    lookup 700 ms, all timing out). Such a send is tried again, up to five times in all, a
    second apart, and never stored twice unless the caller says it does not matter: with
    `arrived`, a send is tried again only when `arrived(15.0)` (waiting up to that many seconds
    for the message where the test expects it) says it did not come; without it, the caller's
    test is indifferent to a message stored twice."""
    for attempt in range(ADMIN_SEND_ATTEMPTS):
        try:
            return mq.admin("sendMessage", *args)
        except RuntimeError as exc:
            last = attempt == ADMIN_SEND_ATTEMPTS - 1
            if last or not any(text in str(exc) for text in SEND_TIMED_OUT):
                raise
        if arrived is not None and arrived(15.0):
            return ""
        time.sleep(1.0)
    raise AssertionError("unreachable: the last attempt returns or raises")
