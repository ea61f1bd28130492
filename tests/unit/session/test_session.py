"""The session state machine: packet ids, in-flight phases, committed offsets, persistence."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.router.queues import client_queue, filter_queue
from bridge.session import (
    PACKET_ID_SPACE,
    InFlight,
    Phase,
    Session,
    SubOptions,
    packet_id_for,
)


def sent_message(
    packet_id: int, queue: str, offset: int, qos: int, seq: int | None = None
) -> InFlight:
    return InFlight(
        packet_id, queue, offset, seq if seq is not None else offset, qos, "t", b"", False
    )


@given(st.integers(min_value=0, max_value=2**63))
def test_packet_id_for_any_seq_is_a_valid_nonzero_id_MQTT_2_3_1_1(seq):
    assert 1 <= packet_id_for(seq) <= PACKET_ID_SPACE


def test_packet_ids_run_from_1_to_65535_then_start_again_at_1():
    assert [packet_id_for(seq) for seq in (0, 1, PACKET_ID_SPACE - 1, PACKET_ID_SPACE)] == [
        1,
        2,
        PACKET_ID_SPACE,
        1,
    ]


def test_consecutive_seqs_get_distinct_packet_ids_across_a_full_id_space():
    ids = {packet_id_for(seq) for seq in range(1000, 1000 + PACKET_ID_SPACE)}
    assert len(ids) == PACKET_ID_SPACE


def test_qos1_message_is_done_on_puback_only():
    session = Session("c", persistent=True)
    session.track(sent_message(5, "f:a", 0, 1))
    assert session.on_pubrec(5) is None
    assert session.on_pubcomp(5) is None
    assert session.on_puback(5) is not None
    assert session.inflight == {}
    assert session.on_puback(5) is None


def test_qos2_message_moves_to_pubrel_phase_then_done_on_pubcomp():
    session = Session("c", persistent=True)
    session.track(sent_message(9, "f:a", 3, 2, seq=100))
    assert session.on_puback(9) is None
    assert session.on_pubcomp(9) is None  # PUBCOMP before PUBREC is ignored
    out = session.on_pubrec(9)
    assert out is not None and out.phase is Phase.AWAITING_PUBCOMP
    assert session.was_released(100)
    assert session.on_pubrec(9) is out  # repeated PUBREC is harmless
    assert session.on_pubcomp(9) is out
    assert session.inflight == {} and not session.was_released(100)


def test_committed_offset_is_the_lowest_unacknowledged_per_queue():
    session = Session("c", persistent=True)
    session.cursors = {"f:a": 10, "f:b": 4}
    session.track(sent_message(1, "f:a", 6, 1))
    session.track(sent_message(2, "f:a", 8, 1))
    assert session.committed("f:a") == 6
    assert session.committed("f:b") == 4
    session.on_puback(1)
    assert session.committed("f:a") == 8
    session.on_puback(2)
    assert session.committed("f:a") == 10


def test_start_queue_keeps_an_existing_cursor():
    session = Session("c", persistent=True)
    session.start_queue("f:a", 5)
    session.start_queue("f:a", 9)
    assert session.cursors["f:a"] == 5


def test_queues_are_the_private_queue_then_one_per_filter():
    session = Session("dev", persistent=False, subscriptions={"a/#": 1, "b": 0})
    assert list(session.queues()) == [client_queue("dev"), filter_queue("a/#"), filter_queue("b")]


def test_restore_round_trips_subscriptions_offsets_and_pubrel_phase():
    session = Session("dev", persistent=True, subscriptions={"a/+": 2}, shared={"$share/g/x": 1})
    session.cursors = {"f:a/+": 12, "c:dev": 3}
    session.track(sent_message(7, "f:a/+", 9, 2, seq=777))
    session.on_pubrec(7)
    restored = Session.restore("dev", session.encode_subscriptions(), session.encode_offsets())
    assert restored.subscriptions == {"a/+": 2}
    assert restored.shared == {"$share/g/x": 1}
    assert restored.cursors == {"f:a/+": 9, "c:dev": 3}  # resumes at the unacknowledged one
    assert restored.resend_below == {"f:a/+": 12, "c:dev": 3}
    assert restored.released == {777}


def test_offline_since_survives_a_restore_so_expiry_counts_from_the_disconnect():
    session = Session("dev", persistent=True, subscriptions={"a": 1})
    session.disconnected_at = 1_700_000_000.0
    restored = Session.restore("dev", session.encode_subscriptions(), session.encode_offsets())
    assert restored.disconnected_at == 1_700_000_000.0
    session.connected = True
    restored = Session.restore("dev", session.encode_subscriptions(), session.encode_offsets())
    assert restored.disconnected_at == 0.0


def test_a_new_session_reads_its_unwritten_tables_as_empty_and_they_cannot_be_written_past():
    session = Session("idle", persistent=False)
    tables = (
        session.subscriptions,
        session.inflight,
        session.shared,
        session.options,
        session.resend_below,
        session.inbound_qos2,
    )
    for table in tables:
        assert len(table) == 0
        with pytest.raises(TypeError):
            table["x"] = 1  # type: ignore[index]  # only through the session's methods
    # Nothing written, nothing kept (64 bytes of an idle connection's memory per table).
    for name in (
        "_subscriptions", "_inflight", "_shared", "_options", "_resend_below", "_inbound_qos2"
    ):  # fmt: skip
        assert getattr(session, name) is None
    assert session.window_free(20) == 20 and not session.in_flight(1)
    assert session.forget_inflight() == []
    assert session.encode_subscriptions() == b'{"subs":{},"shared":{}}'


def test_tables_written_through_the_session_read_back_and_empty_again_when_dropped():
    session = Session("dev", persistent=True)
    session.set_subscription("a/#", 1)
    session.set_subscription("b", 2)
    session.drop_subscription("b")
    session.drop_subscription("b")  # twice: nothing happens
    session.add_shared("$share/g/x", 1)
    session.set_options("a/#", SubOptions(no_local=True))
    session.set_resend_below("f:a/#", 5)
    session.hold_qos2_in(7, None)
    assert session.shared == {"$share/g/x": 1}
    assert session.options == {"a/#": SubOptions(no_local=True)}
    assert session.resend_below == {"f:a/#": 5}
    assert session.inbound_qos2 == {7: None}
    restored = Session.restore("dev", session.encode_subscriptions(), session.encode_offsets())
    assert restored.subscriptions == {"a/#": 1}
    assert restored.shared == {"$share/g/x": 1}
    assert restored.options == {"a/#": SubOptions(no_local=True)}
    session.drop_subscription("a/#")
    assert session._subscriptions is None  # the last one gone, the table goes too
    session.drop_shared("$share/g/x")
    session.drop_options("a/#")
    assert session.pop_resend_below("f:a/#") == 5
    assert session.pop_resend_below("f:a/#") is None
    session.drop_qos2_in(7)
    session.drop_qos2_in(7)  # twice: nothing happens
    assert not session.shared and not session.options
    assert not session.resend_below and not session.inbound_qos2


def test_the_in_flight_table_is_made_by_the_first_send_and_the_window_checks_read_it():
    session = Session("sub", persistent=False)
    assert session.drop_inflight(3) is None and session.on_puback(3) is None
    assert session.on_pubrec(3) is None and session.on_pubcomp(3) is None
    session.track(sent_message(3, "f:a", 0, 1))
    session.track(sent_message(4, "f:a", 1, 2))
    assert session.window_free(20) == 18
    assert session.in_flight(3) and session.in_flight(4) and not session.in_flight(5)
    assert session.drop_inflight(3) is not None and not session.in_flight(3)
    assert session.forget_inflight()[0].packet_id == 4
    assert session.window_free(20) == 20 and session._inflight is None


def test_first_copy_refuses_another_copy_of_a_key_sent_within_the_window_not_the_same_copy():
    session = Session("dev", persistent=False)
    assert session.first_copy("k1", 10, window=2)
    assert session.first_copy("k1", 10, window=2)  # the same stored copy, sent again
    assert not session.first_copy("k1", 99, window=2)  # another copy of it
    assert session.first_copy("k2", 11, window=2)
    assert not session.first_copy("k1", 98, window=2)  # two keys: k1 is still in the window
    assert session.first_copy("k3", 12, window=2)  # k1 leaves the window
    assert session.first_copy("k1", 99, window=2)
    assert session.first_copy("k4", 13, window=0) and session.first_copy("k4", 14, window=0)
    assert session.first_copy("k5", 15, window=1) and not session.first_copy("k5", 16, window=1)


def test_the_identity_a_session_belongs_to_survives_a_restore():
    session = Session("c", persistent=True, owner="user:alice")
    assert Session.restore("c", session.encode_subscriptions(), None).owner == "user:alice"
    anonymous = Session("c", persistent=True, owner="anonymous")
    assert Session.restore("c", anonymous.encode_subscriptions(), None).owner == "anonymous"


def test_a_session_record_without_an_identity_restores_unbound():
    # Written with authentication off, or by a version before sessions were bound.
    assert Session.restore("c", b'{"subs":{"a/#":1},"shared":{}}', None).owner is None
    assert b"own" not in Session("c", persistent=True).encode_subscriptions()


def test_only_an_offline_persistent_session_expires_after_its_own_interval_or_the_default():
    session = Session("c", persistent=True, disconnected_at=1000.0)
    assert not session.expired(1059.0, default_expiry=60.0)
    assert session.expired(1060.0, default_expiry=60.0)
    session.expiry = 5.0  # a 5.0 session's own interval wins
    assert session.expired(1005.0, default_expiry=60.0)
    session.connected = True
    assert not session.expired(9999.0, default_expiry=60.0)
    assert not Session("c", persistent=False).expired(9999.0, default_expiry=60.0)


def test_a_session_seen_going_offline_ages_by_the_monotonic_clock_not_the_wall_clock():
    """A wall clock that jumps an hour forward expires nothing early, and one that jumps back
    keeps nothing late: `now` (the wall clock) is not asked once the node saw it go offline."""
    session = Session("c", persistent=True, expiry=600.0)
    session.went_offline()
    assert not session.expired(time.time() + 3600, default_expiry=60.0)
    assert session.offline_seconds(time.time() + 3600) < 5.0
    session.went_offline(seconds_ago=601.0)  # offline that long by its records' clocks
    assert session.expired(time.time() - 3600, default_expiry=60.0)
    assert abs(session.disconnected_at - (time.time() - 601.0)) < 5.0


def test_every_part_of_a_persistent_session_survives_a_restore():
    session = Session("dev", persistent=True, expiry=300.0, owner="user:alice")
    session.set_subscription("a/#", 1)
    session.set_subscription("b", 2)
    session.add_shared("$share/g/x", 1)
    session.add_shared("$share/h/y", 0)
    session.set_options("a/#", SubOptions(no_local=False, retain_as_published=True, identifier=7))
    session.set_options("b", SubOptions(no_local=True))
    restored = Session.restore("dev", session.encode_subscriptions(), session.encode_offsets())
    assert restored.client_id == "dev" and restored.persistent is True
    assert restored.expiry == 300.0 and restored.owner == "user:alice"
    assert restored.subscriptions == {"a/#": 1, "b": 2}
    assert restored.shared == {"$share/g/x": 1, "$share/h/y": 0}
    assert restored.options == {
        "a/#": SubOptions(no_local=False, retain_as_published=True, identifier=7),
        "b": SubOptions(no_local=True),
    }
    unlimited = Session("dev", persistent=True).encode_subscriptions()
    assert Session.restore("dev", unlimited, None).expiry is None


def test_records_without_their_optional_parts_restore_with_the_defaults():
    restored = Session.restore("dev", b"{}", b'{"c":{"f:a":4}}')
    assert restored.subscriptions == {} and restored.shared == {} and restored.options == {}
    assert restored.cursors == {"f:a": 4} and restored.resend_below == {}
    assert restored.released is None and restored.disconnected_at == 0.0


def test_a_new_session_is_offline_since_0_has_dropped_nothing_and_its_reads_are_unjudged():
    session = Session("dev", persistent=True)
    assert session.connected is False and session.disconnected_at == 0.0
    assert session.dropped_queue_full == 0 and session.dropped_retention == 0
    assert session.reads_judged == -1 and session.read_verdicts is None


def test_adding_or_dropping_one_filter_keeps_the_others():
    session = Session("dev", persistent=True)
    session.add_shared("$share/g/x", 1)
    session.add_shared("$share/g/y", 2)
    session.set_options("a", SubOptions(no_local=True))
    session.set_options("b", SubOptions(identifier=3))
    session.drop_shared("$share/g/x")
    session.drop_options("a")
    assert session.shared == {"$share/g/y": 2}
    assert session.options == {"b": SubOptions(identifier=3)}


def test_inbound_qos2_ids_are_held_each_with_its_state():
    session = Session("dev", persistent=True)
    session.hold_qos2_in(1, "stored")
    session.hold_qos2_in(2, "writing")
    assert session.inbound_qos2 == {1: "stored", 2: "writing"}


def test_asking_about_what_a_session_never_had_answers_nothing():
    session = Session("dev", persistent=True)
    assert session.committed("f:never") == 0
    assert session.drop_inflight(9) is None and session.pop_resend_below("f:never") is None
    session.track(sent_message(1, "f:a", 5, 1))
    assert session.drop_inflight(9) is None and session.committed("f:never") == 0


def test_a_message_in_flight_keeps_what_it_was_made_with():
    out = InFlight(5, "q", 3, 9, 2, "t/1", b"x", True, Phase.AWAITING_PUBCOMP, "m")
    assert (out.topic, out.payload, out.retain, out.message) == ("t/1", b"x", True, "m")


def test_the_qos2_copies_a_session_was_sent_go_with_it_and_hold_back_a_second_copy():
    """Found by the nemesis: two stored copies of one QoS 2 message (two nodes' sends that both
    timed out in a partition and both landed when it healed), the first sent by the node that
    held the session, the second read by the node it moved to, which sent it again."""
    here = Session("roam", persistent=True)
    assert here.first_copy("n3-1-7", seq=40, window=8)
    moved = Session("roam", persistent=True)
    moved.remember_qos2_copies(here.qos2_copies_sent(), window=8)
    assert not moved.first_copy("n3-1-7", seq=90, window=8)  # the second copy
    assert moved.first_copy("n3-1-7", seq=40, window=8)  # the first one again (a resend)


def test_copies_taken_over_count_as_the_oldest_and_the_window_stays_bounded():
    session = Session("roam", persistent=True)
    session.first_copy("sent-here", seq=5, window=3)
    session.remember_qos2_copies([("a", 1), ("b", 2), ("c", 3)], window=3)
    assert [k for k, _ in session.qos2_copies_sent()] == ["b", "c", "sent-here"]
    session.remember_qos2_copies([("d", 4)], window=0)
    assert len(session.qos2_copies_sent()) == 3


def test_a_qos2_message_completed_above_an_unacknowledged_one_is_not_sent_again_after_a_restore():
    """The client may forget a QoS 2 packet id once it has PUBCOMPed: a restore that resumes
    below such a message (an older one of its queue still unacknowledged) must not send its
    PUBLISH again, only a PUBREL the client answers with PUBCOMP."""
    session = Session("dev", persistent=True, subscriptions={"a/#": 2})
    session.cursors = {"f:a/#": 12}
    session.track(sent_message(1, "f:a/#", 9, 1, seq=900))  # QoS 1, not yet acknowledged
    session.track(sent_message(2, "f:a/#", 10, 2, seq=901))
    session.track(sent_message(3, "f:a/#", 11, 2, seq=902))
    session.on_pubrec(2)
    session.on_pubcomp(2)  # done above the unacknowledged offset 9
    session.on_pubrec(3)  # in its PUBREL phase
    restored = Session.restore("dev", session.encode_subscriptions(), session.encode_offsets())
    assert restored.cursors == {"f:a/#": 9}
    assert restored.was_released(901) and restored.was_released(902)


def test_a_completed_qos2_message_is_forgotten_once_everything_below_it_is_acknowledged():
    session = Session("dev", persistent=True, subscriptions={"a/#": 2})
    session.cursors = {"f:a/#": 12}
    session.track(sent_message(1, "f:a/#", 9, 1, seq=900))
    session.track(sent_message(2, "f:a/#", 10, 2, seq=901))
    session.on_pubrec(2)
    session.on_pubcomp(2)
    session.on_puback(1)
    restored = Session.restore("dev", session.encode_subscriptions(), session.encode_offsets())
    assert restored.cursors == {"f:a/#": 12}
    assert not restored.was_released(901)
    assert session.encode_offsets() == restored.encode_offsets()  # nothing left to carry


def test_resend_marks_past_the_cursor_go_with_the_session_to_its_next_node():
    """A session taken from a node whose sends are unknown marks its queues up to their ends
    for DUP; handed on before it read that far, the next node must mark them too."""
    session = Session("dev", persistent=True, subscriptions={"a/#": 1})
    session.cursors = {"f:a/#": 5, "c:dev": 2}
    session.resend_below = {"f:a/#": 12}
    restored = Session.restore("dev", session.encode_subscriptions(), session.encode_offsets())
    assert restored.cursors == {"f:a/#": 5, "c:dev": 2}
    assert restored.resend_below == {"f:a/#": 12, "c:dev": 2}
