"""The factory telemetry schema (version 1), its reference validator and a simulated device.

Pure: no I/O and no pyspark, so the simulator, its tests and the Spark job's tests share one
definition. The Spark job repeats the checks of `validate` in Spark SQL; when the two disagree,
this module and docs/telemetry.md are the specification.

A payload is one UTF-8 JSON object per MQTT message on `factory/<line>/<device>/telemetry`:

    {"v":1,"device":"L1-D03","line":"L1","station":"S3","seq":42,"ts":1763798400000,
     "state":"RUNNING","good":3,"bad":0,"alarms":[]}

`Device` is a seeded state machine that produces such payloads as a real machine would: a message
on every change of state or alarms, otherwise one every `interval_s` seconds of its own clock.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any, Final

SCHEMA_VERSION: Final = 1
STATES: Final = ("RUNNING", "IDLE", "DOWN", "SETUP")
TOPIC_PREFIX: Final = "factory"

FIELDS: Final = ("v", "device", "line", "station", "seq", "ts", "state", "good", "bad", "alarms")
"""Every field of schema version 1, all required, in the order devices write them."""

TS_MIN: Final = 946_684_800_000
"""Smallest valid `ts`: 2000-01-01T00:00:00Z in epoch milliseconds."""
TS_MAX: Final = 4_102_444_800_000
"""First invalid `ts`: 2100-01-01T00:00:00Z in epoch milliseconds (exclusive)."""
COUNTER_MAX: Final = 2**63 - 1
"""Largest `seq`, `good` or `bad`: the range of a signed 64-bit integer (Spark's LongType)."""
ID_MAX_CHARS: Final = 64
"""Longest `device`, `line` or `station`, in characters."""
ALARM_MAX_CHARS: Final = 32
"""Longest alarm code, in characters."""

FAULT_CODES: Final = ("E101", "E205", "E310", "E412")
"""Fault alarms the simulated devices raise while DOWN (one for the whole stop)."""
WARNING_CODES: Final = ("W201", "W202", "W305")
"""Warning alarms the simulated devices raise for a while during RUNNING."""


def telemetry_topic(line: str, device: str) -> str:
    """The MQTT topic a device publishes its telemetry on: `factory/<line>/<device>/telemetry`."""
    return f"{TOPIC_PREFIX}/{line}/{device}/telemetry"


def encode(message: Any) -> bytes:
    """A message (any JSON value) as the compact UTF-8 JSON a device sends."""
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()


# --- validation ------------------------------------------------------------------------------

_REASON_VALUE_CHARS: Final = 24
_HUGE_INT: Final = COUNTER_MAX + 1  # stands in for integers too long to parse: out of range


def _parse_int(text: str) -> int:
    # Python refuses to convert integers of more than 4300 digits; such a number is out of every
    # range here, so it becomes one that is just out of range instead of an error.
    return int(text) if len(text) <= 100 else _HUGE_INT


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN, Infinity and -Infinity (RFC 8259 has none)


def _cut(text: str) -> str:
    """A value cut short for a reason string, so a reason stays one short line."""
    if len(text) > _REASON_VALUE_CHARS:
        return text[:_REASON_VALUE_CHARS] + "..."
    return text


def _is_text(value: Any, max_chars: int) -> bool:
    """A JSON string of 1..max_chars characters that is valid Unicode (JSON escapes can spell
    lone surrogates, which no UTF-8 writer downstream could store)."""
    if type(value) is not str or not 1 <= len(value) <= max_chars:
        return False
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0  # bool is a subclass of int: refused here


def validate(payload: bytes | bytearray | memoryview) -> tuple[dict[str, Any] | None, str | None]:
    """Check one telemetry payload against schema version 1.

    Returns ``(record, None)`` when it is valid, where record holds exactly the schema's fields
    (extra fields are ignored), or ``(None, reason)`` with a short human reason naming the first
    problem found, fields checked in `FIELDS` order. Never raises, whatever the bytes.
    """
    try:
        text = bytes(payload).decode("utf-8")
    except UnicodeDecodeError:
        return None, "not UTF-8"
    try:
        value = json.loads(text, parse_int=_parse_int, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        return None, "not JSON"
    if type(value) is not dict:
        return None, "not a JSON object"
    for name in FIELDS:
        if name not in value:
            return None, f"missing field {name!r}"
    reason = _field_problem(value)
    if reason is not None:
        return None, reason
    record = {name: value[name] for name in FIELDS}
    record["alarms"] = list(record["alarms"])
    return record, None


def _field_problem(value: dict[str, Any]) -> str | None:
    version = value["v"]
    if type(version) is not int:
        return "field 'v' must be an integer"
    if version != SCHEMA_VERSION:
        return f"unsupported version {_cut(str(version))}"
    for name in ("device", "line", "station"):
        if not _is_text(value[name], ID_MAX_CHARS):
            return f"field {name!r} must be a string of 1-{ID_MAX_CHARS} characters"
    seq = value["seq"]
    if not _is_count(seq):
        return "field 'seq' must be a non-negative integer"
    if seq > COUNTER_MAX:
        return "field 'seq' out of range"
    ts = value["ts"]
    if type(ts) is not int:
        return "field 'ts' must be an integer"
    if not TS_MIN <= ts < TS_MAX:
        return "field 'ts' out of range"
    state = value["state"]
    if type(state) is not str:
        return "field 'state' must be a string"
    if state not in STATES:
        return f"unknown state {_cut(state)!r}"
    for name in ("good", "bad"):
        if not _is_count(value[name]):
            return f"field {name!r} must be a non-negative integer"
        if value[name] > COUNTER_MAX:
            return f"field {name!r} out of range"
    alarms = value["alarms"]
    if type(alarms) is not list:
        return "field 'alarms' must be an array"
    for index, code in enumerate(alarms):
        if not _is_text(code, ALARM_MAX_CHARS):
            return f"alarm {index} must be a string of 1-{ALARM_MAX_CHARS} characters"
    return None


# --- the simulated device --------------------------------------------------------------------

# (shortest, longest) time in a state, in seconds of device time.
_DWELL_S: Final = {
    "RUNNING": (90.0, 600.0),
    "IDLE": (20.0, 120.0),
    "DOWN": (30.0, 240.0),
    "SETUP": (60.0, 300.0),
}
# The state that follows each state, with weights.
_NEXT_STATE: Final = {
    "RUNNING": (("IDLE", "DOWN", "SETUP"), (45, 35, 20)),
    "IDLE": (("RUNNING", "SETUP"), (80, 20)),
    "DOWN": (("RUNNING", "SETUP"), (70, 30)),
    "SETUP": (("RUNNING", "IDLE"), (90, 10)),
}
_INITIAL_STATE_WEIGHTS: Final = (70, 10, 10, 10)  # in STATES order
_WARNING_MEAN_GAP_S: Final = 600.0
_WARNING_DURATION_S: Final = (15.0, 90.0)
_CYCLE_RATE_PER_S: Final = (0.5, 2.0)
_SCRAP_FRACTION: Final = (0.01, 0.05)
_NEVER: Final = 2**63


def line_scrap_fraction(line: str) -> float:
    """The fraction of parts a line scraps (1-5%), fixed for a line name: every device of the line
    shares it, whatever its seed."""
    return random.Random(f"scrap:{line}").uniform(*_SCRAP_FRACTION)


class Device:
    """One simulated machine: a seeded state machine with its own clock, producing telemetry.

    The clock starts at `start_ms` and only `step` moves it. The first message is sent at
    `start_ms`; afterwards the device sends at once whenever its state or its alarms change, and
    otherwise `interval_s` seconds after its previous message. While RUNNING it makes parts at
    its own cycle rate (0.5-2 per second), scrapping the line's fraction of them; when DOWN one
    fault code is active; now and then a warning is active for a while during RUNNING. Two
    devices built with the same arguments produce the same messages.
    """

    def __init__(
        self,
        line: str,
        station: str,
        device: str,
        seed: int,
        start_ms: int,
        interval_s: float = 5.0,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.line = line
        self.station = station
        self.device = device
        self.interval_ms = max(1, round(interval_s * 1000))
        self._rng = random.Random(seed)
        self.cycle_rate = self._rng.uniform(*_CYCLE_RATE_PER_S)
        """Parts per second of device time while RUNNING."""
        self.scrap_fraction = line_scrap_fraction(line)
        self.clock_ms = start_ms
        """The device's clock, epoch milliseconds: the `ts` of its latest message."""
        self.seq = 0
        """The `seq` of the next message."""
        self.state: str = self._rng.choices(STATES, _INITIAL_STATE_WEIGHTS)[0]
        # Start part-way through the first dwell, so devices do not change in step.
        self._state_until = start_ms + self._dwell_ms(self.state, fraction=self._rng.random())
        self.fault: str | None = self._rng.choice(FAULT_CODES) if self.state == "DOWN" else None
        self.warning: str | None = None
        self._warning_at = self._schedule_warning(start_ms)
        self._warning_until = _NEVER
        self._last_sent_ms: int | None = None
        self._part_progress = 0.0  # fraction of the part being made
        self._good = 0
        self._bad = 0

    @property
    def alarms(self) -> list[str]:
        """The alarm codes active now."""
        return [code for code in (self.fault, self.warning) if code is not None]

    def step(self) -> list[dict[str, Any]]:
        """Advance the clock to the next moment this device sends, and return what it sends then.

        That is one message: changes that happen in the same millisecond share it. `seq` grows
        by one per message; `ts` never decreases; `good` and `bad` count the parts made since
        the previous message, which all were made in the state that message reported.
        """
        if self._last_sent_ms is None:
            return [self._emit()]
        periodic = self._last_sent_ms + self.interval_ms
        change = min(self._state_until, self._warning_at, self._warning_until)
        now = min(periodic, change)
        self._make_parts(now)
        self.clock_ms = now
        if now >= self._state_until:
            self._change_state(now)
        if now >= self._warning_until:
            self.warning = None
            self._warning_until = _NEVER
        if now >= self._warning_at:
            self.warning = self._rng.choice(WARNING_CODES)
            self._warning_until = now + self._seconds_ms(*_WARNING_DURATION_S)
            self._warning_at = _NEVER
        return [self._emit()]

    # -- internals -----------------------------------------------------------------------------
    def _emit(self) -> dict[str, Any]:
        message = {
            "v": SCHEMA_VERSION,
            "device": self.device,
            "line": self.line,
            "station": self.station,
            "seq": self.seq,
            "ts": self.clock_ms,
            "state": self.state,
            "good": self._good,
            "bad": self._bad,
            "alarms": self.alarms,
        }
        self.seq += 1
        self._last_sent_ms = self.clock_ms
        self._good = self._bad = 0
        return message

    def _make_parts(self, until_ms: int) -> None:
        if self.state != "RUNNING":
            return
        self._part_progress += self.cycle_rate * (until_ms - self.clock_ms) / 1000
        finished = int(self._part_progress)
        self._part_progress -= finished
        for _ in range(finished):
            if self._rng.random() < self.scrap_fraction:
                self._bad += 1
            else:
                self._good += 1

    def _change_state(self, now: int) -> None:
        choices, weights = _NEXT_STATE[self.state]
        self.state = self._rng.choices(choices, weights)[0]
        self._state_until = now + self._dwell_ms(self.state)
        self.fault = self._rng.choice(FAULT_CODES) if self.state == "DOWN" else None
        self._part_progress = 0.0  # a part being made when the machine stopped is abandoned
        # Warnings belong to RUNNING: one still active ends with it.
        self.warning = None
        self._warning_until = _NEVER
        self._warning_at = self._schedule_warning(now)

    def _schedule_warning(self, now: int) -> int:
        if self.state != "RUNNING":
            return _NEVER
        return now + max(1, round(self._rng.expovariate(1 / _WARNING_MEAN_GAP_S) * 1000))

    def _dwell_ms(self, state: str, fraction: float = 1.0) -> int:
        shortest, longest = _DWELL_S[state]
        return max(1, round(self._rng.uniform(shortest, longest) * fraction * 1000))

    def _seconds_ms(self, shortest: float, longest: float) -> int:
        return max(1, round(self._rng.uniform(shortest, longest) * 1000))


# --- malformed payloads ----------------------------------------------------------------------


def _with(message: dict[str, Any], **changes: Any) -> bytes:
    return encode({**message, **changes})


def _without(message: dict[str, Any], rng: random.Random) -> bytes:
    name = rng.choice(FIELDS)
    return encode({key: value for key, value in message.items() if key != name})


def _truncated(message: dict[str, Any], rng: random.Random) -> bytes:
    # A strict prefix of an object is never JSON. Cutting after "seq" keeps payloads distinct.
    data = encode(message)
    return data[: rng.randrange(max(1, data.find(b',"ts":')), len(data))]


def _not_utf8(message: dict[str, Any], rng: random.Random) -> bytes:
    data = encode(message)
    cut = rng.randrange(1, len(data))
    return data[:cut] + b"\xff" + data[cut:]


Malformation = Callable[[dict[str, Any], random.Random], bytes]

MALFORMATIONS: Final[dict[str, Malformation]] = {
    "truncated": _truncated,
    "not UTF-8": _not_utf8,
    "not an object": lambda m, rng: encode([m]),
    "missing field": _without,
    "seq as boolean": lambda m, rng: _with(m, seq=True),
    "count as string": lambda m, rng: _with(m, good=str(m["good"])),
    "negative count": lambda m, rng: _with(m, bad=-1 - m["bad"]),
    "unknown state": lambda m, rng: _with(m, state=m["state"].lower()),
    "unsupported version": lambda m, rng: _with(m, v=SCHEMA_VERSION + 1),
    "ts in seconds": lambda m, rng: _with(m, ts=m["ts"] // 1000),
    "empty device": lambda m, rng: _with(m, device=""),
    "alarms not an array": lambda m, rng: _with(m, alarms=",".join(m["alarms"])),
}
"""Ways a faulty device firmware breaks a message, by name: each turns a valid message into a
payload `validate` rejects (for exercising the quarantine)."""


def malformed_payload(message: dict[str, Any], rng: random.Random) -> bytes:
    """A malformed payload made from `message` by one of `MALFORMATIONS`, chosen with `rng`.

    It still carries the message's device, seq and ts where the malformation leaves them, so
    two malformed payloads of one device differ.
    """
    return MALFORMATIONS[rng.choice(list(MALFORMATIONS))](message, rng)
