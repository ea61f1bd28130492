"""The node's metrics in the Prometheus text format (prometheus-client), served on the admin API's
`/metrics`.

Nothing here runs on the hot path: the node counts in plain ints (`bridge.counters`), and
this collector reads them, and the node's tables for the gauges, when Prometheus scrapes. Every
metric is named `mqtt_bridge_*`; docs/operations.md lists them with the alerts built on them."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from bridge.counters import PACKET_TYPES

if TYPE_CHECKING:
    from bridge.node import Node
    from bridge.operations.served import Served

PREFIX = "mqtt_bridge_"

BAN_COUNTERS = {
    "banned_connects": "CONNECTs refused because a ban names the client (0x8A / 5)",
    "banned_kicks": "connected clients kicked because a new ban names them",
    "flapping_bans": "ClientIds banned by flapping detection",
}
"""Counters of `bridge.access.banlist`, always exported (0 until something is banned)."""

LIMIT_COUNTERS = {
    "publish_rate_pauses": "times a client's socket was read later for its publish rate limits",
    "connections_rate_delayed": "CONNECTs that waited for their turn under connection_rate",
    "connections_rate_refused": "CONNECTs refused under connection_rate (CONNACK 0x9F / 3)",
    "connections_over_max": "CONNECTs refused at max_connections (CONNACK 0x97 / 3)",
    "tls_handshake_failures": "failed TLS handshakes (not TLS, untrusted certificate, timeout)",
    "tls_handshakes_abandoned": "TLS connections closed by the client before their handshake",
    "websocket_origin_refused": "WebSocket upgrades refused for their Origin (HTTP 403)",
    "peer_links_refused": "peer links refused before they came up (no or wrong proof of the "
    "cluster secret, not a live member, handshake too slow or too large)",
    "peer_releases_refused": "Release requests from peers the registry does not name as the "
    "client's owner",
    "peer_releases_unverified": "clients let go to a peer on its word (a newer epoch) because "
    "the registry could not be read: this node was cut from Redis",
    "unauthenticated_refused": "sockets closed at once: max_unauthenticated (or per address) "
    "sockets had no CONNACK yet",
    "unauthenticated_too_many_bytes": "clients closed for sending more than "
    "max_unauthenticated_bytes before their CONNACK",
    "logins_busy": "CONNECTs refused because too many password checks waited (login_queue, "
    "login_queue_per_address; CONNACK 0x89 / 3)",
    "logins_timed_out": "connections closed without a CONNACK within connect_timeout",
    "login_failure_delays": "failed logins whose refusal waited (login_failure_delay)",
    "protocol_faults": "clients closed for a protocol fault: a malformed packet, a protocol "
    "error, a packet over max_packet_size (logged at most once per protocol_fault_log_interval "
    "per reason code)",
}
"""Counters of the limits and listeners' guards, always exported (0 until one applies)."""

