"""Housekeeping of sessions: queue limits, offset flushing, expiry of offline sessions.

Owned by the node. Runs in the background (`run`) and on demand from the publish path (an offline
subscriber's queue grew; a connected one is never trimmed: `bridge.node.congestion` slows its
publishers instead). Whatever it drops is counted
in the node's metrics and logged with the client's id. It is handed the session table, the store,
the limits and a `SessionOwner` to ask when sessions must go, not the node.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from bridge.state import KIND_OFFSETS
from bridge.storage.base import MetaUpdate, StaleOwner, StoreUnavailable

if TYPE_CHECKING:
    from bridge.counters import Metrics
    from bridge.node.roles import SessionOwner
    from bridge.session import Session
    from bridge.settings import Config
    from bridge.storage.base import MessageStore

log = logging.getLogger("bridge.housekeeping")


class Housekeeper:
    """Keeps every session within its limits and writes acknowledged offsets."""

    def __init__(
        self,
        *,
        config: Config,
        store: MessageStore,
        metrics: Metrics,
        sessions: Mapping[str, Session],
        owner: SessionOwner,
    ) -> None:
        self.config = config
        self.store = store
        self.metrics = metrics
        self.sessions = sessions
        self.owner = owner
        self._dirty_offsets: set[str] = set()
        self._trimming: set[str] = set()

    def backlog(self, session: Session) -> tuple[int, int]:
        """(messages, bytes) waiting for a session beyond what was already sent."""
        count = size = 0
        for queue, cursor in session.cursors.items():
            queued, queued_bytes = self.store.backlog(queue, cursor)
            count += queued
            size += queued_bytes
        return count, size

    def over_limits(self, session: Session) -> bool:
        """Whether a session's backlog exceeds `max_queued_messages` or `max_queued_bytes`."""
        count, size = self.backlog(session)
        return count > self.config.max_queued_messages or size > self.config.max_queued_bytes

    def trim_if_over_limits(self, client_id: str) -> None:
        """Trim the session of `client_id` in the background if it is over its limits."""
        session = self.sessions.get(client_id)
        if session is None or client_id in self._trimming:
            return
        if self.over_limits(session):
            self._trimming.add(client_id)
            self.owner.spawn(self.trim_backlog(session))

    async def trim_backlog(self, session: Session) -> None:
        """Drop an offline session's oldest queued messages until it is within 90% of its
        limits (a session that has reconnected meanwhile is left alone)."""
        dropped = 0
        try:
            if session.connected:
                return
            limit_count = self.config.max_queued_messages
            limit_bytes = self.config.max_queued_bytes
            count, size = self.backlog(session)
            if count <= limit_count and size <= limit_bytes:
                return
            target_count = int(limit_count * 0.9)
            target_bytes = int(limit_bytes * 0.9)
            heads: list[list[tuple[int, int, str, int, int]]] = []
            excess = max(count - target_count, 1)
            for queue, cursor in session.cursors.items():
                result = await self.store.read(queue, cursor, min(excess, 4096))
                heads.append(
                    [
                        (s.message.timestamp_ms, s.seq, queue, s.offset, s.size)
                        for s in result.messages
                    ]
                )
            # Oldest first: by time, then seq. Each queue's (part's) messages stay in offset
            # order (seqs of two RocketMQ broker groups say nothing of which came first).
            merged = heapq.merge(*heads, key=lambda head: head[:2])
            for _time, _seq, queue, offset, msg_size in merged:
                if count <= target_count and size <= target_bytes:
                    break
                if queue in session.cursors and session.cursors[queue] <= offset:
                    session.cursors[queue] = offset + 1
                count -= 1
                size -= msg_size
                dropped += 1
            if dropped:
                session.dropped_queue_full += dropped
                self.metrics.inc("dropped_queue_full", dropped)
                self._dirty_offsets.add(session.client_id)
                log.warning(
                    "client %s: queue over its limit (%d messages / %d bytes): dropped the %d "
                    "oldest messages (%d dropped so far)",
                    session.client_id,
                    limit_count,
                    limit_bytes,
                    dropped,
                    session.dropped_queue_full,
                )
        finally:
            self._trimming.discard(session.client_id)
        if dropped:
            # Messages that came while this trim read were not counted by it (their checks saw
            # it running): look again, now that it made progress.
            self.trim_if_over_limits(session.client_id)

    async def run(self) -> None:
        """Flush offsets every `offset_flush_interval`; expire sessions every so often."""
        interval = self.config.offset_flush_interval
        next_expiry_check = 0.0
        while True:
            await asyncio.sleep(interval)
            try:
                await self.flush_offsets(durable=False)
                now = time.time()
                if now >= next_expiry_check:
                    next_expiry_check = now + min(60.0, self.config.session_expiry_seconds / 4)
                    await self.expire_sessions(now)
            except StoreUnavailable as exc:
                log.error("housekeeping: store unavailable: %s", exc)

    async def flush_offsets(self, durable: bool) -> None:
        """Write the offsets of every session whose acknowledged position moved."""
        if not self._dirty_offsets:
            return
        updates = []
        for client_id in self._dirty_offsets:
            session = self.sessions.get(client_id)
            if session is not None and session.persistent:
                updates.append(MetaUpdate(KIND_OFFSETS, client_id, session.encode_offsets()))
        self._dirty_offsets.clear()
        if not updates:
            return
        try:
            await self.store.put_meta(updates, durable=durable)
        except StaleOwner as exc:
            # Another node took these clients over: the rest was written; these go.
            self.owner.lost_ownership(exc.clients)
        except StoreUnavailable:
            self._dirty_offsets.update(u.key for u in updates)  # written with the next flush
            raise

    def mark_offsets_dirty(self, session: Session) -> None:
        """A session's acknowledged position moved; it is written with the next flush."""
        if session.persistent:
            self._dirty_offsets.add(session.client_id)

    def forget(self, client_id: str) -> None:
        """The session is gone: nothing of it to flush."""
        self._dirty_offsets.discard(client_id)

    def expire_later(self, session: Session) -> None:
        """A session with its own expiry interval (MQTT 5.0) went offline: look at it again
        when that interval has passed, not only on the periodic check."""
        if session.expiry is None or not session.persistent:
            return
        loop = asyncio.get_running_loop()
        loop.call_later(
            min(session.expiry + 0.05, 86_400.0 * 30),
            lambda: self.owner.spawn(self.expire_sessions(time.time())),
        )

    async def expire_sessions(self, now: float) -> None:
        """Discard persistent sessions offline longer than their expiry interval (their own,
        MQTT 5.0, or `session_expiry_seconds`)."""
        limit = self.config.session_expiry_seconds
        expired = [s for s in self.sessions.values() if s.expired(now, limit)]
        if not expired:
            return
        for session in expired:
            count, size = self.backlog(session)
            self.metrics.inc("sessions_expired")
            self.metrics.inc("dropped_session_expired", count)
            log.warning(
                "session %s expired after %.0f s offline: %d queued messages (%d bytes) dropped",
                session.client_id,
                session.offline_seconds(now),
                count,
                size,
            )
        await self.owner.expire(expired)
