"""The admin HTTP API: probes, cluster membership, clients (inspect, list, kick), subscriptions,
retained messages, publishing and the metrics hook.

An aiohttp application on its own listener (`admin_listen`), JSON in and out; `ROUTES` is the table
of endpoints and `bridge.operations.admin_openapi` describes each of them. Every request except the
probes, the OpenAPI document and the console's static files (/console/, `admin_console`) needs
`Authorization: Bearer <admin_token>` (/metrics too unless `metrics_public`). Every failure is
answered `{"error": "<message>"}` with its status, never an HTML page or a traceback. What a
stranger can make the listener hold is bounded: connections and the time each has to send a
request head (`admin_listener`), request bodies in size, time and JSON nesting (`admin_bodies`).

Handlers read the node's tables directly: they run on the node's event loop, so what they read is
consistent up to their next `await`, as for everything else the node does.

Groups of endpoints live in modules of their own, each a part of this API (`Route.part`): the
clients (`admin_clients`), topics, limits, bans, the console and access. In a cluster a client is
inspected or kicked where its session lives: `admin_clients` forwards the request to the owning
node as a node call, signed with the cluster secret for that one node (`admin_node_calls`) and
never carrying the operator's token; a node call is accepted only on the routes marked
`node_calls`.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from aiohttp import web

from bridge import __version__
from bridge.cluster.credential import read_cluster_secrets
from bridge.cluster.redis_errors import redis_errors
from bridge.operations.admin_access import AccessAPI
from bridge.operations.admin_bans import BansAPI
from bridge.operations.admin_bodies import publish_body_limit
from bridge.operations.admin_clients import ClientsAPI
from bridge.operations.admin_console import ConsoleAPI
from bridge.operations.admin_limits import LimitsAPI
from bridge.operations.admin_listener import HTTP_LOG, AdminConnections, AdminSite
from bridge.operations.admin_node_calls import NodeCalls
from bridge.operations.admin_openapi import openapi_document
from bridge.operations.admin_requests import (
    API_PREFIX,
    ApiError,
    Route,
    advertised,
    error_response,
    query_params,
    write_token_file,
)
from bridge.operations.admin_topics import TopicsAPI
from bridge.operations.metering import CLIENT, USER
from bridge.operations.node_calls import is_node_call
from bridge.settings import parse_listen

if TYPE_CHECKING:
    from bridge.node import Node
    from bridge.operations.served import Served

log = logging.getLogger("bridge.admin")

TOKEN_FILE = "admin-token"
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_CHALLENGE = 'Bearer realm="mqtt-bridge"'
T = TypeVar("T")


ROUTES: tuple[Route, ...] = (
    Route("GET", "/health", "health", public=True),
    Route("GET", "/ready", "readiness", public=True),
    Route("GET", "/openapi.json", "openapi", public=True),
    Route("GET", "/metrics", "metrics"),
    Route("GET", "/nodes", "nodes"),
    Route("GET", "/connections/count", "connection_count"),
    Route("GET", "/clients", "list_clients", part="clients"),
    Route("GET", "/clients/{clientid:.+}", "get_client", part="clients", node_calls=True),
    Route("DELETE", "/clients/{clientid:.+}", "kick_client", part="clients", node_calls=True),
    Route("GET", "/subscriptions", "list_subscriptions", part="topics"),
    Route("GET", "/retained", "list_retained", part="topics"),
    Route("GET", "/retained/{topic:.*}", "get_retained", part="topics"),
    Route("GET", "/metering/clients/{clientid:.+}", "client_metering"),
    Route("GET", "/metering/users/{username:.+}", "user_metering"),
    Route("POST", "/publish", "publish", part="topics"),
    Route("GET", "/limits", "get_limits", part="limits"),
    Route("PUT", "/limits", "put_limits", part="limits"),
    Route("DELETE", "/limits", "reset_limits", part="limits"),
    Route("GET", "/banned", "list_bans", part="bans"),
    Route("POST", "/banned", "add_ban", part="bans"),
    Route("GET", "/banned/{kind}/{value:.+}", "get_ban", part="bans"),
    Route("DELETE", "/banned/{kind}/{value:.+}", "lift_ban", part="bans"),
    Route("GET", "/stats", "stats", part="console", node_calls=True),
    Route("GET", "/search/clients", "search_clients", part="console", node_calls=True),
    Route("GET", "/search/subscriptions", "search_subscriptions", part="console", node_calls=True),
    Route("GET", "/search/retained", "search_retained", part="console"),
    Route("GET", "/access/users", "users", part="access"),
    Route("GET", "/access/rules", "rules", part="access"),
    Route("GET", "/access/explain", "explain", part="access"),
    Route("GET", "/console", "to_console", public=True, part="console", prefix=""),
    Route("GET", "/console/", "index", public=True, part="console", prefix=""),
    Route("GET", "/console/{file}", "static_file", public=True, part="console", prefix=""),
)


class AdminAPI:
    """The admin HTTP API of one node: owns its aiohttp application, its listener and the HTTP
    client that forwards requests to other nodes. `ready` is what /ready reports (together with
    the node's own state): set once started, cleared when the server begins to shut down."""

    def __init__(self, server: Served) -> None:
        self.server = server
        self.config = server.config
        self.token = self.config.admin_token
        self.ready = False
        self.started = time.time()
        self.advertise = ""
        self._runner: web.AppRunner | None = None
        self._public = {r.prefix + r.path for r in ROUTES if r.public}
        self.admin_connections = AdminConnections(
            self.config.admin_header_timeout, self.config.admin_max_connections
        )
        """The listener's connections: how many, and each one's time to send a request head
        (`bridge.operations.admin_listener`)."""
        self._node_callable: set[web.AbstractRoute] = set()
        """The routes other members call (`Route.node_calls`), as the router matches them."""
        cluster_secrets = read_cluster_secrets(
            self.config.cluster_secret, self.config.cluster_secret_file
        )
        # The node's id as the node takes it (`Node` reads the same), known before the node is.
        self.node_calls = NodeCalls(
            self.config.resolved_node_id(), cluster_secrets, self.config.admin_body_timeout
        )
        if self.config.metrics_public:
            self._public.add(API_PREFIX + "/metrics")
        self.app = web.Application(
            middlewares=[self._errors_and_auth],
            client_max_size=publish_body_limit(self.config.max_packet_size),
        )
        self.clients = ClientsAPI(self)
        self.topics = TopicsAPI(self)
        self.limits = LimitsAPI(self)
        self.bans = BansAPI(self)
        self.console = ConsoleAPI(self)
        self.access = AccessAPI(self)
        for route in ROUTES:
            owner = getattr(self, route.part) if route.part else self
            added = self.app.router.add_route(
                route.method, route.prefix + route.path, getattr(owner, route.handler)
            )
            if route.node_calls:
                self._node_callable.add(added)

    @property
    def node(self) -> Node:
        return self.server.node

    async def start(self) -> None:
        """Listen on `admin_listen` (a token is generated first if none is configured)."""
        if not self.token:
            self.token = secrets.token_urlsafe(32)
            path = Path(self.config.data_dir) / TOKEN_FILE
            write_token_file(path, self.token)
            log.info("admin API token generated into %s (mode 0600)", path)
        host, port = parse_listen(self.config.admin_listen)
        self._runner = web.AppRunner(
            self.app,
            access_log=None,
            shutdown_timeout=2.0,
            keepalive_timeout=self.config.admin_keepalive_timeout,
            logger=HTTP_LOG,
        )
        await self._runner.setup()
        await AdminSite(self._runner, host, port, self.admin_connections).start()
        bound = self._runner.addresses[0][1] if self._runner.addresses else port
        self.advertise = advertised(self.config.admin_listen, bound)
        self.clients.start()
        self.started = time.time()
        self.ready = True
        log.info(
            "admin API on http://%s:%s%s, advertised as %s", host, bound, API_PREFIX, self.advertise
        )

    async def stop(self) -> None:
        """Close the listener (requests under way get a short grace) and the HTTP client."""
        self.ready = False
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.clients.stop()

    # -- errors and authorization ----------------------------------------------------------------

    @web.middleware
    async def _errors_and_auth(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        self.admin_connections.head_received(request.transport)
        try:
            resource = request.match_info.route.resource
            canonical = resource.canonical if resource is not None else None
            if is_node_call(request.headers):
                # Another member's call: its signature, never a token, is what is checked.
                accepted = request.match_info.route in self._node_callable
                await self.node_calls.authenticate(request, accepted)
            elif canonical not in self._public:
                self._authorize(request)
            return await handler(request)
        except ApiError as exc:
            return error_response(exc.status, exc.message, exc.headers)
        except web.HTTPException as exc:
            # aiohttp's own: no such route, method not allowed, body too large.
            return error_response(exc.status, _http_error_message(request, exc), _allow(exc))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("admin API: %s %s failed", request.method, request.path)
            return error_response(500, "internal error (logged by the node)")
        finally:
            self.admin_connections.answered(request.transport)

    def _authorize(self, request: web.Request) -> None:
        header = request.headers.get("Authorization", "")
        if not header:
            raise ApiError(401, "missing bearer token", {"WWW-Authenticate": _CHALLENGE})
        scheme, _, presented = header.partition(" ")
        expected = self.token.encode()
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            presented.strip().encode("utf-8", "replace"), expected
        ):
            raise ApiError(
                401,
                "invalid bearer token",
                {"WWW-Authenticate": f'{_CHALLENGE}, error="invalid_token"'},
            )

    # -- probes, documents, metrics --------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        """The process is up and its event loop answers."""
        query_params(request, ())
        return web.json_response(
            {"status": "ok", "node": self.node.node_id, "version": __version__}
        )

    async def readiness(self, request: web.Request) -> web.Response:
        """Whether the node should get traffic: started, accepting, registry reachable. Anyone
        may ask, so the answer names the component that is down (`"redis": "unavailable"`),
        never its exception: that goes to the node's log."""
        query_params(request, ())
        body: dict[str, Any] = {"status": "ready", "node": self.node.node_id}
        reason = self._not_ready_reason()
        cluster = self.server.cluster
        if cluster is not None and reason is None:
            redis_up = await self._registry_answers(cluster.registry.redis)
            body["redis"] = "ok" if redis_up else "unavailable"
            if not redis_up:
                reason = "the cluster registry (Redis) is unavailable"
        if reason is not None:
            return web.json_response({**body, "status": "not ready", "error": reason}, status=503)
        return web.json_response(body)

    def _not_ready_reason(self) -> str | None:
        if not self.ready:
            return "the node is starting or shutting down"
        if not self.node.accepting:
            return "the node is shutting down (draining)"
        cluster = self.server.cluster
        if cluster is not None and cluster.leaving:
            return "the node is leaving the cluster"
        return None

    async def _registry_answers(self, redis: Any) -> bool:
        """Whether the registry's Redis answers a PING in time; why not is logged."""
        try:
            await asyncio.wait_for(redis.ping(), self.config.redis_timeout)
        except redis_errors(OSError, TimeoutError) as exc:
            log.warning("admin API: /ready: the cluster registry (Redis) did not answer: %r", exc)
            return False
        return True

    async def openapi(self, request: web.Request) -> web.Response:
        query_params(request, ())
        return web.json_response(openapi_document(__version__))

    async def metrics(self, request: web.Request) -> web.Response:
        """The Prometheus exposition (`bridge.operations.prometheus`)."""
        query_params(request, ())
        body = self.server.metrics_text()
        return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})

    # -- metering --------------------------------------------------------------------------------

    async def client_metering(self, request: web.Request) -> web.Response:
        query_params(request, ())
        return await self._metering(CLIENT, request.match_info["clientid"])

    async def user_metering(self, request: web.Request) -> web.Response:
        query_params(request, ())
        return await self._metering(USER, request.match_info["username"])

    async def _metering(self, kind: str, name: str) -> web.Response:
        try:
            counts = await self.node.meter.read(kind, name)
        except redis_errors(OSError) as exc:
            raise ApiError(503, f"metering Redis unavailable: {exc}") from None
        if not counts.pop("found"):
            raise ApiError(404, f"nothing metered for {kind} {name!r}")
        return web.json_response({"kind": kind, "name": name, **counts})

    # -- nodes and counts ------------------------------------------------------------------------

    async def nodes(self, request: web.Request) -> web.Response:
        """This node, or every cluster member with what it publishes in its heartbeat."""
        query_params(request, ())
        cluster = self.server.cluster
        if cluster is None:
            return web.json_response({"clustered": False, "nodes": [self._this_node()]})
        alive, dead = await self.registry_call(cluster.registry.members())
        entries = [self._member(node_id, info, True) for node_id, info in sorted(alive.items())]
        entries += [self._member(node_id, {}, False) for node_id in sorted(dead)]
        return web.json_response({"clustered": True, "nodes": entries})

    def _this_node(self) -> dict[str, Any]:
        return {
            "id": self.node.node_id,
            "self": True,
            "alive": True,
            "role": "bridge",
            "admin": self.advertise,
            "peer": None,
            "connections": len(self.node.connections),
            "started": self.started,
        }

    def _member(self, node_id: str, info: dict[str, Any], alive: bool) -> dict[str, Any]:
        return {
            "id": node_id,
            "self": node_id == self.node.node_id,
            "alive": alive,
            "role": info.get("role"),
            "admin": info.get("admin") or None,
            "peer": info.get("peer"),
            "connections": info.get("connections"),
            "started": info.get("started"),
        }

    async def connection_count(self, request: web.Request) -> web.Response:
        """Connected MQTT clients here and (clustered) on every alive member."""
        query_params(request, ())
        local = len(self.node.connections)
        cluster = self.server.cluster
        if cluster is None:
            return web.json_response({"node": local, "cluster": None})
        alive, _dead = await self.registry_call(cluster.registry.members())
        total = local + sum(
            int(info.get("connections") or 0)
            for node_id, info in alive.items()
            if node_id != self.node.node_id
        )
        return web.json_response({"node": local, "cluster": total})

    async def registry_call(self, call: Coroutine[Any, Any, T]) -> T:
        """A registry (Redis) call, bounded; 503 if Redis does not answer."""
        try:
            return await asyncio.wait_for(call, self.config.redis_timeout)
        except redis_errors(OSError, TimeoutError) as exc:
            raise ApiError(503, f"the cluster registry (Redis) is unavailable: {exc!r}") from None


def _http_error_message(request: web.Request, exc: web.HTTPException) -> str:
    if exc.status == 404:
        return f"no such endpoint: {request.path}"
    if exc.status == 405:
        allowed = exc.headers.get("Allow", "")
        return f"method {request.method} not allowed on {request.path} (allowed: {allowed})"
    text = exc.text or ""
    return text if text and not text.startswith(f"{exc.status}:") else exc.reason


def _allow(exc: web.HTTPException) -> dict[str, str] | None:
    allow = exc.headers.get("Allow")
    return {"Allow": allow} if allow else None
