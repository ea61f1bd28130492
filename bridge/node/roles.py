"""The narrow roles the node's helpers are given instead of the whole node.

Each helper states here what it calls, and nothing more: a `Delivery` sends to a `ClientLink`, a
`Housekeeper` asks its `SessionOwner` to let sessions go, and so on. The node (and, for
`ClientLink`, the listener's connection) fulfil them; a unit test fulfils them with a few lines.
No import of the node or of the listeners: the dependencies point one way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from bridge.mqtt.packets import Will
from bridge.session import Session
from bridge.storage.base import Message


class Spawner(Protocol):
    """Runs background work whose failures are logged, never lost."""

    def __call__(self, coro: Coroutine[Any, Any, Any], /) -> asyncio.Task[Any]: ...


class Drain(Protocol):
    """What a connection sees of the task that sends its session's stored messages
    (`bridge.node.delivery.Delivery`): it wakes it when the client can take more."""

    @property
    def blocked_on_window(self) -> bool:
        """Whether a drain stopped on a full in-flight window (an acknowledgement frees it)."""
        ...

    def wake(self) -> None:
        """Something may be deliverable: drain soon."""
        ...


class ClientLink(Protocol):
    """What the node's side needs of one client connection (`bridge.listeners.connection`)."""

    client_id: str
    username: str | None
    peer: str
    listener: str
    cert_cn: str | None
    connected_at: float
    session: Session | None
    delivery: Drain | None
    """The task sending its session's stored messages, once connected (set and cleared by the
    node's `SessionLifecycle`)."""
    will: Will | None
    will_key: str
    closed: bool
    detached: bool
    close_reason: str
    msgs_in: int
    payload_in: int
    msgs_out: int
    payload_out: int
    keepalive: int
    """The keepalive granted, in seconds (0: none)."""
    shared_encoding: int
    """Which QoS 0 PUBLISH encoded once per fan-out the client takes as it is: 4 (the 3.1.1
    one), 5 (the v5 one, unless its session has subscription options), 0 (none: it uses topic
    aliases, so each message is encoded for it)."""
    max_packet_out: int
    """The largest packet the client accepts (its v5 Maximum Packet Size)."""

    @property
    def receive_window(self) -> int:
        """QoS 1/2 messages the client takes unacknowledged (its v5 Receive Maximum)."""
        ...

    @property
    def auth_method(self) -> str | None:
        """The MQTT 5.0 enhanced authentication method the client completed (None: none)."""
        ...

    @property
    def level(self) -> int:
        """The protocol level the client speaks (3, 4 or 5)."""
        ...

    def encode_message(
        self,
        message: Message,
        qos: int,
        retain: bool,
        dup: bool = False,
        packet_id: int | None = None,
        sub_ids: tuple[int, ...] = (),
    ) -> bytes | None:
        """The PUBLISH of `message` for this client, in its protocol version (5.0: with the
        message's properties, these Subscription Identifiers, a topic alias); None if it is
        larger than the client accepts (then it must not be sent)."""
        ...

    def start_v5(
        self, connect_props: dict[int, Any], chosen: dict[int, Any], session_present: bool
    ) -> None:
        """Accept a v5 CONNECT: answer CONNACK with the server's limits and `chosen` values."""
        ...

    @property
    def writable(self) -> bool:
        """False while the socket's buffer is over its high-water mark."""
        ...

    def screen_delivery(self, topic: str) -> bool:
        """Whether the ACL lets a message on `topic` reach this client (a deny rule narrower
        than one of its subscriptions leaves such topics out); one held back is counted."""
        ...

    def send(self, data: bytes) -> None:
        """Queue an encoded packet."""
        ...

    def send_message(self, data: bytes, payload_size: int, *, metered: bool = True) -> None:
        """Queue an encoded PUBLISH and meter its payload (not a resend: `metered=False`)."""
        ...

    def send_droppable(self, data: bytes, payload_size: int, publisher: str) -> bool:
        """Send a QoS 0 PUBLISH of `publisher` unless the client is too slow to take it (its
        publisher may be made to wait: `bridge.node.qos0_flow`); True if sent."""
        ...

    def hold_reading(self, reason: int) -> None:
        """Stop reading the client's socket until `release_reading(reason)` (a `PAUSED_*` of
        `bridge.node.flow`)."""
        ...

    def release_reading(self, reason: int) -> None:
        """End one reason to stop reading; with none left, read on."""
        ...

    def close(
        self,
        reason: str,
        *,
        taken_over: bool = False,
        log_it: bool = True,
        reason_code: int | None = None,
        discard_queued: bool = False,
    ) -> None:
        """Close after flushing what is queued (or dropping it, with `discard_queued`), logging
        why (a v5 client first gets DISCONNECT with `reason_code`, if one is given)."""
        ...

    def hold_acks(self, reason: str) -> None:
        """Hold the client's PUBACKs/PUBRECs, in order, until `release_acks(reason)`."""
        ...

    def release_acks(self, reason: str) -> None:
        """End one reason to hold acknowledgements; with none left, send what waited."""
        ...

    def limit_publishes(self, messages_per_second: float, bytes_per_second: float) -> None:
        """Pace what the client sends to these rates (0: unlimited) by reading it later."""
        ...

    def hold(self) -> None:
        """Keep the client's further packets unhandled until `release`."""
        ...

    def release(self) -> None:
        """End one `hold`."""
        ...


class SessionOwner(Protocol):
    """What housekeeping asks of the node that holds the sessions."""

    def spawn(self, coro: Coroutine[Any, Any, Any], /) -> asyncio.Task[Any]:
        """Run background work whose failures are logged."""
        ...

    def lost_ownership(self, client_ids: list[str]) -> None:
        """Writes for these clients were refused: another node owns them now."""
        ...

    def expire(self, sessions: list[Session]) -> Coroutine[Any, Any, None]:
        """Discard these offline sessions durably (and in the cluster's registry)."""
        ...


class Waker(Protocol):
    """Wakes the readers of queues that received messages."""

    reachable: Callable[[str], bool]
    """Whether a shared-subscription member can take a message now (here or on a peer)."""

    def wake_readers(self, reader_ids: list[str], queues: list[str]) -> None:
        """Wake local readers, tell peers about theirs, check the backlog of offline ones."""
        ...

    def reader_of(self, client_id: str) -> str:
        """The reader to wake for a client's queue: the client, or the peer holding it."""
        ...
