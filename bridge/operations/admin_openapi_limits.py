"""The OpenAPI description of the admin API's limits (`bridge.operations.admin_limits`), merged
into the document by `bridge.operations.admin_openapi`."""

from __future__ import annotations

from bridge.access.ratelimit import MAX_CONNECTIONS, MAX_RATE, MAX_WAIT
from bridge.operations.openapi_schema import Schema, error, json_body, obj, operation, ref

_LIMIT_PROPERTIES: dict[str, Schema] = {
    "max_connections": {
        "type": "integer",
        "minimum": 0,
        "maximum": MAX_CONNECTIONS,
        "description": "Client sockets a node holds (0: unlimited); beyond: CONNACK 0x97 / 3.",
    },
    "connection_rate": {
        "type": "number",
        "minimum": 0,
        "maximum": MAX_RATE,
        "description": "New connections a second a node takes (0: unlimited); more wait.",
    },
    "connection_rate_wait": {
        "type": "number",
        "minimum": 0,
        "maximum": MAX_WAIT,
        "description": "Seconds a CONNECT may wait for its turn; later: CONNACK 0x9F / 3.",
    },
    "client_publish_rate": {
        "type": "number",
        "minimum": 0,
        "maximum": MAX_RATE,
        "description": "PUBLISH packets a second one client may send (0: unlimited); a faster "
        "client is read later, nothing is dropped.",
    },
    "client_publish_bytes_rate": {
        "type": "integer",
        "minimum": 0,
        "maximum": MAX_RATE,
        "description": "Bytes a second one client may send (0: unlimited); a faster client is "
        "read later, nothing is dropped.",
    },
}

LIMITS_SCHEMAS: dict[str, Schema] = {
    "Limits": obj(_LIMIT_PROPERTIES),
    "LimitsState": obj(
        {
            "scope": {
                "enum": ["cluster", "node"],
                "description": "cluster: overrides are kept in Redis and apply on every node; "
                "node: kept in data_dir/limits.json.",
            },
            "limits": {**ref("Limits"), "description": "In force now."},
            "defaults": {**ref("Limits"), "description": "From the configuration."},
            "overrides": {
                "type": "object",
                "additionalProperties": {"type": "number"},
                "description": "Set through this API, in place of the defaults.",
            },
        }
    ),
    "LimitsChange": {
        "type": "object",
        "additionalProperties": False,
        "minProperties": 1,
        "description": "The limits to change; null sets one back to its configured default.",
        "properties": {
            name: {"oneOf": [schema, {"type": "null"}]}
            for name, schema in _LIMIT_PROPERTIES.items()
        },
    },
}

_STATE = json_body(ref("LimitsState"), "The limits now.")
_UNSTORED = error("Not changed: the cluster's Redis or data_dir cannot be written.")

LIMITS_PATHS: dict[str, dict[str, Schema]] = {
    "/limits": {
        "get": operation("getLimits", "The connection and rate limits in force.", {"200": _STATE}),
        "put": operation(
            "setLimits",
            "Change the named limits, on every node of a cluster at once; they survive "
            "restarts of the nodes and of Redis.",
            {
                "200": _STATE,
                "400": error(
                    "Not JSON, nested deeper than 32 levels, an unknown limit or a value that "
                    "breaks its rules."
                ),
                "408": error("The body did not arrive within admin_body_timeout."),
                "413": error("The body is larger than 64 KiB."),
                "503": _UNSTORED,
            },
            request_body={
                "required": True,
                "content": {"application/json": {"schema": ref("LimitsChange")}},
            },
        ),
        "delete": operation(
            "resetLimits",
            "Drop every override: the configured limits apply again.",
            {"200": _STATE, "503": _UNSTORED},
        ),
    }
}
