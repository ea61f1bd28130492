"""Peer links: one long TCP connection per pair of nodes, carrying `bridge.cluster.wire` frames.

The node with the smaller id dials, the other accepts, so a pair never holds two links. A link
starts with the handshake of `bridge.cluster.handshake`: both sides prove the cluster secret
(over mutual TLS when `peer_tls_*` are set) before any other frame is read, within
`peer_handshake_timeout`, in frames of a few KiB at most. The authenticated peer is then admitted
or refused by its `LinkOwner` (the `Cluster`: a live member of the registry, at the boot the
registry shows, not replacing a live link); every refused link is logged with its remote address
(`PeerAuth.refusals`). Once admitted the link is up and the `LinkOwner` replays its interest.

Each side pings when it has sent nothing for `PING_INTERVAL`; a link the peer has been silent on
for `DEAD_AFTER` is closed (a peer that froze, a cable pulled without a RST). The dialing side
reconnects with backoff.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
import ssl
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

from bridge.cluster.handshake import (
    NONCE_BYTES,
    Handshake,
    HandshakeError,
    PeerAuthenticated,
    Role,
)
from bridge.cluster.peer_auth import PeerAuth
from bridge.cluster.wire import (
    Frame,
    PeerDecoder,
    PeerProtocolError,
    Ping,
    Pong,
    encode,
)

log = logging.getLogger("bridge.cluster")

PING_INTERVAL = 2.0
DEAD_AFTER = 10.0
WRITE_HIGH = 4 * 1024 * 1024
"""Bytes queued on a link beyond which QoS 0 messages to the peer are dropped (counted, logged),
as for a slow client: a flood must not queue without bound ahead of the link's control frames."""
DROP_LOG_INTERVAL = 10.0
BACKOFF_FIRST = 0.1
BACKOFF_MAX = 3.0


class LinkOwner(Protocol):
    """What a link uses of the membership that owns it (`bridge.cluster.cluster.Cluster`)."""

    node_id: str
    boot_id: str
    auth: PeerAuth

    async def admit(self, link: PeerLink) -> str:
        """Whether the peer that authenticated on `link` (its `peer_id`, `peer_boot`) may hold
        a link: "" if so, else why not (the link is then refused)."""
        ...

    def link_refused(self, address: str, reason: str) -> None:
        """A link from `address` was refused before it came up (counted, logged)."""
        ...

    def link_up(self, link: PeerLink) -> None:
        """The link finished its handshake and was admitted."""
        ...

    def link_down(self, link: PeerLink) -> None:
        """An up link was lost."""
        ...

    def on_frame(self, link: PeerLink, frame: Frame) -> None:
        """A frame (other than Hello, Ping, Pong) arrived on an up link."""
        ...

    def should_dial(self, node_id: str) -> bool:
        """Whether a link to `node_id` is still wanted."""
        ...

    def peer_address(self, node_id: str) -> str:
        """Where `node_id` listens now, as far as the membership knows."""
        ...


