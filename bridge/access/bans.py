"""PURE. Banned clients: what a ban is, how a request for one is checked, the table a node matches
CONNECTs against, and the sliding window that finds flapping clients. No I/O, no clock: every
call that depends on time is handed `now` (Unix seconds).

A ban names one client by exactly one of its ClientId, its user name or its address (an IP
address, or a CIDR network of them), and holds until a wall-clock time (`until`), so that every
node of a cluster lets it lapse at the same moment. Addresses are kept in one canonical text
form: `10.0.0.0/8`, `2001:db8::/32`, and a single host without its full-length prefix
(`10.1.2.3`, not `10.1.2.3/32`); an IPv4 client connecting over IPv6 as `::ffff:10.1.2.3`
matches the IPv4 bans. A ban's identity is its kind and value: banning the same one again
replaces it (a new end time, a new reason).
"""

from __future__ import annotations

import ipaddress
import json
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

CLIENTID = "clientid"
USERNAME = "username"
ADDRESS = "address"
KINDS = (CLIENTID, USERNAME, ADDRESS)
"""What a ban may name, each a field of a ban request and a path segment of the admin API."""
REQUEST_FIELDS = (*KINDS, "seconds", "reason")
MAX_SECONDS = 10 * 365 * 24 * 3600
"""The longest ban (ten years): enough for "for ever", small enough for every clock."""
MAX_VALUE_BYTES = 65535
"""The longest ClientId or user name MQTT can carry."""
MAX_REASON = 200

BY_ADMIN = "admin"
BY_FLAPPING = "flapping"


