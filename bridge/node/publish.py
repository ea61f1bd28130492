"""The publish path: accept a message, have the router plan where it goes, carry the plan out.

QoS 0 messages are sent at once to connected subscribers (and forwarded to peers with
subscribers), stored unawaited if `store_qos0`. QoS 1/2 messages are appended to the queues the
plan names, with any meta records (retained message, QoS 2 marker) in the same append; once the
store says they are durable the readers are woken and the publisher is acknowledged. Messages
arriving from peers and from notify come in here too. How a PUBLISH travels: docs/design.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Final

from bridge.access.reads import checks_reads
from bridge.counters import LatencyHistogram, Metrics
from bridge.mqtt import codec
from bridge.mqtt.delayed import DelayedTopic
from bridge.mqtt.packets import Publish
from bridge.node.congestion import Congestion
from bridge.node.copies import live_copy, shared_v5_publish
from bridge.node.delayed import DelayedPublishes, delayed_quota
from bridge.node.retained import RetainedMessages
from bridge.node.roles import Spawner
from bridge.node.stamp import Stamper
from bridge.node.wakes import Wakes
from bridge.router.plan import ConnectionTable, DirectRoutes, RoutePlan, plan_route, readers_of
from bridge.router.queues import peer_subscriber
from bridge.router.shared import SharedSubscriptions
from bridge.router.trie import SubscriptionTrie
from bridge.session import Session
from bridge.state import KIND_QOS2_IN, Unsettled
from bridge.storage.base import (
    DurableCallback,
    Message,
    MessageStore,
    MetaUpdate,
    StoreUnavailable,
)
from bridge.storage.metadata import from_publish

if TYPE_CHECKING:
    from bridge.access.acl import Acl
    from bridge.cluster.cluster import Cluster
    from bridge.node.delivery import Delivery
    from bridge.node.roles import ClientLink
    from bridge.settings import Config

log = logging.getLogger("bridge.node")


class Publisher:
    """Routes every message this node accepts, and wakes the readers of what it stored."""

    def __init__(
        self,
        *,
        config: Config,
        store: MessageStore,
        metrics: Metrics,
        trie: SubscriptionTrie,
        shared: SharedSubscriptions,
        sessions: Mapping[str, Session],
        connections: ConnectionTable[ClientLink],
        deliveries: Mapping[str, Delivery],
        retained: RetainedMessages,
        stamper: Stamper,
        spawn: Spawner,
        offline_grew: Callable[[str], None],
        congestion: Congestion,
        acl: Acl | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.metrics = metrics
        self.trie = trie
        self.shared = shared
        self.sessions = sessions
        self.connections = connections
        self.deliveries = deliveries
        self.retained = retained
        self.stamper = stamper
        self.spawn = spawn
        self.offline_grew = offline_grew
        """Called for a woken reader with no delivery here (an offline session)."""
        self.congestion = congestion
        self.early_reads = store.traits.early_reads and config.deliver_before_commit
        """QoS 1 messages may be read before their commit (`bridge.node.early_reads`)."""
        self.acl = acl
        """The ACL whose deny rules may keep a message from a broader subscription."""
        self.cluster: Cluster | None = None
        self.wakes = Wakes(
            store=store,
            trie=trie,
            sessions=sessions,
            deliveries=deliveries,
            reader_of=self.reader_of,
            offline_grew=offline_grew,
            spawn=spawn,
        )
        """Who is told that queues hold more messages: readers here, peers, offline sessions."""
        self.reachable: Callable[[str], bool] = connections.__contains__
        """Whether a shared-subscription member can take a message now."""
        self.direct_routes = DirectRoutes()
        self.delayed = DelayedPublishes(
            store=store,
            metrics=metrics,
            retained=retained,
            route_submit=self.route_submit,
            quota=delayed_quota(config),
        )
        """Delayed publishes (`$delayed/<seconds>/<topic>`): stored now, routed when due."""

    def join(self, cluster: Cluster) -> None:
        """Route across `cluster`'s peers from now on."""
        self.cluster = cluster
        self.wakes.cluster = cluster
        self.reachable = cluster.is_reachable

    # -- planning and carrying out ----------------------------------------------------------------

    def reader_of(self, client_id: str) -> str:
        """The client itself if its session is here, else the peer holding it (if known)."""
        if self.cluster is None or client_id in self.sessions:
            return client_id
        peer = self.cluster.node_of(client_id)
        return peer_subscriber(peer) if peer else client_id

    def readers_now(self, queues: list[str], planned: list[str]) -> list[str]:
        """The readers of `queues` now, `planned` first. A subscriber (here, or a peer's
        announced filter) added while a message was being stored may read it from a queue the
        plan named (its start was read from the store before the message got there), but the
        plan's readers do not name it, and it would otherwise wait for the next message on
        the queue."""
        found = list(planned)
        for queue in queues:
            for reader in readers_of(queue, self.trie, self.reader_of):
                if reader not in found:
                    found.append(reader)
        return found

    def plan(self, message: Message) -> RoutePlan:
        """Where `message` goes (advances the round-robin of matching shared groups). On a node
        without shared groups, the plan remembered for its topic (shared: never change it)."""
        if not self.shared:
            if message.qos:
                return self.direct_routes.queued_plan(message.topic, self.trie)
            return self.direct_routes.plan(message.topic, self.trie, self.connections)
        return plan_route(
            message.topic,
            message.qos,
            self.trie,
            self.shared,
            self.connections,
            self.reachable,
            self.reader_of,
        )

    def _send_now(self, message: Message, plan: RoutePlan) -> None:
        """The plan's QoS 0 part: direct sends, forwards to peers, shared members on peers."""
        if plan.direct:
            self._send_direct(message, plan.direct)
        if plan.peers or plan.handed:
            cluster = self.cluster
            if cluster is not None:
                if plan.peers:
                    cluster.forward(plan.peers, message)
                for member in plan.handed:
                    cluster.deliver(member, message)
        if plan.unserved:
            self.metrics.inc("dropped_no_shared_member", plan.unserved)

    def _send_direct(self, message: Message, client_ids: list[str]) -> None:
        """Send a QoS 0 PUBLISH to these connected clients (each may drop it if it is too
        slow): encoded once for every 3.1.1 client, per client for v5 ones (their properties,
        Subscription Identifiers, aliases, options); count what was sent once per fan-out."""
        data = data5 = None
        payload = message.payload
        size = len(payload)
        publisher = message.publisher
        connections = self.connections
        sent = 0
        acl = self.acl
        for client_id in client_ids:
            conn = connections[client_id]
            session = conn.session
            if checks_reads(acl, session) and not conn.screen_delivery(message.topic):
                continue
            shared = conn.shared_encoding
            if shared == 4:
                if data is None:
                    data = codec.encode_publish(message.topic, payload, 0)
                sent += conn.send_droppable(data, size, publisher)
                continue
            options = session is not None and session.options
            if shared == 5 and not options:
                if data5 is None:
                    data5 = (
                        shared_v5_publish(message)
                        if message.properties
                        else codec.encode_publish5(message.topic, payload, 0, False, False, None)
                    )
                if len(data5) <= conn.max_packet_out:
                    sent += conn.send_droppable(data5, size, publisher)
                else:
                    self.metrics.inc("dropped_too_large_for_client")
                continue
            retain = False
            sub_ids: tuple[int, ...] = ()
            if options:
                assert session is not None
                wanted, retain, sub_ids = live_copy(
                    session, message.topic, message.publisher, message.retain
                )
                if not wanted:
                    continue
            own = conn.encode_message(message, 0, retain, sub_ids=sub_ids)
            if own is not None:
                sent += conn.send_droppable(own, size, publisher)
        if sent:
            metrics = self.metrics
            metrics.messages_out_qos0 += sent
            metrics.packets_out[3] += sent

    def deliver_qos0(self, message: Message) -> None:
        """Send a QoS 0 message to its online subscribers, here and on peers (not stored)."""
        self._send_now(message, self.plan(message))

    # -- from clients ------------------------------------------------------------------------------

    def publish_qos0(
        self, session: Session, packet: Publish, delayed: DelayedTopic | None = None
    ) -> None:
        """A QoS 0 PUBLISH from a client: deliver it to online subscribers at once, and store it
        without waiting for the store (if `store_qos0` is set, or to keep it as retained). A
        `delayed` one (its topic read by the listener) is stored, not awaited, and delivered
        when it is due."""
        if delayed is not None:
            self.publish(session, packet, _log_failure, delayed)
            return
        message = self.stamper.stamp(
            packet.topic, packet.payload, 0, packet.retain, session.client_id
        )
        if packet.properties:
            message.properties = from_publish(packet.properties)
        self.metrics.messages_in_qos0 += 1
        if packet.retain:
            self._store_retained_qos0(message)
        elif self.config.store_qos0:
            try:
                self.store.append_unqueued(message)
            except StoreUnavailable as exc:
                self.metrics.inc("qos0_not_stored")
                log.debug("QoS 0 message not stored: %s", exc)
        self._send_now(message, self.plan(message))

    def _store_retained_qos0(self, message: Message) -> None:
        """Store a retained QoS 0 message without waiting for it, and keep it as its topic's
        retained message once it is durable.

        A method of its own rather than a closure in `publish_qos0`: compiled, a nested function
        makes its environment on every call of the function that holds it, so every QoS 0
        message would pay for what only retained ones use."""
        retained = self.retained

        def stored(_seq: int | None, error: BaseException | None) -> None:
            if error is None:
                retained.apply(message)
            else:
                log.warning("QoS 0 message not stored: %s", error)

        self.store.submit(message, (), meta=retained.updates(message), callback=stored)

    def publish(
        self,
        session: Session,
        packet: Publish,
        on_durable: DurableCallback,
        delayed: DelayedTopic | None = None,
        key: str = "",
    ) -> None:
        """A QoS 1/2 PUBLISH from a client (or, with `delayed`, the form of its `$delayed/...`
        topic, one of any QoS: stored to be routed when due, `bridge.node.delayed`).
        `on_durable(seq, None)` is called once the message is durable (then the caller
        acknowledges) or `on_durable(None, error)` if it could not be stored (then it must
        not). For QoS 2, `session.inbound_qos2[packet id]` holds a future that completes (with
        the error or None) at the same time, so a resent PUBLISH with that id is answered
        without being stored again. `key`: the message's key when it is a resend that may have
        been stored before under it (`bridge.node.qos2_in`).

        Synchronous up to the store's submit, so calls made in packet order keep that order.
        """
        qos = packet.qos
        message = self.stamper.stamp(
            packet.topic if delayed is None else delayed.topic,
            packet.payload,
            qos,
            packet.retain,
            session.client_id,
        )
        if key:
            message.key = key
        if packet.properties:
            message.properties = from_publish(packet.properties)
        self.metrics.received(qos)
        started = _clock()
        meta: list[MetaUpdate] | tuple[()] = ()
        if delayed is None and packet.retain:  # a delayed one's RETAIN acts once it is routed
            meta = self.retained.updates(message)
        if qos == 2 and packet.packet_id is not None:
            meta, on_durable = self._hold_qos2(session, packet.packet_id, message, meta, on_durable)
        if delayed is None:
            self.route_submit(message, meta, on_durable, started)
        else:
            on_durable = _timed(on_durable, self.metrics.store_latency, started)
            self.delayed.submit(message, packet.topic, delayed.seconds, meta, on_durable)

    def _hold_qos2(
        self,
        session: Session,
        packet_id: int,
        message: Message,
        meta: Sequence[MetaUpdate],
        on_durable: DurableCallback,
    ) -> tuple[list[MetaUpdate], DurableCallback]:
        """Hold a QoS 2 PUBLISH's id in the session until the store answers, so that a resend
        is not stored twice (a persistent session's record of it goes in `meta`). Returns the
        meta records and the callback that settles the id, then calls `on_durable`. A method
        of its own, so that a QoS 1 message makes no closure."""
        unsettled = Unsettled(message.topic, message.key)
        meta = list(meta)
        if session.persistent:
            meta.append(
                MetaUpdate(KIND_QOS2_IN, f"{session.client_id}\x00{packet_id}", unsettled.encode())
            )
        stored: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
        session.hold_qos2_in(packet_id, stored)

        def done(seq: int | None, error: BaseException | None) -> None:
            if not stored.done():
                stored.set_result(error)
            if error is not None and session.inbound_qos2.get(packet_id) is stored:
                if not self.store.traits.atomic_meta and getattr(error, "maybe_stored", False):
                    # The send may have stored it: a resend must ask the store first.
                    session.hold_qos2_in(packet_id, unsettled)
                else:
                    # Not stored: a resend of this id must be stored, not merely acknowledged.
                    session.drop_qos2_in(packet_id)
            on_durable(seq, error)

        return meta, done

    # -- from inside the broker --------------------------------------------------------------------

    async def publish_internal(
        self, topic: str, payload: bytes, qos: int, retain: bool, publisher: str
    ) -> Message:
        """Publish a message that comes from inside the broker (the admin API, `$SYS` statistics,
        client events) as if a client had: routed to every matching subscription, kept as the
        retained message if `retain`. Returns once it is durable (QoS 0: stored, not queued);
        raises StoreUnavailable if it could not be stored."""
        message = self.stamper.stamp(topic, payload, qos, retain, publisher)
        meta = self.retained.updates(message) if retain else []
        await self.route(message, meta)
        return message

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
        self,
        message: Message,
        meta: Sequence[MetaUpdate],
        on_durable: DurableCallback,
        started: float = 0.0,
    ) -> None:
        """Store a message on the queues of every matching subscription; once it is durable,
        keep it as its topic's retained message if it is flagged so (its record is in `meta`),
        wake the readers, then call `on_durable`. QoS 0 messages (wills) are delivered directly
        and stored without queues. `started`: the `_clock()` (`time.perf_counter()`) the
        message came in at, to record how long the store took (0: not recorded)."""
        plan = self.plan(message)
        self._send_now(message, plan)
        readers = plan.readers
        store = self.store
        early = bool(readers) and message.qos < 2 and self.early_reads
        added = self.trie.added
        durable = _Durable(self, message, plan.queues, readers, early, on_durable, started, added)
        readable = store.submit(message, plan.queues, meta=meta, callback=durable, early=early)
        if early:
            if readable:  # read while its commit runs (bridge.node.early_reads)
                deliveries = self.deliveries
                for reader in readers:
                    delivery = deliveries.get(reader)
                    if delivery is not None:
                        delivery.wake()
            else:
                durable.early = False

    # -- from peers and from notify -----------------------------------------------------------

    def deliver_forwarded(self, message: Message) -> None:
        """A QoS 0 message a peer forwarded: to this node's own (non-shared) subscribers (the
        direct part of its plan; never forwarded again)."""
        direct = self.direct_routes.plan(message.topic, self.trie, self.connections).direct
        if direct:
            self._send_direct(message, direct)

    def deliver_to(self, client_id: str, message: Message) -> None:
        """A QoS 0 message a peer picked this node's client for (shared subscription)."""
        if client_id in self.connections:
            self._send_direct(message, [client_id])
        else:
            self.metrics.inc("dropped_no_shared_member")

    def route_backend_message(self, message: Message) -> list[str]:
        """A message a backend produced straight into the store (notify found it): keep it as
        the topic's retained message if flagged so, and return the queues it must reach."""
        if message.retain:
            self.spawn(self._keep_retained(message))
        plan = self.plan(message)
        self._send_now(message, plan)
        return plan.queues

    async def _keep_retained(self, message: Message) -> None:
        try:
            await self.store.put_meta(self.retained.updates(message))
        except StoreUnavailable as exc:
            log.warning(
                "retained message of %r not kept, store unavailable: %s", message.topic, exc
            )
            return
        self.retained.apply(message)

    def wake_readers(self, reader_ids: list[str], queues: list[str]) -> None:
        """Wake these readers of `queues` (the `Waker` role of subscriptions)."""
        self.wakes.wake_readers(reader_ids, queues)


