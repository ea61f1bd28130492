"""What a node knows of its peers' subscriptions: peers sit in the node's trie under pseudo ids,
a replay replaces what was known, and a dead peer's interest is forgotten entirely."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bridge.cluster import announce, wire
from bridge.cluster.cluster import Cluster
from bridge.config import Config
from bridge.node import Node
from bridge.router.plan import DirectRoutes
from bridge.router.queues import ANY_PEER
from bridge.storage.filelog import FileLogStore


def make_cluster(tmp_path: Path) -> tuple[Node, Cluster]:
    config = Config(node_id="a")
    node = Node(config, FileLogStore(tmp_path))  # never opened: only the tables are used
    return node, Cluster(node, registry=None, config=config)  # type: ignore[arg-type]


def matching_peers(node: Node, topic: str) -> set[str]:
    return {s for s in node.trie.match_subscribers(topic) if s.startswith("\x00")}


def test_a_forgotten_peer_leaves_nothing_in_the_trie(tmp_path: Path) -> None:
    node, cluster = make_cluster(tmp_path)
    cluster.interest.add_filters("b", ("factory/#", "pay/+/42"))
    cluster.interest.add_filters("c", ("factory/#",))
    assert matching_peers(node, "factory/line1") == {"\x00b", "\x00c"}
    cluster.forget_peer("b")
    assert matching_peers(node, "factory/line1") == {"\x00c"}
    assert matching_peers(node, "pay/store/42") == set()
    assert "b" not in cluster.interest.peer_filters


def test_a_replay_replaces_the_peers_interest_only_at_its_end(tmp_path: Path) -> None:
    node, cluster = make_cluster(tmp_path)
    cluster.interest.add_filters("b", ("old/#", "kept/#"))
    cluster.interest._replay_filters["b"] = set()  # SyncBegin
    cluster.interest.add_filters("b", ("kept/#", "new/#"))
    assert matching_peers(node, "old/x") == {"\x00b"}  # no gap while the replay streams
    cluster.interest.end_replay("b")  # SyncEnd
    assert matching_peers(node, "old/x") == set()
    assert matching_peers(node, "kept/x") == matching_peers(node, "new/x") == {"\x00b"}


def test_node_gone_from_the_dead_node_itself_marks_it_leaving_not_forgotten(
    tmp_path: Path,
) -> None:
    node, cluster = make_cluster(tmp_path)
    cluster.interest.add_filters("b", ("x/#",))

    class Link:
        peer_id = "b"

    cluster.on_frame(Link(), wire.NodeGone("b"))  # type: ignore[arg-type]
    assert "b" in cluster._leaving
    assert matching_peers(node, "x/1") == {"\x00b"}


def test_wakes_for_a_peer_in_one_loop_turn_leave_merged_ends_first_then_the_wake(
    tmp_path: Path,
) -> None:
    """Every stored message wakes its peer readers; a turn's wakes for one peer go out as one
    Grew (the highest end counted per queue) and one Wake, and none to a peer without a link."""
    _node, cluster = make_cluster(tmp_path)

    class Link:
        peer_id = "b"

        def __init__(self) -> None:
            self.sent: list[wire.Frame] = []

        def send(self, frame: wire.Frame) -> None:
            self.sent.append(frame)

    link = Link()
    cluster.links["b"] = link  # type: ignore[assignment]

    async def main() -> None:
        cluster.wake("b", {"f:a/#": 3})
        cluster.wake("b", {"f:a/#": 4, "c:dev": 0})
        cluster.wake("c", {"f:a/#": 4})  # no link to c: nothing, no error
        assert link.sent == []  # not before the turn ends
        await asyncio.sleep(0)
        assert link.sent == [wire.Grew(("f:a/#",), (4,)), wire.Wake(("f:a/#", "c:dev"))]
        cluster.wake("b", {"f:a/#": 5})
        await asyncio.sleep(0)
        assert link.sent[2:] == [wire.Grew(("f:a/#",), (5,)), wire.Wake(("f:a/#",))]

    asyncio.run(main())


def test_a_peer_link_going_down_or_a_peer_dying_makes_this_node_reread_its_readers_queue_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """notify leaves bridges' messages to the bridge that stored them: a peer that dies between
    storing a message and telling this node must not leave its readers unwoken."""
    monkeypatch.setattr(announce, "PEER_GONE_REFRESH_DELAY", 0.01)
    refreshes: list[float] = []

    async def refresh_queue_ends() -> None:
        refreshes.append(asyncio.get_running_loop().time())

    monkeypatch.setattr(Node, "refresh_queue_ends", lambda _self: refresh_queue_ends())
    _node, cluster = make_cluster(tmp_path)

    class Link:
        peer_id = "b"

    async def main() -> None:
        link = Link()
        cluster.links["b"] = link  # type: ignore[assignment]
        cluster.link_down(link)  # type: ignore[arg-type]
        cluster.peer_gone("b")  # the same event seen twice: one re-read
        await asyncio.sleep(0.1)
        assert len(refreshes) == 1
        cluster.peer_gone("c")
        await asyncio.sleep(0.1)
        assert len(refreshes) == 2
        cluster.leaving = True  # a node that leaves re-reads nothing
        cluster.peer_gone("d")
        await asyncio.sleep(0.1)
        assert len(refreshes) == 2

    asyncio.run(main())


def test_while_a_live_peer_has_no_link_this_node_rereads_its_readers_queue_ends_periodically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition between two live nodes: what one stores for the other's readers cannot be
    announced, so the other re-reads its readers' queue ends every few seconds until the link
    is back."""
    monkeypatch.setattr(announce, "PEER_GONE_REFRESH_DELAY", 0.0)
    monkeypatch.setattr(announce, "PARTITION_REFRESH_INTERVAL", 0.4)
    refreshes: list[float] = []

    async def refresh_queue_ends() -> None:
        refreshes.append(asyncio.get_running_loop().time())

    monkeypatch.setattr(Node, "refresh_queue_ends", lambda _self: refresh_queue_ends())
    _node, cluster = make_cluster(tmp_path)

    async def main() -> None:
        cluster.members = {"a": {}, "b": {}}  # b is alive, but no link to it
        keeper = asyncio.create_task(cluster._keep_links())
        try:
            await asyncio.sleep(1.7)
            partitioned = len(refreshes)
            assert 2 <= partitioned <= 4
            cluster.links["b"] = type("Link", (), {"check_alive": lambda self, now: None})()  # type: ignore[assignment]
            await asyncio.sleep(1.0)
            assert len(refreshes) == partitioned  # linked again: no more re-reads
        finally:
            keeper.cancel()

    asyncio.run(main())


