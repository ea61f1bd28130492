"""Letting a ClientId go to another node (`ClusterOwnership.release`, `lost_ownership`), with the
registry, the cluster and the session lifecycle replaced by the few members it uses."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pytest

from bridge.cluster.registry import Claim
from bridge.config import Config
from bridge.counters import Metrics
from bridge.node.cluster_ownership import ClusterOwnership
from bridge.router.queues import ANY_PEER
from bridge.session import Session
from bridge.state import Unsettled
from bridge.storage.base import MetaUpdate


class Registry:
    """The epochs this node owns its clients at, and `disown`."""

    def __init__(self, epochs: dict[str, int]) -> None:
        self.epochs = epochs

    def disown(self, client_id: str) -> None:
        self.epochs.pop(client_id, None)


class Membership:
    """The cluster as ownership sees it: the registry, and the states handed to peers."""

    def __init__(self, epochs: dict[str, int]) -> None:
        self.registry = Registry(epochs)
        self.handed: list[tuple[str, bytes]] = []

    async def request_release(self, peer: str, client_id: str, epoch: int) -> bytes | None:
        raise AssertionError("not asked in these tests")

    def handed_to(self, peer: str, state: bytes) -> None:
        self.handed.append((peer, state))


class Here:
    """The session lifecycle's steps, recorded; `discard` drops the session from the table."""

    def __init__(self, sessions: dict[str, Session]) -> None:
        self.sessions = sessions
        self.detached: list[Any] = []
        self.discarded: list[str] = []
        self.markers: list[tuple[int, bytes]] = []

    def restore(self, client_id: str, subs: bytes, offsets: bytes | None, was_online: bool) -> Any:
        raise AssertionError("not asked in these tests")

    def restore_qos2_marker(self, session: Session, packet_id: int, value: bytes) -> None:
        self.markers.append((packet_id, value))

    def detach(self, conn: Any) -> bool:
        self.detached.append(conn)
        return True

    def discard(self, session: Session, updates: list[MetaUpdate]) -> None:
        self.discarded.append(session.client_id)
        self.sessions.pop(session.client_id, None)


class Wills:
    def __init__(self) -> None:
        self.cancelled: list[str] = []

    def cancel(self, client_id: str) -> bool:
        self.cancelled.append(client_id)
        return False


class Link:
    """A connection that records its close."""

    def __init__(self) -> None:
        self.will: Any = object()
        self.closed: list[tuple[str, bool, int | None]] = []

    def close(
        self, reason: str, *, taken_over: bool = False, reason_code: int | None = None
    ) -> None:
        self.closed.append((reason, taken_over, reason_code))


def ownership(
    epochs: dict[str, int],
    sessions: dict[str, Session],
    connections: dict[str, Any],
    ends: dict[str, int] | None = None,
) -> tuple[ClusterOwnership, Membership, Here, Wills]:
    cluster, here, wills = Membership(epochs), Here(sessions), Wills()
    unused: Any = None
    owner = ClusterOwnership(
        cluster=cluster,  # type: ignore[arg-type]
        here=here,
        sessions=sessions,
        connections=connections,
        wills=wills,  # type: ignore[arg-type]
        admission=unused,
        metrics=Metrics(),
        config=Config(),
        node_id="node-a",
        refresh_queue_ends=unused,
        queue_end=lambda part: (ends or {}).get(part, 0),
        spawn=unused,
    )
    return owner, cluster, here, wills


def test_release_hands_a_persistent_session_over_and_closes_its_connection_here() -> None:
    session = Session(client_id="phone", persistent=True)
    session.first_copy("n1-a-9", 12, window=8)
    link = Link()
    owner, cluster, here, wills = ownership({"phone": 3}, {"phone": session}, {"phone": link})
    state = owner.release("phone", 4)
    assert set(json.loads(state)) == {"subs", "off", "q2", "in"}
    assert json.loads(state)["q2"] == [["n1-a-9", 12]]  # the QoS 2 copies it was sent
    assert wills.cancelled == ["phone"] and link.will is None
    assert here.detached == [link] and here.discarded == ["phone"]
    assert link.closed and link.closed[0][1] is True
    assert "phone" not in cluster.registry.epochs
    assert owner.metrics.snapshot()["sessions_released"] == 1


