"""Ending a client's socket so that the client reads why it was closed.

`Connection.close` decides that a connection ends and flushes what it queued (a CONNACK with a
refusal code, a DISCONNECT with a reason); this is how the socket itself ends afterwards.
"""

from __future__ import annotations

import asyncio

LINGER_SECONDS = 1.0
"""How long a closed connection still reads after telling the client why (`end_socket`)."""


def end_socket(transport: asyncio.Transport, loop: asyncio.AbstractEventLoop, told: bool) -> None:
    """Close `transport`. If the last write `told` the client why, half-close and read (and
    drop) what the client still sends for a moment: a client that writes after our last packet
    would otherwise get a reset, which can discard the DISCONNECT or CONNACK that says why
    before it reads it."""
    if told and _can_write_eof(transport):
        transport.write_eof()
        transport.resume_reading()
        loop.call_later(LINGER_SECONDS, transport.close)
    else:
        transport.close()


def _can_write_eof(transport: asyncio.Transport) -> bool:
    try:
        return transport.can_write_eof()
    except NotImplementedError:  # a transport of our own (WebSocket) that cannot
        return False
