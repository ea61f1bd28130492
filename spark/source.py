"""`rocketmq`: a PySpark data source over the MQTT messages the bridges stored.

    spark.dataSource.register(RocketMQDataSource)
    spark.read.format("rocketmq").option("nameserver", "127.0.0.1:9876").load()
    spark.readStream.format("rocketmq").option("nameserver", ...).option("topicFilter",
        "factory/+/+/telemetry").option("startingOffsets", "earliest").load()
    spark.read.format("rocketmq").load("./data")          # a bridge on the embedded store

Written with PySpark's Python Data Source API (4.2+). One input partition per RocketMQ queue
(per log segment for the embedded store); offsets per queue are what Spark checkpoints, so a
restarted query resumes exactly where it stopped. Options, columns and offset format:
docs/spark.md. The reading itself is in spark/rocketmq_reader.py and spark/log_reader.py.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from spark import log_reader
from spark import rocketmq_reader as rmq
from spark.options import EARLIEST, LATEST, SourceOptions, parse_options
from spark.rows import ARROW_SCHEMA, SCHEMA_DDL


def _read(options: SourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """The rows of one task; its partition holds a `rmq.QueueRange` or a `log_reader.LogRange`."""
    value = getattr(partition, "value", None)
    if value is None:  # Spark reads one empty partition when `partitions()` found none
        return iter(())
    if isinstance(value, rmq.QueueRange):
        return rmq.read_range(options, value)
    return log_reader.read_range(options, value)


class _Offsets:
    """Offsets and partitions of one store, as the JSON-able dicts Spark checkpoints."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    # -- the embedded log: {"embedded": position}

    def _log_position(self, spec: str | dict[str, Any], timestamp: int | None) -> int:
        assert self.options.path is not None
        path = self.options.path
        if timestamp is not None:
            return log_reader.position_at(path, timestamp)
        given = spec.get(log_reader.EMBEDDED, EARLIEST) if isinstance(spec, dict) else spec
        if given in ("earliest", EARLIEST):
            return log_reader.first_position(path)
        if given in ("latest", LATEST):
            return log_reader.scan_end(path, log_reader.first_position(path))
        return int(given)

    # -- both stores

    def _resolve(self, spec: str | dict[str, Any], timestamp: int | None) -> dict[str, Any]:
        o = self.options
        if o.path is not None:
            return {log_reader.EMBEDDED: self._log_position(spec, timestamp)}

        async def work(client: Any) -> dict[str, Any]:
            queues = await rmq.list_queues(client, o)
            return rmq.to_json(await rmq.resolve(client, queues, spec, timestamp))

        return rmq.run_with_client(o, work)

    def start(self) -> dict[str, Any]:
        """Where a read starts (startingOffsets / startingTimestamp)."""
        return self._resolve(self.options.starting, self.options.starting_timestamp)

    def end(self) -> dict[str, Any]:
        """Where a batch read ends (endingOffsets / endingTimestamp)."""
        return self._resolve(self.options.ending, self.options.ending_timestamp)

    def latest(
        self, start: dict[str, Any], max_messages: int | None
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The newest offsets, at most `max_messages` past `start`, and the newest offsets of
        all (what is available, for the query's progress; None where finding it would cost a
        scan of its own: the embedded log under a limit)."""
        o = self.options
        if o.path is not None:
            begin = int(start.get(log_reader.EMBEDDED, log_reader.first_position(o.path)))
            end = {log_reader.EMBEDDED: log_reader.scan_end(o.path, begin, max_messages)}
            return end, end if max_messages is None else None

        async def work(client: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
            queues = await rmq.list_queues(client, o)
            ends = await rmq.end_offsets(client, queues)
            available, starts = rmq.advance(
                rmq.from_json(start), ends, fail_on_data_loss=o.fail_on_data_loss
            )
            merged = available
            if max_messages is not None:
                merged = rmq.limit_range(starts, available, max_messages)
            return rmq.to_json(merged), rmq.to_json(available)

        return rmq.run_with_client(o, work)

    def partitions(
        self, start: dict[str, Any], end: dict[str, Any], *, streaming: bool = False
    ) -> list[InputPartition]:
        """The ranges [start, end) of every queue, one task each. In a stream an end behind its
        start is a queue that went back (`rmq.advance`): it is read again from its start."""
        o = self.options
        if o.path is not None:
            lo = int(start.get(log_reader.EMBEDDED, 0))
            hi = int(end.get(log_reader.EMBEDDED, 0))
            return [InputPartition(r) for r in log_reader.split(o.path, lo, hi)]
        begin = rmq.from_json(start)
        ranges: list[rmq.QueueRange] = []
        for (topic, broker, queue), stop in sorted(rmq.from_json(end).items()):
            first = begin.get((topic, broker, queue), 0)  # a queue new since `start`: all of it
            if streaming and stop < first:
                first = 0
            if stop > first:
                ranges.append(rmq.QueueRange(topic, broker, queue, first, stop))
        if o.min_partitions is not None:
            ranges = rmq.split_ranges(ranges, o.min_partitions)
        return [InputPartition(r) for r in ranges]


def start_offsets(options: SourceOptions) -> dict[str, Any]:
    """The concrete offsets startingOffsets/startingTimestamp stand for now (what a new stream
    would checkpoint as its start), as JSON-able dicts."""
    return _Offsets(options).start()


class RocketMQBatchReader(DataSourceReader):
    """`spark.read`: the messages between startingOffsets and endingOffsets, fixed at planning."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        offsets = _Offsets(self.options)
        return offsets.partitions(offsets.start(), offsets.end())

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, partition)


class RocketMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """`spark.readStream`: micro-batches of per-queue offset ranges, at most
    maxMessagesPerTrigger messages each when that option is set."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._target: dict[str, Any] | None = None
        self._available: dict[str, Any] | None = None

    def initialOffset(self) -> dict[str, Any]:
        return _Offsets(self.options).start()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_per_trigger is not None:
            return ReadMaxRows(self.options.max_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        # The offsets of "now": a query with trigger(availableNow=True) stops there.
        offsets = _Offsets(self.options)
        self._target = offsets.latest({}, None)[0]

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        offsets = _Offsets(self.options)
        latest, self._available = offsets.latest(start, max_rows)
        if self._target is not None:
            latest = _at_most(latest, self._target, start)
        return latest

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """The newest offsets the last latestOffset saw, past any maxMessagesPerTrigger: a
        query's progress shows them beside the batch's end offsets, so the lag shows."""
        return self._available

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return _Offsets(self.options).partitions(start, end, streaming=True)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: Spark's checkpoint holds the offsets."""


def _at_most(
    latest: dict[str, Any], target: dict[str, Any], start: dict[str, Any]
) -> dict[str, Any]:
    """`latest` with no offset past `target` (nor behind `start`)."""
    out: dict[str, Any] = {}
    for topic, value in latest.items():
        if isinstance(value, dict):
            limits = target.get(topic, {})
            floor = start.get(topic, {})
            # A queue behind its start went back (`rmq.advance`) and is read again: kept.
            out[topic] = {
                q: o if o < floor.get(q, 0) else max(floor.get(q, 0), min(o, limits.get(q, o)))
                for q, o in value.items()
            }
        else:
            out[topic] = max(
                int(start.get(topic, 0)), min(int(value), int(target.get(topic, value)))
            )
    return out


class RocketMQDataSource(DataSource):
    """The `rocketmq` format: MQTT messages stored in RocketMQ or in the embedded log."""

    @classmethod
    def name(cls) -> str:
        return "rocketmq"

    def schema(self) -> str:
        return SCHEMA_DDL

    def _check_schema(self, schema: StructType) -> None:
        if [f.name for f in schema.fields] != ARROW_SCHEMA.names:
            raise ValueError(
                "the rocketmq source has a fixed schema; do not pass one (.schema(...)): "
                + SCHEMA_DDL
            )

    def reader(self, schema: StructType) -> DataSourceReader:
        self._check_schema(schema)
        return RocketMQBatchReader(parse_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        self._check_schema(schema)
        return RocketMQStreamReader(parse_options(self.options, streaming=True))
