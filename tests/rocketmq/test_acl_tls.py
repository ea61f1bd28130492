"""The gateway on a RocketMQ with authentication on and TLS only (deploy/rocketmq's
ROCKETMQ_ACL=1 and ROCKETMQ_TLS=1): the session's `secured_rocketmq`, shared with the storage
contract suite's `rocketmq-acl-tls` backend, which proves that a store with the right
credentials does everything a store does.

Here: missing or wrong credentials, a client that does not speak TLS, does not trust the
servers or has no client certificate (the servers require one), each refused quickly, with an
error naming the setting to fix where there is one; and the path from a
backend producing straight into RocketMQ (RocketMQ's own Java client, and ours) to a device
subscribed through a bridge.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bridge.storage.base import Message, StoreUnavailable
from bridge.storage.rocketmq import Credentials, RocketMQClient, TlsOptions
from bridge.storage.rocketmq.remoting import BrokerUnavailable
from bridge.storage.rocketmq.store import RocketMQStore
from tests.support.clients import paho_client
from tests.support.processes import REPO
from tests.support.rocketmq import LocalRocketMQ
from tests.support.rocketmq_use import admin_send

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(240)]

REFUSAL_WITHIN = 15.0
"""Seconds within which a refused client must have its answer (no hang, no endless retry)."""


def _unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def _open_store(mq: LocalRocketMQ, path: Path, **security: Any) -> str:
    """Open (and close) a store with these credentials/TLS options; the StoreUnavailable
    message if it is refused, "" if it opened."""

    async def main() -> str:
        store = RocketMQStore(mq.namesrv_addr, path, namespace=_unique("acl"), **security)
        try:
            await store.open()
        except StoreUnavailable as exc:
            return str(exc)
        await store.close()
        return ""

    started = time.monotonic()
    message = asyncio.run(main())
    assert time.monotonic() - started < REFUSAL_WITHIN
    return message


def test_a_store_with_the_right_credentials_opens(
    secured_rocketmq: LocalRocketMQ, tmp_path: Path
) -> None:
    mq = secured_rocketmq
    assert _open_store(mq, tmp_path, credentials=mq.credentials, tls=mq.tls_options) == ""


def test_a_store_without_credentials_is_refused_naming_rocketmq_access_key(
    secured_rocketmq: LocalRocketMQ, tmp_path: Path
) -> None:
    message = _open_store(secured_rocketmq, tmp_path, tls=secured_rocketmq.tls_options)
    assert message.startswith("rocketmq_access_key: the broker requires credentials ("), message


def test_a_wrong_secret_key_is_refused_naming_rocketmq_secret_key(
    secured_rocketmq: LocalRocketMQ, tmp_path: Path
) -> None:
    mq = secured_rocketmq
    wrong = Credentials(mq.acl_user, mq.acl_password + "x")
    message = _open_store(mq, tmp_path, credentials=wrong, tls=mq.tls_options)
    assert message.startswith("rocketmq_secret_key: the broker refused the signature ("), message
    assert mq.acl_password not in message


def test_an_unknown_user_is_refused_naming_rocketmq_access_key(
    secured_rocketmq: LocalRocketMQ, tmp_path: Path
) -> None:
    mq = secured_rocketmq
    stranger = Credentials("nobody", mq.acl_password)
    message = _open_store(mq, tmp_path, credentials=stranger, tls=mq.tls_options)
    assert message.startswith("rocketmq_access_key: the broker knows no such user ("), message


def _first_call_error(mq: LocalRocketMQ, **security: Any) -> BrokerUnavailable:
    async def main() -> BrokerUnavailable:
        client = RocketMQClient(
            mq.namesrv_addr,
            client_id=_unique("c"),
            producer_group="g",
            max_attempts=1,
            connect_timeout=5.0,
            request_timeout=5.0,
            **security,
        )
        try:
            await client.fetch_cluster_brokers()
        except BrokerUnavailable as exc:
            return exc
        finally:
            await client.close()
        raise AssertionError("the request succeeded")

    started = time.monotonic()
    error = asyncio.run(main())
    assert time.monotonic() - started < REFUSAL_WITHIN
    return error


def test_a_plain_text_client_of_a_tls_only_cluster_fails_at_once_pointing_at_rocketmq_tls(
    secured_rocketmq: LocalRocketMQ,
) -> None:
    error = _first_call_error(secured_rocketmq, credentials=secured_rocketmq.credentials)
    assert "TLS-only server? see rocketmq_tls" in str(error)


def test_a_client_that_does_not_trust_the_servers_certificate_is_told_to_check_the_cafile(
    secured_rocketmq: LocalRocketMQ,
) -> None:
    # The system's CAs: the throw-away CA of the test servers is not among them.
    error = _first_call_error(secured_rocketmq, tls=TlsOptions())
    assert "TLS handshake failed" in str(error)
    assert "CERTIFICATE_VERIFY_FAILED" in str(error)
    assert "rocketmq_tls_cafile" in str(error)


def test_a_client_without_the_client_certificate_the_servers_require_is_refused(
    secured_rocketmq: LocalRocketMQ,
) -> None:
    mq = secured_rocketmq
    assert mq.tls_client_auth
    error = _first_call_error(mq, tls=TlsOptions(cafile=mq.tls_cafile))
    assert "the server requires a client certificate: rocketmq_tls_certfile" in str(error), error


def _bridge_settings(mq: LocalRocketMQ) -> list[str]:
    """`--set` arguments of the instance's rocketmq_* settings."""
    return [
        f"{name.removeprefix('MQTT_BRIDGE_').lower()}={value}"
        for name, value in mq.bridge_settings().items()
    ]


