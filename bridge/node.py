"""The bridge node: owns the subscription tables, the sessions, the store and the retained messages.

Connections (`bridge.connection`) hand decoded packets to the node; the node decides, writes to the
store and answers through the connection. Everything runs on one event loop, so the node's tables
need no locks; every `await` is a point where another client may have changed them, and the code
re-checks what it relies on after each one.

How a PUBLISH travels is described in docs/design.md.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bridge.auth import AllowAll, AuthResult, make_authenticator
from bridge.config import Config
from bridge.delivery import Delivery
from bridge.housekeeping import Housekeeper
from bridge.metrics import Metrics
from bridge.mqtt import codec
from bridge.mqtt.packets import (
    Connack,
    ConnackCode,
    Connect,
    Publish,
    Will,
)
from bridge.mqtt.topics import parse_shared
from bridge.router.shared import SharedSubscriptions
from bridge.router.trie import SubscriptionTrie
from bridge.session import Session, client_queue, filter_queue
from bridge.state import (
    KIND_OFFSETS,
    KIND_ONLINE,
    KIND_QOS2_IN,
    KIND_RETAINED,
    KIND_SESSION,
    SHARED_QUEUE_PREFIX,
    decode_message,
    encode_message,
    shared_queue,
)
from bridge.storage.base import Message, MessageStore, MetaUpdate, StoreUnavailable
from bridge.subscriptions import SubscriptionHandling

if TYPE_CHECKING:
    from bridge.connection import Connection

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
        self.authenticator = make_authenticator(config.password_file, config.allow_anonymous)
        # scrypt is slow on purpose and releases the GIL: a small pool bounds its CPU and memory.
        self._auth_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="auth")
        self._background: set[asyncio.Task[Any]] = set()
        self._housekeeping: asyncio.Task[None] | None = None
        self.connection_count = 0
        self.accepting = True

    # -- start-up and shutdown ------------------------------------------------------------------

    async def start(self) -> None:
        """Open the store, restore persistent sessions and retained messages, publish the wills of
        clients that were connected when the node last stopped without a clean shutdown."""
        await self.store.open()
        for topic, data in self.store.meta(KIND_RETAINED).items():
            self.retained[topic] = decode_message(data)
        offsets = self.store.meta(KIND_OFFSETS)
        for client_id, subs in self.store.meta(KIND_SESSION).items():
            session = Session.restore(client_id, subs, offsets.get(client_id))
            if not session.disconnected_at or client_id in self.store.meta(KIND_ONLINE):
                # Connected when the node stopped (or never recorded): offline from now on.
                session.disconnected_at = time.time()
            self.sessions[client_id] = session
            self._subscribe_tables(session)
        stale = []
        for key, value in self.store.meta(KIND_QOS2_IN).items():
            client_id, _, packet_id = key.rpartition("\x00")
            session = self.sessions.get(client_id)
            if session is None:
                stale.append(key)
            elif self.store.atomic_meta:
                session.inbound_qos2[int(packet_id)] = None
            else:
                # Written before the message was sent: whether that send stored it is settled
                # by asking the store when the client resends the id (if it ever does).
                session.inbound_qos2[int(packet_id)] = Unsettled.decode(value)
        if stale:
            await self.store.put_meta([MetaUpdate(KIND_QOS2_IN, k, None) for k in stale])
        orphans = dict(self.store.meta(KIND_ONLINE))
        for client_id, data in orphans.items():
            will = json.loads(data).get("will")
            if will is not None:
                log.info("publishing the will of %s, connected when the node stopped", client_id)
                await self._publish_will(client_id, decode_message(will.encode()))
            else:
                await self.store.put_meta([MetaUpdate(KIND_ONLINE, client_id, None)])
        log.info(
            "node %s ready: %d persistent sessions, %d retained messages restored",
            self.node_id,
            len(self.sessions),
            len(self.retained),
        )
        self._housekeeping = asyncio.get_running_loop().create_task(self.housekeeper.run())

    async def stop(self) -> None:
        """Flush offsets and close the store (connections are closed by the server first)."""
        if self._housekeeping is not None:
            self._housekeeping.cancel()
        for task in list(self._background):
            task.cancel()
        for delivery in list(self.deliveries.values()):
            delivery.stop()
        await self.housekeeper.flush_offsets(durable=True)
        await self.store.close()
        self._auth_pool.shutdown(wait=False)

    def _subscribe_tables(self, session: Session) -> None:
        for topic_filter, qos in session.subscriptions.items():
            self.trie.subscribe(topic_filter, session.client_id, qos)
        for share_filter, qos in session.shared.items():
            parsed = parse_shared(share_filter)
            if parsed is not None:
                group, inner = parsed
                self.shared.subscribe(share_filter, group, inner, session.client_id, qos)

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
        if not isinstance(self.authenticator, AllowAll):
            result = await asyncio.get_running_loop().run_in_executor(
                self._auth_pool,
                self.authenticator.authenticate,
                client_id,
                packet.username,
                packet.password,
            )
            if conn.closed:
                return None
            if result is not AuthResult.ACCEPTED:
                self._refuse(
                    conn,
                    result.connack_code,
                    f"authentication failed ({result.name}) for user {packet.username!r}",
                )
                return None
        conn.client_id = client_id

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
            await self.store.put_meta(updates, durable=True)
        except StoreUnavailable as exc:
            log.error("client %s: store unavailable during CONNECT: %s", client_id, exc)
            self._refuse(conn, ConnackCode.SERVER_UNAVAILABLE, "store unavailable")
            self.disconnected(conn, graceful=True)
            return None
        if conn.closed or conn.session is not session:
            return None
        conn.send(codec.encode(Connack(ConnackCode.ACCEPTED, session_present)))
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
        return session

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
        conn.detached = True
        client_id = session.client_id
        delivery = self.deliveries.get(client_id)
        if delivery is not None and delivery.conn is conn:
            delivery.stop()
            del self.deliveries[client_id]
        if self.connections.get(client_id) is not conn:
            return  # taken over: the new connection owns the session now
        del self.connections[client_id]
        session.connected = False
        session.disconnected_at = time.time()
        will = conn.will
        if not graceful and will is not None:
            self.spawn(self._publish_will(client_id, self._will_message(client_id, will)))
        else:
            self.spawn(self.store.put_meta([MetaUpdate(KIND_ONLINE, client_id, None)]))
        self._redispatch_shared(session)
        if not session.persistent:
            self.discard_session(session, [])  # nothing of a clean session is stored
        else:
            self.housekeeper.mark_offsets_dirty(session)

    async def _publish_will(self, client_id: str, message: Message) -> None:
        """Publish a will once: the online record is deleted in the same atomic append."""
        self.metrics.inc("wills_published")
        log.info("client %s: publishing will to %r", client_id, message.topic)
        meta = [MetaUpdate(KIND_ONLINE, client_id, None)]
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
            self.trie.unsubscribe(topic_filter, client_id)
        for share_filter in session.shared:
            self.shared.unsubscribe(share_filter, client_id)
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
        self._deliver_qos0(message)

    def _deliver_qos0(self, message: Message) -> None:
        subscribers = self.trie.match_subscribers(message.topic)
        data = codec.encode_publish(message.topic, message.payload, 0)
        connections = self.connections
        for client_id in subscribers:
            conn = connections.get(client_id)
            if conn is not None:
                conn.send_droppable(data)
        if self.shared:
            for _share_filter, group in self.shared.match(message.topic):
                member = group.pick(connections.__contains__)
                if member is not None:
                    connections[member].send_droppable(data)
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

    async def route(self, message: Message, meta: Iterable[MetaUpdate] = ()) -> int:
        """Route and store a message (wills, system messages); returns its seq once durable."""
        outcome: asyncio.Future[tuple[int | None, BaseException | None]]
        outcome = asyncio.get_running_loop().create_future()
        self.route_submit(message, tuple(meta), lambda seq, err: outcome.set_result((seq, err)))
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
                self._wake_readers(woken)
            on_durable(seq, error)

        self.store.submit(message, queues, meta=meta, callback=durable)

    def queues_for(self, message: Message) -> tuple[list[str], list[str]]:
        """The queues a message must be stored on (one per matching filter, a picked member of
        each matching shared group) and the clients reading them. QoS 0 messages (and shared
        members granted QoS 0) are delivered directly instead."""
        queues: list[str] = []
        woken: list[str] = []
        if message.qos == 0:
            self._deliver_qos0(message)
        else:
            for topic_filter, subscribers in self.trie.match(message.topic):
                queues.append(filter_queue(topic_filter))
                woken.extend(subscribers)
            if self.shared:
                for share_filter, group in self.shared.match(message.topic):
                    member = group.pick(self.connections.__contains__) or group.pick()
                    if member is None:
                        continue
                    if min(group.members.get(member, 0), message.qos) == 0:
                        conn = self.connections.get(member)
                        if conn is not None:
                            conn.send_droppable(
                                codec.encode_publish(message.topic, message.payload, 0)
                            )
                        continue
                    queues.append(shared_queue(share_filter, member))
                    woken.append(member)
        return queues, woken

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
            return [queue.rpartition("\x00")[2]]
        return []

    def queues_grew(self, ends: dict[str, int]) -> None:
        """Queues are known to hold messages up to these ends (notify): wake their readers."""
        woken: list[str] = []
        for queue, end in ends.items():
            self.store.note_end(queue, end)
            woken.extend(self.readers_of(queue))
        if woken:
            self._wake_readers(list(dict.fromkeys(woken)))

    def _wake_readers(self, client_ids: list[str]) -> None:
        deliveries = self.deliveries
        for client_id in client_ids:
            delivery = deliveries.get(client_id)
            if delivery is not None:
                delivery.wake()
            else:
                self.housekeeper.check_backlog(client_id)

    def _retain_updates(self, message: Message) -> list[MetaUpdate]:
        """Set or clear the retained message of a topic (empty payload clears, MQTT-3.3.1-10)."""
        if message.payload:
            self.retained[message.topic] = message
            return [MetaUpdate(KIND_RETAINED, message.topic, encode_message(message))]
        self.retained.pop(message.topic, None)
        return [MetaUpdate(KIND_RETAINED, message.topic, None)]

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


def _log_unstored(_seq: int | None, error: BaseException | None) -> None:
    if error is not None:
        log.warning("QoS 0 message not stored: %s", error)
