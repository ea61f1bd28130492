"""The Spark source's rows: a message's MQTT 5 metadata comes out in readable, typed columns,
whichever store the message was read from, and `properties` keeps the User Properties by name."""

from __future__ import annotations

from hypothesis import given

from bridge.storage import metadata
from bridge.storage.base import Message
from bridge.storage.rocketmq.mapping import from_rocketmq, to_rocketmq
from spark.rows import ARROW_SCHEMA, RowBatcher
from tests.support.metadata_strategies import stored_metadata

META_COLUMNS = [
    "properties",
    "payload_format",
    "message_expiry",
    "content_type",
    "response_topic",
    "correlation_data",
    "user_properties",
]


def rows_of(*messages: Message) -> list[dict[str, object]]:
    batcher = RowBatcher()
    for i, message in enumerate(messages):
        batcher.add(message, store_time_ms=1, rocketmq_topic=None, broker="b", queue=0, offset=i)
    rows: list[dict[str, object]] = batcher.take().to_pylist()
    return rows


def test_the_metadata_columns_come_after_the_earlier_ones() -> None:
    assert ARROW_SCHEMA.names[:14] == [
        "topic", "payload", "qos", "retain", "publisher", "node", "publish_time", "store_time",
        "key", "properties", "rocketmq_topic", "broker", "queue", "offset",
    ]  # fmt: skip
    assert ARROW_SCHEMA.names[14:] == META_COLUMNS[1:]


def test_a_message_with_metadata_and_one_without() -> None:
    meta = metadata.from_publish(
        {
            0x01: 1,
            0x02: 3600,
            0x03: "application/json",
            0x08: "replies/dev-1",
            0x09: b"\x00req",
            0x26: [("unit", "kg"), ("tag", "a"), ("tag", "b")],
        }
    )
    v5, v3 = rows_of(Message("a/b", b"{}", properties=meta), Message("a/c", b"x"))
    assert {c: v5[c] for c in META_COLUMNS} == {
        "properties": [("unit", "kg"), ("tag", "a")],
        "payload_format": 1,
        "message_expiry": 3600,
        "content_type": "application/json",
        "response_topic": "replies/dev-1",
        "correlation_data": b"\x00req",
        "user_properties": [
            {"name": "unit", "value": "kg"},
            {"name": "tag", "value": "a"},
            {"name": "tag", "value": "b"},
        ],
    }
    assert {c: v3[c] for c in META_COLUMNS} == {
        "properties": [],
        "payload_format": None,
        "message_expiry": None,
        "content_type": None,
        "response_topic": None,
        "correlation_data": None,
        "user_properties": [],
    }


def test_what_a_backend_wrote_that_is_no_number_or_no_base64_is_null() -> None:
    message = from_rocketmq(
        "a/b",
        "k",
        {
            "mqtt.payload_format": "utf8",
            "mqtt.message_expiry": "99999999999999999999999",
            "mqtt.correlation_data": "not base64!",
        },
        b"x",
    )
    assert message is not None
    [row] = rows_of(message)
    assert [row["payload_format"], row["message_expiry"], row["correlation_data"]] == [None] * 3


@given(stored_metadata())
def test_the_columns_are_the_same_read_from_rocketmq_or_from_the_embedded_log(
    meta: dict[str, str],
) -> None:
    stored = Message("a/b", b"x", 1, False, "dev", "n-1", 5, "n", meta)
    _topic, tag, keys, props, body = to_rocketmq(stored, ())
    from_broker = from_rocketmq(tag, keys, dict(reversed(props.items())), body)
    assert from_broker is not None
    log_row, broker_row = rows_of(stored, from_broker)
    assert dict(log_row["properties"]) == dict(broker_row["properties"])  # type: ignore[call-overload]
    assert [log_row[c] for c in META_COLUMNS[1:]] == [broker_row[c] for c in META_COLUMNS[1:]]
    users = [(u["name"], u["value"]) for u in log_row["user_properties"]]  # type: ignore[attr-defined]
    assert users == metadata.user_properties(meta)
