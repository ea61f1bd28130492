"""The operator console (`ConsoleAPI`, the "console" part of `bridge.operations.admin.AdminAPI`):
its static files under /console/ and the API endpoints it needs beyond the node-local ones.

The console is plain HTML, CSS and JavaScript modules (`bridge/operations/console/`), served as
they are: no build step, no library, and only the files the directory held at start-up
(`bridge.operations.console_files`). Its files are public (they hold nothing but code); every
answer with data comes from /api/v1 and needs the admin token, which the page asks for and keeps
in the browser's sessionStorage.

Cluster-wide answers (`/stats`, `/search/clients`, `/search/subscriptions`) ask every member
(`bridge.operations.admin_fanout`): sessions, their subscriptions and the counters live on the
node that holds them, and the registry knows only which node holds a ClientId. Retained messages
are replicated to every node, so `/search/retained` and the retained count are this node's.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from bridge.mqtt.errors import MQTTProtocolError
from bridge.mqtt.topics import parse_shared, topic_matches, validate_topic_name
from bridge.operations.admin_fanout import NodeAnswer, answer_for_every_node
from bridge.operations.admin_requests import (
    AdminHost,
    AdminPart,
    ApiError,
    keyset_page,
    page_limit,
    query_params,
    valid_filter,
)
from bridge.operations.console_files import ConsoleFiles

if TYPE_CHECKING:
    from bridge.session import Session

CONSOLE_DIR = Path(__file__).with_name("console")
# The console's own files only: no inline scripts or styles, no other origin, never framed.
SECURITY_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
}
SEARCH_BY = ("clientid", "username", "address")
DEFAULT_PREVIEW = 256
MAX_PREVIEW = 4096
SUMMED = (
    "connections",
    "sessions",
    "subscriptions",
    "inflight",
    "messages_in",
    "messages_out",
    "bytes_in",
    "bytes_out",
    "store_latency_count",
    "store_latency_sum",
)
"""Per-node figures whose cluster total is their sum (retained messages are replicated: their
total is the largest count any node reports)."""


class ConsoleAPI(AdminPart):
    """The console's static files and its cluster-wide overview and searches."""

    def __init__(self, api: AdminHost, console_dir: Path = CONSOLE_DIR) -> None:
        super().__init__(api)
        self.files = ConsoleFiles(console_dir)

    # -- static files ----------------------------------------------------------------------------

    async def to_console(self, request: web.Request) -> web.Response:
        """/console -> /console/ (relative module paths resolve against the directory)."""
        query_params(request, ())
        return web.Response(status=308, headers={"Location": "/console/"})

    async def index(self, request: web.Request) -> web.Response:
        """The console's page."""
        return self._static("index.html")

    async def static_file(self, request: web.Request) -> web.Response:
        """One of the console's files, looked up by name in the allow-list built at start-up."""
        return self._static(request.match_info["file"])

    def _static(self, name: str) -> web.Response:
        found = self.files.get(name)
        if found is None:
            raise ApiError(404, f"no such console file: {name!r}")
        return web.Response(
            body=found.body,
            content_type=found.content_type,
            charset="utf-8",
            headers=SECURITY_HEADERS,
        )

    # -- overview --------------------------------------------------------------------------------

    async def stats(self, request: web.Request) -> web.Response:
        """Every member's counts and counters, and their cluster totals."""
        query_params(request, ())
        clustered = self.api.server.cluster is not None

        def merge(answers: list[NodeAnswer]) -> dict[str, Any]:
            nodes = [_node_entry(answer, "stats") for answer in answers]
            reporting = [n["stats"] for n in nodes if n["stats"] is not None]
            totals: dict[str, Any] = {key: sum(s[key] for s in reporting) for key in SUMMED}
            totals["retained"] = max((s["retained"] for s in reporting), default=0)
            return {
                "clustered": clustered,
                "time": time.time(),
                "complete": all(n["error"] is None for n in nodes),
                "totals": totals,
                "nodes": nodes,
            }

        return await answer_for_every_node(self.api, request, self._node_stats, merge)

    def _node_stats(self) -> dict[str, Any]:
        node = self.node
        metrics = node.metrics
        return {
            "stats": {
                "connections": node.connected_count(),
                "sessions": node.session_count(),
                "subscriptions": node.subscription_count(),
                "retained": node.retained_count(),
                "inflight": sum(len(s.inflight) for s in node.sessions.values() if s.connected),
                "messages_in": sum(metrics.get(f"messages_in_qos{q}") for q in range(3)),
                "messages_out": sum(metrics.get(f"messages_out_qos{q}") for q in range(3)),
                "bytes_in": metrics.bytes_in,
                "bytes_out": metrics.bytes_out,
                "store_latency_count": metrics.store_latency.count,
                "store_latency_sum": metrics.store_latency.sum,
            }
        }

    # -- searches --------------------------------------------------------------------------------

    async def search_clients(self, request: web.Request) -> web.Response:
        """Clients on every node by ClientId prefix, user name or address (IP[:port] prefix)."""
        params = query_params(request, ("q", "by", "limit"))
        limit = page_limit(params)
        by = params.get("by", "clientid")
        if by not in SEARCH_BY:
            raise ApiError(400, f"by must be one of {', '.join(SEARCH_BY)}, got {by!r}")
        text = params.get("q", "")
        if not text and by != "clientid":
            raise ApiError(400, f"q must not be empty when searching by {by}")

        def local() -> dict[str, Any]:
            return {"items": self._matching_clients(by, text, limit + 1)}

        def merge(answers: list[NodeAnswer]) -> dict[str, Any]:
            return _merged(answers, limit, ("client_id", "node"))

        return await answer_for_every_node(self.api, request, local, merge)

    def _matching_clients(self, by: str, text: str, limit: int) -> list[dict[str, Any]]:
        node = self.node
        found: list[dict[str, Any]] = []
        for client_id in sorted(node.sessions):
            if len(found) == limit:
                break
            conn: Any = node.connections.get(client_id)
            if by == "clientid":
                hit = client_id.startswith(text)
            elif conn is None:
                hit = False  # user name and address belong to a connection
            elif by == "username":
                hit = conn.username == text
            else:
                hit = conn.peer.startswith(text)
            if hit:
                found.append(self._client_row(node.sessions[client_id], conn))
        return found

    def _client_row(self, session: Session, conn: Any) -> dict[str, Any]:
        return {
            "client_id": session.client_id,
            "node": self.node.node_id,
            "connected": conn is not None,
            "username": conn.username if conn is not None else None,
            "peer": conn.peer if conn is not None else None,
            "connected_at": (conn.connected_at or None) if conn is not None else None,
            "persistent": session.persistent,
            "subscriptions": len(session.subscriptions) + len(session.shared),
        }

    async def search_subscriptions(self, request: web.Request) -> web.Response:
        """Who subscribes, on every node: with exactly `filter` (shared subscriptions to it
        included), or with a filter that matches topic name `topic`."""
        params = query_params(request, ("filter", "topic", "limit"))
        limit = page_limit(params)
        if ("filter" in params) == ("topic" in params):
            raise ApiError(400, "give exactly one of filter (who subscribes to it) or topic "
                           "(whose filters match it)")  # fmt: skip
        check = self.node.check_topic_limits
        if "filter" in params:
            wanted = valid_filter(params["filter"], check)

            def selects(plain: str) -> bool:
                return plain == wanted
        else:
            topic = _valid_topic(params["topic"], check)

            def selects(plain: str) -> bool:
                return topic_matches(plain, topic)

        def local() -> dict[str, Any]:
            return {"items": self._matching_subscriptions(selects, limit + 1)}

        def merge(answers: list[NodeAnswer]) -> dict[str, Any]:
            return _merged(answers, limit, ("client_id", "filter", "node"))

        return await answer_for_every_node(self.api, request, local, merge)

    def _matching_subscriptions(
        self, selects: Callable[[str], bool], limit: int
    ) -> list[dict[str, Any]]:
        node = self.node
        found: list[dict[str, Any]] = []
        for client_id in sorted(node.sessions):
            session = node.sessions[client_id]
            for topic_filter, qos in sorted({**session.subscriptions, **session.shared}.items()):
                shared = parse_shared(topic_filter)
                if not selects(shared[1] if shared else topic_filter):
                    continue
                if len(found) == limit:
                    return found
                found.append(
                    {
                        "client_id": client_id,
                        "node": node.node_id,
                        "filter": topic_filter,
                        "qos": qos,
                        "share_group": shared[0] if shared else None,
                        "connected": client_id in node.connections,
                    }
                )
        return found

    async def search_retained(self, request: web.Request) -> web.Response:
        """Retained messages matching `filter` (default `#`) with the first `preview` bytes of
        their payloads, a page at a time."""
        params = query_params(request, ("filter", "limit", "after", "preview"))
        limit = page_limit(params)
        preview = _preview_size(params.get("preview"))
        topic_filter = valid_filter(params.get("filter", "#"), self.node.check_topic_limits)
        retained = self.node.retained
        topics = sorted(t for t in retained if topic_matches(topic_filter, t))
        page, next_after = keyset_page(topics, params.get("after"), limit)
        items = [_retained_preview(retained[topic], preview) for topic in page]
        return web.json_response({"items": items, "next": next_after, "total": len(topics)})


