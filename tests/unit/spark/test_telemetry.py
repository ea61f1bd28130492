"""The telemetry schema (spark.telemetry.validate), the simulated Device and its malformed
payloads: what docs/telemetry.md promises, checked on byte literals and on long device runs."""

from __future__ import annotations

import json
import random
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark.telemetry import (
    FAULT_CODES,
    FIELDS,
    MALFORMATIONS,
    STATES,
    TS_MAX,
    TS_MIN,
    WARNING_CODES,
    Device,
    encode,
    line_scrap_fraction,
    malformed_payload,
    telemetry_topic,
    validate,
)

EXAMPLE = (
    b'{"v":1,"device":"L1-D03","line":"L1","station":"S3","seq":42,"ts":1763798400000,'
    b'"state":"RUNNING","good":3,"bad":0,"alarms":[]}'
)
START_MS = 1_763_798_400_000


def example(**changes: Any) -> dict[str, Any]:
    return {**json.loads(EXAMPLE), **changes}


def run_device(seed: int = 1, steps: int = 3000, interval_s: float = 5.0) -> list[dict[str, Any]]:
    device = Device("L2", "S4", "L2-D09", seed, START_MS, interval_s)
    return [message for _ in range(steps) for message in device.step()]


# --- validate: valid payloads ------------------------------------------------------------------


def test_the_documented_example_is_valid() -> None:
    record, reason = validate(EXAMPLE)
    assert reason is None
    assert record == json.loads(EXAMPLE)
    assert list(record) == list(FIELDS)


def test_extra_fields_are_ignored_and_left_out_of_the_record() -> None:
    record, reason = validate(encode(example(firmware="2.1", temperature=41.5)))
    assert reason is None
    assert record == json.loads(EXAMPLE)


@pytest.mark.parametrize(
    "changes",
    [
        {"ts": TS_MIN},
        {"ts": TS_MAX - 1},
        {"seq": 2**63 - 1, "good": 2**63 - 1, "bad": 0},
        {"device": "d" * 64, "line": "ü" * 64, "station": "工" * 64},
        {"alarms": ["E101", "W" * 32, "E101"]},
        {"state": "SETUP"},
    ],
)
def test_values_at_the_edges_of_their_ranges_are_valid(changes: dict[str, Any]) -> None:
    assert validate(encode(example(**changes))) == (example(**changes), None)


def test_memoryview_and_bytearray_are_accepted() -> None:
    assert validate(bytearray(EXAMPLE))[1] is None
    assert validate(memoryview(EXAMPLE))[1] is None


def test_topic_layout() -> None:
    assert telemetry_topic("L2", "L2-D07") == "factory/L2/L2-D07/telemetry"


# --- validate: malformed payloads --------------------------------------------------------------


def with_raw(name: str, raw_json: str) -> bytes:
    """The example with one field's JSON text replaced verbatim."""
    fields = {key: json.dumps(value) for key, value in json.loads(EXAMPLE).items()}
    fields[name] = raw_json
    return ("{" + ",".join(f'"{key}":{value}' for key, value in fields.items()) + "}").encode()


