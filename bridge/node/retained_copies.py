"""Retained messages a SUBSCRIBE queued for a client and not yet sent: never queued twice.

A retained QoS 1/2 message matching a new subscription is delivered through the client's own
queue, like any QoS 1/2 message (so its delivery survives a reconnect): a copy is stored there,
fsynced. A client that sends SUBSCRIBE `#` again and again without reading made the node store
every matching retained message again each time. `RetainedCopies` remembers, per client, which
retained messages (by their key, with the QoS and Subscription Identifiers the copy carries) it
queued, and where the client's queue ended just before: while the client's cursor has not
passed that end, the copy is still unsent and will go out, so another SUBSCRIBE asks for
nothing new. Once sent, a later SUBSCRIBE queues a fresh copy, as MQTT-3.3.1-9 wants (Retain
Handling 0 sends them on every SUBSCRIBE).

Only what is still unsent is remembered: entries whose copies went out are dropped whenever the
client subscribes again, and all of a client's when its session ends. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

CopyId = tuple[str, int, tuple[int, ...]]
"""(the retained message's key, the QoS of the copy, its Subscription Identifiers)."""


class RetainedCopies:
    """Per client: the retained copies queued and not yet sent, each with the ends of the
    client's queue parts just before it was stored."""

    __slots__ = ("_queued",)

    def __init__(self) -> None:
        self._queued: dict[str, dict[CopyId, Mapping[str, int]]] = {}

    def unsent(self, client_id: str, copy: CopyId, cursors: Mapping[str, int]) -> bool:
        """Whether `copy` was queued for `client_id` and its cursors (part -> next offset to
        send) have not passed where the queue ended before it: it will still be sent."""
        queued = self._queued.get(client_id)
        ends = queued.get(copy) if queued is not None else None
        return ends is not None and _unsent(ends, cursors)

    def queued(self, client_id: str, copy: CopyId, ends: Mapping[str, int]) -> None:
        """`copy` was stored in the client's queue, whose parts ended at `ends` just before."""
        self._queued.setdefault(client_id, {})[copy] = ends

    def drop(self, client_id: str, copy: CopyId) -> None:
        """`copy` was not stored after all (the store failed): not remembered."""
        queued = self._queued.get(client_id)
        if queued is not None:
            queued.pop(copy, None)

    def prune(self, client_id: str, cursors: Mapping[str, int]) -> None:
        """Forget the copies of `client_id` that were sent (its cursors passed them)."""
        queued = self._queued.get(client_id)
        if queued is None:
            return
        for copy, ends in list(queued.items()):
            if not _unsent(ends, cursors):
                del queued[copy]
        if not queued:
            del self._queued[client_id]

    def forget(self, client_id: str) -> None:
        """The client's session ended: nothing of it is remembered."""
        self._queued.pop(client_id, None)

    def __len__(self) -> int:
        """How many copies are remembered, for every client together."""
        return sum(len(queued) for queued in self._queued.values())


def _unsent(ends: Mapping[str, int], cursors: Mapping[str, int]) -> bool:
    """A copy stored after `ends` is unsent while no part's cursor passed its end (the copy is
    in one of the parts, at or after that part's end). A part without a cursor may start
    reading past it: not known to be unsent."""
    for part, end in ends.items():
        cursor = cursors.get(part)
        if cursor is None or cursor > end:
            return False
    return True
