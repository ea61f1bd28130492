"""The Redis registry's Lua against a real Redis: ownership moves only by claim, writes of a
stale owner are refused, a dead node's clients are adopted only from it, a claim by another
identity than the session's is refused and changes nothing, membership expires."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

import pytest

from bridge.cluster.redis_access import RedisAccess
from bridge.cluster.registry import RedisRegistry, redis_client
from bridge.state import KIND_OFFSETS, KIND_ONLINE, KIND_RETAINED, KIND_SESSION
from bridge.storage.base import MetaUpdate, SessionBound, StaleOwner
from tests.support.redis import LocalRedis, run_and_collect


def run(
    redis_server: LocalRedis, scenario: Callable[[Callable[[str], RedisRegistry]], Awaitable[None]]
) -> None:
    """Run `scenario(registry_of)` where `registry_of(node_id)` gives that node's registry,
    all under a fresh key prefix."""
    prefix = f"r{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        made: list[RedisRegistry] = []

        def registry_of(node_id: str) -> RedisRegistry:
            registry = RedisRegistry(
                redis_client(RedisAccess(url=redis_server.url)), prefix, node_id
            )
            made.append(registry)
            return registry

        try:
            await scenario(registry_of)
        finally:
            for registry in made:
                await registry.close()

    run_and_collect(main())


def test_a_claim_fences_the_previous_owner_whose_later_writes_are_refused(
    redis_server: LocalRedis,
) -> None:
    async def scenario(registry_of: Callable[[str], RedisRegistry]) -> None:
        a, b = registry_of("a"), registry_of("b")
        first = await a.claim("dev1", False)
        assert first is not None and first.previous_node == ""
        await a.put_meta([MetaUpdate(KIND_SESSION, "dev1", b'{"subs":{"x/#":1}}')])
        second = await b.claim("dev1", False)
        assert second is not None and second.previous_node == "a"
        assert second.epoch > first.epoch
        assert second.records["subs"] == b'{"subs":{"x/#":1}}'
        with pytest.raises(StaleOwner) as refused:
            await a.put_meta([MetaUpdate(KIND_OFFSETS, "dev1", b"stale")])
        assert refused.value.clients == ["dev1"]
        assert "dev1" not in a.epochs
        await b.put_meta([MetaUpdate(KIND_OFFSETS, "dev1", b"fresh")])
        third = await a.claim("dev1", False)
        assert third is not None and third.records["off"] == b"fresh"

    run(redis_server, scenario)


def test_the_claim_hands_the_previous_online_record_to_the_new_owner_once(
    redis_server: LocalRedis,
) -> None:
    async def scenario(registry_of: Callable[[str], RedisRegistry]) -> None:
        a, b = registry_of("a"), registry_of("b")
        await a.claim("dev2", True)
        await a.put_meta([MetaUpdate(KIND_ONLINE, "dev2", b'{"will":"w"}')])
        claim = await b.claim("dev2", True)
        assert claim is not None and claim.online == b'{"will":"w"}'
        await b.put_meta([MetaUpdate(KIND_ONLINE, "dev2", None)])
        again = await a.claim("dev2", True)
        assert again is not None and again.online is None

    run(redis_server, scenario)


def test_adopting_takes_a_client_only_from_the_node_named(redis_server: LocalRedis) -> None:
    async def scenario(registry_of: Callable[[str], RedisRegistry]) -> None:
        dead, survivor, other = registry_of("dead"), registry_of("survivor"), registry_of("other")
        await dead.claim("dev3", False)
        await dead.claim("dev4", False)
        await other.claim("dev4", False)  # reconnected elsewhere before the cleanup
        assert sorted(await survivor.owned_by("dead")) == ["dev3"]
        assert await survivor.claim("dev4", None, only_from="dead") is None
        adopted = await survivor.claim("dev3", None, only_from="dead")
        assert adopted is not None and not adopted.was_clean
        assert await survivor.owner("dev3") == "survivor"

    run(redis_server, scenario)


def test_ending_a_session_deletes_it_and_a_stale_end_is_refused(
    redis_server: LocalRedis,
) -> None:
    async def scenario(registry_of: Callable[[str], RedisRegistry]) -> None:
        a, b = registry_of("a"), registry_of("b")
        await a.claim("dev5", True)
        await b.claim("dev5", True)
        with pytest.raises(StaleOwner):
            await a.end_session("dev5")
        assert await b.owner("dev5") == "b"
        await b.end_session("dev5")
        assert await b.owner("dev5") == ""
        assert await b.owned_by("b") == []

    run(redis_server, scenario)


def test_retained_messages_are_shared_and_membership_expires(redis_server: LocalRedis) -> None:
    async def scenario(registry_of: Callable[[str], RedisRegistry]) -> None:
        a, b = registry_of("a"), registry_of("b")
        await a.put_meta([MetaUpdate(KIND_RETAINED, "state/p7", b"record")])
        assert await b.retained() == {"state/p7": b"record"}
        await a.heartbeat({"peer": "127.0.0.1:1"}, ttl=0.3)
        await b.heartbeat({"peer": "127.0.0.1:2"}, ttl=30)
        alive, dead = await b.members()
        assert set(alive) == {"a", "b"} and dead == []
        await asyncio.sleep(0.5)
        alive, dead = await b.members()
        assert set(alive) == {"b"} and dead == ["a"]
        await b.mark_dead()
        alive, dead = await a.members()
        assert alive == {} and sorted(dead) == ["a", "b"]

    run(redis_server, scenario)


def test_a_claim_by_another_identity_is_refused_and_changes_nothing_until_the_session_ends(
    redis_server: LocalRedis,
) -> None:
    async def scenario(registry_of: Callable[[str], RedisRegistry]) -> None:
        a, b = registry_of("a"), registry_of("b")
        first = await a.claim("phone", False, identity="user:alice")
        assert first is not None
        await a.put_meta([MetaUpdate(KIND_SESSION, "phone", b'{"subs":{"alice/#":1}}')])
        with pytest.raises(SessionBound) as refused:
            await b.claim("phone", True, identity="user:mallory")
        assert refused.value.owner == "user:alice"
        assert "phone" not in b.epochs
        # Nothing moved: a still owns it at its epoch and may write.
        await a.put_meta([MetaUpdate(KIND_OFFSETS, "phone", b"kept")])
        again = await b.claim("phone", False, identity="user:alice")
        assert again is not None and again.previous_node == "a"
        assert again.records["off"] == b"kept" and "who" not in again.records
        # Adopting a dead node's session (no identity) keeps the binding.
        adopted = await a.claim("phone", None, only_from="b")
        assert adopted is not None
        with pytest.raises(SessionBound):
            await b.claim("phone", False, identity="anonymous")
        await a.end_session("phone")
        free = await b.claim("phone", True, identity="user:mallory")
        assert free is not None and free.previous_node == ""

    run(redis_server, scenario)


def test_a_session_claimed_without_an_identity_is_bound_by_the_first_claim_with_one(
    redis_server: LocalRedis,
) -> None:
    async def scenario(registry_of: Callable[[str], RedisRegistry]) -> None:
        a, b = registry_of("a"), registry_of("b")
        assert await a.claim("legacy", False) is not None
        assert await b.claim("legacy", False, identity="user:alice") is not None
        with pytest.raises(SessionBound):
            await a.claim("legacy", False, identity="user:mallory")

    run(redis_server, scenario)
