"""The admin API's clients endpoints (`ClientsAPI`, the "clients" part of
`bridge.operations.admin.AdminAPI`): a client's session and connection, the list of this node's
sessions, and kicking a client.

In a cluster a client is inspected or kicked where its session lives: a node that does not hold
it asks the registry which node owns it and forwards the request to that node's admin API (the
address every node publishes in its heartbeat), as a node call signed with the cluster secret
for that one node (`admin_node_calls`), never carrying the operator's token. A forwarded request
is answered where it arrives, never forwarded again.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import quote

import aiohttp
from aiohttp import web
from yarl import URL

from bridge.operations.admin_node_calls import forwarded_by
from bridge.operations.admin_requests import (
    API_PREFIX,
    AdminPart,
    ApiError,
    keyset_page,
    page_limit,
    query_params,
)
from bridge.operations.node_calls import WINDOW

if TYPE_CHECKING:
    from bridge.listeners.connection import Connection
    from bridge.session import Session

log = logging.getLogger("bridge.admin")

FORWARD_TIMEOUT = 5.0
"""Seconds a forwarded request may take, the owning node's answer included."""
PROTOCOLS = {3: "MQTT 3.1", 4: "MQTT 3.1.1", 5: "MQTT 5.0"}


class ClientsAPI(AdminPart):
    """Endpoints on the clients: inspect, list, kick, each answered by the node that holds the
    client. Holds the HTTP client that forwards requests to other members, open between
    `start` and `stop` of the API."""

    _http: aiohttp.ClientSession | None = None

    def start(self) -> None:
        """Open the HTTP client of forwarded requests (on the running loop)."""
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=FORWARD_TIMEOUT))

    async def stop(self) -> None:
        """Close the HTTP client of forwarded requests."""
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def get_client(self, request: web.Request) -> web.Response:
        """A client's session and connection, from the node that holds it."""
        query_params(request, ())
        client_id = request.match_info["clientid"]
        elsewhere = await self._answer_of_owner(request, client_id)
        if elsewhere is not None:
            return elsewhere
        session = self.node.sessions.get(client_id)
        if session is None:
            raise ApiError(404, f"unknown client {client_id!r}")
        return web.json_response(self._client_detail(session))

    async def kick_client(self, request: web.Request) -> web.Response:
        """Close a client's connection as a network failure would: its will is published."""
        query_params(request, ())
        client_id = request.match_info["clientid"]
        elsewhere = await self._answer_of_owner(request, client_id)
        if elsewhere is not None:
            return elsewhere
        if self.node.kick(client_id, "kicked by the admin API"):
            log.info("admin API: kicked client %s", client_id)
            return web.json_response(
                {"kicked": True, "client_id": client_id, "node": self.node.node_id}
            )
        if client_id in self.node.sessions:
            raise ApiError(409, f"client {client_id!r} is not connected")
        raise ApiError(404, f"unknown client {client_id!r}")

    async def list_clients(self, request: web.Request) -> web.Response:
        """This node's sessions (connected or not) by ClientId, a page at a time."""
        params = query_params(request, ("limit", "after"))
        limit = page_limit(params)
        sessions = self.node.sessions
        page, next_after = keyset_page(sorted(sessions), params.get("after"), limit)
        items = [self._client_summary(sessions[client_id]) for client_id in page]
        return web.json_response({"node": self.node.node_id, "items": items, "next": next_after})

    def _client_summary(self, session: Session) -> dict[str, Any]:
        conn = self.node.connections.get(session.client_id)
        return {
            "client_id": session.client_id,
            "connected": conn is not None,
            "peer": conn.peer if conn is not None else None,
            "persistent": session.persistent,
            "subscriptions": len(session.subscriptions) + len(session.shared),
            "inflight": len(session.inflight),
            "queued": self._queue_depth(session),
        }

    def _client_detail(self, session: Session) -> dict[str, Any]:
        node = self.node
        conn = node.connections.get(session.client_id)
        detail: dict[str, Any] = {
            "client_id": session.client_id,
            "node": node.node_id,
            "connected": conn is not None,
            "peer": None,
            "ip": None,
            "connected_at": None,
            "disconnected_at": None if conn is not None else session.disconnected_at or None,
            "username": None,
            "protocol": None,
            "keepalive": None,
            "clean_session": not session.persistent,
            "persistent": session.persistent,
            "subscriptions": {**session.subscriptions, **session.shared},
            "inflight": len(session.inflight),
            "queued": self._queue_depth(session),
            "dropped_queue_full": session.dropped_queue_full,
            "dropped_retention": session.dropped_retention,
        }
        if conn is not None:
            # The node's table holds the listeners' connections (it types them by the narrow
            # role it uses); here the whole connection is read.
            detail.update(self._connection_fields(cast("Connection", conn)))
        return detail

    def _connection_fields(self, conn: Connection) -> dict[str, Any]:
        level = conn.decoder.protocol_level
        keepalive = conn.keepalive
        return {
            "peer": conn.peer,
            "ip": conn.peer.rpartition(":")[0] or None,
            "connected_at": conn.connected_at or None,
            "username": conn.username,
            "protocol": PROTOCOLS.get(level, f"level {level}"),
            "keepalive": keepalive,
        }

    def _queue_depth(self, session: Session) -> int:
        """Messages waiting to be sent to the session (beyond those in flight)."""
        end_offset = self.node.store.end_offset
        return sum(max(0, end_offset(q) - cursor) for q, cursor in session.cursors.items())

    async def _answer_of_owner(self, request: web.Request, client_id: str) -> web.Response | None:
        """If another cluster member owns `client_id`, its answer to this request; None if the
        client is connected here, owned by this node or nobody, or the request was forwarded
        here already (it is answered here, never forwarded twice)."""
        cluster = self.api.server.cluster
        if (
            cluster is None
            or client_id in self.node.connections
            or forwarded_by(request) is not None
        ):
            return None
        owner = await self.api.registry_call(cluster.registry.owner(client_id))
        if not owner or owner == self.node.node_id:
            return None
        return await self._forward(request, owner, client_id)

    async def _forward(self, request: web.Request, owner: str, client_id: str) -> web.Response:
        """Answer with what the owning node's admin API answers to the same request."""
        cluster = self.api.server.cluster
        assert cluster is not None and self._http is not None
        alive, _dead = await self.api.registry_call(cluster.registry.members())
        if owner not in alive:
            raise ApiError(
                503,
                f"client {client_id!r} is held by node {owner}, which is not alive (its "
                "sessions are being taken over)",
            )
        address = alive[owner].get("admin")
        if not address:
            raise ApiError(503, f"node {owner} does not serve the admin API")
        if not self.api.node_calls.can_call:
            raise ApiError(
                503,
                f"client {client_id!r} is held by node {owner}, and this node has no "
                "cluster secret to call it with",
            )
        url = URL(f"http://{address}{API_PREFIX}/clients/{quote(client_id, safe='')}", encoded=True)
        headers = self.api.node_calls.signed_headers(request.method, url, owner)
        try:
            async with self._http.request(request.method, url, headers=headers) as response:
                body = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ApiError(503, f"node {owner} ({address}) did not answer: {exc!r}") from None
        if status == 401:
            raise ApiError(
                503,
                f"node {owner} refused this node's call ({_error_of(body)}): every node needs "
                f"the same cluster secret and clocks within {WINDOW:.0f} s of each other",
            )
        return web.Response(body=body, status=status, content_type="application/json")


def _error_of(body: bytes) -> str:
    """The `error` of a JSON error answer, or a note that there is none."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        error = None
    return str(error) if error else "no error message"
