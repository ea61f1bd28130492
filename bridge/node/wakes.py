"""Waking the readers of queues that received messages, here, on peers and offline.

A message stored on queues (by this node, a peer or a backend through notify) is read by the
pull task (`Delivery`) of each connected session that reads them; that task sleeps while its
cursors are at the queues' ends as this node knows them. `Wakes` is how it learns that they
moved: from this node's own stores (`wake_readers`), from a peer's announcement with the ends it
counted (`queues_grew`) or without them (`queues_woken`), and by asking the store again when
announcements may have been lost (`refresh_queue_ends`: a link was down, a session moved here).
A reader that is a peer (it holds the session) is told once per wake; an offline session is
handed to housekeeping, which watches its backlog.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from bridge.node.positions import reread_ends
from bridge.node.roles import Spawner
from bridge.router.plan import readers_of
from bridge.router.queues import is_peer, peer_of
from bridge.router.trie import SubscriptionTrie
from bridge.session import Session
from bridge.storage.base import MessageStore, StoreUnavailable

if TYPE_CHECKING:
    from bridge.cluster.cluster import Cluster
    from bridge.node.delivery import Delivery

CHECK_AFTER = 0.02
"""Seconds after a peer's wake when the end of a part the store holds a read at is read again,
for the rare message the broker did not answer that read with (bridge.storage.rocketmq.held):
longer than that answer takes after the wake's message was stored."""
RECHECK_AFTER = 1.0
"""Seconds after a peer's wake when the end of a caught-up reader's queue is read again: longer
than the broker takes to put a confirmed message into its light queues."""


