"""What the authenticated handshake adds to the start of a peer link, on loopback.

    .venv/bin/python tests/bench/peer_handshake.py [--links 300]

Three figures, each the median and 90th percentile of `--links` link starts in one process
(uvloop), from `connect()` to the dialer's link being up:

* `hello only`: TCP connect and one `Hello` each way, what a link start cost before links were
  authenticated (emulated with today's frames: the cost is the round trip, not the bytes);
* `secret`: the real `PeerLink` on both ends with the cluster secret (Hello, Proof both ways,
  admission answered at once as for a member the node already knows);
* `secret, 2 keys`: the same while a rotation is under way (each proof checked against two keys).

Then the CPU time of one handshake's pure part (both ends' `Handshake` objects, no I/O).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import secrets
import statistics
import time
from typing import Any

import uvloop

from bridge.cluster import wire
from bridge.cluster.credential import PEER_LINK, derive_key
from bridge.cluster.handshake import NONCE_BYTES, Handshake, Role
from bridge.cluster.peer_auth import PeerAuth
from bridge.cluster.peers import PeerLink


class Owner:
    """The least a `PeerLink` needs of its cluster; admits every authenticated peer at once."""

    def __init__(self, node_id: str, keys: tuple[bytes, ...]) -> None:
        self.node_id = node_id
        self.boot_id = "boot-" + node_id
        self.auth = PeerAuth(keys)
        self.up: asyncio.Future[None] | None = None

    async def admit(self, link: PeerLink) -> str:
        return ""

    def link_refused(self, address: str, reason: str) -> None:
        raise AssertionError(reason)

    def link_up(self, link: PeerLink) -> None:
        if self.up is not None and not self.up.done():
            self.up.set_result(None)

    def link_down(self, link: PeerLink) -> None:
        pass

    def on_frame(self, link: PeerLink, frame: wire.Frame) -> None:
        pass

    def should_dial(self, node_id: str) -> bool:
        return False

    def peer_address(self, node_id: str) -> str:
        return ""


class HelloOnly(asyncio.Protocol):
    """One `Hello` each way: the link start before authentication."""

    def __init__(self, done: asyncio.Future[None] | None = None) -> None:
        self.done = done
        self.decoder = wire.PeerDecoder()

    def connection_made(self, transport: Any) -> None:
        transport.write(wire.encode(wire.Hello(wire.VERSION, "n", "b", b"x" * 32)))

    def data_received(self, data: bytes) -> None:
        self.decoder.receive_data(data)
        if self.decoder.frames() and self.done is not None and not self.done.done():
            self.done.set_result(None)


async def link_starts(kind: str, links: int, keys: tuple[bytes, ...]) -> list[float]:
    loop = asyncio.get_running_loop()
    acceptor = Owner("b", keys)
    if kind == "hello only":
        server = await loop.create_server(HelloOnly, "127.0.0.1", 0)
    else:
        server = await loop.create_server(lambda: PeerLink(acceptor), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    times = []
    for _ in range(links):
        done: asyncio.Future[None] = loop.create_future()
        dialer = Owner("a", keys)
        dialer.up = done
        started = time.perf_counter()
        protocol: asyncio.Protocol = (
            HelloOnly(done) if kind == "hello only" else PeerLink(dialer, "b")
        )
        transport, _ = await loop.create_connection(lambda: protocol, "127.0.0.1", port)  # noqa: B023
        await done
        times.append((time.perf_counter() - started) * 1000)
        transport.abort()
    server.close()
    return times


def pure_handshake_us(keys: tuple[bytes, ...], rounds: int = 2000) -> float:
    started = time.perf_counter()
    for _ in range(rounds):
        a = Handshake(
            Role.DIALER, "a", "ba", keys, secrets.token_bytes(NONCE_BYTES), expected_peer="b"
        )
        b = Handshake(Role.ACCEPTOR, "b", "bb", keys, secrets.token_bytes(NONCE_BYTES))
        a.receive_data(b.data_to_send())
        a.next_event()
        b.receive_data(a.data_to_send())
        b.next_event()
        b.admit()
        a.receive_data(b.data_to_send())
        a.next_event()
        a.admit()
    return (time.perf_counter() - started) / rounds * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--links", type=int, default=300)
    args = parser.parse_args()
    logging.getLogger("bridge.cluster").setLevel(logging.ERROR)  # each closed link says so
    key = derive_key(b"s" * 64, PEER_LINK)
    other = derive_key(b"o" * 64, PEER_LINK)
    for kind, keys in (
        ("hello only", (key,)),
        ("secret", (key,)),
        ("secret, 2 keys", (other, key)),
    ):
        times = uvloop.run(link_starts(kind, args.links, keys))
        q = statistics.quantiles(times, n=10)
        print(f"{kind:<16} link start: median {statistics.median(times):.3f} ms, p90 {q[8]:.3f} ms")
    print(f"pure handshake (both ends, CPU): {pure_handshake_us((key,)):.1f} us")


if __name__ == "__main__":
    main()
