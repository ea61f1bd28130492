"""A factory's telemetry for the BI job tests, and the tables it must give.

`telemetry` makes 30 minutes of four devices on two lines (duplicates, malformed payloads, a
device switched off for eleven minutes, and a last message three hours past the others in device
time, which moves the watermark past everything); `power_off` is the broker's event of that
device's disconnect, for the jobs that know devices' ClientIds; `expected_tables` computes
every table from the messages in plain Python, apart from the jobs' Spark code (it shares only
the interval rules of `spark.intervals` and the calendar of `spark.shifts`); `actual_tables`
reads what a job wrote, in the same shape, so a test compares the two row for row.

The 30 minutes are those around midnight of 7-8 March 2026 in Havana, where the clocks go
forward from 00:00 to 01:00: they hold a change of the plant's date that UTC does not have, a
night shift an hour short, a shift start (01:00) that cuts every running state, and five
minutes of planned downtime. The jobs run with the same calendar (`CALENDAR_ARGS`). The device
switched off is silent across all three: OFFLINE from its disconnect (when the jobs read the
event) is cut at the shift start, and its part in the planned downtime does not count.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark.intervals import Sample, batch_intervals
from spark.job_config import JobConfig
from spark.jobs import read_table
from spark.presence import OFFLINE
from spark.shifts import Downtime, Shifts
from spark.telemetry import Device, encode, validate

START_MS = 1_772_945_100_000
"""2026-03-08T04:45Z, 23:45 on the 7th in Havana (UTC-5; UTC-4 from 05:00Z)."""
SPAN_MS = 30 * 60_000
CLOCK_MS = START_MS + 3 * 3_600_000
"""A message this far in the device future moves the watermark past everything else."""
CALENDAR_ARGS = ["--timezone", "America/Havana", "--shifts", "01:00,06:00,14:00,22:00",
                 "--planned-downtime", "Sun 01:00-01:05"]  # fmt: skip
"""The jobs' calendar on their command line: 01:00 local is 05:00Z on Sunday 8 March, the first
instant after the clocks went forward; the night shift that began at 22:00 on the 7th (03:00Z)
lasts two hours, not three."""
CALENDAR = Shifts.parse("01:00,06:00,14:00,22:00", "America/Havana",
                        (Downtime.parse("Sun 01:00-01:05"),))  # fmt: skip
"""The same calendar, for a `JobConfig` and the expected tables."""


OFF_DEVICE = "L2-D01"
OFF_MS = START_MS + 11 * 60_000
"""When OFF_DEVICE loses power: it sends nothing from then until ON_MS."""
DISCONNECT_MS = OFF_MS + 45_000
"""When the broker notices (1.5 keepalives of 30 s) and stores the disconnect event."""
ON_MS = START_MS + 22 * 60_000


def device_client_id(top: str) -> str:
    """The jobs' `--device-client-id` pattern: devices connect as `<top>-<device>`, so no other
    test's clients (whose events share the broker's `$SYS` topic) are taken for devices."""
    return f"{top}-{{device}}"


def power_off(top: str) -> tuple[str, bytes]:
    """The `$SYS` disconnect event a node stores for OFF_DEVICE at DISCONNECT_MS (the fields of
    bridge/operations/systopics.py), for a test to store in RocketMQ as the node would."""
    client_id = device_client_id(top).replace("{device}", OFF_DEVICE)
    event = {"clientid": client_id, "username": None, "ip": "127.0.0.1", "node": "n1",
             "reason": "keepalive timeout", "connected_at": START_MS - 3_600_000,
             "ts": DISCONNECT_MS}  # fmt: skip
    return (
        f"$SYS/brokers/n1/clients/{client_id}/disconnected",
        json.dumps(event, separators=(",", ":")).encode(),
    )


def telemetry(top: str) -> tuple[list[tuple[str, bytes]], list[dict]]:
    """(what to publish, the valid messages among it): 2 lines x 2 devices over 30 minutes, in
    device-time order as devices running side by side publish them; five messages sent twice
    in a row (as a QoS 1 retransmission stores them), three malformed ones."""
    timeline: list[tuple[int, str, dict]] = []
    for n, (line, device) in enumerate(
        [("L1", "L1-D01"), ("L1", "L1-D02"), ("L2", "L2-D01"), ("L2", "L2-D02")]
    ):
        model = Device(line, f"S{n + 1}", device, seed=100 + n, start_ms=START_MS, interval_s=10)
        while model.clock_ms < START_MS + SPAN_MS:
            for message in model.step():
                if device == OFF_DEVICE and OFF_MS < message["ts"] < ON_MS:
                    continue  # switched off: nothing is sent
                timeline.append((message["ts"], f"{top}/{line}/{device}/telemetry", message))
    timeline.sort(key=lambda item: item[0])
    published: list[tuple[str, bytes]] = []
    valid: list[dict] = []
    for index, (_, topic, message) in enumerate(timeline):
        published.append((topic, encode(message)))
        valid.append(message)
        if index in (3, 50, 120, 200, 260):
            published.append((topic, encode(message)))  # stored twice, counted once
    clock = {"v": 1, "device": "clock", "line": "ZZ", "station": "S0", "seq": 0,
             "ts": CLOCK_MS, "state": "IDLE", "good": 0, "bad": 0, "alarms": []}  # fmt: skip
    published.append((f"{top}/ZZ/clock/telemetry", encode(clock)))
    valid.append(clock)
    published += [
        (f"{top}/L1/L1-D01/telemetry", b"{not json"),
        (f"{top}/L1/L1-D01/telemetry", b'{"v":1,"device":"L1-D01"}'),
        (f"{top}/L2/L2-D02/telemetry", encode({**valid[0], "state": "EXPLODED"})),
    ]
    return published, valid


def rows(frame: DataFrame | None, *columns: str) -> Counter[tuple]:
    """A table's rows as a multiset of tuples, timestamps as epoch milliseconds."""
    assert frame is not None, "table not written"
    selected = [
        F.unix_millis(F.col(c)).alias(c) if dict(frame.dtypes)[c] == "timestamp" else F.col(c)
        for c in columns
    ]
    return Counter(tuple(r) for r in frame.select(*selected).collect())


