"""Wills: the message a CONNECT leaves behind, published once when its connection ends badly.

A will is kept in the client's `online` record from CONNECT on (so if this node dies, the node
that notices publishes it: `bridge.cluster`), and is deleted in the same atomic append that
publishes it, so it is published at most once. MQTT 5.0 adds the Will Delay Interval: the will
waits that long (or until its session ends, if sooner) and is not published at all if the client
comes back to its session first.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from bridge.logtext import client_text
from bridge.mqtt.packets import Will
from bridge.mqtt.properties import PropertyId
from bridge.node.roles import Spawner
from bridge.state import KIND_ONLINE, encode_message
from bridge.storage import metadata
from bridge.storage.base import (
    Message,
    MetaUpdate,
    RecordsNotWritten,
    StaleOwner,
    StoreUnavailable,
)

if TYPE_CHECKING:
    from bridge.counters import Metrics
    from bridge.node.publish import Publisher

log = logging.getLogger("bridge.node")

RETRY_FIRST = 0.5
RETRY_MAX = 5.0
"""Seconds between attempts to store a will the store could not take."""


def will_delay(will: Will) -> float:
    """The will's delay in seconds (MQTT 5.0 Will Delay Interval; 0 for 3.1.1)."""
    return float(will.properties.get(PropertyId.WILL_DELAY_INTERVAL, 0))


def delay_of(online_record: bytes | None) -> float:
    """The will delay an `online` record names (0 if none)."""
    if not online_record:
        return 0.0
    try:
        return float(json.loads(online_record).get("wd", 0))
    except (ValueError, AttributeError, TypeError):
        return 0.0


class Wills:
    """Publishes wills, now or after their delay, exactly once."""

    def __init__(self, *, publisher: Publisher, metrics: Metrics, spawn: Spawner) -> None:
        self.publisher = publisher
        self.metrics = metrics
        self.spawn = spawn
        self.node_id = publisher.stamper.node_id
        self._delayed: dict[str, tuple[asyncio.TimerHandle, Message]] = {}
        """ClientId -> the timer of its delayed will and the will."""

    def online_record(self, client_id: str, peer: str, will: Will | None) -> bytes:
        """The `online` record of a connection: where it is, since when, its will."""
        record: dict[str, Any] = {"peer": peer, "at": time.time(), "node": self.node_id}
        if will is not None:
            record["will"] = encode_message(self.message(client_id, will)).decode()
            delay = will_delay(will)
            if delay:
                record["wd"] = delay
        return json.dumps(record, separators=(",", ":")).encode()

    def message(self, client_id: str, will: Will) -> Message:
        """The message a will becomes when it is published (its properties kept)."""
        message = self.publisher.stamper.stamp(
            will.topic, will.payload, will.qos, will.retain, client_id
        )
        if will.properties:
            message.properties = metadata.from_publish(will.properties)
        return message

    def due(self, client_id: str, will: Will, session_expiry: float | None) -> None:
        """The connection ended badly: publish its will now, or once its delay (or its
        session's expiry, if sooner) has passed."""
        message = self.message(client_id, will)
        delay = will_delay(will)
        if session_expiry is not None:
            delay = min(delay, session_expiry)
        if delay <= 0:
            self.spawn(self.publish(client_id, message))
            return
        self.cancel(client_id)
        timer = asyncio.get_running_loop().call_later(delay, self._fire, client_id)
        self._delayed[client_id] = (timer, message)
        log.debug("client %s: will delayed %.0f s", client_id, delay)

    def _fire(self, client_id: str) -> None:
        entry = self._delayed.pop(client_id, None)
        if entry is not None:
            self.spawn(self.publish(client_id, entry[1]))

    def cancel(self, client_id: str) -> bool:
        """The client came back to its session in time: its delayed will is not published.
        True if one was waiting."""
        entry = self._delayed.pop(client_id, None)
        if entry is None:
            return False
        entry[0].cancel()
        self.metrics.inc("wills_cancelled")
        log.info("client %s: reconnected within its will delay; will not published", client_id)
        return True

    def publish_now(self, client_id: str) -> None:
        """The session ended before the will's delay did: publish the waiting will now."""
        entry = self._delayed.pop(client_id, None)
        if entry is not None:
            entry[0].cancel()
            self.spawn(self.publish(client_id, entry[1]))

    def stop(self) -> None:
        """The node stops: delayed wills stay in their `online` records for the next owner."""
        for timer, _message in self._delayed.values():
            timer.cancel()
        self._delayed.clear()

    async def publish(self, client_id: str, message: Message, *, clear_online: bool = True) -> None:
        """Publish a will once: the online record is deleted in the same atomic append.

        A store that cannot take it now (Redis or the broker away) is asked again, with pauses
        growing to `RETRY_MAX`: the client is gone and cannot send its will again, so it is the
        server's to deliver. It stops when the will is stored; when the record's write is refused
        because another node took the client over (that node's claim took the online record and
        the will in it: it publishes the will); or when a send may have stored it without saying
        so (sending it again could publish it twice)."""
        self.metrics.inc("wills_published")
        log.info(
            "client %s: publishing will to '%s'", client_text(client_id), client_text(message.topic)
        )
        meta = [MetaUpdate(KIND_ONLINE, client_id, None)] if clear_online else []
        if message.retain:
            meta.extend(self.publisher.retained.updates(message))
        pause = RETRY_FIRST
        while True:
            try:
                await self.publisher.route(message, meta=meta)
                return
            except StaleOwner:
                log.info(
                    "client %s: taken over by another node; its will is published there", client_id
                )
                return
            except StoreUnavailable as exc:
                if exc.maybe_stored and not isinstance(exc, RecordsNotWritten):
                    log.error(
                        "client %s: will perhaps not stored (not sent again): %s", client_id, exc
                    )
                    return
                self.metrics.inc("wills_retried")
                log.warning(
                    "client %s: will not stored, store unavailable (trying again in %.1f s): %s",
                    client_id,
                    pause,
                    exc,
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, RETRY_MAX)
