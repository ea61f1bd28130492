"""`python -m spark.simulate`: simulated factory devices publishing telemetry over MQTT.

Each device of `spark.telemetry.Device` gets its own MQTT connection (ClientId `sim-<device>`,
clean session) and publishes on `factory/<line>/<device>/telemetry`, as a real machine would. One
process holds thousands of connections: the MQTT protocol is our sans-IO codec
(`bridge.mqtt.codec`) behind one small `asyncio.Protocol` per connection, and one scheduler
decides what is sent when.

Three layers, as in the bridge:

- `DeviceLink` (spark/simulate_link.py) owns one device's MQTT state across its connections:
  messages waiting to be sent, QoS 1 messages in flight, packet ids, reconnects with backoff and
  resending what was unacknowledged, with DUP set.
- `Simulator` owns the devices' clocks and the pacing. It sends the devices' messages in the
  order of their timestamps, `rate` per wall-clock second. Without `time_scale` the device clocks
  run as fast as that rate needs; with it, a message is sent only once `start_ms + time_scale *
  elapsed` reaches its `ts`, and `rate` is a ceiling.
- `run(options)` is the public API; `main` is the command line with its progress display.

Every run is bounded: publishing stops after `count` messages or `duration` seconds, whichever
comes first; then the run waits at most `drain_timeout` seconds for outstanding PUBACKs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import math
import random
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final

from spark import telemetry
from spark.simulate_link import (
    Counters,
    DeviceLink,
    LinkSettings,
    SimulatorError,
    describe_failure,
)

__all__ = [
    "Options",
    "SimulatorError",
    "Summary",
    "build_parser",
    "device_names",
    "format_progress",
    "format_summary",
    "main",
    "number_option",
    "parse_options",
    "run",
]

STATIONS_PER_LINE: Final = 5
CONCURRENT_CONNECTS: Final = 256
"""Connection attempts at one time, so thousands of devices do not overflow the listen queue."""
BATCH: Final = 1000
"""Messages the scheduler sends before it lets the event loop run."""


@dataclass(frozen=True, slots=True)
class Options:
    """What to simulate and how hard; the defaults are those of the command line."""

    host: str = "127.0.0.1"
    port: int = 1883
    lines: int = 3
    devices_per_line: int = 10
    rate: float = 100.0
    duration: float = 60.0
    count: int | None = None
    qos: int = 1
    seed: int = 0
    interval: float = 5.0
    time_scale: float | None = None
    start_ms: int | None = None
    malformed: float = 0.0
    max_inflight: int = 16
    keepalive: int = 60
    connect_timeout: float = 5.0
    drain_timeout: float = 10.0


@dataclass(frozen=True, slots=True)
class Summary:
    """What a run did (or, as progress, has done so far).

    `sent` counts messages written at least once (resends are `resent`), `acked` those whose
    PUBACK arrived (always 0 at QoS 0), `malformed` the sent ones replaced by a malformed payload.
    `errors` counts failed connection attempts, lost connections and protocol errors;
    `reconnects` the connections made after a device's first. `undelivered` is what was made but
    never acknowledged (QoS 1) or never written (QoS 0) when the run ended.
    """

    sent: int
    acked: int
    malformed: int
    reconnects: int
    errors: int
    elapsed: float
    in_flight: int = 0
    resent: int = 0
    undelivered: int = 0
    device_seconds: float = 0.0


def device_names(lines: int, devices_per_line: int) -> list[tuple[str, str, str]]:
    """(line, station, device) of every simulated device: lines L1..Ln, devices `<line>-D<nn>`,
    stations S1..S5 assigned round-robin along each line."""
    return [
        (f"L{line}", f"S{(number - 1) % STATIONS_PER_LINE + 1}", f"L{line}-D{number:02d}")
        for line in range(1, lines + 1)
        for number in range(1, devices_per_line + 1)
    ]


def link_settings(options: Options) -> LinkSettings:
    """The part of `options` every device's link uses (broker address, QoS, window, timeouts)."""
    return LinkSettings(
        host=options.host,
        port=options.port,
        qos=options.qos,
        max_inflight=options.max_inflight,
        keepalive=options.keepalive,
        connect_timeout=options.connect_timeout,
    )


