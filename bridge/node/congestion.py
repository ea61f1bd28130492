"""Online subscribers that fall behind slow their publishers down; nothing acknowledged is dropped.

A connected subscriber reads its queues at its own pace. When a QoS 1/2 message is stored on a
queue of a connected subscriber that already holds more unsent messages than `max_queued_messages`
(or more bytes than `max_queued_bytes`), the node holds the publisher's PUBACK/PUBREC for that
message, and every acknowledgement of that publisher after it, in order, until each of the
subscriber's queues is back under 90% of the limits, or it disconnects. The publisher's in-flight
window fills and it waits; its socket is still read, so its own PUBACKs for what it receives keep
flowing (two clients that publish to each other cannot deadlock on each other's reading). The
limits bound *offline* sessions by dropping their oldest messages (`bridge.node.housekeeping`), as
Mosquitto documents for its own; an online one is never trimmed.

Only publishers on this node are slowed: a subscriber on a peer falling behind grows its queue in
the store instead (durable, bounded by the store's retention).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from bridge.node.roles import ClientLink
from bridge.session import Session

if TYPE_CHECKING:
    from bridge.counters import Metrics
    from bridge.node.delivery import Delivery
    from bridge.settings import Config
    from bridge.storage.base import MessageStore

log = logging.getLogger("bridge.node")

RELEASE_AT = 0.9
"""Acknowledgements flow again once a lagging subscriber is back under this part of its limits."""


class Congestion:
    """Which publishers' acknowledgements are held, and for which lagging subscribers."""

    __slots__ = (
        "_checked", "_holding", "config", "connections", "deliveries", "max_bytes", "max_count",
        "metrics", "store",
    )  # fmt: skip

    def __init__(
        self,
        *,
        config: Config,
        store: MessageStore,
        metrics: Metrics,
        connections: Mapping[str, ClientLink],
        deliveries: Mapping[str, Delivery],
    ) -> None:
        self.config = config
        self.max_count = config.max_queued_messages
        self.max_bytes = config.max_queued_bytes
        """The limits, read once as native ints: this is checked for every stored message."""
        self.store = store
        self.metrics = metrics
        self.connections = connections
        self.deliveries = deliveries
        self._holding: dict[str, set[str]] = {}
        """Lagging subscriber's ClientId -> publishers whose acknowledgements wait for it."""
        self._checked: tuple[int, str, list[str], list[str]] = (-1, "", [], [])
        """The last check made in a commit's pass: (pass, publisher, queues, readers)."""

    def stored(
        self, publisher: str, queues: list[str], readers: list[str], commit_pass: int = -1
    ) -> None:
        """A QoS 1/2 message of `publisher` is durable on `queues` (each counted in its parts),
        read by `readers`: if one of them is connected here and too far behind, hold the
        publisher's acknowledgements (this one included: call this before acknowledging).

        `commit_pass`: the store's `commit_pass` as these callbacks run (-1: one by one).
        Within one pass the backlogs do not change, so the check made for the first message
        of a publisher on the same (remembered) plan's queues answers for the others: a commit
        holding 20 messages of one publisher to one topic checks its subscribers once, not 20
        times."""
        if commit_pass >= 0:
            last = self._checked
            if (
                last[0] == commit_pass
                and last[2] is queues
                and last[3] is readers
                and last[1] == publisher
            ):
                return
            self._checked = (commit_pass, publisher, queues, readers)
        conn = self.connections.get(publisher)
        if conn is None or not readers:
            return
        deliveries = self.deliveries
        max_count = self.max_count
        max_bytes = self.max_bytes
        for reader in readers:
            if reader == publisher:
                continue  # never for its own backlog: it would wait on itself
            delivery = deliveries.get(reader)
            if delivery is None:
                continue
            cursors = delivery.session.cursors
            self._hold_if_behind(cursors, queues, max_count, max_bytes, reader, publisher, conn)

    def _hold_if_behind(
        self,
        cursors: Mapping[str, int],
        queues: list[str],
        max_count: int,
        max_bytes: int,
        reader: str,
        publisher: str,
        conn: ClientLink,
    ) -> None:
        """Hold `publisher`'s acknowledgements if `reader` is too far behind on a part of
        `queues` (a loop of its own: a generator per message cost more)."""
        store = self.store
        for queue in queues:
            for part in store.parts(queue):
                cursor = cursors.get(part)
                if cursor is None:
                    continue
                count, size = store.backlog(part, cursor)
                if count > max_count or size > max_bytes:
                    self._hold(reader, publisher, conn, count)
                    return

    def _hold(self, reader: str, publisher: str, conn: ClientLink, count: int) -> None:
        publishers = self._holding.get(reader)
        if publishers is None:
            publishers = self._holding[reader] = set()
            self.metrics.inc("subscribers_behind")
            log.warning(
                "client %s is %d messages behind (max_queued_messages=%d): holding the "
                "acknowledgements of its publishers until it catches up",
                reader,
                count,
                self.config.max_queued_messages,
            )
        if publisher not in publishers:
            publishers.add(publisher)
            self.metrics.inc("publishers_slowed")
            conn.hold_acks(reader)

    def holding(self, reader: str) -> frozenset[str]:
        """The publishers whose acknowledgements wait for `reader` (empty: none)."""
        return frozenset(self._holding.get(reader, ()))

    def read(self, session: Session) -> None:
        """`session`'s delivery finished a pass: if publishers wait for it and each of its queues
        is back under `RELEASE_AT` of the limits, let their acknowledgements go."""
        if session.client_id not in self._holding:
            return
        max_count = self.config.max_queued_messages * RELEASE_AT
        max_bytes = self.config.max_queued_bytes * RELEASE_AT
        backlog = self.store.backlog
        for queue, cursor in session.cursors.items():
            count, size = backlog(queue, cursor)
            if count > max_count or size > max_bytes:
                return
        self._release(session.client_id, "caught up")

    def gone(self, session: Session) -> None:
        """`session`'s client disconnected: its backlog is an offline session's now."""
        if session.client_id in self._holding:
            self._release(session.client_id, "disconnected")

    def _release(self, reader: str, why: str) -> None:
        publishers = self._holding.pop(reader)
        log.info(
            "client %s %s: acknowledgements of %d publishers flow again",
            reader,
            why,
            len(publishers),
        )
        for publisher in publishers:
            conn = self.connections.get(publisher)
            if conn is not None:
                conn.release_acks(reader)