class Wakes:
    """Tells the readers of queues that they hold more messages (module docstring)."""

    def __init__(
        self,
        *,
        store: MessageStore,
        trie: SubscriptionTrie,
        sessions: Mapping[str, Session],
        deliveries: Mapping[str, Delivery],
        reader_of: Callable[[str], str],
        offline_grew: Callable[[str], None],
        spawn: Spawner,
    ) -> None:
        self.store = store
        self.trie = trie
        self.sessions = sessions
        self.deliveries = deliveries
        self.reader_of = reader_of
        """The client itself if its session is here, else the peer holding it (if known)."""
        self.offline_grew = offline_grew
        """Called with a woken reader that has no delivery here (an offline session whose queues
        grew: the housekeeper trims it if it is over its limits)."""
        self.spawn = spawn
        self.cluster: Cluster | None = None
        """The cluster whose peers are told about their readers (None: a single node)."""
        self._refresh_limit = asyncio.Semaphore(32)
        """Queue-end reads under way at once when ends are read again (`refresh_queue_ends`,
        `_recheck_end_later`)."""
        self.reads_held: Callable[[str], bool] | None = None
        """Whether the store holds a read at the end of a part, which brings its next message
        by itself (`bridge.storage.rocketmq.held`; None: a store without them)."""
        self._held_checks: dict[str, int] = {}
        """Part -> the end a peer announced that its held read has not brought yet
        (`_check_held_later`)."""
        self._rechecks: dict[str, bool] = {}
        """Part -> whether a peer woke it again while its end is due to be read again
        (`_recheck_end_later`)."""

    def queues_grew(self, ends: dict[str, int], *, forward: bool = True) -> None:
        """Parts of queues are known to hold messages up to these ends (notify, or with
        `forward` False a peer's count): wake their readers, here and (`forward`) on the peers
        that have readers of them. A peer's count of a part the store holds a read at is only
        checked a moment later: the held read brings those messages, and a reader woken before
        it would ask the broker for messages it has not dispatched yet."""
        woken: list[str] = []
        peers: dict[str, dict[str, int]] = {}
        store = self.store
        queue_of_part = store.queue_of_part
        reads_held = None if forward else self.reads_held
        for part, end in ends.items():
            queue = queue_of_part(part)
            if queue is None:
                continue  # not a part of this store's queues (a peer on another store?)
            if reads_held is not None and reads_held(part):
                self._check_held_later(part, end)
                continue
            store.note_end(part, end)
            for reader in readers_of(queue, self.trie, self.reader_of):
                if not is_peer(reader):
                    woken.append(reader)
                elif forward:
                    peers.setdefault(peer_of(reader), {})[part] = end
        if woken:
            self.wake_readers(list(dict.fromkeys(woken)), [])
        if self.cluster is not None:
            for peer, peer_ends in peers.items():
                self.cluster.grew(peer, peer_ends)

    def held_read_arrived(self, ends: dict[str, int]) -> None:
        """A read the store held found these parts grown to these ends: wake their readers
        here (peers hold reads of their own, or are woken by the node that stored)."""
        store = self.store
        woken: list[str] = []
        for part, end in ends.items():
            queue = store.queue_of_part(part)
            if queue is None:
                continue
            store.note_end(part, end)
            for reader in readers_of(queue, self.trie, self.reader_of):
                if not is_peer(reader):
                    woken.append(reader)
        if woken:
            self.wake_readers(list(dict.fromkeys(woken)), [])

    def queues_woken(self, queues: Iterable[str]) -> None:
        """A peer stored messages on these parts of queues (their new ends unknown here): let
        each reader that is caught up wait for at least one more message."""
        woken: list[str] = []
        store = self.store
        queue_of_part = store.queue_of_part
        reads_held = self.reads_held
        for part in queues:
            queue = queue_of_part(part)
            if queue is None:
                continue
            for reader in readers_of(queue, self.trie, self.reader_of):
                session = self.sessions.get(reader)
                if session is None:
                    continue
                cursor = session.cursors.get(part)
                if cursor is not None and cursor >= store.end_offset(part):
                    if reads_held is not None and reads_held(part):
                        # The store's held read brings the message (it may have already,
                        # and counting one more would have the reader wait for a message
                        # that is not coming); if the broker missed that read, this finds it.
                        self._check_held_later(part, cursor + 1)
                        continue
                    store.note_end(part, cursor + 1)  # a read waits (long-polls) for it
                    self._recheck_end_later(part)
                woken.append(reader)
        if woken:
            self.wake_readers(list(dict.fromkeys(woken)), [])

    def _check_held_later(self, part: str, end: int) -> None:
        """A peer stored messages on `part` up to `end` (or, from a wake, at least one past a
        caught-up reader) and the store holds a read at the part's end, which brings them. If
        `CHECK_AFTER` s later the part's known end is still short of `end`, the broker missed
        that read (`bridge.storage.rocketmq.held`): read the end again and wake the readers
        behind it. One check per part at a time, for the highest end asked."""
        checks = self._held_checks
        if end <= self.store.end_offset(part):
            return
        if part in checks:
            checks[part] = max(checks[part], end)
            return
        checks[part] = end

        async def check() -> None:
            try:
                await asyncio.sleep(CHECK_AFTER)
                if self.store.end_offset(part) >= checks[part]:
                    return
                async with self._refresh_limit:
                    found = await self.store.track_queue(part)
            except StoreUnavailable:
                return
            finally:
                checks.pop(part, None)
            self._wake_behind(part, found)

        self.spawn(check())

    def _recheck_end_later(self, part: str) -> None:
        """Read `part`'s end again `RECHECK_AFTER` s after the last of a run of peer wakes,
        then wake its readers that are behind it. A wake names the queue, not how many
        messages came: the read it starts may find only the first of several, the others not
        yet in the queue, and no later wake comes for them once their publishers stopped."""
        rechecks = self._rechecks
        if part in rechecks:
            rechecks[part] = True  # once more after the one under way
            return
        rechecks[part] = False

        async def recheck() -> None:
            again = True
            while again:
                await asyncio.sleep(RECHECK_AFTER)
                rechecks[part] = False
                try:
                    async with self._refresh_limit:
                        end = await self.store.track_queue(part)
                except StoreUnavailable:
                    break
                self._wake_behind(part, end)
                again = rechecks[part]
            rechecks.pop(part, None)

        self.spawn(recheck())

    def _wake_behind(self, part: str, end: int) -> None:
        """Wake the local readers of `part` whose cursor is before `end`."""
        queue = self.store.queue_of_part(part)
        if queue is None:
            return
        behind = []
        for reader in readers_of(queue, self.trie, self.reader_of):
            session = self.sessions.get(reader)
            cursor = session.cursors.get(part) if session is not None else None
            if cursor is not None and cursor < end:
                behind.append(reader)
        if behind:
            self.wake_readers(behind, [])

    def wake_readers(self, reader_ids: list[str], queues: list[str], *, local: bool = True) -> None:
        """Wake the local readers (unless `local` is False: woken already), tell each peer among
        them once that `queues` grew, let housekeeping look at offline sessions' backlogs."""
        deliveries = self.deliveries
        told: set[str] | None = None  # made for the first peer: most wakes have none
        ends: dict[str, int] | None = None
        for reader in reader_ids:
            delivery = deliveries.get(reader)
            if delivery is not None:
                if local:
                    delivery.wake()
            elif is_peer(reader):
                if told is None:
                    told = set()
                if self.cluster is not None and reader not in told:
                    told.add(reader)
                    if ends is None:
                        end_offset = self.store.end_offset
                        parts = self.store.parts
                        ends = {p: end_offset(p) for queue in queues for p in parts(queue)}
                    self.cluster.wake(peer_of(reader), ends)
            else:
                self.offline_grew(reader)

    async def refresh_queue_ends(self, client_id: str | None = None) -> None:
        """Re-read the ends of the queues connected clients (or `client_id`) read, then wake
        them (after a peer link was down, announcements of new messages may have been lost)."""
        if client_id is None:
            queues = {q for s in self.sessions.values() if s.connected for q in s.cursors}
        else:
            session = self.sessions.get(client_id)
            queues = set(session.cursors) if session is not None else set()
        await reread_ends(self.store, queues, self._refresh_limit)
        # The deliveries as they are now: one made while the ends were read (a resumed
        # session's CONNACK) looked at the ends before they were known.
        if client_id is None:
            deliveries = list(self.deliveries.values())
        else:
            deliveries = [d for d in (self.deliveries.get(client_id),) if d is not None]
        for delivery in deliveries:
            delivery.wake()
