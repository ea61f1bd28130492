"""An asyncio client for Apache RocketMQ's TCP remoting protocol (NameServer + broker, 4.x/5.x).

`RemotingConnection` is one TCP connection: requests are matched to responses by `opaque`, one
future per request, each with its own timeout; a lost connection fails every pending request
with `BrokerUnavailable` at once. `RocketMQClient` adds topic routes from the NameServer (cached,
refreshed in the background and after errors), one connection per broker (reopened on demand
with bounded backoff), and the producer/consumer operations the gateway needs: send, pull (with
long polling), consumer offsets, queue min/max offsets and topic creation.

This module is the entry point and re-exports the client's public names from where they live:
`RemotingConnection` and the errors in connection.py, `RocketMQClient` in client.py (its parts
in pool.py, routing.py, producer.py, consumer.py, admin.py and membership.py), results and
routes in types.py. The frame and header codec lives in `bridge.storage.rocketmq.wire` (no I/O).
"""

from __future__ import annotations

from bridge.storage.rocketmq.client import RocketMQClient
from bridge.storage.rocketmq.connection import (
    BrokerUnavailable,
    RemotingConnection,
    RemotingError,
    RemotingTimeout,
    RocketMQError,
)
from bridge.storage.rocketmq.messages import StoredMessage
from bridge.storage.rocketmq.types import (
    DEFAULT_TOPIC,
    MASTER_ID,
    PERM_READ,
    PERM_WRITE,
    BrokerInfo,
    PullResult,
    PullStatus,
    QueueInfo,
    SendResult,
    SendStatus,
    TopicRoute,
)

__all__ = [
    "DEFAULT_TOPIC",
    "MASTER_ID",
    "PERM_READ",
    "PERM_WRITE",
    "BrokerInfo",
    "BrokerUnavailable",
    "PullResult",
    "PullStatus",
    "QueueInfo",
    "RemotingConnection",
    "RemotingError",
    "RemotingTimeout",
    "RocketMQClient",
    "RocketMQError",
    "SendResult",
    "SendStatus",
    "StoredMessage",
    "TopicRoute",
]
