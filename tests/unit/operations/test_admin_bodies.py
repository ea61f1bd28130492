"""Admin API request bodies (bridge.operations.admin_bodies): the nesting scan and the JSON
parsing, each fault a 400 naming it."""

from __future__ import annotations

import json

import pytest

from bridge.operations.admin_bodies import MAX_DEPTH, json_depth, parse_json
from bridge.operations.admin_requests import ApiError


@pytest.mark.parametrize(
    ("body", "depth"),
    [
        (b"1", 0),
        (b"{}", 1),
        (b'{"a": [1, {"b": []}]}', 4),
        (b'["[[[[", "]]]]"]', 1),
        (b'["\\"[[[", {"k\\\\": "["}]', 2),
        (b'"unterminated [[[[', 0),
    ],
)
def test_depth_counts_brackets_outside_strings_only(body: bytes, depth: int) -> None:
    assert json_depth(body) == depth


def test_depth_stops_counting_past_the_limit() -> None:
    assert json_depth(b"[" * 1_000_000, limit=5) == 6


def test_a_body_at_the_limit_is_decoded_and_one_deeper_is_refused() -> None:
    at_limit = b"[" * MAX_DEPTH + b"]" * MAX_DEPTH
    assert json.dumps(parse_json(at_limit, object_only=False)).count("[") == MAX_DEPTH
    with pytest.raises(ApiError, match=f"nested deeper than {MAX_DEPTH} levels") as caught:
        parse_json(b"[" + at_limit + b"]", object_only=False)
    assert caught.value.status == 400


@pytest.mark.parametrize(
    ("body", "object_only", "message"),
    [
        (b"not json", False, "body is not JSON"),
        (b"", True, "body is not a JSON object"),
        (b"[1]", True, "body is not a JSON object"),
        (b"1" * 5000, False, "body is not JSON"),  # past Python's digit limit: ValueError
    ],
)
def test_bad_bodies_are_400_naming_the_fault(body: bytes, object_only: bool, message: str) -> None:
    with pytest.raises(ApiError, match=message) as caught:
        parse_json(body, object_only=object_only)
    assert caught.value.status == 400
