"""Test clients: a raw packet-level client (exact bytes and flags) and paho-mqtt helpers."""

from __future__ import annotations

import queue
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from bridge.mqtt import codec
from bridge.mqtt.codec import Decoder
from bridge.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Subscribe,
    Subscription,
    Will,
)

OPEN_RAW_CLIENTS: list[RawClient] = []


def close_all_raw_clients() -> None:
    """Close every RawClient a test opened (called by an autouse fixture)."""
    while OPEN_RAW_CLIENTS:
        OPEN_RAW_CLIENTS.pop().close()


class RawClient:
    """A blocking MQTT client that sends exactly the packets (or bytes) a test gives it."""

    def __init__(self, port: int, timeout: float = 5.0, host: str = "127.0.0.1") -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        OPEN_RAW_CLIENTS.append(self)
        self.decoder = Decoder()
        self.timeout = timeout
        self._packets: list[Any] = []

    def send(self, packet: Any) -> None:
        self.sock.sendall(codec.encode(packet))

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, timeout: float | None = None) -> Any:
        """The next packet from the server; raises TimeoutError or ConnectionError."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while not self._packets:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no packet from the server")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                raise TimeoutError("no packet from the server") from None
            if not data:
                raise ConnectionError("server closed the connection")
            self.decoder.feed(data)
            self._packets.extend(self.decoder.packets())
        return self._packets.pop(0)

    def expect_closed(self, timeout: float = 5.0) -> None:
        """Assert the server closes the connection (packets before the close are discarded)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.recv(deadline - time.monotonic())
            except ConnectionError:
                return
            except TimeoutError:
                break
        raise AssertionError("server did not close the connection")

    def connect(
        self,
        client_id: str,
        clean_session: bool = True,
        keepalive: int = 60,
        will: Will | None = None,
    ) -> Connack:
        self.send(Connect(client_id, clean_session, keepalive, will=will))
        connack = self.recv()
        assert isinstance(connack, Connack), connack
        return connack

    def subscribe(self, topic_filter: str, qos: int, packet_id: int = 1) -> list[int]:
        self.send(Subscribe(packet_id, [Subscription(topic_filter, qos)]))
        suback = self.recv()
        return list(suback.return_codes)

    def publish(
        self,
        topic: str,
        payload: bytes,
        qos: int = 0,
        packet_id: int | None = None,
        retain: bool = False,
    ) -> None:
        """Publish and complete the handshake for QoS 1/2."""
        self.send(Publish(topic, payload, qos, retain, packet_id=packet_id if qos else None))
        if qos == 1:
            ack = self.recv()
            assert isinstance(ack, Puback) and ack.packet_id == packet_id, ack
        elif qos == 2:
            rec = self.recv()
            assert isinstance(rec, Pubrec) and rec.packet_id == packet_id, rec
            self.send(Pubrel(packet_id or 0))
            comp = self.recv()
            assert isinstance(comp, Pubcomp) and comp.packet_id == packet_id, comp

    def disconnect(self) -> None:
        try:
            self.send(Disconnect())
        finally:
            self.close()

    def close(self) -> None:
        with suppress(OSError):
            self.sock.close()


@dataclass
class PahoClient:
    """A paho-mqtt client running its network loop in a thread, collecting messages."""

    client: paho.Client
    messages: queue.Queue[paho.MQTTMessage] = field(default_factory=queue.Queue)
    connected: threading.Event = field(default_factory=threading.Event)
    connack_rc: list[Any] = field(default_factory=list)

    def get(self, timeout: float = 5.0) -> paho.MQTTMessage:
        return self.messages.get(timeout=timeout)

    def drain(self, count: int, timeout: float = 10.0) -> list[paho.MQTTMessage]:
        deadline = time.monotonic() + timeout
        out = []
        while len(out) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                out.append(self.messages.get(timeout=remaining))
            except queue.Empty:
                break
        return out


@contextmanager
def paho_client(
    port: int,
    client_id: str | None = None,
    clean_session: bool = True,
    keepalive: int = 30,
    will: tuple[str, bytes, int, bool] | None = None,
) -> Iterator[PahoClient]:
    """A connected paho client (MQTT 3.1.1); disconnected and its thread stopped on exit."""
    client = paho.Client(
        CallbackAPIVersion.VERSION2,
        client_id=client_id or f"paho-{uuid.uuid4().hex[:10]}",
        clean_session=clean_session,
        protocol=paho.MQTTv311,
    )
    wrapper = PahoClient(client)

    def on_connect(_c: Any, _u: Any, _flags: Any, rc: Any, _p: Any) -> None:
        wrapper.connack_rc.append(rc)
        wrapper.connected.set()

    client.on_connect = on_connect
    client.on_message = lambda _c, _u, msg: wrapper.messages.put(msg)
    if will is not None:
        client.will_set(will[0], will[1], will[2], will[3])
    client.connect("127.0.0.1", port, keepalive)
    client.loop_start()
    try:
        assert wrapper.connected.wait(10), "paho client did not connect"
        yield wrapper
    finally:
        try:
            client.disconnect()
        finally:
            stop_paho(client)


def stop_paho(client: paho.Client) -> None:
    """Stop a paho client's network thread and close the socket pair paho opened for it.

    Paho closes that pair only in its finaliser. A client caught in a reference cycle (its
    callbacks refer back to it) is finalised by the garbage collector, in any order, so the
    pair's own finaliser may run first and warn "unclosed socket" in whichever later test
    happens to collect it."""
    client.loop_stop()
    client._reset_sockets(sockpair_only=True)
