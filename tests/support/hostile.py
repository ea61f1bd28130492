"""Hostile clients for a bounded run against one bridge on 127.0.0.1, each kind from a loopback
address of its own (127.0.0.2-9), so the node's per-address bounds meet them as they would meet
strangers on the internet while an honest client on 127.0.0.1 keeps its rights.

The kinds: mutated MQTT packets (valid encodings from the project's codec with bytes flipped,
cut short, wrong or huge remaining lengths) before and after a valid login, at 3.1.1 and 5.0;
slowloris (a CONNECT trickled a byte a second); half-open sockets (connected, never a byte; or
logged in and subscribed, never read); a flood of wrong-password CONNECTs each followed by big
PUBLISHes without waiting; and logged-in subscribers to `#` that never read while a noisy
publisher keeps their queues filling. Every loop is bounded in time and count, and every socket
is closed when the run ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from bridge.mqtt import codec
from bridge.mqtt.packets import (
    Auth,
    Connect,
    Disconnect,
    Pingreq,
    Puback,
    Publish,
    Pubrel,
    Subscribe,
    Subscription,
    Unsubscribe,
    Will,
)
from bridge.mqtt.properties import PropertyId

ADDRESSES = {
    "mutant-preauth": "127.0.0.2",
    "mutant-311": "127.0.0.3",
    "slowloris": "127.0.0.4",
    "silent": "127.0.0.5",
    "non-reader": "127.0.0.6",
    "flood": "127.0.0.7",
    "subscribe-all": "127.0.0.8",
    "mutant-5": "127.0.0.9",
}
"""The source address of each kind of hostile client."""

MAX_ATTEMPTS = 100_000
"""No worker makes more connections than this, however long the run."""


def loopback_aliases_usable() -> str | None:
    """None when 127.0.0.2-9 can be bound as source addresses here, else why not."""
    for address in sorted(set(ADDRESSES.values())):
        try:
            with socket.socket() as sock:
                sock.bind((address, 0))
        except OSError as exc:
            return f"{address} is not usable as a source address: {exc}"
    return None


@dataclass(frozen=True)
class Login:
    """A user name and password the node accepts (the hostile clients that log in use it)."""

    username: str
    password: bytes


def split_frame(data: bytes) -> tuple[int, bytes]:
    """The first byte and the body of one encoded packet (its remaining length skipped)."""
    pos = 1
    while data[pos] & 0x80:
        pos += 1
    return data[0], data[pos + 1 :]


def varint(value: int) -> bytes:
    """MQTT's variable byte integer (any value, so that too-long ones can be built)."""
    out = bytearray()
    while True:
        value, digit = divmod(value, 128)
        out.append(digit | (0x80 if value else 0))
        if not value:
            return bytes(out)


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One damaged version of the encoded packet `data`: bytes flipped, cut short, a wrong or
    huge (or over-long, 5-byte) remaining length, random bytes, or two damaged packets."""
    first, body = split_frame(data)
    how = rng.randrange(7)
    if how == 0:
        damaged = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
        return bytes(damaged)
    if how == 1:
        return data[: rng.randrange(1, len(data))] if len(data) > 1 else data
    if how == 2:
        wrong = rng.choice([0, 1, max(len(body) - 3, 0), len(body) + 100, 127, 16_383])
        return bytes((first,)) + varint(wrong) + body
    if how == 3:
        return bytes((first,)) + bytes((0xFF, 0xFF, 0xFF, 0x7F)) + body  # 268 MB announced
    if how == 4:
        return bytes((first,)) + bytes((0xFF, 0xFF, 0xFF, 0xFF, 0x01)) + body  # 5-byte varint
    if how == 5:
        return rng.randbytes(rng.randint(1, 64))
    return mutate(data, rng) + mutate(data, rng)


@functools.cache
def sample_packets(level: int, login: Login) -> list[bytes]:
    """Valid encodings, at `level` (4: 3.1.1, 5: 5.0), of the packets the mutants damage."""
    v5 = level == 5
    props: dict[int, object] = {PropertyId.USER_PROPERTY: [("k", "v")]} if v5 else {}
    connect = Connect(
        "mutant",
        keepalive=30,
        username=login.username,
        password=login.password,
        will=Will("mutant/will", b"w", 1, properties=dict(props)),
        protocol_level=level,
        properties={PropertyId.SESSION_EXPIRY_INTERVAL: 0} if v5 else {},
    )
    packets: list[object] = [
        connect,
        Publish("mutant/a", b"x" * 40, 0, properties=dict(props)),
        Publish("mutant/b", b"y" * 200, 1, packet_id=7, properties=dict(props)),
        Publish("mutant/c", b"z", 2, packet_id=8),
        Subscribe(3, [Subscription("mutant/#", 1), Subscription("+/x", 0)]),
        Unsubscribe(4, ["mutant/#"]),
        Puback(9),
        Pubrel(10),
        Pingreq(),
        Disconnect(),
    ]
    if v5:
        packets.append(Auth(0x18, {PropertyId.AUTHENTICATION_METHOD: "SCRAM-SHA-256"}))
    return [codec.encode(packet, level) for packet in packets]  # type: ignore[arg-type]


class HostileClients:
    """All the hostile kinds, run together on an event loop of their own (a thread) for
    `seconds`; `outcomes` counts, per kind, how their connections went."""

    def __init__(self, port: int, login: Login, seconds: float, *, seed: int = 7) -> None:
        self.port = port
        self.login = login
        self.seconds = seconds
        self.rng = random.Random(seed)
        self.outcomes: Counter[str] = Counter()
        """`kind:outcome`, e.g. `flood:refused`, `silent:closed by server`."""
        self._sockets: set[socket.socket] = set()
        self._deadline = 0.0
        self._checks = 0
        self._thread = threading.Thread(target=self._main, name="hostile", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        """Wait for the run to end (`seconds`, then every socket is closed)."""
        self._thread.join(self.seconds + 30)
        assert not self._thread.is_alive(), "the hostile clients did not stop"

    def summary(self) -> dict[str, int]:
        """Connections made, and those the node refused (not accepted, closed, or answered
        with a refusing CONNACK), over all kinds."""
        made = sum(n for key, n in self.outcomes.items() if key.endswith(":connected"))
        refused = sum(
            n
            for key, n in self.outcomes.items()
            if key.split(":", 1)[1] in ("not accepted", "refused", "closed by server")
        )
        return {"connections made": made, "refused or closed by the node": refused}

    def _running(self) -> bool:
        """Whether the run goes on: until its deadline, and for MAX_ATTEMPTS * 100 checks in all
        at most (a bound on count as well as time)."""
        self._checks += 1
        return time.monotonic() < self._deadline and self._checks < MAX_ATTEMPTS * 100

    def _main(self) -> None:
        self._deadline = time.monotonic() + self.seconds
        asyncio.run(self._run())

    async def _run(self) -> None:
        workers: list[Awaitable[None]] = []

        def repeat(kind: str, count: int, attempt: Callable[[str], Awaitable[None]]) -> None:
            workers.extend(self._repeat(kind, attempt) for _ in range(count))

        repeat("mutant-preauth", 4, self._mutant_preauth)
        repeat("mutant-311", 3, self._mutant_logged_in)
        repeat("mutant-5", 3, self._mutant_logged_in)
        repeat("slowloris", 16, self._slowloris)
        repeat("silent", 32, self._silent)
        repeat("flood", 48, self._flood)
        workers += [self._non_reader() for _ in range(4)]
        workers += [self._subscribe_all(qos) for qos in (0, 1)]
        workers.append(self._noise())
        tasks = [asyncio.ensure_future(worker) for worker in workers]
        await asyncio.wait(tasks, timeout=self.seconds)
        for task in tasks:
            task.cancel()
        # Python 3.11's wait_for may swallow a cancellation: the workers see the deadline too.
        await asyncio.wait(tasks, timeout=20)
        for sock in list(self._sockets):
            sock.close()
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    async def _repeat(self, kind: str, attempt: Callable[[str], Awaitable[None]]) -> None:
        while self._running():
            await attempt(kind)
            await asyncio.sleep(0.01)

    async def _open(self, kind: str, rcvbuf: int = 0) -> socket.socket | None:
        """A non-blocking socket from the kind's address connected to the node, or None."""
        sock = socket.socket()
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        self._sockets.add(sock)
        try:
            sock.bind((ADDRESSES[kind], 0))
            await asyncio.wait_for(
                asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", self.port)), 5
            )
        except (OSError, TimeoutError):
            self._close(sock)
            self.outcomes[f"{kind}:not accepted"] += 1
            return None
        self.outcomes[f"{kind}:connected"] += 1
        return sock

    def _close(self, sock: socket.socket) -> None:
        self._sockets.discard(sock)
        with contextlib.suppress(OSError):
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
            )
        sock.close()

    async def _send(self, sock: socket.socket, data: bytes, timeout: float = 2.0) -> bool:
        """Send all of `data`; False when the node closed the socket or did not read in time."""
        try:
            await asyncio.wait_for(asyncio.get_running_loop().sock_sendall(sock, data), timeout)
        except (OSError, TimeoutError):
            return False
        return True

    async def _answer(self, sock: socket.socket, timeout: float) -> bytes | None:
        """What the node sends within `timeout`: bytes, b"" when it closed, None if nothing."""
        try:
            return await asyncio.wait_for(asyncio.get_running_loop().sock_recv(sock, 4096), timeout)
        except TimeoutError:
            return None
        except OSError:
            return b""

    def _ended(self, kind: str, answer: bytes | None) -> None:
        if answer is None:
            self.outcomes[f"{kind}:left open"] += 1
        elif not answer:
            self.outcomes[f"{kind}:closed by server"] += 1
        elif answer[0] >> 4 == 2 and len(answer) > 3 and answer[3] != 0:
            self.outcomes[f"{kind}:refused"] += 1
        else:
            self.outcomes[f"{kind}:answered"] += 1

    async def _mutant_preauth(self, kind: str) -> None:
        """A damaged packet (most often a CONNECT) as the first bytes of a connection."""
        level = self.rng.choice([4, 5])
        samples = sample_packets(level, self.login)
        data = mutate(samples[0] if self.rng.random() < 0.6 else self.rng.choice(samples), self.rng)
        sock = await self._open(kind)
        if sock is None:
            return
        try:
            await self._send(sock, data)
            self._ended(kind, await self._answer(sock, 0.3))
        finally:
            self._close(sock)

    async def _login(self, kind: str, sock: socket.socket, level: int, **connect: object) -> bool:
        """A valid CONNECT as the hostile user; True once CONNACK 0 came."""
        packet = Connect(
            f"{kind}-{self.rng.randrange(10**9)}",
            username=self.login.username,
            password=self.login.password,
            protocol_level=level,
            **connect,  # type: ignore[arg-type]
        )
        if not await self._send(sock, codec.encode(packet, level)):
            return False
        answer = await self._answer(sock, 10)
        ok = answer is not None and len(answer) >= 4 and answer[0] == 0x20 and answer[3] == 0
        if not ok:
            self._ended(kind, answer)
        return ok

    async def _mutant_logged_in(self, kind: str) -> None:
        """A valid login, then one to five damaged packets of its protocol level."""
        level = 5 if kind == "mutant-5" else 4
        samples = sample_packets(level, self.login)[1:]
        sock = await self._open(kind)
        if sock is None:
            return
        try:
            if not await self._login(kind, sock, level):
                return
            for _ in range(self.rng.randint(1, 5)):
                if not await self._send(sock, mutate(self.rng.choice(samples), self.rng)):
                    break
            self._ended(kind, await self._answer(sock, 0.3))
        finally:
            self._close(sock)

    async def _slowloris(self, kind: str) -> None:
        """A valid CONNECT, one byte a second, until the node closes the socket."""
        sock = await self._open(kind)
        if sock is None:
            return
        data = codec.encode(Connect("slow", username="slow", password=b"slow-password"))
        try:
            for byte in data:
                if not await self._send(sock, bytes((byte,))):
                    break
                answer = await self._answer(sock, 1.0)
                if answer is not None:
                    self._ended(kind, answer)
                    return
            self._ended(kind, await self._answer(sock, 15))
        finally:
            self._close(sock)

    async def _silent(self, kind: str) -> None:
        """Connected, never a byte: waits for the node to close it."""
        sock = await self._open(kind)
        if sock is None:
            return
        try:
            self._ended(kind, await self._answer(sock, 20))
        finally:
            self._close(sock)

    async def _flood(self, kind: str) -> None:
        """A wrong-password CONNECT, then 64 KiB PUBLISHes without waiting for the answer."""
        sock = await self._open(kind)
        if sock is None:
            return
        connect = Connect(
            f"flood-{self.rng.randrange(10**6)}", username=self.login.username, password=b"wrong"
        )
        publish = codec.encode(Publish("flood/x", b"f" * (64 * 1024)))
        answer = asyncio.ensure_future(self._answer(sock, 15))
        try:
            if await self._send(sock, codec.encode(connect)):
                for _ in range(64):
                    if answer.done() or not await self._send(sock, publish, timeout=0.2):
                        break
            self._ended(kind, await answer)
        finally:
            answer.cancel()
            self._close(sock)

    async def _hold(self, kind: str, subscriptions: list[Subscription], rcvbuf: int) -> None:
        """Log in (keepalive 0, so the node has no reason of its own to close it), subscribe,
        and never read again until the run ends (a failed login is tried again a second
        later)."""
        while self._running():
            sock = await self._open(kind, rcvbuf)
            if sock is not None and await self._login(kind, sock, 4, keepalive=0):
                await self._send(sock, codec.encode(Subscribe(1, subscriptions)))
                await asyncio.sleep(self._deadline - time.monotonic())
            if sock is not None:
                self._close(sock)
            await asyncio.sleep(1)

    async def _non_reader(self) -> None:
        """Logged in and subscribed to the honest topics at QoS 1, with a tiny receive
        buffer, never reading: the node's writes to it back up."""
        await self._hold(
            "non-reader", [Subscription("honest/#", 1), Subscription("noise/#", 0)], 4096
        )

    async def _subscribe_all(self, qos: int) -> None:
        """Logged in, subscribed to `#`, never reading."""
        await self._hold("subscribe-all", [Subscription("#", qos)], 0)

    async def _noise(self) -> None:
        """A logged-in publisher of 8 KiB QoS 0 messages (at most 200 a second) on noise/, so
        that the non-readers' queues fill."""
        kind = "subscribe-all"
        payload = b"n" * 8192
        while self._running():
            sock = await self._open(kind)
            if sock is None:
                await asyncio.sleep(1)
                continue
            try:
                if await self._login(kind, sock, 4, keepalive=0):
                    for n in range(MAX_ATTEMPTS):
                        if not self._running():
                            break
                        data = codec.encode(Publish(f"noise/{n % 16}", payload))
                        if not await self._send(sock, data):
                            break
                        await asyncio.sleep(0.005)
            finally:
                self._close(sock)
            await asyncio.sleep(1)
