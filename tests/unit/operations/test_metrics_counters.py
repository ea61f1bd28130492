"""The node's counters: the hot ones are native ints, read like every other counter; every
counter the code moves is exported under its name with a help text."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from bridge.counters import HOT_COUNTERS, Metrics
from bridge.operations import prometheus
from bridge.operations.prometheus import DROP_REASONS, NODE_COUNTERS

names = st.sampled_from([*HOT_COUNTERS, "dropped_no_subscriber", "acl_denied_publish"])


@given(st.lists(st.tuples(names, st.integers(min_value=0, max_value=10**12)), max_size=40))
def test_every_counter_reads_back_what_was_added_whether_hot_or_not(adds):
    metrics = Metrics()
    expected: dict[str, int] = {}
    for name, amount in adds:
        metrics.inc(name, amount)
        expected[name] = expected.get(name, 0) + amount
    snapshot = metrics.snapshot()
    for name in {*HOT_COUNTERS, *expected}:
        assert metrics.get(name) == expected.get(name, 0)
        assert snapshot.get(name, 0) == expected.get(name, 0)
    assert set(HOT_COUNTERS) <= set(snapshot), "the hot counters are always reported"


def test_a_publish_is_counted_under_its_qos():
    metrics = Metrics()
    for qos in (0, 1, 1, 2, 2, 2):
        metrics.received(qos)
    assert [metrics.get(f"messages_in_qos{q}") for q in range(3)] == [1, 2, 3]
    metrics.messages_out_qos1 += 5
    metrics.bytes_out += 7
    assert metrics.snapshot()["messages_out_qos1"] == 5
    assert metrics.get("bytes_out") == 7
    assert "bytes_out" not in metrics._named, "a hot counter lives outside the dict"


REPO = Path(__file__).resolve().parents[3]
COUNTING_CALLS = {"inc": 0, "count": 0, "_refuse": 2, "_refuse_or_close": 2}
"""Calls that move a counter named by a string, and the position of the name: the node's
`metrics.inc`, the rooms handed it as `count`, the inbound refusals' counter argument."""


def counted_names() -> set[str]:
    """Every counter name the code moves by a literal string."""
    names = set()
    for path in [*(REPO / "bridge").rglob("*.py"), *(REPO / "notify").rglob("*.py")]:
        for call in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(call, ast.Call):
                continue
            func = call.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            position = COUNTING_CALLS.get(called)
            if position is None or len(call.args) <= position:
                continue
            arg = call.args[position]
            value = arg.value if isinstance(arg, ast.Constant) else None
            if isinstance(value, str) and re.fullmatch(r"[a-z][a-z0-9_]*", value):
                names.add(value)
    return names


def test_every_counter_the_code_moves_is_exported_by_name_from_the_start():
    exported = {*NODE_COUNTERS, *prometheus._SPECIAL, *DROP_REASONS, *HOT_COUNTERS}
    names = counted_names()

    assert {"publishers_slowed", "connections_refused", "banned_kicks"} <= names
    missing = sorted(names - exported)
    assert not missing, f"counters with no help text, exported only once they move: {missing}"
    assert not set(NODE_COUNTERS) & (prometheus._SPECIAL | set(DROP_REASONS)), "exported twice"
