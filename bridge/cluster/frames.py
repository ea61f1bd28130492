"""The frames of the peer-link protocol between bridge nodes (their encoding and the sans-IO
decoder are `bridge.cluster.wire`, the protocol's front door, which re-exports every name here).

PURE: frozen dataclasses, one per frame type. A frame's `TYPE` is its number on the wire and
`SCHEMA` the kinds of its fields in declaration order (the kinds are described in
`bridge.cluster.wire`). New frame types get new type numbers; an unknown type is a protocol
error, so a version bump is needed only when an old node could misread a frame.

Frames an earlier version does not know are optional `FEATURES`: a node advertises the ones it
understands in its registry info, and a peer sends them only to a node that advertised them
(for the boot it is linked to), the older frame otherwise. So in a rolling upgrade old and new
nodes keep their links. `ForwardMeta` and `DeliverMeta` (feature `"meta"`) carry a QoS 0
message's MQTT 5 metadata; a message without any still goes as `Forward` or `Deliver`.

What each frame means to a node is described in docs/design.md ("Cluster").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Final

VERSION = 3
"""The peer protocol version this code speaks (sent in `Hello`). 2: the authenticated handshake
(`Hello` carries a nonce, `Proof` follows). 3: `Confirm` and `Confirmed` (a node of version 2
would refuse them as unknown frames)."""

FEATURE_METADATA: Final = "meta"
"""The node understands `ForwardMeta` and `DeliverMeta`."""
FEATURES: Final = (FEATURE_METADATA,)
"""The optional frames this code understands (a node advertises them in its registry info)."""


@dataclass(frozen=True, slots=True)
class Frame:
    """Base of every frame; `TYPE` is its number on the wire, `SCHEMA` its field kinds."""

    TYPE: ClassVar[int] = 0
    SCHEMA: ClassVar[tuple[str, ...]] = ()


@dataclass(frozen=True, slots=True)
class Hello(Frame):
    """First frame of each side: protocol version, node id, a boot id that changes on every
    start (so a peer can tell a restarted node from a reconnected link) and a fresh random
    nonce the other side's `Proof` must cover (so no proof can be replayed)."""

    TYPE = 1
    SCHEMA = ("u64", "str", "str", "bytes")
    version: int
    node_id: str
    boot_id: str
    nonce: bytes


@dataclass(frozen=True, slots=True)
class Proof(Frame):
    """Second frame of each side: an HMAC of both `Hello`s and the sender's role, keyed with the
    cluster secret (`bridge.cluster.handshake.proof_mac`)."""

    TYPE = 20
    SCHEMA = ("bytes",)
    mac: bytes


@dataclass(frozen=True, slots=True)
class SyncBegin(Frame):
    """The sender replays its whole interest: the frames up to `SyncEnd` replace what the
    receiver knew of it (entries missing from the replay are dropped only at `SyncEnd`, so
    routing never has a gap while the replay streams)."""

    TYPE = 2


@dataclass(frozen=True, slots=True)
class SyncEnd(Frame):
    """End of the interest replay started by `SyncBegin`."""

    TYPE = 3


@dataclass(frozen=True, slots=True)
class AddFilters(Frame):
    """The sender now has local subscribers of these (non-shared) topic filters."""

    TYPE = 4
    SCHEMA = ("strs",)
    filters: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RemoveFilters(Frame):
    """The sender has no more local subscribers of these topic filters."""

    TYPE = 5
    SCHEMA = ("strs",)
    filters: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SharedMember(Frame):
    """A member of a shared subscription lives on the sender: its granted QoS and whether its
    client is connected now (the round-robin prefers connected members)."""

    TYPE = 6
    SCHEMA = ("str", "str", "u8", "u8")
    share_filter: str
    client_id: str
    qos: int
    online: int


@dataclass(frozen=True, slots=True)
class SharedMemberGone(Frame):
    """The member left the shared subscription (or its session moved to another node)."""

    TYPE = 7
    SCHEMA = ("str", "str")
    share_filter: str
    client_id: str


@dataclass(frozen=True, slots=True)
class Forward(Frame):
    """A QoS 0 message for the receiver's local (non-shared) subscribers of `topic`."""

    TYPE = 8
    SCHEMA = ("str", "bytes", "u8")
    topic: str
    payload: bytes
    retain: int


