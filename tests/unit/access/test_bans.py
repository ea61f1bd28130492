"""Banned clients: ban requests (every bad form named), canonical addresses, the ban table against
a brute-force matcher, stored records, peers' addresses, the flapping window against a
brute-force count; and in process, the ban list's file and its fallback without Redis."""

from __future__ import annotations

import asyncio
import ipaddress
import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.exceptions import ConnectionError as RedisConnectionError

from bridge.access.banlist import BANS_FILE, BanList, BanListUnavailable
from bridge.access.bans import (
    ADDRESS,
    BY_FLAPPING,
    CLIENTID,
    KINDS,
    MAX_SECONDS,
    USERNAME,
    Ban,
    BanError,
    BanTable,
    FlappingDetector,
    canonical_value,
    matches,
    parse_ban_request,
    peer_ip,
)
from bridge.config import Config

NOW = 1_800_000_000.0


# -- requests ------------------------------------------------------------------------------------


def test_a_request_names_one_client_for_some_seconds() -> None:
    ban = parse_ban_request({"clientid": "dev/1", "seconds": 60, "reason": "noisy"}, NOW)
    assert ban == Ban(CLIENTID, "dev/1", until=NOW + 60, created=NOW, reason="noisy")
    assert parse_ban_request({"username": "bob", "seconds": 0.5}, NOW).until == NOW + 0.5
    assert parse_ban_request({"address": "10.0.0.0/8", "seconds": 1}, NOW).value == "10.0.0.0/8"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "body is not a JSON object"),
        ("clientid", "body is not a JSON object"),
        ({"clientid": "a", "seconds": 1, "color": "red"}, "unknown field(s): color"),
        ({"seconds": 1}, "exactly one of clientid, username, address; got 0"),
        ({"clientid": "a", "username": "b", "seconds": 1}, "exactly one of"),
        ({"clientid": 7, "seconds": 1}, "clientid must be a string"),
        ({"clientid": "", "seconds": 1}, "clientid must not be empty"),
        ({"clientid": "a\x00b", "seconds": 1}, "must not contain U+0000"),
        ({"username": "\ud800", "seconds": 1}, "lone surrogate"),
        ({"clientid": "x" * 65536, "seconds": 1}, "longer than 65535 bytes"),
        ({"address": "10.0.0.300", "seconds": 1}, "not an IP address or CIDR network"),
        ({"address": "10.0.0.0/33", "seconds": 1}, "not an IP address or CIDR network"),
        ({"address": "example.com", "seconds": 1}, "not an IP address or CIDR network"),
        ({"address": "10.1.2.3/8", "seconds": 1}, "host bits set: did you mean 10.0.0.0/8?"),
        ({"clientid": "a"}, "seconds must be a positive number"),
        ({"clientid": "a", "seconds": 0}, "seconds must be a positive number"),
        ({"clientid": "a", "seconds": -5}, "seconds must be a positive number"),
        ({"clientid": "a", "seconds": "60"}, "seconds must be a positive number"),
        ({"clientid": "a", "seconds": True}, "seconds must be a positive number"),
        ({"clientid": "a", "seconds": float("nan")}, "seconds must be a positive number"),
        ({"clientid": "a", "seconds": float("inf")}, "seconds must be a positive number"),
        ({"clientid": "a", "seconds": MAX_SECONDS + 1}, f"at most {MAX_SECONDS}"),
        ({"clientid": "a", "seconds": 1, "reason": 3}, "reason must be a string"),
        ({"clientid": "a", "seconds": 1, "reason": "r" * 201}, "at most 200 characters"),
    ],
)
def test_every_bad_request_is_refused_naming_its_fault(data: object, message: str) -> None:
    with pytest.raises(BanError, match=None) as raised:
        parse_ban_request(data, NOW)
    assert message in str(raised.value)


def test_an_unknown_kind_is_named_with_the_known_ones() -> None:
    with pytest.raises(BanError, match="unknown ban kind 'ip'"):
        canonical_value("ip", "10.0.0.1")


@pytest.mark.parametrize(
    ("given_value", "canonical"),
    [
        ("10.1.2.3", "10.1.2.3"),
        ("10.1.2.3/32", "10.1.2.3"),
        ("10.0.0.0/8", "10.0.0.0/8"),
        ("0.0.0.0/0", "0.0.0.0/0"),
        ("2001:DB8:0:0::1", "2001:db8::1"),
        ("2001:db8::/32", "2001:db8::/32"),
        ("::1/128", "::1"),
    ],
)
def test_addresses_are_kept_in_one_canonical_form(given_value: str, canonical: str) -> None:
    assert canonical_value(ADDRESS, given_value) == canonical
    assert canonical_value(ADDRESS, canonical) == canonical


