"""Load clients for fault tests: QoS 1 and 2 publishers and QoS 1 subscribers that behave as the
spec asks of a client (reconnect with their persistent session, resend what was not
acknowledged with DUP=1) and count everything, so a test can prove nothing acknowledged was lost."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence

from bridge.mqtt.packets import Puback, Pubcomp, Publish, Pubrec, Pubrel
from tests.support.clients import RawClient

RECONNECT_PAUSE = 0.2


def finish(stop: threading.Event, clients: Sequence[ReconnectingClient]) -> None:
    """Stop publishing, wait for every client to finish (all it sent acknowledged), and assert
    that each ended well."""
    stop.set()
    for client in clients:
        client.join(150)
    for client in clients:
        assert client.error is None, f"{client.name}: {client.error!r}"
        assert not client.is_alive(), f"{client.name} did not finish"


class ReconnectingClient(threading.Thread):
    """A client thread that runs `_session` (one connection) until it returns True, reconnecting
    after every lost connection, within `deadline`; `error` holds what ended it badly."""

    deadline: float
    error: BaseException | None

    def run(self) -> None:
        try:
            while True:
                try:
                    if self._session():
                        return
                except (ConnectionError, OSError, TimeoutError):
                    self._lost()
                if time.monotonic() > self.deadline:
                    raise AssertionError(f"{self.name}: {self._unfinished()}")
                time.sleep(RECONNECT_PAUSE)
        except BaseException as exc:
            self.error = exc

    def _session(self) -> bool:
        raise NotImplementedError

    def _lost(self) -> None:
        """A connection was lost."""

    def _unfinished(self) -> str:
        raise NotImplementedError


class Qos1Publisher(ReconnectingClient):
    """Publishes numbered QoS 1 messages continuously, up to `window` unacknowledged, and records
    the time of every PUBACK. When the bridge closes the connection (it does when a message is
    not stored), it reconnects with its persistent session and resends what was not
    acknowledged, with DUP=1. After `stop` it publishes nothing new and finishes when everything
    it published is acknowledged."""

    def __init__(
        self,
        port: int,
        client_id: str,
        stop: threading.Event,
        window: int = 8,
        reply_timeout: float = 9.0,
    ) -> None:
        super().__init__(name=client_id, daemon=True)
        self.reply_timeout = reply_timeout
        self.port = port
        self.client_id = client_id
        self.topic = f"load/{client_id}"
        self.stop_publishing = stop
        self.window = window
        self.next_index = 0
        self.published: set[str] = set()
        self.unacked: dict[int, str] = {}  # packet id -> payload, in send order
        self.acks: list[tuple[float, str]] = []  # (monotonic time, payload) of every PUBACK
        self.closed_at: list[float] = []  # when the bridge closed (or refused) a connection
        self.resent = 0
        self.error: BaseException | None = None
        self.deadline = time.monotonic() + 240

    @property
    def acked(self) -> set[str]:
        return {payload for _, payload in self.acks}

    def _lost(self) -> None:
        self.closed_at.append(time.monotonic())

    def _unfinished(self) -> str:
        return f"{len(self.unacked)} never PUBACKed"

    def _session(self) -> bool:
        """One connection; True once stopped and everything is acknowledged."""
        client = RawClient(self.port, timeout=self.reply_timeout)
        try:
            client.connect(self.client_id, clean_session=False)
            for packet_id, payload in self.unacked.items():
                self.resent += 1
                client.send(Publish(self.topic, payload.encode(), 1, dup=True, packet_id=packet_id))
            while True:
                while not self.stop_publishing.is_set() and len(self.unacked) < self.window:
                    payload = f"{self.client_id}-{self.next_index}"
                    packet_id = self.next_index % 60000 + 1
                    self.next_index += 1
                    self.unacked[packet_id] = payload
                    self.published.add(payload)
                    client.send(Publish(self.topic, payload.encode(), 1, packet_id=packet_id))
                if self.stop_publishing.is_set() and not self.unacked:
                    client.disconnect()
                    return True
                packet = client.recv()
                if isinstance(packet, Puback) and packet.packet_id in self.unacked:
                    self.acks.append((time.monotonic(), self.unacked.pop(packet.packet_id)))
        finally:
            client.close()


class Qos1Subscriber(threading.Thread):
    """A persistent QoS 1 subscriber counting every delivery by payload (reconnects if cut),
    and keeping (topic, payload) of each in arrival order. With `filters` it subscribes to them
    at QoS 1 on its first connection (`ready` is set then); without, it resumes its session."""

    def __init__(self, port: int, client_id: str, filters: Sequence[str] = ()) -> None:
        super().__init__(name=client_id, daemon=True)
        self.port = port
        self.client_id = client_id
        self.filters = list(filters)
        self.delivered: Counter[str] = Counter()
        self.arrived: list[tuple[str, str]] = []
        self.dup_flagged = 0
        self.reconnects = 0
        self.stop = threading.Event()
        self.ready = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            client = None
            try:
                client = RawClient(self.port)
                client.connect(self.client_id, clean_session=False)
                if not self.ready.is_set():
                    for i, topic_filter in enumerate(self.filters):
                        assert client.subscribe(topic_filter, 1, packet_id=i + 1) == [1]
                    self.ready.set()
                while not self.stop.is_set():
                    try:
                        packet = client.recv(0.5)
                    except TimeoutError:
                        continue
                    if isinstance(packet, Publish):
                        self.delivered[packet.payload.decode()] += 1
                        self.arrived.append((packet.topic, packet.payload.decode()))
                        self.dup_flagged += packet.dup
                        if packet.qos == 1:
                            client.send(Puback(packet.packet_id or 0))
            except (ConnectionError, OSError, TimeoutError):
                self.reconnects += 1
                time.sleep(RECONNECT_PAUSE)
            finally:
                if client is not None:
                    client.close()


class Qos2Publisher(ReconnectingClient):
    """Publishes numbered QoS 2 messages to `topic` continuously, up to `window` handshakes
    open. When the bridge closes the connection it reconnects with its persistent session and,
    as the spec requires, resends every PUBLISH not yet PUBRECed (DUP=1) and every PUBREL not
    yet PUBCOMPed. After `stop` it publishes nothing new and finishes when every handshake is
    complete. `recorded` holds the payloads the bridge acknowledged (PUBREC)."""

    def __init__(
        self,
        port: int,
        client_id: str,
        topic: str,
        stop: threading.Event,
        window: int = 4,
        reply_timeout: float = 9.0,
    ) -> None:
        super().__init__(name=client_id, daemon=True)
        self.port = port
        self.client_id = client_id
        self.topic = topic
        self.stop_publishing = stop
        self.window = window
        self.reply_timeout = reply_timeout
        self.next_index = 0
        self.published: set[str] = set()
        self.unreceived: dict[int, str] = {}  # packet id -> payload: PUBLISH sent, no PUBREC
        self.unreleased: dict[int, str] = {}  # PUBREC received, no PUBCOMP yet
        self.recorded: set[str] = set()
        self.completed: set[str] = set()
        self.closed_at: list[float] = []
        self.error: BaseException | None = None
        self.deadline = time.monotonic() + 300

    def _lost(self) -> None:
        self.closed_at.append(time.monotonic())

    def _unfinished(self) -> str:
        return f"{len(self.unreceived)} never PUBRECed, {len(self.unreleased)} never PUBCOMPed"

    def _session(self) -> bool:
        client = RawClient(self.port, timeout=self.reply_timeout)
        try:
            client.connect(self.client_id, clean_session=False)
            for packet_id, payload in self.unreceived.items():
                client.send(Publish(self.topic, payload.encode(), 2, dup=True, packet_id=packet_id))
            for packet_id in self.unreleased:
                client.send(Pubrel(packet_id))
            while True:
                while (
                    not self.stop_publishing.is_set()
                    and len(self.unreceived) + len(self.unreleased) < self.window
                ):
                    payload = f"{self.client_id}-{self.next_index}"
                    packet_id = self.next_index % 60000 + 1
                    self.next_index += 1
                    self.unreceived[packet_id] = payload
                    self.published.add(payload)
                    client.send(Publish(self.topic, payload.encode(), 2, packet_id=packet_id))
                if self.stop_publishing.is_set() and not self.unreceived and not self.unreleased:
                    client.disconnect()
                    return True
                packet = client.recv()
                packet_id = getattr(packet, "packet_id", None) or 0
                if isinstance(packet, Pubrec):
                    if packet_id in self.unreceived:
                        payload = self.unreceived.pop(packet_id)
                        self.unreleased[packet_id] = payload
                        self.recorded.add(payload)
                    if packet_id in self.unreleased:
                        client.send(Pubrel(packet_id))
                elif isinstance(packet, Pubcomp) and packet_id in self.unreleased:
                    self.completed.add(self.unreleased.pop(packet_id))
        finally:
            client.close()
