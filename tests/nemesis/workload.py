"""The nemesis clients: they behave as the spec asks of a client through every fault and write
what they saw to one `History`.

- `Publisher`: numbered QoS 1 or QoS 2 messages to a topic of its own, through the balancer, a
  few in flight, at a bounded rate; after a lost connection it resumes its persistent session
  and resends what was not acknowledged (DUP=1) and the PUBRELs not completed.
- `Subscriber`: a persistent QoS 2 subscription to every publisher's topic; QoS 2 packet ids are
  kept from PUBLISH to PUBREL across connections (the spec's "method B"), so a resend is not a
  new delivery. A roaming subscriber now and then connects again straight to a random node
  while its old connection is still open (a take-over) and asks on the old connection: a server
  that still answers there serves the ClientId twice.
- `WillClient`: connects once with a QoS 2 will and pings; `abandon()` drops the socket without
  DISCONNECT as a device that dies; a connection the network took is never resumed either.
- `WillWatcher`: receives the wills (a `Subscriber` on the will topics).

A connection is judged dead when a PINGREQ has had no answer for `SILENCE` seconds (any other
request: `ACK_PATIENCE`); clients then connect again, as devices do after their keep-alive.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

from bridge.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
    Will,
)
from tests.support.clients import RawClient

from .history import History

Address = tuple[str, int]

KEEPALIVE = 4
"""Seconds: the server drops a client silent for 1.5 times this (and publishes its will)."""
SILENCE = 4.0
"""Seconds a PINGREQ may go unanswered before the client gives the connection up (as clients'
keep-alive does: a server that answers pings is alive, however long a PUBACK takes)."""
ACK_PATIENCE = 30.0
"""Seconds any other request may go unanswered on a connection whose pings are answered."""
PING_EVERY = 1.0
RECONNECT_PAUSE = 0.3


class Dead(ConnectionError):
    """The client gave a connection up (`SILENCE`, `ACK_PATIENCE`)."""


class Link:
    """One connection of a client, recorded in the history."""

    def __init__(self, history: History, client_id: str, instance: str, address: Address) -> None:
        self.history = history
        self.index = history.opened(client_id, instance, time.monotonic())
        self.client = RawClient(address[1], timeout=SILENCE, host=address[0])
        self.pending: dict[object, float] = {}  # request key -> when sent (oldest first)
        self.last_received = time.monotonic()

    def connect(self, client_id: str, will: Will | None = None) -> bool:
        """CONNECT with a persistent session; the session-present flag."""
        self.client.send(Connect(client_id, False, KEEPALIVE, will=will))
        connack = self.client.recv(SILENCE)
        if not isinstance(connack, Connack) or connack.return_code:
            raise ConnectionError(f"refused: {connack}")
        self.history.connacked(self.index, connack.session_present, time.monotonic())
        return connack.session_present

    def request(self, key: object, packet: object) -> None:
        """Send a packet the server must answer; `key` names the answer."""
        self.pending.setdefault(key, time.monotonic())
        self.client.send(packet)

    def answered(self, key: object) -> float | None:
        """The answer for `key` arrived: when its request was sent (None if not pending)."""
        sent = self.pending.pop(key, None)
        if sent is not None:
            self.history.answered(self.index, sent, time.monotonic())
        return sent

    def poll(self, timeout: float = 0.2) -> object | None:
        """The next packet, or None; pings when nothing came for a while; raises Dead when a
        ping (or, after `ACK_PATIENCE`, any request) has no answer."""
        now = time.monotonic()
        ping = self.pending.get("ping")
        if ping is not None and now - ping > SILENCE:
            raise Dead("no PINGRESP")
        if self.pending and now - min(self.pending.values()) > ACK_PATIENCE:
            raise Dead("a request unanswered")
        if ping is None and now - self.last_received > PING_EVERY:
            self.request("ping", Pingreq())
        try:
            packet: object = self.client.recv(timeout)
        except TimeoutError:
            return None
        self.last_received = time.monotonic()
        if isinstance(packet, Pingresp):
            self.answered("ping")
            return None
        return packet

    def close(self, clean: bool = False) -> None:
        if clean:
            try:
                self.client.send(Disconnect())
            except OSError:
                clean = False
        self.client.close()
        self.history.closed(self.index, time.monotonic(), clean)


class Client(threading.Thread):
    """A client thread: `_session` runs one connection; reconnects until done or `deadline`."""

    def __init__(self, history: History, client_id: str, address: Callable[[], Address]) -> None:
        super().__init__(name=client_id, daemon=True)
        self.history = history
        self.client_id = client_id
        self.address = address
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.deadline = float("inf")
        self.sessions = 0

    def finish(self, within: float) -> None:
        """Stop: complete what is in flight, disconnect, end within `within` seconds."""
        self.deadline = time.monotonic() + within
        self.stop.set()

    def run(self) -> None:
        try:
            while time.monotonic() < self.deadline:
                link = None
                try:
                    link = Link(self.history, self.client_id, self.name, self.address())
                    self.sessions += 1
                    if self._session(link):
                        return
                except (ConnectionError, OSError, TimeoutError):
                    pass
                finally:
                    if link is not None:
                        link.close()
                time.sleep(RECONNECT_PAUSE)
            raise AssertionError(f"{self.name}: not finished by its deadline: {self._left()}")
        except BaseException as exc:
            self.error = exc

    def _session(self, link: Link) -> bool:
        raise NotImplementedError

    def _left(self) -> str:
        return ""


class Publisher(Client):
    def __init__(
        self,
        history: History,
        client_id: str,
        address: Callable[[], Address],
        qos: int,
        rate: float = 40.0,
        window: int = 4,
    ) -> None:
        super().__init__(history, client_id, address)
        self.qos = qos
        self.topic = f"nem/{client_id}"
        self.interval = 1.0 / rate
        self.window = window
        self.next_index = 0
        self.unreceived: dict[int, str] = {}  # packet id -> payload: no PUBACK/PUBREC yet
        self.unreleased: dict[int, str] = {}  # QoS 2: PUBREC'd, no PUBCOMP yet

    def _left(self) -> str:
        return f"{len(self.unreceived)} unacknowledged, {len(self.unreleased)} unreleased"

    def _send(self, link: Link, packet_id: int, payload: str, dup: bool) -> None:
        self.history.published(payload, self.client_id, self.qos, link.index, time.monotonic())
        link.request(
            ("ack", packet_id),
            Publish(self.topic, payload.encode(), self.qos, dup=dup, packet_id=packet_id),
        )

    def _session(self, link: Link) -> bool:
        link.connect(self.client_id)
        for packet_id, payload in self.unreceived.items():
            self._send(link, packet_id, payload, dup=True)
        for packet_id in self.unreleased:
            link.request(("comp", packet_id), Pubrel(packet_id))
        next_at = time.monotonic()
        while True:
            open_handshakes = len(self.unreceived) + len(self.unreleased)
            if self.stop.is_set():
                if not open_handshakes:
                    link.close(clean=True)
                    return True
            elif open_handshakes < self.window and time.monotonic() >= next_at:
                payload = f"{self.client_id}-{self.next_index}"
                packet_id = self.next_index % 60000 + 1
                self.next_index += 1
                self.unreceived[packet_id] = payload
                self._send(link, packet_id, payload, dup=False)
                next_at = max(next_at + self.interval, time.monotonic() - 1.0)
                continue
            packet = link.poll(0.05)
            packet_id = getattr(packet, "packet_id", None) or 0
            if isinstance(packet, (Puback, Pubrec)) and packet_id in self.unreceived:
                link.answered(("ack", packet_id))
                payload = self.unreceived.pop(packet_id)
                self.history.acknowledged(payload, time.monotonic())
                if isinstance(packet, Pubrec):
                    self.unreleased[packet_id] = payload
                    link.request(("comp", packet_id), Pubrel(packet_id))
            elif isinstance(packet, Pubrec) and packet_id in self.unreleased:
                link.request(("comp", packet_id), Pubrel(packet_id))  # a PUBREC again
            elif isinstance(packet, Pubcomp) and packet_id in self.unreleased:
                link.answered(("comp", packet_id))
                del self.unreleased[packet_id]


class Subscriber(Client):
    """With `nodes`, it roams: every few seconds (random, from `rng`) it takes its session over
    through one of `nodes`, straight to the node, while the old connection is open. `record`
    is told of each new delivery (default: the history's deliveries to this subscriber)."""

    def __init__(
        self,
        history: History,
        client_id: str,
        address: Callable[[], Address],
        topic_filter: str,
        nodes: list[Address] | None = None,
        rng: random.Random | None = None,
        record: Callable[[str, int], None] | None = None,
    ) -> None:
        super().__init__(history, client_id, address)
        self.topic_filter = topic_filter
        self.record = record or (
            lambda payload, connection: history.delivered(
                client_id, payload, connection, time.monotonic()
            )
        )
        self.nodes = nodes or []
        self.rng = rng or random.Random(0)
        self.awaiting_pubrel: set[int] = set()
        self.subscribed = threading.Event()
        self.roamed = 0

    def _session(self, link: Link) -> bool:
        link.connect(self.client_id)
        if not self.subscribed.is_set():
            link.request("suback", Subscribe(1, [Subscription(self.topic_filter, 2)]))
        roam_at = time.monotonic() + self.rng.uniform(2, 6)
        while True:
            if self.stop.is_set() and not link.pending and not self.awaiting_pubrel:
                link.close(clean=True)
                return True
            if self.nodes and not self.stop.is_set() and time.monotonic() > roam_at:
                link = self._take_over(link)
                roam_at = time.monotonic() + self.rng.uniform(2, 6)
            packet = link.poll()
            if packet is not None:
                self._handle(link, packet)

    def _handle(self, link: Link, packet: object, old: bool = False) -> None:
        if isinstance(packet, Suback):
            if link.answered("suback") is not None:
                assert list(packet.return_codes) == [2], packet
                self.subscribed.set()
        elif isinstance(packet, Publish):
            payload = packet.payload.decode()
            packet_id = packet.packet_id or 0
            new = packet.qos < 2 or packet_id not in self.awaiting_pubrel
            if new:
                self.record(payload, link.index)
                if old:  # the server sent it here after the take-over: answered a request
                    record = self.history.sent.get(payload)
                    if record is not None:
                        self.history.answered(link.index, record.sent, time.monotonic())
            if packet.qos == 1:
                link.client.send(Puback(packet_id))
            elif packet.qos == 2:
                self.awaiting_pubrel.add(packet_id)
                link.client.send(Pubrec(packet_id))
        elif isinstance(packet, Pubrel):
            self.awaiting_pubrel.discard(packet.packet_id)
            link.client.send(Pubcomp(packet.packet_id))

    def _take_over(self, old: Link) -> Link:
        """Connect again through a random node with the old connection still open; ask the old
        connection once more; keep what it still delivers; then drop it."""
        try:
            new = Link(
                self.history, self.client_id, f"{self.name}/roam", self.rng.choice(self.nodes)
            )
        except OSError:
            return old  # that node is cut off: stay
        try:
            new.connect(self.client_id)
        except (ConnectionError, OSError, TimeoutError):
            new.close()
            return old
        self.roamed += 1
        try:
            time.sleep(0.05)  # the ping goes out after the CONNACK, on the client's clock too
            old.request("ping", Pingreq())
            end = time.monotonic() + 1.0
            while time.monotonic() < end:
                try:
                    packet = old.client.recv(0.2)
                except TimeoutError:
                    continue
                if isinstance(packet, Pingresp):
                    old.answered("ping")
                else:
                    self._handle(old, packet, old=True)
        except (ConnectionError, OSError):
            pass
        old.close()
        return new


class WillClient(Client):
    """Connects once with a QoS 2 will on `nemwill/<id>` and keeps the connection alive."""

    def __init__(self, history: History, client_id: str, address: Callable[[], Address]) -> None:
        super().__init__(history, client_id, address)
        self.dropped = threading.Event()
        self.connected = threading.Event()

    def abandon(self) -> None:
        self.dropped.set()

    def run(self) -> None:
        link = None
        try:
            link = Link(self.history, self.client_id, self.name, self.address())
            link.connect(
                self.client_id, Will(f"nemwill/{self.client_id}", self.client_id.encode(), 2)
            )
            self.connected.set()
            while not self.stop.is_set() and not self.dropped.is_set():
                link.poll()
        except (ConnectionError, OSError, TimeoutError):
            pass
        finally:
            if link is not None:
                clean = self.stop.is_set() and not self.dropped.is_set()
                if self.connected.is_set() and not clean:
                    self.history.abandon(self.client_id)
                link.close(clean=clean)
