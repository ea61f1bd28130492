"""Pieces shared by the RocketMQ codec modules: the protocol error and a bounds-checked reader.

`bridge.storage.rocketmq.wire` (frames) and `bridge.storage.rocketmq.messages` (stored messages)
both build on these; they live apart so that the message codec need not import the frame codec,
which re-exports the message codec's names. Pure, no I/O.
"""

from __future__ import annotations

import struct
from typing import Any, Final

__all__ = ["DEFAULT_MAX_FRAME_SIZE", "ByteReader", "RemotingProtocolError"]


DEFAULT_MAX_FRAME_SIZE: Final = 16 * 1024 * 1024
"""The broker's default `com.rocketmq.remoting.frameMaxLength` (16 MiB)."""


class RemotingProtocolError(Exception):
    """Bytes that are not a valid RocketMQ remoting frame or stored message."""


class ByteReader:
    """Bounds-checked big-endian reads from a bytes-like object."""

    __slots__ = ("data", "end", "pos", "what")

    def __init__(self, data: bytes | memoryview, what: str, pos: int = 0, end: int = -1) -> None:
        self.data = data
        self.pos = pos
        self.end = len(data) if end < 0 else end
        self.what = what

    def take(self, n: int) -> bytes:
        """The next `n` bytes; RemotingProtocolError if fewer are left."""
        if n < 0 or self.pos + n > self.end:
            raise RemotingProtocolError(
                f"{self.what}: needs {n} bytes at offset {self.pos},"
                f" only {self.end - self.pos} left"
            )
        chunk = bytes(self.data[self.pos : self.pos + n])
        self.pos += n
        return chunk

    def unpack(self, fmt: struct.Struct) -> tuple[Any, ...]:
        """The next `fmt.size` bytes unpacked with `fmt`."""
        return fmt.unpack(self.take(fmt.size))

    def text(self, n: int, name: str) -> str:
        """The next `n` bytes as UTF-8 text (`name` is for the error message)."""
        try:
            return self.take(n).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RemotingProtocolError(f"{self.what}: {name} is not UTF-8: {exc}") from None
