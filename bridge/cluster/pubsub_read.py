"""Reading a subscribed redis-py pubsub connection without `listen()`.

redis-py (8.1) answers a blocking read whose socket failed with a time-out (ETIMEDOUT after a
long network cut) with None, as if no message had come, and `listen()` reads the dead socket
again at once, for ever, without yielding: a node spun at 100% CPU and served nothing (found
by the nemesis). `published` reads the connection itself and takes None for the failure it is.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any


async def published(pubsub: Any, what: str) -> AsyncIterator[dict[str, Any]]:
    """Every message published to what `pubsub` subscribed to (subscription confirmations
    left out). Raises ConnectionError, naming `what`, when the connection timed out; redis-py's
    errors when it failed otherwise."""
    while True:
        response = await pubsub.parse_response(block=True)
        if response is None:
            raise ConnectionError(f"the connection following {what} timed out")
        message = await pubsub.handle_message(response)
        if message is not None and message.get("type") == "message":
            yield message
