"""Closing a client for a fault of its own (a malformed packet, a protocol error, a packet over
`max_packet_size`), logged at a pace a flood cannot raise.

Every such closure is counted (`protocol_faults`) and names the fault and the client (escaped:
`bridge.logtext.client_text`) in a log line, but at most one line per
`protocol_fault_log_interval` seconds for each kind of fault (the reason code a v5 client is
told in its DISCONNECT or CONNACK), the next line of that kind saying how many were not logged
meanwhile. A party that reconnects in a loop to send garbage costs the log a few lines a
minute, and each still says how big its flood was.
"""

from __future__ import annotations

import logging

from bridge.listeners.link import Link
from bridge.logtext import client_text, suppressed_note
from bridge.mqtt import codec
from bridge.mqtt.errors import MQTTProtocolError, PacketTooLarge
from bridge.mqtt.packets import Connack
from bridge.mqtt.reasons import ReasonCode

log = logging.getLogger("bridge.connection")


def close_for_fault(conn: Link, fault: str, reason_code: int) -> None:
    """Close `conn` for the client's `fault` (a v5 client first gets DISCONNECT with
    `reason_code` once it has logged in), counted, and logged at the node's pace."""
    node = conn.node
    node.metrics.inc("protocol_faults")
    shown, suppressed = node.fault_log.note(reason_code)
    if shown:
        log.warning(
            "client %s (%s): closing: %s%s",
            client_text(conn.client_id or "-"),
            conn.peer,
            client_text(fault, 256),
            suppressed_note(suppressed),
        )
    conn.close(fault, reason_code=reason_code, log_it=False)


def close_for_protocol_error(conn: Link, error: MQTTProtocolError, level: int) -> None:
    """Close `conn` for what its decoder (of protocol `level`) found wrong in its bytes: a
    malformed packet, a protocol error, or a packet over `max_packet_size`."""
    reason_code = getattr(error, "reason_code", ReasonCode.MALFORMED_PACKET)
    if conn.session is None and level >= 5:
        # A v5 client that never got its CONNACK hears why in one (MQTT-3.1.4-1).
        conn.send(codec.encode(Connack(reason_code, False), 5))
    if isinstance(error, PacketTooLarge):
        conn.node.metrics.inc("packets_too_large")
        fault = f"packet of {error.size} bytes exceeds max_packet_size={error.limit}"
        close_for_fault(conn, fault, ReasonCode.PACKET_TOO_LARGE)
    else:
        conn.node.metrics.inc("protocol_errors")
        close_for_fault(conn, f"protocol violation {error}", reason_code)
