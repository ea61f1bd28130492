"""Users and ACL rules kept in the cluster's Redis, changed with the CLIs while two nodes run:
every node applies a change at once (cached password checks and ACL decisions are dropped), and
a client whose user is removed cannot log in on either node."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from bridge.mqtt.packets import SUBACK_FAILURE, Connect
from tests.support.clients import RawClient
from tests.support.cluster import ClusterLauncher
from tests.support.processes import REPO
from tests.support.redis import LocalRedis

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(180)]


def cli(module: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )


def login(port: int, client_id: str, username: str, password: str) -> tuple[RawClient, int]:
    client = RawClient(port)
    client.send(Connect(client_id, username=username, password=password.encode()))
    return client, client.recv().return_code


def eventually(probe: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe():
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout} s: {what}")


def test_redis_users_and_rules_changed_by_the_clis_apply_on_every_node_at_once(
    cluster: ClusterLauncher, redis_server: LocalRedis
) -> None:
    url = redis_server.url
    name = cluster.name
    added = cli("bridge.passwd", url, "--cluster", name, "add", "dev", "--password-stdin",
                stdin="first\n")  # fmt: skip
    assert added.returncode == 0, added.stderr
    rule = cli("bridge.aclctl", url, "--cluster", name, "add", "allow all publish up/%u/#")
    assert rule.returncode == 0, rule.stderr
    settings = ("auth_redis=true", "acl_redis=true", "allow_anonymous=false")
    a = cluster.start("a", *settings)
    b = cluster.start("b", *settings)
    cluster.wait_linked()

    for node in (a, b):  # verified, then cached on both nodes
        client, code = login(node.port, f"dev-{node.port}", "dev", "first")
        assert code == 0
        assert client.subscribe("down/dev", 0) == [SUBACK_FAILURE]  # no rule yet
        client.disconnect()
        _wrong, code = login(node.port, "x", "dev", "second")
        assert code == 4
    anonymous = RawClient(a.port)
    anonymous.send(Connect("anon"))
    assert anonymous.recv().return_code == 5

    # A new password: the cached verification of the old one must not let it in anymore.
    changed = cli("bridge.passwd", url, "--cluster", name, "add", "dev", "--password-stdin",
                  stdin="second\n")  # fmt: skip
    assert changed.returncode == 0 and "updated password" in changed.stdout
    for node in (a, b):
        eventually(lambda n=node: login(n.port, "p", "dev", "first")[1] == 4, "old password out")
        client, code = login(node.port, f"dev-{node.port}", "dev", "second")
        assert code == 0
        client.disconnect()

    # A rule added in Redis: both nodes allow the subscription the cached decision denied.
    new_rule = "allow all subscribe down/%u"
    rule = cli("bridge.aclctl", url, "--cluster", name, "add", new_rule, "--at", "1")
    assert rule.returncode == 0, rule.stderr
    listed = cli("bridge.aclctl", url, "--cluster", name, "list")
    assert listed.stdout.splitlines()[0].split(None, 1)[1] == "allow all subscribe down/%u"
    for node in (a, b):

        def allowed(port: int = node.port) -> bool:
            client, code = login(port, f"dev-{port}", "dev", "second")
            try:
                return code == 0 and client.subscribe("down/dev", 0) == [0]
            finally:
                client.close()

        eventually(allowed, "rule from Redis applied")

    # The user removed: refused everywhere.
    removed = cli("bridge.passwd", url, "--cluster", name, "remove", "dev")
    assert removed.returncode == 0, removed.stderr
    for node in (a, b):
        eventually(lambda n=node: login(n.port, "p", "dev", "second")[1] == 4, "user removed")
    missing = cli("bridge.passwd", url, "--cluster", name, "remove", "dev")
    assert missing.returncode == 1 and "no user 'dev'" in missing.stderr
    bad = cli("bridge.aclctl", url, "--cluster", name, "add", "allow all publish a/#/b")
    assert bad.returncode == 1 and "'#' must be a whole last level" in bad.stderr
