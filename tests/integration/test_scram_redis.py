"""SCRAM-SHA-256 credentials of Redis users, on a real Redis: what `python -m bridge.passwd
redis://...` stores is what `AccessControl.scram_credential` finds; entries written without a
credential (older tools, `--no-scram`, a hand-made HSET) still log in with a password, not with
SCRAM; and unknown users get the same fake salt on every node."""

from __future__ import annotations

import asyncio
import io
import sys
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
import redis.asyncio
import scramp

from bridge.access import AccessControl, ScramError, UserStoreUnavailable, passwd
from bridge.access.auth import AuthResult
from bridge.access.control import scram_key, users_key
from bridge.access.hashes import hash_password
from bridge.config import Config
from tests.support.processes import free_port
from tests.support.redis import LocalRedis

pytestmark = pytest.mark.integration

T = TypeVar("T")


@pytest.fixture(autouse=True)
def _fast_hashes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cheap scrypt hashes for the passwd runs (SCRAM credentials keep their real 4096)."""
    monkeypatch.setattr(passwd, "hash_password", lambda pw: hash_password(pw, n=2**10))


@pytest.fixture
def cluster_name() -> str:
    return f"scram-{uuid.uuid4().hex[:8]}"


def passwd_cli(
    monkeypatch: pytest.MonkeyPatch, url: str, cluster: str, *argv: str, stdin: str = ""
):
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    return passwd.main([url, "--cluster", cluster, *argv])


def with_access(
    url: str, cluster: str, use: Callable[[AccessControl], Awaitable[T]], *, start: bool = False
) -> T:
    """Run `use(access)` on an AccessControl of Redis users, its client connected to `url`."""

    async def run() -> T:
        access = AccessControl(Config(redis_url=url, cluster_name=cluster, auth_redis=True))
        client = redis.asyncio.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        try:
            if start:
                await access.start(client)
            else:
                access.redis = client
            return await use(access)
        finally:
            await access.stop()
            await client.aclose()

    return asyncio.run(run())


async def scram_login(access: AccessControl, username: str, password: str) -> bool:
    server = access.new_scram_exchange()
    client = scramp.ScramClient(["SCRAM-SHA-256"], username, password)
    name = server.client_first(client.get_client_first().encode())
    client.set_server_first(server.server_first(await access.scram_credential(name)).decode())
    try:
        client.set_server_final(server.client_final(client.get_client_final().encode()).decode())
    except ScramError:
        return False
    return server.authenticated


def test_passwd_add_stores_a_scram_credential_found_by_the_lookup(
    redis_server: LocalRedis, cluster_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = redis_server.url
    assert (
        passwd_cli(monkeypatch, url, cluster_name, "add", "dev", "--password-stdin", stdin="pw\n")
        == 0
    )

    async def check(access: AccessControl) -> None:
        credential = await access.scram_credential("dev")
        assert credential is not None and credential.iterations == 4096
        assert await scram_login(access, "dev", "pw")
        assert not await scram_login(access, "dev", "wrong")
        assert not await scram_login(access, "nobody", "pw")
        assert await access.scram_credential("nobody") is None
        assert (await access.authenticate("c", "dev", b"pw"))[0] is AuthResult.ACCEPTED

    with_access(url, cluster_name, check)

    assert passwd_cli(monkeypatch, url, cluster_name, "remove", "dev") == 0
    with redis_server.client() as client:
        assert not client.hexists(scram_key(cluster_name), "dev")

    async def removed(access: AccessControl) -> None:
        assert await access.scram_credential("dev") is None

    with_access(url, cluster_name, removed)


def test_entries_without_a_credential_keep_the_plain_path_only(
    redis_server: LocalRedis, cluster_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = redis_server.url
    with redis_server.client() as client:  # as an older bridge.passwd wrote them
        client.hset(users_key(cluster_name), "old", hash_password("pw", n=2**10))
    argv = ("add", "nosc", "--password-stdin", "--no-scram")
    assert passwd_cli(monkeypatch, url, cluster_name, *argv, stdin="pw\n") == 0

    async def check(access: AccessControl) -> None:
        for name in ("old", "nosc"):
            assert await access.scram_credential(name) is None
            assert not await scram_login(access, name, "pw")
            assert (await access.authenticate("c", name, b"pw"))[0] is AuthResult.ACCEPTED

    with_access(url, cluster_name, check)


def test_password_changed_without_scram_voids_the_old_credential(
    redis_server: LocalRedis, cluster_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = redis_server.url
    assert (
        passwd_cli(monkeypatch, url, cluster_name, "add", "dev", "--password-stdin", stdin="old\n")
        == 0
    )
    with redis_server.client() as client:  # an older tool or a hand-made HSET: hash only
        client.hset(users_key(cluster_name), "dev", hash_password("new", n=2**10))

    async def check(access: AccessControl) -> None:
        assert await access.scram_credential("dev") is None
        assert not await scram_login(access, "dev", "old")
        assert (await access.authenticate("c", "dev", b"new"))[0] is AuthResult.ACCEPTED

    with_access(url, cluster_name, check)


def test_unknown_users_get_the_same_fake_salt_on_every_node(
    redis_server: LocalRedis, cluster_name: str
) -> None:
    async def fake_answer(access: AccessControl) -> bytes:
        server = access.new_scram_exchange(server_nonce="fixed")
        server.client_first(b"n,,n=mallory,r=abc")
        return server.server_first(await access.scram_credential("mallory"))

    url = redis_server.url
    first_node = with_access(url, cluster_name, fake_answer, start=True)
    second_node = with_access(url, cluster_name, fake_answer, start=True)
    assert first_node == second_node
    other_cluster = with_access(url, cluster_name + "-b", fake_answer, start=True)
    assert other_cluster != first_node


def test_unreachable_redis_is_reported_not_taken_for_an_unknown_user() -> None:
    async def lookup(access: AccessControl) -> Any:
        with pytest.raises(UserStoreUnavailable):
            await access.scram_credential("dev")

    with_access(f"redis://127.0.0.1:{free_port()}/0", "scram", lookup)
