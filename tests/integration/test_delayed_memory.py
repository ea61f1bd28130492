"""A real bridge process on the embedded store keeps pending delayed payloads on disk: its RSS
after 1,000 delayed publishes of 64 KiB (62.5 MiB of payload, due in an hour) grows by a small
fraction of that. The node's record cache of recent records (up to 1,024 entries) holds any
recent publish's payload, delayed or not; more than that many small messages are sent after
the delayed ones, so the cache no longer holds them when RSS is read. glibc's malloc is told to
map every block of 32 KiB or more on its own (`MALLOC_MMAP_THRESHOLD_`), so a freed payload
leaves RSS at once and RSS measures what the node still holds, not what the allocator kept."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.support.clients import RawClient
from tests.support.processes import BridgeProcess

pytestmark = pytest.mark.integration

KiB = 1024
PAYLOAD = 64 * KiB
COUNT = 1000
PER_CLIENT = 200
"""Delayed publishes per publisher: 12.5 MiB, within `delayed_max_bytes_per_client` (16 MiB)."""
CACHE_ENTRIES = 1024
"""The record cache's entry bound (`RecordCache.max_entries`)."""


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * KiB
    raise AssertionError("no VmRSS")


def flush_record_cache(client: RawClient) -> None:
    for i in range(CACHE_ENTRIES + 100):
        client.publish("tiny/t", b"t", qos=1, packet_id=i % 60000 + 1)


def test_pending_delayed_payloads_do_not_stay_in_the_nodes_memory(
    bridge_factory: Callable[..., BridgeProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(32 * KiB))
    bridge = bridge_factory()
    filler = RawClient(bridge.port)
    assert filler.connect("filler").return_code == 0
    for i in range(50):  # the node's buffers for 64 KiB packets exist before the first reading
        filler.publish("warm/t", b"w" * PAYLOAD, qos=1, packet_id=i + 1)
    flush_record_cache(filler)
    before = rss(bridge.pid)
    publishers: list[RawClient] = []
    for i in range(COUNT):
        if i % PER_CLIENT == 0:
            publishers.append(RawClient(bridge.port))
            assert publishers[-1].connect(f"delayed-{i}").return_code == 0
        body = bytes([i % 256]) * PAYLOAD
        publishers[-1].publish("$delayed/3600/d/t", body, qos=1, packet_id=i % 60000 + 1)
    flush_record_cache(filler)
    time.sleep(0.5)  # the last commits' buffers are released
    grown = rss(bridge.pid) - before
    assert grown < COUNT * PAYLOAD // 4, f"RSS grew {grown >> 20} MiB for {COUNT * PAYLOAD >> 20}"
    for client in [*publishers, filler]:
        client.disconnect()
