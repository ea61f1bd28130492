"""The OpenAPI description of the endpoints the operator console needs beyond the node-local
ones (`bridge.operations.admin_console`, `admin_access`); `admin_openapi` puts them in the
document. The console's static files under /console/ are not API routes and are not described.
"""

from __future__ import annotations

from bridge.operations.openapi_schema import (
    BAD_REQUEST,
    LIMIT,
    REGISTRY_DOWN,
    Schema,
    after,
    error,
    json_body,
    nullable,
    obj,
    operation,
    param,
    ref,
)

_INT = {"type": "integer"}
_STR = {"type": "string"}
_NODE_ERRORS = {
    "type": "array",
    "description": "Members that could not be asked (dead, no admin API, no answer in time).",
    "items": obj({"node": _STR, "error": _STR}),
}


def _search_result(item: str) -> Schema:
    return obj(
        {
            "items": {"type": "array", "items": ref(item)},
            "truncated": {"type": "boolean", "description": "More matched than `limit`."},
            "errors": _NODE_ERRORS,
        }
    )


CONSOLE_SCHEMAS: dict[str, Schema] = {
    "NodeStats": obj(
        {
            "connections": _INT,
            "sessions": _INT,
            "subscriptions": _INT,
            "retained": {**_INT, "description": "Retained messages (replicated to every node)."},
            "inflight": _INT,
            "messages_in": {**_INT, "description": "PUBLISH accepted from clients, since start."},
            "messages_out": {**_INT, "description": "PUBLISH sent to clients, since start."},
            "bytes_in": _INT,
            "bytes_out": _INT,
            "store_latency_count": {**_INT, "description": "QoS 1/2 stores timed."},
            "store_latency_sum": {"type": "number", "description": "Their total, in seconds."},
        }
    ),
    "Stats": obj(
        {
            "clustered": {"type": "boolean"},
            "time": {"type": "number", "description": "Unix time of the answer."},
            "complete": {"type": "boolean", "description": "Every member answered."},
            "totals": {
                "allOf": [ref("NodeStats")],
                "description": "Sums over the members that answered; retained: the largest count.",
            },
            "nodes": {
                "type": "array",
                "items": obj(
                    {
                        "id": _STR,
                        "self": {"type": "boolean"},
                        "alive": {"type": "boolean"},
                        "error": nullable("string"),
                        "stats": {"oneOf": [ref("NodeStats"), {"type": "null"}]},
                    }
                ),
            },
        }
    ),
    "ClientMatch": obj(
        {
            "client_id": _STR,
            "node": _STR,
            "connected": {"type": "boolean"},
            "username": nullable("string"),
            "peer": {**nullable("string"), "description": "IP:port of the connection."},
            "connected_at": {**nullable("number"), "description": "Unix time."},
            "persistent": {"type": "boolean"},
            "subscriptions": {**_INT, "description": "How many."},
        }
    ),
    "ClientSearch": _search_result("ClientMatch"),
    "SubscriptionMatch": obj(
        {
            "client_id": _STR,
            "node": _STR,
            "filter": {**_STR, "description": "As subscribed, $share/... included."},
            "qos": {"type": "integer", "enum": [0, 1, 2]},
            "share_group": nullable("string"),
            "connected": {"type": "boolean"},
        }
    ),
    "SubscriptionSearch": _search_result("SubscriptionMatch"),
    "RetainedPreview": obj(
        {
            "topic": _STR,
            "qos": {"type": "integer", "enum": [0, 1, 2]},
            "size": {**_INT, "description": "Payload bytes."},
            "published_at": nullable("number"),
            "publisher": nullable("string"),
            "preview": {**_STR, "description": "The first `preview` bytes of the payload."},
            "preview_encoding": {"enum": ["utf-8", "base64"]},
            "truncated": {"type": "boolean"},
        }
    ),
    "RetainedPreviewPage": obj(
        {
            "items": {"type": "array", "items": ref("RetainedPreview")},
            "next": {**nullable("string"), "description": "The topic to pass as `after`."},
            "total": {**_INT, "description": "Retained topics matching the filter."},
        }
    ),
    "UserPage": obj(
        {
            "authenticating": {"type": "boolean"},
            "allow_anonymous": {"type": "boolean"},
            "password_file": nullable("string"),
            "redis_users": {**nullable("string"), "description": "The Redis hash of users."},
            "items": {
                "type": "array",
                "items": obj(
                    {
                        "username": _STR,
                        "sources": {"type": "array", "items": {"enum": ["file", "redis"]}},
                        "scram": {"type": "boolean", "description": "Has a SCRAM credential."},
                    }
                ),
            },
            "next": {**nullable("string"), "description": "The user name to pass as `after`."},
        }
    ),
    "AclRule": obj(
        {
            "index": _INT,
            "decision": {"enum": ["allow", "deny"]},
            "who": _STR,
            "action": {"enum": ["publish", "subscribe", "all"]},
            "filter": _STR,
            "source": {**nullable("string"), "description": "file:line or Redis key:line."},
            "text": _STR,
        }
    ),
    "AclRules": obj(
        {
            "enabled": {"type": "boolean", "description": "false: ACL off, all allowed."},
            "acl_file": nullable("string"),
            "redis_rules": {**nullable("string"), "description": "The Redis list of rules."},
            "cache_ttl": {"type": "number"},
            "items": {"type": "array", "items": ref("AclRule")},
        }
    ),
    "AclExplanation": obj(
        {
            "client_id": _STR,
            "username": nullable("string"),
            "action": {"enum": ["publish", "subscribe"]},
            "topic": _STR,
            "checked": {**_STR, "description": "What the ACL checks ($share/group/ removed)."},
            "acl_enabled": {"type": "boolean"},
            "allowed": {"type": "boolean"},
            "deciding_rule": {**nullable("integer"), "description": "Index in steps."},
            "reason": _STR,
            "steps": {
                "type": "array",
                "items": obj(
                    {
                        "index": _INT,
                        "rule": _STR,
                        "source": nullable("string"),
                        "pattern": {**nullable("string"), "description": "%c/%u substituted."},
                        "outcome": _STR,
                    }
                ),
            },
            "may_filter_deliveries": {
                "type": "array",
                "items": _INT,
                "description": "Deny rules that may leave messages out of a granted filter.",
            },
        }
    ),
}


