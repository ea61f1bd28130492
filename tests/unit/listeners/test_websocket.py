"""The WebSocket listener's protocol driven by bytes: a fake socket below, a recording inner
protocol above, and wsproto's client side producing and parsing the bytes a real client would."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Ping,
    Pong,
    RejectConnection,
    Request,
    TextMessage,
)

from bridge.counters import Metrics
from bridge.listeners.origins import OriginPolicy
from bridge.listeners.websocket import MAX_REQUEST_BYTES, WebSocketProtocol, WebSocketTransport
from bridge.mqtt import codec
from bridge.mqtt.packets import Connect, Pingreq, Publish

PEER = ("192.0.2.7", 50123)


class FakeSocket:
    """The part of an asyncio transport the protocol uses, recording what happens to it."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False
        self.aborted = False
        self.reading = True
        self.limits: tuple[int | None, int | None] = (None, None)

    def write(self, data: bytes) -> None:
        assert not self.closed, "write after close"
        self.written += data

    def take(self) -> bytes:
        data = bytes(self.written)
        self.written.clear()
        return data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = self.aborted = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": PEER}.get(name, default)

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_reading(self) -> bool:
        return self.reading

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.limits = (high, low)

    def get_write_buffer_size(self) -> int:
        return 1234


class RecordingInner(asyncio.Protocol):
    """Stands in for `Connection`: records its transport, the bytes and the calls it gets."""

    def __init__(self) -> None:
        self.transport: Any = None
        self.received = bytearray()
        self.calls: list[str] = []
        self.lost: list[Exception | None] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.received += data

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.append(exc)

    def pause_writing(self) -> None:
        self.calls.append("pause_writing")

    def resume_writing(self) -> None:
        self.calls.append("resume_writing")


