"""A real full disk under the embedded store: its data dir on a tmpfs of a few MiB, filled by
another file while QoS 1 publishers keep publishing and a subscriber reads live.

What the test holds the store to: a message it could not write is never acknowledged (the
publisher gets no PUBACK, its connection closes, and it resends after reconnecting); the
subscriber stays connected throughout; once the space is back the publishers go on without anyone
restarting anything; and the log is whole afterwards: after a kill -9 and a restart on the same
disk, a session that was offline the whole time receives every acknowledged message from it.
The simulated failures of `tests/integration/test_store_failure.py` (ENOSPC raised from a
patched write) test the same paths message by message; this one is the disk itself."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.clients import RawClient
from tests.support.disks import fill
from tests.support.load import Qos1Publisher, Qos1Subscriber, finish
from tests.support.processes import BridgeProcess
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.fault, pytest.mark.timeout(150)]

DISK_MIB = 24
LEFT_FREE = 384 * 1024
"""Bytes left free by the filler: a few thousand of the publishers' records."""


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of DISK_MIB MiB (root only: mount)."""
    if os.geteuid() != 0:
        pytest.fail("mounting a tmpfs needs root (as the nemesis tests do)")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_MIB}m,mode=0700", "tmpfs", str(disk)],
        check=True,
    )
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_full_disk_acknowledges_nothing_unstored_resumes_by_itself_and_keeps_the_log_whole(
    small_disk: Path,
) -> None:
    # The publishers run for a time, not a count: on a busy machine they get more than the
    # offline session's default 10,000 queued messages acknowledged, and that limit drops the
    # oldest (as it should); what is checked here is the log, so the limit is out of the way.
    settings = (
        "segment_bytes=2097152",
        "segment_preallocate_bytes=262144",
        "max_queued_messages=1000000",
    )
    bridge = BridgeProcess(small_disk / "data", *settings).start()
    try:
        offline = RawClient(bridge.port)
        offline.connect("offline", clean_session=False)
        assert offline.subscribe("load/#", 1, packet_id=1) == [1]
        offline.disconnect()
        live = Qos1Subscriber(bridge.port, "live", ["load/#"])
        live.start()
        assert live.ready.wait(10)
        stop = threading.Event()
        publishers = [Qos1Publisher(bridge.port, f"pub{i}", stop, window=20) for i in range(2)]
        for publisher in publishers:
            publisher.start()
        wait_until(lambda: sum(len(p.acks) for p in publishers) > 500, 20, "publishing")

        filler = fill(small_disk, LEFT_FREE)
        bridge.wait_for_log("rolling back", timeout=30)
        wait_until(lambda: all(p.closed_at for p in publishers), 20, "both refused")
        full_at = time.monotonic()
        time.sleep(2.0)  # full for a while: refused again at every reconnect
        during = sum(1 for p in publishers for t, _ in p.acks if t > full_at + 0.5)

        filler.unlink()
        freed_at = time.monotonic()
        wait_until(
            lambda: all(any(t > freed_at for t, _ in p.acks) for p in publishers),
            30,
            "publishing resumed after the space came back",
        )
        finish(stop, publishers)
        acked = set().union(*(p.acked for p in publishers))
        wait_until(lambda: acked <= set(live.delivered), 30, "the live subscriber got everything")
        live.stop.set()
        live.join(5)
        assert live.reconnects == 0, "the subscriber's connection did not survive the full disk"

        bridge.kill()
        bridge.start()
        after = Qos1Subscriber(bridge.port, "offline")
        after.start()
        try:
            wait_until(lambda: acked <= set(after.delivered), 30, "the log after a restart")
        except AssertionError as exc:
            missing = sorted(acked - set(after.delivered))
            log_tail = "\n".join(bridge.log_text().splitlines()[-30:])
            raise AssertionError(
                f"{exc}: {len(missing)} of {len(acked)} acknowledged not read back "
                f"(first {missing[:5]}), {len(after.delivered)} read; the node's log:\n{log_tail}"
            ) from None
        after.stop.set()
        after.join(5)
    finally:
        bridge.kill()
    refusals = sum(len(p.closed_at) for p in publishers)
    print(
        f"\nfull disk: {len(acked)} acknowledged, {refusals} refusals, {during} acknowledged "
        f"while full, {len(set(after.delivered))} read from the log after kill -9"
    )
