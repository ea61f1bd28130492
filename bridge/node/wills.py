"""Wills: the message a CONNECT leaves behind, published once when its connection ends badly.

A will is kept in the client's `online` record from CONNECT on, under the message key it will be
published with (so if this node dies, the node that notices publishes it: `bridge.cluster`). In
the embedded store the record is deleted in the same atomic append that publishes the will, so it
is published once. A store whose records live apart from its messages (RocketMQ, with Redis)
cannot do that: there the record is first rewritten as "being published" (`SENT`), the will is
sent, and the record is deleted only once the will is stored. A node that takes such a record
over asks the store for the will's key before it publishes it (`publication_begun`): deleting the
record before the send, as the atomic append does, lost a will whenever the send failed and the
node was taken over before it could try again. MQTT 5.0 adds the Will Delay Interval: the will
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

SENT = "sent"
"""The field of an `online` record that says its will's publication has begun (under the key
the record's will carries)."""

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


def publication_begun(online_record: bytes | None) -> bool:
    """Whether the owner of an `online` record began publishing its will, which may therefore
    be stored already: whoever takes the record over looks the will's key up first."""
    if not online_record:
        return False
    try:
        return bool(json.loads(online_record).get(SENT))
    except (ValueError, AttributeError, TypeError):
        return False


