"""The OpenAPI description of the admin API's banned clients (`bridge.operations.admin_bans`),
merged into the document by `bridge.operations.admin_openapi`."""

from __future__ import annotations

from bridge.access.bans import KINDS, MAX_REASON, MAX_SECONDS
from bridge.operations.openapi_schema import (
    LIMIT,
    Schema,
    after,
    error,
    json_body,
    obj,
    operation,
    page,
    param,
    ref,
)

_UNSTORED = error("The ban list could not be changed (Redis or the bans file unavailable).")
_NOT_IN_FORCE = error("No ban of this kind and value is in force.")
_IDENTITY = [
    param("kind", "path", "What the ban names.", {"enum": list(KINDS)}, True),
    param(
        "value",
        "path",
        "The ClientId, user name or address (IP or CIDR network; its '/' may stay unencoded).",
        {"type": "string", "minLength": 1},
        True,
    ),
]

BANS_SCHEMAS: dict[str, Schema] = {
    "BanRequest": {
        "type": "object",
        "additionalProperties": False,
        "description": "Exactly one of clientid, username or address, and seconds.",
        "oneOf": [{"required": [kind]} for kind in KINDS],
        "required": ["seconds"],
        "properties": {
            "clientid": {"type": "string", "minLength": 1},
            "username": {"type": "string", "minLength": 1},
            "address": {
                "type": "string",
                "description": "An IP address or a CIDR network without host bits "
                "(10.0.0.0/8, 2001:db8::/32).",
            },
            "seconds": {
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": MAX_SECONDS,
                "description": "How long the ban holds.",
            },
            "reason": {"type": "string", "maxLength": MAX_REASON},
        },
    },
    "Ban": obj(
        {
            "kind": {"enum": list(KINDS)},
            "value": {"type": "string", "description": "Canonical (an address as 10.1.2.3)."},
            "until": {"type": "number", "description": "Unix time it lapses."},
            "seconds_left": {"type": "number"},
            "created": {"type": "number", "description": "Unix time it was set."},
            "reason": {"type": "string"},
            "by": {"enum": ["admin", "flapping"], "description": "Who set it."},
        }
    ),
    "BanPage": page("Ban", "The `kind:value` to pass as `after`.", with_node=False),
    "BanLifted": obj(
        {"lifted": {"const": True}, "kind": {"enum": list(KINDS)}, "value": {"type": "string"}}
    ),
}

BANS_PATHS: dict[str, dict[str, Schema]] = {
    "/banned": {
        "get": operation(
            "listBans",
            "The bans in force (on every node), by kind and value.",
            {"200": json_body(ref("BanPage"), "One page.")},
            parameters=[
                LIMIT,
                after("The `next` of the previous page."),
                param("kind", "query", "Only bans of this kind.", {"enum": list(KINDS)}, False),
            ],
        ),
        "post": operation(
            "addBan",
            "Ban a ClientId, user name or address on every node: its CONNECTs are refused "
            "(0x8A; 3.1.1: 5) and its connected clients kicked (v5: DISCONNECT 0x98).",
            {
                "200": json_body(ref("Ban"), "Replaced a ban of the same kind and value."),
                "201": json_body(ref("Ban"), "Banned."),
                "400": error(
                    "Not a JSON object, nested deeper than 32 levels, an unknown field, a bad "
                    "address or seconds."
                ),
                "408": error("The body did not arrive within admin_body_timeout."),
                "413": error("The body is larger than 64 KiB."),
                "503": _UNSTORED,
            },
            request_body={
                "required": True,
                "content": {"application/json": {"schema": ref("BanRequest")}},
            },
        ),
    },
    "/banned/{kind}/{value}": {
        "get": operation(
            "getBan",
            "One ban in force.",
            {"200": json_body(ref("Ban"), "The ban."), "404": _NOT_IN_FORCE},
            parameters=_IDENTITY,
        ),
        "delete": operation(
            "liftBan",
            "Lift a ban on every node.",
            {
                "200": json_body(ref("BanLifted"), "Lifted."),
                "404": _NOT_IN_FORCE,
                "503": _UNSTORED,
            },
            parameters=_IDENTITY,
        ),
    },
}
