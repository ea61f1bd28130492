"""Reading MQTT messages out of RocketMQ for the Spark source: queues, offsets, pulls.

No Spark here. The driver side lists the queues of the topics to read and resolves offsets
("earliest", "latest", JSON, a timestamp) to numbers; the executor side pulls one queue's offset
range and turns every stored message into a row. Both use the gateway's own remoting client
(`bridge.storage.rocketmq`), synchronously: each call runs on an event loop of its own.

Offsets are per queue, keyed "broker:queueId" inside each RocketMQ topic, the form Spark
checkpoints: {"factory": {"broker-a:0": 120, "broker-a:1": 118}}. An offset is the queue offset
of the next message to read, so a range [start, end) holds end - start stored messages.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa

from bridge.mqtt.topics import topic_matches
from bridge.storage.rocketmq import (
    DISPATCH_TOPIC,
    PullStatus,
    RemotingError,
    ResponseCode,
    RocketMQClient,
    message_of,
)
from spark.options import EARLIEST, LATEST, SourceOptions, client_security
from spark.rows import RowBatcher

log = logging.getLogger("spark.rocketmq")

T = TypeVar("T")

QueueKey = tuple[str, str, int]
"""(RocketMQ topic, broker name, queue id)."""

STALL_LIMIT = 20
"""Pulls in a row (with growing pauses, ~8 s in all) that may return nothing short of the
range's end before the read fails."""


class DataLossError(RuntimeError):
    """Messages in the requested range are gone (deleted by retention) before being read."""


def queue_id(broker: str, queue: int) -> str:
    return f"{broker}:{queue}"


def to_json(offsets: dict[QueueKey, int]) -> dict[str, dict[str, int]]:
    """Offsets in the form Spark checkpoints."""
    out: dict[str, dict[str, int]] = {}
    for (topic, broker, queue), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[queue_id(broker, queue)] = offset
    return out


def from_json(data: dict[str, Any]) -> dict[QueueKey, int]:
    """Inverse of `to_json` (raises ValueError for a malformed queue id)."""
    out: dict[QueueKey, int] = {}
    for topic, queues in data.items():
        for name, offset in queues.items():
            broker, sep, number = name.rpartition(":")
            if not sep or not broker or not number.isdigit():
                raise ValueError(f"queue {name!r} of topic {topic!r}: expected 'broker:queueId'")
            out[(topic, broker, int(number))] = int(offset)
    return out


def _client(options: SourceOptions) -> RocketMQClient:
    assert options.nameserver
    credentials, tls = client_security(options)
    return RocketMQClient(
        options.nameserver,
        client_id=f"spark-{os.getpid()}-{uuid.uuid4().hex[:8]}",
        producer_group=options.consumer_group,
        consumer_group=options.consumer_group,
        request_timeout=options.request_timeout,
        retry_deadline=max(10.0, options.request_timeout * 2),
        credentials=credentials,
        tls=tls,
    )


def run_with_client(options: SourceOptions, work: Callable[[RocketMQClient], Awaitable[T]]) -> T:
    """Run `work(client)` on a fresh event loop with a fresh client, then close both."""

    async def main() -> T:
        client = _client(options)
        try:
            return await work(client)
        except RemotingError as exc:
            if exc.refused_credential is not None:
                # The client's message names the bridge's setting; here the option is to fix.
                option = "secretKey" if exc.refused_credential == "secret_key" else "accessKey"
                raise RuntimeError(f"option {option}: {exc}") from exc
            raise
        finally:
            await client.close()

    return asyncio.run(main())


async def list_queues(client: RocketMQClient, options: SourceOptions) -> list[QueueKey]:
    """Every readable queue of the topics to read. A named topic that does not exist (yet) has
    none; with no topics named, every data topic but the bridge's dispatch copies."""
    if options.topics is not None:
        topics = list(options.topics)
    else:
        topics = [t for t in await client.data_topics() if not t.endswith(DISPATCH_TOPIC)]
    queues: list[QueueKey] = []
    for topic in topics:
        try:
            route = await client.fetch_route(topic)
        except RemotingError as exc:
            if exc.code == ResponseCode.TOPIC_NOT_EXIST:
                continue
            raise
        queues.extend((topic, broker, qid) for broker, qid in route.read_queues())
    return queues