class RecordingHandler(logging.Handler):
    """Keeps the log records it gets."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class Harness:
    """One WebSocketProtocol on a FakeSocket, with a wsproto client to talk to it."""

    def __init__(self, *, max_message_size: int = 10_000, handshake_timeout: float = 5.0) -> None:
        self.inners: list[RecordingInner] = []
        self.protocol = WebSocketProtocol(
            self._new_inner,
            path="/mqtt",
            handshake_timeout=handshake_timeout,
            max_message_size=max_message_size,
        )
        self.socket = FakeSocket()
        self.protocol.connection_made(self.socket)  # type: ignore[arg-type]
        self.client = WSConnection(ConnectionType.CLIENT)

    def _new_inner(self) -> RecordingInner:
        self.inners.append(RecordingInner())
        return self.inners[-1]

    @property
    def inner(self) -> RecordingInner:
        assert len(self.inners) == 1, "no upgrade happened"
        return self.inners[0]

    def send(self, event: Event) -> None:
        self.protocol.data_received(self.client.send(event))

    def replies(self) -> list[Event]:
        self.client.receive_data(self.socket.take())
        return list(self.client.events())

    def upgrade(self, target: str = "/mqtt", subprotocols: list[str] | None = None) -> list[Event]:
        offered = ["mqtt"] if subprotocols is None else subprotocols
        self.send(Request(host="localhost", target=target, subprotocols=offered))
        return self.replies()


def in_loop(test: Callable[[], Awaitable[None]]) -> Callable[[], None]:
    """Run an async test in its own event loop (the protocol schedules its handshake timer)."""

    @functools.wraps(test)
    def run() -> None:
        asyncio.run(test())  # type: ignore[arg-type]

    return run


def opened() -> Harness:
    harness = Harness()
    (accept,) = harness.upgrade()
    assert isinstance(accept, AcceptConnection)
    return harness


# -- the upgrade ---------------------------------------------------------------------------------


@in_loop
async def test_upgrade_on_ws_path_is_accepted_with_subprotocol_mqtt() -> None:
    harness = Harness()
    (accept,) = harness.upgrade("/mqtt", ["mqtt"])
    assert isinstance(accept, AcceptConnection)
    assert accept.subprotocol == "mqtt"
    assert isinstance(harness.inner.transport, WebSocketTransport)
    assert not harness.socket.closed


@pytest.mark.parametrize(
    ("offered", "chosen"),
    [(["mqttv3.1"], "mqttv3.1"), (["chat", "mqtt"], "mqtt"), ([], None)],
)
def test_mqttv31_or_no_subprotocol_is_accepted_too(offered: list[str], chosen: str | None) -> None:
    async def scenario() -> None:
        harness = Harness()
        (accept,) = harness.upgrade("/mqtt?client=1", offered)
        assert isinstance(accept, AcceptConnection)
        assert accept.subprotocol == chosen

    asyncio.run(scenario())


@in_loop
async def test_only_unknown_subprotocols_offered_gets_400() -> None:
    harness = Harness()
    (reject, *_) = harness.upgrade("/mqtt", ["chat"])
    assert isinstance(reject, RejectConnection)
    assert reject.status_code == 400
    assert harness.socket.closed and not harness.inners


@in_loop
async def test_wrong_path_gets_404_and_close() -> None:
    harness = Harness()
    (reject, *_) = harness.upgrade("/other")
    assert isinstance(reject, RejectConnection)
    assert reject.status_code == 404
    assert harness.socket.closed and not harness.inners


@in_loop
async def test_plain_http_request_gets_400_and_close() -> None:
    harness = Harness()
    harness.protocol.data_received(b"GET /mqtt HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert harness.socket.take().startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert harness.socket.closed and not harness.inners


@in_loop
async def test_unsupported_websocket_version_gets_426_naming_version_13() -> None:
    harness = Harness()
    harness.protocol.data_received(
        b"GET /mqtt HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 8\r\n\r\n"
    )
    response = harness.socket.take()
    assert response.startswith(b"HTTP/1.1 426 Upgrade Required\r\n")
    assert b"\r\nSec-WebSocket-Version: 13\r\n" in response
    assert harness.socket.closed


@in_loop
async def test_mqtt_bytes_on_the_websocket_port_get_400_and_close() -> None:
    harness = Harness()
    harness.protocol.data_received(codec.encode(Connect("raw-tcp-client")))
    assert harness.socket.take().startswith(b"HTTP/1.1 400 ")
    assert harness.socket.closed


@in_loop
async def test_upgrade_request_over_the_size_bound_gets_431() -> None:
    harness = Harness()
    harness.protocol.data_received(b"GET /mqtt HTTP/1.1\r\nHost: localhost\r\n")
    filler = b"X-Filler: " + b"a" * 1000 + b"\r\n"
    for _ in range(MAX_REQUEST_BYTES // len(filler) + 1):
        if harness.socket.closed:
            break
        harness.protocol.data_received(filler)
    assert harness.socket.take().startswith(b"HTTP/1.1 431 ")
    assert harness.socket.closed


@in_loop
async def test_no_upgrade_request_within_the_handshake_timeout_closes() -> None:
    harness = Harness(handshake_timeout=0.05)
    harness.protocol.data_received(b"GET /mqtt HTTP/1.1\r\n")
    await asyncio.sleep(0.2)
    assert harness.socket.closed and not harness.inners


@in_loop
async def test_handshake_timer_stops_at_the_upgrade() -> None:
    harness = Harness(handshake_timeout=0.05)
    harness.upgrade()
    await asyncio.sleep(0.2)
    assert not harness.socket.closed


# -- after the upgrade ---------------------------------------------------------------------------


@in_loop
async def test_mqtt_packets_split_across_frames_reach_the_inner_protocol_intact() -> None:
    harness = opened()
    stream = b"".join(
        codec.encode(packet)
        for packet in (
            Connect("ws-client"),
            Publish("a/b", b"x" * 300, 1, False, packet_id=1),
            Pingreq(),
        )
    )
    cut1, cut2 = 7, 200
    wire = (
        # one packet cut over two messages, a message fragmented into two frames, and the
        # rest of the stream (several packets) in one frame
        harness.client.send(BytesMessage(stream[:cut1]))
        + harness.client.send(BytesMessage(stream[cut1:cut2], message_finished=False))
        + harness.client.send(BytesMessage(stream[cut2:250], message_finished=True))
        + harness.client.send(BytesMessage(stream[250:]))
    )
    for i in range(len(wire)):  # byte by byte: frame boundaries never line up with reads
        harness.protocol.data_received(wire[i : i + 1])
    assert bytes(harness.inner.received) == stream
    assert not harness.socket.closed


@in_loop
async def test_text_message_bytes_are_fed_as_well() -> None:
    harness = opened()
    harness.send(TextMessage("\x00\x01ab"))
    assert bytes(harness.inner.received) == b"\x00\x01ab"


@in_loop
async def test_each_inner_write_comes_out_as_one_binary_message() -> None:
    harness = opened()
    harness.inner.transport.write(b"\x20\x02\x00\x00")
    harness.inner.transport.write(b"\xd0\x00")
    messages = harness.replies()
    assert [type(m) for m in messages] == [BytesMessage, BytesMessage]
    assert [m.data for m in messages] == [b"\x20\x02\x00\x00", b"\xd0\x00"]  # type: ignore[attr-defined]
    assert all(m.message_finished for m in messages)  # type: ignore[attr-defined]


@in_loop
async def test_ping_is_answered_with_pong() -> None:
    harness = opened()
    harness.send(Ping(b"hello"))
    assert harness.replies() == [Pong(b"hello")]


@in_loop
async def test_client_close_frame_is_answered_then_the_socket_closes() -> None:
    harness = opened()
    harness.send(CloseConnection(code=1000, reason="bye"))
    (reply,) = harness.replies()
    assert isinstance(reply, CloseConnection) and reply.code == 1000
    assert harness.socket.closed
    harness.inner.transport.write(b"\xd0\x00")  # the inner protocol's late write is dropped
    assert harness.socket.take() == b""
    harness.protocol.connection_lost(None)
    assert harness.inner.lost == [None]


@in_loop
async def test_inner_close_sends_a_close_frame_then_closes_the_socket() -> None:
    harness = opened()
    harness.inner.transport.write(b"\x20\x02\x00\x05")  # e.g. a refusing CONNACK, then close
    harness.inner.transport.close()
    assert harness.inner.transport.is_closing()
    connack, close = harness.replies()
    assert isinstance(connack, BytesMessage) and connack.data == b"\x20\x02\x00\x05"
    assert isinstance(close, CloseConnection) and close.code == 1000
    assert harness.socket.closed


@in_loop
async def test_inner_abort_aborts_the_socket() -> None:
    harness = opened()
    harness.inner.transport.abort()
    assert harness.socket.aborted and harness.inner.transport.is_closing()


@in_loop
async def test_oversized_message_closes_with_1009_before_feeding_it() -> None:
    harness = Harness(max_message_size=100)
    harness.upgrade()
    harness.send(BytesMessage(b"a" * 100))  # at the limit: fine
    harness.send(BytesMessage(b"b" * 60, message_finished=False))
    harness.send(BytesMessage(b"c" * 41, message_finished=True))  # 101 bytes in one message
    *_, close = harness.replies()
    assert isinstance(close, CloseConnection) and close.code == 1009
    assert bytes(harness.inner.received) == b"a" * 100 + b"b" * 60
    assert harness.socket.closed


@in_loop
async def test_framing_fault_is_logged_naming_the_peer_and_closes_with_1002() -> None:
    harness = opened()
    handler = RecordingHandler()
    logger = logging.getLogger("bridge.websocket")
    logger.addHandler(handler)
    try:
        harness.protocol.data_received(b"\x82\x01a")  # a client frame without a mask
    finally:
        logger.removeHandler(handler)
    records = handler.records
    (close,) = harness.replies()
    assert isinstance(close, CloseConnection) and close.code == 1002
    assert harness.socket.closed
    (record,) = records
    assert "192.0.2.7:50123" in record.getMessage()
    assert "protocol error" in record.getMessage()


@in_loop
async def test_transport_adapter_delegates_to_the_socket_and_forwards_flow_control() -> None:
    harness = opened()
    transport = harness.inner.transport
    assert transport.get_extra_info("peername") == PEER
    assert transport.get_extra_info("ssl_object") is None
    transport.pause_reading()
    assert not harness.socket.reading and not transport.is_reading()
    transport.resume_reading()
    assert harness.socket.reading
    transport.set_write_buffer_limits(high=4096)
    assert harness.socket.limits == (4096, None)
    assert transport.get_write_buffer_size() == 1234
    harness.protocol.pause_writing()
    harness.protocol.resume_writing()
    assert harness.inner.calls == ["pause_writing", "resume_writing"]
    harness.protocol.connection_lost(ConnectionResetError())
    assert isinstance(harness.inner.lost[0], ConnectionResetError)


@in_loop
async def test_connection_lost_before_the_upgrade_is_quiet() -> None:
    harness = Harness()
    harness.protocol.data_received(b"GET /mq")
    harness.protocol.connection_lost(None)
    harness.protocol.pause_writing()
    assert not harness.inners


# -- Origin ----------------------------------------------------------------------------------------


def origin_harness(allowed: list[str]) -> tuple[Harness, Metrics]:
    """A Harness whose protocol checks Origin against `allowed` and counts refusals."""
    harness = Harness()
    metrics = Metrics()
    harness.protocol.origins = OriginPolicy(allowed)
    harness.protocol.metrics = metrics
    return harness, metrics


def upgrade_from(harness: Harness, origin: str | None, host: str = "broker.example:8083") -> Event:
    headers = [] if origin is None else [(b"Origin", origin.encode())]
    harness.send(Request(host=host, target="/mqtt", subprotocols=["mqtt"], extra_headers=headers))
    return harness.replies()[0]


@pytest.mark.parametrize(
    ("allowed", "origin"),
    [
        ([], None),
        ([], "https://broker.example"),
        ([], "http://broker.example:18083"),
        (["https://console.example"], "https://console.example"),
        (["*"], "https://anything.example"),
    ],
)
def test_upgrades_without_origin_from_the_same_host_or_listed_are_accepted(
    allowed: list[str], origin: str | None
) -> None:
    async def scenario() -> None:
        harness, metrics = origin_harness(allowed)
        assert isinstance(upgrade_from(harness, origin), AcceptConnection)
        assert metrics.get("websocket_origin_refused") == 0

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("allowed", "origin"),
    [
        ([], "https://evil.example"),
        ([], "null"),
        (["https://console.example"], "http://console.example"),
        (["https://console.example"], "https://broker.example.evil.example"),
    ],
)
def test_an_upgrade_from_another_origin_gets_403_a_log_line_and_is_counted(
    allowed: list[str], origin: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        harness, metrics = origin_harness(allowed)
        with caplog.at_level(logging.INFO, logger="bridge.websocket"):
            reply = upgrade_from(harness, origin)
        assert isinstance(reply, RejectConnection) and reply.status_code == 403
        assert harness.socket.closed and harness.inners == []
        assert metrics.get("websocket_origin_refused") == 1
        (line,) = [r.getMessage() for r in caplog.records if "403" in r.getMessage()]
        assert "192.0.2.7:50123" in line and repr(origin) in line and "ws_allowed_origins" in line

    asyncio.run(scenario())
