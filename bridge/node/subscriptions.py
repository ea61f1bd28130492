"""SUBSCRIBE and UNSUBSCRIBE, retained messages on subscribe, and shared-subscription hand-over.

`Subscriptions` owns every change to the node's subscription tables (the trie and the shared
groups) for the sessions held here, and tells the cluster about them; the cluster itself adds
and removes the peers' interest.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from bridge.counters import Metrics
from bridge.logtext import client_text
from bridge.mqtt import codec
from bridge.mqtt.errors import MQTTProtocolError
from bridge.mqtt.packets import SUBACK_FAILURE, Suback, Subscribe, Unsuback, Unsubscribe
from bridge.mqtt.properties import PropertyId
from bridge.mqtt.reasons import ReasonCode
from bridge.mqtt.topics import parse_shared, topic_matches, validate_topic_filter
from bridge.node.positions import Ends, learn_ends, parts_read, start_reading_at, stop_reading
from bridge.node.quotas import subscription_fault
from bridge.node.retained import RetainedMessages
from bridge.node.retained_copies import RetainedCopies
from bridge.node.roles import ClientLink, Spawner, Waker
from bridge.node.stamp import Stamper
from bridge.router.queues import client_queue, filter_queue, shared_queue
from bridge.router.shared import SharedGroup, SharedSubscriptions
from bridge.router.trie import SubscriptionTrie
from bridge.session import Session, SubOptions
from bridge.state import KIND_OFFSETS, KIND_SESSION, RETAINED_DELIVERY
from bridge.storage.base import Message, MessageStore, MetaUpdate, StoreUnavailable
from bridge.storage.metadata import SUBSCRIPTION_IDS, expired

if TYPE_CHECKING:
    from bridge.access.acl import Acl
    from bridge.cluster.cluster import Cluster

log = logging.getLogger("bridge.node")

_NO_OPTIONS = SubOptions()


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
        max_subscriptions: int = 0,
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
        self.max_subscriptions = max_subscriptions
        self.retained_copies = RetainedCopies()
        """Retained messages queued for a client by a SUBSCRIBE and not yet sent to it."""
        """Filters one session may hold (`max_subscriptions_per_client`; 0: no limit)."""
        self.cluster: Cluster | None = None

    # -- the tables ---------------------------------------------------------------------------

    def add_subscription(self, client_id: str, topic_filter: str, qos: int) -> bool:
        """A local session subscribes (the cluster advertises a filter's first subscriber);
        True if the peers are told of new interest."""
        if self.trie.subscribe(topic_filter, client_id, qos) and self.cluster is not None:
            return self.cluster.local_filter_added(topic_filter)
        return False

    def remove_subscription(self, client_id: str, topic_filter: str) -> None:
        """A local session unsubscribes (the cluster withdraws a filter's last subscriber)."""
        if self.trie.unsubscribe(topic_filter, client_id) and self.cluster is not None:
            self.cluster.local_filter_removed(topic_filter)

    def add_shared(
        self, client_id: str, share_filter: str, parsed: tuple[str, str], qos: int
    ) -> bool:
        """A local session joins a shared group (`parsed`: group, inner filter); peers hear
        (True: there is a cluster to tell)."""
        group, inner = parsed
        self.shared.subscribe(share_filter, group, inner, client_id, qos)
        if self.cluster is None:
            return False
        self.cluster.shared_member_changed(share_filter, client_id, qos)
        return True

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
        self.retained_copies.forget(session.client_id)

    # -- SUBSCRIBE / UNSUBSCRIBE ----------------------------------------------------------------

    def subscribe(self, conn: ClientLink, session: Session, packet: Subscribe) -> None:
        """Register the filters at once where the store knows its queue ends itself (so a
        PUBLISH that arrives after this SUBSCRIBE, from any client, is routed by them), else as
        soon as the ends are learned; then, in the background, make them durable for a
        persistent session, answer SUBACK (once the peers confirmed a new filter, the client's
        later packets waiting until then: `bridge.cluster.confirm`) and send the matching
        retained messages."""
        v5 = conn.level >= 5  # (No Local on a shared filter is refused by the codec: 0x82)
        if self.store.traits.local_ends:
            codes, retained_for, announced = self._register_filters(
                session, packet, conn.username, v5, self.store.end_offset
            )
            confirmed = self._peers_confirm(announced)
            if confirmed is None:
                finish = self._finish_subscribe(
                    conn, session, packet.packet_id, codes, retained_for
                )
            else:
                conn.hold()
                finish = self._confirmed_subscribe(
                    conn, session, packet.packet_id, codes, retained_for, confirmed
                )
            self.spawn(finish)
            return
        conn.hold()
        self.spawn(self._subscribe(conn, session, packet, v5))

    def _peers_confirm(self, announced: bool) -> asyncio.Future[None] | None:
        """Until the peers confirmed the interest a SUBSCRIBE announced (None: nothing to wait
        for: nothing new announced, no peer linked, a single node)."""
        if not announced or self.cluster is None:
            return None
        return self.cluster.confirm_interest()

    async def _confirmed_subscribe(
        self,
        conn: ClientLink,
        session: Session,
        packet_id: int,
        codes: list[int],
        retained_for: list[tuple[str, int, int]],
        confirmed: asyncio.Future[None],
    ) -> None:
        """SUBACK once the peers know the new filters. The client's later packets wait
        meanwhile, so none of their answers overtakes the SUBACK."""
        try:
            await confirmed
        finally:
            conn.release()
        await self._finish_subscribe(conn, session, packet_id, codes, retained_for)

    async def _subscribe(
        self, conn: ClientLink, session: Session, packet: Subscribe, v5: bool
    ) -> None:
        """Ask the store where each new queue ends (before the filter is routed, so no message
        routed to it is skipped), then register the filters, SUBACK and send retained messages.
        The client's later packets wait meanwhile, so a PUBLISH after SUBSCRIBE sees it."""
        try:
            queues = [
                _queue_of(sub.topic_filter, session.client_id) for sub in packet.subscriptions
            ]
            ends = await learn_ends(self.store, session, [q for q in queues if q])
            codes, retained_for, announced = self._register_filters(
                session, packet, conn.username, v5, ends
            )
            confirmed = self._peers_confirm(announced)
            if confirmed is not None:
                await confirmed  # SUBACK once the peers know the new filters
        finally:
            conn.release()
        await self._finish_subscribe(conn, session, packet.packet_id, codes, retained_for)

    def _register_filters(
        self, session: Session, packet: Subscribe, username: str | None, v5: bool, ends: Ends
    ) -> tuple[list[int], list[tuple[str, int, int]], bool]:
        """Each filter's SUBACK code, the filters to send retained messages for, and whether
        the peers were told of new interest."""
        codes: list[int] = []
        announced = False
        retained_for: list[tuple[str, int, int]] = []
        ids = packet.properties.get(PropertyId.SUBSCRIPTION_IDENTIFIER)
        identifier = ids[0] if ids else 0
        for sub in packet.subscriptions:
            topic_filter = sub.topic_filter
            try:
                validate_topic_filter(topic_filter)
                error = self.topic_fault(topic_filter)
                if error:
                    raise MQTTProtocolError("limit", error)
            except MQTTProtocolError as exc:
                codes.append(
                    self._refuse_filter(
                        session,
                        topic_filter,
                        str(exc),
                        ReasonCode.TOPIC_FILTER_INVALID if v5 else 0x80,
                    )
                )
                continue
            granted = min(sub.qos, 2)
            parsed = parse_shared(topic_filter)
            checked = parsed[1] if parsed is not None else topic_filter
            if not self.acl.subscribe_allowed(session.client_id, username, checked):
                self.metrics.inc("acl_denied_subscribe")
                codes.append(
                    self._refuse_filter(
                        session,
                        topic_filter,
                        "denied by the ACL",
                        ReasonCode.NOT_AUTHORIZED if v5 else 0x80,
                    )
                )
                continue
            existed = topic_filter in session.subscriptions or topic_filter in session.shared
            if not existed and self.max_subscriptions:
                held = len(session.subscriptions) + len(session.shared)
                fault = subscription_fault(held, self.max_subscriptions)
                if fault:
                    self.metrics.inc("quota_refused_subscriptions")
                    codes.append(
                        self._refuse_filter(
                            session, topic_filter, fault, ReasonCode.QUOTA_EXCEEDED if v5 else 0x80
                        )
                    )
                    continue
            options = SubOptions(sub.no_local, sub.retain_as_published, identifier)
            if options != _NO_OPTIONS:
                session.set_options(topic_filter, options)
            else:
                session.drop_options(topic_filter)
            queue = (
                shared_queue(topic_filter, session.client_id)
                if parsed is not None
                else filter_queue(topic_filter)
            )
            try:
                start_reading_at(self.store, session, queue, ends)
            except StoreUnavailable as exc:
                session.drop_options(topic_filter)
                codes.append(
                    self._refuse_filter(session, topic_filter, f"store unavailable: {exc}")
                )
                continue
            if parsed is not None:
                session.add_shared(topic_filter, granted)
                if self.add_shared(session.client_id, topic_filter, parsed, granted):
                    announced = True
            else:
                if self.add_subscription(session.client_id, topic_filter, granted):
                    announced = True
                session.set_subscription(topic_filter, granted)
                # Retain Handling: 0 send retained messages, 1 only for a new subscription, 2 never.
                if sub.retain_handling == 0 or (sub.retain_handling == 1 and not existed):
                    retained_for.append((topic_filter, granted, identifier))
            codes.append(granted)
        return codes, retained_for, announced

    def _refuse_filter(
        self, session: Session, topic_filter: str, reason: str, code: int = SUBACK_FAILURE
    ) -> int:
        """Log and count a refused filter; its SUBACK return code."""
        log.warning(
            "client %s: SUBSCRIBE '%s' refused (0x%02X): %s",
            client_text(session.client_id),
            client_text(topic_filter),
            code,
            reason,
        )
        self.metrics.inc("subscriptions_refused")
        return code

    async def _finish_subscribe(
        self,
        conn: ClientLink,
        session: Session,
        packet_id: int,
        codes: list[int],
        retained_for: list[tuple[str, int, int]],
    ) -> None:
        if session.persistent:
            await self.persist(session)
        if conn.closed:
            return
        conn.send(codec.encode(Suback(packet_id, codes), conn.level))
        await self._send_retained(conn, session, retained_for)

    async def _send_retained(
        self, conn: ClientLink, session: Session, filters: list[tuple[str, int, int]]
    ) -> None:
        """Retained messages for new subscriptions, with RETAIN=1 (MQTT-3.3.1-6, -8), each with
        the Subscription Identifier of the subscription that asked for it. A QoS 1/2 one goes
        through the client's own queue, unless an unsent copy of it waits there already
        (`bridge.node.retained_copies`)."""
        if not filters or not self.retained:
            return
        queued = False
        own_queue = client_queue(session.client_id)
        copies = self.retained_copies
        copies.prune(session.client_id, session.cursors)
        parts = self.store.parts(own_queue)
        now_ms = int(time.time() * 1000)
        identifiers = {f: i for f, _q, i in filters if i}
        for message, best in self.retained.matching([(f, q) for f, q, _i in filters]):
            if message.properties and expired(message.properties, message.timestamp_ms, now_ms):
                continue
            if not conn.screen_delivery(message.topic):
                continue
            sub_ids = tuple(
                sorted({i for f, i in identifiers.items() if topic_matches(f, message.topic)})
            )
            qos = min(best, message.qos)
            if qos == 0:
                data = conn.encode_message(message, 0, True, sub_ids=sub_ids)
                if data is not None:
                    conn.send_message(data, len(message.payload))
                    self.metrics.messages_out_qos0 += 1
                continue
            copy_id = (message.key, qos, sub_ids)
            if copies.unsent(session.client_id, copy_id, session.cursors):
                self.metrics.inc("retained_copies_unchanged")
                continue
            # Where the queue ends before this copy (each earlier one is durable: awaited).
            ends = {part: self.store.end_offset(part) for part in parts}
            properties = dict(message.properties)
            properties[RETAINED_DELIVERY] = str(qos)
            if sub_ids:
                properties[SUBSCRIPTION_IDS] = ",".join(map(str, sub_ids))
            copy = Message(
                topic=message.topic,
                payload=message.payload,
                qos=message.qos,
                retain=True,
                publisher=message.publisher,
                key=self.stamper.next_key(),
                timestamp_ms=message.timestamp_ms,
                node=self.stamper.node_id,
                properties=properties,
            )
            # Noted before the store answers: a SUBSCRIBE handled meanwhile must not store it too.
            copies.queued(session.client_id, copy_id, ends)
            try:
                await self.store.append(copy, [own_queue])
            except BaseException:
                copies.drop(session.client_id, copy_id)
                raise
            self.metrics.inc("retained_copies_stored")
            queued = True
        if queued:
            self.waker.wake_readers([session.client_id], [own_queue])

    def unsubscribe(self, conn: ClientLink, session: Session, packet: Unsubscribe) -> None:
        """Remove the filters at once; make it durable for a persistent session, then UNSUBACK
        (5.0: with 0x11 for each filter that was not subscribed)."""
        codes = []
        for topic_filter in packet.topic_filters:
            existed = topic_filter in session.subscriptions or topic_filter in session.shared
            codes.append(ReasonCode.SUCCESS if existed else ReasonCode.NO_SUBSCRIPTION_EXISTED)
            session.drop_options(topic_filter)
            if topic_filter in session.subscriptions:
                session.drop_subscription(topic_filter)
                self.remove_subscription(session.client_id, topic_filter)
                stop_reading(self.store, session, filter_queue(topic_filter))
            elif topic_filter in session.shared:
                session.drop_shared(topic_filter)
                self.remove_shared(session.client_id, topic_filter)
                stop_reading(self.store, session, shared_queue(topic_filter, session.client_id))
        self.spawn(self._finish_unsubscribe(conn, session, packet.packet_id, codes))

    async def _finish_unsubscribe(
        self, conn: ClientLink, session: Session, packet_id: int, codes: list[int]
    ) -> None:
        if session.persistent:
            await self.persist(session)
        if not conn.closed:
            level = conn.level
            conn.send(codec.encode(Unsuback(packet_id, codes if level >= 5 else []), level))

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
            end = await self.store.track_queue(queue)
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
                await self.store.append(stored.message, [target])
                handed_to = stored.offset + 1
                moved += 1
                self.waker.wake_readers([self.waker.reader_of(member)], [target])
        if handed_to == start:
            return True
        # What was handed over is this member's no more: not in flight, not to be read.
        for packet_id, out in list(session.inflight.items()):
            if out.queue == queue and out.offset < handed_to:
                session.drop_inflight(packet_id)
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


def _queue_of(topic_filter: str, client_id: str) -> str:
    """The queue a subscription to `topic_filter` reads ("" for a filter that is not valid)."""
    try:
        validate_topic_filter(topic_filter)
        parsed = parse_shared(topic_filter)
    except MQTTProtocolError:
        return ""
    return (
        shared_queue(topic_filter, client_id) if parsed is not None else filter_queue(topic_filter)
    )
