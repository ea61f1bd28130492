"""The bridge node: owns the tables and the store, and wires the parts that act on them.

The tables are the subscription trie and shared groups (`bridge.router`), the sessions, the
connections and their deliveries, and the retained messages. The parts, each handed only what it
uses:

* `SessionLifecycle` (CONNECT, take-over, disconnect, wills), and in a cluster its
  `ClusterOwnership` (the ClientIds claimed, adopted and released across the cluster),
* `Publisher` (plans a message's route with `bridge.router.plan` and carries the plan out),
* `Subscriptions` (SUBSCRIBE, UNSUBSCRIBE, retained messages on subscribe, shared hand-over),
* `Housekeeper` (queue limits, offsets, expiry), `Delivery` (one per connected client),
* from `bridge.operations`: `SysTopics` and `Meter`.

The node itself starts and stops them in order, and is the role its cluster membership
(`bridge.cluster.host.ClusterHost`) and its `$SYS` publisher (`SysHost`) talk to. Everything
runs on one event loop, so the tables need no locks; every `await` is a point where another
client may have changed them, and the code re-checks what it relies on after each one.

How a PUBLISH travels is described in docs/design.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterable
from typing import TYPE_CHECKING, Any, cast

from bridge.access import AccessControl
from bridge.access.banlist import BanList
from bridge.access.limits import LimitControl
from bridge.access.login_guard import UnauthenticatedSockets
from bridge.counters import Metrics
from bridge.logtext import RefusalLog, client_text
from bridge.mqtt.reasons import ReasonCode
from bridge.mqtt.topics import topic_limit_error
from bridge.node.congestion import Congestion
from bridge.node.deadlines import Deadlines
from bridge.node.delivery import Delivery
from bridge.node.early_reads import rewind
from bridge.node.housekeeping import Housekeeper
from bridge.node.lifecycle import SessionLifecycle
from bridge.node.positions import start_new_parts
from bridge.node.presubscribe import parse_presubscriptions
from bridge.node.publish import Publisher
from bridge.node.qos0_flow import Qos0Flow
from bridge.node.quotas import Quota
from bridge.node.retained import RetainedMessages
from bridge.node.stalls import StallWatch
from bridge.node.stamp import Stamper
from bridge.node.subscriptions import Subscriptions
from bridge.node.wills import publication_begun
from bridge.operations.metering import Meter
from bridge.operations.systopics import SysTopics
from bridge.router.plan import ConnectionTable
from bridge.router.shared import SharedSubscriptions
from bridge.router.trie import SubscriptionTrie
from bridge.session import Session
from bridge.settings import Config
from bridge.state import (
    KIND_OFFSETS,
    KIND_ONLINE,
    KIND_QOS2_IN,
    KIND_RETAINED,
    KIND_SESSION,
    Unsettled,
    will_of,
)
from bridge.storage.base import HeldReadStore, Message, MessageStore, MetaUpdate

if TYPE_CHECKING:
    from bridge.access.ratelimit import Limits
    from bridge.cluster.cluster import Cluster
    from bridge.cluster.registry import Claim
    from bridge.node.cluster_ownership import ClusterOwnership
    from bridge.node.roles import ClientLink

__all__ = ["Node", "Unsettled"]

log = logging.getLogger("bridge.node")
_SWEEP_LOG_LINES = 10
"""Clients named in the log when a change of rules disconnects them; the rest are counted."""


class Node:
    """One MQTT-Bridge node: the broker logic between connections and the store."""

    def __init__(self, config: Config, store: MessageStore) -> None:
        self.config = config
        self.node_id = config.resolved_node_id()
        self.store = store
        self.metrics = Metrics()
        self.trie = SubscriptionTrie()
        self.shared = SharedSubscriptions()
        self.sessions: dict[str, Session] = {}
        self.connections: ConnectionTable[ClientLink] = ConnectionTable()
        self.deliveries: dict[str, Delivery] = {}
        self.retained = RetainedMessages(
            Quota(
                config.retained_max_messages,
                config.retained_max_bytes,
                config.retained_max_messages_per_client,
                config.retained_max_bytes_per_client,
                (
                    "retained_max_messages",
                    "retained_max_bytes",
                    "retained_max_messages_per_client",
                    "retained_max_bytes_per_client",
                ),
            )
        )
        self.stamper = Stamper(self.node_id)
        self.access = AccessControl(config)
        self.bans = BanList(
            config, connections=self.connections, kick=self.kick, count=self.metrics.inc
        )
        self.limits = LimitControl(config)
        """The connection and rate limits in force (the configured ones, or the admin API's)."""
        self.limits.changed = self._limits_changed
        self.access.rules_changed = self._rules_changed
        self.connection_count = 0
        self.unauthenticated = UnauthenticatedSockets(
            config.max_unauthenticated, config.max_unauthenticated_per_address
        )
        """The sockets without a CONNACK yet, and their limits (`bridge.listeners.preauth`)."""
        self.fault_log = RefusalLog(config.protocol_fault_log_interval)
        """Paces the log lines about clients closed for a protocol fault, per reason code
        (`bridge.listeners.faults`)."""
        self.deadlines = Deadlines()
        """The connections' CONNECT and keepalive deadlines, on one loop timer."""
        self.stalls = StallWatch()
        """Notices a pause of this process before its connections act on what waited
        (`bridge.node.stalls`); watched by the cluster."""
        self._read_cached = store.read_cached if store.traits.cached_reads else None
        """The store's read from memory (if it has one), one bound method for every delivery."""
        self.accepting = True
        self.cluster: Cluster | None = None
        """Set when the node is a cluster member (`bridge.cluster`)."""
        self.ownership: ClusterOwnership | None = None
        """Its clients' ClientIds across the cluster, set with `cluster` (`join`)."""
        self._background: set[asyncio.Task[Any]] = set()
        self._housekeeping: asyncio.Task[None] | None = None
        self.housekeeper = Housekeeper(
            config=config, store=store, metrics=self.metrics, sessions=self.sessions, owner=self
        )
        if store.traits.early_reads:
            store.on_rewind = self._rewind_readers
        self.congestion = Congestion(
            config=config,
            store=store,
            metrics=self.metrics,
            connections=self.connections,
            deliveries=self.deliveries,
        )
        self.qos0_flow = Qos0Flow(config=config, metrics=self.metrics, connections=self.connections)
        self.publisher = Publisher(
            config=config,
            store=store,
            metrics=self.metrics,
            trie=self.trie,
            shared=self.shared,
            sessions=self.sessions,
            connections=self.connections,
            deliveries=self.deliveries,
            retained=self.retained,
            stamper=self.stamper,
            spawn=self.spawn,
            offline_grew=self.housekeeper.trim_if_over_limits,
            congestion=self.congestion,
            acl=self.access.acl,
        )
        if store.traits.held_reads:
            held = cast(HeldReadStore, store)
            held.on_arrival = self._held_read_arrived
            self.publisher.wakes.reads_held = held.reads_held
        self.subscriptions = Subscriptions(
            trie=self.trie,
            shared=self.shared,
            store=store,
            metrics=self.metrics,
            acl=self.access.acl,
            retained=self.retained,
            stamper=self.stamper,
            waker=self.publisher,
            offsets_moved=self.housekeeper.mark_offsets_dirty,
            max_subscriptions=config.max_subscriptions_per_client,
            topic_fault=self.check_topic_limits,
            spawn=self.spawn,
        )
        self.sys = SysTopics(self, config)
        self.meter = Meter(
            self.connections,
            cluster_name=config.cluster_name,
            interval=config.metering_interval,
        )
        self.lifecycle = SessionLifecycle(
            config=config,
            store=store,
            metrics=self.metrics,
            access=self.access,
            bans=self.bans,
            limits=self.limits,
            presubscriptions=parse_presubscriptions(config.presubscribe),
            subscriptions=self.subscriptions,
            publisher=self.publisher,
            housekeeper=self.housekeeper,
            events=self.sys,
            meter=self.meter,
            sessions=self.sessions,
            connections=self.connections,
            deliveries=self.deliveries,
            make_delivery=self._make_delivery,
            refusing=self._refusing,
            topic_fault=self.check_topic_limits,
            spawn=self.spawn,
        )

    def join(self, cluster: Cluster) -> None:
        """Become a member of `cluster` (before `start`)."""
        self.cluster = cluster
        self.publisher.join(cluster)
        self.subscriptions.cluster = cluster
        self.ownership = self.lifecycle.join(cluster)
        self.retained.announce = cluster.retained_changed

    def _make_delivery(self, session: Session, conn: ClientLink) -> Delivery:
        return Delivery(
            session,
            conn,
            store=self.store,
            metrics=self.metrics,
            offsets=self.housekeeper,
            pace=self.congestion,
            max_inflight=min(self.config.max_inflight, conn.receive_window),
            acl=self.access.acl,
            read_now=self._read_cached,
            # Only a store that cannot settle a failed send stores a QoS 2 resend twice.
            qos2_copy_window=0 if self.store.traits.atomic_meta else self.config.qos2_copy_window,
        )

    def _rewind_readers(self, ends: dict[str, int]) -> None:
        """A failed write took back messages that readers could already read: their cursors go
        back to the queues' new ends (`bridge.node.early_reads`)."""
        self.metrics.inc(
            "readers_rewound",
            rewind(self.sessions.values(), ends, self.housekeeper.mark_offsets_dirty),
        )

    def _refusing(self) -> int | None:
        """Why new clients are refused now (a reason code), or None when they are taken."""
        if not self.accepting:
            return ReasonCode.SERVER_SHUTTING_DOWN
        max_connections = self.limits.current.max_connections
        if max_connections and self.connection_count > max_connections:
            return ReasonCode.QUOTA_EXCEEDED
        return None

    def _limits_changed(self, limits: Limits) -> None:
        """New publish limits apply to the connected clients at once (new ones take them at
        CONNECT)."""
        for conn in self.connections.values():
            conn.limit_publishes(limits.client_publish_rate, limits.client_publish_bytes_rate)

    def _rules_changed(self) -> None:
        """New ACL rules: a connected client whose ClientId they refuse (`clientid` lines) is
        disconnected, 0x87 Not authorized (3.1.1: the connection closed), as a revoked
        subscription stops delivering. Its will is published; a persistent session stays."""
        refusal = self.access.clientid_refusal
        refused = [
            (conn, reason)
            for conn in self.connections.values()
            if (reason := refusal(conn.client_id, conn.username)) is not None
        ]
        for shown, (conn, reason) in enumerate(refused):
            if shown < _SWEEP_LOG_LINES:
                log.warning(
                    "client %s from %s disconnected: %s",
                    client_text(conn.client_id),
                    conn.peer,
                    reason,
                )
            self.metrics.inc("clients_disconnected_clientid_prefix")
            conn.close(reason, reason_code=ReasonCode.NOT_AUTHORIZED)
            self.lifecycle.disconnected(conn, graceful=False)
        if len(refused) > _SWEEP_LOG_LINES:
            log.warning(
                "%d clients disconnected in all: the new ACL rules refuse their ClientIds",
                len(refused),
            )

    # -- start-up and shutdown ------------------------------------------------------------------

    async def start(self) -> None:
        """Open the store, restore persistent sessions and retained messages, publish the wills of
        clients that were connected when the node last stopped without a clean shutdown."""
        store = self.store
        lifecycle = self.lifecycle
        if hasattr(store, "on_new_groups"):
            store.on_new_groups = self._new_store_parts
        await store.open()
        self.retained.restore(store.meta(KIND_RETAINED))
        offsets = store.meta(KIND_OFFSETS)
        online = store.meta(KIND_ONLINE)
        for client_id, subs in store.meta(KIND_SESSION).items():
            lifecycle.restore(client_id, subs, offsets.get(client_id), client_id in online)
        stale = []
        for key, value in store.meta(KIND_QOS2_IN).items():
            client_id, _, packet_id = key.rpartition("\x00")
            session = self.sessions.get(client_id)
            if session is None:
                stale.append(key)
            else:
                lifecycle.restore_qos2_marker(session, int(packet_id), value)
        if stale:
            await store.put_meta([MetaUpdate(KIND_QOS2_IN, k, None) for k in stale])
        for client_id, data in dict(store.meta(KIND_ONLINE)).items():
            will = will_of(data)
            if will is not None:
                log.info("publishing the will of %s, connected when the node stopped", client_id)
                await lifecycle.publish_will(client_id, will, maybe_sent=publication_begun(data))
            else:
                await store.put_meta([MetaUpdate(KIND_ONLINE, client_id, None)])
        log.info(
            "node %s ready: %d persistent sessions, %d retained messages restored",
            self.node_id,
            len(self.sessions),
            len(self.retained),
        )
        self.publisher.delayed.start()  # after the sessions: overdue ones reach them
        self._housekeeping = asyncio.get_running_loop().create_task(self.housekeeper.run())
        access = self.access
        await access.start(self.cluster.registry.redis if self.cluster is not None else None)
        await self.bans.start(self.cluster.registry.redis if self.cluster is not None else None)
        await self.limits.start(self.cluster.registry.redis if self.cluster is not None else None)
        log.log(logging.INFO if access.authenticating else logging.WARNING, "%s", access.describe())
        if self.config.metering_redis_url:
            # Only here: a node without Redis skips redis-py's 10 MiB.
            from bridge.cluster.redis_access import RedisAccess, async_client

            access = RedisAccess.from_config(self.config, url=self.config.metering_redis_url)
            self.meter.redis = async_client(access)
        elif self.cluster is not None:
            self.meter.redis = self.cluster.registry.redis
        self.meter.start()
        self.sys.start()

    async def stop(self) -> None:
        """Flush offsets and close the store (connections are closed by the server first)."""
        self.sys.stop()
        self.deadlines.close()
        await self.meter.stop()
        if self._housekeeping is not None:
            self._housekeeping.cancel()
        for task in list(self._background):
            task.cancel()
        for delivery in list(self.deliveries.values()):
            delivery.stop()
        self.publisher.delayed.stop()
        await self.housekeeper.flush_offsets(durable=True)
        await self.store.close()
        await self.access.stop()
        await self.bans.stop()
        await self.limits.stop()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run a background coroutine whose exceptions are logged, never lost."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background_done)
        return task

    def _background_done(self, task: asyncio.Task[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task failed", exc_info=task.exception())

    # -- questions -------------------------------------------------------------------------------

    def check_topic_limits(self, topic: str) -> str | None:
        """The configured limits on a topic name or filter; a message naming the fault, or None."""
        config = self.config
        return topic_limit_error(topic, config.max_topic_length, config.max_topic_levels)

    def next_key(self) -> str:
        """A message key unique across nodes and restarts."""
        return self.stamper.next_key()

    def connected_count(self) -> int:
        """Clients connected to this node."""
        return len(self.connections)

    def session_count(self) -> int:
        """Sessions (connected or not) held by this node."""
        return len(self.sessions)

    def subscription_count(self) -> int:
        """Subscriptions (shared ones included) of the sessions held here."""
        return sum(len(s.subscriptions) + len(s.shared) for s in self.sessions.values())

    def retained_count(self) -> int:
        """Retained messages of clients and backends (not this node's `$SYS` statistics)."""
        return self.retained.published_count()

    def is_connected(self, client_id: str) -> bool:
        """Whether the client has a connection on this node."""
        return client_id in self.connections

    def holds_session(self, client_id: str) -> bool:
        """Whether the client's session is held by this node."""
        return client_id in self.sessions

    def local_shared_members(self) -> list[tuple[str, str, int]]:
        """(share filter, ClientId, QoS) of every shared membership of a session held here."""
        return [
            (share_filter, session.client_id, qos)
            for session in self.sessions.values()
            for share_filter, qos in session.shared.items()
        ]

    def queue_ends_known(self, queues: list[str]) -> dict[str, int]:
        """The ends this node's store knows of the parts of `queues` (its own stores counted),
        leaving out the parts it knows nothing of."""
        store = self.store
        ends = {part: store.end_offset(part) for queue in queues for part in store.parts(queue)}
        return {part: end for part, end in ends.items() if end > 0}

    # -- acting on clients -------------------------------------------------------------------------

    def kick(self, client_id: str, reason: str) -> bool:
        """Close a client's connection on this node as a network failure would (its will is
        published; a persistent session stays). False if it is not connected here."""
        conn = self.connections.get(client_id)
        if conn is None:
            return False
        conn.close(reason, reason_code=ReasonCode.ADMINISTRATIVE_ACTION)
        self.lifecycle.disconnected(conn, graceful=False)
        return True

    async def persist_quietly(self, updates: list[MetaUpdate]) -> None:
        """Write records in the background: a refusal or outage is logged, not raised."""
        await self.lifecycle.persist_quietly(updates)

    # -- publishing from inside the broker (admin API, $SYS, notify) -----------------------------

    async def publish_internal(
        self, topic: str, payload: bytes, qos: int, retain: bool, publisher: str
    ) -> Message:
        """Publish as if a client had (see `Publisher.publish_internal`)."""
        return await self.publisher.publish_internal(topic, payload, qos, retain, publisher)

    def deliver_qos0(self, message: Message) -> None:
        """Send a QoS 0 message to its online subscribers, here and on peers (not stored)."""
        self.publisher.deliver_qos0(message)

    def keep_retained_in_memory(self, message: Message) -> None:
        """Keep a retained message in this process only (`$SYS` statistics)."""
        self.retained.keep_in_memory(message)

    def route_backend_message(self, message: Message) -> list[str]:
        """A message a backend produced into the store: the queues it must reach."""
        return self.publisher.route_backend_message(message)

    # -- the roles of housekeeping (SessionOwner) and of the cluster (ClusterHost) ---------------

    def fence_clients(self) -> None:
        """This node's lease on its clients may lapse (`bridge.cluster.lease`): close every
        client connection, as if each had gone away (a will is due, and is published here only
        if no other node took the client over meanwhile: `bridge.node.wills`)."""
        for conn in list(self.connections.values()):
            conn.close(
                "this node is cut off from the cluster: reconnect (through another node)",
                reason_code=ReasonCode.SERVER_BUSY,
                discard_queued=True,
            )

    def lost_ownership(self, client_ids: list[str]) -> None:
        """Writes for these clients were refused: another node owns them now. Let go."""
        assert self.ownership is not None
        self.ownership.lost_ownership(client_ids)

    async def expire(self, sessions: list[Session]) -> None:
        """Discard offline sessions whose expiry passed."""
        await self.lifecycle.expire(sessions)

    def adopt_session(self, client_id: str, claim: Claim) -> Session:
        """Hold a persistent session taken over from another node (offline until it connects)."""
        assert self.ownership is not None
        return self.ownership.adopt(client_id, claim)

    def release_session(self, client_id: str, epoch: int | None = None) -> bytes:
        """Another node took the client over: let it go here, hand over its state."""
        assert self.ownership is not None
        return self.ownership.release(client_id, epoch)

    async def publish_orphan_will(
        self, client_id: str, will: Message, online: bytes | None
    ) -> None:
        """Publish the will of a client whose node died (its online record goes with it);
        looked up in the store first if that node had begun publishing it."""
        await self.lifecycle.publish_will(client_id, will, maybe_sent=publication_begun(online))

    async def clear_online(self, client_id: str) -> None:
        """Delete a client's online record (a dead node's client that left no will)."""
        await self.store.put_meta([MetaUpdate(KIND_ONLINE, client_id, None)])

    def deliver_forwarded(self, message: Message) -> None:
        """A QoS 0 message a peer forwarded, for this node's own subscribers."""
        self.publisher.deliver_forwarded(message)

    def deliver_to(self, client_id: str, message: Message) -> None:
        """A QoS 0 message a peer picked this node's shared member for."""
        self.publisher.deliver_to(client_id, message)

    def queues_woken(self, queues: Iterable[str]) -> None:
        """A peer stored messages on these queues (their ends unknown here)."""
        self.publisher.wakes.queues_woken(queues)

    def _held_read_arrived(self, ends: dict[str, int]) -> None:
        """A read the store held found these parts grown: wake their readers here (peers hold
        reads of their own, or are woken by the publishing node)."""
        self.publisher.wakes.held_read_arrived(ends)

    def queues_grew(self, ends: dict[str, int], *, forward: bool = True) -> None:
        """These queues hold messages up to these ends (notify, or a peer)."""
        self.publisher.wakes.queues_grew(ends, forward=forward)

    def retained_from_peer(self, topic: str, record: bytes) -> None:
        """A peer set (or, with an empty record, cleared) a topic's retained message."""
        self.retained.from_peer(topic, record)

    def replace_retained(self, records: dict[str, bytes]) -> None:
        """The registry's full set of retained messages (re-read after a link was down)."""
        self.retained.restore(records)

    def _new_store_parts(self, _groups: list[str]) -> None:
        """The store holds queues in more parts now (a RocketMQ broker group was added): every
        session reads the new parts of its queues from their start."""
        for session in self.sessions.values():
            if start_new_parts(self.store, session):
                self.housekeeper.mark_offsets_dirty(session)
        self.spawn(self.refresh_queue_ends())  # learn the new parts' ends, then wake

    async def refresh_queue_ends(self) -> None:
        """Re-read the queue ends connected clients read, then wake them."""
        await self.publisher.wakes.refresh_queue_ends()
