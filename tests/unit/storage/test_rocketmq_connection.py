"""`RemotingConnection` without a broker: what leaves on the socket, in which order and form.

A recording transport stands in for the TCP socket (the connection is fed through the same
asyncio protocol a real socket uses); the frames are read back with the wire codec.
"""

from __future__ import annotations

import asyncio
from typing import Any

from bridge.storage.rocketmq.connection import (
    BINARY_HEADER_REQUESTS,
    RemotingConnection,
    _Protocol,
)
from bridge.storage.rocketmq.wire import (
    RequestCode,
    SerializeType,
)
from tests.support.transport import RecordingTransport


def _connected() -> tuple[RemotingConnection, RecordingTransport]:
    conn = RemotingConnection("127.0.0.1:1")
    transport = RecordingTransport()
    _Protocol(conn).connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


def _ignore(_response: Any, _error: Any) -> None:
    return None


def test_requests_written_in_one_loop_turn_leave_in_one_socket_write_in_order() -> None:
    async def main() -> None:
        conn, transport = _connected()
        opaques = [
            conn.request_nowait(RequestCode.SEND_MESSAGE_V2, {"b": f"t{i}"}, b"body%d" % i, _ignore)
            for i in range(5)
        ]
        assert transport.writes == []  # nothing before the turn ends
        await asyncio.sleep(0)
        assert len(transport.writes) == 1
        frames = transport.frames()
        assert [f.opaque for f in frames] == opaques
        assert [f.body for f in frames] == [b"body%d" % i for i in range(5)]
        # The next turn's requests go in a write of their own, after the first.
        conn.request_nowait(RequestCode.SEND_MESSAGE_V2, {"b": "late"}, b"late", _ignore)
        await asyncio.sleep(0)
        assert len(transport.writes) == 2
        assert transport.frames()[-1].body == b"late"

    asyncio.run(main())


def test_hot_path_requests_carry_the_binary_header_and_others_json() -> None:
    async def main() -> None:
        conn, transport = _connected()
        conn.request_nowait(RequestCode.SEND_MESSAGE_V2, {"b": "t"}, b"x", _ignore)
        conn.request_nowait(RequestCode.HEART_BEAT, {}, b"{}", _ignore)
        conn.request_nowait(RequestCode.PULL_MESSAGE, {"topic": "t"}, b"", _ignore)
        await asyncio.sleep(0)
        kinds = {f.code: f.serialize_type for f in transport.frames()}
        assert kinds == {
            RequestCode.SEND_MESSAGE_V2: SerializeType.ROCKETMQ,
            RequestCode.HEART_BEAT: SerializeType.JSON,
            RequestCode.PULL_MESSAGE: SerializeType.ROCKETMQ,
        }
        assert RequestCode.SEND_MESSAGE_V2 in BINARY_HEADER_REQUESTS
        # The binary header keeps every field as sent.
        send = next(f for f in transport.frames() if f.code == RequestCode.SEND_MESSAGE_V2)
        assert send.ext_fields == {"b": "t"}

    asyncio.run(main())


def test_frames_written_before_close_still_leave_and_a_lost_connection_drops_the_rest() -> None:
    async def main() -> None:
        conn, transport = _connected()
        conn.request_nowait(RequestCode.SEND_MESSAGE_V2, {"b": "t"}, b"before close", _ignore)
        await conn.close()
        assert [f.body for f in transport.frames()] == [b"before close"]
        assert transport.closed

        errors: list[Any] = []
        lost, lost_transport = _connected()
        lost.request_nowait(
            RequestCode.SEND_MESSAGE_V2, {"b": "t"}, b"never", lambda r, e: errors.append(e)
        )
        _Protocol(lost).connection_lost(ConnectionResetError("reset"))
        await asyncio.sleep(0)
        assert lost_transport.writes == []  # not written to a dead socket
        assert len(errors) == 1 and "lost" in str(errors[0])

    asyncio.run(main())
