"""The admin API's subscriptions, retained messages and publishing endpoints (`TopicsAPI`, the
"topics" part of `bridge.operations.admin.AdminAPI`)."""

from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING, Any

from aiohttp import web

from bridge.mqtt.topics import parse_shared, topic_matches
from bridge.operations.admin_bodies import publish_body_limit, read_json
from bridge.operations.admin_requests import (
    AdminPart,
    ApiError,
    decode_cursor,
    encode_cursor,
    keyset_page,
    page_limit,
    parse_publish,
    payload_fields,
    query_params,
    valid_filter,
)
from bridge.storage.base import Message, StoreUnavailable

if TYPE_CHECKING:
    pass

log = logging.getLogger("bridge.admin")


class TopicsAPI(AdminPart):
    """Endpoints on the node's subscriptions, retained messages and publishing."""

    async def list_subscriptions(self, request: web.Request) -> web.Response:
        """The subscriptions of the sessions held here by (client, filter), a page at a time."""
        params = query_params(request, ("limit", "after", "client"))
        limit = page_limit(params)
        after = decode_cursor(params["after"]) if "after" in params else None
        sessions = self.node.sessions
        if "client" in params:
            if params["client"] not in sessions:
                raise ApiError(404, f"unknown client {params['client']!r}")
            client_ids = [params["client"]]
        else:
            client_ids = sorted(sessions)
        start = 0 if after is None else bisect.bisect_left(client_ids, after[0])
        items: list[dict[str, Any]] = []
        more = False
        for client_id in client_ids[start:]:
            session = sessions[client_id]
            for topic_filter, qos in sorted({**session.subscriptions, **session.shared}.items()):
                if after is not None and (client_id, topic_filter) <= after:
                    continue
                if len(items) == limit:
                    more = True
                    break
                shared = parse_shared(topic_filter)
                items.append(
                    {
                        "client_id": client_id,
                        "filter": topic_filter,
                        "qos": qos,
                        "share_group": shared[0] if shared else None,
                    }
                )
            if more:
                break
        last = items[-1] if more else None
        next_after = encode_cursor(last["client_id"], last["filter"]) if last else None
        return web.json_response({"node": self.node.node_id, "items": items, "next": next_after})

    async def list_retained(self, request: web.Request) -> web.Response:
        """Retained topics (optionally those matching `filter`), a page at a time."""
        params = query_params(request, ("limit", "after", "filter"))
        limit = page_limit(params)
        retained = self.node.retained
        topics = sorted(retained)
        if "filter" in params:
            topic_filter = valid_filter(params["filter"], self.node.check_topic_limits)
            topics = [t for t in topics if topic_matches(topic_filter, t)]
        page, next_after = keyset_page(topics, params.get("after"), limit)
        items = [_retained_summary(retained[topic]) for topic in page]
        return web.json_response({"items": items, "next": next_after})

    async def get_retained(self, request: web.Request) -> web.Response:
        """One retained message with its payload."""
        query_params(request, ())
        topic = request.match_info["topic"]
        if not topic:
            raise ApiError(400, "topic missing: GET /retained/{topic}")
        message = self.node.retained.get(topic)
        if message is None:
            raise ApiError(404, f"no retained message on topic {topic!r}")
        return web.json_response({**_retained_summary(message), **payload_fields(message.payload)})

    # -- publishing ------------------------------------------------------------------------------

    async def publish(self, request: web.Request) -> web.Response:
        """Publish as if a client had: routed, stored (answered once durable), maybe retained."""
        query_params(request, ())
        node = self.node
        body = await read_json(
            request,
            publish_body_limit(self.config.max_packet_size),
            self.config.admin_body_timeout,
            object_only=True,
        )
        wanted = parse_publish(body, node.check_topic_limits, self.config.max_packet_size)
        if not node.accepting:
            raise ApiError(503, "the node is shutting down")
        try:
            message = await node.publish_internal(
                wanted.topic, wanted.payload, wanted.qos, wanted.retain, publisher="admin-api"
            )
        except StoreUnavailable as exc:
            raise ApiError(503, f"message not stored: {exc}") from None
        log.info(
            "admin API: published %d bytes to %r (qos %d, retain %s)",
            len(wanted.payload),
            wanted.topic,
            wanted.qos,
            wanted.retain,
        )
        return web.json_response(
            {
                "id": message.key,
                "topic": message.topic,
                "qos": message.qos,
                "retain": message.retain,
                "stored": True,
            }
        )


def _retained_summary(message: Message) -> dict[str, Any]:
    return {
        "topic": message.topic,
        "qos": message.qos,
        "size": len(message.payload),
        "published_at": message.timestamp_ms / 1000 if message.timestamp_ms else None,
        "publisher": message.publisher or None,
    }
