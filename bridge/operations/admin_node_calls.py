"""The admin API's side of node-to-node calls: signing the requests this node sends to other
members' admin APIs (the fan-out of `admin_fanout`, a client inspected or kicked where it lives)
and authenticating those other members send here. The rules themselves (what is signed, what is
accepted) are `bridge.operations.node_calls`; this is the aiohttp glue around them.

A node never sends the operator's bearer token to another node: the address it sends to comes
from Redis, and whoever can write there could collect the token. A node call carries only its
signature, which is good for one request, to one node, for `WINDOW` seconds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from aiohttp import web
from yarl import URL

from bridge.access.ratelimit import LogThrottle
from bridge.operations.admin_bodies import read_body
from bridge.operations.admin_requests import ApiError
from bridge.operations.node_calls import (
    CALLER_HEADER,
    NodeCallRefused,
    NodeCallVerifier,
    admin_call_keys,
    sign_call,
)

log = logging.getLogger("bridge.admin")

NODE_CALLER: web.RequestKey[str] = web.RequestKey("node_caller", str)
"""Set on a request that was authenticated as a node call: the calling node's id."""
REFUSAL_LOG_INTERVAL = 10.0
"""Seconds between log lines about refused node calls (the others are counted, not logged)."""
CHALLENGE = 'BridgeNodeSignature realm="mqtt-bridge"'
NODE_CALL_BODY = 1024
"""The largest body read to check a node call's signature: the calls the fan-out makes carry
none, and the body is read before the caller is known."""


class NodeCalls:
    """Signs this node's calls to other members and authenticates theirs, with the keys derived
    from the cluster secrets (none: this node neither makes nor accepts node calls). A call's
    body must arrive within `body_timeout` seconds."""

    def __init__(self, node_id: str, cluster_secrets: Sequence[bytes], body_timeout: float) -> None:
        self.node_id = node_id
        self.body_timeout = body_timeout
        self.keys = admin_call_keys(cluster_secrets)
        self.verifier = NodeCallVerifier(node_id, self.keys)
        self.refused = 0
        """Node calls refused since start (every one, logged or not)."""
        self._throttle = LogThrottle(REFUSAL_LOG_INTERVAL)

    @property
    def can_call(self) -> bool:
        """Whether this node has a cluster secret to sign calls with."""
        return bool(self.keys)

    def signed_headers(self, method: str, url: URL, target: str) -> dict[str, str]:
        """The headers of a body-less call to node `target` at `url` (as it will be sent)."""
        return sign_call(
            self.keys[0], method, url.raw_path_qs, b"", self.node_id, target, time.time()
        )

    async def authenticate(self, request: web.Request, accepted_here: bool) -> None:
        """Accept `request` as a node call (`NODE_CALLER` is set) or raise a 401 naming the
        fault. `accepted_here`: whether its route is one the fan-out calls."""
        try:
            if not accepted_here:
                raise NodeCallRefused(f"{request.method} {request.path} does not accept node calls")
            body = await read_body(request, NODE_CALL_BODY, self.body_timeout)
            caller = self.verifier.verify(
                request.method, request.raw_path, body, request.headers, time.time()
            )
        except NodeCallRefused as exc:
            self._log_refusal(request, str(exc))
            raise ApiError(
                401, f"node call refused: {exc}", {"WWW-Authenticate": CHALLENGE}
            ) from None
        request[NODE_CALLER] = caller

    def _log_refusal(self, request: web.Request, reason: str) -> None:
        self.refused += 1
        log_it, suppressed = self._throttle.note(time.monotonic())
        if log_it:
            more = f" ({suppressed} more refused since the last line)" if suppressed else ""
            log.warning(
                "admin API: refused a node call %s %s from %s (says it is node %r): %s%s",
                request.method,
                request.path,
                request.remote,
                request.headers.get(CALLER_HEADER),
                reason,
                more,
            )


def forwarded_by(request: web.Request) -> str | None:
    """The calling node's id if `request` is an authenticated node call (it is answered by this
    node alone, never sent on), None if an operator made it."""
    return request.get(NODE_CALLER)