def _query(name: str, description: str, **schema: object) -> Schema:
    return param(name, "query", description, {"type": "string", **schema}, False)


CONSOLE_PATHS: dict[str, dict[str, Schema]] = {
    "/stats": {
        "get": operation(
            "getStats",
            "Counts and counters of every cluster member, and their totals.",
            {"200": json_body(ref("Stats"), "The figures."), "503": REGISTRY_DOWN},
            node_calls=True,
        )
    },
    "/search/clients": {
        "get": operation(
            "searchClients",
            "Clients on every member by ClientId prefix, user name or address prefix.",
            {
                "200": json_body(ref("ClientSearch"), "The matches."),
                "400": BAD_REQUEST,
                "503": REGISTRY_DOWN,
            },
            parameters=[
                _query("q", "What to look for (may be empty for a ClientId prefix)."),
                _query(
                    "by",
                    "clientid (prefix), username, address (IP[:port] prefix).",
                    enum=["clientid", "username", "address"],
                    default="clientid",
                ),
                LIMIT,
            ],
            node_calls=True,
        )
    },
    "/search/subscriptions": {
        "get": operation(
            "searchSubscriptions",
            "Who subscribes, on every member: to exactly `filter`, or to a filter matching "
            "`topic` (give one of them).",
            {
                "200": json_body(ref("SubscriptionSearch"), "The matches."),
                "400": BAD_REQUEST,
                "503": REGISTRY_DOWN,
            },
            parameters=[
                _query("filter", "A topic filter (shared subscriptions to it included)."),
                _query("topic", "A topic name."),
                LIMIT,
            ],
            node_calls=True,
        )
    },
    "/search/retained": {
        "get": operation(
            "searchRetained",
            "Retained messages matching a filter, with a preview of their payloads.",
            {"200": json_body(ref("RetainedPreviewPage"), "One page."), "400": BAD_REQUEST},
            parameters=[
                _query("filter", "A topic filter (default #)."),
                LIMIT,
                after("The `next` of the previous page: the last topic."),
                param(
                    "preview",
                    "query",
                    "Payload bytes shown (default 256).",
                    {"type": "integer", "minimum": 0, "maximum": 4096},
                    False,
                ),
            ],
        )
    },
    "/access/users": {
        "get": operation(
            "listUsers",
            "User names of the password file and the cluster's Redis (never their hashes).",
            {"200": json_body(ref("UserPage"), "One page."), "503": REGISTRY_DOWN},
            parameters=[LIMIT, after("The `next` of the previous page: the last user name.")],
        )
    },
    "/access/rules": {
        "get": operation(
            "listAclRules",
            "The ACL rules in force on this node, in the order they are checked.",
            {"200": json_body(ref("AclRules"), "The rules.")},
        )
    },
    "/access/explain": {
        "get": operation(
            "explainAcl",
            "Whether a client may publish to a topic or subscribe to a filter, and which rule "
            "decides.",
            {
                "200": json_body(ref("AclExplanation"), "The decision and each rule's part."),
                "400": error("A parameter is missing or malformed."),
            },
            parameters=[
                param("clientid", "query", "The ClientId.", {"type": "string"}, True),
                _query("username", "The user name (absent: anonymous)."),
                param(
                    "topic",
                    "query",
                    "A topic name (publish) or filter (subscribe).",
                    {"type": "string"},
                    True,
                ),
                _query("action", "publish (default) or subscribe.", enum=["publish", "subscribe"]),
            ],
        )
    },
}
