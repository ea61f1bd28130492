"""RocketMQ as the bridge's message store, and the remoting client it is built on.

The front door of the room: the store (`RocketMQStore`), the client that notify and the Spark
source read with (`RocketMQClient` and its errors, pull statuses and response codes), and the
MQTT <-> RocketMQ mapping (`message_of`, `rocketmq_topic`, `tag_of`, ...). Code outside
`bridge.storage.rocketmq` imports from here, never from the modules behind it.
"""

from bridge.storage.rocketmq.client import RocketMQClient
from bridge.storage.rocketmq.connection import RemotingError, RocketMQError
from bridge.storage.rocketmq.groups import part_name
from bridge.storage.rocketmq.mapping import (
    NOTIFY_FILTER,
    PROP_DELAYED,
    PROP_NODE,
    escape_name,
    message_of,
    rocketmq_topic,
    tag_of,
    to_rocketmq,
)
from bridge.storage.rocketmq.messages import PROPERTY_INNER_MULTI_DISPATCH, StoredMessage
from bridge.storage.rocketmq.store import DISPATCH_TOPIC, RocketMQStore
from bridge.storage.rocketmq.types import PullStatus
from bridge.storage.rocketmq.wire import ResponseCode

__all__ = [
    "DISPATCH_TOPIC",
    "NOTIFY_FILTER",
    "PROPERTY_INNER_MULTI_DISPATCH",
    "PROP_DELAYED",
    "PROP_NODE",
    "PullStatus",
    "RemotingError",
    "ResponseCode",
    "RocketMQClient",
    "RocketMQError",
    "RocketMQStore",
    "StoredMessage",
    "escape_name",
    "message_of",
    "part_name",
    "rocketmq_topic",
    "tag_of",
    "to_rocketmq",
]
