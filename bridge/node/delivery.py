"""Per-client delivery: read the session's queues from its cursors and send to the client.

A `Delivery` exists while its client is connected. It runs a task per queue only when woken (a
message was appended to the queue, an acknowledgement freed the in-flight window, the socket
became writable again) and the task ends as soon as that queue is caught up or blocked: an idle
client costs no task and no polling, and a read that waits on one queue holds up no other.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, Protocol

from bridge.access.reads import checks_reads
from bridge.mqtt import codec
from bridge.mqtt.packets import Pubrel
from bridge.node.copies import copy_for
from bridge.session import InFlight, Phase, Session, packet_id_for
from bridge.storage.base import StoreUnavailable
from bridge.storage.metadata import expired

if TYPE_CHECKING:
    from bridge.access.acl import Acl
    from bridge.counters import Metrics
    from bridge.node.roles import ClientLink
    from bridge.storage.base import MessageStore, ReadResult, Stored

log = logging.getLogger("bridge.delivery")

READ_BATCH = 128
SENT: Final = 0
"""A message read was sent (or its PUBREL, when only its release was owed)."""
SKIPPED: Final = 1
"""A message read is not for this client, or not from this queue: its cursor moves past it."""
WAIT: Final = 2
"""A message read cannot be sent before an acknowledgement frees the window or its packet id:
the drain stops and reads it again."""
RETRY_SECONDS = 1.0
"""Seconds between read attempts while the store is unavailable."""


class Offsets(Protocol):
    """Where a delivery reports moved read positions (`bridge.node.housekeeping.Housekeeper`)."""

    def mark_offsets_dirty(self, session: Session) -> None:
        """The session's read position moved: write it with the next flush."""
        ...


class Pace(Protocol):
    """Who waits for this client to catch up (`bridge.node.congestion.Congestion`)."""

    def read(self, session: Session) -> None:
        """A pass over the session's queues ended."""
        ...

    def gone(self, session: Session) -> None:
        """The client disconnected."""
        ...