REJECTED = [
    (b"\xff\xfe{}", "not UTF-8"),
    (EXAMPLE[:40] + b"\xc3" + EXAMPLE[40:], "not UTF-8"),
    (b"", "not JSON"),
    (EXAMPLE[:-1], "not JSON"),
    (b"{'v': 1}", "not JSON"),
    (with_raw("good", "NaN"), "not JSON"),
    (with_raw("good", "Infinity"), "not JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
    (b"[" + EXAMPLE + b"]", "not a JSON object"),
    (b"null", "not a JSON object"),
    (b"42", "not a JSON object"),
    (b'"RUNNING"', "not a JSON object"),
    (b"true", "not a JSON object"),
    (with_raw("v", '"1"'), "field 'v' must be an integer"),
    (with_raw("v", "1.0"), "field 'v' must be an integer"),
    (with_raw("v", "true"), "field 'v' must be an integer"),
    (with_raw("v", "2"), "unsupported version 2"),
    (with_raw("v", "0"), "unsupported version 0"),
    (with_raw("device", '""'), "field 'device' must be a string of 1-64 characters"),
    (
        with_raw("device", '"' + "d" * 65 + '"'),
        "field 'device' must be a string of 1-64 characters",
    ),
    (with_raw("device", "7"), "field 'device' must be a string of 1-64 characters"),
    (with_raw("device", '"\\ud800"'), "field 'device' must be a string of 1-64 characters"),
    (with_raw("line", "null"), "field 'line' must be a string of 1-64 characters"),
    (with_raw("station", '["S3"]'), "field 'station' must be a string of 1-64 characters"),
    (with_raw("seq", "-1"), "field 'seq' must be a non-negative integer"),
    (with_raw("seq", "true"), "field 'seq' must be a non-negative integer"),
    (with_raw("seq", "4.0"), "field 'seq' must be a non-negative integer"),
    (with_raw("seq", "4e1"), "field 'seq' must be a non-negative integer"),
    (with_raw("seq", '"42"'), "field 'seq' must be a non-negative integer"),
    (with_raw("seq", str(2**63)), "field 'seq' out of range"),
    (with_raw("seq", "9" * 5000), "field 'seq' out of range"),
    (with_raw("ts", str(TS_MIN - 1)), "field 'ts' out of range"),
    (with_raw("ts", str(TS_MAX)), "field 'ts' out of range"),
    (with_raw("ts", "1763798400"), "field 'ts' out of range"),
    (with_raw("ts", '"2025-11-22T08:00:00Z"'), "field 'ts' must be an integer"),
    (with_raw("ts", "false"), "field 'ts' must be an integer"),
    (with_raw("state", '"FOO"'), "unknown state 'FOO'"),
    (with_raw("state", '"running"'), "unknown state 'running'"),
    (with_raw("state", '"' + "X" * 500 + '"'), "unknown state '" + "X" * 24 + "...'"),
    (with_raw("state", "3"), "field 'state' must be a string"),
    (with_raw("good", "-3"), "field 'good' must be a non-negative integer"),
    (with_raw("good", "null"), "field 'good' must be a non-negative integer"),
    (with_raw("bad", "true"), "field 'bad' must be a non-negative integer"),
    (with_raw("bad", str(2**64)), "field 'bad' out of range"),
    (with_raw("alarms", '"E101"'), "field 'alarms' must be an array"),
    (with_raw("alarms", "{}"), "field 'alarms' must be an array"),
    (with_raw("alarms", '["E101", ""]'), "alarm 1 must be a string of 1-32 characters"),
    (with_raw("alarms", '["' + "E" * 33 + '"]'), "alarm 0 must be a string of 1-32 characters"),
    (with_raw("alarms", "[101]"), "alarm 0 must be a string of 1-32 characters"),
]


@pytest.mark.parametrize(("payload", "reason"), REJECTED)
def test_malformed_payloads_are_rejected_with_the_reason(payload: bytes, reason: str) -> None:
    assert validate(payload) == (None, reason)


@pytest.mark.parametrize("name", FIELDS)
def test_each_missing_field_is_named(name: str) -> None:
    message = example()
    del message[name]
    assert validate(encode(message)) == (None, f"missing field {name!r}")


def test_the_first_problem_in_field_order_is_reported() -> None:
    assert validate(encode(example(seq=-1, state="FOO"))) == (
        None,
        "field 'seq' must be a non-negative integer",
    )
    without_alarms = example(v=2)
    del without_alarms["alarms"]
    assert validate(encode(without_alarms)) == (None, "missing field 'alarms'")


# --- validate never raises -------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


def check_result(result: tuple[dict[str, Any] | None, str | None]) -> None:
    record, reason = result
    assert (record is None) != (reason is None)
    if reason is not None:
        assert isinstance(reason, str) and reason and "\n" not in reason and len(reason) < 100


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_validate_never_raises_on_arbitrary_bytes(payload: bytes) -> None:
    check_result(validate(payload))


@settings(max_examples=500, deadline=None)
@given(JSON_VALUES)
def test_validate_never_raises_on_arbitrary_json(value: Any) -> None:
    check_result(validate(json.dumps(value).encode()))


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(FIELDS), JSON_VALUES)
def test_validate_never_raises_on_the_example_with_one_field_replaced(
    name: str, value: Any
) -> None:
    payload = encode(example(**{name: value}))
    check_result(validate(payload))
    record, _ = validate(payload)
    if record is not None:
        assert record == example(**{name: value})


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=1, max_size=40), st.integers(min_value=0, max_value=len(EXAMPLE)))
def test_validate_never_raises_on_corrupted_examples(noise: bytes, at: int) -> None:
    check_result(validate(EXAMPLE[:at] + noise + EXAMPLE[at:]))


# --- the simulated device ----------------------------------------------------------------------


def test_every_message_of_a_device_is_valid() -> None:
    for message in run_device():
        assert validate(encode(message)) == (message, None)


def test_same_seed_same_messages_other_seed_other_messages() -> None:
    assert run_device(seed=7) == run_device(seed=7)
    assert run_device(seed=7) != run_device(seed=8)