NODE_COUNTERS = {
    "connections_accepted": "CONNECTs accepted (CONNACK 0)",
    "connections_refused": "CONNECTs refused, for any reason (each cause also has its counter)",
    "connections_refused_clientid_prefix": "CONNECTs refused because the ClientId's prefix is "
    "bound to another user (ACL clientid rules)",
    "clients_disconnected_clientid_prefix": "connected clients closed because a changed ACL "
    "bound their ClientId's prefix to another user",
    "keepalive_timeouts": "clients closed for sending nothing within their keep-alive allowance",
    "packets_too_large": "clients closed for a packet over max_packet_size",
    "protocol_errors": "clients closed for a malformed packet or a protocol error",
    "subscriptions_refused": "topic filters a SUBACK refused (not authorized, bad filter, quota)",
    "quota_refused_subscriptions": "topic filters refused at max_subscriptions_per_client",
    "quota_refused_will": "CONNECTs refused because their will's payload is over max_will_bytes",
    "quota_refused_retained": "retained PUBLISHes refused over the retained_max_* quotas",
    "quota_refused_delayed": "delayed PUBLISHes refused over the delayed_max_* quotas",
    "quota_refused_awaiting_rel": "QoS 2 PUBLISHes refused while max_awaiting_rel of the "
    "client's were waiting for their PUBREL",
    "properties_too_large": "PUBLISHes refused for properties over max_message_properties",
    "payload_format_invalid": "PUBLISHes refused whose payload is not the UTF-8 their Payload "
    "Format Indicator says",
    "publishers_slowed": "times the node held a publisher's PUBACKs because a connected "
    "subscriber was past max_queued_messages or max_queued_bytes (backpressure)",
    "subscribers_behind": "times a connected subscriber went past max_queued_messages or "
    "max_queued_bytes (its publishers are slowed until it catches up)",
    "qos0_publisher_waits": "times a QoS 0 publisher's socket was read later because a "
    "subscriber's buffer was full",
    "qos0_subscribers_stuck": "QoS 0 subscribers that read nothing within qos0_publisher_wait "
    "(publishers stop waiting for them; their messages drop past write_buffer_high)",
    "delivery_store_errors": "reads of the store for a delivery that failed (retried)",
    "qos2_copies_skipped": "second stored copies of a QoS 2 message not delivered again",
    "readers_rewound": "client cursors moved back after a failed write took back messages",
    "retained_copies_stored": "retained messages copied into a new subscriber's queue",
    "retained_copies_unchanged": "retained copies not stored again: the subscriber had them",
    "presubscriptions": "subscriptions a session got at its CONNECT from `presubscribe`",
    "sessions_expired": "sessions removed at their expiry",
    "sessions_released": "sessions handed to another node that took the client over",
    "sessions_recovered_from_registry": "persistent sessions resumed from the registry's copy "
    "because a claim of this node had been applied while refused (Redis failover)",
    "sessions_recovered_after_rollback": "persistent sessions resumed as this node last served "
    "them after a Redis failover lost its claim of them (`bridge.node.let_go`)",
    "lease_fences": "times this node stopped serving its clients: no heartbeat through to "
    "Redis for nearly node_timeout while a member could not reach it (its lease could lapse)",
    "claims_superseded": "CONNECTs closed because a newer claim took their ClientId while "
    "they waited for its previous node",
    "wills_published": "wills published (the client went away without DISCONNECT)",
    "wills_retried": "attempts to store a will again after the store could not take it",
    "wills_cancelled": "wills not published (the client came back in time, or disconnected "
    "cleanly)",
    "client_events": "$SYS client connected/disconnected events published",
    "client_events_lost": "$SYS client events not published because the store failed",
    "peer_confirm_timeouts": "subscriptions whose peers' confirmation did not come within "
    "interest_confirm_timeout (SUBACK sent anyway)",
}
"""The node's other counters, each exported as mqtt_bridge_<name>_total from the start (0 until
it first moves), so a dashboard shows 0 rather than no data and `increase()` sees the first
move. A counter missing here is still exported once it moves, as `count of <name>`."""

# Counters shown under a name of their own (or folded into a labelled family); every other
# counter of the node is exported as mqtt_bridge_<name>_total.
_SPECIAL = {
    "bytes_out",
    "messages_in_qos0",
    "messages_in_qos1",
    "messages_in_qos2",
    "messages_out_qos0",
    "messages_out_qos1",
    "messages_out_qos2",
    "acl_denied_publish",
    "acl_denied_subscribe",
    "acl_denied_will",
    "connections_refused_not_owner",
    "auth_failures",
    *BAN_COUNTERS,
    *LIMIT_COUNTERS,
    "delayed_scheduled",
    "delayed_delivered",
    "delayed_refused",
}