class PeerLink(asyncio.Protocol):
    """One link to a peer node: the handshake, then frames in, frames out, liveness."""

    def __init__(self, cluster: LinkOwner, expected_peer: str = "") -> None:
        self.cluster = cluster
        self.expected_peer = expected_peer
        self.peer_id = ""
        self.peer_boot = ""
        self.transport: asyncio.Transport | None = None
        self.decoder = PeerDecoder()
        self.up = False
        self.closed = False
        self.last_heard = time.monotonic()
        self.last_sent = self.last_heard
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.frames_out: Counter[str] = Counter()
        self.frames_in: Counter[str] = Counter()
        self.dropped = 0
        self._dropped_logged = 0
        self._drop_logged_at = 0.0
        self.remote = "?"
        """The remote address, for the log lines of a link that has no peer id yet."""
        self.handshake: Handshake | None = None
        """Until the link is up: the handshake, which alone reads what arrives."""
        self._deadline: asyncio.TimerHandle | None = None
        self._admission: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport
        peer = transport.get_extra_info("peername")
        if peer:
            self.remote = f"{peer[0]}:{peer[1]}"
        cluster = self.cluster
        self.handshake = Handshake(
            Role.DIALER if self.expected_peer else Role.ACCEPTOR,
            cluster.node_id,
            cluster.boot_id,
            cluster.auth.keys,
            secrets.token_bytes(NONCE_BYTES),
            expected_peer=self.expected_peer,
        )
        self._deadline = asyncio.get_running_loop().call_later(
            cluster.auth.handshake_timeout, self._handshake_expired
        )
        self._write_handshake()

    def send(self, frame: Frame) -> None:
        """Write a frame (dropped if the link is closed: its peer re-syncs on the next link)."""
        if self.closed or self.transport is None:
            return
        self.frames_out[type(frame).__name__] += 1
        self.last_sent = time.monotonic()
        self.transport.write(encode(frame))

    def send_droppable(self, data: bytes) -> bool:
        """Write an encoded QoS 0 frame unless the link is backed up; False if dropped."""
        transport = self.transport
        if self.closed or transport is None:
            return False
        if transport.get_write_buffer_size() > WRITE_HIGH:
            self.dropped += 1
            now = time.monotonic()
            if now - self._drop_logged_at > DROP_LOG_INTERVAL:
                log.warning(
                    "peer link to %s backed up (over %d bytes queued): %d QoS 0 messages "
                    "dropped so far",
                    self.peer_id,
                    WRITE_HIGH,
                    self.dropped,
                )
                self._drop_logged_at = now
            return False
        self.last_sent = time.monotonic()
        transport.write(data)
        return True

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.last_heard = time.monotonic()
        if self.handshake is not None:
            self._handshake_data(data)
        else:
            self._frames(data)

    def _frames(self, data: bytes) -> None:
        self.decoder.receive_data(data)
        try:
            while (frame := self.decoder.next_frame()) is not None:
                self.frames_in[type(frame).__name__] += 1
                if isinstance(frame, Ping):
                    self.send(Pong())
                elif not isinstance(frame, Pong):
                    self.cluster.on_frame(self, frame)
                if self.closed:
                    return
        except PeerProtocolError as exc:
            self.close(f"protocol error: {exc}")

    # -- the handshake ---------------------------------------------------------------------------

    def _handshake_data(self, data: bytes) -> None:
        handshake = self.handshake
        assert handshake is not None
        handshake.receive_data(data)
        try:
            event = handshake.next_event()
        except HandshakeError as exc:
            self.refuse(str(exc))
            return
        self._write_handshake()
        if event is not None:
            self._admission = asyncio.get_running_loop().create_task(self._admit(event))

    def _write_handshake(self) -> None:
        if self.handshake is not None and self.transport is not None:
            data = self.handshake.data_to_send()
            if data:
                self.last_sent = time.monotonic()
                self.transport.write(data)

    async def _admit(self, event: PeerAuthenticated) -> None:
        self.peer_id, self.peer_boot = event.node_id, event.boot_id
        try:
            reason = await self.cluster.admit(self)
        except Exception as exc:  # an admission fault refuses the link, never kills the loop
            log.exception("admitting peer %s failed", event.node_id)
            reason = f"admission failed: {exc}"
        if self.closed:
            return
        if reason:
            self.refuse(f"authenticated as {event.node_id} (boot {event.boot_id}) but {reason}")
            return
        handshake = self.handshake
        assert handshake is not None
        rest = handshake.admit()
        self._write_handshake()
        self.handshake = None
        if self._deadline is not None:
            self._deadline.cancel()
        self.up = True
        self.cluster.link_up(self)
        if rest and not self.closed:
            self._frames(rest)

    def _handshake_expired(self) -> None:
        if self.handshake is not None and not self.closed:
            timeout = self.cluster.auth.handshake_timeout
            self.refuse(f"no authenticated handshake within {timeout:g} s")

    def refuse(self, reason: str) -> None:
        """Close a link that has not come up, reporting it as refused (`LinkOwner.link_refused`)."""
        if self.closed:
            return
        self.cluster.link_refused(self.remote, reason)
        self.peer_id = ""  # a refused dial is no reconnection: the dialer keeps backing off
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def close(self, reason: str) -> None:
        """Close the link, logging why."""
        if self.closed:
            return
        log.warning("peer link to %s closed: %s", self.peer_id or "(unknown)", reason)
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        if self._admission is not None and not self._admission.done():
            self._admission.cancel()
        if not self.closed and self.handshake is not None:
            self.closed = True
            self.cluster.link_refused(self.remote, "closed by the peer during the handshake")
        if not self.closed and self.peer_id:
            log.warning("peer link to %s lost: %s", self.peer_id, exc or "closed by the peer")
        self.closed = True
        if not self.lost.done():
            self.lost.set_result(None)
        if self.up:
            self.up = False
            self.cluster.link_down(self)

    def check_alive(self, now: float) -> None:
        """Ping when this side has sent nothing for a while; close a link the peer has been
        silent on too long. Each side pings on its own sending silence, so a peer hears us even
        when its direction is flooded and its own pings queue behind the flood."""
        silent = now - self.last_heard
        if silent > DEAD_AFTER:
            # After a stall of this process, timers run before the reads that waited: look
            # again once the loop has read what arrived, before calling the peer silent.
            asyncio.get_running_loop().call_later(0.2, self._confirm_silence)
        elif now - self.last_sent > PING_INTERVAL:
            self.send(Ping())

    def _confirm_silence(self) -> None:
        silent = time.monotonic() - self.last_heard
        if silent > DEAD_AFTER:
            self.close(f"nothing heard for {silent:.1f} s")


