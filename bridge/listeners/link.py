"""What the helpers of a connection (`inbound`, `delivery_acks`, `enhanced_auth`) use of it.

`Connection` fulfils this; the helpers never import it, so the listeners' modules form no
circle.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from bridge.listeners.v5 import Version5
    from bridge.node import Node
    from bridge.node.flow import ConnectionFlow
    from bridge.node.roles import Drain
    from bridge.session import Session


class Link(Protocol):
    """One client connection, as its helpers see it."""

    node: Node
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport | None
    session: Session | None
    delivery: Drain | None
    flow: ConnectionFlow
    v5: Version5 | None
    client_id: str
    peer: str
    username: str | None
    closed: bool
    receive_maximum: int

    def send(self, data: bytes) -> None:
        """Queue an encoded packet."""
        ...

    def hold_reading(self, reason: int) -> None:
        """Stop reading the socket until `release_reading(reason)` (a `PAUSED_*` of
        `bridge.node.flow`)."""
        ...

    def release_reading(self, reason: int) -> None:
        """End one reason to stop reading; with none left, read on."""
        ...

    def close(
        self,
        reason: str,
        *,
        taken_over: bool = False,
        log_it: bool = True,
        reason_code: int | None = None,
        server_reference: str = "",
        discard_queued: bool = False,
    ) -> None:
        """Close (a v5 client first gets DISCONNECT with `reason_code`), logging why; with
        `discard_queued`, what was queued and not yet written is dropped."""
        ...
