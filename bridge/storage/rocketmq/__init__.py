"""RocketMQ as the bridge's message store, and the remoting client it is built on.

The front door of the room: the store (`RocketMQStore`), the client that notify and the Spark
source read with (`RocketMQClient` and its errors, pull statuses and response codes), what
both take to reach a secured cluster (`Credentials`, `TlsOptions`; built from a node's settings,
and checked, by `rocketmq_security`), and the
MQTT <-> RocketMQ mapping (`message_of`, `rocketmq_topic`, `tag_of`, ...). Code outside
`bridge.storage.rocketmq` imports from here, never from the modules behind it.
"""

from bridge.storage.rocketmq.acl import Credentials
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
from bridge.storage.rocketmq.security import rocketmq_security
from bridge.storage.rocketmq.store import DISPATCH_TOPIC, RocketMQStore
from bridge.storage.rocketmq.tls import TlsOptions, TlsOptionsError
from bridge.storage.rocketmq.types import PullStatus
from bridge.storage.rocketmq.wire import ResponseCode

__all__ = [
    "DISPATCH_TOPIC",
    "NOTIFY_FILTER",
    "PROPERTY_INNER_MULTI_DISPATCH",
    "PROP_DELAYED",
    "PROP_NODE",
    "Credentials",
    "PullStatus",
    "RemotingError",
    "ResponseCode",
    "RocketMQClient",
    "RocketMQError",
    "RocketMQStore",
    "StoredMessage",
    "TlsOptions",
    "TlsOptionsError",
    "escape_name",
    "message_of",
    "part_name",
    "rocketmq_security",
    "rocketmq_topic",
    "tag_of",
    "to_rocketmq",
]
