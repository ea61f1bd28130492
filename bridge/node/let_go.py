"""The last state of sessions this node let go because the registry refused its writes for them.

A node lets a session go without handing it to anyone when Redis refuses its writes for the
client (`ClusterOwnership.lost_ownership`): the registry names another epoch. Usually another
node took the client over and holds the session; nobody will ask for this copy. But a Sentinel
failover can also roll the registry back: a claim this node made on the deposed master, confirmed
by a replica that was then made to follow the new master, is gone, and the registry names this
node again under its older epoch. The session this node served since (which messages it sent,
under which packet ids, which the client acknowledged) was then in no copy anywhere: the node
that took the client next resumed the registry's older copy and sent the client QoS 2 messages
it had completed, under new packet ids, as new (the nemesis saw 64 of them).

So the state is kept here, and handed over when the registry sends a taker to this node for the
client (`ClusterOwnership.release`) or the client comes back here. It is the latest state in
the cluster exactly when the registry names this node: any later owner would have asked this
node to let the client go, and would be named instead. It is bounded in bytes, the oldest
dropped first (such a client gets the registry's copy, as before).
"""

from __future__ import annotations

from collections import OrderedDict

MAX_BYTES = 16 * 1024 * 1024
"""The most state kept (a session's state is its subscriptions, cursors and the keys of the
QoS 2 messages it was last sent: from a hundred bytes to some tens of KiB)."""


class LetGo:
    """ClientId -> its session's state as `ClusterOwnership.release` encodes it."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._states: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._states)

    def keep(self, client_id: str, state: bytes) -> None:
        """Keep the state of a session let go (an empty one is a clean session's: nothing)."""
        self.pop(client_id)
        if not state or len(state) > self.max_bytes:
            return
        self._states[client_id] = state
        self._bytes += len(state)
        while self._bytes > self.max_bytes:
            _, dropped = self._states.popitem(last=False)
            self._bytes -= len(dropped)

    def pop(self, client_id: str) -> bytes:
        """The state kept for the client (b"" if none), no longer kept."""
        state = self._states.pop(client_id, b"")
        self._bytes -= len(state)
        return state
