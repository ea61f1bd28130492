"""kill -9 a process appending to a FileLogStore: every acknowledged message must survive.

A child process appends durable messages from many concurrent tasks and prints each one as soon
as its append returned. The parent SIGKILLs it mid-stream, reopens the store and checks that
every printed message is there with its payload, at its seq, and that queue offsets are dense.
Several rounds run on the same directory, so later ones also append after a recovery. Under
`sync = interval` an append returns once written to the OS, before its sync: the kill of the
process cannot take that back either.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
import uvloop

from bridge.storage import FileLogStore

pytestmark = pytest.mark.fault

CHILD = r"""
import asyncio, sys, zlib
import uvloop
from bridge.storage import FileLogStore, Message, MetaUpdate

def payload(key):
    return (key.encode() + b"|") * (1 + zlib.crc32(key.encode()) % 97)

async def main(path, round_, ahead, sync_interval):
    store = FileLogStore(
        path, segment_bytes=64 * 1024, snapshot_every_bytes=32 * 1024, preallocate_bytes=ahead,
        sync_interval=sync_interval,
    )
    await store.open()
    out = sys.stdout

    async def writer(w):
        i = 0
        while True:
            key = f"r{round_}-w{w}-{i}"
            seq = await store.append(
                Message(topic=f"t/{w}", payload=payload(key), qos=1, key=key),
                ["all", f"w{w}"],
                meta=[MetaUpdate("last", f"r{round_}-w{w}", str(i).encode())],
            )
            out.write(f"{seq} {key}\n")
            out.flush()
            i += 1

    print("ready", flush=True)
    await asyncio.gather(*(writer(w) for w in range(16)))

uvloop.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])))
"""


def payload(key: str) -> bytes:
    return (key.encode() + b"|") * (1 + zlib.crc32(key.encode()) % 97)


def run_and_kill(
    path: Path, round_: int, acks_before_kill: int, preallocate: int = 0, sync_interval: float = 0.0
) -> dict[str, int]:
    """Start the child, collect acknowledgements, SIGKILL it; returns key -> seq."""
    command = [sys.executable, "-c", CHILD, str(path), str(round_), str(preallocate)]
    proc = subprocess.Popen(
        [*command, str(sync_interval)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    acked: dict[str, int] = {}
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 20
        first = proc.stdout.readline()
        if first != "ready\n":
            proc.kill()
            _, err = proc.communicate(timeout=10)
            pytest.fail(f"child failed to start: {first!r} {err}")
        while len(acked) < acks_before_kill:
            assert time.monotonic() < deadline, "child too slow"
            line = proc.stdout.readline()
            assert line, "child exited early"
            seq, key = line.split()
            acked[key] = int(seq)
        os.kill(proc.pid, signal.SIGKILL)
        # Lines already in the pipe were acknowledged before the kill too. Read them through the
        # same text stream: communicate() reads the raw pipe and would skip what readline()
        # already buffered, starting mid-line.
        rest = proc.stdout.read()
        proc.wait(timeout=10)
        for line in rest.splitlines(keepends=True):
            if line.endswith("\n"):  # a complete line: printed after its append returned
                seq, key = line.split()
                acked[key] = int(seq)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    assert proc.returncode == -signal.SIGKILL
    return acked


async def check(path: Path, acked: dict[str, int], preallocate: int = 0) -> None:
    store = FileLogStore(path, segment_bytes=64 * 1024, preallocate_bytes=preallocate)
    await store.open()
    try:
        by_key = {}
        offset = 0
        expected_offset = 0
        while True:
            result = await store.read("all", offset, 500)
            assert result.lost == 0
            if not result.messages:
                break
            for stored in result.messages:
                assert stored.offset == expected_offset
                expected_offset += 1
                by_key[stored.message.key] = stored
            offset = result.next_offset
        assert store.end_offset("all") == expected_offset
        missing = [key for key in acked if key not in by_key]
        assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:5]}"
        for key, seq in acked.items():
            stored = by_key[key]
            assert stored.seq == seq
            assert stored.message.payload == payload(key)
        seqs = [s.seq for s in sorted(by_key.values(), key=lambda s: s.offset)]
        assert seqs == sorted(seqs)
        # per-writer queues are dense too
        for w in range(16):
            offsets: list[int] = []
            offset = 0
            while batch := (await store.read(f"w{w}", offset, 500)).messages:
                offsets.extend(s.offset for s in batch)
                offset = offsets[-1] + 1
            assert offsets == list(range(store.end_offset(f"w{w}")))
        # and the meta written with each message is there
        last: dict[str, int] = {}
        for key in acked:
            round_writer, counter = key.rsplit("-", 1)
            last[round_writer] = max(last.get(round_writer, -1), int(counter))
        for round_writer, newest in last.items():
            assert int(store.meta("last")[round_writer]) >= newest
    finally:
        await store.close()


# 0: the file grows with every commit; 16 KiB: zeros are written ahead of the records (a few
# times per 64 KiB segment), and the kill lands in them. `sync = interval` (10 ms): appends are
# acknowledged once written, synced later.
@pytest.mark.parametrize(
    ("preallocate", "sync_interval"),
    [(0, 0.0), (16 * 1024, 0.0), (16 * 1024, 0.01)],
    ids=["appending", "zeros_ahead", "sync_interval"],
)
def test_acknowledged_appends_survive_sigkill(
    tmp_path: Path, preallocate: int, sync_interval: float
) -> None:
    path = tmp_path / "store"
    acked: dict[str, int] = {}
    for round_, acks in enumerate((300, 450, 700, 1000), start=1):
        acked.update(run_and_kill(path, round_, acks, preallocate, sync_interval))
        uvloop.run(check(path, acked, preallocate))
