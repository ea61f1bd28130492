#!/usr/bin/env python3
"""A measuring stick, not a broker: the least a Python + uvloop process does to relay MQTT.

It answers CONNECT, SUBSCRIBE, PINGREQ and DISCONNECT of MQTT 3.1.1 clients, passes each
PUBLISH (QoS 0 or 1) on to the clients subscribed to exactly its topic (QoS 1 with a packet id
of the subscriber's own) and PUBACKs a QoS 1 PUBLISH at once. Nothing else: no store, no fsync,
no sessions, no wildcards, no in-flight window, no limits, no checks of what clients send.
Output is gathered per connection and written once per event-loop turn, and each read takes
what the socket holds, as our broker does.

Run in place of our broker by single_node.py, in the same invocation as Mosquitto::

    .venv/bin/python tests/bench/single_node.py --rounds 2 --loadgen /tmp/loadgen \\
        --ours-cmd '{python} {repo}/tests/bench/relay_floor.py --port {port}'

it tells how much of our CPU per message the runtime alone needs (the event loop, the system
calls, one Python call per packet), so the rest of our cost is our broker's own work
(docs/performance/2026-11-27-one-node-passes-7-9.md, "Eighth look: the floor of the runtime").
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from typing import cast

import uvloop

CONNACK = b"\x20\x02\x00\x00"
PINGRESP = b"\xd0\x00"


def remaining_length(n: int) -> bytes:
    """MQTT's variable-length encoding of `n`."""
    out = bytearray()
    while True:
        digit, n = n % 128, n // 128
        out.append(digit | 0x80 if n else digit)
        if not n:
            return bytes(out)


class Relay(asyncio.Protocol):
    """One client connection."""

    def __init__(self, topics: dict[bytes, list[Relay]]) -> None:
        self.topics = topics
        self.transport: asyncio.Transport | None = None
        self.pending = b""
        self.out: list[bytes] = []
        self.flush_handle: asyncio.Handle | None = None
        self.packet_id = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        for subscribers in self.topics.values():
            if self in subscribers:
                subscribers.remove(self)

    def data_received(self, data: bytes) -> None:
        buf = self.pending + data if self.pending else data
        pos, end = 0, len(buf)
        while pos + 2 <= end:
            first = buf[pos]
            at, shift, length = pos + 1, 0, 0
            while at < end:
                byte = buf[at]
                at += 1
                length |= (byte & 0x7F) << shift
                shift += 7
                if not byte & 0x80:
                    break
            else:
                break  # the length itself is split
            if at + length > end:
                break
            self.packet(first, buf[at : at + length])
            pos = at + length
        self.pending = buf[pos:]

    def packet(self, first: int, body: bytes) -> None:
        kind = first >> 4
        if kind == 3:
            self.publish((first >> 1) & 3, body)
        elif kind == 1:
            self.send(CONNACK)
        elif kind == 8:
            topic_len = int.from_bytes(body[2:4], "big")
            topic = body[4 : 4 + topic_len]
            self.topics.setdefault(topic, []).append(self)
            granted = min(body[4 + topic_len], 1)
            self.send(b"\x90\x03" + body[0:2] + bytes((granted,)))
        elif kind == 12:
            self.send(PINGRESP)
        elif kind == 14 and self.transport is not None:
            self.transport.close()
        # PUBACK (4) from a subscriber: nothing to do.

    def publish(self, qos: int, body: bytes) -> None:
        topic_len = int.from_bytes(body[0:2], "big")
        topic = body[2 : 2 + topic_len]
        if qos:
            self.send(b"\x40\x02" + body[2 + topic_len : 4 + topic_len])
            payload = body[4 + topic_len :]
        else:
            payload = body[2 + topic_len :]
        topic_field = body[0 : 2 + topic_len]
        for sub in self.topics.get(topic, ()):
            head = topic_field
            if qos:
                sub.packet_id = sub.packet_id % 65535 + 1
                head += sub.packet_id.to_bytes(2, "big")
            rest = len(head) + len(payload)
            sub.send(bytes((0x32 if qos else 0x30,)) + remaining_length(rest) + head + payload)

    def send(self, data: bytes) -> None:
        self.out.append(data)
        if self.flush_handle is None:
            self.flush_handle = asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self.flush_handle = None
        if self.out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(self.out))
        self.out.clear()


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    topics: dict[bytes, list[Relay]] = {}
    server = await loop.create_server(lambda: Relay(topics), host, port)
    stop = loop.create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set_result, None)
    async with server:
        await stop


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    uvloop.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