def test_seq_counts_from_zero_and_ts_never_decreases() -> None:
    messages = run_device()
    assert [m["seq"] for m in messages] == list(range(len(messages)))
    assert messages[0]["ts"] == START_MS
    assert all(a["ts"] <= b["ts"] for a, b in pairwise(messages))


@pytest.mark.parametrize("interval_s", [0.5, 5.0, 30.0])
def test_a_message_on_every_change_and_otherwise_every_interval(interval_s: float) -> None:
    messages = run_device(interval_s=interval_s)
    interval_ms = round(interval_s * 1000)
    for previous, message in pairwise(messages):
        gap = message["ts"] - previous["ts"]
        assert 0 < gap <= interval_ms
        changed = (previous["state"], previous["alarms"]) != (message["state"], message["alarms"])
        assert changed or gap == interval_ms, (previous, message)


def test_parts_are_counted_only_for_time_spent_running() -> None:
    messages = run_device(steps=5000)
    assert messages[0]["good"] == messages[0]["bad"] == 0
    for previous, message in pairwise(messages):
        assert message["good"] >= 0 and message["bad"] >= 0
        if message["good"] or message["bad"]:
            assert previous["state"] == "RUNNING", (previous, message)
    assert sum(m["bad"] for m in messages) > 0


def test_alarms_follow_the_state() -> None:
    """DOWN carries exactly one fault code for the whole stop; warnings only during RUNNING."""
    messages = [m for seed in range(5) for m in run_device(seed=seed)]
    fault_of_stop: str | None = None
    for message in messages:
        faults = [code for code in message["alarms"] if code in FAULT_CODES]
        warnings = [code for code in message["alarms"] if code in WARNING_CODES]
        assert len(faults) + len(warnings) == len(message["alarms"])
        if message["state"] == "DOWN":
            assert len(faults) == 1
            assert fault_of_stop in (None, faults[0])
            fault_of_stop = faults[0]
        else:
            assert not faults
            fault_of_stop = None
        if warnings:
            assert message["state"] == "RUNNING" and len(warnings) == 1
    codes = {code for m in messages for code in m["alarms"]}
    assert codes & set(FAULT_CODES) and codes & set(WARNING_CODES)


def test_a_fleet_behaves_like_a_factory() -> None:
    """Mostly RUNNING, every state seen, dwell times of tens of seconds to minutes, the line's
    scrap fraction (1-5%) and 0.5-2 parts per second while running."""
    time_in: dict[str, int] = dict.fromkeys(STATES, 0)
    dwells: list[int] = []
    good = bad = 0
    for seed in range(20):
        messages = run_device(seed=seed, steps=2000)
        started = messages[0]
        for previous, message in pairwise(messages):
            time_in[previous["state"]] += message["ts"] - previous["ts"]
            if message["state"] != previous["state"]:
                if started is not messages[0]:  # the first dwell starts part-way through
                    dwells.append(message["ts"] - started["ts"])
                started = message
            good += message["good"]
            bad += message["bad"]
    total_time = sum(time_in.values())
    assert all(time_in.values())
    assert time_in["RUNNING"] / total_time > 0.5
    assert min(dwells) >= 20_000 and max(dwells) <= 600_000
    scrap = line_scrap_fraction("L2")
    assert 0.01 <= scrap <= 0.05
    assert abs(bad / (good + bad) - scrap) < 0.01
    parts_per_running_second = (good + bad) / (time_in["RUNNING"] / 1000)
    assert 0.5 <= parts_per_running_second <= 2.0


def test_devices_of_a_line_share_its_scrap_fraction() -> None:
    a = Device("L3", "S1", "L3-D01", 1, START_MS)
    b = Device("L3", "S2", "L3-D02", 2, START_MS)
    assert a.scrap_fraction == b.scrap_fraction == line_scrap_fraction("L3")
    assert line_scrap_fraction("L3") != line_scrap_fraction("L4")


def test_a_device_needs_a_positive_interval() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        Device("L1", "S1", "L1-D01", 1, START_MS, interval_s=0)


# --- malformed payloads ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(MALFORMATIONS))
def test_every_malformation_is_rejected(kind: str) -> None:
    rng = random.Random(kind)
    for message in run_device(steps=300):
        payload = MALFORMATIONS[kind](message, rng)
        record, reason = validate(payload)
        assert record is None and reason, (kind, payload)


def test_malformed_payloads_of_one_device_are_distinct() -> None:
    rng = random.Random(3)
    payloads = [malformed_payload(message, rng) for message in run_device(steps=2000)]
    assert len(set(payloads)) == len(payloads)
    reasons = {validate(payload)[1] for payload in payloads}
    assert len(reasons) >= 8
