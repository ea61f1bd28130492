"""The capture reader of tests/bench/path_steps.py (`tests.bench.harness.pcap`): a loopback
capture back into TCP byte streams, in order, a retransmitted segment kept once, each byte's
time the time its segment was seen. A wrong reader would misplace every step of the report."""

from __future__ import annotations

import struct
from pathlib import Path

from tests.bench.harness.pcap import read_streams


def _segment(sport: int, dport: int, seq: int, payload: bytes, *, syn: bool = False) -> bytes:
    tcp = struct.pack(
        ">HHIIBBHHH", sport, dport, seq, 0, 5 << 4, 0x02 if syn else 0x18, 65535, 0, 0
    )
    body = tcp + payload
    ip = struct.pack(
        ">BBHHHBBH4s4s",
        0x45,
        0,
        20 + len(body),
        0,
        0,
        64,
        6,
        0,
        bytes([127, 0, 0, 1]),
        bytes([127, 0, 0, 1]),
    )
    return b"\x00" * 12 + b"\x08\x00" + ip + body


def _pcap(path: Path, packets: list[tuple[int, bytes]]) -> None:
    out = struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 262144, 1)
    for t_ns, frame in packets:
        out += struct.pack(
            "<IIII", t_ns // 1_000_000_000, t_ns % 1_000_000_000, len(frame), len(frame)
        )
        out += frame
    path.write_bytes(out)


def test_streams_are_put_together_in_order_with_a_retransmission_kept_once(tmp_path: Path) -> None:
    path = tmp_path / "lo.pcap"
    base = 1_700_000_000_000_000_000
    _pcap(
        path,
        [
            (base, _segment(5000, 1883, 99, b"", syn=True)),
            (base + 1_000, _segment(5000, 1883, 100, b"abc")),
            (base + 2_000, _segment(5000, 1883, 103, b"defg")),
            (base + 3_000, _segment(5000, 1883, 101, b"bcdef")),  # retransmitted: nothing new
            (base + 4_000, _segment(5000, 1883, 106, b"gh")),  # overlaps: "h" is new
            (base + 5_000, _segment(1883, 5000, 7, b"reply")),  # the other direction
        ],
    )
    streams = read_streams(path)
    up = streams[(("127.0.0.1", 5000), ("127.0.0.1", 1883))]
    assert bytes(up.data) == b"abcdefgh"
    assert [up.time_at(i) for i in (0, 2, 3, 6, 7)] == [
        base + 1_000,
        base + 1_000,
        base + 2_000,
        base + 2_000,
        base + 4_000,
    ]
    down = streams[(("127.0.0.1", 1883), ("127.0.0.1", 5000))]
    assert bytes(down.data) == b"reply"
