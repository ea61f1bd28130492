"""One simulated device's MQTT connection(s): the client side of `python -m spark.simulate`.

`DeviceLink` owns a device's MQTT state across its connections: messages waiting to be sent,
QoS 1 messages in flight (at most `max_inflight`, acknowledged only by their PUBACK), packet
ids, and a supervisor task that reconnects with backoff and resends what was unacknowledged,
with DUP set. `_Wire` is the `asyncio.Protocol` of one connection, feeding our sans-IO codec.

This is the lower layer: `spark.simulate` (the scheduler and the command line) imports it, never
the other way round. What a link needs of the run's options comes in as `LinkSettings`, and the
live counts it shares with the scheduler as `Counters`, both defined here.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Final, cast

from bridge.mqtt import codec
from bridge.mqtt.errors import MQTTProtocolError
from bridge.mqtt.packets import Connack, ConnackCode, Connect, Disconnect, Pingreq, Puback

MAX_PENDING: Final = 10_000
"""Messages one device buffers while it cannot send; beyond that the scheduler waits for it."""
ACK_TIMEOUT: Final = 30.0
"""Seconds without the PUBACK of the oldest message in flight before the connection counts as
dead and is replaced (a half-open TCP connection never reports itself)."""
BACKOFF_FIRST: Final = 0.1
BACKOFF_MAX: Final = 5.0
CLOSE_TIMEOUT: Final = 5.0
"""Seconds a connection has to flush and close at the end before it is aborted."""


class SimulatorError(Exception):
    """The run cannot start (the broker cannot be reached or refuses us); `str` is one line."""


@dataclass(frozen=True, slots=True)
class LinkSettings:
    """What every link of a run needs to know: where the broker is and how to talk to it.

    The scheduler (`spark.simulate.Simulator`) makes one from its `Options`; the link owns only
    these few values, so it does not depend on the simulator's options or command line."""

    host: str
    port: int
    qos: int
    max_inflight: int
    """QoS 1 messages one device may have unacknowledged at a time."""
    keepalive: int
    """Seconds of the MQTT keepalive sent in CONNECT."""
    connect_timeout: float
    """Seconds for TCP connect, and again for the CONNACK."""


@dataclass(slots=True)
class Counters:
    """The live counts of a run, shared by the scheduler (which makes messages and reads the
    counts for its progress and summary) and every link (which sends and acknowledges them)."""

    qos: int
    made: int = 0
    sent: int = 0
    acked: int = 0
    malformed: int = 0
    reconnects: int = 0
    errors: int = 0
    in_flight: int = 0
    resent: int = 0
    latest_ts: int = 0
    publishing_done: bool = False
    all_done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def done(self) -> int:
        """Messages finished with: acknowledged (QoS 1) or written (QoS 0)."""
        return self.acked if self.qos else self.sent

    def settle(self) -> None:
        """Called when a message is finished with: wakes the final drain when it was the last."""
        if self.publishing_done and self.done >= self.made:
            self.all_done.set()


def describe_failure(exc: BaseException) -> str:
    """A connection failure in a few words ("Connection refused", "timed out"), for the one-line
    error a run reports when its first device cannot connect."""
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, SimulatorError):
        return str(exc)
    errno = getattr(exc, "errno", None)
    if errno is None:
        # A host name with several addresses fails with "Multiple exceptions: [Errno 111] ...".
        found = re.search(r"\[Errno (\d+)\]", str(exc))
        errno = int(found.group(1)) if found else None
    if isinstance(errno, int) and errno > 0:
        return os.strerror(errno)
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


class _Wire(asyncio.Protocol):
    """One TCP connection of a device: bytes in, decoded packets out to its link."""

    def __init__(self, link: DeviceLink) -> None:
        self.link = link
        self.decoder = codec.Decoder()
        self.transport: asyncio.Transport | None = None
        loop = asyncio.get_running_loop()
        self.connack: asyncio.Future[Connack] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self.paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self.link.wires.add(self)

    def data_received(self, data: bytes) -> None:
        self.decoder.feed(data)
        try:
            packets = self.decoder.packets()
        except MQTTProtocolError as exc:
            self.link.protocol_error(self, exc)
            packets = exc.packets
        for packet in packets:
            self.link.packet_received(self, packet)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.connack.done():
            self.connack.set_exception(ConnectionError("connection closed before CONNACK"))
        self.closed.set_result(None)
        self.link.wires.discard(self)
        self.link.connection_lost(self)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.link.pump()