DROP_REASONS = {
    "dropped_queue_full": "queue_full",
    "dropped_retention": "retention",
    "dropped_session_expired": "session_expired",
    "dropped_slow_consumer": "slow_consumer",
    "dropped_no_shared_member": "no_shared_member",
    "dropped_peer_link": "peer_link",
    "dropped_sys_publish": "sys_topic",
    "acl_denied_publish": "acl_denied",
    "qos0_not_stored": "qos0_not_stored",
    "dropped_expired": "expired",
    "dropped_too_large_for_client": "too_large_for_client",
    "acl_filtered_deliveries": "acl_filtered",
}
"""Counter -> `reason` label of mqtt_bridge_messages_dropped_total."""


class NodeCollector:
    """Reads one server's node (and its notify and cluster) at scrape time."""

    def __init__(self, server: Served) -> None:
        self.server = server

    def describe(self) -> list[Metric]:
        return []  # families are only known at collect time; nothing to check up front

    def collect(self) -> Iterator[Metric]:
        node = self.server.node
        metrics = node.metrics
        counters = metrics.snapshot()

        yield _gauge("connections", "MQTT clients connected to this node", len(node.connections))
        yield _gauge("sockets", "open client sockets (including before CONNECT)",
                     node.connection_count)  # fmt: skip
        yield _gauge("unauthenticated_sockets", "client sockets without a CONNACK yet",
                     node.unauthenticated.total)  # fmt: skip
        yield _gauge("sessions", "sessions held by this node (online and offline)",
                     len(node.sessions))  # fmt: skip
        yield _gauge(
            "subscriptions",
            "subscriptions of the sessions held by this node",
            node.subscription_count(),
        )
        yield _gauge("retained_messages", "retained messages known to this node",
                     node.retained_count())  # fmt: skip
        yield _gauge(
            "retained_bytes",
            "bytes (payload and topic) of the retained messages, as retained_max_bytes counts them",
            node.retained.tally.bytes,
        )
        yield _gauge(
            "inflight",
            "QoS 1/2 messages sent to connected clients and not yet acknowledged",
            sum(len(s.inflight) for s in node.sessions.values() if s.connected),
        )
        yield _gauge(
            "pull_tasks",
            "delivery tasks reading the store for a client right now",
            sum(1 for d in node.deliveries.values() if d.running),
        )

        packets_in = CounterMetricFamily(
            PREFIX + "packets_received", "MQTT packets received, by type", labels=["type"]
        )
        packets_out = CounterMetricFamily(
            PREFIX + "packets_sent", "MQTT packets sent, by type", labels=["type"]
        )
        for number, name in enumerate(PACKET_TYPES):
            if metrics.packets_in[number] or name in ("connect", "publish", "subscribe"):
                packets_in.add_metric([name], metrics.packets_in[number])
            if metrics.packets_out[number] or name in ("connack", "publish", "suback"):
                packets_out.add_metric([name], metrics.packets_out[number])
        yield packets_in
        yield packets_out
        yield _counter("bytes_received", "bytes received from MQTT clients", metrics.bytes_in)
        yield _counter("bytes_sent", "bytes sent to MQTT clients", metrics.bytes_out)

        received = CounterMetricFamily(
            PREFIX + "messages_received", "PUBLISH messages accepted from clients, by QoS",
            labels=["qos"],
        )  # fmt: skip
        sent = CounterMetricFamily(
            PREFIX + "messages_sent", "PUBLISH messages sent to clients, by QoS", labels=["qos"]
        )
        for qos in ("0", "1", "2"):
            received.add_metric([qos], metrics.get(f"messages_in_qos{qos}"))
            sent.add_metric([qos], metrics.get(f"messages_out_qos{qos}"))
        yield received
        yield sent

        dropped = CounterMetricFamily(
            PREFIX + "messages_dropped", "messages dropped, by reason", labels=["reason"]
        )
        for counter, reason in DROP_REASONS.items():
            dropped.add_metric([reason], counters.get(counter, 0))
        yield dropped

        denied = CounterMetricFamily(
            PREFIX + "acl_denied", "requests the ACL denied, by action", labels=["action"]
        )
        for action in ("publish", "subscribe", "will"):
            denied.add_metric([action], counters.get(f"acl_denied_{action}", 0))
        yield denied
        yield _counter("auth_failures", "CONNECTs refused by authentication",
                       counters.get("auth_failures", 0))  # fmt: skip
        yield _counter("connections_refused_not_owner",
                       "CONNECTs refused because the ClientId's session is another identity's",
                       counters.get("connections_refused_not_owner", 0))  # fmt: skip
        for name, doc in BAN_COUNTERS.items():
            yield _counter(name, doc, counters.get(name, 0))
        for name, doc in LIMIT_COUNTERS.items():
            yield _counter(name, doc, counters.get(name, 0))
        limits = GaugeMetricFamily(
            PREFIX + "limit", "connection and rate limits in force (0: unlimited)", labels=["name"]
        )
        for name, value in node.limits.current.as_dict().items():
            limits.add_metric([name], value)
        yield limits

        yield from _delayed(node, counters, self.server.notifier)

        latency = metrics.store_latency
        yield HistogramMetricFamily(
            PREFIX + "store_latency_seconds",
            "seconds from a client's QoS 1/2 PUBLISH to the store to it being durable",
            buckets=latency.cumulative(),
            sum_value=latency.sum,
        )

        notifier = self.server.notifier
        if notifier is not None:
            stats = notifier.stats
            yield _counter("notify_events", "queue-grew events notify produced", stats.events)
            yield _counter("notify_messages", "messages notify read", stats.messages)
            yield _counter("notify_dispatched", "backend messages notify routed",
                           stats.dispatched)  # fmt: skip
            yield _gauge("notify_unfiltered", "1 if the broker refused notify's property filter "
                         "(notify reads the bridges' own messages too)",
                         int(stats.unfiltered))  # fmt: skip

        cluster = self.server.cluster
        if cluster is not None:
            links = GaugeMetricFamily(
                PREFIX + "peer_link_up", "1 while the link to a peer node is up", labels=["peer"]
            )
            for peer, up in cluster.link_states().items():
                links.add_metric([peer], 1 if up else 0)
            yield links

        for name, doc in NODE_COUNTERS.items():
            yield _counter(name, doc, counters.get(name, 0))
        for name, value in sorted(counters.items()):
            if name in _SPECIAL or name in DROP_REASONS or name in NODE_COUNTERS:
                continue
            yield _counter(name, f"count of {name.replace('_', ' ')}", value)


