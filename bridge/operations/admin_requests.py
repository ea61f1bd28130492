"""The admin API's request parsing and small helpers, free of the node: the POST /publish body,
query parameters and keyset pagination, cursors, filters, payload rendering, the token file.

Request bodies are read and decoded in `bridge.operations.admin_bodies`. Everything here raises
`ApiError` (status and message) for bad input; `bridge.operations.admin`
turns it into the JSON answer.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from bridge.mqtt.errors import MQTTProtocolError
from bridge.mqtt.topics import SHARE_PREFIX, validate_topic_filter, validate_topic_name
from bridge.private_files import make_private_dir
from bridge.settings import parse_listen

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from yarl import URL

    from bridge.node import Node
    from bridge.operations.served import Served
    from bridge.settings import Config

API_PREFIX = "/api/v1"
DEFAULT_PAGE = 100
MAX_PAGE = 1000
PUBLISH_FIELDS = ("topic", "payload", "payload_encoding", "qos", "retain")


@dataclass(frozen=True, slots=True)
class Route:
    """One endpoint: method, path under `prefix`, handler name, whether it needs the token
    (`public` ones do not; /metrics depends on `metrics_public`). The handler is a method of
    `AdminAPI` itself, or of the part of it named by `part` (an attribute of `AdminAPI`, e.g.
    "topics" for `bridge.operations.admin_topics.TopicsAPI`). Every route is under `API_PREFIX`
    and described in the OpenAPI document, except the console's static files (prefix "").
    `node_calls`: other members call it (the admin fan-out), so it also accepts a call signed
    with the cluster secret (`bridge.operations.node_calls`) instead of the token."""

    method: str
    path: str
    handler: str
    public: bool = False
    part: str = ""
    prefix: str = API_PREFIX
    node_calls: bool = False


class NodeCallSigner(Protocol):
    """What the admin parts use of this node's node-call credentials
    (`bridge.operations.admin_node_calls.NodeCalls`): whether it can sign, and the headers."""

    @property
    def can_call(self) -> bool:
        """Whether this node has a cluster secret to sign calls with."""
        ...

    def signed_headers(self, method: str, url: URL, target: str) -> dict[str, str]:
        """The headers of a body-less call to node `target` at `url`."""
        ...


class AdminHost(Protocol):
    """What a part of the admin API (a group of endpoints in its own module) reads of the
    `AdminAPI` that serves it."""

    server: Served
    config: Config

    @property
    def node_calls(self) -> NodeCallSigner:
        """This node's node-call credentials."""
        ...

    @property
    def node(self) -> Node: ...

    async def registry_call(self, call: Coroutine[Any, Any, Any]) -> Any:
        """A registry (Redis) call, bounded; `ApiError` 503 if Redis does not answer."""
        ...


class AdminPart:
    """A group of endpoints in its own module (a part of `AdminAPI`), handed the API serving
    it: handlers read the node and the configuration through it."""

    def __init__(self, api: AdminHost) -> None:
        self.api = api
        self.config = api.config

    @property
    def node(self) -> Node:
        return self.api.node


