"""What the BI jobs share: where they read and write and the knobs of both (`JobConfig`), and
the names of their tables."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from pyspark.sql import DataFrame

from spark import tables
from spark.presence import PRESENCE_FILTER, DeviceClientIds
from spark.shifts import Shifts
from spark.telemetry import TOPIC_PREFIX

TELEMETRY_FILTER = f"{TOPIC_PREFIX}/+/+/telemetry"
ALL_TABLES = (
    "telemetry",
    "late",
    "quarantine",
    "line_minute",
    "state_intervals",
    "alarm_intervals",
    "availability",
    "alarm_summary",
)


class Layout(NamedTuple):
    """How a table is partitioned: by `partition`, the plant's local date (ISO) of the time
    column `dated_by` (None: the table has the date column itself), and which column says how
    far the table has got (`spark.delta.table_state`)."""

    partition: str
    dated_by: str | None
    newest: str


LAYOUTS = {
    "telemetry": Layout("date", "ts", "ts"),
    "late": Layout("date", "ts", "ts"),
    "quarantine": Layout("date", "store_time", "store_time"),
    "line_minute": Layout("date", "minute", "minute"),
    "state_intervals": Layout("date", "start", "end"),
    "alarm_intervals": Layout("date", "start", "end"),
    "availability": Layout("shift_date", None, "shift_start"),
    "alarm_summary": Layout("date", None, "date"),
}


def dated(frame: DataFrame, name: str, shifts: Shifts) -> DataFrame:
    """`frame`, rows of table `name`, with the date column the table is partitioned by."""
    layout = LAYOUTS[name]
    if layout.dated_by is None:
        return frame
    return frame.withColumn(layout.partition, tables.plant_date(layout.dated_by, shifts))


@dataclass(frozen=True, slots=True)
class JobConfig:
    """Where to read, where to write, and the knobs both jobs share."""

    out: str
    nameserver: str | None = None
    path: str | None = None
    topic_filter: str = TELEMETRY_FILTER
    shifts: Shifts = field(default_factory=Shifts)
    watermark_s: int = 120
    """How late (device time) a message may arrive and still count."""
    max_clock_ahead_s: int = tables.MAX_CLOCK_AHEAD_S
    """How far ahead of the broker's store time a device's timestamp is believed
    (`tables.parse`); less than the watermark, so one device moves the watermark at most this
    far past the broker's clock and never past an honest device's data."""
    device_client_ids: DeviceClientIds | None = None
    """How devices' ClientIds are made from their ids; given, the intervals also read the
    broker's disconnect events, and a device is OFFLINE from its disconnect to its next
    report (`spark.presence`)."""

    def __post_init__(self) -> None:
        if not 0 <= self.max_clock_ahead_s < self.watermark_s:
            raise ValueError(
                f"the clock allowance ({self.max_clock_ahead_s} s) must be at least 0 and less "
                f"than the watermark ({self.watermark_s} s)"
            )

    def source_options(self, **extra: str) -> dict[str, str]:
        """Options of the `rocketmq` source reading this job's telemetry."""
        options = {"topicFilter": self.topic_filter, **extra}
        if self.nameserver:
            options["nameserver"] = self.nameserver
        if self.path:
            options["path"] = self.path
        return options

    def presence_options(self) -> dict[str, str] | None:
        """Options of the `rocketmq` source reading the broker's disconnect events, or None when
        devices' ClientIds are not known."""
        if self.device_client_ids is None:
            return None
        return self.source_options(topicFilter=PRESENCE_FILTER)

    def table(self, name: str) -> str:
        return str(Path(self.out) / name)
