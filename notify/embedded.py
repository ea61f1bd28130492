"""notify inside a bridge node: events wake the node's pull tasks, backend messages are routed by
the node's subscription tree."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from bridge.storage.base import Message
from bridge.storage.rocketmq import NOTIFY_FILTER, escape_name, part_name
from notify.core import Notifier

if TYPE_CHECKING:
    from bridge.node import Node
    from bridge.storage.rocketmq import RocketMQStore

log = logging.getLogger("notify")


class NodeSink:
    """A `Sink` that is one bridge node."""

    def __init__(self, node: Node, store: RocketMQStore) -> None:
        self.node = node
        self.store = store

    def queues_grew(self, ends: dict[str, int], group: str) -> None:
        mine: dict[str, int] = {}
        for lmq, end in ends.items():
            queue = self.store.queue_of(lmq)
            if queue is not None:
                mine[part_name(group, queue)] = end
        if mine:
            self.node.queues_grew(mine)

    def route(self, message: Message) -> Sequence[str]:
        return [self.store.register_lmq(q) for q in self.node.route_backend_message(message)]


def embedded_notifier(node: Node, store: RocketMQStore) -> Notifier:
    """The notifier a bridge node runs by default (config `notify`)."""
    return Notifier(
        store.reader_client,
        NodeSink(node, store),
        store.dispatch,
        group=escape_name(f"{store.namespace}mqtt-bridge-notify"),
        dispatch_topic=store.dispatch_topic,
        skip_filter=NOTIFY_FILTER,
    )
