"""MQTT 5.0 test clients: paho-mqtt 2.x as a v5 client (`paho5`), Debian's mosquitto_sub /
mosquitto_pub with `-V 5` (`mosquitto_pub`, `MosquittoSub`), and `RawClient5`, a packet-level
v5 client on the repo's codec for what a real client will not send (a bad Topic Alias, a
duplicate property, more unacknowledged messages than the server allows) or will not show (the
reason code of a PUBREC, a topic sent as an alias).

Every client a test opens here is closed when the test ends: RawClient5 through the autouse
fixture of tests/conftest.py, paho clients and mosquitto_sub processes by their context managers.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from paho.mqtt.reasoncodes import ReasonCode as PahoReasonCode

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
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
)
from bridge.mqtt.properties import PropertyId
from tests.support.clients import RawClient, stop_paho
from tests.support.processes import BridgeProcess

P = PropertyId


# -- the raw v5 client ---------------------------------------------------------------------------


class RawClient5(RawClient):
    """A RawClient that speaks MQTT 5.0: packets are encoded at level 5 and read with a
    client-side 5.0 decoder (a server's PUBLISH may carry Subscription Identifiers)."""

    def __init__(self, port: int, timeout: float = 5.0) -> None:
        super().__init__(port, timeout)
        self.decoder = Decoder(from_server=True)
        self.decoder.protocol_level = 5

    def send(self, packet: Any) -> None:
        self.sock.sendall(codec.encode(packet, 5))

    def connect(
        self,
        client_id: str,
        clean_session: bool = True,
        keepalive: int = 60,
        will: Will | None = None,
        *,
        properties: dict[int, Any] | None = None,
        username: str | None = None,
        password: bytes | None = None,
    ) -> Connack:
        """CONNECT at 5.0 (`clean_session` is Clean Start) and return the CONNACK."""
        self.send(
            Connect(
                client_id,
                clean_session,
                keepalive,
                username=username,
                password=password,
                will=will,
                protocol_level=5,
                properties=properties or {},
            )
        )
        connack = self.recv()
        assert isinstance(connack, Connack), connack
        return connack

    def subscribe_many(
        self,
        *subscriptions: Subscription,
        packet_id: int = 1,
        properties: dict[int, Any] | None = None,
    ) -> list[int]:
        """SUBSCRIBE with 5.0 options; the SUBACK's reason codes."""
        self.send(Subscribe(packet_id, list(subscriptions), properties or {}))
        suback = self.recv()
        assert isinstance(suback, Suback) and suback.packet_id == packet_id, suback
        return list(suback.return_codes)

    def unsubscribe(self, *topic_filters: str, packet_id: int = 1) -> list[int]:
        """UNSUBSCRIBE; the UNSUBACK's reason codes."""
        self.send(Unsubscribe(packet_id, list(topic_filters)))
        unsuback = self.recv()
        assert isinstance(unsuback, Unsuback) and unsuback.packet_id == packet_id, unsuback
        return list(unsuback.reason_codes)

    def disconnect(self, reason_code: int = 0, properties: dict[int, Any] | None = None) -> None:
        try:
            self.send(Disconnect(reason_code, properties or {}))
        finally:
            self.close()

    def recv_publish(self, timeout: float | None = None) -> Publish:
        packet = self.recv(timeout)
        assert isinstance(packet, Publish), packet
        return packet

    def acknowledge(self, message: Publish) -> None:
        """Complete the handshake of a received QoS 1/2 message as a client must."""
        if message.qos == 1:
            self.send(Puback(message.packet_id or 0))
        elif message.qos == 2:
            self.send(Pubrec(message.packet_id or 0))
            pubrel = self.recv()
            assert isinstance(pubrel, Pubrel) and pubrel.packet_id == message.packet_id, pubrel
            self.send(Pubcomp(message.packet_id or 0))

    def expect_disconnect(self, reason_code: int, timeout: float = 5.0) -> Disconnect:
        """Assert the server sends DISCONNECT with `reason_code` (after any other packets) and
        then closes the connection; the DISCONNECT."""
        deadline = time.monotonic() + timeout
        seen: list[Any] = []
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no DISCONNECT within {timeout} s; got {seen}"
            try:
                packet = self.recv(remaining)
            except ConnectionError:
                raise AssertionError(f"closed without DISCONNECT; got {seen}") from None
            if isinstance(packet, Disconnect):
                break
            seen.append(packet)
        assert packet.reason_code == reason_code, (
            f"DISCONNECT 0x{packet.reason_code:02X} "
            f"({packet.properties.get(P.REASON_STRING)!r}), expected 0x{reason_code:02X}"
        )
        self.expect_closed(timeout=max(deadline - time.monotonic(), 1.0))
        return packet

    def assert_nothing(self, wait: float = 0.5) -> None:
        """Assert no packet arrives within `wait` seconds."""
        try:
            packet = self.recv(wait)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected packet {packet}")


def connect_5(port: int, client_id: str) -> int:
    """CONNECT at 5.0; the CONNACK reason code (the connection is closed after)."""
    client = RawClient5(port)
    try:
        return int(client.connect(client_id).return_code)
    finally:
        client.close()


def publish_bytes(
    topic: str,
    payload: bytes = b"",
    qos: int = 0,
    packet_id: int | None = None,
    *property_blocks: dict[int, Any],
    retain: bool = False,
) -> bytes:
    """A 5.0 PUBLISH built from property blocks written one after another, unchecked: for
    packets the encoder refuses to write (a Topic Alias of 0, a property given twice)."""
    content = b"".join(codec.encode_property_block_content(block) for block in property_blocks)
    return codec.encode_publish5(topic, payload, qos, retain, False, packet_id, content)


# -- paho-mqtt as a v5 client --------------------------------------------------------------------


def paho_properties(packet_type: int, **values: Any) -> PahoProperties:
    """paho Properties for `packet_type` (PacketTypes.PUBLISH, CONNECT, ...), by paho's
    property names (ResponseTopic=..., UserProperty=[(k, v), ...])."""
    props = PahoProperties(packet_type)
    for name, value in values.items():
        setattr(props, name, value)
    return props


@dataclass
class Paho5:
    """A paho v5 client with its network loop in a thread, collecting messages, the CONNACK
    and the server's DISCONNECT. It does not reconnect on its own."""

    client: paho.Client
    client_id: str
    messages: queue.Queue[paho.MQTTMessage] = field(default_factory=queue.Queue)
    connected: threading.Event = field(default_factory=threading.Event)
    connack_reason: int | None = None
    connack_properties: Any = None
    session_present: bool | None = None
    disconnects: queue.Queue[tuple[int, Any]] = field(default_factory=queue.Queue)
    subacks: queue.Queue[list[int]] = field(default_factory=queue.Queue)
    acks: queue.Queue[tuple[int, int]] = field(default_factory=queue.Queue)

    def get(self, timeout: float = 5.0) -> paho.MQTTMessage:
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.client_id}: no message within {timeout} s") from None

    def drain(self, count: int, timeout: float = 10.0) -> list[paho.MQTTMessage]:
        """Up to `count` messages, waiting at most `timeout` in all."""
        deadline = time.monotonic() + timeout
        out: list[paho.MQTTMessage] = []
        while len(out) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                out.append(self.messages.get(timeout=remaining))
            except queue.Empty:
                break
        return out

    def assert_nothing(self, wait: float = 0.5) -> None:
        try:
            message = self.messages.get(timeout=wait)
        except queue.Empty:
            return
        raise AssertionError(
            f"{self.client_id}: unexpected message {message.topic} {message.payload!r}"
        )

    def subscribe(
        self, *subscriptions: tuple[str, paho.SubscribeOptions], **props: Any
    ) -> list[int]:
        """SUBSCRIBE and wait for the SUBACK; its reason codes."""
        properties = paho_properties(PacketTypes.SUBSCRIBE, **props) if props else None
        rc, _mid = self.client.subscribe(list(subscriptions), properties=properties)
        assert rc == paho.MQTT_ERR_SUCCESS, rc
        try:
            return self.subacks.get(timeout=5)
        except queue.Empty:
            raise AssertionError(f"{self.client_id}: no SUBACK") from None

    def publish(
        self, topic: str, payload: bytes | str, qos: int = 0, retain: bool = False, **props: Any
    ) -> int | None:
        """Publish (with PUBLISH properties by paho name) and wait until paho has sent it (QoS
        0) or got its PUBACK / PUBCOMP; the PUBACK's reason code for QoS 1, else None."""
        properties = paho_properties(PacketTypes.PUBLISH, **props) if props else None
        info = self.client.publish(topic, payload, qos, retain, properties)
        info.wait_for_publish(10)
        assert info.is_published(), f"{self.client_id}: publish to {topic} not completed"
        if qos != 1:
            return None
        deadline = time.monotonic() + 5
        while True:  # acknowledgements of earlier publishes may be queued before this one's
            try:
                mid, reason = self.acks.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(f"{self.client_id}: no PUBACK for {topic}") from None
            if mid == info.mid:
                return reason

    def wait_disconnect(self, timeout: float = 10.0) -> tuple[int, Any]:
        """The reason code and properties with which the connection ended."""
        try:
            return self.disconnects.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.client_id}: still connected after {timeout} s") from None