async def _each(
    queues: list[QueueKey], fetch: Callable[[QueueKey], Awaitable[int]]
) -> dict[QueueKey, int]:
    values = await asyncio.gather(*(fetch(q) for q in queues))
    return dict(zip(queues, values, strict=True))


async def end_offsets(client: RocketMQClient, queues: list[QueueKey]) -> dict[QueueKey, int]:
    """Each queue's max offset: one past its newest message."""
    return await _each(queues, lambda q: client.max_offset(q[0], q[2], broker_name=q[1]))


async def resolve(
    client: RocketMQClient,
    queues: list[QueueKey],
    spec: str | dict[str, Any],
    timestamp_ms: int | None,
) -> dict[QueueKey, int]:
    """Concrete offsets for every queue: from a timestamp (first message stored at or after
    it), "earliest", "latest", or a JSON object (queues it does not name start at the earliest)."""
    if timestamp_ms is not None:
        return await _each(
            queues, lambda q: client.offset_at(q[0], q[2], timestamp_ms, broker_name=q[1])
        )
    given = from_json(spec) if isinstance(spec, dict) else {}
    wanted = {q: given.get(q, EARLIEST if spec != "latest" else LATEST) for q in queues}

    async def one(q: QueueKey) -> int:
        offset = wanted[q]
        if offset == EARLIEST:
            return await client.min_offset(q[0], q[2], broker_name=q[1])
        if offset == LATEST:
            return await client.max_offset(q[0], q[2], broker_name=q[1])
        return offset

    return await _each(queues, one)


def advance(
    begin: dict[QueueKey, int], ends: dict[QueueKey, int], *, fail_on_data_loss: bool
) -> tuple[dict[QueueKey, int], dict[QueueKey, int]]:
    """Where each queue's next batch ends, from the offsets read so far (`begin`) and the
    queues' current ends: (the new ends, the offsets the batch starts from).

    A queue the broker no longer lists keeps its offset. A queue whose end is behind what was
    already read went back: its store was wiped or its topic recreated, and the old offsets
    mean nothing there. With failOnDataLoss that fails the query naming the queue; without it
    the queue is read again from its start (offset 0), with a warning, instead of waiting
    silently until it grows past the old offset and then skipping what came before."""
    starts = dict(begin)
    merged = dict(begin)
    for q, end in ends.items():
        read = begin.get(q, 0)
        if end < read:
            what = (
                f"queue {q[0]} {queue_id(q[1], q[2])}: its end offset went back from {read} "
                f"to {end} (its store was wiped or its topic recreated)"
            )
            if fail_on_data_loss:
                raise DataLossError(what + "; set failOnDataLoss=false to read it again")
            log.warning("%s: read again from its start (failOnDataLoss=false)", what)
            starts[q] = 0
        merged[q] = end
    return merged, starts


