"""The OpenAPI 3.1 description of the admin HTTP API (`bridge.operations.admin`), served at
/api/v1/openapi.json.

Kept next to, not inside, the handlers: a test checks that every route of the application is
described here and that nothing else is, so the two cannot drift apart unnoticed.
"""

from __future__ import annotations

from typing import Any

from bridge.operations.admin_openapi_bans import BANS_PATHS, BANS_SCHEMAS
from bridge.operations.admin_openapi_console import CONSOLE_PATHS, CONSOLE_SCHEMAS
from bridge.operations.admin_openapi_limits import LIMITS_PATHS, LIMITS_SCHEMAS
from bridge.operations.openapi_schema import (
    BAD_REQUEST,
    CLIENT_ID,
    LIMIT,
    NODE_SIGNATURE,
    PREFIX,
    REGISTRY_DOWN,
    Schema,
)
from bridge.operations.openapi_schema import after as _after
from bridge.operations.openapi_schema import error as _error
from bridge.operations.openapi_schema import json_body as _json
from bridge.operations.openapi_schema import nullable as _nullable
from bridge.operations.openapi_schema import obj as _object
from bridge.operations.openapi_schema import operation as _operation
from bridge.operations.openapi_schema import page as _page
from bridge.operations.openapi_schema import param as _param
from bridge.operations.openapi_schema import ref as _ref

SCHEMAS: dict[str, Schema] = {
    "Error": _object({"error": {"type": "string", "description": "What went wrong."}}),
    "Health": _object(
        {"status": {"const": "ok"}, "node": {"type": "string"}, "version": {"type": "string"}}
    ),
    "Readiness": _object(
        {
            "status": {"enum": ["ready", "not ready"]},
            "node": {"type": "string"},
            "error": {"type": "string", "description": "Why the node is not ready."},
            "redis": {
                "enum": ["ok", "unavailable"],
                "description": "A cluster member's registry (Redis), when the node is otherwise "
                "ready; why it is unavailable is in the node's log, not here.",
            },
        },
        ["status", "node"],
    ),
    "Node": _object(
        {
            "id": {"type": "string"},
            "self": {"type": "boolean", "description": "The node that answered."},
            "alive": {"type": "boolean"},
            "role": {**_nullable("string"), "description": "bridge or notify"},
            "admin": {**_nullable("string"), "description": "Its admin API, HOST:PORT."},
            "peer": {**_nullable("string"), "description": "Its peer-link address."},
            "connections": {**_nullable("integer"), "description": "Connected MQTT clients."},
            "started": {**_nullable("number"), "description": "Unix time it started."},
        }
    ),
    "NodeList": _object(
        {"clustered": {"type": "boolean"}, "nodes": {"type": "array", "items": _ref("Node")}}
    ),
    "Metering": _object(
        {
            "kind": {"type": "string", "enum": ["client", "user"]},
            "name": {"type": "string"},
            "source": {
                "type": "string",
                "enum": ["redis", "node"],
                "description": "redis: cluster-wide totals (plus this node's unflushed counts); "
                "node: this node's totals since it started (no metering Redis).",
            },
            "msgs_in": {"type": "integer"},
            "bytes_in": {"type": "integer", "description": "Payload bytes."},
            "msgs_out": {"type": "integer"},
            "bytes_out": {"type": "integer", "description": "Payload bytes."},
            "unflushed": {"type": "object", "additionalProperties": {"type": "integer"}},
        }
    ),
    "ConnectionCount": _object(
        {
            "node": {"type": "integer", "description": "Connected MQTT clients on this node."},
            "cluster": {
                **_nullable("integer"),
                "description": "On every alive member, from their heartbeats (null: no cluster).",
            },
        }
    ),
    "Client": _object(
        {
            "client_id": {"type": "string"},
            "node": {"type": "string", "description": "The node holding the session."},
            "connected": {"type": "boolean"},
            "peer": {**_nullable("string"), "description": "IP:port of the connection."},
            "ip": _nullable("string"),
            "connected_at": {**_nullable("number"), "description": "Unix time."},
            "disconnected_at": {**_nullable("number"), "description": "Unix time (offline)."},
            "username": _nullable("string"),
            "protocol": {**_nullable("string"), "description": "e.g. MQTT 3.1.1"},
            "keepalive": {**_nullable("integer"), "description": "Granted, in seconds."},
            "clean_session": {"type": "boolean"},
            "persistent": {"type": "boolean"},
            "subscriptions": {
                "type": "object",
                "additionalProperties": {"type": "integer", "enum": [0, 1, 2]},
                "description": "Filter (shared ones as $share/group/filter) -> granted QoS.",
            },
            "inflight": {"type": "integer", "description": "Sent, not yet acknowledged."},
            "queued": {"type": "integer", "description": "Stored, waiting to be sent."},
            "dropped_queue_full": {"type": "integer"},
            "dropped_retention": {"type": "integer"},
        }
    ),
    "ClientSummary": _object(
        {
            "client_id": {"type": "string"},
            "connected": {"type": "boolean"},
            "peer": _nullable("string"),
            "persistent": {"type": "boolean"},
            "subscriptions": {"type": "integer", "description": "How many."},
            "inflight": {"type": "integer"},
            "queued": {"type": "integer"},
        }
    ),
    "ClientPage": _page("ClientSummary", "The ClientId to pass as `after` (null: last page)."),
    "Kicked": _object(
        {"kicked": {"const": True}, "client_id": {"type": "string"}, "node": {"type": "string"}}
    ),
    "Subscription": _object(
        {
            "client_id": {"type": "string"},
            "filter": {"type": "string", "description": "As subscribed, $share/... included."},
            "qos": {"type": "integer", "enum": [0, 1, 2]},
            "share_group": _nullable("string"),
        }
    ),
    "SubscriptionPage": _page("Subscription", "An opaque cursor to pass as `after`."),
    "RetainedSummary": _object(
        {
            "topic": {"type": "string"},
            "qos": {"type": "integer", "enum": [0, 1, 2]},
            "size": {"type": "integer", "description": "Payload bytes."},
            "published_at": {**_nullable("number"), "description": "Unix time."},
            "publisher": _nullable("string"),
        }
    ),
    "RetainedPage": _page("RetainedSummary", "The topic to pass as `after`.", with_node=False),
    "RetainedMessage": {
        "allOf": [
            _ref("RetainedSummary"),
            _object(
                {
                    "payload": {"type": "string"},
                    "payload_encoding": {"enum": ["utf-8", "base64"]},
                }
            ),
        ]
    },
    "PublishRequest": {
        "type": "object",
        "additionalProperties": False,
        "required": ["topic", "payload"],
        "properties": {
            "topic": {
                "type": "string",
                "minLength": 1,
                "description": "A topic name: no wildcards, not starting with '$'.",
            },
            "payload": {"type": "string"},
            "payload_encoding": {"enum": ["utf-8", "base64"], "default": "utf-8"},
            "qos": {"type": "integer", "enum": [0, 1, 2], "default": 0},
            "retain": {"type": "boolean", "default": False},
        },
    },
    "PublishResult": _object(
        {
            "id": {"type": "string", "description": "The message key."},
            "topic": {"type": "string"},
            "qos": {"type": "integer"},
            "retain": {"type": "boolean"},
            "stored": {"const": True},
        }
    ),
    **BANS_SCHEMAS,
    **LIMITS_SCHEMAS,
}