networks = st.one_of(
    st.builds(
        lambda n, p: ipaddress.ip_network((n, p), strict=False),
        st.integers(0, 2**32 - 1),
        st.integers(0, 32),
    ),
    st.builds(
        lambda n, p: ipaddress.IPv6Network((n, p), strict=False),
        st.integers(0, 2**128 - 1),
        st.integers(0, 128),
    ),
)


@given(networks)
def test_a_canonical_address_is_its_own_canonical_form_and_names_the_same_network(
    network: ipaddress.IPv4Network | ipaddress.IPv6Network,
) -> None:
    value = canonical_value(ADDRESS, str(network))
    assert canonical_value(ADDRESS, value) == value
    assert ipaddress.ip_network(value) == network


# -- records and peers ---------------------------------------------------------------------------


def test_a_record_reads_back_as_the_same_ban_and_garbage_is_refused() -> None:
    ban = Ban(ADDRESS, "2001:db8::/32", NOW + 5, NOW, "scan", BY_FLAPPING)
    assert Ban.from_record(ban.record()) == ban
    assert Ban.from_record(ban.record().encode()) == ban
    for raw in ("", "[]", "{}", '{"kind":"ip","value":"x","until":1,"created":1}'):
        with pytest.raises(BanError):
            Ban.from_record(raw)
    not_canonical = json.dumps({"kind": ADDRESS, "value": "10.0.0.1/32", "until": 1, "created": 1})
    with pytest.raises(BanError, match="not canonical"):
        Ban.from_record(not_canonical)


@pytest.mark.parametrize(
    ("peer", "ip"),
    [
        ("10.1.2.3:51000", "10.1.2.3"),
        ("::1:51000", "::1"),
        ("[::1]:51000", "::1"),
        ("::ffff:10.1.2.3:51000", "10.1.2.3"),
        ("?", None),
        ("", None),
    ],
)
def test_a_peers_ip_is_read_from_ip_colon_port(peer: str, ip: str | None) -> None:
    found = peer_ip(peer)
    assert (str(found) if found is not None else None) == ip


# -- the table -----------------------------------------------------------------------------------

clients = st.sampled_from(["c1", "c2", "c/3"])
users = st.sampled_from([None, "alice", "bob"])
ips = st.sampled_from(["10.1.2.3", "10.1.9.9", "192.168.0.1", "2001:db8::7", "::1"])
ban_values = {
    CLIENTID: st.sampled_from(["c1", "c2", "c/3"]),
    USERNAME: st.sampled_from(["alice", "bob"]),
    ADDRESS: st.sampled_from(
        ["10.1.2.3", "10.1.0.0/16", "10.0.0.0/8", "0.0.0.0/0", "2001:db8::/32", "::1", "::/0"]
    ),
}
bans = st.sampled_from(KINDS).flatmap(
    lambda kind: st.builds(
        lambda value, until: Ban(kind, value, until, NOW - 100),
        ban_values[kind],
        st.sampled_from([NOW - 1, NOW, NOW + 1, NOW + 1000]),
    )
)


@settings(max_examples=300)
@given(st.lists(bans, max_size=8), clients, users, ips)
def test_the_table_matches_what_a_brute_force_matcher_finds(
    banned: list[Ban], client_id: str, username: str | None, ip_text: str
) -> None:
    table = BanTable()
    for ban in banned:
        table.put(ban)
    held = {ban.key: ban for ban in banned}  # the last ban of an identity replaces the others
    ip = ipaddress.ip_address(ip_text)
    expected = [
        ban
        for ban in held.values()
        if not ban.expired(NOW) and matches(ban, client_id, username, ip)
    ]
    found = table.match(client_id, username, ip, NOW)
    assert (found is not None) == bool(expected)
    assert found is None or found in expected
    assert table.active(NOW) == sorted(
        (b for b in held.values() if not b.expired(NOW)), key=lambda b: b.key
    )


def test_replacing_the_table_reports_the_bans_that_are_new_or_changed() -> None:
    table = BanTable()
    kept = Ban(CLIENTID, "c1", NOW + 10, NOW)
    table.replace([kept, Ban(USERNAME, "bob", NOW + 10, NOW)])
    longer = Ban(USERNAME, "bob", NOW + 99, NOW)
    network = Ban(ADDRESS, "10.0.0.0/8", NOW + 10, NOW)
    assert table.replace([kept, longer, network]) == [longer, network]
    assert table.match("x", None, ipaddress.ip_address("10.9.9.9"), NOW) == network
    assert table.remove(ADDRESS, "10.0.0.0/8") == network
    assert table.match("x", None, ipaddress.ip_address("10.9.9.9"), NOW) is None


def test_a_lapsed_ban_matches_nothing_and_is_purged() -> None:
    table = BanTable()
    lapsed = Ban(CLIENTID, "c1", NOW, NOW - 10)
    table.put(lapsed)
    assert table.match("c1", None, None, NOW) is None
    assert table.get(CLIENTID, "c1", NOW) is None
    assert table.match("c1", None, None, NOW - 1) == lapsed
    assert table.purge(NOW) == [lapsed] and len(table) == 0