class Wills:
    """Publishes wills, now or after their delay, exactly once."""

    def __init__(self, *, publisher: Publisher, metrics: Metrics, spawn: Spawner) -> None:
        self.publisher = publisher
        self.metrics = metrics
        self.spawn = spawn
        self.node_id = publisher.stamper.node_id
        self._delayed: dict[str, tuple[asyncio.TimerHandle, Message]] = {}
        """ClientId -> the timer of its delayed will and the will."""

    def online_record(self, client_id: str, peer: str, will: Will | None) -> tuple[bytes, str]:
        """The `online` record of a connection (where it is, since when, its will) and the key
        its will is published under ("" without a will): `due` is given it, so that a node
        that takes the record over can tell whether the will was stored already."""
        record: dict[str, Any] = {"peer": peer, "at": time.time(), "node": self.node_id}
        key = ""
        if will is not None:
            message = self.message(client_id, will)
            key = message.key
            record["will"] = encode_message(message).decode()
            delay = will_delay(will)
            if delay:
                record["wd"] = delay
        return json.dumps(record, separators=(",", ":")).encode(), key

    def _sending_record(self, message: Message) -> bytes:
        """The `online` record of a will being published: the will (with its key) and `SENT`;
        no delay, since the will is due."""
        record = {"at": time.time(), "node": self.node_id, "will": encode_message(message).decode()}
        record[SENT] = 1
        return json.dumps(record, separators=(",", ":")).encode()

    def message(self, client_id: str, will: Will) -> Message:
        """The message a will becomes when it is published (its properties kept)."""
        message = self.publisher.stamper.stamp(
            will.topic, will.payload, will.qos, will.retain, client_id
        )
        if will.properties:
            message.properties = metadata.from_publish(will.properties)
        return message

    def due(self, client_id: str, will: Will, session_expiry: float | None, key: str = "") -> None:
        """The connection ended badly: publish its will now, or once its delay (or its
        session's expiry, if sooner) has passed; under `key`, the one its online record names."""
        message = self.message(client_id, will)
        if key:
            message.key = key
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

    async def publish(
        self,
        client_id: str,
        message: Message,
        *,
        clear_online: bool = True,
        maybe_sent: bool = False,
    ) -> None:
        """Publish a will once, and with it end the client's online record (`clear_online`).

        A store that cannot take it now (Redis or the broker away) is asked again, with pauses
        growing to `RETRY_MAX`: the client is gone and cannot send its will again, so it is the
        server's to deliver. It stops when the will is stored; or when the record's write is
        refused because another node took the client over (that node's claim took the online
        record and the will in it: it publishes the will). A send that may have stored it
        without saying so (a broker that did not answer) is settled as a QoS 2 resend is: the
        store is asked whether it holds the will's key, and it is sent again, under that key,
        only if it does not (`_stored_meanwhile`). A store that cannot be asked leaves it at
        that rather than risk publishing it twice. `maybe_sent`: the record was taken over from
        a node that had begun publishing the will (`publication_begun`), so the store is asked
        first."""
        self.metrics.inc("wills_published")
        log.info(
            "client %s: publishing will to '%s'", client_text(client_id), client_text(message.topic)
        )
        atomic = self.publisher.store.traits.atomic_meta
        if not message.key:
            message.key = self.publisher.stamper.next_key()  # to look it up after a failure
        meta: list[MetaUpdate] = []
        if clear_online:
            # Records are written before the message is sent: where they are not one atomic
            # append with it, the record must still hold the will if the send fails.
            record = None if atomic else self._sending_record(message)
            meta.append(MetaUpdate(KIND_ONLINE, client_id, record))
        if message.retain:
            meta.extend(self.publisher.retained.updates(message))
        if maybe_sent and not atomic and await self._stored_meanwhile(client_id, message):
            log.info("client %s: its will was stored by the node that held it", client_id)
        elif not await self._send(client_id, message, meta, atomic):
            return
        if clear_online and not atomic:
            await self._end_online(client_id)

    async def _send(
        self, client_id: str, message: Message, meta: list[MetaUpdate], atomic: bool
    ) -> bool:
        """Store the will with its records, trying until it is stored (True) or left to
        another node or to doubt (False)."""
        pauses = _Pauses()
        tries = 0
        while True:
            tries += 1
            try:
                await self.publisher.route(message, meta=meta)
                if tries > 1:
                    log.info("client %s: will stored at try %d", client_id, tries)
                return True
            except StaleOwner:
                log.info(
                    "client %s: taken over by another node; its will is published there", client_id
                )
                return False
            except StoreUnavailable as exc:
                if exc.maybe_stored and not isinstance(exc, RecordsNotWritten):
                    if atomic:
                        # A store whose writes are atomic with their records never leaves this
                        # doubt; should one, sending again could publish the will twice.
                        log.error(
                            "client %s: will perhaps not stored (not sent again): %s",
                            client_id,
                            exc,
                        )
                        return False
                    if await self._stored_meanwhile(client_id, message):
                        log.info("client %s: its will was stored before the failure", client_id)
                        return True
                self.metrics.inc("wills_retried")
                log.warning(
                    "client %s: will not stored, store unavailable (trying again in %.1f s): %s",
                    client_id,
                    pauses.next,
                    exc,
                )
            await pauses.wait()

    async def _stored_meanwhile(self, client_id: str, message: Message) -> bool:
        """Whether the store holds the will (by its key): asked until the store answers, with
        pauses growing to `RETRY_MAX`."""
        pauses = _Pauses()
        while True:
            try:
                return await self.publisher.store.find_key(message.topic, message.key)
            except StoreUnavailable as exc:
                log.warning("client %s: was its will stored? Asking again: %s", client_id, exc)
                await pauses.wait()

    async def _end_online(self, client_id: str) -> None:
        """The will is stored: delete the online record that said it was being published
        (until Redis takes it; a node that took the client over meanwhile finds the will's
        key stored and does not publish it again)."""
        pauses = _Pauses()
        while True:
            try:
                await self.publisher.store.put_meta([MetaUpdate(KIND_ONLINE, client_id, None)])
                return
            except StaleOwner:
                return
            except StoreUnavailable as exc:
                log.warning(
                    "client %s: will stored, its online record not deleted yet "
                    "(trying again in %.1f s): %s",
                    client_id,
                    pauses.next,
                    exc,
                )
            await pauses.wait()


class _Pauses:
    """The pauses between tries: `RETRY_FIRST`, doubling up to `RETRY_MAX`."""

    def __init__(self) -> None:
        self.next = RETRY_FIRST

    async def wait(self) -> None:
        await asyncio.sleep(self.next)
        self.next = min(self.next * 2, RETRY_MAX)
