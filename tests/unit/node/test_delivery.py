"""A client's pull task (`bridge.node.delivery`) and housekeeping (`bridge.node.housekeeping`),
without a node: each is handed a real embedded store and the narrow roles it needs (a client
link that records what it was sent, a session owner that records what it was asked)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

from bridge.config import Config
from bridge.counters import Metrics
from bridge.mqtt import codec
from bridge.mqtt.codec import Decoder
from bridge.mqtt.packets import Publish, Pubrel
from bridge.node.congestion import Congestion
from bridge.node.delivery import Delivery
from bridge.node.housekeeping import Housekeeper
from bridge.router.queues import client_queue, filter_queue
from bridge.session import Session
from bridge.state import KIND_OFFSETS, RETAINED_DELIVERY
from bridge.storage import FileLogStore, Message
from bridge.storage.base import StaleOwner, StoreTraits


class RecordingLink:
    """A client connection that keeps the packets it was sent, decoded."""

    def __init__(self) -> None:
        self.client_id = "dev"
        self.username: str | None = None
        self.closed = False
        self.writable = True
        self.msgs_out = 0
        self.payload_out = 0
        self.closed_for = ""
        self._decoder = Decoder()
        self.packets: list[Any] = []

    def send(self, data: bytes) -> None:
        self._decoder.feed(data)
        self.packets.extend(self._decoder.packets())

    level = 4
    shared_encoding = 4
    max_packet_out = 268_435_460
    receive_window = 65535

    def screen_delivery(self, topic: str) -> bool:
        return True

    def encode_message(
        self,
        message: Any,
        qos: int,
        retain: bool,
        dup: bool = False,
        packet_id: int | None = None,
        sub_ids: tuple[int, ...] = (),
    ) -> bytes:
        return codec.encode_publish(message.topic, message.payload, qos, retain, dup, packet_id)

    def send_message(self, data: bytes, payload_size: int, *, metered: bool = True) -> None:
        if metered:
            self.msgs_out += 1
            self.payload_out += payload_size
        self.send(data)

    def close(self, reason: str, **_: Any) -> None:
        self.closed = True
        self.closed_for = reason

    def publishes(self) -> list[Publish]:
        return [p for p in self.packets if isinstance(p, Publish)]


class RecordingOwner:
    """A session owner that records the sessions it was asked to let go of."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[Any]] = []
        self.lost: list[str] = []
        self.expired: list[str] = []

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.append(task)
        return task

    def lost_ownership(self, client_ids: list[str]) -> None:
        self.lost.extend(client_ids)

    async def expire(self, sessions: list[Session]) -> None:
        self.expired.extend(s.client_id for s in sessions)


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


async def open_store(path: Path) -> FileLogStore:
    store = FileLogStore(path, fsync=False)
    await store.open()
    return store


async def put(store: FileLogStore, topic: str, qos: int, queues: list[str], **props: str) -> None:
    await store.append(Message(topic, topic.encode(), qos, properties=dict(props)), queues)


def make_keeper(store: FileLogStore, sessions: dict[str, Session], **limits: Any):
    owner = RecordingOwner()
    keeper = Housekeeper(
        config=Config(**limits), store=store, metrics=Metrics(), sessions=sessions, owner=owner
    )
    return keeper, owner


async def delivered(delivery: Delivery) -> None:
    """Run one pull and wait for it to end."""
    delivery.wake()
    for _ in range(100):
        if not delivery.running:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the pull did not end")


class RecordingPace:
    """Congestion control as a delivery sees it: told when a pass ends and when it stops."""

    def __init__(self) -> None:
        self.passes = 0
        self.stopped = False

    def read(self, session: Session) -> None:
        self.passes += 1

    def gone(self, session: Session) -> None:
        self.stopped = True


def make_delivery(store, session, link, keeper, max_inflight: int = 20, **more: Any) -> Delivery:
    return Delivery(
        session,
        link,
        store=store,
        metrics=Metrics(),
        offsets=keeper,
        pace=RecordingPace(),
        max_inflight=max_inflight,
        **more,
    )