def test_a_message_a_backend_produces_into_a_secured_rocketmq_reaches_a_device_through_a_bridge(
    secured_rocketmq: LocalRocketMQ, bridge_factory: Callable[..., Any]
) -> None:
    """Two backends: RocketMQ's own admin tool (the Java client, signing as the tools.yml user,
    over TLS) and our client with credentials. The bridge signs and speaks TLS for its store
    and its embedded notify; the device gets both, and the secret key is in no log line."""
    mq = secured_rocketmq
    first = _unique("pay")
    node = bridge_factory(
        "store=rocketmq", f"rocketmq_namespace={_unique('b')}", *_bridge_settings(mq)
    )
    with paho_client(node.port, "device-42") as client:
        client.client.subscribe(f"{first}/store/42/#", qos=1)
        time.sleep(0.5)
        early: list[Any] = []

        def arrived(timeout: float) -> bool:
            early.extend(client.drain(1, timeout=timeout))
            return bool(early)

        admin_send(
            mq, "-t", first, "-c", f"{first}/store/42/order/9", "-p", "paid 9", arrived=arrived
        )

        async def produce() -> None:
            async with RocketMQClient(
                mq.namesrv_addr,
                client_id=_unique("backend"),
                producer_group="payments",
                credentials=mq.credentials,
                tls=mq.tls_options,
            ) as backend:
                await backend.send(first, b"paid 10", tags=f"{first}/store/42/order/10")

        asyncio.run(produce())
        got = early + client.drain(2 - len(early), timeout=60)
        assert sorted((m.topic, m.payload, m.qos) for m in got) == [
            (f"{first}/store/42/order/10", b"paid 10", 1),
            (f"{first}/store/42/order/9", b"paid 9", 1),
        ]
    assert mq.acl_password not in node.log_text()


def test_a_bridge_with_a_wrong_secret_key_stops_with_one_line_naming_the_setting(
    secured_rocketmq: LocalRocketMQ, tmp_path: Path
) -> None:
    mq = secured_rocketmq
    settings = [s for s in _bridge_settings(mq) if not s.startswith("rocketmq_secret_key=")]
    args = [sys.executable, "-m", "bridge", "--listen", "127.0.0.1:0"]
    args += ["--data-dir", str(tmp_path), "--set", "store=rocketmq"]
    for setting in [*settings, "rocketmq_secret_key=not-the-key"]:
        args += ["--set", setting]
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=60)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert "rocketmq_secret_key: the broker refused the signature" in output
    assert "Traceback" not in output
    assert "not-the-key" not in output


def test_a_rotated_key_works_at_once_and_the_old_one_stops_when_its_user_is_deleted(
    secured_rocketmq: LocalRocketMQ, tmp_path: Path
) -> None:
    """The rotation of docs/operations.md: a second user made with mqadmin (createUser, to
    every broker of the cluster) is accepted at once; once deleted, its key is refused."""
    mq = secured_rocketmq
    user, secret = _unique("gw"), uuid.uuid4().hex
    mq.admin("createUser", "-c", "DefaultCluster", "-u", user, "-p", secret, "-t", "Super")
    assert (
        _open_store(mq, tmp_path / "a", credentials=Credentials(user, secret), tls=mq.tls_options)
        == ""
    )
    mq.admin("deleteUser", "-c", "DefaultCluster", "-u", user)
    deadline = time.monotonic() + 90  # the broker's user cache refreshes every 60 s
    while True:
        message = _open_store(
            mq, tmp_path / "b", credentials=Credentials(user, secret), tls=mq.tls_options
        )
        if message or time.monotonic() > deadline:
            break
        time.sleep(1.0)  # polling the broker's cache: there is nothing to wait on
    assert message.startswith("rocketmq_access_key: the broker knows no such user ("), message


def _store_error(mq: LocalRocketMQ, path: Path, credentials: Credentials) -> str:
    """Open a store and append one message; the first StoreUnavailable message, "" if both
    worked."""

    async def main() -> str:
        store = RocketMQStore(
            mq.namesrv_addr, path, namespace=_unique("acl"), credentials=credentials,
            tls=mq.tls_options, send_timeout=5.0,
        )  # fmt: skip
        try:
            await store.open()
        except StoreUnavailable as exc:
            return str(exc)
        try:
            await store.append(Message(f"{_unique('t')}/a", b"x", qos=1, key=_unique("k")), ["q"])
        except StoreUnavailable as exc:
            return str(exc)
        finally:
            await store.close()
        return ""

    return asyncio.run(main())


def test_a_normal_user_needs_the_acl_of_operations_md_and_without_it_is_told_so(
    secured_rocketmq: LocalRocketMQ, tmp_path: Path
) -> None:
    """A Normal (not Super) user: refused by the broker's authorization until it has the ACL
    docs/operations.md gives, then the store works."""
    mq = secured_rocketmq
    user, secret = _unique("normal"), uuid.uuid4().hex
    mq.admin("createUser", "-c", "DefaultCluster", "-u", user, "-p", secret, "-t", "Normal")
    message = _store_error(mq, tmp_path / "a", Credentials(user, secret))
    assert "rocketmq_access_key: the broker's ACL does not allow this user (" in message, message
    mq.admin(
        "createAcl", "-c", "DefaultCluster", "-s", f"User:{user}", "-r", "Topic:*,Group:*",
        "-a", "Pub,Sub,Create,Update,Get", "-d", "Allow",
    )  # fmt: skip
    assert _store_error(mq, tmp_path / "b", Credentials(user, secret)) == ""