@contextmanager
def paho5(
    port: int,
    client_id: str | None = None,
    *,
    clean_start: bool = True,
    session_expiry: int | None = None,
    keepalive: int = 30,
    will: tuple[str, bytes, int, bool, dict[str, Any]] | None = None,
    username: str | None = None,
    password: str | None = None,
    expect_refusal: bool = False,
    **connect_props: Any,
) -> Iterator[Paho5]:
    """A paho-mqtt MQTT 5.0 client connected to 127.0.0.1:port (`connect_props` by paho
    name, e.g. ReceiveMaximum=3); disconnected and its thread stopped on exit. With
    `expect_refusal` the CONNACK may refuse (its reason is in `connack_reason`)."""
    client_id = client_id if client_id is not None else f"paho5-{uuid.uuid4().hex[:10]}"
    client = paho.Client(
        CallbackAPIVersion.VERSION2,
        client_id=client_id,
        protocol=paho.MQTTv5,
        reconnect_on_failure=False,
    )
    wrapper = Paho5(client, client_id)

    def on_connect(_c: Any, _u: Any, flags: Any, reason: PahoReasonCode, props: Any) -> None:
        wrapper.connack_reason = reason.value
        wrapper.connack_properties = props
        wrapper.session_present = flags.session_present
        wrapper.connected.set()

    def on_disconnect(_c: Any, _u: Any, _f: Any, reason: PahoReasonCode, props: Any) -> None:
        wrapper.disconnects.put((reason.value, props))

    def on_subscribe(_c: Any, _u: Any, _mid: int, reasons: list[PahoReasonCode], _p: Any) -> None:
        wrapper.subacks.put([r.value for r in reasons])

    def on_publish(_c: Any, _u: Any, mid: int, reason: PahoReasonCode, _p: Any) -> None:
        wrapper.acks.put((mid, reason.value))

    client.on_connect = on_connect
    client.on_disconnect = on_disconnect
    client.on_subscribe = on_subscribe
    client.on_publish = on_publish
    client.on_message = lambda _c, _u, msg: wrapper.messages.put(msg)
    if will is not None:
        topic, payload, qos, retain, will_props = will
        props = paho_properties(PacketTypes.WILLMESSAGE, **will_props) if will_props else None
        client.will_set(topic, payload, qos, retain, props)
    if username is not None:
        client.username_pw_set(username, password)
    if session_expiry is not None:
        connect_props["SessionExpiryInterval"] = session_expiry
    properties = paho_properties(PacketTypes.CONNECT, **connect_props) if connect_props else None
    client.connect("127.0.0.1", port, keepalive, clean_start=clean_start, properties=properties)
    client.loop_start()
    try:
        assert wrapper.connected.wait(10), f"{client_id}: no CONNACK"
        if not expect_refusal:
            assert wrapper.connack_reason == 0, f"CONNACK 0x{wrapper.connack_reason:02X}"
        yield wrapper
    finally:
        try:
            client.disconnect()
        finally:
            stop_paho(client)