def queues_of(node: Node, topic: str) -> list[str]:
    """The queues a QoS 1 message to `topic` published on `node` is stored on."""
    return list(DirectRoutes().queued_plan(topic, node.trie).queues)


def test_a_session_on_its_way_here_keeps_its_queues_fed_when_its_previous_owner_is_forgotten(
    tmp_path: Path,
) -> None:
    """The CI loss of 27 PUBACKed messages in the SIGTERM drain drill: node c claimed the
    subscriber from draining node a, declared a dead (forgetting its interest) while a's
    Release answer was still awaited, and stored the publishes in between on no queue."""

    async def main() -> None:
        node, cluster = make_cluster(tmp_path)
        cluster.interest.add_filters("b", ("load/#",))  # the previous owner's subscriber
        assert queues_of(node, "load/pub2") == ["f:load/#"]
        cluster.hold_arriving({"load/#"})  # claimed from b, Release under way
        assert cluster.interest.local_counts["load/#"] == 1  # announced to the peers
        cluster.peer_gone("b")  # b declared dead meanwhile
        assert queues_of(node, "load/pub2") == ["f:load/#"]
        cluster.release_arriving({"load/#"})  # adopted (its own subscription took over)
        assert queues_of(node, "load/pub2") == []
        assert "load/#" not in cluster.interest.local_counts  # withdrawn after the grace

    asyncio.run(main())


def test_a_held_filter_also_handed_to_any_peer_stays_until_both_let_it_go(tmp_path: Path) -> None:
    async def main() -> None:
        node, cluster = make_cluster(tmp_path)
        cluster.hold_arriving({"load/#"})
        cluster.interest.add_filters(ANY_PEER, ("load/#",))  # a session handed elsewhere
        cluster.interest.remove_filters(ANY_PEER, {"load/#"})  # its grace ran out
        assert queues_of(node, "load/x") == ["f:load/#"]  # still held
        cluster.interest.add_filters(ANY_PEER, ("load/#",))
        cluster.release_arriving({"load/#"})
        assert queues_of(node, "load/x") == ["f:load/#"]  # still handed
        cluster.interest.remove_filters(ANY_PEER, {"load/#"})
        assert queues_of(node, "load/x") == []

    asyncio.run(main())
