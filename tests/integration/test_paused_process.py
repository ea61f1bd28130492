"""A node whose process was paused (SIGSTOP, a paused virtual machine) decides whether it may
still serve before it answers anything that waited meanwhile (`bridge.node.stalls`).

In-process: a real node on the embedded store, a real TCP client, and the loop really blocked.
The PINGREQ is in the socket when the loop runs again, so its read is handled before any timer of
that turn: a check made by a timer alone (the cluster's link keeper, here `ticking`) answered the
PINGREQ first, as the nemesis saw a resumed node do 50 ms after another node took the client.
The cluster's own decision (`Cluster.after_stall`, the lease) is `tests/unit/cluster`'s."""

from __future__ import annotations

import asyncio
import tempfile
import time

import pytest

from bridge.checks import load_config
from bridge.listeners.server import Server
from bridge.mqtt import codec
from bridge.mqtt.decoder import Decoder
from bridge.mqtt.packets import Connack, Connect, Disconnect, Pingreq, Pingresp
from bridge.mqtt.reasons import ReasonCode

pytestmark = pytest.mark.integration

LIMIT = 0.3
"""A gap between ticks longer than this is a pause (the cluster's is its lease margin)."""


async def ticking(server: Server) -> None:
    """What the cluster's link keeper does every half second, faster."""
    loop = asyncio.get_running_loop()
    stalls = server.node.stalls
    while True:
        await asyncio.sleep(0.05)
        stalls.turned(loop.time())


async def answers(reader: asyncio.StreamReader, seconds: float) -> list[object]:
    """Every packet the node sends until it closes the connection (or `seconds` pass)."""
    decoder = Decoder(from_server=True)
    decoder.protocol_level = 5
    packets: list[object] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            data = await asyncio.wait_for(reader.read(4096), left)
        except TimeoutError:
            break
        if not data:
            break
        decoder.feed(data)
        packets.extend(decoder.packets())
    return packets


def run_paused(stop_serving: bool) -> list[object]:
    """Connect a v5 client, send a PINGREQ, block the node's loop for three `LIMIT`s; what the
    client gets afterwards. `stop_serving`: the node's answer to the pause."""
    stalls_seen: list[float] = []

    def on_stall(gap: float) -> bool:
        stalls_seen.append(gap)
        if stop_serving:
            server.node.fence_clients()
        return stop_serving

    async def scenario() -> list[object]:
        loop = asyncio.get_running_loop()
        await server.start()
        port = server.listeners[0].sockets[0].getsockname()[1]
        server.node.stalls.watch(loop.time(), LIMIT, on_stall)
        ticker = loop.create_task(ticking(server))
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(codec.encode(Connect("paused-client", protocol_level=5)))
            decoder = Decoder(from_server=True)
            decoder.protocol_level = 5
            while not (packets := decoder.packets()):
                decoder.feed(await asyncio.wait_for(reader.read(4096), 5))
            assert isinstance(packets[0], Connack) and packets[0].return_code == 0
            writer.write(codec.encode(Pingreq()))
            await writer.drain()  # in the kernel: the node reads it when its loop runs again
            time.sleep(3 * LIMIT)  # the whole loop stops, as a process under SIGSTOP does
            got = await answers(reader, 2.0)
            writer.close()
            assert len(stalls_seen) == 1 and stalls_seen[0] >= 3 * LIMIT
            return got
        finally:
            ticker.cancel()
            await server.shutdown()

    with tempfile.TemporaryDirectory(prefix="paused-") as data_dir:
        config = load_config(
            None,
            env={},
            overrides={
                "listen": ["127.0.0.1:0"],
                "data_dir": data_dir,
                "node_id": "paused",
                "allow_anonymous": True,
                "log_level": "warning",
            },
        )
        server = Server(config)
        return asyncio.run(scenario())


def test_a_node_that_stops_serving_after_a_pause_answers_nothing_that_waited_in_it() -> None:
    got = run_paused(stop_serving=True)
    assert [type(packet) for packet in got] == [Disconnect], got
    assert isinstance(got[0], Disconnect) and got[0].reason_code == ReasonCode.SERVER_BUSY


def test_a_node_that_may_still_serve_after_a_pause_answers_what_waited() -> None:
    assert run_paused(stop_serving=False) == [Pingresp()]
