"""The login queue's rules: bounded overall and per address, served in turn by address
(`FairQueue`, pure), the asyncio glue that runs checks on a pool (`Lane`), the lane of its own
for failing addresses (`LoginQueue`); and the pre-authentication guards (`UnauthenticatedSockets`,
`FailedLogins`)."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from bridge.access.login_guard import FailedLogins, UnauthenticatedSockets
from bridge.access.login_queue import FairQueue, Lane, LoginQueue, LoginsBusy, lowest_cpu_priority


def one_lane(pool: ThreadPoolExecutor, max_total: int, max_per_source: int) -> LoginQueue:
    """A queue whose two lanes share `pool`, one worker each, and no address failing."""
    return LoginQueue(
        Lane(pool, 1, max_total, max_per_source),
        Lane(pool, 1, max_total, max_per_source),
        FailedLogins(0.0, 4.0),
    )


def drain(queue: FairQueue[str]) -> list[str]:
    taken = []
    while (item := queue.take()) is not None:
        taken.append(item)
    return taken


def test_items_are_taken_in_turn_by_source_each_source_in_its_own_order() -> None:
    queue: FairQueue[str] = FairQueue(max_total=100, max_per_source=0)
    for n in range(5):
        queue.offer("flood", f"f{n}")
    queue.offer("alice", "a0")
    queue.offer("bob", "b0")
    queue.offer("alice", "a1")
    # The flood queued first, but every other source gets a turn after each of its items.
    assert drain(queue) == ["f0", "a0", "b0", "f1", "a1", "f2", "f3", "f4"]
    assert len(queue) == 0


def test_a_source_that_arrives_while_a_flood_waits_is_served_within_one_round() -> None:
    queue: FairQueue[str] = FairQueue(max_total=100, max_per_source=0)
    for n in range(50):
        queue.offer("flood", f"f{n}")
    assert queue.take() == "f0"
    queue.offer("alice", "a0")
    assert queue.take() == "f1"  # the flood's turn had come; alice's is next
    assert queue.take() == "a0"


def test_the_queue_refuses_beyond_its_total_and_per_source_bounds_saying_which() -> None:
    queue: FairQueue[str] = FairQueue(max_total=4, max_per_source=2)
    assert queue.offer("flood", "f0") and queue.offer("flood", "f1")
    assert not queue.offer("flood", "f2")
    assert "login_queue_per_address=2" in (queue.refusal("flood") or "")
    assert queue.offer("alice", "a0") and queue.offer("bob", "b0")
    assert not queue.offer("carol", "c0")
    assert "login_queue=4" in (queue.refusal("carol") or "")
    assert queue.take() == "f0"
    assert queue.offer("carol", "c0")  # a slot freed: taken again
    assert queue.waiting("flood") == 1 and len(queue) == 4


def test_a_discarded_item_is_not_taken_and_frees_its_place() -> None:
    queue: FairQueue[str] = FairQueue(max_total=2, max_per_source=0)
    queue.offer("a", "a0")
    queue.offer("b", "b0")
    assert queue.discard("a", "a0")
    assert not queue.discard("a", "a0")
    assert queue.offer("c", "c0")
    assert drain(queue) == ["b0", "c0"]


def test_login_queue_runs_waiting_checks_in_turn_by_address_and_refuses_the_excess() -> None:
    gate = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        queue = one_lane(pool, max_total=10, max_per_source=3)
        order: list[str] = []
        jobs = [("flood", f"f{n}") for n in range(5)] + [("alice", "a0")]
        pool.submit(gate.wait, 5)  # the one thread is busy until the jobs are queued

        async def release_later() -> None:
            await asyncio.sleep(0)
            gate.set()

        def check(name: str) -> str:
            order.append(name)
            return name

        async def main() -> list[object]:
            tasks = [
                asyncio.ensure_future(queue.run(source, check, name, wanted=None))
                for source, name in jobs
            ]
            await release_later()
            return await asyncio.gather(*tasks, return_exceptions=True)

        results = asyncio.run(main())
    # f0 took the worker; f1..f3 waited (3 per address); f4 was refused; alice was served
    # right after the first waiting flood check, not after all of them.
    assert order == ["f0", "f1", "a0", "f2", "f3"]
    assert isinstance(results[4], LoginsBusy) and "login_queue_per_address=3" in str(results[4])
    assert results[5] == "a0"
    assert queue.lane.running == 0 and len(queue.lane.queue) == 0


def test_a_check_whose_client_left_before_its_turn_is_not_run() -> None:
    with ThreadPoolExecutor(1) as pool:
        queue = one_lane(pool, max_total=10, max_per_source=0)
        order: list[str] = []

        def check(name: str) -> str:
            order.append(name)
            return name

        async def main() -> list[object]:
            first = asyncio.ensure_future(queue.run("a", check, "first", wanted=None))
            gone = asyncio.ensure_future(queue.run("b", check, "gone", wanted=lambda: False))
            return await asyncio.gather(first, gone, return_exceptions=True)

        results = asyncio.run(main())
    assert order == ["first"]
    assert isinstance(results[1], LoginsBusy) and "left" in str(results[1])
    assert queue.lane.running == 0


def test_a_cancelled_waiting_check_gives_up_its_place() -> None:
    with ThreadPoolExecutor(1) as pool:
        queue = one_lane(pool, max_total=1, max_per_source=0)
        gate = threading.Event()

        async def main() -> str:
            busy = asyncio.ensure_future(queue.run("a", gate.wait, 5, wanted=None))
            await asyncio.sleep(0)
            waiting = asyncio.ensure_future(queue.run("b", str, "b", wanted=None))
            await asyncio.sleep(0)
            assert len(queue.lane.queue) == 1
            waiting.cancel()
            await asyncio.sleep(0)
            assert len(queue.lane.queue) == 0
            later = asyncio.ensure_future(queue.run("c", str, "c", wanted=None))
            gate.set()
            await busy
            return await later

        assert asyncio.run(main()) == "c"
        assert queue.lane.running == 0


def test_a_check_of_another_address_runs_while_a_failing_address_holds_its_lane() -> None:
    gate = threading.Event()
    failed = FailedLogins(0.0, 4.0)
    with ThreadPoolExecutor(1) as pool, ThreadPoolExecutor(1) as failing_pool:
        queue = LoginQueue(Lane(pool, 1, 10, 0), Lane(failing_pool, 1, 10, 0), failed)

        async def main() -> tuple[str, int]:
            failed.failed("flood", asyncio.get_running_loop().time())
            stuck = [
                asyncio.ensure_future(queue.run("flood", gate.wait, 5, wanted=None))
                for _ in range(3)
            ]
            await asyncio.sleep(0)
            honest = await queue.run("alice", str, "a0", wanted=None)
            waiting = len(queue.failing_lane.queue)  # the flood's checks still wait
            gate.set()
            await asyncio.gather(*stuck)
            return honest, waiting

        assert asyncio.run(main()) == ("a0", 2)
        assert queue.lane.running == queue.failing_lane.running == 0


def test_a_waiting_check_whose_address_failed_meanwhile_moves_to_the_failing_lane() -> None:
    gate = threading.Event()
    failed = FailedLogins(0.0, 4.0)
    ran_on: list[str] = []

    def check(name: str) -> str:
        ran_on.append(threading.current_thread().name)
        return name

    with (
        ThreadPoolExecutor(1) as pool,
        ThreadPoolExecutor(1, thread_name_prefix="failing") as failing_pool,
    ):
        queue = LoginQueue(Lane(pool, 1, 10, 0), Lane(failing_pool, 1, 10, 0), failed)

        async def main() -> None:
            loop = asyncio.get_running_loop()
            busy = asyncio.ensure_future(queue.run("alice", gate.wait, 5, wanted=None))
            await asyncio.sleep(0)
            later = asyncio.ensure_future(queue.run("flood", check, "f0", wanted=None))
            await asyncio.sleep(0)
            assert len(queue.lane.queue) == 1  # queued before its address failed
            failed.failed("flood", loop.time())
            gate.set()
            await asyncio.gather(busy, later)

        asyncio.run(main())
    assert [name.split("_")[0] for name in ran_on] == ["failing"]
    assert queue.failing_lane.running == queue.lane.running == 0
    assert len(queue.lane.queue) == len(queue.failing_lane.queue) == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="threads have no nice value")
def test_the_lowest_cpu_priority_is_set_on_the_calling_thread_only() -> None:
    # Compared with the priority the test started at: under `nice -n 19` (make mutation) the
    # main thread is at 19 already.
    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen: list[int] = []

    def lowered() -> None:
        lowest_cpu_priority()
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    thread = threading.Thread(target=lowered)
    thread.start()
    thread.join()
    assert seen == [19]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before


def test_sockets_over_the_total_or_per_address_limit_are_refused_and_not_counted() -> None:
    sockets = UnauthenticatedSockets(max_total=3, max_per_source=2)
    assert sockets.arrive("10.0.0.1") is None
    assert sockets.arrive("10.0.0.1") is None
    refused = sockets.arrive("10.0.0.1")
    assert refused is not None and "max_unauthenticated_per_address=2" in refused
    assert sockets.arrive("10.0.0.2") is None
    refused = sockets.arrive("10.0.0.3")
    assert refused is not None and "max_unauthenticated=3" in refused
    sockets.leave("10.0.0.1")
    assert sockets.arrive("10.0.0.3") is None
    for source in ("10.0.0.1", "10.0.0.2", "10.0.0.3"):
        sockets.leave(source)
    assert sockets.total == 0 and sockets.by_source == {}


def test_zero_means_no_limit_on_unauthenticated_sockets() -> None:
    sockets = UnauthenticatedSockets(max_total=0, max_per_source=0)
    assert all(sockets.arrive("10.0.0.1") is None for _ in range(1000))


@pytest.mark.parametrize(
    ("first", "expected"), [(0.5, [0.5, 1.0, 2.0, 4.0, 4.0]), (0.0, [0.0] * 5)]
)
def test_failed_logins_from_one_address_wait_longer_each_time_up_to_the_maximum(
    first: float, expected: list[float]
) -> None:
    failed = FailedLogins(first, 4.0)
    assert [failed.failed("10.0.0.1", float(n)) for n in range(5)] == expected
    if first:
        assert failed.failed("10.0.0.2", 5.0) == first  # another address starts afresh


def test_failed_logins_are_forgotten_after_a_quiet_while() -> None:
    failed = FailedLogins(0.5, 4.0)
    for n in range(4):
        failed.failed("10.0.0.1", float(n))
    assert failed.failures("10.0.0.1") == 4
    assert failed.failed("10.0.0.1", 3.0 + 41.0) == 0.5


def test_an_address_is_failing_from_its_first_failure_until_its_failures_are_forgotten() -> None:
    failed = FailedLogins(0.0, 4.0)  # failures that do not wait are remembered all the same
    assert not failed.failing("10.0.0.1", 0.0)
    assert failed.failed("10.0.0.1", 1.0) == 0.0
    assert failed.failing("10.0.0.1", 1.0) and failed.failing("10.0.0.1", 41.0)
    assert not failed.failing("10.0.0.2", 1.0)
    assert not failed.failing("10.0.0.1", 41.5)