class Simulator:
    """The devices, their links and the scheduler of one run; see the module docstring."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.start_ms = options.start_ms if options.start_ms is not None else _now_ms()
        self.counters = Counters(options.qos)
        self.started = time.monotonic()
        self.devices: list[telemetry.Device] = []
        self.links: list[DeviceLink] = []

    def snapshot(self) -> Summary:
        """The counters now, as a Summary."""
        c = self.counters
        return Summary(
            sent=c.sent,
            acked=c.acked,
            malformed=c.malformed,
            reconnects=c.reconnects,
            errors=c.errors,
            elapsed=time.monotonic() - self.started,
            in_flight=c.in_flight,
            resent=c.resent,
            undelivered=c.made - c.done,
            device_seconds=max(0, c.latest_ts - self.start_ms) / 1000,
        )

    async def run(self) -> Summary:
        options = self.options
        _ensure_open_files(options.lines * options.devices_per_line)
        gate = asyncio.Semaphore(CONCURRENT_CONNECTS)
        settings = link_settings(options)
        for line, station, name in device_names(options.lines, options.devices_per_line):
            seed = random.Random(f"{options.seed}/{name}").getrandbits(63)
            self.devices.append(
                telemetry.Device(line, station, name, seed, self.start_ms, options.interval)
            )
            topic = telemetry.telemetry_topic(line, name)
            self.links.append(DeviceLink(f"sim-{name}", topic, settings, self.counters, gate))
        try:
            await self.links[0].connect()
        except (OSError, TimeoutError, ConnectionError, SimulatorError) as exc:
            await self.links[0].close()
            raise SimulatorError(
                f"cannot connect to {options.host}:{options.port}: {describe_failure(exc)}"
            ) from None
        tasks = [asyncio.create_task(link.supervise()) for link in self.links]
        tasks.append(asyncio.create_task(self._keepalive()))
        try:
            await self._publish()
            await self._drain()
        finally:
            # Stop reconnecting first (a cancelled attempt closes its socket), then say goodbye.
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.gather(*(link.close() for link in self.links))
        return self.snapshot()

    async def _publish(self) -> None:
        """Make and hand out messages in timestamp order, paced, until count or duration."""
        options = self.options
        counters = self.counters
        loop = asyncio.get_running_loop()
        corrupt = random.Random(f"malformed/{options.seed}")
        heads = [device.step() for device in self.devices]
        queue = [(batch[0]["ts"], index) for index, batch in enumerate(heads)]
        heapq.heapify(queue)
        began = loop.time()
        deadline = began + options.duration
        limit = options.count if options.count is not None else math.inf
        while counters.made < limit:
            now = loop.time()
            if now >= deadline:
                break
            allowed = min(BATCH, math.floor((now - began) * options.rate) + 1 - counters.made)
            due_ms = math.inf
            if options.time_scale is not None:
                due_ms = self.start_ms + (now - began) * options.time_scale * 1000
            while allowed > 0 and counters.made < limit and queue[0][0] <= due_ms:
                index = queue[0][1]
                link = self.links[index]
                if not link.room.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(link.room.wait(), deadline - loop.time())
                    break
                message = heads[index].pop(0)
                if not heads[index]:
                    heads[index] = self.devices[index].step()
                heapq.heapreplace(queue, (heads[index][0]["ts"], index))
                malformed = corrupt.random() < options.malformed
                if malformed:
                    payload = telemetry.malformed_payload(message, corrupt)
                else:
                    payload = telemetry.encode(message)
                counters.made += 1
                counters.latest_ts = max(counters.latest_ts, message["ts"])
                link.submit(payload, malformed)
                allowed -= 1
            wake = began + counters.made / options.rate  # the next message's slot
            if options.time_scale is not None and queue[0][0] > due_ms:
                due_at = began + (queue[0][0] - self.start_ms) / 1000 / options.time_scale
                wake = max(wake, due_at)
            await asyncio.sleep(min(max(0.0, wake - loop.time()), deadline - loop.time()))

    async def _drain(self) -> None:
        """Wait (at most drain_timeout) until everything made is acknowledged or written."""
        counters = self.counters
        counters.publishing_done = True
        if counters.done >= counters.made:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(counters.all_done.wait(), self.options.drain_timeout)

    async def _keepalive(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(1.0)
            now = loop.time()
            for link in self.links:
                link.ping_if_idle(now)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _ensure_open_files(connections: int) -> None:
    """Raise the soft limit of open files to what the connections need, or say why we cannot."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Unix: nothing to check
        return
    needed = connections + 64
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        if soft < needed:
            raise SimulatorError(
                f"{connections} devices need about {needed} open files but the limit is {soft} "
                "(raise it with ulimit -n)"
            )


