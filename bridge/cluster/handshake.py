"""The start of a peer link: both ends prove they hold the cluster secret before any other frame.

PURE: no sockets, no event loop, no clock. `Handshake.receive_data(bytes)` buffers what arrived,
`next_event()` returns `PeerAuthenticated` once the peer has proved itself (None: need more
data), `data_to_send()` returns the bytes to write. Every rule is unit-tested with byte literals
(tests/unit/cluster/test_peer_handshake.py). The asyncio glue (deadline, admission against the
registry, logging) is `bridge.cluster.peers`.

The exchange, with a shared secret::

    dialer                                          acceptor
      Hello(version, id, boot, nonce)   ---->
                                        <----       Hello(version, id, boot, nonce)
      Proof(mac as dialer)              ---->       checks it; the node admits the peer
                                        <----       Proof(mac as acceptor)
      checks it; the node admits the peer

The MAC (`proof_mac`) covers the prover's role and both `Hello`s whole: both node ids, both boot
ids and both nonces. Each side's nonce is fresh, so a proof captured on one link proves nothing
on another (no replay); the role is in it, so an acceptor's proof sent back to it as a dialer's
fails (no reflection); the node ids are in it, so a proof binds the id the link will carry. The
acceptor proves itself only after the dialer has: a stranger dialing in learns no MAC at all.

Without a secret (peer TLS alone, the certificates authenticate both ends) the handshake is the
two `Hello`s; the glue then binds the claimed node id to the peer's certificate.

Until the peer has proved itself, a frame may be at most `HANDSHAKE_MAX_FRAME` bytes and only
the frame the state expects is accepted: a stranger can make a node hold a few KiB, no more.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from bridge.cluster.wire import (
    VERSION,
    Frame,
    Hello,
    PeerProtocolError,
    Proof,
    decode_frame,
    encode,
)

NONCE_BYTES = 32
"""Length of each side's `Hello` nonce."""
HANDSHAKE_MAX_FRAME = 4096
"""Largest frame accepted before the peer is authenticated (a `Hello` is well under 1 KiB)."""
_PROOF_CONTEXT = b"mqtt-bridge peer-link proof v2\x00"


class Role(Enum):
    """Which end of the link this side is: the dialer connects, the acceptor listens."""

    DIALER = b"D"
    ACCEPTOR = b"A"

    @property
    def other(self) -> Role:
        """The role of the other end."""
        return Role.ACCEPTOR if self is Role.DIALER else Role.DIALER


class HandshakeState(Enum):
    """Where the handshake stands (`Handshake.state`)."""

    AWAIT_HELLO = "await-hello"
    AWAIT_PROOF = "await-proof"
    AUTHENTICATED = "authenticated"
    """The peer proved itself; the node decides whether to admit it (`Handshake.admit`)."""
    DONE = "done"
    FAILED = "failed"


class HandshakeError(Exception):
    """The peer is refused: its bytes are not a handshake, or its proof is wrong. The message
    says why (it is logged with the peer's address)."""


@dataclass(frozen=True, slots=True)
class PeerAuthenticated:
    """The peer proved it holds a cluster secret (or, without one, sent a valid `Hello` over
    a verified TLS link) and claims this node id and boot id."""

    node_id: str
    boot_id: str


def proof_mac(key: bytes, prover: Role, dialer: Hello, acceptor: Hello) -> bytes:
    """The MAC the `prover` sends: HMAC-SHA-256 over the prover's role and both `Hello`s as
    encoded on the wire (length-prefixed fields, so no two transcripts share bytes)."""
    return _mac_over(key, prover, encode(dialer) + encode(acceptor))


def _mac_over(key: bytes, prover: Role, hellos: bytes) -> bytes:
    message = b"".join((_PROOF_CONTEXT, prover.value, hellos))
    return hmac.new(key, message, hashlib.sha256).digest()