def limit_range(
    start: dict[QueueKey, int], end: dict[QueueKey, int], max_messages: int
) -> dict[QueueKey, int]:
    """`end`, cut so that at most `max_messages` offsets are taken in all, shared fairly: each
    queue with a backlog gets an equal share, and what a queue does not need goes to the rest."""
    backlog = {q: max(0, e - start.get(q, 0)) for q, e in end.items()}
    granted = dict.fromkeys(backlog, 0)
    budget = max_messages
    waiting = sorted(q for q, b in backlog.items() if b > 0)
    while budget > 0 and waiting:
        share = max(1, budget // len(waiting))
        for q in list(waiting):
            take = min(share, backlog[q] - granted[q], budget)
            granted[q] += take
            budget -= take
            if granted[q] == backlog[q]:
                waiting.remove(q)
            if budget == 0:
                break
    return {q: start.get(q, 0) + granted[q] if backlog[q] > 0 else e for q, e in end.items()}


@dataclass(frozen=True, slots=True)
class QueueRange:
    """What one Spark task reads: offsets [start, end) of one queue."""

    topic: str
    broker: str
    queue: int
    start: int
    end: int


def split_ranges(ranges: list[QueueRange], min_partitions: int) -> list[QueueRange]:
    """`ranges` cut into at least `min_partitions` pieces where they hold that many messages
    (Spark's Kafka option of the same name): each range is split in proportion to its size,
    into pieces of nearly equal length, so one big queue is read by several tasks at once."""
    total = sum(r.end - r.start for r in ranges)
    if min_partitions <= len(ranges) or total == 0:
        return ranges
    out: list[QueueRange] = []
    for r in ranges:
        size = r.end - r.start
        pieces = max(1, min(size, -(-size * min_partitions // total)))
        for i in range(pieces):
            start = r.start + size * i // pieces
            end = r.start + size * (i + 1) // pieces
            out.append(QueueRange(r.topic, r.broker, r.queue, start, end))
    return out


def read_range(options: SourceOptions, part: QueueRange) -> Iterator[pa.RecordBatch]:
    """The rows of one queue range, in offset order, as Arrow batches (runs on an executor)."""
    loop = asyncio.new_event_loop()
    client = _client(options)
    try:
        yield from _pull_range(loop, client, options, part)
    finally:
        loop.run_until_complete(client.close())
        loop.close()


def _pull_range(
    loop: asyncio.AbstractEventLoop,
    client: RocketMQClient,
    options: SourceOptions,
    part: QueueRange,
) -> Iterator[pa.RecordBatch]:
    batcher = RowBatcher()
    offset = part.start
    tags = options.tag_expression
    stalls = 0
    while offset < part.end:
        result = loop.run_until_complete(
            client.pull(
                part.topic,
                part.queue,
                offset,
                min(options.pull_batch, part.end - offset),
                subscription=tags,
                broker_name=part.broker,
            )
        )
        if result.min_offset > offset:
            _lost(options, part, offset, min(result.min_offset, part.end))
            offset = result.min_offset
            continue
        if result.status is PullStatus.OFFSET_ILLEGAL:
            raise DataLossError(
                f"{part.topic} {queue_id(part.broker, part.queue)}: offset {offset} is not in "
                f"the queue (min {result.min_offset}, max {result.max_offset})"
            )
        for raw in result.messages:
            if raw.queue_offset >= part.end:
                break
            message = message_of(raw)
            if message is None:
                continue  # no tag: not an MQTT message, no topic to report
            if not options.matches_all and not topic_matches(options.topic_filter, message.topic):
                continue
            batcher.add(
                message,
                store_time_ms=raw.store_timestamp,
                rocketmq_topic=part.topic,
                broker=part.broker,
                queue=part.queue,
                offset=raw.queue_offset,
            )
        yield from batcher.full_batches()
        advanced = max(offset, min(result.next_offset, part.end))
        stalls = 0 if advanced > offset else stalls + 1
        if stalls:
            time.sleep(min(0.05 * stalls, 0.5))  # e.g. the broker still indexing the range
        if stalls >= STALL_LIMIT:
            raise RuntimeError(
                f"{part.topic} {queue_id(part.broker, part.queue)}: no progress at offset "
                f"{offset} (of {part.end}) after {STALL_LIMIT} pulls ({result.status.value})"
            )
        offset = advanced
    yield from batcher.rest()


def _lost(options: SourceOptions, part: QueueRange, start: int, end: int) -> None:
    what = (
        f"{part.topic} {queue_id(part.broker, part.queue)}: offsets {start}..{end - 1} were "
        "deleted by retention before they were read"
    )
    if options.fail_on_data_loss:
        raise DataLossError(what + " (set failOnDataLoss=false to skip lost messages)")
    log.warning("%s; skipped (failOnDataLoss=false)", what)