def test_delivery_sends_queued_messages_in_order_and_stops_at_the_window(tmp_path):
    async def scenario() -> None:
        store = await open_store(tmp_path)
        session = Session("dev", persistent=True, subscriptions={"t/#": 1})
        session.start_queue(filter_queue("t/#"), 0)
        for i in range(5):
            await put(store, f"t/{i}", 1, [filter_queue("t/#")])
        keeper, _owner = make_keeper(store, {"dev": session})
        link = RecordingLink()
        delivery = make_delivery(store, session, link, keeper, max_inflight=3)
        await delivered(delivery)
        assert [p.topic for p in link.publishes()] == ["t/0", "t/1", "t/2"]
        assert delivery.blocked_on_window and len(session.inflight) == 3
        for packet in link.publishes():  # the client acknowledges: the window frees
            session.on_puback(packet.packet_id)
        await delivered(delivery)
        assert [p.topic for p in link.publishes()] == ["t/0", "t/1", "t/2", "t/3", "t/4"]
        assert session.cursors[filter_queue("t/#")] == 5
        await store.close()

    run(scenario())


def test_a_message_on_two_filters_goes_out_once_at_the_higher_qos(tmp_path):
    async def scenario() -> None:
        store = await open_store(tmp_path)
        session = Session("dev", persistent=False, subscriptions={"a/+": 0, "a/#": 2})
        queues = [filter_queue("a/+"), filter_queue("a/#")]
        for queue in queues:
            session.start_queue(queue, 0)
        await put(store, "a/b", 2, queues)
        keeper, _owner = make_keeper(store, {"dev": session})
        link = RecordingLink()
        await delivered(make_delivery(store, session, link, keeper))
        assert [(p.topic, p.qos) for p in link.publishes()] == [("a/b", 2)]
        await store.close()

    run(scenario())


def test_granted_qos_caps_the_message_qos_and_retained_copies_carry_retain(tmp_path):
    async def scenario() -> None:
        store = await open_store(tmp_path)
        session = Session("dev", persistent=False, subscriptions={"x": 0})
        session.start_queue(filter_queue("x"), 0)
        session.start_queue(client_queue("dev"), 0)
        await put(store, "x", 1, [filter_queue("x")])
        await put(store, "r", 2, [client_queue("dev")], **{RETAINED_DELIVERY: "1"})
        keeper, _owner = make_keeper(store, {"dev": session})
        link = RecordingLink()
        await delivered(make_delivery(store, session, link, keeper))
        sent = sorted((p.topic, p.qos, p.retain) for p in link.publishes())
        assert sent == [("r", 1, True), ("x", 0, False)]
        assert link.msgs_out == 2 and link.payload_out == 2
        await store.close()

    run(scenario())


def test_resent_messages_carry_dup_and_released_qos2_messages_resume_with_pubrel(tmp_path):
    async def scenario() -> None:
        store = await open_store(tmp_path)
        queue = filter_queue("q")
        session = Session("dev", persistent=True, subscriptions={"q": 2})
        session.start_queue(queue, 0)
        await put(store, "q", 2, [queue])
        await put(store, "q", 2, [queue])
        first = (await store.read(queue, 0, 1)).messages[0]
        session.set_resend_below(queue, 2)  # both were sent before a reconnect
        session.released = {first.seq}  # and the first one's PUBREC had arrived
        keeper, _owner = make_keeper(store, {"dev": session})
        link = RecordingLink()
        await delivered(make_delivery(store, session, link, keeper))
        assert isinstance(link.packets[0], Pubrel)
        assert [(p.dup, p.qos) for p in link.publishes()] == [(True, 2)]
        assert link.msgs_out == 0, "a resend is not metered twice"
        await store.close()

    run(scenario())


def test_a_slow_socket_pauses_delivery_until_it_is_writable(tmp_path):
    async def scenario() -> None:
        store = await open_store(tmp_path)
        session = Session("dev", persistent=False, subscriptions={"t": 1})
        session.start_queue(filter_queue("t"), 0)
        await put(store, "t", 1, [filter_queue("t")])
        keeper, _owner = make_keeper(store, {"dev": session})
        link = RecordingLink()
        link.writable = False
        delivery = make_delivery(store, session, link, keeper)
        await delivered(delivery)
        assert link.publishes() == [] and session.cursors[filter_queue("t")] == 0
        link.writable = True
        await delivered(delivery)
        assert len(link.publishes()) == 1
        await store.close()

    run(scenario())


