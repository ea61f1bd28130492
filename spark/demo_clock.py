"""The demo's clock message: one valid telemetry message, three hours past the data in device
time, on a line of its own (`ZZ`, device `clock`).

`python -m spark.demo` publishes it after the simulation to move the stream's event-time
watermark past every real message; the report (`spark.demo_report`) leaves line `ZZ` out of its
comparison and chart, since the stream never closes the clock message's own minute. Both import
it from here, so neither imports the other for it.
"""

from __future__ import annotations

from typing import Final

from spark import telemetry
from spark.demo_servers import publish_once

CLOCK_LINE: Final = "ZZ"
CLOCK_DEVICE: Final = "clock"
CLOCK_AHEAD_MS: Final = 3 * 3_600_000
"""How far past the data the clock message is: far beyond the watermark and any open minute."""


def publish_clock(port: int, ts_ms: int) -> None:
    """One valid telemetry message of device `clock` on line ZZ at `ts_ms`, acknowledged (so
    stored) when this returns. It moves the stream's watermark to `ts_ms` minus the stream's
    watermark delay."""
    message = {
        "v": telemetry.SCHEMA_VERSION,
        "device": CLOCK_DEVICE,
        "line": CLOCK_LINE,
        "station": "S0",
        "seq": 0,
        "ts": ts_ms,
        "state": "IDLE",
        "good": 0,
        "bad": 0,
        "alarms": [],
    }
    topic = telemetry.telemetry_topic(CLOCK_LINE, CLOCK_DEVICE)
    publish_once(port, topic, telemetry.encode(message), "spark-demo-clock")
