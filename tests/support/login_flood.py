"""A flood of bad logins, and an honest login timed through it (issue 36): the integration test
tests/integration/test_login_flood.py asserts how the node answers both, the benchmark
tests/bench/login_flood.py reports how long the honest login took.

The flood: FLOOD_SOCKETS sockets from 127.0.0.2, each sending a CONNECT with a wrong password
for a user of the node's password file and then (`publishes`) 256 KiB PUBLISH packets without
waiting for the CONNACK, reconnecting when closed, for `seconds`. The honest client logs in from
127.0.0.1 as alice (password `alice-pw`, HONEST_PASSWORD).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections import Counter

from bridge.mqtt import codec
from bridge.mqtt.packets import Connack, Connect, Publish
from tests.support.clients import RawClient
from tests.support.hostile_run import rss_bytes

FLOOD_SOCKETS = 300
FLOOD_SECONDS = 8.0
PAYLOAD = b"x" * (256 * 1024 - 64)
HONEST_PASSWORD = b"alice-pw"
LOGIN_WAIT = 20.0
"""Seconds an honest login is waited for before it counts as starved."""


def flood_source_usable() -> str | None:
    """None when 127.0.0.2 can be a source address here, else why not."""
    try:
        probe = socket.create_connection(("127.0.0.1", 1), source_address=("127.0.0.2", 0))
    except ConnectionRefusedError:
        return None  # 127.0.0.2 is usable as a source address
    except OSError as exc:
        return f"127.0.0.2 is not a loopback alias here: {exc}"
    probe.close()
    return None


class Flood:
    """FLOOD_SOCKETS sockets from 127.0.0.2 that send a wrong-password CONNECT and then stream
    PUBLISHes without waiting; each reconnects once closed, until `stop` or `seconds` passed.
    Counts how each socket ended."""

    def __init__(
        self, port: int, pid: int, *, publishes: bool, seconds: float = FLOOD_SECONDS
    ) -> None:
        self.port = port
        self.pid = pid
        self.seconds = seconds
        self.publishes = publishes
        """Whether each socket streams PUBLISHes after its CONNECT (else it only waits)."""
        self.outcomes: Counter[str] = Counter()
        self.peak_rss = 0
        """The bridge's largest RSS seen while the flood ran (sampled every 50 ms)."""
        self.opened = 0
        self.under_way = threading.Event()
        """Set once every flood socket has connected at least once."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._sampler = threading.Thread(target=self._sample, daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._sampler.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.seconds + 30)
        self._sampler.join(5)
        assert not self._thread.is_alive(), "the flood did not stop"

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            self.peak_rss = max(self.peak_rss, rss_bytes(self.pid))

    async def _run(self) -> None:
        deadline = time.monotonic() + self.seconds
        await asyncio.gather(*(self._socket(i, deadline) for i in range(FLOOD_SOCKETS)))

    async def _socket(self, n: int, deadline: float) -> None:
        connect = codec.encode(Connect(f"flood-{n}", username="alice", password=b"wrong"))
        publish = codec.encode(Publish("flood/x", PAYLOAD))
        while not self._stop.is_set() and time.monotonic() < deadline:
            self.outcomes[await self._attempt(connect, publish, deadline)] += 1

    async def _attempt(self, connect: bytes, publish: bytes, deadline: float) -> str:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", self.port, local_addr=("127.0.0.2", 0)), 5
            )
        except (OSError, TimeoutError):
            return "not accepted"
        self.opened += 1
        if self.opened >= FLOOD_SOCKETS:
            self.under_way.set()
        answer = asyncio.ensure_future(reader.read(4096))
        try:
            writer.write(connect)
            while self.publishes and not answer.done() and time.monotonic() < deadline:
                writer.write(publish)
                # The bridge may read no more: then wait for its answer instead.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(writer.drain(), 0.2)
                await asyncio.sleep(0)
            if not answer.done():
                # The flood is over: this socket's answer is still due (connect_timeout).
                await asyncio.wait_for(asyncio.shield(answer), 15)
            data = answer.result()
        except (OSError, ConnectionError):
            return "closed"
        except TimeoutError:
            return "silent"
        finally:
            answer.cancel()
            writer.transport.abort()
        if not data:
            return "closed"
        return "refused" if data[0] >> 4 == 2 else "other"


def timed_login(port: int) -> tuple[Connack | None, float]:
    """Alice's CONNACK (None if none came within LOGIN_WAIT) and the seconds from connecting
    to it."""
    started = time.monotonic()
    client = RawClient(port, timeout=LOGIN_WAIT)
    try:
        client.send(Connect(f"alice-{started}", username="alice", password=HONEST_PASSWORD))
        try:
            connack = client.recv()
        except TimeoutError:
            return None, LOGIN_WAIT
        assert isinstance(connack, Connack), connack
        return connack, time.monotonic() - started
    finally:
        client.sock.close()