def test_a_release_older_than_this_nodes_own_claim_is_stale_and_changes_nothing() -> None:
    session = Session(client_id="phone", persistent=True)
    owner, cluster, here, wills = ownership({"phone": 7}, {"phone": session}, {"phone": Link()})
    assert owner.release("phone", 6) == b""
    assert wills.cancelled == [] and here.discarded == [] and here.detached == []
    assert cluster.registry.epochs == {"phone": 7}


def test_a_clean_session_is_released_with_no_state() -> None:
    session = Session(client_id="sensor", persistent=False)
    owner, _, here, _ = ownership({}, {"sensor": session}, {})
    assert owner.release("sensor") == b""
    assert here.discarded == ["sensor"]


def test_lost_ownership_lets_go_only_of_clients_this_node_no_longer_owns() -> None:
    sessions = {
        "gone": Session(client_id="gone", persistent=True),
        "kept": Session(client_id="kept", persistent=True),
    }
    owner, cluster, here, _ = ownership({"kept": 2}, sessions, {})
    owner.lost_ownership(["gone", "kept"])
    assert here.discarded == ["gone"]
    assert [peer for peer, _ in cluster.handed] == [ANY_PEER]
    assert json.loads(cluster.handed[0][1])["subs"]
    assert "kept" in sessions


def test_a_session_whose_sends_are_unknown_marks_its_queues_up_to_their_ends_for_dup() -> None:
    """What the old node sent after the registry's copy was written is unknown: each part's
    messages up to its end come with DUP=1; a part read to its end, or marked further already,
    keeps its mark."""
    session = Session(client_id="phone", persistent=True)
    session.cursors = {"f/0": 5, "f/1": 7, "f/2": 3}
    session.resend_below = {"f/2": 12}
    owner, *_ = ownership({}, {"phone": session}, {}, ends={"f/0": 9, "f/1": 7, "f/2": 10})
    owner.assume_sent(session)
    assert dict(session.resend_below) == {"f/0": 9, "f/2": 12}


class Arrivals(Membership):
    """A cluster whose registry hands the client over from node-b, and which records what it
    holds for an arriving session at the moment node-b is asked to release it."""

    def __init__(self, subs: bytes) -> None:
        super().__init__({})
        self.held: Counter[str] = Counter()
        self.held_during_release: dict[str, int] = {}
        claim = Claim(epoch=2, previous_node="node-b", records={"subs": subs, "off": b"{}"})

        async def claim_it(client_id: str, clean: bool, identity: str | None = None) -> Claim:
            self.registry.epochs[client_id] = claim.epoch  # as Registry.claim does
            return claim

        self.registry.claim = claim_it  # type: ignore[attr-defined]

    async def request_release(self, peer: str, client_id: str, epoch: int) -> bytes | None:
        self.held_during_release = dict(self.held)
        handed = {"subs": '{"subs": {"load/#": 1}}', "off": "{}", "q2": [["n2-b-4", 30]]}
        return json.dumps(handed).encode()

    def hold_arriving(self, filters: set[str]) -> None:
        self.held.update(filters)

    def release_arriving(self, filters: set[str]) -> None:
        self.held.subtract(filters)


def test_a_session_claimed_from_another_node_keeps_its_filters_held_until_adopted() -> None:
    """Between the claim and the adoption the previous owner can be declared dead and its
    interest forgotten (the drain drill's lost messages): the session's filters are held."""
    cluster = Arrivals(b'{"subs": {"load/#": 1, "alerts/+": 0}}')
    owner, *_ = ownership({}, {}, {})
    owner.cluster = cluster  # type: ignore[assignment]
    adopted: list[Session] = []

    def adopt(client_id: str, claim: Claim, **_: Any) -> Session:
        adopted.append(Session(client_id=client_id, persistent=True))
        return adopted[-1]

    owner.adopt = adopt  # type: ignore[method-assign]
    taken = asyncio.run(owner.take_over(Link(), "keeper", False, True, None))  # type: ignore[arg-type]
    assert taken is True and [s.client_id for s in adopted] == ["keeper"]
    assert cluster.held_during_release == {"load/#": 1, "alerts/+": 1}
    assert +cluster.held == Counter()  # let go once adopted
    # What the old node said it sent of QoS 2 holds a second stored copy back here.
    assert not adopted[0].first_copy("n2-b-4", 77, window=8)