class DeviceLink:
    """One device's MQTT client state across connections; see the module docstring."""

    def __init__(
        self,
        client_id: str,
        topic: str,
        settings: LinkSettings,
        counters: Counters,
        gate: asyncio.Semaphore,
    ) -> None:
        self.client_id = client_id
        self.topic = topic
        self.settings = settings
        self.counters = counters
        self.gate = gate
        self.pending: deque[tuple[bytes, bool]] = deque()  # (payload, malformed), not yet sent
        self.inflight: dict[int, tuple[bytes, float]] = {}  # packet id -> (payload, sent at)
        self.room = asyncio.Event()
        self.room.set()
        self.wire: _Wire | None = None  # the connection, once its CONNACK accepted us
        self.wires: set[_Wire] = set()  # every connection not closed yet, accepted or not
        self.last_write = 0.0
        self.closing = False
        self._lost = asyncio.Event()
        self._next_id = 1
        self._connections = 0
        self._loop = asyncio.get_running_loop()

    # -- sending -----------------------------------------------------------------------------
    def submit(self, payload: bytes, malformed: bool) -> None:
        """Queue one new message and send what the in-flight window allows."""
        self.pending.append((payload, malformed))
        if len(self.pending) >= MAX_PENDING:
            self.room.clear()
        self.pump()

    def pump(self) -> None:
        """Send pending messages while connected, writable and under the in-flight limit."""
        wire = self.wire
        if wire is None or wire.transport is None:
            return
        qos = self.settings.qos
        counters = self.counters
        now = self._loop.time()
        while self.pending and not wire.paused:
            if qos and len(self.inflight) >= self.settings.max_inflight:
                break
            payload, malformed = self.pending.popleft()
            packet_id = None
            if qos:
                packet_id = self._take_packet_id()
                self.inflight[packet_id] = (payload, now)
                counters.in_flight += 1
            wire.transport.write(
                codec.encode_publish(self.topic, payload, qos, False, False, packet_id)
            )
            self.last_write = now
            counters.sent += 1
            counters.malformed += malformed
            if not qos:
                counters.settle()
        if len(self.pending) < MAX_PENDING // 2:
            self.room.set()

    def _take_packet_id(self) -> int:
        while self._next_id in self.inflight:
            self._next_id = self._next_id % 0xFFFF + 1
        packet_id = self._next_id
        self._next_id = self._next_id % 0xFFFF + 1
        return packet_id

    def ping_if_idle(self, now: float) -> None:
        """Keepalive: a PINGREQ when nothing was written for half the keepalive; replace the
        connection when the oldest message in flight waited ACK_TIMEOUT for its PUBACK."""
        wire = self.wire
        if wire is None or wire.transport is None:
            return
        if self.inflight and now - next(iter(self.inflight.values()))[1] > ACK_TIMEOUT:
            wire.transport.abort()  # counted as an error when it is lost
            return
        if now - self.last_write > self.settings.keepalive / 2:
            wire.transport.write(codec.encode(Pingreq()))
            self.last_write = now

    # -- events from the wire ------------------------------------------------------------------
    def packet_received(self, wire: _Wire, packet: Any) -> None:
        if isinstance(packet, Puback):
            if wire is self.wire and self.inflight.pop(packet.packet_id, None) is not None:
                self.counters.acked += 1
                self.counters.in_flight -= 1
                self.counters.settle()
                self.pump()
        elif isinstance(packet, Connack) and not wire.connack.done():
            wire.connack.set_result(packet)

    def protocol_error(self, wire: _Wire, exc: MQTTProtocolError) -> None:
        """The broker sent something our codec refuses: drop that connection (counted as an
        error when it is lost) and reconnect."""
        if wire.transport is not None:
            wire.transport.abort()

    def connection_lost(self, wire: _Wire) -> None:
        if wire is self.wire:
            self.wire = None
            if not self.closing:
                self.counters.errors += 1
            self._lost.set()

    # -- connecting ----------------------------------------------------------------------------
    async def connect(self) -> None:
        """One connection attempt: TCP, CONNECT, CONNACK; then resend what is unacknowledged
        (DUP set) and go on sending. Raises OSError, TimeoutError or SimulatorError (refused)."""
        settings = self.settings
        timeout = settings.connect_timeout
        _, wire = await asyncio.wait_for(
            self._loop.create_connection(lambda: _Wire(self), settings.host, settings.port),
            timeout,
        )
        assert wire.transport is not None
        try:
            connect = Connect(self.client_id, clean_session=True, keepalive=settings.keepalive)
            wire.transport.write(codec.encode(connect))
            connack = await asyncio.wait_for(wire.connack, timeout)
            if connack.return_code != ConnackCode.ACCEPTED:
                raise SimulatorError(_refusal(connack.return_code))
            if self.closing:
                raise ConnectionError("the run ended while connecting")
        except BaseException:
            wire.transport.abort()
            raise
        self._connections += 1
        if self._connections > 1:
            self.counters.reconnects += 1
        self._lost.clear()
        self.wire = wire
        now = self.last_write = self._loop.time()
        for packet_id, (payload, _) in list(self.inflight.items()):
            self.inflight[packet_id] = (payload, now)
            wire.transport.write(
                codec.encode_publish(self.topic, payload, 1, False, True, packet_id)
            )
            self.counters.resent += 1
        self.pump()

    async def supervise(self) -> None:
        """Keep the device connected until `close`: reconnect with backoff after every loss."""
        backoff = BACKOFF_FIRST
        jitter = random.Random(self.client_id)
        while not self.closing:
            if self.wire is None:
                try:
                    async with self.gate:
                        await self.connect()
                except (OSError, TimeoutError, SimulatorError, ConnectionError):
                    self.counters.errors += 1
                    await asyncio.sleep(backoff * (0.5 + jitter.random()))
                    backoff = min(backoff * 2, BACKOFF_MAX)
                    continue
                backoff = BACKOFF_FIRST
            await self._lost.wait()

    async def close(self) -> None:
        """DISCONNECT and close the connection (after what is buffered for it); return once every
        connection of this device is closed."""
        self.closing = True
        self._lost.set()
        wire = self.wire
        if wire is not None and wire.transport is not None:
            wire.transport.write(codec.encode(Disconnect()))
            wire.transport.close()
        wires = list(self.wires)
        if wires:
            _, late = await asyncio.wait([w.closed for w in wires], timeout=CLOSE_TIMEOUT)
            for w in wires:
                if not w.closed.done() and w.transport is not None:
                    w.transport.abort()
            if late:
                await asyncio.wait(late, timeout=1.0)


def _refusal(code: int) -> str:
    try:
        name = ConnackCode(code).name.lower().replace("_", " ")
    except ValueError:
        name = "unknown code"
    return f"refused with CONNACK {code} ({name})"
