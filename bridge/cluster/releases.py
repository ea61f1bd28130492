"""Moving a ClientId between nodes over their link: the new owner asks the old one to let the
client go (`Release`), the old one answers with the session's last state (`Released`).

The asking side waits at most `takeover_timeout` and falls back on the registry's copy of the
session. The answering side checks a peer's word against the registry: it lets the client go if
the registry names the asking node as the client's owner (`bridge.cluster.trust.release_refusal`);
otherwise it logs the refusal and answers that it holds nothing. If the registry shows that a
third node took the client since this node held it, this node lets the client go all the same
(as when its own writes are refused), without handing its state to the asker.

When the registry cannot be read in half of `takeover_timeout` (this node is cut from Redis, the
asker is not: it just claimed the client there), the peer's word decides, provided its epoch is
newer than the one this node took the client at: epochs come from one counter in Redis, so a
newer one was handed out after this node's claim. Keeping the client instead would serve it
twice, here and on the asking node once its wait is over; letting it go on a word that turns out
stale costs the client one reconnect. The asker is a cluster member that proved the cluster
secret on its link.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from bridge.cluster import wire
from bridge.cluster.trust import release_refusal
from bridge.storage.base import StoreUnavailable

if TYPE_CHECKING:
    from bridge.cluster.host import ClusterHost
    from bridge.cluster.peers import PeerLink
    from bridge.cluster.registry import RedisRegistry

log = logging.getLogger("bridge.cluster")


class Releases:
    """The `Release` requests this node made and the ones it answers (module docstring)."""

    def __init__(
        self,
        links: dict[str, PeerLink],
        registry: RedisRegistry,
        node: ClusterHost,
        handed_to: Callable[[str, bytes], None],
        timeout: float,
    ) -> None:
        self.links = links
        self.registry = registry
        self.node = node
        self.handed_to = handed_to
        """Called with the asking peer and the state handed to it (`Interest.handed_to`)."""
        self.timeout = timeout
        self._requests: dict[int, tuple[str, asyncio.Future[bytes | None]]] = {}
        """Release request id -> (peer asked, its answer)."""
        self._next_request = 1

    async def request(self, peer: str, client_id: str, epoch: int) -> bytes | None:
        """Ask the node that held the client to let it go; its last session state (JSON), b""
        if it had none, None if it could not be asked (no link, no answer in time)."""
        link = self.links.get(peer)
        if link is None:
            return None
        request = self._next_request
        self._next_request += 1
        future: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
        self._requests[request] = (peer, future)
        link.send(wire.Release(request, client_id, epoch))
        try:
            return await asyncio.wait_for(future, self.timeout)
        except TimeoutError:
            log.warning("client %s: node %s did not release it in time", client_id, peer)
            return None
        finally:
            self._requests.pop(request, None)

    def answered(self, frame: wire.Released) -> None:
        """A peer answered one of this node's requests."""
        pending = self._requests.pop(frame.request, None)
        if pending is not None and not pending[1].done():
            pending[1].set_result(frame.state)

    def link_lost(self, peer: str) -> None:
        """The link to `peer` went down: its pending requests are not answered (their callers
        use the registry's copy)."""
        for request, (asked, future) in list(self._requests.items()):
            if asked == peer and not future.done():
                future.set_result(None)
                del self._requests[request]

    async def answer(self, link: PeerLink, frame: wire.Release) -> None:
        """Let a client go to the peer that took it over, if the registry agrees it did."""
        peer, client_id = link.peer_id, frame.client_id
        try:
            owner, current = await asyncio.wait_for(
                self.registry.owner_epoch(client_id), self.timeout / 2
            )
        except (RedisError, OSError, StoreUnavailable, TimeoutError) as exc:
            held = self.registry.epochs.get(client_id)
            if held is None or frame.epoch > held:
                log.warning(
                    "client %s: released to node %s on its word (epoch %d, this node's %s): "
                    "the registry cannot be read (%s)",
                    client_id,
                    peer,
                    frame.epoch,
                    held,
                    exc or "no answer in time",
                )
                self.node.metrics.inc("peer_releases_unverified")
                state = self.node.release_session(frame.client_id, frame.epoch)
                self.handed_to(peer, state)
                link.send(wire.Released(frame.request, frame.client_id, state))
                return
            owner, current = "", 0
            refusal = f"the registry cannot be read and this node holds epoch {held}"
        else:
            refusal = release_refusal(owner, current, peer, frame.epoch)
        if refusal:
            log.warning(
                "refused Release of client %s from node %s (epoch %d): %s",
                client_id,
                peer,
                frame.epoch,
                refusal,
            )
            self.node.metrics.inc("peer_releases_refused")
            state = b""
            held = self.registry.epochs.get(client_id)
            if owner and owner != self.registry.node_id and held is not None and current > held:
                self.registry.disown(client_id)  # a third node took it: not ours either
                self.node.lost_ownership([client_id])
        else:
            state = self.node.release_session(frame.client_id, frame.epoch)
            self.handed_to(peer, state)
        link.send(wire.Released(frame.request, frame.client_id, state))