def test_housekeeping_trims_an_offline_backlog_over_its_limit_oldest_first(tmp_path):
    async def scenario() -> None:
        store = await open_store(tmp_path)
        queue = filter_queue("t")
        session = Session("dev", persistent=True, subscriptions={"t": 1})
        session.start_queue(queue, 0)
        for _ in range(20):
            await put(store, "t", 1, [queue])
        keeper, owner = make_keeper(store, {"dev": session}, max_queued_messages=10)
        assert keeper.over_limits(session)
        keeper.trim_if_over_limits("dev")
        await asyncio.gather(*owner.tasks)
        assert session.cursors[queue] == 11, "the 11 oldest go, leaving 90% of the limit"
        assert session.dropped_queue_full == 11
        assert keeper.metrics.get("dropped_queue_full") == 11
        assert not keeper.over_limits(session)
        await store.close()

    run(scenario())


def test_housekeeping_flushes_moved_offsets_of_persistent_sessions_only(tmp_path):
    async def scenario() -> None:
        store = await open_store(tmp_path)
        durable = Session("keep", persistent=True, subscriptions={"t": 1})
        durable.cursors[filter_queue("t")] = 7
        clean = Session("clean", persistent=False)
        keeper, _owner = make_keeper(store, {"keep": durable, "clean": clean})
        keeper.mark_offsets_dirty(durable)
        keeper.mark_offsets_dirty(clean)
        await keeper.flush_offsets(durable=True)
        assert set(store.meta(KIND_OFFSETS)) == {"keep"}
        assert Session.restore("keep", b"{}", store.meta(KIND_OFFSETS)["keep"]).cursors == {
            filter_queue("t"): 7
        }
        await store.close()

    run(scenario())


class RefusingStore:
    """A store whose keyed writes are refused: the sessions moved to another node. (A wrapper:
    the compiled store's methods cannot be replaced on an instance.)"""

    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def put_meta(self, updates: Any, *, durable: bool = True) -> None:
        raise StaleOwner(["moved"])


def test_housekeeping_lets_go_of_sessions_another_node_owns(tmp_path):
    async def scenario() -> None:
        store = await open_store(tmp_path)
        moved = Session("moved", persistent=True)
        keeper, owner = make_keeper(RefusingStore(store), {"moved": moved})
        keeper.mark_offsets_dirty(moved)
        await keeper.flush_offsets(durable=False)
        assert owner.lost == ["moved"]
        await store.close()

    run(scenario())


@pytest.mark.parametrize("offline_for, expired", [(10.0, ["old"]), (1.0, [])])
def test_housekeeping_expires_sessions_offline_longer_than_the_limit(
    tmp_path, offline_for, expired
):
    async def scenario() -> None:
        store = await open_store(tmp_path)
        old = Session("old", persistent=True, disconnected_at=100.0)
        online = Session("on", persistent=True, connected=True, disconnected_at=1.0)
        keeper, owner = make_keeper(store, {"old": old, "on": online}, session_expiry_seconds=5.0)
        await keeper.expire_sessions(100.0 + offline_for)
        assert owner.expired == expired
        await store.close()

    run(scenario())


class AckHoldingLink(RecordingLink):
    """A publisher's connection that records why its acknowledgements are held."""

    def __init__(self) -> None:
        super().__init__()
        self.holds: set[str] = set()

    def hold_acks(self, reason: str) -> None:
        self.holds.add(reason)

    def release_acks(self, reason: str) -> None:
        self.holds.discard(reason)