class Delivery:
    """The pull task of one connected client."""

    __slots__ = (
        "_drains",
        "_read_now",
        "_retrying",
        "_scan",
        "_stopped",
        "_window_blocked",
        "acl",
        "conn",
        "max_inflight",
        "metrics",
        "offsets",
        "pace",
        "qos2_copy_window",
        "session",
        "store",
    )

    def __init__(
        self,
        session: Session,
        conn: ClientLink,
        *,
        store: MessageStore,
        metrics: Metrics,
        offsets: Offsets,
        pace: Pace,
        max_inflight: int,
        acl: Acl | None = None,
        read_now: Callable[[str, int, int], ReadResult | None] | None = None,
        qos2_copy_window: int = 0,
    ) -> None:
        self.session = session
        self.conn = conn
        self.store = store
        self.metrics = metrics
        self.offsets = offsets
        self.pace = pace
        self.max_inflight = max_inflight
        self.qos2_copy_window = qos2_copy_window
        """QoS 2 keys remembered to leave out a second stored copy (`Session.first_copy`)."""
        self.acl = acl
        """The ACL whose deny rules may keep a message from a broader subscription."""
        self._retrying = False
        self._stopped = False
        self._drains: dict[str, asyncio.Task[None]] | None = None
        """Queue -> the task sending what it holds. Each queue is drained on its own: a read
        that waits on one (a light queue the broker has not filled yet) holds up no other.
        None while there is none (an idle connection's memory)."""
        self._window_blocked: set[str] | None = None
        """Queues whose drain stopped on a full window; None while there is none (an empty set
        is 216 bytes of every idle connection)."""
        self._scan: asyncio.Handle | None = None
        self._read_now = read_now or (store.read_cached if store.traits.cached_reads else None)
        """The store's read from memory (the embedded store's record cache), if it has one;
        the node hands every delivery the same bound method."""

    def wake(self) -> None:
        """Something may be deliverable: soon (once per event-loop turn, however many wakes
        came in it) drain every queue that holds unsent messages and is not being drained
        already (a running drain goes on until its queue is caught up)."""
        if self._scan is None and not self._stopped:
            self._scan = asyncio.get_running_loop().call_soon(self._start_drains)

    def _start_drains(self) -> None:
        self._scan = None
        if self._stopped:
            return
        drains = self._drains
        end_offset = self.store.end_offset
        session = self.session
        # With the window full (or the socket backed up) a drain would end at once: start none;
        # the acknowledgement that frees the window (or resume_writing) wakes this again.
        window_full = session.window_free(self.max_inflight) <= 0
        if not window_full and not self.conn.writable:
            return
        for queue, cursor in list(session.cursors.items()):
            if cursor < end_offset(queue) and (drains is None or queue not in drains):
                if window_full:
                    self._block(queue)
                elif self._drain_now(queue):
                    self.pace.read(session)
                else:
                    if drains is None:
                        drains = self._drains = {}
                    drains[queue] = asyncio.get_running_loop().create_task(self._run(queue))

    @property
    def running(self) -> bool:
        """Whether a queue is being drained (or is about to be)."""
        return bool(self._drains) or self._scan is not None

    @property
    def blocked_on_window(self) -> bool:
        """Whether a drain stopped because the in-flight window is full (an acknowledgement
        that frees enough of it should wake this delivery)."""
        return bool(self._window_blocked)

    def _block(self, queue: str) -> None:
        if self._window_blocked is None:
            self._window_blocked = set()
        self._window_blocked.add(queue)

    def _unblock(self, queue: str) -> None:
        if self._window_blocked is not None:
            self._window_blocked.discard(queue)

    def stop(self) -> None:
        """The connection ended; never send again."""
        if self._stopped:
            return
        self._stopped = True
        if self._scan is not None:
            self._scan.cancel()
            self._scan = None
        for task in (self._drains or {}).values():
            task.cancel()
        self._drains = None
        self.pace.gone(self.session)

    def resend_inflight(self) -> None:
        """On session resumption: resend unacknowledged PUBLISHes with DUP=1 and PUBRELs, in the
        original order (MQTT-4.4.0-1)."""
        conn = self.conn
        for out in self.session.inflight.values():
            if out.phase is Phase.AWAITING_ACK:
                message = out.message
                data: bytes | None
                if message is None:
                    data = codec.encode_publish(
                        out.topic, out.payload, out.qos, out.retain, True, out.packet_id
                    )
                else:
                    data = conn.encode_message(
                        message, out.qos, out.retain, True, out.packet_id, out.sub_ids
                    )
                if data is not None:
                    conn.send(data)
            else:
                conn.send(codec.encode(Pubrel(out.packet_id), conn.level))

    async def _run(self, queue: str) -> None:
        try:
            await self._drain(queue)
            if self._retrying:
                self._retrying = False
                log.info("client %s: reading queued messages again", self.session.client_id)
        except asyncio.CancelledError:
            raise
        except StoreUnavailable as exc:
            # An outage of the store, not a fault of this client: keep the connection, try again.
            if not self._retrying:
                log.warning(
                    "client %s: cannot read queued messages now, retrying every %.0f s: %s",
                    self.session.client_id,
                    RETRY_SECONDS,
                    exc,
                )
            self._retrying = True
            self.metrics.inc("delivery_store_errors")
            asyncio.get_running_loop().call_later(RETRY_SECONDS, self.wake)
        except Exception:
            log.exception("client %s: delivery failed", self.session.client_id)
            self.conn.close("internal error in delivery")
        finally:
            # No await since the drain's last look at the queue's end: a wake from now on
            # starts a new drain, so no message can arrive unseen in between.
            drains = self._drains
            if drains is not None and drains.get(queue) is asyncio.current_task():
                del drains[queue]
                if not drains:
                    self._drains = None
        self.pace.read(self.session)

    async def _drain(self, queue: str) -> None:
        """Send what `queue` holds from the session's cursor until it is caught up, the window
        is full (`blocked_on_window`) or the socket is not writable."""
        self._unblock(queue)
        logical = self.store.queue_of_part(queue) or queue  # `queue` is a part (positions.py)
        while not self._stopped:
            planned = self._next_read_or_block(queue)
            if planned is None:
                return
            cursor, limit = planned
            result = await self.store.read(queue, cursor, limit)
            if self._stopped or self.session.cursors.get(queue) != cursor:
                return
            if not self._take(queue, logical, cursor, result):
                return

    def _drain_now(self, queue: str) -> bool:
        """`_drain` without a task, while what it reads is in the store's memory (a reader that
        keeps up: the hot path). False when a read needs the disk (or the store failed): a task
        goes on from the cursor then."""
        read_now = self._read_now
        if read_now is None:
            return False
        self._unblock(queue)
        logical = self.store.queue_of_part(queue) or queue
        try:
            while not self._stopped:
                planned = self._next_read_or_block(queue)
                if planned is None:
                    return True
                cursor, limit = planned
                result = read_now(queue, cursor, limit)
                if result is None:
                    return False
                if not self._take(queue, logical, cursor, result):
                    return True
        except StoreUnavailable:
            return False  # the task meets it again, counts it and retries
        except Exception:
            log.exception("client %s: delivery failed", self.session.client_id)
            self.conn.close("internal error in delivery")
        return True

    def _next_read_or_block(self, queue: str) -> tuple[int, int] | None:
        """The cursor of `queue` and how many messages to read there, or None: caught up, the
        window full (then `queue` is marked blocked on the window, `_block`, so that the
        acknowledgement that frees a place wakes it) or the socket not writable
        (resume_writing wakes us)."""
        session = self.session
        cursor = session.cursors.get(queue)
        if cursor is None or cursor >= self.store.end_offset(queue):
            return None
        free = session.window_free(self.max_inflight)
        if free <= 0:
            self._block(queue)
            return None
        if not self.conn.writable:
            return None
        # Read about what the window can take: messages read and not sent are read again.
        return cursor, min(READ_BATCH, max(free, 8))

    def _take(self, queue: str, logical: str, cursor: int, result: ReadResult) -> bool:
        """Send what a read of part `queue` at `cursor` returned and move the cursor past it;
        False when the window filled up on the way (the drain stops)."""
        session = self.session
        next_offset = cursor
        if result.lost:
            next_offset = cursor + result.lost
            session.dropped_retention += result.lost
            self.metrics.inc("dropped_retention", result.lost)
            log.warning(
                "client %s: %d queued messages of %s were removed by retention before delivery",
                session.client_id,
                result.lost,
                queue,
            )
        blocked = False
        for stored in result.messages:
            if self._send(queue, logical, stored) == WAIT:
                blocked = True
                self._block(queue)
                break
            next_offset = stored.offset + 1
        if not result.messages and not result.lost:
            next_offset = max(next_offset, result.next_offset)
        session.cursors[queue] = next_offset
        self.offsets.mark_offsets_dirty(session)
        return not blocked

    def _send(self, queue: str, logical: str, stored: Stored) -> int:
        """Send one message read from part `queue` of queue `logical`: `SENT`, `SKIPPED`
        (expired, not for this client's ACL, no copy for it from this queue: `copy_for`, or too
        large for the client) or `WAIT` (the window or packet id is not free: stop and wait for
        an acknowledgement)."""
        session = self.session
        message = stored.message
        if message.properties and expired(
            message.properties, message.timestamp_ms, int(time.time() * 1000)
        ):
            self.metrics.inc("dropped_expired")
            return SKIPPED  # its Message Expiry Interval passed while it waited (MQTT-3.3.2-5)
        acl = self.acl
        if checks_reads(acl, session) and not self.conn.screen_delivery(message.topic):
            return SKIPPED
        copy = copy_for(session, logical, message, stored.queues, self.store)
        if copy.skip:
            return SKIPPED
        qos = copy.qos
        retain = copy.retain
        sub_ids = copy.sub_ids
        if (
            qos == 2
            and message.key
            and not session.first_copy(message.key, stored.seq, self.qos2_copy_window)
        ):
            self.metrics.inc("qos2_copies_skipped")
            log.info(
                "client %s: QoS 2 message %s was stored twice (a resend after a store failure); "
                "its second copy is not sent",
                session.client_id,
                message.key,
            )
            return SKIPPED
        conn = self.conn
        if qos == 0:
            data = conn.encode_message(message, 0, retain, False, None, sub_ids)
            if data is None:
                return SKIPPED
            conn.send_message(data, len(message.payload))
            self.metrics.messages_out_qos0 += 1
            return SENT
        if session.window_free(self.max_inflight) <= 0:
            return WAIT
        packet_id = packet_id_for(stored.seq)
        if session.in_flight(packet_id):
            return WAIT  # id collision with an older message still in flight: wait for it
        released = qos == 2 and session.was_released(stored.seq)
        dup = stored.offset < session.resend_below.get(queue, -1)
        data = None
        if not released:
            data = conn.encode_message(message, qos, retain, dup, packet_id, sub_ids)
            if data is None:
                return SKIPPED  # too large for the client: as if sent (MQTT-3.1.2-25)
        out = InFlight(
            packet_id,
            queue,
            stored.offset,
            stored.seq,
            qos,
            message.topic,
            message.payload,
            retain,
            message=message,
            sub_ids=sub_ids,
        )
        session.track(out)
        if data is None:
            out.phase = Phase.AWAITING_PUBCOMP
            conn.send(codec.encode(Pubrel(packet_id), conn.level))
            return SENT
        conn.send_message(data, len(message.payload), metered=not dup)
        if qos == 1:
            self.metrics.messages_out_qos1 += 1
        else:
            self.metrics.messages_out_qos2 += 1
        return SENT
