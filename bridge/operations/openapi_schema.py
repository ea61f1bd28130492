"""The building blocks of the admin API's OpenAPI 3.1 document: schema and operation helpers
and the parameters and responses many endpoints share. `bridge.operations.admin_openapi` and the
parts' descriptions (`admin_openapi_console`) are written with them."""

from __future__ import annotations

from typing import Any

PREFIX = "/api/v1"

Schema = dict[str, Any]


def ref(name: str) -> Schema:
    """A reference to the component schema `name`."""
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema_type: str) -> Schema:
    """`schema_type` or null."""
    return {"type": [schema_type, "null"]}


def obj(properties: dict[str, Schema], required: list[str] | None = None) -> Schema:
    """An object of `properties`, all required unless `required` names some."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
    }


def json_body(schema: Schema, description: str) -> Schema:
    """A JSON response (or body) of `schema`."""
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def error(description: str) -> Schema:
    """An error response: `{"error": message}`."""
    return json_body(ref("Error"), description)


UNAUTHORIZED = {"$ref": "#/components/responses/Unauthorized"}
NODE_SIGNATURE: Schema = {
    "type": "apiKey",
    "in": "header",
    "name": "X-Bridge-Signature",
    "description": "A call from another cluster member (the admin fan-out), never an "
    "operator's: HMAC-SHA-256, with a key derived from the cluster secret, over the method, the "
    "path and query, the SHA-256 of the body, X-Bridge-Timestamp (Unix seconds, within 30 s), "
    "X-Bridge-Nonce (used once), X-Bridge-Forwarded-By (the calling node) and X-Bridge-Target "
    "(this node). A request carrying any of these headers is judged as a node call only.",
}
"""The security scheme of node-to-node calls (`bridge.operations.node_calls`)."""
BAD_REQUEST = error("Bad input: an unknown or malformed parameter (the message says which).")
REGISTRY_DOWN = error("The cluster registry (Redis) or the owning node cannot be reached.")


def param(name: str, where: str, description: str, schema: Schema, required: bool) -> Schema:
    """A parameter `name` in the path or query."""
    return {
        "name": name,
        "in": where,
        "description": description,
        "required": required,
        "schema": schema,
    }


LIMIT = param(
    "limit",
    "query",
    "Items per page (default 100).",
    {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100},
    False,
)
CLIENT_ID = param(
    "clientid",
    "path",
    "The ClientId, percent-encoded (it may contain '/').",
    {"type": "string", "minLength": 1},
    True,
)


def after(description: str) -> Schema:
    """The `after` query parameter of keyset pagination."""
    return param("after", "query", description, {"type": "string"}, False)


def operation(
    operation_id: str,
    summary: str,
    responses: dict[str, Any],
    *,
    parameters: list[Schema] | None = None,
    public: bool = False,
    node_calls: bool = False,
    request_body: Schema | None = None,
    description: str = "",
) -> Schema:
    """An operation; every one may answer 400 (unknown parameters), and 401 unless public.
    `node_calls`: other cluster members call it too, authenticated by a node signature
    (`NODE_SIGNATURE`) instead of the bearer token."""
    operation: Schema = {"operationId": operation_id, "summary": summary}
    if description:
        operation["description"] = description
    if parameters:
        operation["parameters"] = parameters
    if request_body is not None:
        operation["requestBody"] = request_body
    responses = {**responses}
    responses.setdefault("400", BAD_REQUEST)  # unknown query parameters, everywhere
    if public:
        operation["security"] = []
    else:
        if node_calls:
            operation["security"] = [{"bearer": []}, {"nodeSignature": []}]
        responses = {**responses, "401": UNAUTHORIZED}
    operation["responses"] = responses
    return operation


def page(item: str, next_description: str, with_node: bool = True) -> Schema:
    """A page of `item`s with the `next` cursor (and the answering node)."""
    properties: dict[str, Schema] = {}
    if with_node:
        properties["node"] = {"type": "string"}
    properties["items"] = {"type": "array", "items": ref(item)}
    properties["next"] = {**nullable("string"), "description": next_description}
    return obj(properties)
