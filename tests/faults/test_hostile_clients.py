"""Hostile clients cost the honest ones nothing: against one bridge process with authentication
on, mutated packets, slowloris, half-open sockets, a flood of bad logins with big PUBLISHes and
subscribers that never read attack from 127.0.0.2-9 for a bounded time while an honest QoS 1
publisher and persistent subscriber work on 127.0.0.1. Every acknowledged message is delivered,
the node stays up and logs a new honest client in promptly, its RSS stays bounded and its log
has no traceback. The few-minute run of the same: `make hostile SECONDS=180`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.hostile import loopback_aliases_usable
from tests.support.hostile_run import access_settings, run_hostile
from tests.support.processes import BridgeProcess, require_loopback_alias

pytestmark = pytest.mark.fault

SECONDS = 15.0


def test_hostile_clients_lose_no_acknowledged_message_and_leave_memory_bounded(
    tmp_path: Path, bridge_factory: Callable[..., BridgeProcess]
) -> None:
    unusable = loopback_aliases_usable()
    if unusable:
        require_loopback_alias(unusable)
    node = bridge_factory(*access_settings(tmp_path))
    report = run_hostile(node, SECONDS, drain_seconds=10.0)
    print("\n".join(report.lines()))
    assert report.problems() == [], "\n".join(report.problems() + report.lines())
