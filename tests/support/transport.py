"""A recorder in place of a socket transport, for protocols driven in-process: an MQTT
`Connection` on a node, or the RocketMQ client's `RemotingConnection`. What they write is read
back with their own decoders."""

from __future__ import annotations

import asyncio
from typing import Any

from bridge.listeners.connection import Connection
from bridge.mqtt import codec
from bridge.mqtt.codec import Decoder
from bridge.mqtt.packets import Connect
from bridge.node import Node
from bridge.storage.rocketmq.wire import FrameDecoder, RemotingCommand


class RecordingTransport:
    """Keeps every `write` call; never pauses, never fails; closing (or aborting) is recorded, as
    a socket close would be."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else None

    def set_write_buffer_limits(self, high: int) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def packets(self) -> list[Any]:
        """What was written, decoded as MQTT packets."""
        decoder = Decoder()
        decoder.feed(b"".join(self.writes))
        return decoder.packets()

    def frames(self) -> list[RemotingCommand]:
        """What was written, decoded as RocketMQ remoting frames."""
        return FrameDecoder().feed(b"".join(self.writes))


async def open_connection(
    node: Node, client_id: str, transport: RecordingTransport | None = None
) -> tuple[Connection, RecordingTransport]:
    """A persistent-session client on `transport` (a new recorder by default), CONNACK read."""
    conn = Connection(node)
    if transport is None:
        transport = RecordingTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.data_received(codec.encode(Connect(client_id, clean_session=False)))
    for _ in range(50):
        await asyncio.sleep(0.01)
        if transport.packets():
            break
    return conn, transport
