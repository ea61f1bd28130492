"""Acknowledgements of what the bridge sent: PUBACK, PUBREC and PUBCOMP from the client.

Each frees a place in the client's in-flight window (and wakes its delivery when enough are
free); a PUBREC moves a QoS 2 message to its PUBREL phase, durably for a persistent session
before PUBREL goes out. A v5 client may refuse a message with an error reason code: it is done.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from bridge.mqtt import codec
from bridge.mqtt.packets import PacketType, Puback, Pubcomp, Pubrec, Pubrel
from bridge.mqtt.reasons import ReasonCode
from bridge.session import Phase
from bridge.state import KIND_OFFSETS
from bridge.storage.base import MetaUpdate, StoreUnavailable

if TYPE_CHECKING:
    from bridge.listeners.link import Link
    from bridge.session import Session

log = logging.getLogger("bridge.connection")


def on_puback(conn: Link, packet: Puback) -> None:
    session = conn.session
    assert session is not None
    if session.on_puback(packet.packet_id) is None:
        log.debug("client %s: PUBACK for unknown packet id %d", conn.client_id, packet.packet_id)
        return
    _after_ack(conn, session)


def on_pubrec(conn: Link, packet: Pubrec) -> None:
    session = conn.session
    assert session is not None
    if packet.reason_code >= 0x80 and conn.v5 is not None:
        # The client refused the message (MQTT-4.3.3-4): it is done, no PUBREL follows.
        out = session.inflight.get(packet.packet_id)
        if out is not None and out.qos == 2 and out.phase is Phase.AWAITING_ACK:
            session.drop_inflight(packet.packet_id)
            _after_ack(conn, session)
        return
    out = session.on_pubrec(packet.packet_id)
    if out is None and conn.v5 is not None:
        conn.send(
            codec.encode_ack5(
                PacketType.PUBREL, packet.packet_id, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND
            )
        )
        return
    if out is None or not session.persistent:
        # Unknown id: answer PUBREL anyway so the client can finish its side.
        conn.send(codec.encode(Pubrel(packet.packet_id)))
        return
    # The client may forget the id once it has PUBCOMPed: the PUBREL phase must be durable
    # before PUBREL goes out, so a restart never resends this PUBLISH.
    conn.node.spawn(_persist_then_pubrel(conn, session, packet.packet_id))


async def _persist_then_pubrel(conn: Link, session: Session, packet_id: int) -> None:
    try:
        await conn.node.store.put_meta(
            [MetaUpdate(KIND_OFFSETS, session.client_id, session.encode_offsets())],
            durable=True,
        )
    except StoreUnavailable as exc:
        conn.close(
            f"store unavailable, PUBREC not recorded: {exc}",
            reason_code=ReasonCode.UNSPECIFIED_ERROR,
        )
        return
    conn.send(codec.encode(Pubrel(packet_id)))


def on_pubcomp(conn: Link, packet: Pubcomp) -> None:
    session = conn.session
    assert session is not None
    if session.on_pubcomp(packet.packet_id) is None:
        log.debug("client %s: PUBCOMP for unknown packet id %d", conn.client_id, packet.packet_id)
        return
    _after_ack(conn, session)


def _after_ack(conn: Link, session: Session) -> None:
    if session.persistent:  # (checked here too: a clean session's ack makes no call)
        conn.node.housekeeper.mark_offsets_dirty(session)
    delivery = conn.delivery
    if delivery is not None and delivery.blocked_on_window:
        # Refill at once: the acknowledgements of one read wake one drain (`wake` runs once
        # per loop turn), and waiting for more of them stalls a client that holds its PUBACKs
        # back until ours carry its TCP ACK (Nagle, e.g. mosquitto_sub: 40 ms per window).
        delivery.wake()
