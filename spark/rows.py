"""The rows the `rocketmq` data source produces: one per stored MQTT message, as Arrow batches.

The same columns whichever store the messages come from (RocketMQ or the embedded log), so a job
written against one runs against the other. Rows are built column by column into Arrow record
batches: Spark takes those without converting Python objects one value at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa

from bridge.storage.base import Message

SCHEMA_DDL = (
    "topic STRING, payload BINARY, qos INT, retain BOOLEAN, publisher STRING, node STRING, "
    "publish_time TIMESTAMP, store_time TIMESTAMP, key STRING, "
    "properties MAP<STRING, STRING>, rocketmq_topic STRING, broker STRING, queue INT, "
    "offset BIGINT"
)
"""The source's columns (docs/spark.md describes each)."""

_TIMESTAMP = pa.timestamp("us", tz="UTC")
ARROW_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("payload", pa.binary()),
        ("qos", pa.int32()),
        ("retain", pa.bool_()),
        ("publisher", pa.string()),
        ("node", pa.string()),
        ("publish_time", _TIMESTAMP),
        ("store_time", _TIMESTAMP),
        ("key", pa.string()),
        ("properties", pa.map_(pa.string(), pa.string())),
        ("rocketmq_topic", pa.string()),
        ("broker", pa.string()),
        ("queue", pa.int32()),
        ("offset", pa.int64()),
    ]
)

BATCH_ROWS = 4096
"""Rows per Arrow batch handed to Spark."""


@dataclass(slots=True)
class RowBatcher:
    """Collects messages column-wise and cuts them into Arrow record batches."""

    columns: list[list[object]] = field(default_factory=lambda: [[] for _ in ARROW_SCHEMA])

    def __len__(self) -> int:
        return len(self.columns[0])

    def add(
        self,
        message: Message,
        *,
        store_time_ms: int,
        rocketmq_topic: str | None,
        broker: str,
        queue: int,
        offset: int,
    ) -> None:
        """One row for `message`, stored at `offset` of `queue` (of `broker`)."""
        values = (
            message.topic,
            message.payload,
            message.qos,
            message.retain,
            message.publisher,
            message.node,
            message.timestamp_ms * 1000,
            store_time_ms * 1000,
            message.key,
            list(message.properties.items()),
            rocketmq_topic,
            broker,
            queue,
            offset,
        )
        for column, value in zip(self.columns, values, strict=True):
            column.append(value)

    def take(self) -> pa.RecordBatch:
        """The rows collected so far as one batch; the batcher is empty afterwards."""
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array(column, type=f.type)
                for column, f in zip(self.columns, ARROW_SCHEMA, strict=True)
            ],
            schema=ARROW_SCHEMA,
        )
        self.columns = [[] for _ in ARROW_SCHEMA]
        return batch

    def full_batches(self) -> Iterator[pa.RecordBatch]:
        """A batch when at least `BATCH_ROWS` rows are waiting (the caller yields it)."""
        if len(self) >= BATCH_ROWS:
            yield self.take()

    def rest(self) -> Iterator[pa.RecordBatch]:
        """The last, partial batch, if any rows are left."""
        if len(self):
            yield self.take()
