"""Refusing a CONNECT whose ClientId's session belongs to another identity
(`Admission.refuse_not_owner`): the CONNACK at each protocol level, the count, and a log that an
intruder retrying cannot flood."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from bridge.config import Config
from bridge.counters import Metrics
from bridge.mqtt.codec import Decoder
from bridge.mqtt.packets import Connack
from bridge.mqtt.properties import PropertyId
from bridge.mqtt.reasons import ReasonCode
from bridge.node.admission import Admission


class RefusedLink:
    """What refusing needs of a connection: it records what is sent and the close."""

    def __init__(self) -> None:
        self.client_id = ""
        self.peer = "198.51.100.7:40000"
        self.sent: list[bytes] = []
        self.closed_for: str | None = None

    def send(self, data: bytes) -> None:
        self.sent.append(data)

    def close(self, reason: str, *, log_it: bool = True) -> None:
        self.closed_for = reason

    def connack(self, level: int) -> Connack:
        decoder = Decoder(from_server=True)
        decoder.protocol_level = level
        decoder.feed(b"".join(self.sent))
        (packet,) = decoder.packets()
        assert isinstance(packet, Connack)
        return packet


def admission() -> Admission:
    unused: Any = None  # the refusal asks nothing of access control, bans or limits
    return Admission(
        config=Config(),
        access=unused,
        bans=unused,
        limits=unused,
        metrics=Metrics(),
        refusing=lambda: None,
        topic_fault=lambda _topic: None,
    )


def test_the_refusal_is_0x87_at_5_and_return_code_5_at_311_and_closes() -> None:
    gate = admission()
    v5, v311 = RefusedLink(), RefusedLink()
    gate.refuse_not_owner(v5, "phone", "user:alice", "user:mallory", 5)
    gate.refuse_not_owner(v311, "phone", "user:alice", "user:mallory", 4)
    connack = v5.connack(5)
    assert connack.return_code == ReasonCode.NOT_AUTHORIZED
    reason = connack.properties[PropertyId.REASON_STRING]
    assert "user 'mallory'" in reason and "alice" not in reason
    assert v311.connack(4).return_code == 5
    assert v5.closed_for == v311.closed_for == reason
    assert gate.metrics.snapshot()["connections_refused_not_owner"] == 2


def test_refusals_are_logged_once_per_interval_with_the_count_left_out_and_escaped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = admission()
    with caplog.at_level(logging.WARNING, logger="bridge.node"):
        for _ in range(5):
            gate.refuse_not_owner(RefusedLink(), "ph\none", "user:al\x1bice", "anonymous", 4)
    lines = [r.getMessage() for r in caplog.records if "belongs to" in r.getMessage()]
    assert len(lines) == 1
    assert "client ph\\none from" in lines[0] and "user 'al\\x1bice', not to anonymous" in lines[0]
    assert gate.metrics.snapshot()["connections_refused_not_owner"] == 5
    gate.not_owner_log.last -= 60  # as if the interval had passed
    with caplog.at_level(logging.WARNING, logger="bridge.node"):
        gate.refuse_not_owner(RefusedLink(), "phone", "user:alice", "anonymous", 4)
    assert "(+4 more not logged since the last line)" in caplog.records[-1].getMessage()