def _delayed(node: Node, counters: Mapping[str, int], notifier: Any) -> Iterator[Metric]:
    """Delayed publishes: stored, delivered when due (on RocketMQ the notifier that read them
    routed them), refused, and waiting in the embedded index."""
    yield _counter("delayed_scheduled", "delayed publishes stored until their due time",
                   counters.get("delayed_scheduled", 0))  # fmt: skip
    routed_by_notify = notifier.stats.delayed if notifier is not None else 0
    due = counters.get("delayed_delivered", 0) + routed_by_notify
    yield _counter("delayed_delivered", "delayed publishes routed at their due time", due)
    yield _counter("delayed_refused", "delayed publishes refused (bad form, too long, full)",
                   counters.get("delayed_refused", 0))  # fmt: skip
    pending = node.publisher.delayed.pending()
    if pending is not None:
        yield _gauge("delayed_pending", "delayed publishes waiting in the embedded index", pending)
        yield _gauge(
            "delayed_bytes",
            "bytes (payload and target topic) of the delayed publishes waiting in the embedded "
            "store's log",
            node.publisher.delayed.tally.bytes,
        )


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, doc, value=value)


class Exporter:
    """The Prometheus registry of one server, rendering its metrics on demand."""

    def __init__(self, server: Served) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(NodeCollector(server))  # type: ignore[arg-type]

    def text(self) -> bytes:
        """The current metrics in the Prometheus text format (version 0.0.4)."""
        return generate_latest(self.registry)
