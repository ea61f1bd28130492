"""`ConnectionPool`: the RocketMQ client's connections by address, and its retry policy.

One `RemotingConnection` per NameServer or broker address, opened on first use and opened again
after it was lost. `call` sends one request with bounded retries: at most `max_attempts` tries
within `retry_deadline` seconds, with exponential backoff (and jitter) between reconnects.
Every connection gets the pool's TLS context and request signer, if any.
"""

from __future__ import annotations

import asyncio
import random
import ssl
import time
from collections.abc import Mapping

from bridge.storage.rocketmq.acl import RequestSigner
from bridge.storage.rocketmq.connection import BrokerUnavailable, RemotingConnection
from bridge.storage.rocketmq.wire import RemotingCommand

__all__ = ["ConnectionPool"]


class ConnectionPool:
    """The open connections of one client, by address, and the retry policy of its requests.

    The settings are fixed at construction; every part of the client that sends requests reads
    them here (`request_timeout`, `max_attempts`, `retry_deadline`).
    """

    def __init__(
        self,
        *,
        request_timeout: float,
        connect_timeout: float,
        max_attempts: int,
        retry_deadline: float,
        backoff_initial: float,
        backoff_max: float,
        max_frame_size: int,
        ssl_context: ssl.SSLContext | None = None,
        signer: RequestSigner | None = None,
    ) -> None:
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout
        self.max_attempts = max_attempts
        self.retry_deadline = retry_deadline
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.max_frame_size = max_frame_size
        self.ssl_context = ssl_context
        """Every connection is TLS with this context (None: plain TCP)."""
        self.signer = signer
        """Signs every request (None: the cluster does not authenticate)."""
        self.closed = False
        """Set when the client closes: no connection is opened any more."""
        self._conns: dict[str, RemotingConnection] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def connection(self, addr: str) -> RemotingConnection:
        """The open connection to `addr`, opened now if needed (one attempt)."""
        conn = self._conns.get(addr)
        if conn is not None and not conn.closed:
            return conn
        lock = self._locks.setdefault(addr, asyncio.Lock())
        async with lock:
            conn = self._conns.get(addr)
            if conn is None or conn.closed:
                if self.closed:
                    raise BrokerUnavailable("client is closed", maybe_delivered=False)
                conn = await RemotingConnection.open(
                    addr,
                    connect_timeout=self.connect_timeout,
                    max_frame_size=self.max_frame_size,
                    ssl_context=self.ssl_context,
                    signer=self.signer,
                )
                self._conns[addr] = conn
            return conn

    def deadline(self) -> float:
        """The monotonic time by which an operation starting now must stop retrying."""
        return time.monotonic() + self.retry_deadline

    async def backoff(self, attempt: int, deadline: float) -> bool:
        """Sleep before retry `attempt` (1-based); False when out of attempts or time."""
        if attempt >= self.max_attempts:
            return False
        delay = min(self.backoff_max, self.backoff_initial * (2 ** (attempt - 1)))
        delay *= 0.5 + random.random() / 2
        if time.monotonic() + delay >= deadline:
            return False
        await asyncio.sleep(delay)
        return True

    async def call(
        self,
        addr: str,
        code: int,
        ext_fields: Mapping[str, str] | None = None,
        body: bytes = b"",
        *,
        timeout: float | None = None,
        idempotent: bool = True,
    ) -> RemotingCommand:
        """Send one request to `addr` with bounded retries; return the response.

        Connection failures are retried (at most `max_attempts` tries within `retry_deadline`);
        a request that may have reached the server is retried only if `idempotent`. Timeouts
        are not retried.
        """
        deadline = self.deadline()
        attempt = 0
        while True:
            attempt += 1
            try:
                conn = await self.connection(addr)
                return await conn.request(
                    code, ext_fields, body, timeout=timeout or self.request_timeout
                )
            except BrokerUnavailable as exc:
                if (exc.maybe_delivered and not idempotent) or not await self.backoff(
                    attempt, deadline
                ):
                    raise

    async def close(self) -> None:
        """Close every connection; none is opened after this."""
        self.closed = True
        conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            await conn.close()