def _node_entry(answer: NodeAnswer, key: str) -> dict[str, Any]:
    body = answer["answer"]
    value = body.get(key) if body is not None else None
    return {
        "id": answer["id"],
        "self": answer["self"],
        "alive": answer["alive"],
        "error": answer["error"],
        key: value,
    }


def _merged(answers: list[NodeAnswer], limit: int, order: tuple[str, ...]) -> dict[str, Any]:
    """Every node's items in one list (sorted by `order`, at most `limit`; each node sends up to
    one more, so `truncated` is known), and which nodes could not be asked."""
    items = [item for a in answers if a["answer"] is not None for item in a["answer"]["items"]]
    items.sort(key=lambda item: tuple(item[k] for k in order))
    errors = [{"node": a["id"], "error": a["error"]} for a in answers if a["error"] is not None]
    return {"items": items[:limit], "truncated": len(items) > limit, "errors": errors}


def _valid_topic(topic: str, check_topic_limits: Callable[[str], str | None]) -> str:
    try:
        validate_topic_name(topic)
    except MQTTProtocolError as exc:
        raise ApiError(400, f"bad topic: {exc.args[-1]}") from None
    limit_error = check_topic_limits(topic)
    if limit_error:
        raise ApiError(400, f"bad topic: {limit_error}")
    return topic


