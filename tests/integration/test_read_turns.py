"""One loop turn, one large read per client: a publisher that sends megabytes at once is read
64 KiB-or-more at a time, with every other client's turn (and the store's commit) in between,
and its messages reach the subscriber as they are read. In-process: a real node on the embedded
store, its `Connection`s on the transports of `tests/bench/hot_path.py`."""

from __future__ import annotations

import asyncio
import tempfile
from argparse import Namespace
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from bridge.listeners.connection import READ_TURN
from bridge.listeners.server import Server
from bridge.mqtt import codec
from bridge.mqtt.packets import Pingreq, Pingresp, Publish
from tests.bench.hot_path import TOPIC, Client, HarnessCpu, make_config

pytestmark = pytest.mark.integration


def settings() -> Namespace:
    return Namespace(set=[], fsync="on", log_level="warning")


def publishes(size: int) -> tuple[bytes, int]:
    """QoS 0 PUBLISHes of 100 B payloads numbered from 0, at least `size` bytes of them, and
    how many."""
    one = len(codec.encode(Publish(TOPIC, b"0" * 100)))
    count = -(-size // one)
    data = b"".join(codec.encode(Publish(TOPIC, b"%08d" % i + b"x" * 92)) for i in range(count))
    return data, count


@asynccontextmanager
async def node_with(other_id: str) -> AsyncIterator[tuple[Client, Client]]:
    """A node on the embedded store in a temporary directory, and two clients connected to it:
    "pub" and `other_id`. Shut down at the end."""
    with tempfile.TemporaryDirectory(prefix="read-turns-") as data_dir:
        server = Server(make_config(data_dir, settings()))
        await server.start()
        try:
            harness = HarnessCpu()
            pub = Client(server.node, "pub", 20000, harness)
            await pub.connect()
            other = Client(server.node, other_id, 20001, harness)
            await other.connect()
            yield pub, other
        finally:
            await server.shutdown()


def test_a_large_read_pauses_the_client_until_the_next_loop_turn() -> None:
    async def scenario() -> None:
        async with node_with("other") as (pub, other):
            small, _ = publishes(READ_TURN // 2)
            pub.conn.data_received(small)
            assert pub.transport.reading, "a read under READ_TURN does not pause"
            large, _ = publishes(READ_TURN)
            pub.conn.data_received(large)
            assert not pub.transport.reading, "a read of READ_TURN waits for the next turn"
            other.conn.data_received(codec.encode(Pingreq()))  # its turn comes in between
            await asyncio.sleep(0)
            assert pub.transport.reading, "reading goes on at the next loop turn"
            await other.transport.wait()
            assert other.received() == [Pingresp()]

    asyncio.run(scenario())


def test_a_flood_in_large_reads_reaches_its_subscriber_whole_and_in_order() -> None:
    async def scenario() -> None:
        async with node_with("sub") as (pub, sub):
            await sub.subscribe(0)
            flood, count = publishes(4 * 1024 * 1024)
            done = sub.expect_until(count)
            reads = [flood[i : i + 256 * 1024] for i in range(0, len(flood), 256 * 1024)]
            for data in reads:  # as libuv hands them: 256 KiB each, while reading is on
                while not pub.transport.reading:
                    await pub.transport.wait()
                pub.conn.data_received(data)
            await asyncio.wait_for(done, 30)
            assert not sub.errors, sub.errors
            assert sub.expected == count

    asyncio.run(scenario())