async def lagging(
    tmp_path, *, persistent: bool, backlog: int, limit: int, metrics: Metrics | None = None,
    own: AckHoldingLink | None = None,
) -> tuple[FileLogStore, str, Session, AckHoldingLink, Congestion]:  # fmt: skip
    """A store whose queue "t" holds `backlog` messages its subscriber "slow" has not read, and
    the congestion of a node whose limit is `limit` messages, with publisher "pub" (and "slow"
    publishing too if `own`)."""
    store = await open_store(tmp_path)
    queue = filter_queue("t")
    session = Session("slow", persistent=persistent, subscriptions={"t": 1})
    session.start_queue(queue, 0)
    for _ in range(backlog):
        await put(store, "t", 1, [queue])
    publisher = AckHoldingLink()
    connections = {"pub": publisher} if own is None else {"pub": publisher, "slow": own}
    congestion = Congestion(
        config=Config(max_queued_messages=limit),
        store=store,
        metrics=metrics or Metrics(),
        connections=connections,
        deliveries={"slow": make_delivery(store, session, RecordingLink(), None)},
    )
    return store, queue, session, publisher, congestion


def test_a_subscriber_past_its_limit_holds_its_publishers_acks_until_it_catches_up(tmp_path):
    async def scenario() -> None:
        metrics, own = Metrics(), AckHoldingLink()
        store, queue, session, publisher, congestion = await lagging(
            tmp_path, persistent=False, backlog=12, limit=10, metrics=metrics, own=own
        )
        congestion.stored("pub", [queue], ["slow", "elsewhere"])
        congestion.stored("slow", [queue], ["slow"])  # never for a client's own backlog
        assert publisher.holds == {"slow"} and own.holds == set()
        assert congestion.holding("slow") == {"pub"}
        assert metrics.get("publishers_slowed") == 1
        session.cursors[queue] = 2  # 10 left: within the limit, not yet at 90% of it
        congestion.read(session)
        assert publisher.holds == {"slow"}
        session.cursors[queue] = 3  # 9 left: 90%
        congestion.read(session)
        assert publisher.holds == set() and congestion.holding("slow") == frozenset()
        congestion.stored("pub", [queue], ["slow"])  # within the limit now: nothing held
        assert publisher.holds == set()
        await store.close()

    run(scenario())


def test_a_commit_pass_checks_a_publishers_subscribers_once_per_plan_and_each_pass_anew(
    tmp_path,
):
    async def scenario() -> None:
        store, queue, session, publisher, congestion = await lagging(
            tmp_path, persistent=False, backlog=12, limit=10
        )
        queues, readers = [queue], ["slow"]
        session.cursors[queue] = 12  # caught up
        congestion.stored("pub", queues, readers, 1)
        assert publisher.holds == set()
        # Within a pass nothing moves; moving the cursor here shows the check is not redone
        # for the same plan, and is redone for another plan or in the next pass.
        session.cursors[queue] = 0
        congestion.stored("pub", queues, readers, 1)
        assert publisher.holds == set(), "the same pass and plan: checked once"
        congestion.stored("pub", [queue], readers, 1)
        assert publisher.holds == {"slow"}, "another plan's queues are checked"
        congestion.gone(session)
        assert publisher.holds == set()
        congestion.stored("pub", queues, readers, 2)
        assert publisher.holds == {"slow"}, "the next pass checks again"
        congestion.gone(session)
        congestion.stored("pub", queues, readers)
        congestion.stored("pub", queues, readers)
        assert publisher.holds == {"slow"}, "without a pass every message is checked"
        await store.close()

    run(scenario())


def test_a_subscriber_that_leaves_releases_the_publishers_it_held(tmp_path):
    async def scenario() -> None:
        store, queue, session, publisher, congestion = await lagging(
            tmp_path, persistent=True, backlog=5, limit=2
        )
        congestion.stored("pub", [queue], ["slow"])
        assert publisher.holds == {"slow"}
        congestion.gone(session)
        assert publisher.holds == set()
        await store.close()

    run(scenario())


def test_delivery_tells_its_pace_when_a_pass_ends_and_when_it_stops(tmp_path):
    async def scenario() -> None:
        store = await open_store(tmp_path)
        session = Session("dev", persistent=False, subscriptions={"t": 1})
        session.start_queue(filter_queue("t"), 0)
        await put(store, "t", 1, [filter_queue("t")])
        keeper, _owner = make_keeper(store, {"dev": session}, max_queued_messages=0)
        delivery = make_delivery(store, session, RecordingLink(), keeper)
        await delivered(delivery)
        assert delivery.pace.passes == 1
        assert session.cursors[filter_queue("t")] == 1, "an online session is never trimmed"
        delivery.stop()
        assert delivery.pace.stopped
        await store.close()

    run(scenario())


