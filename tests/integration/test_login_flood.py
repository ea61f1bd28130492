"""A flood of bad logins on a real bridge process with a password file (Argon2 hashes): 300 sockets
from 127.0.0.2, each sending a CONNECT with a wrong password and then 256 KiB PUBLISH packets
without waiting for the CONNACK (or, in the second case, only waiting for it), reconnecting when
closed, while an honest client logs in from 127.0.0.1 (tests/support/login_flood.py). Every honest
login is accepted, never told "server busy" nor left waiting, the bridge's memory stays bounded,
and every flood socket is answered (a refusal or a closed socket), never left silent. How long the
honest logins took is printed here and measured by tests/bench/login_flood.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from bridge.access.hashes import hash_password
from tests.support.hostile_run import rss_bytes
from tests.support.login_flood import (
    FLOOD_SECONDS,
    FLOOD_SOCKETS,
    HONEST_PASSWORD,
    Flood,
    flood_source_usable,
    timed_login,
)
from tests.support.processes import BridgeProcess, require_loopback_alias

pytestmark = pytest.mark.integration

HONEST_LOGINS = 5
RSS_BOUND = 256 * 1024 * 1024


@pytest.mark.parametrize("publishes", [True, False], ids=["streaming", "logins-only"])
def test_a_flood_of_bad_logins_leaves_honest_logins_accepted_and_memory_bounded(
    tmp_path: Path, bridge_factory: Callable[..., BridgeProcess], publishes: bool
) -> None:
    unusable = flood_source_usable()
    if unusable:
        require_loopback_alias(unusable)
    passwd = tmp_path / "passwd"
    passwd.write_text(f"alice:{hash_password(HONEST_PASSWORD)}\n")  # Argon2id, the default
    passwd.chmod(0o600)
    # No cache of verified passwords: every honest login is hashed, in turn with the flood's.
    node = bridge_factory(f"password_file={passwd}", "allow_anonymous=false", "auth_cache_ttl=0")
    timed_login(node.port)  # warm: the login path is imported
    rss_before = rss_bytes(node.pid)
    flood = Flood(node.port, node.pid, publishes=publishes)
    flood.start()
    try:
        assert flood.under_way.wait(FLOOD_SECONDS), "the flood did not get going"
        logins = [timed_login(node.port) for _ in range(HONEST_LOGINS)]
    finally:
        flood.stop()
    rss_growth = max(flood.peak_rss, rss_bytes(node.pid)) - rss_before
    print(
        f"honest CONNACK in {', '.join(f'{t:.2f}' for _, t in logins)} s; RSS grew "
        f"{rss_growth / 2**20:.0f} MiB; flood outcomes {dict(flood.outcomes)}"
    )
    # Accepted, each one: never "server busy" (3) behind the flood's checks, never starved.
    codes = [None if connack is None else connack.return_code for connack, _ in logins]
    assert codes == [0] * HONEST_LOGINS, codes
    assert rss_growth < RSS_BOUND, f"RSS grew {rss_growth / 2**20:.0f} MiB"
    assert flood.outcomes["silent"] == 0, flood.outcomes
    assert flood.outcomes["refused"] + flood.outcomes["closed"] >= FLOOD_SOCKETS, flood.outcomes
    if not publishes:
        # Wrong passwords that only wait are answered: CONNACK 4 after their delay, or 3
        # (server busy) when too many checks from their address wait.
        assert flood.outcomes["refused"] >= FLOOD_SOCKETS // 2, flood.outcomes
    assert node.proc is not None and node.proc.poll() is None, "the bridge died"