def _preview_size(text: str | None) -> int:
    if text is None:
        return DEFAULT_PREVIEW
    if not (text.isascii() and text.isdigit() and len(text) <= 6) or int(text) > MAX_PREVIEW:
        raise ApiError(400, f"preview must be an integer from 0 to {MAX_PREVIEW}, got {text!r}")
    return int(text)


def _retained_preview(message: Any, size: int) -> dict[str, Any]:
    payload: bytes = message.payload
    head = payload[:size]
    try:
        # A cut may split a UTF-8 character: drop the partial one rather than call it binary.
        text = head.decode("utf-8") if len(head) == len(payload) else _utf8_head(head)
        shown, encoding = text, "utf-8"
    except UnicodeDecodeError:
        shown, encoding = base64.b64encode(head).decode(), "base64"
    return {
        "topic": message.topic,
        "qos": message.qos,
        "size": len(payload),
        "published_at": message.timestamp_ms / 1000 if message.timestamp_ms else None,
        "publisher": message.publisher or None,
        "preview": shown,
        "preview_encoding": encoding,
        "truncated": len(payload) > size,
    }


def _utf8_head(head: bytes) -> str:
    """The text of a cut UTF-8 payload without the character the cut split."""
    try:
        return head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.reason != "unexpected end of data" or exc.start < len(head) - 3:
            raise
        return head[: exc.start].decode("utf-8")
