#!/usr/bin/env python3
"""Read amplification of the two ways a subscriber can read its messages from RocketMQ.

    .venv/bin/python tests/bench/read_amplification.py [--messages 5000] [--lines 50]

Starts a local RocketMQ (deploy/rocketmq), stores `--messages` messages spread over `--lines`
topics `factory/line<i>/<metric>` the way the bridge does (one send each, dispatched into the light
queue of every matching filter of two subscribers: `factory/line7/temp` and `factory/+/temp`), then
reads each subscriber's messages both ways and prints what was transferred:

* light queue: pull the filter's LMQ (what the bridge does);
* tag filter: pull the first-level topic's queues with a tag expression. Only an exact filter can
  be a tag expression; a wildcard subscriber must pull every message of the topic and match in
  the bridge.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bridge.mqtt.topics import topic_matches  # noqa: E402
from bridge.storage.base import Message, future_callback  # noqa: E402
from bridge.storage.rocketmq.store import RocketMQStore  # noqa: E402
from tests.support.rocketmq import LocalRocketMQ  # noqa: E402

FILTERS = ("factory/line7/temp", "factory/+/temp")
METRICS = ("temp", "pressure", "speed", "power", "state")


def topic_of(i: int, lines: int) -> str:
    return f"factory/line{i % lines}/{METRICS[(i // lines) % len(METRICS)]}"


async def pull_all(store: RocketMQStore, topic: str, tags: str) -> tuple[int, int, float]:
    """(messages, bytes, seconds) pulling every queue of `topic` with a tag expression."""
    client = store.reader_client
    route = await client.fetch_route(topic)
    count = size = 0
    started = time.perf_counter()
    for info in route.queues:
        for qid in range(info.read_queue_nums):
            offset = 0
            while True:
                result = await client.pull(
                    topic,
                    qid,
                    offset,
                    32,
                    consumer_group="bench-tagfilter",
                    subscription=tags,
                    broker_name=info.broker_name,
                )
                count += len(result.messages)
                size += sum(m.store_size or len(m.body) for m in result.messages)
                if result.next_offset <= offset:
                    break
                offset = result.next_offset
                if offset >= result.max_offset:
                    break
    return count, size, time.perf_counter() - started


async def pull_lmq(store: RocketMQStore, queue: str) -> tuple[int, int, float]:
    count = size = 0
    offset = 0
    started = time.perf_counter()
    while True:
        result = await store.read(queue, offset, 32)
        if not result.messages:
            break
        count += len(result.messages)
        size += sum(s.size for s in result.messages)
        offset = result.next_offset
    return count, size, time.perf_counter() - started


async def measure(namesrv: str, data: Path, messages: int, lines: int) -> None:
    store = RocketMQStore(namesrv, data / "store", namespace="amp-")
    await store.open()
    try:
        pending = []
        for i in range(messages):
            topic = topic_of(i, lines)
            queues = [f"f:{f}" for f in FILTERS if topic_matches(f, topic)]
            message = Message(topic, b"x" * 100, qos=1, key=f"amp-{i}", node="bench")
            stored: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            store.submit(message, queues, callback=future_callback(stored))
            pending.append(stored)
            if len(pending) >= 500:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
        await asyncio.sleep(1.0)  # let the broker index the last LMQ entries
        print(
            f"{messages} messages over {lines} lines x {len(METRICS)} metrics, "
            "factory/line<i>/<metric> (100 B payloads)\n"
        )
        print("| subscriber | way | messages read | matching | amplification | ms |")
        print("|---|---|---:|---:|---:|---:|")
        for topic_filter in FILTERS:
            matching = sum(
                1 for i in range(messages) if topic_matches(topic_filter, topic_of(i, lines))
            )
            ways = [("light queue", await pull_lmq(store, f"f:{topic_filter}"))]
            if "+" in topic_filter or "#" in topic_filter:
                ways.append(
                    ("tag filter (all, match in bridge)", await pull_all(store, "factory", "*"))
                )
            else:
                ways.append(("tag filter", await pull_all(store, "factory", topic_filter)))
            for way, (count, _size, seconds) in ways:
                print(
                    f"| `{topic_filter}` | {way} | {count} | {matching} | "
                    f"{count / max(matching, 1):.1f}x | {seconds * 1000:.0f} |"
                )
    finally:
        await store.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--lines", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="amp-") as tmp:
        mq = LocalRocketMQ(Path(tmp) / "rocketmq")
        mq.start()
        try:
            asyncio.run(measure(mq.namesrv_addr, Path(tmp), args.messages, args.lines))
        finally:
            mq.stop(graceful=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