class OwnClaim(Membership):
    """A registry whose claim finds this node (node-a) the previous owner: an earlier claim of
    node-a was applied while Redis reported it failed."""

    def __init__(self, records: dict[str, bytes], was_clean: bool = False) -> None:
        super().__init__({})
        claim = Claim(epoch=9, previous_node="node-a", records=records, was_clean=was_clean)

        async def claim_it(client_id: str, clean: bool, identity: str | None = None) -> Claim:
            return claim

        self.registry.claim = claim_it  # type: ignore[attr-defined]


def take_over_own_claim(
    cluster: OwnClaim, sessions: dict[str, Session]
) -> tuple[bool | None, list[str], list[Any]]:
    owner, *_ = ownership({}, sessions, {})
    owner.cluster = cluster  # type: ignore[assignment]
    adopted: list[str] = []
    spawned: list[Any] = []
    owner.adopt = lambda client_id, claim, **_: adopted.append(client_id)  # type: ignore[method-assign, assignment, return-value]
    owner.spawn = lambda coro: spawned.append(coro.close())  # type: ignore[assignment, func-returns-value]
    taken = asyncio.run(owner.take_over(Link(), "roamer", False, True, None))  # type: ignore[arg-type]
    return taken, adopted, spawned


def test_a_session_this_node_owns_in_the_registry_but_does_not_hold_is_resumed_from_it() -> None:
    """Found by the nemesis Redis failover: a claim Redis applied while WAIT refused it left
    this node the owner without the session; the holder let it go. Starting afresh (session
    present 0) dropped the subscriptions and all published meanwhile."""
    records = {"subs": b'{"subs": {"load/#": 2}}', "off": b"{}"}
    taken, adopted, spawned = take_over_own_claim(OwnClaim(records), {})
    assert taken is True and adopted == ["roamer"]
    assert len(spawned) == 1  # its queues' ends are learnt, what was sent marked for DUP


def test_a_session_held_here_is_resumed_here_and_not_adopted_again() -> None:
    records = {"subs": b'{"subs": {"load/#": 2}}'}
    sessions = {"roamer": Session(client_id="roamer", persistent=True)}
    taken, adopted, _ = take_over_own_claim(OwnClaim(records), sessions)
    assert taken is False and adopted == []


def test_a_clean_session_this_node_owned_is_not_resumed_from_the_registry() -> None:
    taken, adopted, _ = take_over_own_claim(OwnClaim({"subs": b"{}"}, was_clean=True), {})
    assert taken is False and adopted == []


class SlowHolder(Membership):
    """node-b holds the client and answers the Release late; meanwhile the client connects
    again here, and that newer claim (`newer`) adopts the session."""

    def __init__(self, newer: int) -> None:
        super().__init__({})
        self.newer = newer
        self.resumed = Session(client_id="roamer", persistent=True)
        self.sessions: dict[str, Session] = {}
        claim = Claim(epoch=7, previous_node="node-b", records={"subs": b'{"subs": {}}'})

        async def claim_it(client_id: str, clean: bool, identity: str | None = None) -> Claim:
            self.registry.epochs[client_id] = claim.epoch
            return claim

        self.registry.claim = claim_it  # type: ignore[attr-defined]

    async def request_release(self, peer: str, client_id: str, epoch: int) -> bytes | None:
        # While node-b is asked, the client's next CONNECT claims it again (epoch 8, say) and
        # resumes the session here: the table holds what that connection is served from.
        self.registry.epochs[client_id] = self.newer
        self.sessions[client_id] = self.resumed
        return None

    async def wait_for_holder(self, holder: str, client_id: str) -> bool:
        return True  # node-b's lease lapsed

    def hold_arriving(self, filters: set[str]) -> None:
        pass

    def release_arriving(self, filters: set[str]) -> None:
        pass


class Refusals:
    def __init__(self) -> None:
        self.refused: list[int] = []

    def refuse(self, conn: Any, code: int, reason: str, level: int, *_: Any) -> None:
        self.refused.append(code)


