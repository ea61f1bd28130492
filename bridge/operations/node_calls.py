"""Node-to-node admin calls: how one node signs a request to another node's admin API, and how
the receiving node checks it. Pure: no sockets, no event loop, no clock of its own (the caller
passes `now`), so every rule is tested with literals.

Why: the admin fan-out (console totals and searches, a client inspected or kicked where its
session lives) sends requests to the admin address each member writes into Redis. Whoever can
write into Redis can make that address theirs, so what travels there must be worthless to them:
never the operator's bearer token, only a signature that proves membership of the cluster for
this one request to this one node, once, for a few seconds.

The signature is HMAC-SHA-256, with the key derived from the cluster secret for `ADMIN_CALLS`
(`bridge.cluster.credential`), over (one field a line, see `signed_text`):

    mqtt-bridge/admin-call/v1, METHOD, path?query (as sent, percent-encoded),
    SHA-256 of the body, timestamp, nonce, calling node id, target node id

The target is bound: a request captured at a wrong address (an impostor's entry in Redis) names
the impostor as its target and no real node accepts it. The timestamp bounds how long a captured
request is worth anything (`WINDOW` seconds either side of the receiver's clock) and the nonce,
remembered by the receiver for that long, makes each signed request good for one use.

Rotation: a node signs with its first secret and accepts a signature made with any of them.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping, Sequence

from bridge.cluster.credential import ADMIN_CALLS, derive_key

CALLER_HEADER = "X-Bridge-Forwarded-By"
"""The calling node's id. A request that carries it is a node call and must be signed."""
TARGET_HEADER = "X-Bridge-Target"
"""The node the call is meant for (bound into the signature)."""
TIMESTAMP_HEADER = "X-Bridge-Timestamp"
"""When the call was signed: Unix time, whole seconds."""
NONCE_HEADER = "X-Bridge-Nonce"
"""128 random bits in hex: each signed call is accepted once."""
SIGNATURE_HEADER = "X-Bridge-Signature"
"""HMAC-SHA-256 of `signed_text`, hex."""
NODE_CALL_HEADERS = (CALLER_HEADER, TARGET_HEADER, TIMESTAMP_HEADER, NONCE_HEADER, SIGNATURE_HEADER)

VERSION = "mqtt-bridge/admin-call/v1"
WINDOW = 30.0
"""Seconds a signed call stays acceptable either side of the receiver's clock (clock skew plus
the time a call takes); also how long the receiver remembers its nonce."""
MAX_NONCES = 10_000
"""Nonces remembered at once. Only calls with a valid signature are remembered, so only a
member can fill it; beyond it calls are refused until old nonces expire, never forgotten early
(forgetting early would let a captured call be replayed)."""

_NONCE = re.compile(r"[0-9a-f]{32}")
_SIGNATURE = re.compile(r"[0-9a-f]{64}")
_TIMESTAMP = re.compile(r"[0-9]{1,12}")


class NodeCallRefused(Exception):
    """A node call that is not accepted; the message names the fault (it goes into the 401)."""


def admin_call_keys(cluster_secrets: Sequence[bytes]) -> tuple[bytes, ...]:
    """The keys that sign admin calls, one per cluster secret, in the same order (the first
    signs, any verifies)."""
    return tuple(derive_key(secret, ADMIN_CALLS) for secret in cluster_secrets)


def signed_text(
    method: str,
    path_qs: str,
    body: bytes,
    timestamp: str,
    nonce: str,
    caller: str,
    target: str,
) -> bytes:
    """What the signature covers, one field a line. No field may hold a line break (header
    values cannot, and a path as sent cannot), so no two calls share a text."""
    fields = (
        VERSION,
        method.upper(),
        path_qs,
        hashlib.sha256(body).hexdigest(),
        timestamp,
        nonce,
        caller,
        target,
    )
    if any("\n" in field or "\r" in field for field in fields):
        raise ValueError("a node call's fields hold no line breaks")
    return "\n".join(fields).encode()


def sign_call(
    key: bytes,
    method: str,
    path_qs: str,
    body: bytes,
    caller: str,
    target: str,
    now: float,
    nonce: str | None = None,
) -> dict[str, str]:
    """The headers that make a request from node `caller` to node `target` a signed node call
    (`nonce` is random unless given, for tests)."""
    timestamp = str(int(now))
    nonce = secrets.token_hex(16) if nonce is None else nonce
    text = signed_text(method, path_qs, body, timestamp, nonce, caller, target)
    return {
        CALLER_HEADER: caller,
        TARGET_HEADER: target,
        TIMESTAMP_HEADER: timestamp,
        NONCE_HEADER: nonce,
        SIGNATURE_HEADER: hmac.new(key, text, hashlib.sha256).hexdigest(),
    }


