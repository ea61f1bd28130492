"""The storage contract every backend fulfils.

A bridge stores three things: messages (each appended once to its topic's log and referenced from
every queue it must reach), consumers' positions in those queues, and small keyed records
("meta": sessions, retained messages, QoS 2 state). A backend promises:

* `append(..., durable=True)` returns only when the message, its queue entries and the meta
  updates passed with it are on stable storage, all or nothing;
* a queue's offsets are dense and increase by one per message (0, 1, 2, ...), and never change;
* `seq` is unique and increasing across the whole store (like RocketMQ's commit-log offset);
* `read` never returns a message twice for one offset and reports what retention removed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from bridge.storage.message import Message as Message
from bridge.storage.message import MetaUpdate as MetaUpdate
from bridge.storage.message import ReadResult as ReadResult
from bridge.storage.message import Stored as Stored


class StoreUnavailable(Exception):
    """The backend cannot take or give data now (disk full, broker down). Nothing was acked.

    `maybe_stored` is True when a write may have taken effect although it was not confirmed
    (a time-out or a connection lost after the request went out).
    """

    def __init__(self, message: str, *, maybe_stored: bool = False) -> None:
        super().__init__(message)
        self.maybe_stored = maybe_stored


class StaleOwner(StoreUnavailable):
    """Writes of session records were refused: `clients` were taken over by another node since
    this one took them (a cluster fences each client's records with an epoch)."""

    def __init__(self, clients: list[str]) -> None:
        super().__init__(f"taken over by another node: {', '.join(clients[:5])}")
        self.clients = clients


class RecordsNotWritten(StoreUnavailable):
    """The records a message is stored with (a QoS 2 marker, a will's online record) could not
    be written first, so the message itself was not sent. `maybe_stored` is about the records: a
    QoS 2 marker that may be there must be settled before the message is stored again; a will
    can be sent again."""


class SessionBound(Exception):
    """A claim of a ClientId was refused: its session (or live connection) belongs to another
    identity, `owner` (`bridge.access.ownership`); nothing was changed."""

    def __init__(self, owner: str) -> None:
        super().__init__("the ClientId's session belongs to another identity")
        self.owner = owner


DurableCallback = Callable[[int | None, BaseException | None], None]
"""Told once a submitted message is durable (`seq`, None) or will not be (None, error)."""


def future_callback(future: asyncio.Future[int]) -> DurableCallback:
    """A durability callback that resolves `future` (unless it is done already): `submit`'s
    callback for a caller that awaits (`append`)."""

    def done(seq: int | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            assert seq is not None
            future.set_result(seq)

    return done


@dataclass(frozen=True)
class StoreTraits:
    """What a backend can do, declared once per backend; the node adapts to it."""

    atomic_meta: bool
    """True if meta passed with a message becomes durable in the same write as the message. If
    False, it becomes durable before the message is sent (so a crash in between leaves meta that
    names a message which may not exist: see `MessageStore.find_key`)."""
    local_ends: bool
    """True if `end_offset` is always the truth (this store assigns every offset itself), so a
    reader can start at a queue's end without asking anyone (`track_queue` need not be awaited)."""
    early_reads: bool
    """True if `submit(..., early=True)` may make a message readable before it is durable (its
    return value says whether it did); a failed write that takes back messages readers could
    read then calls `on_rewind` (queue -> new end)."""
    cached_reads: bool
    """True if `read_cached` can answer from memory; False if it always answers None (then the
    node does not ask it)."""
    exact_backlog_bytes: bool
    """True if `backlog`'s byte count is exact, False if it is an estimate."""
    held_reads: bool = False
    """True if the store keeps reads held at the ends of the parts its readers follow and learns
    by itself when they grow (`HeldReadStore`): it then calls `on_arrival`, and a peer's wake
    for a part whose reads it holds (`reads_held`) need not be counted as one more message."""


class MessageStore(Protocol):
    """The storage backend of a bridge. See the module docstring for the promises."""

    traits: StoreTraits
    """What this backend can do."""
    on_rewind: Callable[[dict[str, int]], None] | None
    """Set by the node when `traits.early_reads`: called with the queues whose readable end a
    failed write moved back, and their new ends."""
    commit_pass: int
    """Moves before each group of durability callbacks that run with nothing added or made
    visible between them (a commit's), so a backlog read in one of them reads the same in the
    others; -1 if callbacks come one by one (a check is then made for each)."""

    async def open(self) -> None:
        """Recover and load the store; after this, `meta` and queue ends reflect durable data."""

    async def close(self) -> None:
        """Flush everything pending and release files/connections."""

    async def append(
        self,
        message: Message,
        queues: Sequence[str],
        *,
        durable: bool = True,
        meta: Sequence[MetaUpdate] = (),
    ) -> int:
        """Store `message` once, enqueue it on every queue in `queues` and apply `meta`, atomically.

        Returns the message's `seq`. With `durable=False` the call returns once the data is
        accepted in memory; it becomes durable with the next group commit.
        """

    def submit(
        self,
        message: Message,
        queues: Sequence[str],
        *,
        meta: Sequence[MetaUpdate] = (),
        callback: DurableCallback,
        early: bool = False,
    ) -> bool:
        """Synchronous form of `append(durable=True)` for the broker's hot path.

        Assigns queue offsets and applies `meta` in memory before it returns (so calls made in
        order keep their order), then calls `callback(seq, None)` once the record is durable or
        `callback(None, error)` (StoreUnavailable) if it will not be, in submission order,
        without a future per message (`future_callback` makes one for a caller that awaits).
        Queue entries become visible to `read` and `end_offset` only when durable, so nothing is
        delivered that a crash could take back; with `early` (a QoS 0/1 message: a crash makes
        its publisher send it again) a store with `traits.early_reads` makes it visible at once
        if everything before it on its queues is. Returns whether it did: True when readers may
        read the message now, before its callback.
        """

    def append_unqueued(self, message: Message) -> None:
        """Store a message no queue references (QoS 0 kept for analytics): not awaited, not
        kept in memory, durable with the next group commit."""

    def parts(self, queue: str) -> tuple[str, ...]:
        """The parts `queue` is read as, each with offsets of its own: a reader keeps one
        position per part, and `read`, `end_offset`, `track_queue`, `note_end` and `backlog` take
        a part. A store with one log has one part per queue, the queue itself; RocketMQ has one
        per broker group (a message is stored on one group only)."""

    def queue_of_part(self, part: str) -> str | None:
        """The queue a part belongs to (None: not a part of this store)."""

    def upgrade_part(self, queue: str) -> str:
        """The part a position kept under a queue's own name belongs to (positions written
        before queues had parts)."""

    async def read(self, queue: str, offset: int, limit: int) -> ReadResult:
        """Up to `limit` messages of part `queue` from `offset` on, in offset order."""

    def read_cached(self, queue: str, offset: int, limit: int) -> ReadResult | None:
        """`read` without awaiting, while what it reads is in memory (a reader that keeps up);
        None when it needs I/O. A backend without `traits.cached_reads` always answers None."""

    def end_offset(self, queue: str) -> int:
        """The end of `queue` (the offset its next message gets) as far as this store knows: at
        least the end after every message this store appended (once durable) and every end it
        learned (`track_queue`, `note_end`, reads). 0 for a queue it knows nothing of. A backend
        whose queues other writers fill (RocketMQ) may lag behind the true end."""

    async def track_queue(self, queue: str) -> int:
        """Keep track of `queue` from now on and learn its true end: record the queue where
        the backend must know its queues (RocketMQ keeps a record of each queue it has made),
        ask the backend for the end if need be, and return it; `end_offset` follows. A command,
        not a question: it may write and does I/O."""

    def note_end(self, queue: str, end: int) -> None:
        """Learn that `queue` holds messages up to `end` (from a notification)."""

    def backlog(self, queue: str, offset: int) -> tuple[int, int]:
        """(messages, bytes) in `queue` at or after `offset`, as far as `end_offset` knows. The
        byte count is exact if `traits.exact_backlog_bytes`, else an estimate (average message
        size)."""

    async def find_key(self, topic: str, key: str) -> bool:
        """Whether a message with this key (and MQTT topic) is stored. Needed only when
        `atomic_meta` is False, to settle meta written for a message whose send was not
        confirmed; atomic backends raise NotImplementedError."""

    async def put_meta(self, updates: Sequence[MetaUpdate], *, durable: bool = True) -> None:
        """Apply keyed-record updates atomically; with `durable`, return after they are stable."""

    def meta(self, kind: str) -> dict[str, bytes]:
        """All records of `kind` as they stand (a live view the caller must not modify)."""


@runtime_checkable
class TimerStore(Protocol):
    """A store whose backend holds a delayed message until it is due (RocketMQ's timer
    messages). A store without this keeps no timers: the node keeps its delayed messages on a
    queue of its own, held back from retention (`HoldingStore`), and a due-time index of them
    in its keyed records (`bridge.node.delayed`)."""

    def submit_delayed(
        self,
        message: Message,
        delay_seconds: int,
        *,
        meta: Sequence[MetaUpdate] = (),
        callback: DurableCallback,
    ) -> None:
        """Store `message` now, durably (callback as for `MessageStore.submit`, in submission
        order with it), to be routed to its topic's subscribers at `message.timestamp_ms` (its
        due time), once per cluster, by whoever reads what the backend delivers then (notify).
        `meta` as for `submit`."""


class QueueHolds(Protocol):
    """Holds on queues of a store that assigns every offset itself: a reader that reads a
    queue out of order, long after (the node's delayed publishes), keeps its messages from
    retention until it has read them."""

    def next_offset(self, queue: str) -> int:
        """The offset the next message `submit`ted to `queue` gets (durable or not; a write
        that fails gives it to the next one). Known before the submit, so a keyed record
        written with the message can name its place."""

    def hold(self, queue: str, offset: int) -> None:
        """Keep `queue`'s messages from `offset` on (and whatever the store must keep to keep
        them) until a later hold moves the offset; retention deletes none of them. A hold
        should only move forward (to the reader's oldest unread message, or to the queue's
        next offset when it has read all). It outlives a restart: after one the store holds
        from the last offset set or an earlier one (a crash may lose the latest moves, and
        an earlier hold keeps more), never from a later one or none; and a hold set before a
        message is submitted is durable once that message is. Never raises for a store
        that takes no writes now: the hold stays where it was."""

    def held(self, queue: str) -> int | None:
        """The offset `queue` is held from (None: it was never held)."""


@runtime_checkable
class HoldingStore(Protocol):
    """A store whose queues a reader can hold back from retention (the embedded log): the
    node's delayed publishes wait on one of its queues (`bridge.node.delayed`)."""

    holds: QueueHolds


class HeldReadStore(MessageStore, Protocol):
    """A store with `traits.held_reads` (RocketMQ: `bridge.storage.rocketmq.held`)."""

    on_arrival: Callable[[dict[str, int]], None] | None
    """Set by the node: called with parts of queues a held read found grown, and their ends
    (their readers are woken; peers hold reads of their own)."""

    def reads_held(self, queue: str) -> bool:
        """Whether a read is held at the end of part `queue`: its next message is found
        without a wake."""