PATHS: dict[str, dict[str, Schema]] = {
    "/health": {
        "get": _operation(
            "health",
            "Liveness: the process is up.",
            {"200": _json(_ref("Health"), "Up.")},
            public=True,
        )
    },
    "/ready": {
        "get": _operation(
            "ready",
            "Readiness: started, accepting clients and (clustered) the registry reachable.",
            {
                "200": _json(_ref("Readiness"), "Ready for traffic."),
                "503": _json(_ref("Readiness"), "Not ready (starting, draining, Redis down)."),
            },
            public=True,
        )
    },
    "/openapi.json": {
        "get": _operation(
            "openapi",
            "This document.",
            {"200": _json({"type": "object"}, "The OpenAPI 3.1 document.")},
            public=True,
        )
    },
    "/metrics": {
        "get": _operation(
            "metrics",
            "Prometheus metrics (text exposition format).",
            {
                "200": {
                    "description": "The metrics.",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                },
                "404": _error("This node has no metrics exposition."),
            },
            description="Needs the token unless the node runs with metrics_public=true.",
        )
    },
    "/nodes": {
        "get": _operation(
            "listNodes",
            "This node, or every cluster member with what its heartbeat publishes.",
            {"200": _json(_ref("NodeList"), "The nodes."), "503": REGISTRY_DOWN},
        )
    },
    "/connections/count": {
        "get": _operation(
            "countConnections",
            "Connected MQTT clients on this node and in the cluster.",
            {"200": _json(_ref("ConnectionCount"), "The counts."), "503": REGISTRY_DOWN},
        )
    },
    "/clients": {
        "get": _operation(
            "listClients",
            "The sessions held on this node, by ClientId (keyset pagination).",
            {"200": _json(_ref("ClientPage"), "One page."), "400": BAD_REQUEST},
            parameters=[LIMIT, _after("The `next` of the previous page: the last ClientId.")],
        )
    },
    "/clients/{clientid}": {
        "get": _operation(
            "getClient",
            "A client's session and connection (forwarded to the node that holds it).",
            {
                "200": _json(_ref("Client"), "The client."),
                "404": _error("No node knows this client."),
                "503": REGISTRY_DOWN,
            },
            parameters=[CLIENT_ID],
            node_calls=True,
        ),
        "delete": _operation(
            "kickClient",
            "Close the client's connection as a network failure would: its will is published, "
            "a persistent session stays (forwarded to the node that holds it).",
            {
                "200": _json(_ref("Kicked"), "Kicked."),
                "404": _error("No node knows this client."),
                "409": _error("The client has a session but is not connected."),
                "503": REGISTRY_DOWN,
            },
            parameters=[CLIENT_ID],
            node_calls=True,
        ),
    },
    "/subscriptions": {
        "get": _operation(
            "listSubscriptions",
            "The subscriptions of the sessions held on this node, by (client, filter).",
            {
                "200": _json(_ref("SubscriptionPage"), "One page."),
                "400": BAD_REQUEST,
                "404": _error("`client` is not known on this node."),
            },
            parameters=[
                LIMIT,
                _after("The `next` of the previous page (an opaque cursor)."),
                _param("client", "query", "Only this ClientId's.", {"type": "string"}, False),
            ],
        )
    },
    "/retained": {
        "get": _operation(
            "listRetained",
            "Retained messages (without payloads), by topic.",
            {"200": _json(_ref("RetainedPage"), "One page."), "400": BAD_REQUEST},
            parameters=[
                LIMIT,
                _after("The `next` of the previous page: the last topic."),
                _param(
                    "filter",
                    "query",
                    "Only topics this MQTT topic filter matches (+ and # wildcards).",
                    {"type": "string"},
                    False,
                ),
            ],
        )
    },
    "/retained/{topic}": {
        "get": _operation(
            "getRetained",
            "One retained message with its payload.",
            {
                "200": _json(_ref("RetainedMessage"), "The message."),
                "400": BAD_REQUEST,
                "404": _error("No retained message on this topic."),
            },
            parameters=[
                _param(
                    "topic",
                    "path",
                    "The topic; its '/' may stay unencoded.",
                    {"type": "string"},
                    True,
                )
            ],
        )
    },
    "/metering/clients/{clientid}": {
        "get": _operation(
            "getClientMetering",
            "Messages and payload bytes in and out of one ClientId, for billing.",
            {
                "200": _json(_ref("Metering"), "The counters."),
                "404": _error("Nothing metered for this ClientId."),
                "503": _error("The metering Redis cannot be reached."),
            },
            parameters=[CLIENT_ID],
        )
    },
    "/metering/users/{username}": {
        "get": _operation(
            "getUserMetering",
            "Messages and payload bytes in and out of every client of one user name.",
            {
                "200": _json(_ref("Metering"), "The counters."),
                "404": _error("Nothing metered for this user name."),
                "503": _error("The metering Redis cannot be reached."),
            },
            parameters=[_param("username", "path", "The user name.", {"type": "string"}, True)],
        )
    },
    "/publish": {
        "post": _operation(
            "publish",
            "Publish a message as a client would; answered once it is stored.",
            {
                "200": _json(_ref("PublishResult"), "Stored and routed."),
                "400": _error(
                    "Not a JSON object, nested deeper than 32 levels, an unknown field or a bad "
                    "value."
                ),
                "408": _error("The body did not arrive within admin_body_timeout."),
                "413": _error("The payload or the body is larger than max_packet_size allows."),
                "503": _error("The store is unavailable or the node is shutting down."),
            },
            request_body={
                "required": True,
                "content": {"application/json": {"schema": _ref("PublishRequest")}},
            },
        )
    },
    **BANS_PATHS,
    **LIMITS_PATHS,
}


def openapi_document(version: str) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the admin API."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "MQTT-Bridge admin API",
            "version": version,
            "description": "Inspect and operate one bridge node (and, through it, its cluster). "
            "Every error is a JSON object with an `error` message.",
        },
        "paths": {
            PREFIX + path: operations for path, operations in {**PATHS, **CONSOLE_PATHS}.items()
        },
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "nodeSignature": NODE_SIGNATURE,
            },
            "responses": {
                "Unauthorized": {
                    "description": "Missing or wrong bearer token, or a refused node call "
                    "(the message names the fault).",
                    "headers": {
                        "WWW-Authenticate": {"schema": {"type": "string"}, "required": True}
                    },
                    "content": {"application/json": {"schema": _ref("Error")}},
                }
            },
            "schemas": {**SCHEMAS, **CONSOLE_SCHEMAS},
        },
        "security": [{"bearer": []}],
    }