def minute(ts: int) -> int:
    return ts - ts % 60_000


def expected_tables(
    valid: list[dict], published: list[tuple[str, bytes]], *, offline: bool = False
) -> dict[str, Counter]:
    """The tables from the messages; with `offline`, the jobs also read `power_off`'s event."""
    unique_messages = list({(m["device"], m["seq"]): m for m in valid}.values())
    out: dict[str, Counter] = {}
    out["telemetry"] = Counter(
        (m["device"], m["seq"], m["ts"], m["state"], m["good"], m["bad"]) for m in unique_messages
    )
    out["late"] = Counter()  # published in device-time order: nothing comes behind the watermark
    out["quarantine"] = Counter(
        (reason, payload)
        for _, payload in published
        if (reason := validate(payload)[1]) is not None
    )
    per_minute: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0, 0])
    for m in unique_messages:
        cell = per_minute[(m["line"], minute(m["ts"]))]
        cell[0] += m["good"]
        cell[1] += m["bad"]
        cell[2] += 1
    out["line_minute"] = Counter(
        (line, at, good, bad, good + bad, ratio(bad, good + bad), messages)
        for (line, at), (good, bad, messages) in per_minute.items()
    )
    by_device: dict[str, list[Sample]] = defaultdict(list)
    for m in unique_messages:
        by_device[m["device"]].append(
            Sample(m["ts"], m["seq"], m["state"], frozenset(m["alarms"]), m["line"], m["station"])
        )
    if offline:  # OFFLINE from the disconnect to the next report; the event names no line
        by_device[OFF_DEVICE].append(
            Sample(DISCONNECT_MS, -DISCONNECT_MS, OFFLINE, frozenset(), "", "")
        )
    newest = max(m["ts"] for m in unique_messages)  # how far a back-fill cuts running states
    intervals = [i for d, s in by_device.items() for i in batch_intervals(d, s, CALENDAR, newest)]
    out["state_intervals"] = Counter(
        (i.device, i.what, i.start, i.end, i.closed_by) for i in intervals if i.kind == "state"
    )
    out["alarm_intervals"] = Counter(
        (i.device, i.what, i.start, i.end) for i in intervals if i.kind == "alarm"
    )
    shift_ms: dict[tuple[str, str, int, int], dict[str, int]] = defaultdict(
        lambda: defaultdict(int)
    )
    for i in intervals:
        if i.kind == "state":
            for piece in CALENDAR.pieces(i.start, i.end):
                planned = CALENDAR.planned_ms(piece.shift_start)
                shift_ms[(i.device, piece.shift_date, piece.shift, planned)][i.what] += piece.ms
    out["availability"] = Counter(
        (
            device,
            date,
            number,
            planned / 1000,
            s["RUNNING"] / 1000,
            s[OFFLINE] / 1000,
            sum(s.values()) / 1000,
            ratio(s["RUNNING"], sum(s.values())),
        )
        for (device, date, number, planned), s in shift_ms.items()
    )
    alarms: dict[tuple[str, str], list[tuple[str, int]]] = defaultdict(list)
    for i in intervals:
        if i.kind == "alarm":
            day = CALENDAR.local_date(i.start).isoformat()
            alarms[(day, i.what)].append((i.device, i.end - i.start))
    out["alarm_summary"] = Counter(
        (
            day,
            code,
            len(raised),
            sum(ms for _, ms in raised) / 1000,
            max(ms for _, ms in raised) / 1000,
            len({device for device, _ in raised}),
        )
        for (day, code), raised in alarms.items()
    )
    return out


