"""A QoS 2 PUBLISH a client sends again while its packet id is still held: never stored twice.

The first PUBLISH with an id is stored by `Publisher.publish`, which holds the id in
`session.inbound_qos2` until PUBREL: a future while the store runs, None once it is durable, or
an `Unsettled` marker when a send to the store ended without an answer (RocketMQ: a timeout, or
a crash between the marker and the send). A resend is acknowledged once the first store is
durable; an unsettled one asks the store whether the message is there.

A message found there was stored without this node learning so: no answer counted it in its
queues' ends, and nothing woke their readers (its broker group's master may have died before
answering, and no later message may ever come to that group's part of the queue). So the ends
of every queue it may be on are read again from the store, and their readers woken.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from bridge.mqtt.delayed import parse_delayed
from bridge.mqtt.packets import Publish
from bridge.node.positions import reread_ends
from bridge.router.plan import possible_queues
from bridge.session import Session
from bridge.state import KIND_QOS2_IN, Unsettled
from bridge.storage.base import MetaUpdate, StoreUnavailable

if TYPE_CHECKING:
    from bridge.node.publish import Publisher
    from bridge.storage.base import MessageStore

log = logging.getLogger("bridge.node")

Ack = Callable[[BaseException | None], None]

REREAD_ATTEMPTS = 30
REREAD_AT_ONCE = 8
REREAD_PAUSE = 1.0
"""Seconds between reads of the ends that failed (a master's death: until its slave answers)."""


def publish_again(publisher: Publisher, session: Session, packet: Publish, ack: Ack) -> None:
    """A QoS 2 PUBLISH whose packet id is still held: acknowledge it once the first store is
    durable, never store it twice. If whether that store happened is unsettled (a send that
    timed out, a crash between marker and send), ask the store: found, acknowledge; not
    found, store this one."""
    assert packet.packet_id is not None
    pending = session.inbound_qos2[packet.packet_id]
    if isinstance(pending, Unsettled):
        publisher.spawn(_settle(publisher, session, packet, pending, ack))
    elif pending is None or pending.done():
        ack(None if pending is None else pending.result())
    else:
        pending.add_done_callback(lambda f: ack(f.result()))


async def _settle(
    publisher: Publisher, session: Session, packet: Publish, unsettled: Unsettled, ack: Ack
) -> None:
    packet_id = packet.packet_id
    assert packet_id is not None
    try:
        found = await publisher.store.find_key(unsettled.topic, unsettled.key)
    except StoreUnavailable as exc:
        ack(exc)
        return
    if session.inbound_qos2.get(packet_id) is not unsettled:
        # Settled meanwhile (PUBREL, or another resend got here first): start over.
        if packet_id in session.inbound_qos2:
            publish_again(publisher, session, packet, ack)
        else:
            publisher.publish(
                session, packet, lambda _s, error: ack(error), parse_delayed(packet.topic)
            )
        return
    if found:
        log.info(
            "client %s: QoS 2 message %s was stored before the failure; not stored again",
            session.client_id,
            unsettled.key,
        )
        session.hold_qos2_in(packet_id, None)
        ack(None)
        publisher.spawn(_reread_ends(publisher, unsettled.topic))
    else:
        # Stored again under the same key: a reader that had a first copy the store lost track
        # of (a master that died before its slave had it) leaves this one out.
        session.drop_qos2_in(packet_id)
        publisher.publish(
            session,
            packet,
            lambda _s, error: ack(error),
            parse_delayed(packet.topic),
            key=unsettled.key,
        )


async def _reread_ends(publisher: Publisher, topic: str) -> None:
    """Read the ends of every part of every queue a message on `topic` may be on, until each
    answered (or `REREAD_ATTEMPTS` rounds), and wake their readers here and on the peers."""
    store = publisher.store
    parts = [
        p for q in possible_queues(topic, publisher.trie, publisher.shared) for p in store.parts(q)
    ]
    limit = asyncio.Semaphore(REREAD_AT_ONCE)
    for _ in range(REREAD_ATTEMPTS):
        failed = await reread_ends(store, parts, limit)
        ends = {part: store.end_offset(part) for part in parts if part not in failed}
        if ends:
            publisher.wakes.queues_grew(ends)
        if not failed:
            return
        parts = failed
        await asyncio.sleep(REREAD_PAUSE)
    log.warning(
        "ends of %d queue parts of %r not read again after a QoS 2 message was found stored: "
        "their readers see it with the next message there",
        len(parts),
        topic,
    )


async def release(store: MessageStore, session: Session, packet_id: int) -> None:
    """PUBREL from the publisher of a persistent session: forget the packet id durably before
    PUBCOMP (a clean session's id lives only in memory; the connection drops it itself)."""
    session.drop_qos2_in(packet_id)
    await store.put_meta(
        [MetaUpdate(KIND_QOS2_IN, f"{session.client_id}\x00{packet_id}", None)], durable=True
    )
