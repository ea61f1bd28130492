"""Request bodies of the admin API: read within a size and a time limit, parsed as JSON within a
nesting limit. Every fault is an `ApiError` (400, 408 or 413) whose message names it.

`json.loads` recurses once per nesting level: a body of 100,000 `[` raises RecursionError deep
in the decoder (a 500 and a traceback, had it reached the handler). The body is scanned for its
nesting depth first (`json_depth`), in one pass that skips strings whole, and refused past
`MAX_DEPTH` before anything is decoded. No body the API accepts nests more than three levels.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from aiohttp import web

from bridge.operations.admin_requests import ApiError

MAX_DEPTH = 32
"""The deepest nesting of arrays and objects a JSON body may have."""
BODY_ALLOWANCE = 64 * 1024
"""Request bytes allowed beyond the largest (base64-encoded) payload: the JSON around it."""

# A whole string (escapes included), a bracket, or a stray quote (an unterminated string: the
# scan stops there and the decoder reports the body as not JSON).
_TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]|"', re.DOTALL)
_OPENING = frozenset(b"[{")
_CLOSING = frozenset(b"]}")


def publish_body_limit(max_packet_size: int) -> int:
    """The largest POST /publish body: a payload of `max_packet_size` bytes base64-encoded, and
    the JSON around it. No other body the API takes is larger (the listener's limit too)."""
    return 4 * -(-max_packet_size // 3) + BODY_ALLOWANCE


def json_depth(body: bytes, limit: int = MAX_DEPTH) -> int:
    """The nesting depth of the arrays and objects in `body`, counted until it passes `limit`
    (then `limit + 1`); brackets inside strings do not count. Not a validator: a body that is
    not JSON may get any depth, and the decoder refuses it after."""
    depth = deepest = 0
    for token in _TOKENS.finditer(body):
        first = token.group()[0]
        if first in _OPENING:
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        elif first in _CLOSING:
            depth -= 1
        elif len(token.group()) == 1:  # the stray quote
            break
    return deepest


def parse_json(body: bytes, *, object_only: bool) -> Any:
    """The JSON value of a request body; ApiError 400 if it nests deeper than `MAX_DEPTH`, is
    not JSON, or (`object_only`) is not a JSON object."""
    if json_depth(body) > MAX_DEPTH:
        raise ApiError(400, f"request body: JSON nested deeper than {MAX_DEPTH} levels")
    expected = "a JSON object" if object_only else "JSON"
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise ApiError(400, f"body is not {expected}") from None
    if object_only and not isinstance(data, dict):
        raise ApiError(400, f"body is not {expected}")
    return data


async def read_body(request: web.Request, limit: int, timeout: float) -> bytes:
    """The request's body, at most `limit` bytes (413 past it; a declared length past it is
    refused before a byte is read) and sent within `timeout` seconds (408 after)."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise ApiError(413, f"request body: {declared} bytes is over the limit of {limit}")
    try:
        body = await asyncio.wait_for(request.read(), timeout)
    except TimeoutError:
        raise ApiError(408, f"request body: not received within {timeout:g} s") from None
    except web.HTTPRequestEntityTooLarge:
        raise ApiError(413, f"request body: over the limit of {limit} bytes") from None
    if len(body) > limit:
        raise ApiError(413, f"request body: {len(body)} bytes is over the limit of {limit}")
    return body


async def read_json(request: web.Request, limit: int, timeout: float, *, object_only: bool) -> Any:
    """The request's body (`read_body`) as JSON (`parse_json`)."""
    return parse_json(await read_body(request, limit, timeout), object_only=object_only)