class ParkingStore:
    """The real embedded store, except that reads of one queue park until released (as a pull
    of a light queue the broker has not filled yet waits in RocketMQ)."""

    traits = StoreTraits(
        atomic_meta=True, local_ends=True, early_reads=False, cached_reads=False,
        exact_backlog_bytes=True,
    )  # fmt: skip
    """Every read is awaited, as on RocketMQ."""

    def __init__(self, store: FileLogStore, parked: str) -> None:
        self.store = store
        self.parked = parked
        self.release = asyncio.Event()
        self.parked_reads = 0

    def end_offset(self, queue: str) -> int:
        return self.store.end_offset(queue)

    def queue_of_part(self, part: str) -> str | None:
        return self.store.queue_of_part(part)

    async def read(self, queue: str, offset: int, limit: int):
        if queue == self.parked:
            self.parked_reads += 1
            await self.release.wait()
        return await self.store.read(queue, offset, limit)


def test_a_parked_read_of_one_queue_does_not_hold_up_the_clients_other_queues(tmp_path):
    async def scenario() -> None:
        store = await open_store(tmp_path)
        slow, fast = filter_queue("slow/#"), filter_queue("fast/#")
        session = Session("dev", persistent=False, subscriptions={"slow/#": 1, "fast/#": 1})
        session.start_queue(slow, 0)
        session.start_queue(fast, 0)
        await put(store, "slow/1", 1, [slow])
        for i in range(3):
            await put(store, f"fast/{i}", 1, [fast])
        parking = ParkingStore(store, slow)
        keeper, _owner = make_keeper(store, {"dev": session})
        link = RecordingLink()
        delivery = Delivery(
            session,
            link,
            store=parking,  # type: ignore[arg-type]
            metrics=Metrics(),
            offsets=keeper,
            pace=RecordingPace(),
            max_inflight=20,
        )
        delivery.wake()
        for _ in range(100):
            if len(link.publishes()) == 3:
                break
            await asyncio.sleep(0.01)
        assert [p.topic for p in link.publishes()] == ["fast/0", "fast/1", "fast/2"]
        assert parking.parked_reads == 1 and delivery.running, "the slow queue's read still waits"
        parking.release.set()
        await delivered(delivery)
        assert sorted(p.topic for p in link.publishes()) == ["fast/0", "fast/1", "fast/2", "slow/1"]
        delivery.stop()
        await store.close()

    run(scenario())


def test_a_second_stored_copy_of_a_qos2_message_is_not_sent_a_first_copy_resent_is(tmp_path):
    """A resend the store could not settle is stored again under the first copy's key
    (bridge.node.qos2_in); a subscriber that was sent the first copy gets only that one, at
    QoS 2. A subscriber granted QoS 1 may get both, as QoS 1 allows."""

    async def scenario() -> None:
        store = await open_store(tmp_path)
        exactly = Session("exactly", persistent=False, subscriptions={"pay/#": 2})
        once_or_more = Session("once-or-more", persistent=False, subscriptions={"pay/#": 1})
        for session in (exactly, once_or_more):
            session.start_queue(filter_queue("pay/#"), 0)
        for payload in (b"first copy", b"other", b"second copy"):
            key = "pub-7" if payload.endswith(b"copy") else "pub-8"
            message = Message("pay/1", payload, 2, key=key)
            await store.append(message, [filter_queue("pay/#")])
        keeper, _owner = make_keeper(store, {"exactly": exactly, "once-or-more": once_or_more})
        got = {}
        for session in (exactly, once_or_more):
            link = RecordingLink()
            delivery = make_delivery(store, session, link, keeper, qos2_copy_window=16)
            await delivered(delivery)
            got[session.client_id] = [p.payload for p in link.publishes()]
            if session is exactly:
                assert delivery.metrics.get("qos2_copies_skipped") == 1
                assert session.cursors[filter_queue("pay/#")] == 3  # passed, not stuck
        assert got["exactly"] == [b"first copy", b"other"]
        assert got["once-or-more"] == [b"first copy", b"other", b"second copy"]
        await store.close()

    run(scenario())
