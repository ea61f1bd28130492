"""A QoS 1 message reaches an online subscriber while its commit runs, its PUBACK still waits
for the commit, QoS 2 waits for it entirely, and a failed write after such an early read neither
skips nor loses the messages that come next.

Runs the node in-process on a real FileLogStore (its disk writes watched or made to fail), with
the connections' transports replaced by recorders (tests/support/transport.py).
"""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path
from typing import Any

import pytest
import uvloop

from bridge.config import Config
from bridge.listeners.connection import Connection
from bridge.mqtt import codec
from bridge.mqtt.packets import Puback, Publish, Pubrec, Subscribe, Subscription
from bridge.node import Node
from bridge.storage import FileLogStore
from bridge.storage.filelog import commit as filelog_commit
from tests.support.transport import RecordingTransport, open_connection


class EventTransport(RecordingTransport):
    """A recorder that also notes, in one list shared with the disk, when it was written to."""

    def __init__(self, name: str, events: list[str]) -> None:
        super().__init__()
        self.name = name
        self.events = events

    def write(self, data: bytes) -> None:
        super().write(data)
        self.events.append(self.name)


async def connect(node: Node, client_id: str, events: list[str]) -> tuple[Connection, Any]:
    return await open_connection(node, client_id, EventTransport(client_id, events))


async def settle(check: Any, seconds: float = 2.0) -> None:
    for _ in range(int(seconds / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)


def publishes(transport: RecordingTransport) -> list[Publish]:
    return [p for p in transport.packets() if isinstance(p, Publish)]


@pytest.mark.parametrize(
    ("qos", "setting", "before"),
    [(1, True, True), (1, False, False), (2, True, False)],
    ids=["qos1", "qos1-deliver_before_commit-off", "qos2"],
)
def test_a_subscriber_gets_qos1_while_its_commit_runs_and_qos2_only_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, qos: int, setting: bool, before: bool
) -> None:
    events: list[str] = []
    real_write = filelog_commit._write_all

    def watched(fd: int, data: Any) -> None:
        events.append("commit")
        real_write(fd, data)

    async def scenario() -> None:
        config = Config(
            listen=["127.0.0.1:0"], data_dir=str(tmp_path), deliver_before_commit=setting
        )
        node = Node(config, FileLogStore(tmp_path))
        await node.start()
        sub, sub_t = await connect(node, "subscriber", events)
        sub.data_received(codec.encode(Subscribe(1, [Subscription("plant/#", 2)])))
        pub, pub_t = await connect(node, "publisher", events)
        await asyncio.sleep(0.1)
        monkeypatch.setattr(filelog_commit, "_write_all", watched)
        events.clear()
        pub.data_received(codec.encode(Publish("plant/x", b"m", qos, packet_id=7)))
        await settle(lambda: publishes(sub_t) and len(pub_t.packets()) > 1)
        assert [p.payload for p in publishes(sub_t)] == [b"m"]
        ack = Puback if qos == 1 else Pubrec
        assert any(isinstance(p, ack) for p in pub_t.packets())
        commit = events.index("commit")
        # The publisher is acknowledged only after the commit, in either case.
        assert "publisher" in events[commit:]
        if before:
            assert events.index("subscriber") < commit  # sent while the commit ran
        else:
            assert events.index("subscriber") > commit  # QoS 2 never: a resend would repeat it
        await node.stop()

    uvloop.run(scenario())


def test_a_failed_write_after_an_early_read_neither_skips_nor_loses_the_next_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []

    def disk_full(fd: int, data: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    async def scenario() -> None:
        config = Config(listen=["127.0.0.1:0"], data_dir=str(tmp_path))
        store = FileLogStore(tmp_path)
        node = Node(config, store)
        await node.start()
        sub, sub_t = await connect(node, "subscriber", events)
        sub.data_received(codec.encode(Subscribe(1, [Subscription("plant/#", 1)])))
        pub, pub_t = await connect(node, "publisher", events)
        await asyncio.sleep(0.1)
        acked: set[int] = set()

        def ack_all() -> None:
            for p in publishes(sub_t):
                if p.packet_id not in acked:
                    acked.add(p.packet_id)
                    sub.data_received(codec.encode(Puback(p.packet_id)))

        monkeypatch.setattr(filelog_commit, "_write_all", disk_full)
        pub.data_received(codec.encode(Publish("plant/x", b"first", 1, packet_id=1)))
        await settle(lambda: pub_t.closed)
        # The subscriber had it before the write failed; its publisher was never acknowledged
        # and is cut off, so it sends it again.
        assert [p.payload for p in publishes(sub_t)] == [b"first"]
        assert not any(isinstance(p, Puback) for p in pub_t.packets())
        assert pub_t.closed
        pub.connection_lost(None)
        assert node.metrics.get("readers_rewound") == 1
        monkeypatch.undo()

        pub, pub_t = await connect(node, "publisher", events)
        pub.data_received(
            codec.encode(Publish("plant/x", b"first", 1, dup=True, packet_id=1))
            + codec.encode(Publish("plant/x", b"second", 1, packet_id=2))
        )
        await settle(lambda: sum(isinstance(p, Puback) for p in pub_t.packets()) == 2)
        for _ in range(3):  # the first copy's packet id is taken until it is acknowledged
            ack_all()
            await settle(lambda: len(publishes(sub_t)) == 3, 0.5)
        ack_all()
        assert [p.payload for p in publishes(sub_t)] == [b"first", b"first", b"second"]
        stored = await store.read("f:plant/#", 0, 10)
        assert [(s.offset, s.message.payload) for s in stored.messages] == [
            (0, b"first"),
            (1, b"second"),
        ]
        session = node.sessions["subscriber"]
        assert session.cursors["f:plant/#"] == 2 and not session.inflight
        await node.stop()

    uvloop.run(scenario())
