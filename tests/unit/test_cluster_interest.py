"""What a node knows of its peers' subscriptions: peers sit in the node's trie under pseudo ids,
a replay replaces what was known, and a dead peer's interest is forgotten entirely."""

from __future__ import annotations

from pathlib import Path

from bridge.cluster import wire
from bridge.cluster.cluster import Cluster
from bridge.config import Config
from bridge.node import Node
from bridge.storage.filelog import FileLogStore


def make_cluster(tmp_path: Path) -> tuple[Node, Cluster]:
    config = Config(node_id="a")
    node = Node(config, FileLogStore(tmp_path))  # never opened: only the tables are used
    return node, Cluster(node, registry=None, config=config)  # type: ignore[arg-type]


def matching_peers(node: Node, topic: str) -> set[str]:
    return {s for s in node.trie.match_subscribers(topic) if s.startswith("\x00")}


def test_a_forgotten_peer_leaves_nothing_in_the_trie(tmp_path: Path) -> None:
    node, cluster = make_cluster(tmp_path)
    cluster._add_filters("b", ("factory/#", "pay/+/42"))
    cluster._add_filters("c", ("factory/#",))
    assert matching_peers(node, "factory/line1") == {"\x00b", "\x00c"}
    cluster.forget_peer("b")
    assert matching_peers(node, "factory/line1") == {"\x00c"}
    assert matching_peers(node, "pay/store/42") == set()
    assert "b" not in cluster.peer_filters


def test_a_replay_replaces_the_peers_interest_only_at_its_end(tmp_path: Path) -> None:
    node, cluster = make_cluster(tmp_path)
    cluster._add_filters("b", ("old/#", "kept/#"))
    cluster._replay_filters["b"] = set()  # SyncBegin
    cluster._add_filters("b", ("kept/#", "new/#"))
    assert matching_peers(node, "old/x") == {"\x00b"}  # no gap while the replay streams
    cluster._end_replay("b")  # SyncEnd
    assert matching_peers(node, "old/x") == set()
    assert matching_peers(node, "kept/x") == matching_peers(node, "new/x") == {"\x00b"}


def test_node_gone_from_the_dead_node_itself_marks_it_leaving_not_forgotten(
    tmp_path: Path,
) -> None:
    node, cluster = make_cluster(tmp_path)
    cluster._add_filters("b", ("x/#",))

    class Link:
        peer_id = "b"

    cluster.on_frame(Link(), wire.NodeGone("b"))  # type: ignore[arg-type]
    assert "b" in cluster._leaving
    assert matching_peers(node, "x/1") == {"\x00b"}