def is_node_call(headers: Mapping[str, str]) -> bool:
    """Whether a request presents itself as a node call (carries any of its headers)."""
    return any(name in headers for name in NODE_CALL_HEADERS)


class NodeCallVerifier:
    """The receiving side: accepts a node call only if it is meant for this node, fresh, signed
    with a key of this cluster, and not seen before. Owns the nonces it has seen (bounded, each
    forgotten when its call could no longer be accepted anyway)."""

    def __init__(
        self,
        node_id: str,
        keys: Sequence[bytes],
        window: float = WINDOW,
        max_nonces: int = MAX_NONCES,
    ) -> None:
        self.node_id = node_id
        self.keys = tuple(keys)
        self.window = window
        self.max_nonces = max_nonces
        self._seen: dict[str, float] = {}
        """nonce -> when it may be forgotten (its timestamp plus the window); insertion order is
        not expiry order (timestamps vary by the callers' clocks), so expiry scans them all."""
        self._next_sweep = 0.0

    def verify(
        self, method: str, path_qs: str, body: bytes, headers: Mapping[str, str], now: float
    ) -> str:
        """The calling node's id if the call is accepted; `NodeCallRefused` naming the fault
        otherwise. An accepted call's nonce is remembered: the same call is refused next time."""
        if not self.keys:
            raise NodeCallRefused("this node has no cluster secret: it accepts no node calls")
        missing = [name for name in NODE_CALL_HEADERS if not headers.get(name)]
        if missing:
            raise NodeCallRefused(f"node call without {', '.join(missing)}")
        caller = headers[CALLER_HEADER]
        target = headers[TARGET_HEADER]
        timestamp = headers[TIMESTAMP_HEADER]
        nonce = headers[NONCE_HEADER]
        signature = headers[SIGNATURE_HEADER]
        if target != self.node_id:
            raise NodeCallRefused(
                f"node call signed for node {target!r}, but this is node {self.node_id!r}"
            )
        if not _TIMESTAMP.fullmatch(timestamp):
            raise NodeCallRefused(f"{TIMESTAMP_HEADER} is not Unix time in seconds")
        age = now - int(timestamp)
        if abs(age) > self.window:
            raise NodeCallRefused(
                f"node call signed {age:+.0f} s from this node's clock (allowed: "
                f"{self.window:.0f} s either way): expired, or the nodes' clocks disagree"
            )
        if not _NONCE.fullmatch(nonce):
            raise NodeCallRefused(f"{NONCE_HEADER} is not 32 lowercase hex digits")
        if not _SIGNATURE.fullmatch(signature):
            raise NodeCallRefused(f"{SIGNATURE_HEADER} is not 64 lowercase hex digits")
        try:
            text = signed_text(method, path_qs, body, timestamp, nonce, caller, target)
        except ValueError:
            raise NodeCallRefused("node call fields hold line breaks") from None
        presented = signature.encode()
        # Every key is tried (no early exit), so the time taken does not say which one matched.
        matched = False
        for key in self.keys:
            expected = hmac.new(key, text, hashlib.sha256).hexdigest().encode()
            matched |= hmac.compare_digest(presented, expected)
        if not matched:
            raise NodeCallRefused(
                f"node call from {caller!r} has a wrong signature (another cluster secret, or "
                "the request was altered)"
            )
        self._forget_expired(now)
        if nonce in self._seen:
            raise NodeCallRefused(f"node call from {caller!r} replayed (nonce seen before)")
        if len(self._seen) >= self.max_nonces:
            raise NodeCallRefused(
                f"more than {self.max_nonces} node calls in {self.window:.0f} s: refused until "
                "older ones expire"
            )
        self._seen[nonce] = int(timestamp) + self.window
        return caller

    @property
    def remembered(self) -> int:
        """How many nonces are remembered now."""
        return len(self._seen)

    def _forget_expired(self, now: float) -> None:
        # A sweep at most once a second keeps the cost of a call flat; a full table is swept
        # at once, so a burst is refused only while its nonces are truly still live.
        if now < self._next_sweep and len(self._seen) < self.max_nonces:
            return
        self._next_sweep = now + 1.0
        expired = [nonce for nonce, until in self._seen.items() if until < now]
        for nonce in expired:
            del self._seen[nonce]