# -- flapping ------------------------------------------------------------------------------------


@settings(max_examples=300)
@given(
    st.integers(1, 5),
    st.sampled_from([1.0, 2.5, 10.0]),
    st.lists(st.tuples(st.sampled_from(["a", "b"]), st.floats(0, 3)), max_size=40),
)
def test_the_flapping_window_counts_what_a_brute_force_count_finds(
    max_connects: int, window: float, steps: list[tuple[str, float]]
) -> None:
    detector = FlappingDetector(max_connects, window)
    now = NOW
    history: dict[str, list[float]] = {}
    for client_id, gap in steps:
        now += gap
        history.setdefault(client_id, []).append(now)
        in_window = [t for t in history[client_id] if t > now - window]
        count = detector.record_connect(client_id, now)
        assert count == min(len(in_window), max_connects + 1)
        assert detector.is_flapping(count) == (len(in_window) > max_connects)


def test_idle_clients_are_forgotten_and_a_banned_one_starts_afresh() -> None:
    detector = FlappingDetector(2, 10.0)
    for t in (0, 1, 2):
        count = detector.record_connect("a", NOW + t)
    assert detector.is_flapping(count)
    detector.forget("a")
    assert detector.record_connect("a", NOW + 3) == 1
    detector.record_connect("b", NOW + 3)
    assert detector.sweep(NOW + 12) == 0
    assert detector.sweep(NOW + 13) == 2 and len(detector) == 0


# -- the ban list, in process (the file; Redis that does not answer) ------------------------------


class _Link:
    def __init__(self, client_id: str, username: str | None, peer: str) -> None:
        self.client_id, self.username, self.peer = client_id, username, peer


class _DeadRedis:
    """A Redis whose every command fails as an unreachable one does."""

    def __getattr__(self, _name: str) -> object:
        def fail(*_args: object, **_kwargs: object) -> object:
            raise RedisConnectionError("Connection refused")

        return fail


def _ban_list(tmp_path: Path, **settings: object) -> tuple[BanList, list[str], Counter[str]]:
    config = Config(data_dir=str(tmp_path), **settings)  # type: ignore[arg-type]
    connections = {"c1": _Link("c1", "alice", "10.1.2.3:5000"), "c2": _Link("c2", None, "::1:9")}
    kicked: list[str] = []
    counts: Counter[str] = Counter()

    def kick(client_id: str, _reason: str) -> bool:
        kicked.append(client_id)
        return True

    def count(name: str) -> None:
        counts[name] += 1

    bans = BanList(config, connections=connections, kick=kick, count=count, clock=lambda: NOW)
    return bans, kicked, counts


def test_a_single_nodes_bans_are_written_whole_and_read_back(tmp_path: Path) -> None:
    async def scenario() -> None:
        bans, kicked, counts = _ban_list(tmp_path)
        await bans.start(None)
        assert await bans.ban(Ban(ADDRESS, "10.0.0.0/8", NOW + 60, NOW)) is True
        assert kicked == ["c1"] and counts["banned_kicks"] == 1
        assert await bans.ban(Ban(USERNAME, "bob", NOW + 60, NOW)) is True
        assert await bans.unban(USERNAME, "bob") is not None
        assert await bans.unban(USERNAME, "bob") is None
        again, _kicked, _counts = _ban_list(tmp_path)
        await again.start(None)
        assert [b.key for b in again.active()] == ["address:10.0.0.0/8"]
        assert again.ban_of("x", None, "10.200.0.1:1") is not None
        assert not list(tmp_path.glob(".banned.json*"))  # no temporary file left

    asyncio.run(scenario())


def test_an_unreadable_bans_file_is_logged_and_no_ban_is_in_force(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / BANS_FILE).write_text("{not json")

    async def scenario() -> None:
        bans, _kicked, _counts = _ban_list(tmp_path)
        await bans.start(None)
        assert bans.active() == []

    asyncio.run(scenario())
    assert "is not JSON, no bans in force" in caplog.text


def test_without_redis_flapping_is_counted_and_banned_by_the_node_alone(tmp_path: Path) -> None:
    async def scenario() -> None:
        bans, kicked, counts = _ban_list(
            tmp_path, flapping_max_connects=2, flapping_window=60.0, flapping_ban_seconds=30.0
        )
        bans.redis = _DeadRedis()
        assert await bans.connected("c2") is None
        assert await bans.connected("c2") is None
        ban = await bans.connected("c2")
        assert ban is not None and ban.by == BY_FLAPPING and ban.until == NOW + 30
        assert bans.ban_of("c2", None, "::1:10") == ban  # held here until Redis answers
        assert kicked == ["c2"] and counts["flapping_bans"] == 1
        with pytest.raises(BanListUnavailable):
            await bans.ban(Ban(CLIENTID, "c9", NOW + 5, NOW))

    asyncio.run(scenario())