async def run(
    options: Options,
    progress: Callable[[Summary], None] | None = None,
    progress_every: float = 1.0,
) -> Summary:
    """Simulate `options`' devices against the broker until count or duration; the Summary.

    `progress`, if given, is called with a snapshot every `progress_every` seconds. Raises
    SimulatorError when the first device cannot connect (nothing was sent then).
    """
    simulator = Simulator(options)

    async def report() -> None:
        while True:
            await asyncio.sleep(progress_every)
            assert progress is not None
            progress(simulator.snapshot())

    reporter = asyncio.create_task(report()) if progress is not None else None
    try:
        return await simulator.run()
    finally:
        if reporter is not None:
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter


# --- the command line ------------------------------------------------------------------------


def number_option(
    kind: Callable[[str], Any], low: float, high: float = math.inf, *, open_low: bool
) -> Callable[[str], Any]:
    """An argparse type: `kind` within (low, high] if open_low else [low, high]."""

    def convert(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        below = value <= low if open_low else value < low
        if below or value > high or value != value:
            bound = f"> {low:g}" if open_low else f">= {low:g}"
            if high != math.inf:
                bound += f" and <= {high:g}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value

    return convert


def build_parser() -> argparse.ArgumentParser:
    """The command line of `python -m spark.simulate`."""
    parser = argparse.ArgumentParser(
        prog="python -m spark.simulate",
        description="Simulated factory devices publishing telemetry (docs/telemetry.md) over "
        "MQTT, one connection per device. Stops after --count messages or --duration seconds.",
    )
    add = parser.add_argument
    positive_int = number_option(int, 0, open_low=True)
    positive = number_option(float, 0, open_low=True)
    add("--host", default="127.0.0.1", help="broker host (default 127.0.0.1)")
    port = number_option(int, 1, 65535, open_low=False)
    add("--port", type=port, default=1883, help="(default 1883)")
    add(
        "--lines",
        metavar="N",
        type=positive_int,
        default=3,
        help="production lines L1..Ln (default 3)",
    )
    add(
        "--devices-per-line",
        metavar="N",
        type=positive_int,
        default=10,
        help="devices per line (default 10)",
    )
    add(
        "--rate",
        metavar="MSG/S",
        type=positive,
        default=100.0,
        help="messages/s over all devices (default 100)",
    )
    add(
        "--duration",
        metavar="SECONDS",
        type=positive,
        default=60.0,
        help="seconds of publishing (default 60)",
    )
    add(
        "--count",
        metavar="N",
        type=positive_int,
        help="stop after this many messages (default: no limit)",
    )
    add("--qos", type=int, choices=(0, 1), default=1, help="publish QoS (default 1)")
    add("--seed", type=int, default=0, help="seed of the devices and malformations (default 0)")
    add(
        "--interval",
        metavar="SECONDS",
        type=positive,
        default=5.0,
        help="device sample interval, s (default 5)",
    )
    add(
        "--time-scale",
        metavar="S",
        type=positive,
        help="device-clock seconds per wall second (e.g. 60: an hour per minute); --rate is then "
        "a ceiling. Default: the device clocks run as fast as --rate needs",
    )
    add(
        "--start-ms",
        metavar="MS",
        type=number_option(int, telemetry.TS_MIN, telemetry.TS_MAX - 1, open_low=False),
        help="device clocks' start, epoch ms (default: now)",
    )
    add(
        "--malformed",
        metavar="FRACTION",
        type=number_option(float, 0, 1, open_low=False),
        default=0.0,
        help="fraction of messages replaced by malformed payloads (default 0)",
    )
    add(
        "--max-inflight",
        metavar="N",
        type=positive_int,
        default=16,
        help="QoS 1 window per device (16)",
    )
    return parser


def parse_options(argv: list[str] | None = None) -> Options:
    """Options from the command line; exits with a usage error (status 2) on bad values."""
    args = build_parser().parse_args(argv)
    return Options(
        host=args.host,
        port=args.port,
        lines=args.lines,
        devices_per_line=args.devices_per_line,
        rate=args.rate,
        duration=args.duration,
        count=args.count,
        qos=args.qos,
        seed=args.seed,
        interval=args.interval,
        time_scale=args.time_scale,
        start_ms=args.start_ms,
        malformed=args.malformed,
        max_inflight=args.max_inflight,
    )


def format_progress(summary: Summary, rate: float) -> str:
    """One progress line."""
    return (
        f"{summary.elapsed:6.1f} s  sent {summary.sent}  acked {summary.acked}  {rate:.1f} msg/s  "
        f"in flight {summary.in_flight}  reconnects {summary.reconnects}  errors {summary.errors}"
    )


def format_summary(summary: Summary) -> str:
    """The final line: everything a run did."""
    rate = summary.sent / summary.elapsed if summary.elapsed > 0 else 0.0
    return (
        f"done in {summary.elapsed:.1f} s: sent {summary.sent} ({summary.malformed} malformed, "
        f"{summary.resent} resent), acked {summary.acked}, {rate:.1f} msg/s, "
        f"reconnects {summary.reconnects}, errors {summary.errors}, "
        f"device time {summary.device_seconds:.0f} s"
    )


class _ProgressDisplay:
    """A line rewritten in place every second on a terminal; else a log line every 5 s."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.every = 1.0 if self.tty else 5.0
        self._last_sent = 0
        self._last_time = 0.0
        self._shown = False

    def __call__(self, summary: Summary) -> None:
        span = summary.elapsed - self._last_time
        rate = (summary.sent - self._last_sent) / span if span > 0 else 0.0
        self._last_sent, self._last_time = summary.sent, summary.elapsed
        line = format_progress(summary, rate)
        if self.tty:
            self.stream.write(f"\r\x1b[K{line}")
            self._shown = True
        else:
            self.stream.write(f"simulate: {line.strip()}\n")
        self.stream.flush()

    def finish(self, text: str) -> None:
        if self._shown:
            self.stream.write("\r\x1b[K")
        self.stream.write(f"simulate: {text}\n")
        self.stream.flush()


def _run_loop(main: Coroutine[Any, Any, Summary]) -> Summary:
    """Run a coroutine on uvloop (what the bridge runs on: cheaper per connection), or asyncio."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; fall back for odd platforms
        return asyncio.run(main)
    return uvloop.run(main)


def main(argv: list[str] | None = None) -> int:
    """Run the simulator from the command line; the process exit code."""
    options = parse_options(argv)
    display = _ProgressDisplay(sys.stderr)
    if options.time_scale is not None:
        devices = options.lines * options.devices_per_line
        natural = devices * options.time_scale / options.interval  # periodic samples alone
        if natural > options.rate:
            display.finish(
                f"note: at --time-scale {options.time_scale:g} the {devices} devices send at "
                f"least {natural:.0f} msg/s; --rate {options.rate:g} holds their clocks back"
            )
    try:
        summary = _run_loop(run(options, display, display.every))
    except SimulatorError as exc:
        display.finish(str(exc))
        return 1
    except KeyboardInterrupt:
        display.finish("interrupted")
        return 130
    display.finish(format_summary(summary))
    if summary.undelivered:
        what = "acknowledged" if options.qos else "sent"
        display.finish(f"error: {summary.undelivered} messages were not {what}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