class BanError(ValueError):
    """A ban request or stored ban record that is not valid; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class Ban:
    """One ban: who (`kind`, canonical `value`), until when (Unix time), since when, why, and
    who set it (`BY_ADMIN` or `BY_FLAPPING`)."""

    kind: str
    value: str
    until: float
    created: float
    reason: str = ""
    by: str = BY_ADMIN

    @property
    def key(self) -> str:
        """The ban's identity, `kind:value` (a Redis hash field, a listing's sort key)."""
        return ban_key(self.kind, self.value)

    def expired(self, now: float) -> bool:
        """Whether the ban has lapsed at `now`."""
        return self.until <= now

    def record(self) -> str:
        """The ban as stored (JSON); `from_record` reads it back."""
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_record(cls, raw: str | bytes) -> Ban:
        """A stored ban; BanError if the record is not one `record` wrote."""
        try:
            data = json.loads(raw)
            ban = cls(
                kind=data["kind"],
                value=data["value"],
                until=float(data["until"]),
                created=float(data["created"]),
                reason=str(data.get("reason", "")),
                by=str(data.get("by", BY_ADMIN)),
            )
        except (ValueError, TypeError, KeyError) as exc:
            raise BanError(f"not a ban record: {exc}") from None
        if ban.kind not in KINDS or not isinstance(ban.value, str):
            raise BanError(f"not a ban record: kind {ban.kind!r}")
        if canonical_value(ban.kind, ban.value) != ban.value:
            raise BanError(f"not a ban record: value {ban.value!r} is not canonical")
        return ban

    def describe(self, now: float) -> dict[str, object]:
        """The ban as the admin API shows it."""
        return {
            "kind": self.kind,
            "value": self.value,
            "until": self.until,
            "seconds_left": max(0.0, round(self.until - now, 3)),
            "created": self.created,
            "reason": self.reason,
            "by": self.by,
        }


def ban_key(kind: str, value: str) -> str:
    """The identity of the ban of `value` by `kind` (see `Ban.key`)."""
    return f"{kind}:{value}"


def canonical_value(kind: str, value: str) -> str:
    """`value` in the form bans of `kind` are kept in; BanError naming what is wrong."""
    if kind not in KINDS:
        raise BanError(f"unknown ban kind {kind!r} (one of {', '.join(KINDS)})")
    if not value:
        raise BanError(f"{kind} must not be empty")
    if kind != ADDRESS:
        if "\x00" in value:
            raise BanError(f"{kind} must not contain U+0000")
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:
            raise BanError(f"{kind} is not valid UTF-8 (lone surrogate)") from None
        if size > MAX_VALUE_BYTES:
            raise BanError(f"{kind} is longer than {MAX_VALUE_BYTES} bytes")
        return value
    try:
        network = ipaddress.ip_network(value, strict=True)
    except ValueError as exc:
        if "has host bits set" in str(exc):
            wider = ipaddress.ip_network(value, strict=False)
            raise BanError(f"address {value!r} has host bits set: did you mean {wider}?") from None
        raise BanError(f"address {value!r} is not an IP address or CIDR network") from None
    if network.prefixlen == network.max_prefixlen:
        return str(network.network_address)
    return str(network)


def parse_ban_request(data: object, now: float) -> Ban:
    """The ban a request asks for: a JSON object naming exactly one of `clientid`, `username`
    or `address`, with `seconds` (a positive number, at most `MAX_SECONDS`) and optionally a
    `reason`. BanError names the first fault."""
    if not isinstance(data, dict):
        raise BanError("body is not a JSON object")
    unknown = sorted(str(name) for name in set(data) - set(REQUEST_FIELDS))
    if unknown:
        raise BanError(
            f"unknown field(s): {', '.join(unknown)} (a ban has one of {', '.join(KINDS)}, "
            "seconds and an optional reason)"
        )
    named = [kind for kind in KINDS if kind in data]
    if len(named) != 1:
        raise BanError(f"a ban names exactly one of {', '.join(KINDS)}; got {len(named)}")
    kind = named[0]
    value = data[kind]
    if not isinstance(value, str):
        raise BanError(f"{kind} must be a string")
    value = canonical_value(kind, value)
    seconds = data.get("seconds")
    if (
        not isinstance(seconds, int | float)
        or isinstance(seconds, bool)
        or not math.isfinite(seconds)
        or not 0 < seconds <= MAX_SECONDS
    ):
        raise BanError(f"seconds must be a positive number of at most {MAX_SECONDS}")
    reason = data.get("reason", "")
    if not isinstance(reason, str) or len(reason) > MAX_REASON:
        raise BanError(f"reason must be a string of at most {MAX_REASON} characters")
    return Ban(kind, value, until=now + seconds, created=now, reason=reason)


def peer_ip(peer: str) -> IPAddress | None:
    """The IP address of a connection's peer as the listeners write it (`IP:PORT`, an IPv6 IP
    without brackets); an IPv4-mapped IPv6 address as its IPv4 address. None if it is none."""
    host = peer.rpartition(":")[0].strip("[]") if ":" in peer else peer
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def matches(ban: Ban, client_id: str, username: str | None, ip: IPAddress | None) -> bool:
    """Whether `ban` names a client with this ClientId, user name and address (expiry aside)."""
    if ban.kind == CLIENTID:
        return ban.value == client_id
    if ban.kind == USERNAME:
        return username is not None and ban.value == username
    return ip is not None and ip in ipaddress.ip_network(ban.value)


class BanTable:
    """The bans in force on a node, by identity, matched against a client in a few dict lookups
    plus one containment test per banned network. Lapsed bans stay until `purge` but never match
    and are never listed."""

    def __init__(self) -> None:
        self._bans: dict[str, Ban] = {}
        self._networks: dict[str, IPNetwork] = {}
        """Key -> network, for the address bans wider than one host."""

    def __len__(self) -> int:
        return len(self._bans)

    def put(self, ban: Ban) -> bool:
        """Hold `ban`, replacing one of the same identity; whether it was not held before."""
        new = ban.key not in self._bans
        self._bans[ban.key] = ban
        if ban.kind == ADDRESS and "/" in ban.value:
            self._networks[ban.key] = ipaddress.ip_network(ban.value)
        return new

    def remove(self, kind: str, value: str) -> Ban | None:
        """Stop holding the ban of `value` by `kind`; the ban removed, or None."""
        key = ban_key(kind, value)
        self._networks.pop(key, None)
        return self._bans.pop(key, None)

    def replace(self, bans: Iterable[Ban]) -> list[Ban]:
        """Hold exactly `bans`; those that are new or changed (what may now refuse a client
        that was let in)."""
        before = self._bans
        self._bans = {}
        self._networks = {}
        for ban in bans:
            self.put(ban)
        return [ban for key, ban in self._bans.items() if before.get(key) != ban]

    def get(self, kind: str, value: str, now: float) -> Ban | None:
        """The ban of `value` by `kind` in force at `now`, or None."""
        ban = self._bans.get(ban_key(kind, value))
        return None if ban is None or ban.expired(now) else ban

    def active(self, now: float) -> list[Ban]:
        """The bans in force at `now`, by identity."""
        return [ban for _key, ban in sorted(self._bans.items()) if not ban.expired(now)]

    def purge(self, now: float) -> list[Ban]:
        """Forget the bans that lapsed by `now`; those forgotten."""
        lapsed = [ban for ban in self._bans.values() if ban.expired(now)]
        for ban in lapsed:
            self.remove(ban.kind, ban.value)
        return lapsed

    def match(
        self, client_id: str, username: str | None, ip: IPAddress | None, now: float
    ) -> Ban | None:
        """The ban in force at `now` that names this client (by ClientId first, then user name,
        then address), or None."""
        candidates = [self._bans.get(ban_key(CLIENTID, client_id))]
        if username is not None:
            candidates.append(self._bans.get(ban_key(USERNAME, username)))
        if ip is not None:
            candidates.append(self._bans.get(ban_key(ADDRESS, str(ip))))
            candidates += [
                self._bans[key]
                for key, network in self._networks.items()
                if network.version == ip.version and ip in network
            ]
        for ban in candidates:
            if ban is not None and not ban.expired(now):
                return ban
        return None


class FlappingDetector:
    """Counts each ClientId's connects in a sliding window of `window` seconds; a client is
    flapping when its connects in the window exceed `max_connects`. Keeps at most
    `max_connects + 1` times per client, and forgets a client whose window emptied."""

    def __init__(self, max_connects: int, window: float) -> None:
        self.max_connects = max_connects
        self.window = window
        self._times: dict[str, deque[float]] = {}

    def __len__(self) -> int:
        return len(self._times)

    def record_connect(self, client_id: str, now: float) -> int:
        """Count a connect of `client_id` at `now`; its connects in the window ending at `now`
        (this one included, at most `max_connects + 1`)."""
        times = self._times.get(client_id)
        if times is None:
            times = self._times[client_id] = deque(maxlen=self.max_connects + 1)
        times.append(now)
        while times and times[0] <= now - self.window:
            times.popleft()
        return len(times)

    def is_flapping(self, count: int) -> bool:
        """Whether `count` connects in one window is more than allowed."""
        return count > self.max_connects

    def forget(self, client_id: str) -> None:
        """Start `client_id`'s count afresh (it was banned)."""
        self._times.pop(client_id, None)

    def sweep(self, now: float) -> int:
        """Forget the clients with no connect in the window ending at `now`; how many."""
        idle = [cid for cid, times in self._times.items() if times[-1] <= now - self.window]
        for client_id in idle:
            del self._times[client_id]
        return len(idle)