def test_a_claim_overtaken_while_its_previous_node_was_asked_leaves_the_newer_session_alone() -> (
    None
):
    """Found by the nemesis: a CONNECT waited for a silent node while the client connected
    again and was served; when the wait ended, the older claim replaced that session with the
    registry's older copy, and the next connection got about 300 QoS 2 messages again."""
    cluster = SlowHolder(newer=8)
    owner, *_ = ownership({}, cluster.sessions, {})
    owner.cluster = cluster  # type: ignore[assignment]
    owner.spawn = lambda coro: coro.close()  # type: ignore[assignment, func-returns-value]
    owner.admission = refusals = Refusals()  # type: ignore[assignment]
    owner.adopt = lambda *a, **k: pytest.fail("adopted by the overtaken claim")  # type: ignore[method-assign]
    link = Link()
    link.level = 4  # type: ignore[attr-defined]
    taken = asyncio.run(owner.take_over(link, "roamer", False, True, None))  # type: ignore[arg-type]
    assert taken is None and refusals.refused
    assert cluster.sessions == {"roamer": cluster.resumed}
    assert owner.metrics.get("claims_superseded") == 1


def let_go_of(owner: ClusterOwnership, client_id: str) -> Session:
    """A persistent session of `client_id` this node served (a QoS 2 message sent as packet id
    12), let go when the registry refused its writes."""
    session = Session(client_id=client_id, persistent=True)
    session.cursors = {"f/0": 41}
    session.first_copy("n1-a-9", 12, window=8)
    session.hold_qos2_in(7, None)  # received as packet id 7 and stored; no PUBREL yet
    session.hold_qos2_in(8, Unsettled("nem/x", "n1-a-10"))  # its send's outcome unknown
    owner.sessions[client_id] = session  # type: ignore[index]
    owner.lost_ownership([client_id])
    assert client_id not in owner.sessions
    return session


def test_a_session_let_go_is_handed_to_the_taker_the_registry_sends_here_once() -> None:
    """Found by the nemesis: a Redis failover lost this node's claim, so the registry named it
    the owner again under its older epoch; the taker the registry sent here was answered "no
    session", resumed the registry's older copy and sent 64 completed QoS 2 messages again."""
    owner, *_ = ownership({}, {}, {})
    let_go_of(owner, "roamer")
    state = json.loads(owner.release("roamer", 12))
    assert state["q2"] == [["n1-a-9", 12]] and json.loads(state["off"])
    assert state["in"] == {"7": "", "8": Unsettled("nem/x", "n1-a-10").encode().decode()}
    assert owner.release("roamer", 13) == b""  # handed over: the taker's now


def test_a_session_let_go_is_resumed_as_served_when_the_client_comes_back_here() -> None:
    owner, _, here, _ = ownership({}, {}, {})
    served = let_go_of(owner, "roamer")
    owner.cluster = OwnClaim({"subs": b'{"subs": {"older/#": 1}}', "off": b"{}"})  # type: ignore[assignment]
    adopted: list[Claim] = []

    def adopt(client_id: str, claim: Claim, **_: Any) -> Session:
        adopted.append(claim)
        return Session(client_id=client_id, persistent=True)

    owner.adopt = adopt  # type: ignore[method-assign]
    owner.spawn = lambda coro: coro.close()  # type: ignore[assignment, func-returns-value]
    taken = asyncio.run(owner.take_over(Link(), "roamer", False, True, None))  # type: ignore[arg-type]
    assert taken is True and len(adopted) == 1
    assert adopted[0].records["off"] == served.encode_offsets()  # not the registry's copy
    # The QoS 2 ids it holds until PUBREL, the stored one and the unsettled one: a resend of
    # either is not stored again (the registry's markers may have been rolled back).
    assert [packet_id for packet_id, _ in here.markers] == [7, 8]
    assert owner.metrics.snapshot()["sessions_recovered_after_rollback"] == 1


def test_what_was_let_go_is_forgotten_once_the_registry_names_a_later_owner() -> None:
    owner, *_ = ownership({}, {}, {})
    let_go_of(owner, "keeper")
    owner.cluster = Arrivals(b'{"subs": {"load/#": 1}}')  # type: ignore[assignment]
    owner.adopt = lambda client_id, claim, **_: Session(client_id=client_id, persistent=True)  # type: ignore[method-assign, assignment, return-value]
    asyncio.run(owner.take_over(Link(), "keeper", False, True, None))  # type: ignore[arg-type]
    assert len(owner.let_go) == 0
