"""What the cluster membership uses of its node: `ClusterHost`.

The cluster is handed this role, not the node: the node's subscription tables (which hold the
peers' interest too), a few questions about its clients, and the callbacks through which peers'
frames reach it. `bridge.node.Node` fulfils it; `bridge.cluster` never imports the node.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from bridge.cluster.registry import Claim
    from bridge.counters import Metrics
    from bridge.node.stalls import StallWatch
    from bridge.router.shared import SharedSubscriptions
    from bridge.router.trie import SubscriptionTrie
    from bridge.storage.base import Message


class ClusterHost(Protocol):
    """The node as its cluster membership sees it."""

    node_id: str
    trie: SubscriptionTrie
    """The node's subscription trie; peers' interest goes in under their peer ids."""
    shared: SharedSubscriptions
    """The node's shared groups; remote members go in under their ClientIds."""
    metrics: Metrics
    stalls: StallWatch
    """Watched for pauses of this process while the cluster runs (`bridge.node.stalls`)."""

    def spawn(self, coro: Coroutine[Any, Any, Any], /) -> asyncio.Task[Any]:
        """Run background work whose failures are logged."""
        ...

    # -- questions --------------------------------------------------------------------------

    def is_connected(self, client_id: str) -> bool:
        """Whether the client has a connection on this node."""
        ...

    def holds_session(self, client_id: str) -> bool:
        """Whether the client's session (connected or not) is held by this node."""
        ...

    def connected_count(self) -> int:
        """Clients connected to this node."""
        ...

    def local_shared_members(self) -> list[tuple[str, str, int]]:
        """(share filter, ClientId, QoS) of every shared membership of a session held here."""
        ...

    def queue_ends_known(self, queues: list[str]) -> dict[str, int]:
        """The ends this node's store knows of the parts of `queues` (parts it knows nothing of
        left out)."""
        ...

    # -- sessions moving between nodes --------------------------------------------------------

    def adopt_session(self, client_id: str, claim: Claim) -> object:
        """Hold a persistent session taken over from a dead node."""
        ...

    def release_session(self, client_id: str, epoch: int | None = None) -> bytes:
        """Another node took the client over: let it go, hand over its state."""
        ...

    def fence_clients(self) -> None:
        """This node's lease on its clients may lapse (`bridge.cluster.lease`): close every
        client connection."""
        ...

    def lost_ownership(self, client_ids: list[str]) -> None:
        """Writes for these clients were refused: another node owns them now."""
        ...

    async def publish_orphan_will(
        self, client_id: str, will: Message, online: bytes | None
    ) -> None:
        """Publish the will of a client whose node died, taken from its `online` record (which
        says whether that node had begun publishing it)."""
        ...

    async def clear_online(self, client_id: str) -> None:
        """Delete a dead node's online record of a client that left no will."""
        ...

    # -- what peers send ------------------------------------------------------------------------

    def deliver_forwarded(self, message: Message) -> None:
        """A QoS 0 message a peer forwarded, for this node's own (non-shared) subscribers.
        Topic, payload and retain flag are set; publisher, timestamp and `properties` (its
        MQTT 5 metadata) too when it has metadata and the peer could send it
        (`wire.ForwardMeta`), empty otherwise. QoS is 0."""
        ...

    def deliver_to(self, client_id: str, message: Message) -> None:
        """A QoS 0 message for one shared member held here (filled as for
        `deliver_forwarded`)."""
        ...

    def queues_woken(self, queues: Iterable[str]) -> None:
        """A peer stored messages on these queues."""
        ...

    def queues_grew(self, ends: dict[str, int], *, forward: bool = True) -> None:
        """These queues hold messages up to these ends."""
        ...

    def retained_from_peer(self, topic: str, record: bytes) -> None:
        """A peer set or cleared a topic's retained message."""
        ...

    def replace_retained(self, records: dict[str, bytes]) -> None:
        """The registry's full set of retained messages."""
        ...

    async def refresh_queue_ends(self) -> None:
        """Re-read queue ends and wake every reader (after a link was down)."""
        ...
