"""The bridge node: owns the subscription tables, the sessions, the store and the retained messages.

Connections (`bridge.listeners.connection`) hand decoded packets to the node; the node decides,
writes to the store and answers through the connection. Everything runs on one event loop, so the
node's tables need no locks; every `await` is a point where another client may have changed them,
and the code re-checks what it relies on after each one.

How a PUBLISH travels is described in docs/design.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis import asyncio as aioredis

from bridge.access import AccessControl
from bridge.access.acl import PUBLISH
from bridge.access.auth import AuthResult
from bridge.config import Config
from bridge.mqtt import codec
from bridge.mqtt.packets import (
    Connack,
    ConnackCode,
    Connect,
    Publish,
    Will,
)
from bridge.mqtt.topics import parse_shared
from bridge.node.delivery import Delivery
from bridge.node.housekeeping import Housekeeper
from bridge.node.presubscribe import parse_presubscriptions
from bridge.node.subscriptions import SubscriptionHandling
from bridge.operations.metering import Meter
from bridge.operations.metrics import LatencyHistogram, Metrics
from bridge.operations.systopics import SysTopics
from bridge.router.shared import SharedSubscriptions
from bridge.router.trie import SubscriptionTrie
from bridge.session import Session, client_queue, filter_queue
from bridge.state import (
    KIND_OFFSETS,
    KIND_ONLINE,
    KIND_QOS2_IN,
    KIND_RETAINED,
    KIND_SESSION,
    PEER_PREFIX,
    SHARED_QUEUE_PREFIX,
    decode_message,
    encode_message,
    peer_subscriber,
    shared_queue,
    will_of,
)
from bridge.storage.base import Message, MessageStore, MetaUpdate, StaleOwner, StoreUnavailable

if TYPE_CHECKING:
    from bridge.cluster.cluster import Cluster
    from bridge.cluster.registry import Claim
    from bridge.listeners.connection import Connection

DurableCallback = Callable[[int | None, BaseException | None], None]

log = logging.getLogger("bridge.node")
_now = time.time


class Node(SubscriptionHandling):
    """One MQTT-Bridge node: the broker logic between connections and the store."""

    def __init__(self, config: Config, store: MessageStore) -> None:
        self.config = config
        self.node_id = config.resolved_node_id()
        self.store = store
        self.metrics = Metrics()
        self.trie = SubscriptionTrie()
        self.shared = SharedSubscriptions()
        self.sessions: dict[str, Session] = {}
        self.connections: dict[str, Connection] = {}
        self.retained: dict[str, Message] = {}
        self.deliveries: dict[str, Delivery] = {}
        self._key_counter = itertools.count(1)
        self._key_prefix = f"{self.node_id}-{uuid.uuid4().hex[:8]}-"
        self.housekeeper = Housekeeper(self)
        self.access = AccessControl(config)
        self.presubscriptions = parse_presubscriptions(config.presubscribe)
        self.sys = SysTopics(self)
        self.meter = Meter(self)
        self._background: set[asyncio.Task[Any]] = set()
        self._housekeeping: asyncio.Task[None] | None = None
        self.connection_count = 0
        self.accepting = True
        self.cluster: Cluster | None = None
        """Set when the node is a cluster member (`bridge.cluster`)."""
        self.reachable: Callable[[str], bool] = self.connections.__contains__
        """Whether a shared-subscription member can take a message now."""

    def join(self, cluster: Cluster) -> None:
        """Become a member of `cluster` (before `start`)."""
        self.cluster = cluster
        self.reachable = cluster.is_reachable

    # -- start-up and shutdown ------------------------------------------------------------------

    async def start(self) -> None:
        """Open the store, restore persistent sessions and retained messages, publish the wills of
        clients that were connected when the node last stopped without a clean shutdown."""
        await self.store.open()
        for topic, data in self.store.meta(KIND_RETAINED).items():
            self.retained[topic] = decode_message(data)
        offsets = self.store.meta(KIND_OFFSETS)
        online = self.store.meta(KIND_ONLINE)
        for client_id, subs in self.store.meta(KIND_SESSION).items():
            self._restore_session(client_id, subs, offsets.get(client_id), client_id in online)
        stale = []
        for key, value in self.store.meta(KIND_QOS2_IN).items():
            client_id, _, packet_id = key.rpartition("\x00")
            session = self.sessions.get(client_id)
            if session is None:
                stale.append(key)
            else:
                self._restore_qos2_marker(session, int(packet_id), value)
        if stale:
            await self.store.put_meta([MetaUpdate(KIND_QOS2_IN, k, None) for k in stale])
        orphans = dict(self.store.meta(KIND_ONLINE))
        for client_id, data in orphans.items():
            will = will_of(data)
            if will is not None:
                log.info("publishing the will of %s, connected when the node stopped", client_id)
                await self._publish_will(client_id, will)
            else:
                await self.store.put_meta([MetaUpdate(KIND_ONLINE, client_id, None)])
        log.info(
            "node %s ready: %d persistent sessions, %d retained messages restored",
            self.node_id,
            len(self.sessions),
            len(self.retained),
        )
        self._housekeeping = asyncio.get_running_loop().create_task(self.housekeeper.run())
        access = self.access
        await access.start(self.cluster.registry.redis if self.cluster is not None else None)
        log.log(logging.INFO if access.authenticating else logging.WARNING, "%s", access.describe())
        if self.config.metering_redis_url:
            self.meter.redis = aioredis.from_url(
                self.config.metering_redis_url,
                socket_timeout=self.config.redis_timeout,
                socket_connect_timeout=self.config.redis_timeout,
            )
        elif self.cluster is not None:
            self.meter.redis = self.cluster.registry.redis
        self.meter.start()
        self.sys.start()

    def _restore_session(
        self, client_id: str, subs: bytes, offsets: bytes | None, was_online: bool
    ) -> Session:
        """A persistent session from its records, offline, in the tables."""
        session = Session.restore(client_id, subs, offsets)
        if not session.disconnected_at or was_online:
            # Connected when its node stopped (or never recorded): offline from now on.
            session.disconnected_at = time.time()
        self.sessions[client_id] = session
        self._subscribe_tables(session)
        return session

    def _restore_qos2_marker(self, session: Session, packet_id: int, value: bytes) -> None:
        if self.store.atomic_meta:
            session.inbound_qos2[packet_id] = None
        else:
            # Written before the message was sent: whether that send stored it is settled
            # by asking the store when the client resends the id (if it ever does).
            session.inbound_qos2[packet_id] = Unsettled.decode(value)

    def adopt_session(self, client_id: str, claim: Claim) -> Session:
        """Hold a persistent session taken over from another node (offline until it connects)."""
        records = claim.records
        session = self._restore_session(
            client_id, records["subs"], records.get("off"), records.get("online") is not None
        )
        for name, value in records.items():
            if name.startswith("q2:"):
                self._restore_qos2_marker(session, int(name[3:]), value)
        return session

    async def publish_orphan_will(self, client_id: str, will: Message) -> None:
        """Publish the will of a client whose node died (its online record goes with it)."""
        await self._publish_will(client_id, will)

    async def clear_online(self, client_id: str) -> None:
        await self.store.put_meta([MetaUpdate(KIND_ONLINE, client_id, None)])

    async def stop(self) -> None:
        """Flush offsets and close the store (connections are closed by the server first)."""
        self.sys.stop()
        await self.meter.stop()
        if self._housekeeping is not None:
            self._housekeeping.cancel()
        for task in list(self._background):
            task.cancel()
        for delivery in list(self.deliveries.values()):
            delivery.stop()
        await self.housekeeper.flush_offsets(durable=True)
        await self.store.close()
        await self.access.stop()

    def _subscribe_tables(self, session: Session) -> None:
        for topic_filter, qos in session.subscriptions.items():
            self.add_subscription(session.client_id, topic_filter, qos)
        for share_filter, qos in session.shared.items():
            parsed = parse_shared(share_filter)
            if parsed is not None:
                self.add_shared(session.client_id, share_filter, parsed, qos)

    def add_subscription(self, client_id: str, topic_filter: str, qos: int) -> None:
        """A local session subscribes (the cluster advertises a filter's first subscriber)."""
        if self.trie.subscribe(topic_filter, client_id, qos) and self.cluster is not None:
            self.cluster.local_filter_added(topic_filter)

    def remove_subscription(self, client_id: str, topic_filter: str) -> None:
        if self.trie.unsubscribe(topic_filter, client_id) and self.cluster is not None:
            self.cluster.local_filter_removed(topic_filter)

    def add_shared(
        self, client_id: str, share_filter: str, parsed: tuple[str, str], qos: int
    ) -> None:
        group, inner = parsed
        self.shared.subscribe(share_filter, group, inner, client_id, qos)
        if self.cluster is not None:
            self.cluster.shared_member_changed(share_filter, client_id, qos)

    def remove_shared(self, client_id: str, share_filter: str) -> None:
        if self.shared.unsubscribe(share_filter, client_id) and self.cluster is not None:
            self.cluster.shared_member_removed(share_filter, client_id)

    def local_shared_members(self) -> list[tuple[str, str, int]]:
        """(share filter, ClientId, QoS) of every shared membership of a session held here."""
        return [
            (share_filter, session.client_id, qos)
            for session in self.sessions.values()
            for share_filter, qos in session.shared.items()
        ]

    def subscription_count(self) -> int:
        """Subscriptions (shared ones included) of the sessions held here."""
        return sum(len(s.subscriptions) + len(s.shared) for s in self.sessions.values())

    def retained_count(self) -> int:
        """Retained messages of clients and backends (not this node's `$SYS` statistics)."""
        return sum(1 for topic in self.retained if not topic.startswith("$SYS/"))

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        """Run a background coroutine whose exceptions are logged, never lost."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background_done)
        return task

    def _background_done(self, task: asyncio.Task[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task failed", exc_info=task.exception())

    def next_key(self) -> str:
        """A message key unique across nodes and restarts."""
        return f"{self._key_prefix}{next(self._key_counter)}"

    # -- CONNECT / DISCONNECT -------------------------------------------------------------------

    async def connect(self, conn: Connection, packet: Connect) -> Session | None:
        """Validate CONNECT, take over or create the session, answer CONNACK. None if refused."""
        cfg = self.config
        if (packet.protocol_name, packet.protocol_level) not in (("MQIsdp", 3), ("MQTT", 4)):
            self._refuse(
                conn,
                ConnackCode.UNACCEPTABLE_PROTOCOL_VERSION,
                f"protocol level {packet.protocol_level} not supported (MQTT-3.1.2-2)",
            )
            return None
        client_id = packet.client_id
        if not client_id:
            if not packet.clean_session:
                self._refuse(
                    conn,
                    ConnackCode.IDENTIFIER_REJECTED,
                    "empty ClientId with clean session 0 (MQTT-3.1.3-8)",
                )
                return None
            if not cfg.allow_zero_length_clientid:
                self._refuse(
                    conn,
                    ConnackCode.IDENTIFIER_REJECTED,
                    "empty ClientId not allowed by configuration",
                )
                return None
            client_id = f"auto-{uuid.uuid4().hex}"
        elif packet.protocol_level == 3 and len(client_id) > 23:
            self._refuse(
                conn, ConnackCode.IDENTIFIER_REJECTED, "MQTT 3.1 ClientId longer than 23 characters"
            )
            return None
        if "\x00" in client_id or len(client_id.encode()) > cfg.max_topic_length:
            self._refuse(conn, ConnackCode.IDENTIFIER_REJECTED, "ClientId too long")
            return None
        if not self.accepting or (
            cfg.max_connections and self.connection_count > cfg.max_connections
        ):
            self._refuse(
                conn, ConnackCode.SERVER_UNAVAILABLE, "node is draining or at max_connections"
            )
            return None
        if packet.will is not None:
            error = self.check_topic_limits(packet.will.topic)
            if error:
                conn.close(f"will topic rejected: {error}")
                return None
        result, username = await self.access.authenticate(
            client_id, packet.username, packet.password, conn.cert_cn
        )
        if conn.closed:
            return None
        if result is not AuthResult.ACCEPTED:
            self.metrics.inc("auth_failures")
            self._refuse(
                conn,
                result.connack_code,
                f"authentication failed ({result.name}) for user {packet.username!r}",
            )
            return None
        if packet.will is not None and not self.access.acl.allows(
            PUBLISH, client_id, username, packet.will.topic
        ):
            self.metrics.inc("acl_denied_will")
            self._refuse(
                conn,
                ConnackCode.NOT_AUTHORIZED,
                f"ACL denies publishing the will topic {packet.will.topic!r}",
            )
            return None
        conn.username = username
        conn.client_id = client_id
        handed_over = False
        if self.cluster is not None:
            outcome = await self._take_over_in_cluster(conn, client_id, packet.clean_session)
            if outcome is None:
                return None
            handed_over = outcome

        old = self.connections.get(client_id)
        if old is not None and old is not conn:
            log.info(
                "client %s: taken over by a new connection from %s (MQTT-3.1.4-2)",
                client_id,
                conn.peer,
            )
            old.close("session taken over by a new connection", taken_over=True)
            self.disconnected(old, graceful=False)

        session = self.sessions.get(client_id)
        updates: list[MetaUpdate] = []
        session_present = False
        if packet.clean_session:
            if session is not None:
                self.discard_session(session, updates)
            session = Session(client_id=client_id, persistent=False)
        elif session is not None and session.persistent:
            session_present = True
            if handed_over:
                # Its state came from the node that held it: durable under our ownership now.
                updates.append(MetaUpdate(KIND_SESSION, client_id, session.encode_subscriptions()))
                updates.append(MetaUpdate(KIND_OFFSETS, client_id, session.encode_offsets()))
        else:
            if session is not None:
                self.discard_session(session, updates)
            session = Session(client_id=client_id, persistent=True)
            updates.append(MetaUpdate(KIND_SESSION, client_id, session.encode_subscriptions()))
        self.sessions[client_id] = session
        session.connected = True
        conn.session = session
        conn.will = packet.will
        self.connections[client_id] = conn
        self.metrics.inc("connections_accepted")
        updates.append(MetaUpdate(KIND_ONLINE, client_id, self._online_record(conn, packet.will)))
        own_queue = client_queue(client_id)
        try:
            if own_queue not in session.cursors:
                session.start_queue(own_queue, await self.store.queue_end(own_queue))
            if self.presubscriptions and await self._presubscribe(session, username):
                updates.append(MetaUpdate(KIND_SESSION, client_id, session.encode_subscriptions()))
            await self.store.put_meta(updates, durable=True)
        except StoreUnavailable as exc:
            log.error("client %s: store unavailable during CONNECT: %s", client_id, exc)
            self._refuse(conn, ConnackCode.SERVER_UNAVAILABLE, "store unavailable")
            self.disconnected(conn, graceful=True)
            return None
        if conn.closed or conn.session is not session:
            return None
        conn.send(codec.encode(Connack(ConnackCode.ACCEPTED, session_present)))
        conn.connected_at = time.time()
        self.sys.connected(conn, packet.clean_session, packet.keepalive)
        log.debug(
            "client %s connected from %s (clean=%s, present=%s)",
            client_id,
            conn.peer,
            packet.clean_session,
            session_present,
        )
        delivery = Delivery(self, session, conn)
        self.deliveries[client_id] = delivery
        delivery.resend_inflight()
        delivery.wake()
        if self.cluster is not None:
            for share_filter, qos in session.shared.items():
                self.cluster.shared_member_changed(share_filter, client_id, qos)
        return session

    async def _presubscribe(self, session: Session, username: str | None) -> bool:
        """Subscribe the session to the configured pre-subscriptions it lacks (`%c`/`%u`
        expanded); True if a persistent session's subscriptions changed. Raises
        StoreUnavailable (the CONNECT is refused then)."""
        client_id = session.client_id
        changed = False
        for presub in self.presubscriptions:
            topic_filter = presub.expand(client_id, username)
            if topic_filter is None or topic_filter in session.subscriptions:
                continue
            if self.check_topic_limits(topic_filter):
                continue
            queue = filter_queue(topic_filter)
            if queue not in session.cursors:
                session.start_queue(queue, await self.store.queue_end(queue))
            self.add_subscription(client_id, topic_filter, presub.qos)
            session.subscriptions[topic_filter] = presub.qos
            self.metrics.inc("presubscriptions")
            changed = session.persistent
        return changed

    async def _take_over_in_cluster(
        self, conn: Connection, client_id: str, clean: bool
    ) -> bool | None:
        """Own the ClientId cluster-wide: claim it in the registry (the atomic step), have the
        node that held it close the old connection and hand over the session, publish the old
        connection's will. True if a session came from another node, None if refused."""
        assert self.cluster is not None
        cluster = self.cluster
        try:
            claim = await cluster.registry.claim(client_id, clean)
        except StoreUnavailable as exc:
            self._refuse(conn, ConnackCode.SERVER_UNAVAILABLE, f"registry unavailable: {exc}")
            return None
        assert claim is not None
        previous = claim.previous_node
        if not previous or previous == self.node_id:
            return False
        state = await cluster.request_release(previous, client_id, claim.epoch)
        will = will_of(claim.online)
        if will is not None:
            # The old connection ends without DISCONNECT: its will is due, and only the node
            # that took the online record (atomically, in the claim) publishes it.
            self.spawn(self._publish_will(client_id, will, clear_online=False))
        records = dict(claim.records)
        if state:
            handed = json.loads(state)
            records["subs"], records["off"] = handed["subs"].encode(), handed["off"].encode()
        session = self.sessions.get(client_id)
        if session is not None:
            self.discard_session(session, [])  # a stale copy from before
        if "subs" in records and not claim.was_clean:
            claim.records = records
            self.adopt_session(client_id, claim)
            return True
        return False

    def release_session(self, client_id: str, epoch: int | None = None) -> bytes:
        """Another node took the client over (at `epoch`, if known): close its connection here
        (its will is the new owner's to publish), drop the session from the tables, hand over
        its state."""
        assert self.cluster is not None
        own = self.cluster.registry.epochs.get(client_id)
        if own is not None and epoch is not None and own > epoch:
            return b""  # taken back by this node since: the request is stale
        session = self.sessions.get(client_id)
        state = b""
        if session is not None and session.persistent:
            state = json.dumps(
                {
                    "subs": session.encode_subscriptions().decode(),
                    "off": session.encode_offsets().decode(),
                },
                separators=(",", ":"),
            ).encode()
        conn = self.connections.get(client_id)
        if conn is not None:
            conn.will = None
            self._detach(conn)
            conn.close("session taken over by a connection on another node", taken_over=True)
        if session is not None:
            self.discard_session(session, [])
        self.cluster.registry.disown(client_id)
        self.metrics.inc("sessions_released")
        return state

    def lost_ownership(self, client_ids: list[str]) -> None:
        """Writes for these clients were refused: another node owns them now. Let go."""
        assert self.cluster is not None
        for client_id in client_ids:
            if client_id not in self.cluster.registry.epochs:
                log.warning("client %s: owned by another node now; dropped here", client_id)
                self.release_session(client_id)

    def _online_record(self, conn: Connection, will: Will | None) -> bytes:
        record: dict[str, Any] = {"peer": conn.peer, "at": time.time(), "node": self.node_id}
        if will is not None:
            record["will"] = encode_message(self._will_message(conn.client_id, will)).decode()
        return json.dumps(record, separators=(",", ":")).encode()

    def _will_message(self, client_id: str, will: Will) -> Message:
        return self._stamp(will.topic, will.payload, will.qos, will.retain, client_id)

    def _stamp(self, topic: str, payload: bytes, qos: int, retain: bool, publisher: str) -> Message:
        """A message as this node stores it: unique key, publish time, node id."""
        return Message(
            topic,
            payload,
            qos,
            retain,
            publisher,
            f"{self._key_prefix}{next(self._key_counter)}",
            int(_now() * 1000),
            self.node_id,
        )

    def _refuse(self, conn: Connection, code: int, reason: str) -> None:
        log.warning("client %r from %s refused: %s", conn.client_id or "", conn.peer, reason)
        self.metrics.inc("connections_refused")
        conn.send(codec.encode(Connack(code, False)))
        conn.close(reason, log_it=False)

    def disconnected(self, conn: Connection, graceful: bool) -> None:
        """The connection ended: DISCONNECT received (`graceful`) or the network/peer failed."""
        session = conn.session
        if session is None or conn.detached:
            return
        self.meter.take(conn)
        if not self._detach(conn):
            return  # taken over: the new connection owns the session now
        self.sys.disconnected(
            conn, "disconnect" if graceful else conn.close_reason or "connection lost"
        )
        client_id = session.client_id
        will = conn.will
        if not graceful and will is not None:
            self.spawn(self._publish_will(client_id, self._will_message(client_id, will)))
        else:
            self.spawn(self.persist_quietly([MetaUpdate(KIND_ONLINE, client_id, None)]))
        self._redispatch_shared(session)
        if not session.persistent:
            self.discard_session(session, [])  # nothing of a clean session is stored
            if self.cluster is not None:
                self.spawn(self.end_in_registry(client_id))
        else:
            self.housekeeper.mark_offsets_dirty(session)
            if self.cluster is not None:
                for share_filter, qos in session.shared.items():
                    self.cluster.shared_member_changed(share_filter, client_id, qos)

    def _detach(self, conn: Connection) -> bool:
        """Unhook a connection from its session; False if it no longer was the session's."""
        conn.detached = True
        session = conn.session
        assert session is not None
        client_id = session.client_id
        delivery = self.deliveries.get(client_id)
        if delivery is not None and delivery.conn is conn:
            delivery.stop()
            del self.deliveries[client_id]
        if self.connections.get(client_id) is not conn:
            return False
        del self.connections[client_id]
        session.connected = False
        session.disconnected_at = time.time()
        return True

    async def persist_quietly(self, updates: list[MetaUpdate]) -> None:
        """Write records in the background: a refusal or outage is logged, not raised."""
        try:
            await self.store.put_meta(updates)
        except StaleOwner as exc:
            log.debug("records not written: %s", exc)
        except StoreUnavailable as exc:
            log.warning("records not written, store unavailable: %s", exc)

    async def end_in_registry(self, client_id: str) -> None:
        assert self.cluster is not None
        if client_id in self.sessions:
            return  # reconnected meanwhile
        try:
            await self.cluster.registry.end_session(client_id)
        except StoreUnavailable as exc:
            log.debug("client %s: registry entry not deleted: %s", client_id, exc)

    async def _publish_will(
        self, client_id: str, message: Message, *, clear_online: bool = True
    ) -> None:
        """Publish a will once: the online record is deleted in the same atomic append."""
        self.metrics.inc("wills_published")
        log.info("client %s: publishing will to %r", client_id, message.topic)
        meta = [MetaUpdate(KIND_ONLINE, client_id, None)] if clear_online else []
        if message.retain:
            meta.extend(self._retain_updates(message))
        try:
            await self.route(message, meta=meta)
        except StoreUnavailable as exc:
            log.error("client %s: will not stored, store unavailable: %s", client_id, exc)

    def discard_session(self, session: Session, updates: list[MetaUpdate]) -> None:
        """Forget a session entirely (clean session, expiry, replaced by a clean one)."""
        client_id = session.client_id
        for topic_filter in session.subscriptions:
            self.remove_subscription(client_id, topic_filter)
        for share_filter in session.shared:
            self.remove_shared(client_id, share_filter)
        if self.sessions.get(client_id) is session:
            del self.sessions[client_id]
        self.housekeeper.forget(client_id)
        if session.persistent:
            updates.append(MetaUpdate(KIND_SESSION, client_id, None))
            updates.append(MetaUpdate(KIND_OFFSETS, client_id, None))
            for packet_id in session.inbound_qos2:
                updates.append(MetaUpdate(KIND_QOS2_IN, f"{client_id}\x00{packet_id}", None))

    # -- PUBLISH --------------------------------------------------------------------------------

    def check_topic_limits(self, topic: str) -> str | None:
        """The configured limits on a topic name or filter; a message naming the fault, or None."""
        limit = self.config.max_topic_length
        # A UTF-8 character is at most 4 bytes: most topics need no encoding to be checked.
        if len(topic) * 4 > limit and len(topic.encode()) > limit:
            return f"topic longer than max_topic_length={self.config.max_topic_length}"
        if topic.count("/") + 1 > self.config.max_topic_levels:
            return f"topic has more than max_topic_levels={self.config.max_topic_levels} levels"
        return None

    def publish_qos0(self, session: Session, packet: Publish) -> None:
        """A QoS 0 PUBLISH from a client: deliver to online subscribers at once, store unawaited."""
        message = self._stamp(packet.topic, packet.payload, 0, packet.retain, session.client_id)
        self.metrics.counters["messages_in_qos0"] += 1
        if packet.retain:
            self.store.submit(
                message, (), meta=self._retain_updates(message), callback=_log_unstored
            )
        elif self.config.store_qos0:
            try:
                self.store.append_unqueued(message)
            except StoreUnavailable as exc:
                self.metrics.inc("qos0_not_stored")
                log.debug("QoS 0 message not stored: %s", exc)
        self.deliver_qos0(message)

    def deliver_qos0(self, message: Message) -> None:
        """Send a QoS 0 message to its online subscribers, here and on peers (not stored)."""
        data = codec.encode_publish(message.topic, message.payload, 0)
        connections = self.connections
        peers = self._send_to_subscribers(message.topic, data, len(message.payload))
        if peers and self.cluster is not None:
            self.cluster.forward(peers, message)
        if self.shared:
            for _share_filter, group in self.shared.match(message.topic):
                member = group.pick(self.reachable)
                if member is None:
                    self.metrics.inc("dropped_no_shared_member")
                elif member in connections:
                    self.count_qos0_sent(
                        connections[member].send_droppable(data, len(message.payload))
                    )
                elif self.cluster is not None:
                    self.cluster.deliver(member, message)

    def _send_to_subscribers(self, topic: str, data: bytes, payload_size: int) -> list[str]:
        """Send an encoded QoS 0 PUBLISH to this node's connected (non-shared) subscribers of
        `topic`; the peers among the matches (they have subscribers of their own)."""
        connections = self.connections
        peers: list[str] = []
        sent = 0
        for client_id in self.trie.match_subscribers(topic):
            conn = connections.get(client_id)
            if conn is not None:
                sent += conn.send_droppable(data, payload_size)
            elif client_id[0] == PEER_PREFIX:
                peers.append(client_id[1:])
        self.count_qos0_sent(sent)
        return peers

    def count_qos0_sent(self, sent: int) -> None:
        """Count QoS 0 PUBLISH packets sent directly (`Connection.send_droppable`)."""
        if sent:
            metrics = self.metrics
            metrics.counters["messages_out_qos0"] += sent
            metrics.packets_out[3] += sent

    def deliver_forwarded(self, topic: str, payload: bytes) -> None:
        """A QoS 0 message a peer forwarded: to this node's own (non-shared) subscribers."""
        self._send_to_subscribers(topic, codec.encode_publish(topic, payload, 0), len(payload))

    def deliver_to(self, client_id: str, topic: str, payload: bytes) -> None:
        """A QoS 0 message a peer picked this node's client for (shared subscription)."""
        conn = self.connections.get(client_id)
        if conn is not None:
            self.count_qos0_sent(
                conn.send_droppable(codec.encode_publish(topic, payload, 0), len(payload))
            )
        else:
            self.metrics.inc("dropped_no_shared_member")

    def publish(self, session: Session, packet: Publish, on_durable: DurableCallback) -> None:
        """A QoS 1/2 PUBLISH from a client. `on_durable(seq, None)` is called once the message is
        durable (then the caller acknowledges) or `on_durable(None, error)` if it could not be
        stored (then it must not). For QoS 2, `session.inbound_qos2[packet id]` holds a future
        that completes (with the error or None) at the same time, so a resent PUBLISH with that
        id is answered without being stored again.

        Synchronous up to the store's submit, so calls made in packet order keep that order.
        """
        qos = packet.qos
        message = self._stamp(packet.topic, packet.payload, qos, packet.retain, session.client_id)
        self.metrics.counters["messages_in_qos1" if qos == 1 else "messages_in_qos2"] += 1
        on_durable = _timed(on_durable, self.metrics.store_latency)
        meta: list[MetaUpdate] | tuple[()] = ()
        if packet.retain:
            meta = self._retain_updates(message)
        if qos == 1 or packet.packet_id is None:
            self.route_submit(message, meta, on_durable)
            return
        unsettled = Unsettled(message.topic, message.key)
        if session.persistent:
            meta = [
                *meta,
                MetaUpdate(
                    KIND_QOS2_IN, f"{session.client_id}\x00{packet.packet_id}", unsettled.encode()
                ),
            ]
        packet_id = packet.packet_id
        stored: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
        session.inbound_qos2[packet_id] = stored
        atomic = self.store.atomic_meta

        def done(seq: int | None, error: BaseException | None) -> None:
            if not stored.done():
                stored.set_result(error)
            if error is not None and session.inbound_qos2.get(packet_id) is stored:
                if not atomic and getattr(error, "maybe_stored", False):
                    # The send may have stored it: a resend must ask the store first.
                    session.inbound_qos2[packet_id] = unsettled
                else:
                    # Not stored: a resend of this id must be stored, not merely acknowledged.
                    del session.inbound_qos2[packet_id]
            on_durable(seq, error)

        self.route_submit(message, meta, done)

    def publish_qos2_again(
        self, session: Session, packet: Publish, ack: Callable[[BaseException | None], None]
    ) -> None:
        """A QoS 2 PUBLISH whose packet id is still held: acknowledge it once the first store is
        durable, never store it twice. If whether that store happened is unsettled (a send that
        timed out, a crash between marker and send), ask the store: found, acknowledge; not
        found, store this one."""
        assert packet.packet_id is not None
        pending = session.inbound_qos2[packet.packet_id]
        if isinstance(pending, Unsettled):
            self.spawn(self._settle_qos2(session, packet, pending, ack))
        elif pending is None or pending.done():
            ack(None if pending is None else pending.result())
        else:
            pending.add_done_callback(lambda f: ack(f.result()))

    async def _settle_qos2(
        self,
        session: Session,
        packet: Publish,
        unsettled: Unsettled,
        ack: Callable[[BaseException | None], None],
    ) -> None:
        packet_id = packet.packet_id
        assert packet_id is not None
        try:
            found = await self.store.find_key(unsettled.topic, unsettled.key)
        except StoreUnavailable as exc:
            ack(exc)
            return
        if session.inbound_qos2.get(packet_id) is not unsettled:
            # Settled meanwhile (PUBREL, or another resend got here first): start over.
            if packet_id in session.inbound_qos2:
                self.publish_qos2_again(session, packet, ack)
            else:
                self.publish(session, packet, lambda _s, error: ack(error))
            return
        if found:
            log.info(
                "client %s: QoS 2 message %s was stored before the failure; not stored again",
                session.client_id,
                unsettled.key,
            )
            session.inbound_qos2[packet_id] = None
            ack(None)
        else:
            del session.inbound_qos2[packet_id]
            self.publish(session, packet, lambda _s, error: ack(error))

    async def publish_internal(
        self, topic: str, payload: bytes, qos: int, retain: bool, publisher: str
    ) -> Message:
        """Publish a message that comes from inside the broker (the admin API, `$SYS` statistics,
        client events) as if a client had: routed to every matching subscription, kept as the
        retained message if `retain`. Returns once it is durable (QoS 0: stored, not queued);
        raises StoreUnavailable if it could not be stored."""
        message = self._stamp(topic, payload, qos, retain, publisher)
        meta = self._retain_updates(message) if retain else []
        await self.route(message, meta)
        return message

    def kick(self, client_id: str, reason: str) -> bool:
        """Close a client's connection on this node as a network failure would (its will is
        published; a persistent session stays). False if it is not connected here."""
        conn = self.connections.get(client_id)
        if conn is None:
            return False
        conn.close(reason)
        self.disconnected(conn, graceful=False)
        return True

    async def route(self, message: Message, meta: Iterable[MetaUpdate] = ()) -> int:
        """Route and store a message (wills, system messages); returns its seq once durable."""
        outcome: asyncio.Future[tuple[int | None, BaseException | None]]
        outcome = asyncio.get_running_loop().create_future()

        def settle(seq: int | None, error: BaseException | None) -> None:
            if not outcome.done():  # the awaiting task may have been cancelled (shutdown)
                outcome.set_result((seq, error))

        self.route_submit(message, tuple(meta), settle)
        seq, error = await outcome
        if error is not None:
            raise error
        assert seq is not None
        return seq

    def route_submit(
        self, message: Message, meta: Sequence[MetaUpdate], on_durable: DurableCallback
    ) -> None:
        """Store a message on the queues of every matching subscription; once it is durable,
        wake their readers, then call `on_durable`. QoS 0 messages (wills) are delivered directly
        and stored without queue entries."""
        queues, woken = self.queues_for(message)

        def durable(seq: int | None, error: BaseException | None) -> None:
            if woken and error is None:
                self._wake_readers(woken, queues)
            on_durable(seq, error)

        self.store.submit(message, queues, meta=meta, callback=durable)

    def queues_for(self, message: Message) -> tuple[list[str], list[str]]:
        """The queues a message must be stored on (one per matching filter, a picked member of
        each matching shared group) and the clients reading them. QoS 0 messages (and shared
        members granted QoS 0) are delivered directly instead."""
        queues: list[str] = []
        woken: list[str] = []
        if message.qos == 0:
            self.deliver_qos0(message)
        else:
            for topic_filter, subscribers in self.trie.match(message.topic):
                queues.append(filter_queue(topic_filter))
                woken.extend(subscribers)
            if self.shared:
                for share_filter, group in self.shared.match(message.topic):
                    member = group.pick(self.reachable) or group.pick()
                    if member is None:
                        continue
                    if min(group.members.get(member, 0), message.qos) == 0:
                        conn = self.connections.get(member)
                        if conn is not None:
                            self.count_qos0_sent(
                                conn.send_droppable(
                                    codec.encode_publish(message.topic, message.payload, 0),
                                    len(message.payload),
                                )
                            )
                        elif self.cluster is not None:
                            self.cluster.deliver(member, message)
                        continue
                    queues.append(shared_queue(share_filter, member))
                    woken.append(self._reader_id(member))
        return queues, woken

    def _reader_id(self, client_id: str) -> str:
        """The client itself if its session is here, else the peer holding it (if known)."""
        if self.cluster is None or client_id in self.sessions:
            return client_id
        peer = self.cluster.node_of(client_id)
        return peer_subscriber(peer) if peer else client_id

    def route_backend_message(self, message: Message) -> list[str]:
        """A message a backend produced straight into the store (notify found it): keep it as
        the topic's retained message if flagged so, and return the queues it must reach."""
        if message.retain:
            self.spawn(self.store.put_meta(self._retain_updates(message)))
        queues, _woken = self.queues_for(message)
        return queues

    def readers_of(self, queue: str) -> list[str]:
        """The clients of this node that read `queue`."""
        if queue.startswith("f:"):
            return list(self.trie.subscribers(queue[2:]))
        if queue.startswith("c:"):
            return [queue[2:]]
        if queue.startswith(SHARED_QUEUE_PREFIX):
            return [self._reader_id(queue.rpartition("\x00")[2])]
        return []

    def queues_grew(self, ends: dict[str, int], *, forward: bool = True) -> None:
        """Queues are known to hold messages up to these ends (notify): wake their readers,
        here and (`forward`) on the peers that have readers of them."""
        woken: list[str] = []
        peers: dict[str, dict[str, int]] = {}
        for queue, end in ends.items():
            self.store.note_end(queue, end)
            for reader in self.readers_of(queue):
                if reader[0] != PEER_PREFIX:
                    woken.append(reader)
                elif forward:
                    peers.setdefault(reader[1:], {})[queue] = end
        if woken:
            self._wake_readers(list(dict.fromkeys(woken)), [])
        if self.cluster is not None:
            for peer, peer_ends in peers.items():
                self.cluster.grew(peer, peer_ends)

    def queues_woken(self, queues: Iterable[str]) -> None:
        """A peer stored messages on these queues (their new ends unknown here): let each
        reader that is caught up wait for at least one more message."""
        woken: list[str] = []
        store = self.store
        for queue in queues:
            for reader in self.readers_of(queue):
                session = self.sessions.get(reader)
                if session is None:
                    continue
                cursor = session.cursors.get(queue)
                if cursor is not None and cursor >= store.end_offset(queue):
                    store.note_end(queue, cursor + 1)  # a read waits (long-polls) for it
                woken.append(reader)
        if woken:
            self._wake_readers(list(dict.fromkeys(woken)), [])

    def _wake_readers(self, client_ids: list[str], queues: list[str]) -> None:
        deliveries = self.deliveries
        told: set[str] = set()
        for client_id in client_ids:
            delivery = deliveries.get(client_id)
            if delivery is not None:
                delivery.wake()
            elif client_id[0] == PEER_PREFIX:
                if self.cluster is not None and client_id not in told:
                    told.add(client_id)
                    self.cluster.wake(client_id[1:], queues)
            else:
                self.housekeeper.check_backlog(client_id)

    async def refresh_queue_ends(self) -> None:
        """Re-read the ends of the queues connected clients read, then wake them (after a peer
        link was down, announcements of new messages may have been lost)."""
        queues = {q for s in self.sessions.values() if s.connected for q in s.cursors}
        limit = asyncio.Semaphore(32)

        async def refresh(queue: str) -> None:
            async with limit:
                with contextlib.suppress(StoreUnavailable):
                    await self.store.queue_end(queue)

        await asyncio.gather(*(refresh(q) for q in queues))
        for delivery in list(self.deliveries.values()):
            delivery.wake()

    def retained_from_peer(self, topic: str, record: bytes) -> None:
        """A peer set (or, with an empty record, cleared) a topic's retained message."""
        if record:
            self.retained[topic] = decode_message(record)
        else:
            self.retained.pop(topic, None)

    def replace_retained(self, records: dict[str, bytes]) -> None:
        """The registry's full set of retained messages (re-read after a link was down)."""
        self.retained = {topic: decode_message(data) for topic, data in records.items()}

    def _retain_updates(self, message: Message) -> list[MetaUpdate]:
        """Set or clear the retained message of a topic (empty payload clears, MQTT-3.3.1-10)."""
        record = encode_message(message) if message.payload else None
        if record is not None:
            self.retained[message.topic] = message
        else:
            self.retained.pop(message.topic, None)
        if self.cluster is not None:
            self.cluster.retained_changed(message.topic, record or b"")
        return [MetaUpdate(KIND_RETAINED, message.topic, record)]

    async def release_qos2(self, session: Session, packet_id: int) -> None:
        """PUBREL from the publisher of a persistent session: forget the packet id durably before
        PUBCOMP (a clean session's id lives only in memory; the connection drops it itself)."""
        session.inbound_qos2.pop(packet_id, None)
        await self.store.put_meta(
            [MetaUpdate(KIND_QOS2_IN, f"{session.client_id}\x00{packet_id}", None)], durable=True
        )


@dataclass(slots=True, frozen=True)
class Unsettled:
    """An inbound QoS 2 message whose store is not confirmed either way (non-atomic stores)."""

    topic: str
    key: str

    def encode(self) -> bytes:
        return json.dumps({"t": self.topic, "k": self.key}, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> Unsettled | None:
        """The marker's message; None for an old marker with no message (taken as stored)."""
        try:
            raw = json.loads(data)
            return cls(str(raw["t"]), str(raw["k"]))
        except (ValueError, KeyError, TypeError):
            return None


def _timed(on_durable: DurableCallback, histogram: LatencyHistogram) -> DurableCallback:
    """`on_durable` that first records how long the store took (successful stores only)."""
    started = time.perf_counter()

    def timed(seq: int | None, error: BaseException | None) -> None:
        if error is None:
            histogram.observe(time.perf_counter() - started)
        on_durable(seq, error)

    return timed


def _log_unstored(_seq: int | None, error: BaseException | None) -> None:
    if error is not None:
        log.warning("QoS 0 message not stored: %s", error)
