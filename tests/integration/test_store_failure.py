"""A store that fails to write never lets an acknowledgement out, and a QoS 2 PUBLISH whose
store failed is stored when the client resends it (not merely acknowledged as a duplicate).

Runs the node in-process on a real FileLogStore whose disk writes are made to fail (ENOSPC),
with the connection's transport replaced by a recorder (tests/support/transport.py)."""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path
from typing import Any

import pytest
import uvloop

from bridge.config import Config
from bridge.mqtt import codec
from bridge.mqtt.packets import Publish, Pubrec, Subscribe, Subscription
from bridge.node import Node
from bridge.storage import FileLogStore
from bridge.storage.filelog import commit as filelog_commit
from tests.support.transport import open_connection


def test_failed_store_sends_no_pubrec_and_a_resend_is_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        config = Config(listen=["127.0.0.1:0"], data_dir=str(tmp_path))
        store = FileLogStore(tmp_path)
        node = Node(config, store)
        await node.start()
        sub, _ = await open_connection(node, "subscriber")
        sub.data_received(codec.encode(Subscribe(1, [Subscription("plant/#", 2)])))
        await asyncio.sleep(0.05)

        def disk_full(fd: int, data: Any) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        pub, transport = await open_connection(node, "publisher")
        assert transport.packets()[0].return_code == 0
        monkeypatch.setattr(filelog_commit, "_write_all", disk_full)
        pub.data_received(codec.encode(Publish("plant/x", b"once", 2, packet_id=5)))
        await asyncio.sleep(0.2)
        assert not any(isinstance(p, Pubrec) for p in transport.packets())
        assert transport.closed  # so the client resends on a new connection
        pub.connection_lost(None)

        monkeypatch.undo()
        pub, transport = await open_connection(node, "publisher")
        pub.data_received(codec.encode(Publish("plant/x", b"once", 2, dup=True, packet_id=5)))
        await asyncio.sleep(0.2)
        assert any(isinstance(p, Pubrec) for p in transport.packets())
        stored = await store.read("f:plant/#", 0, 10)
        assert [s.message.payload for s in stored.messages] == [b"once"]
        await node.stop()

    uvloop.run(scenario())
