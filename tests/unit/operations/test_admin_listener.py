"""The admin listener's connection rules (bridge.operations.admin_listener) without a socket: a
fake transport and a fake aiohttp protocol show when a connection is closed for its request
head, when it is refused for the cap, and what the log filter makes of a parser's error."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp.http_exceptions import BadHttpMessage

from bridge.operations.admin_listener import (
    AdminConnections,
    _HeadDeadline,
    _MalformedRequests,
)

TIMEOUT = 0.05


class FakeTransport:
    """What the wrapper calls on a transport; `closed` is set when it is closed."""

    def __init__(self) -> None:
        self.closed = asyncio.Event()

    def close(self) -> None:
        self.closed.set()

    def is_closing(self) -> bool:
        return self.closed.is_set()

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else None


class FakeProtocol(asyncio.Protocol):
    """aiohttp's side: what it was handed."""

    def __init__(self) -> None:
        self.made = False
        self.data = b""
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.made = True

    def data_received(self, data: bytes) -> None:
        self.data += data

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True


def connect(
    connections: AdminConnections,
) -> tuple[_HeadDeadline, FakeProtocol, FakeTransport]:
    inner, transport = FakeProtocol(), FakeTransport()
    wrapper = _HeadDeadline(inner, connections)
    wrapper.connection_made(transport)  # type: ignore[arg-type]
    return wrapper, inner, transport


def test_a_connection_without_a_complete_head_is_closed_after_the_timeout() -> None:
    async def scenario() -> None:
        connections = AdminConnections(TIMEOUT, 10)
        wrapper, inner, transport = connect(connections)
        wrapper.data_received(b"GET / HT")
        await asyncio.wait_for(transport.closed.wait(), 5)
        assert inner.data == b"GET / HT" and connections.closed == 1

    asyncio.run(scenario())


def test_a_head_that_arrived_stops_the_clock_until_the_next_request_starts() -> None:
    async def scenario() -> None:
        connections = AdminConnections(TIMEOUT, 10)
        wrapper, _inner, transport = connect(connections)
        assert wrapper.waiting_for_head  # from the connection's start
        wrapper.data_received(b"GET / HTTP/1.1\r\n\r\n")
        connections.head_received(transport)
        assert not wrapper.waiting_for_head  # handled as long as it takes: no head clock
        wrapper.data_received(b"body bytes")
        assert not wrapper.waiting_for_head  # a body has its own limit (admin_body_timeout)
        connections.answered(transport)
        assert not wrapper.waiting_for_head  # idle: aiohttp's keep-alive timeout applies
        wrapper.data_received(b"GET /ne")  # the next request's first bytes start a new clock
        assert wrapper.waiting_for_head
        await asyncio.wait_for(transport.closed.wait(), 5)

    asyncio.run(scenario())


def test_a_connection_past_the_cap_is_closed_and_never_reaches_aiohttp() -> None:
    async def scenario() -> None:
        connections = AdminConnections(10.0, 2)
        first, _, _ = connect(connections)
        connect(connections)
        _, refused_inner, refused_transport = connect(connections)
        assert refused_transport.closed.is_set() and not refused_inner.made
        assert connections.refused == 1
        first.connection_lost(None)  # one slot freed
        _, inner, transport = connect(connections)
        assert inner.made and not transport.closed.is_set()

    asyncio.run(scenario())


def record_of(exc: BaseException) -> logging.LogRecord:
    return logging.LogRecord(
        "bridge.admin.http",
        logging.ERROR,
        __file__,
        1,
        "Error handling request from %s",
        ("10.0.0.9",),
        (type(exc), exc, None),
    )


def test_a_parser_error_becomes_one_warning_line_without_a_traceback() -> None:
    log_filter = _MalformedRequests()
    record = record_of(BadHttpMessage("Invalid header token:\n\n  b'Bad Header'\n  ^"))
    assert log_filter.filter(record)
    assert record.levelno == logging.WARNING and record.exc_info is None
    assert record.getMessage() == (
        "admin API: answered 400 to a malformed request from 10.0.0.9: "
        "\"Invalid header token: b'Bad Header' ^\" (0 more since the last line)"
    )
    assert not log_filter.filter(record_of(BadHttpMessage("again")))  # within 10 s: counted


def test_any_other_error_aiohttp_logs_keeps_its_traceback() -> None:
    record = record_of(RuntimeError("a bug of ours"))
    assert _MalformedRequests().filter(record)
    assert record.levelno == logging.ERROR and record.exc_info is not None
