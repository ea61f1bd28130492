"""A device's disconnect, from the broker's `$SYS` event, makes it OFFLINE until it reports."""

from __future__ import annotations

import json

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from spark.intervals import DeviceTrack, Sample, batch_intervals
from spark.presence import OFFLINE, DeviceClientIds, disconnect_of

T0 = 1_767_592_800_000  # 2026-01-05T06:00Z


def event(client_id: str, ts: object, *, node: str = "n1", what: str = "disconnected") -> tuple:
    body = {"clientid": client_id, "reason": "connection lost", "ts": ts, "node": node}
    return f"$SYS/brokers/{node}/clients/{client_id}/{what}", json.dumps(body).encode()


def report(ts: int, seq: int, state: str, alarms: tuple[str, ...] = ()) -> Sample:
    return Sample(T0 + ts, seq, state, frozenset(alarms), "L1", "S3")


def offline(ts: int) -> Sample:
    """A disconnect as the parser makes it: seq = -time, no line or station."""
    return Sample(T0 + ts, -(T0 + ts), OFFLINE, frozenset(), "", "")


def test_a_disconnect_event_of_a_devices_client_id_names_the_device_and_the_time() -> None:
    ids = DeviceClientIds("sim-{device}")
    assert disconnect_of(*event("sim-L1-D03", T0), ids) == ("L1-D03", T0)


@pytest.mark.parametrize(
    "message",
    [
        event("backend-7", T0),  # another client
        event("sim-", T0),  # the pattern with no device in it
        event("sim-L1-D03", T0, what="connected"),
        event("sim-L1-D03", "yesterday"),
        event("sim-L1-D03", 12),  # before 2000: no device time
        ("$SYS/brokers/n1/uptime", b"12"),
        ("$SYS/brokers/n1/clients/sim-L1-D03/disconnected", b"{not json"),
        ("$SYS/brokers/n1/clients/sim-L1-D03/disconnected", b"[1]"),
        ("factory/L1/L1-D03/telemetry", b"{}"),
    ],
)
def test_anything_else_is_no_devices_disconnect(message: tuple[str, bytes]) -> None:
    assert disconnect_of(*message, DeviceClientIds("sim-{device}")) is None


@pytest.mark.parametrize("pattern", ["device", "{device}-{device}", "sim-{dev}"])
def test_a_client_id_pattern_without_exactly_one_placeholder_is_refused(pattern: str) -> None:
    with pytest.raises(ValueError, match=r"expected \{device\} exactly once"):
        DeviceClientIds(pattern)


@given(st.text(min_size=1), st.text(), st.text())
def test_a_pattern_gives_back_the_device_it_was_filled_with(
    device: str, prefix: str, suffix: str
) -> None:
    assume("{device}" not in prefix + suffix)
    ids = DeviceClientIds(f"{prefix}{{device}}{suffix}")
    assert ids.device_of(f"{prefix}{device}{suffix}") == device


def test_a_disconnect_closes_state_and_open_alarms_and_offline_lasts_to_the_next_report() -> None:
    samples = [report(0, 0, "DOWN", ("E101",)), offline(60_000), report(600_000, 1, "RUNNING")]
    got = [(i.kind, i.what, i.start - T0, i.end - T0, i.closed_by, i.line, i.station)
           for i in batch_intervals("L1-D03", samples)]  # fmt: skip
    assert sorted(got) == [
        ("alarm", "E101", 0, 60_000, "offline", "L1", "S3"),
        ("state", "DOWN", 0, 60_000, "change", "L1", "S3"),
        ("state", OFFLINE, 60_000, 600_000, "change", "L1", "S3"),
    ]


def test_a_disconnect_of_a_device_never_heard_of_leaves_no_track() -> None:
    track = DeviceTrack("L9-X")
    closed, late = track.advance([offline(0)], T0 + 1_000)
    assert (closed, late, track.state, track.pending) == ([], 0, None, [])


def test_a_reconnect_within_the_same_state_still_shows_the_time_offline() -> None:
    samples = [report(0, 0, "RUNNING"), offline(5_000), report(7_000, 1, "RUNNING")]
    got = [(i.what, i.start - T0, i.end - T0) for i in batch_intervals("d", samples)]
    assert got == [("RUNNING", 0, 5_000), (OFFLINE, 5_000, 7_000)]
