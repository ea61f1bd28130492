"""What a node believes of its peers, and why: nothing is trusted because it came over a link.

Two checks, each against the registry in Redis rather than the peer's word:

* `admit_link`: a peer that proved the cluster secret (or presented a certificate of the cluster
  CA) may hold a link only as a node the registry lists alive, at the boot id the registry shows
  for it, and without pushing aside a live link of that same boot. A restarted peer has a new
  boot id, which its heartbeat put in the registry before it dialed: its link replaces the one
  of its previous run.
* `release_refusal`: a `Release` (close a client here, hand over its session) is honoured only
  from the node the registry names as the client's owner, at the epoch of the request or later.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from redis.exceptions import RedisError

from bridge.cluster.peer_auth import PeerAuth, certificate_names
from bridge.cluster.peers import PING_INTERVAL

if TYPE_CHECKING:
    from bridge.cluster.peers import PeerLink

LIVE_LINK_SILENCE = 3 * PING_INTERVAL
"""A link that carried something this recently is alive (each side pings every `PING_INTERVAL`
it has sent nothing): a second link claiming its peer and boot is refused, not let in."""


class Admitting(Protocol):
    """What admitting a link reads of the membership (`Cluster`)."""

    auth: PeerAuth
    members: dict[str, dict[str, Any]]
    links: dict[str, PeerLink]

    async def refresh_members(self) -> dict[str, dict[str, Any]]:
        """Re-read the live members from the registry (and act on them as the membership loop
        does); raises RedisError/OSError when Redis cannot be read."""
        ...


def link_refusal(
    info: dict[str, Any] | None, old: PeerLink | None, peer_boot: str, now: float
) -> str:
    """Why an authenticated peer claiming boot `peer_boot` may not hold a link ("" if it may):
    `info` is the registry's entry for its node id (None: not a live member), `old` the link
    to that node id this node holds now, if any."""
    if info is None:
        return "the registry lists no live member of that id"
    if info.get("boot") != peer_boot:
        return f"the registry shows boot {info.get('boot')} for that node"
    if (
        old is not None
        and old.up
        and not old.closed
        and old.peer_boot == peer_boot
        and now - old.last_heard < LIVE_LINK_SILENCE
    ):
        return f"a live link of that node is up (heard {now - old.last_heard:.1f} s ago)"
    return ""


async def admit_link(cluster: Admitting, link: PeerLink, now: float) -> str:
    """Why the peer authenticated on `link` may not hold it ("" if it may: see the module
    docstring). With peer TLS alone, the node id must also be named in its certificate."""
    if not cluster.auth.keys:
        transport = link.transport
        peercert = transport.get_extra_info("peercert") if transport is not None else None
        names = certificate_names(peercert)
        if link.peer_id not in names:
            return f"its certificate names {sorted(names)}, not {link.peer_id}"
    info = cluster.members.get(link.peer_id)
    if info is None or info.get("boot") != link.peer_boot:
        # A node that just started heartbeats before it dials: the membership read here may
        # be older than that.
        try:
            info = (await cluster.refresh_members()).get(link.peer_id)
        except (RedisError, OSError) as exc:
            return f"the registry cannot be read to check it ({exc})"
    return link_refusal(info, cluster.links.get(link.peer_id), link.peer_boot, now)


def release_refusal(owner: str, current: int, peer: str, epoch: int) -> str:
    """Why `peer`'s request to release a client at `epoch` is not honoured ("" if it is), given
    the registry's `owner` of the client and the `current` epoch it took it at: the registry
    must name `peer`, at `epoch` or a later epoch (it took the client again since)."""
    if owner != peer:
        return f"the registry names {owner or 'no node'} as the client's owner"
    if current < epoch:
        return f"the registry's epoch {current} is older than the request's"
    return ""
