"""The rows the `rocketmq` data source produces: one per stored MQTT message, as Arrow batches.

The same columns whichever store the messages come from (RocketMQ or the embedded log), so a job
written against one runs against the other. Rows are built column by column into Arrow record
batches: Spark takes those without converting Python objects one value at a time.

A message's MQTT 5 metadata (`bridge.storage.metadata`) comes out readable, in columns of its
own named as its RocketMQ properties are (`mqtt.response_topic` -> `response_topic`): typed
(the expiry a number, the correlation data bytes) and clear of the User Properties, whose names
are the publisher's and could be anything. `properties` keeps what it always held, the User
Properties by name (a repeated name: its first value); `user_properties` lists them all, in
order.
"""

from __future__ import annotations

from base64 import b64decode
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import pyarrow as pa

from bridge.storage import metadata
from bridge.storage.base import Message

SCHEMA_DDL = (
    "topic STRING, payload BINARY, qos INT, retain BOOLEAN, publisher STRING, node STRING, "
    "publish_time TIMESTAMP, store_time TIMESTAMP, key STRING, "
    "properties MAP<STRING, STRING>, rocketmq_topic STRING, broker STRING, queue INT, "
    "offset BIGINT, payload_format INT, message_expiry BIGINT, content_type STRING, "
    "response_topic STRING, correlation_data BINARY, "
    "user_properties ARRAY<STRUCT<name: STRING, value: STRING>>"
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
        ("payload_format", pa.int32()),
        ("message_expiry", pa.int64()),
        ("content_type", pa.string()),
        ("response_topic", pa.string()),
        ("correlation_data", pa.binary()),
        ("user_properties", pa.list_(pa.struct([("name", pa.string()), ("value", pa.string())]))),
    ]
)

BATCH_ROWS = 4096
"""Rows per Arrow batch handed to Spark."""

_NO_METADATA: tuple[object, ...] = ([], None, None, None, None, None, [])


def metadata_columns(meta: Mapping[str, str]) -> tuple[object, ...]:
    """The values of `properties` and of the MQTT 5 metadata columns (`payload_format` ...
    `user_properties`) for a message's stored metadata. A value a backend wrote that is no
    number (expiry, format) or no base64 (correlation data) is null."""
    if not meta:
        return _NO_METADATA
    correlation: bytes | None = None
    if (encoded := meta.get(metadata.CORRELATION_DATA)) is not None:
        try:
            correlation = b64decode(encoded, validate=True)
        except ValueError:
            correlation = None
    return (
        [(key, value) for key, value in meta.items() if "\x00" not in key],
        _number(meta.get(metadata.PAYLOAD_FORMAT), digits=9),
        _number(meta.get(metadata.EXPIRY), digits=18),
        meta.get(metadata.CONTENT_TYPE),
        meta.get(metadata.RESPONSE_TOPIC),
        correlation,
        metadata.user_properties(meta),
    )


def _number(text: str | None, digits: int) -> int | None:
    if text is None or not (text.isascii() and text.isdigit()) or len(text) > digits:
        return None
    return int(text)


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
        properties, *meta = metadata_columns(message.properties)
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
            properties,
            rocketmq_topic,
            broker,
            queue,
            offset,
            *meta,
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
