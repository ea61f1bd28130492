"""A test subscriber that receives exactly as MQTT requires of a client, counting deliveries.

QoS 2 packet ids are remembered from PUBLISH until PUBREL (the spec's "method B"), so a PUBLISH
resent with the same id is not delivered twice by the client; whatever is counted twice was
sent twice as a new message by the broker. Subclasses may drop the connection at any step of the
handshakes (`drop`) to test what a broker does with clients that vanish mid-way."""

from __future__ import annotations

import time
from collections import Counter

from bridge.mqtt.packets import Puback, Pubcomp, Publish, Pubrec, Pubrel
from tests.support.clients import RawClient


class ExactlyOnceReceiver:
    """A persistent-session subscriber that counts every delivery by payload."""

    def __init__(self, port: int, client_id: str) -> None:
        self.port = port
        self.client_id = client_id
        self.delivered: Counter[str] = Counter()
        self.awaiting_pubrel: set[int] = set()
        self.client: RawClient | None = None

    def connect(self) -> RawClient:
        """(Re)connect with clean session 0; the broker resends what is unacknowledged."""
        if self.client is not None:
            self.client.close()
        self.client = RawClient(self.port)
        self.client.connect(self.client_id, clean_session=False)
        return self.client

    def drop(self, step: str) -> bool:
        """Hook: reconnect and return True to act as a client gone at `step` (`before-puback`,
        `before-pubrec`, `after-pubrec`, `before-pubcomp`). This one never drops."""
        return False

    def handle(self, packet: object) -> None:
        """Act on one packet from the broker as a compliant client would."""
        assert self.client is not None
        if isinstance(packet, Publish):
            packet_id = packet.packet_id or 0
            if packet.qos == 2:
                if packet_id not in self.awaiting_pubrel:
                    self.delivered[packet.payload.decode()] += 1
                    self.awaiting_pubrel.add(packet_id)
                if self.drop("before-pubrec"):
                    return
                self.client.send(Pubrec(packet_id))
                self.drop("after-pubrec")
            else:
                self.delivered[packet.payload.decode()] += 1
                if packet.qos == 1 and not self.drop("before-puback"):
                    self.client.send(Puback(packet_id))
        elif isinstance(packet, Pubrel):
            self.awaiting_pubrel.discard(packet.packet_id)
            if self.drop("before-pubcomp"):
                return  # the broker resends PUBREL; we answer PUBCOMP then
            self.client.send(Pubcomp(packet.packet_id))

    def receive(self, until: int, timeout: float = 10.0, settle: bool = True) -> None:
        """Handle packets until `until` distinct messages arrived and (with `settle`) no QoS 2
        handshake is open, or `timeout` passes. A broken connection raises
        (ConnectionError/OSError). Without `settle` it stops at once, handshakes left open."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.delivered) >= until and (not settle or not self.awaiting_pubrel):
                return
            assert self.client is not None
            try:
                packet = self.client.recv(min(1.0, max(deadline - time.monotonic(), 0.01)))
            except TimeoutError:
                continue
            self.handle(packet)
