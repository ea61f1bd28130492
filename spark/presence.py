"""A device's disconnects, read from the broker's `$SYS` client events, as OFFLINE samples.

With `client_events` on (the default), a node stores a JSON event on
`$SYS/brokers/<node>/clients/<ClientId>/disconnected` whenever a client's connection ends,
however it ended (DISCONNECT, a lost network, a missed keepalive, a kick); a session taken over
by a new connection of the same ClientId is not a disconnect and has no event. When devices
connect under ClientIds derived from their device ids (`DeviceClientIds`, e.g. `{device}` or
`sim-{device}`), such an event says when the broker lost the device: from then until its next
report its state is OFFLINE, not the last one it reported. Silence without an event (the
broker has not noticed yet) still counts as the last state.

Pure: the Spark job's parser (`spark.tables.parse`) calls `disconnect_of` per stored message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Final

from spark.telemetry import TS_MAX, TS_MIN

OFFLINE: Final = "OFFLINE"
"""The state of a device between its disconnect and its next report."""
PRESENCE_FILTER: Final = "$SYS/brokers/+/clients/+/disconnected"
"""Where the nodes store disconnect events (bridge/operations/systopics.py)."""
PLACEHOLDER: Final = "{device}"


@dataclass(frozen=True, slots=True)
class DeviceClientIds:
    """How devices' ClientIds are made from their device ids: `pattern` holds `{device}` once,
    with any fixed text around it (`{device}`, `sim-{device}`, `plant1/{device}`)."""

    pattern: str

    def __post_init__(self) -> None:
        if self.pattern.count(PLACEHOLDER) != 1:
            raise ValueError(
                f"device ClientId pattern {self.pattern!r}: expected {PLACEHOLDER} exactly once"
            )

    def device_of(self, client_id: str) -> str | None:
        """The device id a ClientId of this pattern names, or None for another client's."""
        prefix, _, suffix = self.pattern.partition(PLACEHOLDER)
        if len(client_id) <= len(prefix) + len(suffix):
            return None
        if not (client_id.startswith(prefix) and client_id.endswith(suffix)):
            return None
        return client_id[len(prefix) : len(client_id) - len(suffix)]


def disconnect_of(topic: str, payload: bytes, ids: DeviceClientIds) -> tuple[str, int] | None:
    """(device, when in epoch ms) of a stored disconnect event of a device's connection; None for
    any other message, another client's event, or an event without a usable time."""
    levels = topic.split("/")
    if len(levels) != 6 or (levels[0], levels[1], levels[3], levels[5]) != (
        "$SYS", "brokers", "clients", "disconnected"
    ):  # fmt: skip
        return None
    try:
        event = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(event, dict):
        return None
    client_id, ts = event.get("clientid"), event.get("ts")
    if not isinstance(client_id, str) or type(ts) is not int or not TS_MIN <= ts < TS_MAX:
        return None
    device = ids.device_of(client_id)
    return None if device is None else (device, ts)
