"""What a node tells its subscribers about itself: `$SYS` statistics and client events.

* Every `sys_interval` seconds the node publishes its statistics as retained QoS 0 messages under
  `$SYS/brokers/<node>/...` (`STATISTICS` lists them). They live in the node's memory only: they
  describe this process, are replaced every interval and are worth nothing after a restart.
* When a client connects or disconnects, the node publishes a JSON event on
  `$SYS/brokers/<node>/clients/<ClientId>/connected|disconnected` with QoS `client_events_qos`
  (1 by default: stored like any message, so a backend with a persistent session learns about
  every presence change, also those that happen while it is offline).

A ClientId is one topic level here: `/`, `+`, `#` and `%` in it are percent-encoded (`%2F`, `%2B`,
`%23`, `%25`), so no ClientId can add levels or wildcards to an event topic.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from bridge import __version__
from bridge.storage.base import Message, StoreUnavailable

if TYPE_CHECKING:
    from bridge.counters import Metrics
    from bridge.settings import Config

log = logging.getLogger("bridge.systopics")

SYS_PUBLISHER = "$SYS"
_ESCAPES = str.maketrans({"%": "%25", "/": "%2F", "+": "%2B", "#": "%23"})

STATISTICS = (
    "version",
    "uptime",
    "clients/connected",
    "sessions/count",
    "subscriptions/count",
    "retained/count",
    "messages/received",
    "messages/sent",
    "messages/dropped",
    "bytes/received",
    "bytes/sent",
    "store/latency/p99",
)
"""The statistics published under `$SYS/brokers/<node>/`."""


def topic_level(client_id: str) -> str:
    """`client_id` as one topic level (percent-encoding `%`, `/`, `+` and `#`)."""
    return client_id.translate(_ESCAPES)


def event_topic(node_id: str, client_id: str, event: str) -> str:
    """`$SYS/brokers/<node>/clients/<ClientId>/<event>`."""
    return f"$SYS/brokers/{topic_level(node_id)}/clients/{topic_level(client_id)}/{event}"


class Figures(Protocol):
    """What the statistics are read from: the node's counters and the sizes of its tables."""

    metrics: Metrics

    def connected_count(self) -> int: ...

    def session_count(self) -> int: ...

    def subscription_count(self) -> int: ...

    def retained_count(self) -> int: ...


class SysHost(Figures, Protocol):
    """What `SysTopics` uses of its node: figures, and a way to publish."""

    node_id: str

    def next_key(self) -> str: ...

    def keep_retained_in_memory(self, message: Message) -> None: ...

    def deliver_qos0(self, message: Message) -> None: ...

    async def publish_internal(
        self, topic: str, payload: bytes, qos: int, retain: bool, publisher: str
    ) -> Message: ...

    def spawn(self, coro: Coroutine[Any, Any, Any], /) -> asyncio.Task[Any]: ...


class ClientFacts(Protocol):
    """What an event says about a client connection."""

    client_id: str
    username: str | None
    peer: str
    listener: str
    connected_at: float


def statistics(node: Figures, started: float) -> dict[str, str]:
    """The current value of every statistic, as text."""
    metrics = node.metrics
    counters = metrics.snapshot()
    received = sum(metrics.get(f"messages_in_qos{q}") for q in range(3))
    sent = sum(metrics.get(f"messages_out_qos{q}") for q in range(3))
    dropped = sum(v for k, v in counters.items() if k.startswith(("dropped_", "acl_denied_pub")))
    p99 = node.metrics.store_latency.quantile(0.99)
    return {
        "version": f"mqtt-bridge {__version__}",
        "uptime": str(int(time.time() - started)),
        "clients/connected": str(node.connected_count()),
        "sessions/count": str(node.session_count()),
        "subscriptions/count": str(node.subscription_count()),
        "retained/count": str(node.retained_count()),
        "messages/received": str(received),
        "messages/sent": str(sent),
        "messages/dropped": str(dropped),
        "bytes/received": str(node.metrics.bytes_in),
        "bytes/sent": str(metrics.bytes_out),
        "store/latency/p99": "" if p99 is None else f"{p99:g}",
    }


class SysTopics:
    """Publishes a node's `$SYS` statistics and its clients' connected/disconnected events."""

    def __init__(self, node: SysHost, config: Config) -> None:
        self.node = node
        self.config = config
        self.started = time.time()
        self.prefix = f"$SYS/brokers/{topic_level(node.node_id)}/"
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.config.sys_interval > 0:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                self.publish_statistics()
            except Exception:  # a statistic must never take the node down
                log.exception("$SYS statistics not published")
            await asyncio.sleep(self.config.sys_interval)

    def publish_statistics(self) -> None:
        """Set and send every statistic (retained, QoS 0, in memory)."""
        node = self.node
        now_ms = int(time.time() * 1000)
        for name, value in statistics(node, self.started).items():
            topic = self.prefix + name
            message = Message(
                topic, value.encode(), 0, True, SYS_PUBLISHER, node.next_key(), now_ms, node.node_id
            )
            node.keep_retained_in_memory(message)
            node.deliver_qos0(message)

    # -- client events ----------------------------------------------------------------------------

    def connected(self, conn: ClientFacts, clean_session: bool, keepalive: int) -> None:
        """Announce that `conn`'s client connected."""
        if not self.config.client_events:
            return
        host, _, port = conn.peer.rpartition(":")
        self._publish(
            conn.client_id,
            "connected",
            {
                "clientid": conn.client_id,
                "username": conn.username,
                "ip": host,
                "port": int(port) if port.isdigit() else None,
                "node": self.node.node_id,
                "listener": conn.listener,
                "clean_session": clean_session,
                "keepalive": keepalive,
                "ts": int(time.time() * 1000),
            },
        )

    def disconnected(self, conn: ClientFacts, reason: str) -> None:
        """Announce that `conn`'s client is gone, and why."""
        if not self.config.client_events:
            return
        host, _, _port = conn.peer.rpartition(":")
        self._publish(
            conn.client_id,
            "disconnected",
            {
                "clientid": conn.client_id,
                "username": conn.username,
                "ip": host,
                "node": self.node.node_id,
                "reason": reason,
                "connected_at": int(conn.connected_at * 1000),
                "ts": int(time.time() * 1000),
            },
        )

    def _publish(self, client_id: str, event: str, body: dict[str, Any]) -> None:
        topic = event_topic(self.node.node_id, client_id, event)
        payload = json.dumps(body, separators=(",", ":")).encode()
        self.node.spawn(self._send(topic, payload))

    async def _send(self, topic: str, payload: bytes) -> None:
        try:
            await self.node.publish_internal(
                topic, payload, self.config.client_events_qos, False, SYS_PUBLISHER
            )
            self.node.metrics.inc("client_events")
        except StoreUnavailable as exc:
            self.node.metrics.inc("client_events_lost")
            log.warning("event %s not published, store unavailable: %s", topic, exc)