_clock: Final = time.perf_counter
"""Read once: compiled, `time.perf_counter()` looks the name up in the module every call."""


def _log_failure(_seq: int | None, error: BaseException | None) -> None:
    """The outcome of a QoS 0 store nobody waits for: only a failure is worth a line."""
    if error is not None:
        log.warning("QoS 0 message not stored: %s", error)


def _timed(
    on_durable: DurableCallback, histogram: LatencyHistogram, started: float
) -> DurableCallback:
    """`on_durable` that first records in `histogram` how long the store took since `started`
    (a `_clock()`; successful stores only)."""

    def timed(seq: int | None, error: BaseException | None) -> None:
        if error is None:
            histogram.observe(_clock() - started)
        on_durable(seq, error)

    return timed


class _Durable:
    """What `Publisher.route_submit` does once a message is durable (or could not be stored):
    one object per message, which the store calls (a closure would be two, and `_timed` a
    third)."""

    def __init__(
        self,
        publisher: Publisher,
        message: Message,
        queues: list[str],
        readers: list[str],
        early: bool,
        on_durable: DurableCallback,
        started: float,
        added: int,
    ) -> None:
        self.publisher = publisher
        self.message = message
        self.queues = queues
        self.readers = readers
        self.early = early
        """The readers were woken when it was stored, to read it before its commit
        (`bridge.node.early_reads`): once it is durable, those connected here are not woken
        again (peers and offline sessions still hear of it)."""
        self.on_durable = on_durable
        self.started = started
        self.added = added
        """The trie's count of subscriptions added when the route was planned."""

    def __call__(self, seq: int | None, error: BaseException | None) -> None:
        if error is None:
            publisher = self.publisher
            message = self.message
            if message.retain:
                publisher.retained.apply(message)
            readers = self.readers
            if publisher.trie.added != self.added:
                readers = publisher.readers_now(self.queues, readers)
            if readers:
                publisher.wakes.wake_readers(readers, self.queues, local=not self.early)
                # Before the publisher is acknowledged: a lagging reader holds that ack.
                commit_pass = publisher.store.commit_pass
                publisher.congestion.stored(message.publisher, self.queues, readers, commit_pass)
            if self.started:
                publisher.metrics.store_latency.observe(_clock() - self.started)
        self.on_durable(seq, error)