async def listen(
    cluster: LinkOwner,
    host: str,
    port: int,
    accept_tls: Callable[[Callable[[], Any]], Callable[[], Any]] | None = None,
) -> asyncio.base_events.Server:
    """Accept links from peers on `host:port`, over TLS when the cluster's `PeerAuth` has it:
    through `accept_tls` if given (it wraps the protocol factory so that failed TLS handshakes
    are seen), else the event loop's own TLS."""
    factory: Callable[[], Any] = lambda: PeerLink(cluster)  # noqa: E731
    tls = cluster.auth.server_ssl
    if tls is not None and accept_tls is not None:
        factory, tls = accept_tls(factory), None
    return await asyncio.get_running_loop().create_server(
        factory,
        host,
        port,
        reuse_address=True,
        ssl=tls,
        ssl_handshake_timeout=cluster.auth.handshake_timeout if tls is not None else None,
    )


async def dial(cluster: LinkOwner, peer_id: str, address: str) -> None:
    """Keep a link to `peer_id` up while it is a live member: connect, wait until the link is
    lost, reconnect with backoff. Ends when the cluster no longer lists the peer as alive."""
    backoff = BACKOFF_FIRST
    loop = asyncio.get_running_loop()
    auth = cluster.auth
    while cluster.should_dial(peer_id):
        host, _, port = address.rpartition(":")
        try:
            _transport, link = await asyncio.wait_for(
                loop.create_connection(
                    lambda: PeerLink(cluster, peer_id),
                    host,
                    int(port),
                    ssl=auth.client_ssl,
                    ssl_handshake_timeout=auth.handshake_timeout if auth.tls else None,
                ),
                timeout=DEAD_AFTER,
            )
        except ssl.SSLError as exc:
            log.warning("peer %s at %s: TLS handshake failed: %s", peer_id, address, exc)
        except (OSError, TimeoutError) as exc:
            log.debug("peer %s at %s: cannot connect: %s", peer_id, address, exc)
        else:
            await link.lost
            if link.up or link.peer_id:
                backoff = BACKOFF_FIRST
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, BACKOFF_MAX)
        address = cluster.peer_address(peer_id) or address


def advertise_address(host: str, port: int) -> str:
    """Where peers reach this node: the listen host, or this machine's name for a wildcard."""
    if host in ("", "0.0.0.0", "::"):
        host = socket.gethostname()
    return f"{host}:{port}"