def sub_options(
    qos: int,
    *,
    no_local: bool = False,
    retain_as_published: bool = False,
    retain_handling: int = 0,
) -> paho.SubscribeOptions:
    """paho's 5.0 subscription options, named as in the specification."""
    return paho.SubscribeOptions(
        qos=qos,
        noLocal=no_local,
        retainAsPublished=retain_as_published,
        retainHandling=retain_handling,
    )


# -- mosquitto_sub / mosquitto_pub -----------------------------------------------------------------


def mosquitto_pub(port: int, *args: str, version: str = "5") -> None:
    """Run `mosquitto_pub -V <version>` against the bridge; fails the test if it fails."""
    result = subprocess.run(
        ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "-V", version, *args],
        capture_output=True,
        timeout=15,
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")


class JsonObject(dict[str, Any]):
    """A JSON object from mosquitto_sub that also keeps its (name, value) pairs in order:
    mosquitto prints User Properties as one object whose names may repeat."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__(pairs)
        self.pairs = pairs


class MosquittoSub:
    """A `mosquitto_sub` process printing one JSON line per message (`-F %j`); started by
    `mosquitto_sub_process`, which kills it at the end."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    def messages(self, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Wait (bounded) until it has printed `count` messages and exited (`-C count`)."""
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            out, err = self.proc.communicate()
        lines = [line for line in out.decode().splitlines() if line.strip()]
        assert len(lines) == count, f"{len(lines)} of {count} messages: {lines} {err.decode()}"
        return [json.loads(line, object_pairs_hook=JsonObject) for line in lines]

    def kill(self) -> None:
        """SIGKILL: the client vanishes without DISCONNECT."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def mosquitto_subscribe_session(
    port: int, client_id: str, topic_filter: str, qos: int = 1, version: str = "5"
) -> list[str]:
    """`mosquitto_sub -c -x 60 -E`: a persistent session subscribes and leaves once the SUBACK
    came, so what is published from now on waits for a `mosquitto_sub -c` with the same id.
    (mosquitto_sub says nothing when its subscription is in place; this way nothing races.)
    The session's own args, to start that reader with."""
    args = ["-c", "-i", client_id, "-t", topic_filter, "-q", str(qos)]
    if version == "5":
        args += ["-x", "60"]
    result = subprocess.run(
        ["mosquitto_sub", "-h", "127.0.0.1", "-p", str(port), "-V", version, "-E", *args],
        capture_output=True,
        timeout=15,
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    return args


@contextmanager
def mosquitto_sub_process(port: int, *args: str, version: str = "5") -> Iterator[MosquittoSub]:
    """Start `mosquitto_sub -V <version> -F %j ARGS`; killed by PID on exit."""
    proc = subprocess.Popen(
        ["mosquitto_sub", "-h", "127.0.0.1", "-p", str(port), "-V", version, "-F", "%j", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    sub = MosquittoSub(proc)
    try:
        yield sub
    finally:
        sub.kill()
        if proc.stdout is not None:
            proc.stdout.close()
        if proc.stderr is not None:
            proc.stderr.close()


def user_property_pairs(message: dict[str, Any]) -> list[tuple[str, str]]:
    """The User Properties of a message mosquitto_sub printed, as (name, value) pairs in order."""
    users = message.get("properties", {}).get("user-properties")
    return list(users.pairs) if isinstance(users, JsonObject) else []


def wait_connected(node: BridgeProcess, client_id: str, timeout: float = 5.0) -> None:
    """Wait until the bridge `node` logged that `client_id` connected (for clients such as
    mosquitto_sub that say nothing when they are connected)."""
    node.wait_for_log(f"client {client_id} connected from", timeout)
