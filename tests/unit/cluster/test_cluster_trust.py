"""Whom a node believes: which authenticated peer may hold a link (a live member, at its current
boot, pushing aside no live link), which Release it honours (the registry's owner only), how
refused links are logged (every one counted, the lines throttled), and secret rotation by SIGHUP."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from bridge.cluster import wire
from bridge.cluster.peer_auth import PeerAuth, RefusalLog, certificate_names, peer_auth
from bridge.cluster.releases import Releases
from bridge.cluster.trust import LIVE_LINK_SILENCE, admit_link, link_refusal, release_refusal
from bridge.config import Config


class FakeLink:
    def __init__(self, peer_id: str, boot: str, last_heard: float = 0.0) -> None:
        self.peer_id = peer_id
        self.peer_boot = boot
        self.up = True
        self.closed = False
        self.last_heard = last_heard
        self.transport: Any = None


class FakeMembership:
    def __init__(self, members: dict[str, dict[str, Any]], registry: dict[str, Any]) -> None:
        self.auth = PeerAuth((b"k" * 32,))
        self.members = members
        self.links: dict[str, Any] = {}
        self.registry = registry
        self.refreshed = 0

    async def refresh_members(self) -> dict[str, dict[str, Any]]:
        self.refreshed += 1
        self.members = dict(self.registry)
        return self.members


def test_a_live_member_at_its_current_boot_is_admitted() -> None:
    assert link_refusal({"boot": "b2"}, None, "b2", now=100.0) == ""


def test_an_id_the_registry_does_not_list_is_refused() -> None:
    assert "no live member" in link_refusal(None, None, "b2", now=100.0)


def test_a_boot_other_than_the_registrys_is_refused() -> None:
    assert "shows boot b2" in link_refusal({"boot": "b2"}, None, "made-up", now=100.0)


def test_a_second_link_of_the_same_boot_cannot_push_a_live_one_aside() -> None:
    live = FakeLink("n2", "b2", last_heard=99.0)
    assert "a live link of that node is up" in link_refusal({"boot": "b2"}, live, "b2", 100.0)


def test_a_silent_link_of_the_same_boot_may_be_replaced() -> None:
    """The peer saw the link die before this side did (a half-open link): it redials."""
    silent = FakeLink("n2", "b2", last_heard=100.0 - LIVE_LINK_SILENCE - 1)
    assert link_refusal({"boot": "b2"}, silent, "b2", now=100.0) == ""


def test_a_restarted_peer_replaces_the_link_of_its_previous_boot() -> None:
    old = FakeLink("n2", "b1", last_heard=100.0)
    assert link_refusal({"boot": "b2"}, old, "b2", now=100.0) == ""


def test_a_peer_newer_than_the_known_membership_is_looked_up_in_the_registry() -> None:
    membership = FakeMembership({}, {"n3": {"boot": "b3"}})
    assert asyncio.run(admit_link(membership, FakeLink("n3", "b3"), now=1.0)) == ""  # type: ignore[arg-type]
    assert membership.refreshed == 1
    assert "no live member" in asyncio.run(
        admit_link(membership, FakeLink("n9", "b9"), now=1.0)  # type: ignore[arg-type]
    )


def test_with_peer_tls_alone_the_node_id_must_be_named_in_the_certificate() -> None:
    membership = FakeMembership({"n2": {"boot": "b2"}}, {})
    membership.auth = PeerAuth(())
    link = FakeLink("n2", "b2")

    class Transport:
        def __init__(self, cert: dict[str, Any]) -> None:
            self.cert = cert

        def get_extra_info(self, name: str) -> Any:
            return self.cert if name == "peercert" else None

    link.transport = Transport({"subject": ((("commonName", "n3"),),)})
    refusal = asyncio.run(admit_link(membership, link, now=1.0))  # type: ignore[arg-type]
    assert "its certificate names ['n3'], not n2" in refusal
    link.transport = Transport({"subjectAltName": (("DNS", "n2"),)})
    assert asyncio.run(admit_link(membership, link, now=1.0)) == ""  # type: ignore[arg-type]


def test_certificate_names_are_the_common_name_and_dns_alt_names() -> None:
    cert = {
        "subject": ((("organizationName", "acme"),), (("commonName", "node-1"),)),
        "subjectAltName": (("DNS", "node-1.internal"), ("IP Address", "10.0.0.1")),
    }
    assert certificate_names(cert) == {"node-1", "node-1.internal"}
    assert certificate_names(None) == set()


@pytest.mark.parametrize(
    ("owner", "epoch", "asked_at", "refused"),
    [
        ("n2", 7, 7, ""),
        ("n2", 8, 7, ""),  # it took the client again since: still its own
        ("n1", 7, 7, "names n1 as the client's owner"),
        ("", 0, 2**64 - 1, "names no node as the client's owner"),
        ("n2", 7, 2**64 - 1, "older than the request's"),
    ],
)
def test_a_release_is_honoured_only_from_the_registrys_owner(
    owner: str, epoch: int, asked_at: int, refused: str
) -> None:
    refusal = release_refusal(owner, epoch, "n2", asked_at)
    assert (refusal == "") if not refused else (refused in refusal)


def test_refused_links_are_all_counted_and_their_lines_throttled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refusals = RefusalLog(burst=3, interval=10.0)
    with caplog.at_level(logging.WARNING, logger="bridge.cluster"):
        for i in range(10):
            refusals.refuse(f"10.0.0.{i}:5000", "wrong proof", now=100.0 + i * 0.1)
        refusals.refuse("10.0.0.99:5000", "wrong proof", now=111.0)
    lines = [r.getMessage() for r in caplog.records]
    assert refusals.refused == 11
    assert lines[:3] == [f"refused peer link from 10.0.0.{i}:5000: wrong proof" for i in range(3)]
    assert "7 more peer links refused in the last 11 s" in lines[3]
    assert lines[4] == "refused peer link from 10.0.0.99:5000: wrong proof"


def test_sighup_rereads_the_secret_file_and_a_bad_file_keeps_the_keys(tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text("a" * 64 + "\n")
    config = Config(cluster_secret_file=str(secret_file))
    auth = peer_auth(config)
    assert len(auth.keys) == 1
    secret_file.write_text("b" * 64 + "\n" + "a" * 64 + "\n")
    auth.reload_keys(config)
    assert len(auth.keys) == 2
    secret_file.write_text("short\n")
    auth.reload_keys(config)
    assert len(auth.keys) == 2


class ReleaseRegistry:
    """`owner` None: Redis cannot be reached (the read fails, or with `hang` never answers)."""

    def __init__(
        self, owner: str | None, epoch: int, held: dict[str, int], hang: bool = False
    ) -> None:
        self.node_id = "a"
        self.owner, self.epoch = owner, epoch
        self.epochs = held
        self.hang = hang

    async def owner_epoch(self, client_id: str) -> tuple[str, int]:
        if self.owner is None:
            if self.hang:
                await asyncio.sleep(60)
            raise RedisConnectionError("Redis is cut off")
        return self.owner, self.epoch

    def disown(self, client_id: str) -> None:
        self.epochs.pop(client_id, None)


class ReleaseNode:
    def __init__(self) -> None:
        self.released: list[str] = []
        self.lost: list[str] = []
        self.metrics = Counter()

    def release_session(self, client_id: str, epoch: int | None = None) -> bytes:
        self.released.append(client_id)
        return b'{"subs":"{}","off":"{}"}'

    def lost_ownership(self, client_ids: list[str]) -> None:
        self.lost += client_ids


class Counter:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def inc(self, name: str, amount: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + amount


class SentLink:
    def __init__(self, peer_id: str) -> None:
        self.peer_id = peer_id
        self.sent: list[Any] = []

    def send(self, frame: Any) -> None:
        self.sent.append(frame)


def answer(
    owner: str | None, epoch: int, held: dict[str, int], asker: str = "b", hang: bool = False
) -> tuple[Any, ...]:
    registry = ReleaseRegistry(owner, epoch, held, hang)
    node, link = ReleaseNode(), SentLink(asker)
    handed: list[tuple[str, bytes]] = []
    releases = Releases({}, registry, node, lambda p, s: handed.append((p, s)), 0.2)  # type: ignore[arg-type]
    asyncio.run(releases.answer(link, wire.Release(1, "c", 5)))  # type: ignore[arg-type]
    return node, link.sent, handed


def test_the_registrys_owner_gets_the_client_and_its_state() -> None:
    node, sent, handed = answer("b", 5, {"c": 4})
    assert node.released == ["c"] and handed == [("b", b'{"subs":"{}","off":"{}"}')]
    assert sent == [wire.Released(1, "c", b'{"subs":"{}","off":"{}"}')]


def test_a_release_asked_by_another_node_than_the_owner_hands_nothing_over() -> None:
    node, sent, handed = answer("a", 4, {"c": 4})  # this node still owns it
    assert node.released == [] and node.lost == [] and handed == []
    assert sent == [wire.Released(1, "c", b"")]
    assert node.metrics.counts == {"peer_releases_refused": 1}


def test_a_client_a_third_node_took_since_is_let_go_but_not_handed_to_the_asker() -> None:
    node, sent, handed = answer("c3", 6, {"c": 4})
    assert node.lost == ["c"] and node.released == [] and handed == []
    assert sent == [wire.Released(1, "c", b"")]


@pytest.mark.parametrize("hang", [False, True], ids=["refused", "silent"])
def test_a_node_cut_from_redis_lets_a_client_go_to_a_peer_that_claimed_it_at_a_newer_epoch(
    hang: bool,
) -> None:
    """Keeping it would serve the client twice once the asker stops waiting (nemesis
    node-cut-from-redis found the old connection still answered after the new CONNACK)."""
    node, sent, handed = answer(None, 0, {"c": 4}, hang=hang)
    assert node.released == ["c"] and handed == [("b", b'{"subs":"{}","off":"{}"}')]
    assert sent == [wire.Released(1, "c", b'{"subs":"{}","off":"{}"}')]
    assert node.metrics.counts == {"peer_releases_unverified": 1}


def test_a_node_cut_from_redis_keeps_a_client_it_holds_at_a_newer_epoch_than_the_request() -> None:
    node, sent, handed = answer(None, 0, {"c": 6})  # taken back here since the peer's claim
    assert node.released == [] and handed == [] and sent == [wire.Released(1, "c", b"")]
    assert node.metrics.counts == {"peer_releases_refused": 1}
