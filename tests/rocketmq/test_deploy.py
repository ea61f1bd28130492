"""The local RocketMQ deployment (deploy/rocketmq) really starts, stores and survives kill -9.

One NameServer + broker for the whole module (start-up ~7 s, each admin-tool call ~3-4 s, as
every call starts a JVM). The tests run in file order and the last one stops the instance.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.rocketmq import LocalRocketMQ
from tests.support.rocketmq_use import admin_send, own_rocketmq

# No skip when java is missing: `make test` installs a JRE, and a machine without one must fail
# here with the reason (LocalRocketMQ.start raises), never pass by skipping.
pytestmark = pytest.mark.rocketmq

TOPIC = "deploy_test"


@pytest.fixture(scope="module")
def mq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRocketMQ]:
    began = time.monotonic()
    with own_rocketmq(tmp_path_factory.mktemp("rocketmq"), timer=False) as node:
        node.start_seconds = time.monotonic() - began  # type: ignore[attr-defined]
        yield node


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _send(mq: LocalRocketMQ, body: str, key: str) -> str:
    """Send one message with mqadmin; return its id. A send tried again after mqadmin's own
    timeout may store the message twice, which changes nothing these tests check: each reads
    back the id of the send that answered."""
    out = admin_send(mq, "-t", TOPIC, "-p", body, "-c", "tagA", "-k", key)
    assert "SEND_OK" in out, out
    return out.strip().splitlines()[-1].split()[-1]  # the message id


def _java_pids_using(path: Path) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"java" in cmdline and str(path).encode() in cmdline:
            pids.append(int(entry.name))
    return pids


def test_start_registers_broker(mq: LocalRocketMQ) -> None:
    assert mq.pid("namesrv") and mq.pid("broker")
    assert mq.broker_addr in mq.registered_brokers()
    assert mq.broker_addr in mq.admin("clusterList")
    print(
        f"\nstart {mq.start_seconds:.1f} s, RSS namesrv {mq.rss_mib('namesrv'):.0f} MiB,"  # type: ignore[attr-defined]
        f" broker {mq.rss_mib('broker'):.0f} MiB"
    )


def test_config_applied(mq: LocalRocketMQ) -> None:
    """The keys of broker.conf reach the broker (misspelt keys are silently ignored)."""
    out = mq.admin("getBrokerConfig", "-b", mq.broker_addr)
    config = {
        key.strip(): value.strip()
        for key, sep, value in (row.partition("=") for row in out.splitlines())
        if sep
    }
    assert config["enableLmq"] == "true"
    assert config["enableMultiDispatch"] == "true"
    assert config["flushDiskType"] == "SYNC_FLUSH"
    assert config["mappedFileSizeCommitLog"] == str(64 * 1024 * 1024)
    assert config["listenPort"] == str(mq.broker_port)
    assert config["storePathRootDir"] == str(mq.data_dir / "store")


def test_create_topic(mq: LocalRocketMQ) -> None:
    mq.create_topic(TOPIC)
    assert TOPIC in mq.admin("topicList").split()
    assert mq.broker_addr in mq.admin("topicRoute", "-t", TOPIC)


def test_send_and_read_back(mq: LocalRocketMQ) -> None:
    key = f"k-{uuid.uuid4().hex[:8]}"
    body = f"hello-{key}"
    msg_id = _send(mq, body, key)
    assert msg_id in mq.admin("queryMsgByKey", "-t", TOPIC, "-k", key)
    assert f"BODY: {body}" in mq.admin("printMsg", "-t", TOPIC, "-d", "true")


def test_kill9_broker_and_restart_keeps_data(mq: LocalRocketMQ) -> None:
    key = f"k-{uuid.uuid4().hex[:8]}"
    body = f"before-kill-{key}"
    msg_id = _send(mq, body, key)
    old_pid = mq.pid("broker")
    assert old_pid

    mq.kill_broker()
    assert mq.pid("broker") is None
    assert not os.path.exists(f"/proc/{old_pid}")
    assert not _port_open(mq.broker_port)

    began = time.monotonic()
    mq.start_broker()
    print(f"\nbroker restart after kill -9: {time.monotonic() - began:.1f} s")
    assert mq.pid("broker") not in (None, old_pid)
    assert mq.broker_addr in mq.registered_brokers()
    # The message acknowledged before the kill is still there, and the broker takes new ones.
    assert msg_id in mq.admin("queryMsgByKey", "-t", TOPIC, "-k", key)
    assert f"BODY: {body}" in mq.admin("printMsg", "-t", TOPIC, "-d", "true")
    _send(mq, "after-restart", f"after-{key}")


def test_stop_leaves_no_java_process(mq: LocalRocketMQ) -> None:
    """Runs last: stops the module's instance the orderly way (stop.sh, SIGTERM)."""
    pids = [mq.pid("namesrv"), mq.pid("broker")]
    assert all(pids)
    mq.stop()
    assert mq.pid("namesrv") is None and mq.pid("broker") is None
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}"), f"pid {pid} still alive"
    assert _java_pids_using(mq.data_dir) == []
    assert not _port_open(mq.namesrv_port) and not _port_open(mq.broker_port)
    assert not (mq.data_dir / "broker.pid").exists()