def ratio(part: int, whole: int) -> float | None:
    """`part / whole` to four places, half up, as the tables round (None when `whole` is 0)."""
    if not whole:
        return None
    return float((Decimal(part) / Decimal(whole)).quantize(Decimal("0.0001"), ROUND_HALF_UP))


def actual_tables(spark: SparkSession, out: Path) -> dict[str, Counter]:
    config = JobConfig(out=str(out))

    def table(name: str) -> DataFrame | None:
        return read_table(spark, config, name)

    availability = table("availability")
    assert availability is not None
    availability = availability.select(
        "device",
        F.col("shift_date").cast("string").alias("shift_date"),
        "shift",
        "planned_s",
        "running_s",
        "offline_s",
        "observed_s",
        "availability",
    )
    alarm_summary = table("alarm_summary")
    assert alarm_summary is not None
    alarm_summary = alarm_summary.select(
        F.col("date").cast("string").alias("date"),
        "code",
        "count",
        "total_s",
        "max_s",
        "devices",
    )
    return {
        "telemetry": rows(table("telemetry"), "device", "seq", "ts", "state", "good", "bad"),
        # Written only once a row is late (a stream), or empty (a back-fill).
        "late": Counter() if (late := table("late")) is None else rows(late, "device", "seq"),
        "quarantine": Counter(
            (r.error, bytes(r.payload))
            for r in table("quarantine").collect()  # type: ignore[union-attr]
        ),
        "line_minute": rows(
            table("line_minute"), "line", "minute", "good", "bad", "total", "scrap_rate", "messages"
        ),
        "state_intervals": rows(
            table("state_intervals"), "device", "state", "start", "end", "closed_by"
        ),
        "alarm_intervals": rows(table("alarm_intervals"), "device", "code", "start", "end"),
        "availability": rows(availability, *availability.columns),
        "alarm_summary": rows(alarm_summary, *alarm_summary.columns),
    }


def without_open_minute(table: Counter) -> Counter:
    """line_minute without line ZZ's minute: nothing after it closes it in a stream."""
    return Counter({row: n for row, n in table.items() if row[0] != "ZZ"})