class Handshake:
    """One side's handshake (see the module docstring). `keys` are the peer-link keys derived
    from the node's secrets: the first proves this side, any of them verifies the peer (secret
    rotation). No keys: the transport (mutual TLS) authenticates, the `Hello`s are exchanged."""

    def __init__(
        self,
        role: Role,
        node_id: str,
        boot_id: str,
        keys: Sequence[bytes],
        nonce: bytes,
        *,
        expected_peer: str = "",
    ) -> None:
        if len(nonce) != NONCE_BYTES:
            raise ValueError(f"nonce must be {NONCE_BYTES} bytes")
        self.role = role
        self.keys = tuple(keys)
        self.expected_peer = expected_peer
        """The node id a dialer dialed ("" for the acceptor: any member may dial in)."""
        self.own_hello = Hello(VERSION, node_id, boot_id, nonce)
        self.peer_hello: Hello | None = None
        self._hellos = b""
        """Both `Hello`s as the MAC covers them, dialer's first (set with `peer_hello`)."""
        self.state = HandshakeState.AWAIT_HELLO
        self._buffer = bytearray()
        self._own_bytes = encode(self.own_hello)
        self._outbox = bytearray(self._own_bytes)

    # -- the sans-IO surface -----------------------------------------------------------------------

    def data_to_send(self) -> bytes:
        """The bytes to write to the peer now (and forget)."""
        data = bytes(self._outbox)
        self._outbox.clear()
        return data

    def receive_data(self, data: bytes) -> None:
        """Append bytes read from the link."""
        self._buffer += data

    def next_event(self) -> PeerAuthenticated | None:
        """`PeerAuthenticated` once the peer proved itself (returned once), None until more
        bytes arrive or after that. Raises HandshakeError when the peer is to be refused (the
        handshake is FAILED from then on)."""
        try:
            while self.state in (HandshakeState.AWAIT_HELLO, HandshakeState.AWAIT_PROOF):
                frame = self._next_frame()
                if frame is None:
                    return None
                if self.state is HandshakeState.AWAIT_HELLO:
                    event = self._on_hello(frame)
                else:
                    event = self._on_proof(frame)
                if event is not None:
                    return event
        except HandshakeError:
            self.state = HandshakeState.FAILED
            raise
        return None

    def admit(self) -> bytes:
        """The node admits the authenticated peer: the acceptor now proves itself (see
        `data_to_send`). Returns the bytes that arrived after the handshake: the link's first
        frames, for the link's frame decoder."""
        if self.state is not HandshakeState.AUTHENTICATED:
            raise RuntimeError(f"admit() in state {self.state.value}")
        if self.role is Role.ACCEPTOR and self.keys:
            self._outbox += encode(Proof(self._mac(self.keys[0], Role.ACCEPTOR)))
        self.state = HandshakeState.DONE
        rest = bytes(self._buffer)
        self._buffer.clear()
        return rest

    # -- the rules ---------------------------------------------------------------------------------

    def _next_frame(self) -> Frame | None:
        buffer = self._buffer
        if len(buffer) < 4:
            return None
        length = int.from_bytes(buffer[:4], "big")
        if length > HANDSHAKE_MAX_FRAME:
            raise HandshakeError(
                f"a frame of {length} bytes before the handshake (at most {HANDSHAKE_MAX_FRAME})"
            )
        if len(buffer) < 4 + length:
            return None
        body = bytes(buffer[4 : 4 + length])
        del buffer[: 4 + length]
        if body[:1] == bytes((Hello.TYPE,)) and len(body) >= 9:
            version = int.from_bytes(body[1:9], "big")
            if version != VERSION:
                raise HandshakeError(
                    f"the peer speaks peer protocol version {version}, this node {VERSION} "
                    "(upgrade every node; see docs/operations.md)"
                )
        try:
            return decode_frame(body)
        except PeerProtocolError as exc:
            raise HandshakeError(f"not a handshake frame: {exc}") from None

    def _authenticated(self) -> PeerAuthenticated:
        assert self.peer_hello is not None
        self.state = HandshakeState.AUTHENTICATED
        return PeerAuthenticated(self.peer_hello.node_id, self.peer_hello.boot_id)

    def _on_hello(self, frame: Frame) -> PeerAuthenticated | None:
        if not isinstance(frame, Hello):
            raise HandshakeError(f"expected Hello, got {type(frame).__name__}")
        own = self.own_hello
        if not frame.node_id or not frame.boot_id:
            raise HandshakeError("Hello without a node id or boot id")
        if frame.node_id == own.node_id:
            raise HandshakeError("a link to this node itself (two nodes share a node_id?)")
        if len(frame.nonce) != NONCE_BYTES or frame.nonce == own.nonce:
            raise HandshakeError("Hello with a bad nonce")
        if self.expected_peer and frame.node_id != self.expected_peer:
            raise HandshakeError(f"dialed {self.expected_peer} but {frame.node_id} answered")
        self.peer_hello = frame
        peer_bytes = encode(frame)
        if self.role is Role.DIALER:
            self._hellos = self._own_bytes + peer_bytes
        else:
            self._hellos = peer_bytes + self._own_bytes
        if not self.keys:
            return self._authenticated()
        if self.role is Role.DIALER:
            self._outbox += encode(Proof(self._mac(self.keys[0], Role.DIALER)))
        self.state = HandshakeState.AWAIT_PROOF
        return None

    def _on_proof(self, frame: Frame) -> PeerAuthenticated:
        if not isinstance(frame, Proof):
            raise HandshakeError(f"expected Proof, got {type(frame).__name__}")
        peer_role = self.role.other
        # Every key is checked, whichever matches: the time taken says nothing about which.
        matches = [hmac.compare_digest(frame.mac, self._mac(k, peer_role)) for k in self.keys]
        if not any(matches):
            raise HandshakeError("wrong proof of the cluster secret")
        return self._authenticated()

    def _mac(self, key: bytes, prover: Role) -> bytes:
        assert self._hellos
        return _mac_over(key, prover, self._hellos)