class ApiError(Exception):
    """A request answered with `{"error": message}` and `status` (raised by handlers)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def error_response(status: int, message: str, headers: Any = None) -> web.Response:
    """The one shape of every error the API answers."""
    return web.json_response({"error": message}, status=status, headers=headers)


# -- request parsing (pure) ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PublishRequest:
    """A validated POST /publish body."""

    topic: str
    payload: bytes
    qos: int
    retain: bool


def parse_publish(
    data: Any, check_topic_limits: Callable[[str], str | None], max_payload: int
) -> PublishRequest:
    """Validate a POST /publish body (decoded JSON, `bridge.operations.admin_bodies`) strictly;
    raises ApiError (400, 413 for a payload over `max_payload` bytes) naming the first fault."""
    if not isinstance(data, dict):
        raise ApiError(400, "body is not a JSON object")
    unknown = sorted(set(data) - set(PUBLISH_FIELDS))
    if unknown:
        raise ApiError(400, f"unknown field(s): {', '.join(unknown)}")
    topic = data.get("topic")
    if not isinstance(topic, str) or not topic:
        raise ApiError(400, "topic must be a non-empty string")
    try:
        validate_topic_name(topic)
    except MQTTProtocolError as exc:
        raise ApiError(400, f"bad topic: {exc.args[-1]}") from None
    if topic.startswith("$"):
        raise ApiError(400, "topics starting with '$' are reserved for the broker")
    limit_error = check_topic_limits(topic)
    if limit_error:
        raise ApiError(400, f"bad topic: {limit_error}")
    text = data.get("payload")
    if not isinstance(text, str):
        raise ApiError(400, "payload must be a string")
    encoding = data.get("payload_encoding", "utf-8")
    if encoding == "utf-8":
        try:
            payload = text.encode("utf-8")
        except UnicodeEncodeError:
            raise ApiError(400, "payload is not valid UTF-8 (lone surrogate)") from None
    elif encoding == "base64":
        try:
            payload = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(400, "payload is not valid base64") from None
    else:
        raise ApiError(400, "payload_encoding must be 'utf-8' or 'base64'")
    if len(payload) > max_payload:
        raise ApiError(
            413, f"payload of {len(payload)} bytes exceeds max_packet_size={max_payload}"
        )
    qos = data.get("qos", 0)
    if type(qos) is not int or qos not in (0, 1, 2):
        raise ApiError(400, "qos must be 0, 1 or 2")
    retain = data.get("retain", False)
    if not isinstance(retain, bool):
        raise ApiError(400, "retain must be true or false")
    return PublishRequest(topic, payload, qos, retain)


def query_params(request: web.Request, allowed: tuple[str, ...]) -> dict[str, str]:
    """The query parameters, each at most once; 400 for any not in `allowed`."""
    query = request.query
    unknown = sorted(set(query) - set(allowed))
    if unknown:
        raise ApiError(400, f"unknown query parameter(s): {', '.join(unknown)}")
    params: dict[str, str] = {}
    for name in query:
        values = query.getall(name)
        if len(values) > 1:
            raise ApiError(400, f"query parameter {name!r} given more than once")
        params[name] = values[0]
    return params


def page_limit(params: dict[str, str]) -> int:
    """The `limit` parameter: DEFAULT_PAGE when absent, else 1..MAX_PAGE."""
    text = params.get("limit")
    if text is None:
        return DEFAULT_PAGE
    if not (text.isascii() and text.isdigit() and len(text) <= 6) or not (
        1 <= int(text) <= MAX_PAGE
    ):
        raise ApiError(400, f"limit must be an integer from 1 to {MAX_PAGE}, got {text!r}")
    return int(text)


def keyset_page(keys: list[str], after: str | None, limit: int) -> tuple[list[str], str | None]:
    """The sorted `keys` after `after`, at most `limit` of them, and the key to pass as `after`
    for the next page (None on the last page)."""
    start = 0 if after is None else bisect.bisect_right(keys, after)
    page = keys[start : start + limit]
    return page, page[-1] if start + limit < len(keys) else None


def encode_cursor(client_id: str, topic_filter: str) -> str:
    """An opaque `after` value for the subscriptions listing."""
    raw = json.dumps([client_id, topic_filter], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[str, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        client_id, topic_filter = json.loads(raw)
    except (ValueError, TypeError, binascii.Error):
        raise ApiError(400, "after is not a cursor returned as 'next' by this listing") from None
    if not isinstance(client_id, str) or not isinstance(topic_filter, str):
        raise ApiError(400, "after is not a cursor returned as 'next' by this listing")
    return client_id, topic_filter


def valid_filter(topic_filter: str, check_topic_limits: Callable[[str], str | None]) -> str:
    """A topic filter to match retained topics with (not shared); ApiError 400 if bad."""
    try:
        validate_topic_filter(topic_filter)
    except MQTTProtocolError as exc:
        raise ApiError(400, f"bad filter: {exc.args[-1]}") from None
    if topic_filter.startswith(SHARE_PREFIX):
        raise ApiError(400, "bad filter: a shared subscription filter matches no topic")
    limit_error = check_topic_limits(topic_filter)
    if limit_error:
        raise ApiError(400, f"bad filter: {limit_error}")
    return topic_filter


def payload_fields(payload: bytes) -> dict[str, str]:
    """A payload as JSON: its text if it is UTF-8, else base64."""
    try:
        return {"payload": payload.decode("utf-8"), "payload_encoding": "utf-8"}
    except UnicodeDecodeError:
        return {"payload": base64.b64encode(payload).decode(), "payload_encoding": "base64"}


def advertised(listen: str, port: int) -> str:
    """Where other nodes reach a listener: its host, or this machine's name for a wildcard."""
    host, _ = parse_listen(listen)
    if host in ("", "0.0.0.0", "::"):
        host = socket.gethostname()
    return f"{host}:{port}"


def write_token_file(path: Path, token: str) -> None:
    """Write `token` readable by this user only (mode 0600), replacing any older file whole."""
    make_private_dir(path.parent)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an existing temporary file keeps its mode on O_CREAT
        os.write(fd, f"{token}\n".encode())
    finally:
        os.close(fd)
    os.replace(temporary, path)


# -- the application -----------------------------------------------------------------------------
