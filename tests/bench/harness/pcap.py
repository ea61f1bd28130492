"""Reading a loopback capture (tcpdump's pcap, nanosecond timestamps) back into TCP byte
streams: which bytes each side of each connection sent, and when each segment was seen.

PURE: no capture is started here (path_steps.py runs tcpdump). Only what a capture of `lo`
holds is read: Ethernet (DLT_EN10MB, the link type of Linux's loopback) or Linux cooked
(SLL) frames, IPv4, TCP. A stream is one direction of one connection; its segments are put in
sequence order and a segment seen twice (a retransmission) is kept once, so a frame split over
segments can be cut out of the stream and given the time its last byte was seen.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Stream", "read_streams"]

_NANO_MAGIC = 0xA1B23C4D
_MICRO_MAGIC = 0xA1B2C3D4
_LINK_ETHERNET = 1
_LINK_SLL = 113
_LINK_SLL2 = 276


@dataclass
class Stream:
    """The bytes one side of a TCP connection sent, in order, and when each part was seen."""

    src: tuple[str, int]
    dst: tuple[str, int]
    data: bytearray = field(default_factory=bytearray)
    ends: list[int] = field(default_factory=list)
    """For each segment kept: the stream offset just after its last byte."""
    times: list[int] = field(default_factory=list)
    """For each segment kept: when it was seen (ns since the epoch)."""
    _next_seq: int | None = None

    def add(self, seq: int, payload: bytes, t_ns: int) -> None:
        """A segment: its bytes past what the stream already holds are appended (loopback
        delivers in order; a segment before the stream's end is a retransmission)."""
        if self._next_seq is None:
            self._next_seq = seq
        behind = (self._next_seq - seq) % (1 << 32)
        if behind >= 1 << 31:
            skip = 0  # a gap (the capture lost a segment): go on from here, frames resync
        elif behind >= len(payload):
            return  # nothing new: a retransmission
        else:
            skip = behind
        self.data += payload[skip:]
        self.ends.append(len(self.data))
        self.times.append(t_ns)
        self._next_seq = (seq + len(payload)) % (1 << 32)

    def time_at(self, offset: int) -> int:
        """When the byte at stream `offset` was seen."""
        i = bisect_right(self.ends, offset)
        return self.times[min(i, len(self.times) - 1)]


def _packets(path: Path) -> Iterator[tuple[int, int, bytes]]:
    """(link type, time in ns, frame) of every packet of the capture at `path`."""
    data = path.read_bytes()
    if len(data) < 24:
        return
    (magic,) = struct.unpack_from("<I", data, 0)
    order = "<"
    if magic not in (_NANO_MAGIC, _MICRO_MAGIC):
        order = ">"
        (magic,) = struct.unpack_from(">I", data, 0)
    if magic not in (_NANO_MAGIC, _MICRO_MAGIC):
        raise ValueError(f"{path}: not a pcap file")
    scale = 1 if magic == _NANO_MAGIC else 1000
    (link,) = struct.unpack_from(order + "I", data, 20)
    record = struct.Struct(order + "IIII")
    pos = 24
    while pos + 16 <= len(data):
        sec, frac, caplen, _ = record.unpack_from(data, pos)
        pos += 16
        yield link, sec * 1_000_000_000 + frac * scale, data[pos : pos + caplen]
        pos += caplen


def _ipv4_of(link: int, frame: bytes) -> bytes | None:
    if link == _LINK_ETHERNET:
        if len(frame) < 14 or frame[12:14] != b"\x08\x00":
            return None
        return frame[14:]
    if link == _LINK_SLL:
        return frame[16:] if frame[14:16] == b"\x08\x00" else None
    if link == _LINK_SLL2:
        return frame[20:] if frame[0:2] == b"\x08\x00" else None
    return None


def read_streams(path: Path) -> dict[tuple[tuple[str, int], tuple[str, int]], Stream]:
    """Every TCP stream in the capture at `path`, keyed by (source, destination)."""
    streams: dict[tuple[tuple[str, int], tuple[str, int]], Stream] = {}
    for link, t_ns, frame in _packets(path):
        ip = _ipv4_of(link, frame)
        if ip is None or len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != 6:
            continue
        ihl = (ip[0] & 0x0F) * 4
        (total,) = struct.unpack_from(">H", ip, 2)
        tcp = ip[ihl:total]
        if len(tcp) < 20:
            continue
        sport, dport, seq = struct.unpack_from(">HHI", tcp, 0)
        payload = tcp[(tcp[12] >> 4) * 4 :]
        syn = tcp[13] & 0x02
        src = (".".join(map(str, ip[12:16])), sport)
        dst = (".".join(map(str, ip[16:20])), dport)
        stream = streams.get((src, dst))
        if stream is None:
            stream = streams[(src, dst)] = Stream(src, dst)
        if syn:
            stream._next_seq = (seq + 1) % (1 << 32)
            continue
        if payload:
            stream.add(seq, bytes(payload), t_ns)
    return streams
