"""QoS 0 messages between nodes: a message with MQTT 5 metadata goes in the frames that carry it
only to a peer that advertised them for the boot it is linked to; every other peer, and every
message without metadata, gets the frames an earlier version knows. A received frame reaches
the node as a `Message`."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

from bridge.cluster import wire
from bridge.cluster.cluster import Cluster
from bridge.config import Config
from bridge.storage.base import Message

META = {"\x00ct": "text/plain", "\x00rt": "replies/1", "unit": "kg", "unit\x001": "g"}


class Metrics:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def inc(self, name: str, by: int = 1) -> None:
        self.counts[name] += by


class Host:
    """The parts of `ClusterHost` these tests reach, recording what peers' frames deliver."""

    node_id = "a"

    def __init__(self) -> None:
        self.metrics = Metrics()
        self.forwarded: list[Message] = []
        self.delivered: list[tuple[str, Message]] = []

    def spawn(self, coro: Any) -> None:
        coro.close()

    async def refresh_queue_ends(self) -> None:
        pass

    def connected_count(self) -> int:
        return 0

    def deliver_forwarded(self, message: Message) -> None:
        self.forwarded.append(message)

    def deliver_to(self, client_id: str, message: Message) -> None:
        self.delivered.append((client_id, message))


class Link:
    def __init__(self, peer_id: str, boot: str) -> None:
        self.peer_id = peer_id
        self.peer_boot = boot
        self.sent: list[bytes] = []
        self.last_heard = time.monotonic()  # a live link (the lease asks)

    def send_droppable(self, data: bytes) -> bool:
        self.sent.append(data)
        return True

    def frames(self) -> list[wire.Frame]:
        decoder = wire.PeerDecoder()
        for data in self.sent:
            decoder.receive_data(data)
        return decoder.frames()


def make_cluster() -> tuple[Host, Cluster, dict[str, Link]]:
    host = Host()
    cluster = Cluster(host, registry=None, config=Config(node_id="a"))  # type: ignore[arg-type]
    links = {
        "new": Link("new", "boot-2"),
        "old": Link("old", "boot-3"),  # a node of the previous version: no features
        "restarted": Link("restarted", "boot-5"),  # its info is that of its previous boot
    }
    cluster.members = {
        "a": {"boot": cluster.boot_id, "features": ["meta"]},
        "new": {"boot": "boot-2", "features": ["meta", "something-later"]},
        "old": {"boot": "boot-3"},
        "restarted": {"boot": "boot-4", "features": ["meta"]},
    }
    cluster.links.update(links)  # type: ignore[arg-type]
    return host, cluster, links


def test_metadata_goes_only_to_peers_that_advertised_it_for_the_linked_boot() -> None:
    host, cluster, links = make_cluster()
    message = Message("a/b", b"x", retain=True, publisher="dev-1", timestamp_ms=7, properties=META)
    cluster.forward(["new", "old", "restarted", "gone"], message)
    assert links["new"].frames() == [
        wire.ForwardMeta("a/b", b"x", 1, "dev-1", 7, tuple(META.items()))
    ]
    assert links["old"].frames() == links["restarted"].frames() == [wire.Forward("a/b", b"x", 1)]
    assert links["old"].sent[0] is links["restarted"].sent[0]  # encoded once per frame kind
    assert host.metrics.counts["dropped_peer_link"] == 1  # no link to "gone"

    cluster.interest.member_node.update({"m1": "new", "m2": "old"})
    cluster.deliver("m1", message)
    cluster.deliver("m2", message)
    assert links["new"].frames()[-1] == wire.DeliverMeta(
        "m1", "a/b", b"x", 1, "dev-1", 7, tuple(META.items())
    )
    assert links["old"].frames()[-1] == wire.Deliver("m2", "a/b", b"x")


def test_a_message_without_metadata_goes_in_the_old_frames_to_every_peer() -> None:
    _host, cluster, links = make_cluster()
    plain = Message("a/b", b"x", publisher="dev-1", timestamp_ms=7)
    cluster.forward(["new", "old"], plain)
    cluster.interest.member_node["m1"] = "new"
    cluster.deliver("m1", plain)
    assert links["new"].frames() == [wire.Forward("a/b", b"x", 0), wire.Deliver("m1", "a/b", b"x")]
    assert links["old"].frames() == [wire.Forward("a/b", b"x", 0)]


def test_frames_from_peers_reach_the_node_as_messages() -> None:
    host, cluster, links = make_cluster()
    link = links["new"]
    for frame in (
        wire.Forward("t/1", b"old", 1),
        wire.ForwardMeta("t/2", b"new", 0, "dev-1", 99, tuple(META.items())),
        wire.Deliver("m1", "t/3", b"old"),
        wire.DeliverMeta("m1", "t/4", b"new", 1, "dev-2", 5, (("k", "v"),)),
    ):
        cluster.on_frame(link, frame)  # type: ignore[arg-type]
    assert host.forwarded == [
        Message("t/1", b"old", retain=True),
        Message("t/2", b"new", publisher="dev-1", timestamp_ms=99, properties=META),
    ]
    assert list(host.forwarded[1].properties) == list(META)  # in the publisher's order
    assert host.delivered == [
        ("m1", Message("t/3", b"old")),
        ("m1", Message("t/4", b"new", retain=True, publisher="dev-2", timestamp_ms=5,
                       properties={"k": "v"})),
    ]  # fmt: skip


def test_a_node_advertises_the_frames_it_understands_in_its_registry_info() -> None:
    _host, cluster, _links = make_cluster()
    infos: list[dict[str, Any]] = []

    class Registry:
        async def heartbeat(self, info: dict[str, Any], ttl: float) -> bool:
            infos.append(info)
            return False

    cluster.registry = Registry()  # type: ignore[assignment]
    asyncio.run(cluster._heartbeat())
    assert infos[0]["features"] == ["meta"] and infos[0]["boot"] == cluster.boot_id
