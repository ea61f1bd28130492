"""SUBSCRIBE and UNSUBSCRIBE, retained messages on subscribe, and shared-subscription hand-over.

`Subscriptions` owns every change to the node's subscription tables (the trie and the shared
groups) for the sessions held here, and tells the cluster about them; the cluster itself adds
and removes the peers' interest.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from bridge.access.acl import SUBSCRIBE
from bridge.mqtt import codec
from bridge.mqtt.errors import MQTTProtocolError
from bridge.mqtt.packets import SUBACK_FAILURE, Suback, Subscribe, Unsuback, Unsubscribe
from bridge.mqtt.topics import parse_shared, validate_topic_filter
from bridge.node.positions import parts_read, start_reading, stop_reading
from bridge.node.retained import RetainedMessages
from bridge.node.roles import ClientLink, Spawner, Waker
from bridge.node.stamp import Stamper
from bridge.operations.metrics import Metrics
from bridge.router.queues import client_queue, filter_queue, shared_queue
from bridge.router.shared import SharedGroup, SharedSubscriptions
from bridge.router.trie import SubscriptionTrie
from bridge.session import Session
from bridge.state import KIND_OFFSETS, KIND_SESSION, RETAINED_DELIVERY
from bridge.storage.base import Message, MessageStore, MetaUpdate, StoreUnavailable

if TYPE_CHECKING:
    from bridge.access.acl import Acl
    from bridge.cluster.cluster import Cluster

log = logging.getLogger("bridge.node")


class Subscriptions:
    """What SUBSCRIBE and UNSUBSCRIBE do to a node's tables and sessions."""

    def __init__(
        self,
        *,
        trie: SubscriptionTrie,
        shared: SharedSubscriptions,
        store: MessageStore,
        metrics: Metrics,
        acl: Acl,
        retained: RetainedMessages,
        stamper: Stamper,
        waker: Waker,
        offsets_moved: Callable[[Session], None],
        topic_fault: Callable[[str], str | None],
        spawn: Spawner,
    ) -> None:
        self.trie = trie
        self.shared = shared
        self.store = store
        self.metrics = metrics
        self.acl = acl
        self.retained = retained
        self.stamper = stamper
        self.waker = waker
        self.offsets_moved = offsets_moved
        self.topic_fault = topic_fault
        self.spawn = spawn
        self.cluster: Cluster | None = None

    # -- the tables ---------------------------------------------------------------------------

    def add_subscription(self, client_id: str, topic_filter: str, qos: int) -> None:
        """A local session subscribes (the cluster advertises a filter's first subscriber)."""
        if self.trie.subscribe(topic_filter, client_id, qos) and self.cluster is not None:
            self.cluster.local_filter_added(topic_filter)

    def remove_subscription(self, client_id: str, topic_filter: str) -> None:
        """A local session unsubscribes (the cluster withdraws a filter's last subscriber)."""
        if self.trie.unsubscribe(topic_filter, client_id) and self.cluster is not None:
            self.cluster.local_filter_removed(topic_filter)

    def add_shared(
        self, client_id: str, share_filter: str, parsed: tuple[str, str], qos: int
    ) -> None:
        """A local session joins a shared group (`parsed`: group, inner filter); peers hear."""
        group, inner = parsed
        self.shared.subscribe(share_filter, group, inner, client_id, qos)
        if self.cluster is not None:
            self.cluster.shared_member_changed(share_filter, client_id, qos)

    def remove_shared(self, client_id: str, share_filter: str) -> None:
        """A local session leaves a shared group; peers hear."""
        if self.shared.unsubscribe(share_filter, client_id) and self.cluster is not None:
            self.cluster.shared_member_removed(share_filter, client_id)

    def enter(self, session: Session) -> None:
        """Put a restored or adopted session's subscriptions into the tables."""
        for topic_filter, qos in session.subscriptions.items():
            self.add_subscription(session.client_id, topic_filter, qos)
        for share_filter, qos in session.shared.items():
            parsed = parse_shared(share_filter)
            if parsed is not None:
                self.add_shared(session.client_id, share_filter, parsed, qos)

    def leave(self, session: Session) -> None:
        """Take a session's subscriptions out of the tables (the session is discarded)."""
        for topic_filter in session.subscriptions:
            self.remove_subscription(session.client_id, topic_filter)
        for share_filter in session.shared:
            self.remove_shared(session.client_id, share_filter)

    # -- SUBSCRIBE / UNSUBSCRIBE ----------------------------------------------------------------

    def subscribe(self, conn: ClientLink, session: Session, packet: Subscribe) -> None:
        """Apply the filters at once (so a PUBLISH that follows is routed by them), then, in the
        background, make them durable for a persistent session, answer SUBACK and send the
        matching retained messages."""
        conn.hold()
        self.spawn(self._subscribe(conn, session, packet))

    async def _subscribe(self, conn: ClientLink, session: Session, packet: Subscribe) -> None:
        """Ask the store where each new queue ends (before the filter is routed, so no message
        routed to it is skipped), then register the filters, SUBACK and send retained messages.
        The client's later packets wait meanwhile, so a PUBLISH after SUBSCRIBE sees it."""
        try:
            codes, retained_for = await self._register_filters(session, packet, conn.username)
        finally:
            conn.release()
        await self._finish_subscribe(conn, session, packet.packet_id, codes, retained_for)

    async def _register_filters(
        self, session: Session, packet: Subscribe, username: str | None
    ) -> tuple[list[int], list[tuple[str, int]]]:
        codes: list[int] = []
        retained_for: list[tuple[str, int]] = []
        for sub in packet.subscriptions:
            topic_filter = sub.topic_filter
            try:
                validate_topic_filter(topic_filter)
                error = self.topic_fault(topic_filter)
                if error:
                    raise MQTTProtocolError("limit", error)
            except MQTTProtocolError as exc:
                codes.append(self._refuse_filter(session, topic_filter, str(exc)))
                continue
            granted = min(sub.qos, 2)
            parsed = parse_shared(topic_filter)
            checked = parsed[1] if parsed is not None else topic_filter
            if not self.acl.allows(SUBSCRIBE, session.client_id, username, checked):
                self.metrics.inc("acl_denied_subscribe")
                codes.append(self._refuse_filter(session, topic_filter, "denied by the ACL"))
                continue
            queue = (
                shared_queue(topic_filter, session.client_id)
                if parsed is not None
                else filter_queue(topic_filter)
            )
            try:
                await start_reading(self.store, session, queue)
            except StoreUnavailable as exc:
                codes.append(
                    self._refuse_filter(session, topic_filter, f"store unavailable: {exc}")
                )
                continue
            if parsed is not None:
                session.shared[topic_filter] = granted
                self.add_shared(session.client_id, topic_filter, parsed, granted)
            else:
                self.add_subscription(session.client_id, topic_filter, granted)
                session.subscriptions[topic_filter] = granted
                retained_for.append((topic_filter, granted))
            codes.append(granted)
        return codes, retained_for

    def _refuse_filter(self, session: Session, topic_filter: str, reason: str) -> int:
        """Log and count a refused filter; its SUBACK return code."""
        log.warning(
            "client %s: SUBSCRIBE %r refused (0x80): %s", session.client_id, topic_filter, reason
        )
        self.metrics.inc("subscriptions_refused")
        return SUBACK_FAILURE

    async def _finish_subscribe(
        self,
        conn: ClientLink,
        session: Session,
        packet_id: int,
        codes: list[int],
        retained_for: list[tuple[str, int]],
    ) -> None:
        if session.persistent:
            await self.persist(session)
        if conn.closed:
            return
        conn.send(codec.encode(Suback(packet_id, codes)))
        await self._send_retained(conn, session, retained_for)

    async def _send_retained(
        self, conn: ClientLink, session: Session, filters: list[tuple[str, int]]
    ) -> None:
        """Retained messages for new subscriptions, with RETAIN=1 (MQTT-3.3.1-6, -8)."""
        if not filters or not self.retained:
            return
        queued = False
        for message, best in self.retained.matching(filters):
            qos = min(best, message.qos)
            if qos == 0:
                conn.send_message(
                    codec.encode_publish(message.topic, message.payload, 0, retain=True),
                    len(message.payload),
                )
                self.metrics.counters["messages_out_qos0"] += 1
                continue
            copy = Message(
                topic=message.topic,
                payload=message.payload,
                qos=message.qos,
                retain=True,
                publisher=message.publisher,
                key=self.stamper.next_key(),
                timestamp_ms=message.timestamp_ms,
                node=self.stamper.node_id,
                properties={RETAINED_DELIVERY: str(qos)},
            )
            await self.store.submit(copy, [client_queue(session.client_id)])
            queued = True
        if queued:
            self.waker.wake_readers([session.client_id], [client_queue(session.client_id)])

    def unsubscribe(self, conn: ClientLink, session: Session, packet: Unsubscribe) -> None:
        """Remove the filters at once; make it durable for a persistent session, then UNSUBACK."""
        for topic_filter in packet.topic_filters:
            if topic_filter in session.subscriptions:
                del session.subscriptions[topic_filter]
                self.remove_subscription(session.client_id, topic_filter)
                stop_reading(self.store, session, filter_queue(topic_filter))
            elif topic_filter in session.shared:
                del session.shared[topic_filter]
                self.remove_shared(session.client_id, topic_filter)
                stop_reading(self.store, session, shared_queue(topic_filter, session.client_id))
        self.spawn(self._finish_unsubscribe(conn, session, packet.packet_id))

    async def _finish_unsubscribe(self, conn: ClientLink, session: Session, packet_id: int) -> None:
        if session.persistent:
            await self.persist(session)
        if not conn.closed:
            conn.send(codec.encode(Unsuback(packet_id)))

    async def persist(self, session: Session) -> None:
        """A persistent session's filters and their start offsets, durable before SUBACK or
        UNSUBACK goes out, so a crash after the ack keeps (or forgets) the subscription."""
        await self.store.put_meta(
            [
                MetaUpdate(KIND_SESSION, session.client_id, session.encode_subscriptions()),
                MetaUpdate(KIND_OFFSETS, session.client_id, session.encode_offsets()),
            ],
            durable=True,
        )

    # -- shared subscriptions --------------------------------------------------------------------

    def redispatch_shared(self, session: Session) -> None:
        """A member left: its unacknowledged and unread shared messages go to other members."""
        if not session.shared:
            return
        self.spawn(self._redispatch_shared(session))

    async def _redispatch_shared(self, session: Session) -> None:
        for share_filter in list(session.shared):
            group = self.shared.group(share_filter)
            if group is None:
                continue
            queue = shared_queue(share_filter, session.client_id)
            for part in parts_read(self.store, session, queue):
                if not await self._hand_over(session, share_filter, group, part):
                    return

    async def _hand_over(
        self, session: Session, share_filter: str, group: SharedGroup, queue: str
    ) -> bool:
        """Move the unacknowledged and unread messages of one part of a leaving member's queue
        to other members; False if the store cannot be read (they stay queued)."""
        start = session.committed(queue)
        try:
            end = await self.store.queue_end(queue)
        except StoreUnavailable as exc:
            log.error("shared messages of %s stay queued: %s", session.client_id, exc)
            return False
        handed_to = start  # offsets below this now belong to another member
        moved = 0
        nobody_else = False
        while handed_to < end and not nobody_else:
            result = await self.store.read(queue, handed_to, 256)
            if not result.messages:
                break
            for stored in result.messages:
                member = group.pick(lambda m: m != session.client_id and self.waker.reachable(m))
                if member is None:
                    nobody_else = True  # the rest waits for this member
                    break
                target = shared_queue(share_filter, member)
                await self.store.submit(stored.message, [target])
                handed_to = stored.offset + 1
                moved += 1
                self.waker.wake_readers([self.waker.reader_of(member)], [target])
        if handed_to == start:
            return True
        # What was handed over is this member's no more: not in flight, not to be read.
        for packet_id, out in list(session.inflight.items()):
            if out.queue == queue and out.offset < handed_to:
                del session.inflight[packet_id]
        if session.cursors.get(queue, 0) < handed_to:
            session.cursors[queue] = handed_to
        self.offsets_moved(session)
        log.info(
            "client %s left %s: %d unacknowledged messages moved to other members",
            session.client_id,
            share_filter,
            moved,
        )
        return True
