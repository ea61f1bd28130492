"""Loopback ports for the servers tests start, each pytest-xdist worker in a range of its own.

A port picked by binding port 0 comes from Linux's ephemeral range (32768-60999): free when
picked, but between the pick and the server's own bind any client connection on the machine may
be given it, and so may another worker's pick. The ports here come from below that range
(10000-32767), which is split evenly between the workers of a run (`PYTEST_XDIST_WORKER` gwN of
`PYTEST_XDIST_WORKER_COUNT`), and a process hands them out in turn from a random place in its
share, each checked free when handed out: two workers of one run never pick the same port, client
sockets never take one, and another run on the machine (a second checkout's tests) starts
elsewhere in the range.
"""

from __future__ import annotations

import os
import random
import threading

from spark.demo_servers import can_bind

LOW = 10000
HIGH = 32768
"""Ports below Linux's ephemeral range (net.ipv4.ip_local_port_range starts at 32768)."""


def worker_share() -> tuple[int, int]:
    """[first, end) of the ports this process's pytest-xdist worker may hand out (the whole
    range outside xdist)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "") or 1)
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    width = (HIGH - LOW) // max(count, 1)
    first = LOW + min(index, count - 1) * width
    return first, first + width


class _Dealer:
    """Hands out this process's share of ports in turn, each one checked free."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.share = worker_share()
        rng = random.Random(os.getpid() ^ int.from_bytes(os.urandom(4), "big"))
        self.cursor = rng.randrange(*self.share)

    def block(self, offsets: tuple[int, ...]) -> int:
        """A port P of the share with P + offset free for every offset (all in the share)."""
        first, end = self.share
        low, high = min(offsets), max(offsets)
        with self.lock:
            for _ in range(end - first):
                port = self.cursor
                self.cursor = self.cursor + 1 if self.cursor + 1 < end else first
                if port + low < first or port + high >= end:
                    continue
                if all(can_bind(port + offset) for offset in offsets):
                    # The next pick starts after the block, so it is not handed out twice.
                    if port + high + 1 < end:
                        self.cursor = max(self.cursor, port + high + 1)
                    return port
        raise RuntimeError(f"no free port block {offsets} in 127.0.0.1:{first}-{end - 1}")


_dealer: _Dealer | None = None
_made = threading.Lock()


def _the_dealer() -> _Dealer:
    global _dealer
    with _made:
        if _dealer is None:
            _dealer = _Dealer()
        return _dealer


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, not handed out before by this
    process (until its share wraps around)."""
    return _the_dealer().block((0,))


def free_ports(count: int) -> list[int]:
    """`count` different free ports."""
    return [free_port() for _ in range(count)]


def free_port_block(offsets: tuple[int, ...] = (0,)) -> int:
    """A port P such that P + offset is free for every offset (RocketMQ's broker listens on
    its port and on neighbours of it)."""
    return _the_dealer().block(offsets)