@dataclass(frozen=True, slots=True)
class Deliver(Frame):
    """A QoS 0 message for one client of the receiver (a shared-subscription pick)."""

    TYPE = 9
    SCHEMA = ("str", "str", "bytes")
    client_id: str
    topic: str
    payload: bytes


@dataclass(frozen=True, slots=True)
class ForwardMeta(Frame):
    """`Forward` of a message with MQTT 5 metadata: also its publisher (for No Local), its
    timestamp (its expiry counts from it) and its `Message.properties`, in order. Sent only to
    a peer with `FEATURE_METADATA`."""

    TYPE = 18
    SCHEMA = ("str", "bytes", "u8", "str", "u64", "pairs")
    topic: str
    payload: bytes
    retain: int
    publisher: str
    timestamp_ms: int
    properties: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class DeliverMeta(Frame):
    """`Deliver` of a message with MQTT 5 metadata (the fields of `ForwardMeta`). Sent only to
    a peer with `FEATURE_METADATA`."""

    TYPE = 19
    SCHEMA = ("str", "str", "bytes", "u8", "str", "u64", "pairs")
    client_id: str
    topic: str
    payload: bytes
    retain: int
    publisher: str
    timestamp_ms: int
    properties: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Wake(Frame):
    """Messages were stored on these queues (ends not known to the sender): wake their readers."""

    TYPE = 10
    SCHEMA = ("strs",)
    queues: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Grew(Frame):
    """These queues hold messages up to these ends (notify read them): wake their readers."""

    TYPE = 11
    SCHEMA = ("strs", "u64s")
    queues: tuple[str, ...]
    ends: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Retained(Frame):
    """The retained message of `topic` changed: `record` is its encoding, empty when cleared."""

    TYPE = 12
    SCHEMA = ("str", "bytes")
    topic: str
    record: bytes


@dataclass(frozen=True, slots=True)
class Release(Frame):
    """The sender took over `client_id` at `epoch`: close its connection here (no will: the new
    owner publishes it) and answer `Released` with the session's state."""

    TYPE = 13
    SCHEMA = ("u64", "str", "u64")
    request: int
    client_id: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Released(Frame):
    """Answer to `Release`: `state` is the session's last subscriptions and offsets (JSON), empty
    if this node did not hold the session."""

    TYPE = 14
    SCHEMA = ("u64", "str", "bytes")
    request: int
    client_id: str
    state: bytes


@dataclass(frozen=True, slots=True)
class NodeGone(Frame):
    """The sender has taken over the sessions of a dead node: forget that node's interest. Sent
    with the sender's own id, it says the sender is stopping: take over its sessions now."""

    TYPE = 15
    SCHEMA = ("str",)
    node_id: str


@dataclass(frozen=True, slots=True)
class Ping(Frame):
    """Keepalive: a link that carries nothing for a while proves it is alive."""

    TYPE = 16


@dataclass(frozen=True, slots=True)
class Pong(Frame):
    """Answer to `Ping`."""

    TYPE = 17


@dataclass(frozen=True, slots=True)
class Confirm(Frame):
    """Answer `Confirmed(token)` once every frame sent before this one is applied. The sender
    announced new interest and holds a SUBACK until each peer confirms it: a link is an ordered
    stream, and a node applies interest frames as it reads them."""

    TYPE = 21
    SCHEMA = ("u64",)
    token: int


@dataclass(frozen=True, slots=True)
class Confirmed(Frame):
    """Answer to `Confirm`: everything the peer sent before its `Confirm(token)` is applied."""

    TYPE = 22
    SCHEMA = ("u64",)
    token: int


FRAME_TYPES: dict[int, type[Frame]] = {
    cls.TYPE: cls
    for cls in (
        Hello,
        Proof,
        SyncBegin,
        SyncEnd,
        AddFilters,
        RemoveFilters,
        SharedMember,
        SharedMemberGone,
        Forward,
        Deliver,
        Wake,
        Grew,
        Retained,
        Release,
        Released,
        NodeGone,
        Ping,
        Pong,
        ForwardMeta,
        DeliverMeta,
        Confirm,
        Confirmed,
    )
}
