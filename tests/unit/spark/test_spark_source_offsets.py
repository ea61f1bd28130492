"""Pure parts of the `rocketmq` Spark source: option checks, offset JSON, the per-trigger cut."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.storage.rocketmq import Credentials, TlsOptions
from spark.options import OptionError, client_security, parse_options
from spark.rocketmq_reader import (
    DataLossError,
    QueueRange,
    advance,
    from_json,
    limit_range,
    split_ranges,
    to_json,
)
from spark.source import _at_most, _Offsets


def test_filter_without_wildcards_is_pushed_to_the_broker_as_a_tag() -> None:
    options = parse_options({"nameserver": "h:1", "topicFilter": "factory/L1/d1"}, streaming=False)
    assert options.tag_expression == "factory/L1/d1"
    assert options.topics == ("factory",)
    wildcard = parse_options({"nameserver": "h:1", "topicFilter": "factory/+/d1"}, streaming=False)
    assert wildcard.tag_expression == "*"


def test_a_wildcard_first_level_reads_every_topic_and_topics_are_mapped_like_the_bridge() -> None:
    assert parse_options({"nameserver": "h:1", "topicFilter": "+/x"}, streaming=True).topics is None
    named = parse_options({"nameserver": "h:1", "topics": "pay, $SYS"}, streaming=True)
    assert named.topics == ("pay", "|24SYS")


def test_defaults_follow_batch_and_stream_conventions() -> None:
    assert parse_options({"nameserver": "h:1"}, streaming=False).starting == "earliest"
    assert parse_options({"nameserver": "h:1"}, streaming=True).starting == "latest"


@pytest.mark.parametrize(
    ("options", "streaming", "message"),
    [
        ({"path": "/d", "nameserver": "h:1"}, False, "exactly one"),
        ({"nameserver": "h:1", "endingOffsets": "latest"}, True, "endingOffsets"),
        ({"nameserver": "h:1", "endingTimestamp": "1700000000000"}, True, "endingTimestamp: only"),
        ({"nameserver": "h:1", "maxMessagesPerTrigger": "0"}, True, "at least 1"),
        ({"nameserver": "h:1", "failOnDataLoss": "maybe"}, False, "failOnDataLoss"),
        ({"nameserver": "h:1", "topicFilter": "$share/g/a"}, False, "shared"),
        ({"nameserver": "h:1", "startingOffsets": "[1]"}, False, "startingOffsets"),
        ({"nameserver": "h:1", "requestTimeout": "soon"}, False, "requestTimeout"),
        ({"nameserver": "h:1", "accessKey": "u"}, False, "option secretKey: .*go together"),
        ({"nameserver": "h:1", "secretKey": "s"}, False, "option accessKey: .*go together"),
        ({"nameserver": "h:1", "tlsCaFile": "/ca.pem"}, False, "option tlsCaFile: needs .*tls"),
        ({"nameserver": "h:1", "tls": "yes"}, False, "option tls: true or false"),
        (
            {"nameserver": "h:1", "tls": "true", "tlsCaFile": "/nonexistent.pem"},
            False,
            "option tlsCaFile: cafile: cannot load",
        ),
    ],
)
def test_bad_options_name_the_option(options: dict, streaming: bool, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        parse_options(options, streaming=streaming)


@pytest.mark.parametrize(
    ("habit", "suggestion"),
    [
        ("maxOffsetsPerTrigger", "did you mean maxMessagesPerTrigger"),
        ("startingOffset", "did you mean startingOffsets"),
        ("namesrv", "did you mean nameserver"),
        ("kafka.bootstrap.servers", "no such option \\(docs"),
    ],
)
def test_an_unknown_option_is_refused_with_the_nearest_known_one(
    habit: str, suggestion: str
) -> None:
    with pytest.raises(OptionError, match=f"option {habit}: .*{suggestion}"):
        parse_options({"nameserver": "h:1", habit: "1"}, streaming=True)


def test_every_known_option_is_accepted_in_any_case() -> None:
    options = {name.upper(): value for name, value in {
        "nameserver": "h:1", "topicFilter": "factory/#", "maxMessagesPerTrigger": "5",
        "failOnDataLoss": "false", "consumerGroup": "g",
    }.items()}  # fmt: skip
    parsed = parse_options(options, streaming=True)
    assert (parsed.max_per_trigger, parsed.fail_on_data_loss) == (5, False)


def test_credentials_and_tls_options_reach_the_client_and_the_secret_is_not_in_the_repr() -> None:
    options = parse_options(
        {"nameserver": "h:1", "accessKey": "spark", "secretKey": "hunter2", "tls": "true"},
        streaming=False,
    )
    assert "hunter2" not in repr(options)
    credentials, tls = client_security(options)
    assert credentials == Credentials("spark", "hunter2")
    assert tls == TlsOptions()
    assert client_security(parse_options({"nameserver": "h:1"}, streaming=False)) == (None, None)


def test_offsets_json_round_trip() -> None:
    offsets = {("factory", "broker-a", 0): 12, ("factory", "broker-a", 3): 0, ("pay", "b:x", 1): 5}
    assert from_json(to_json(offsets)) == offsets
    assert to_json(offsets)["factory"] == {"broker-a:0": 12, "broker-a:3": 0}


queues = st.dictionaries(
    st.tuples(st.just("t"), st.sampled_from(["a", "b"]), st.integers(0, 7)),
    st.tuples(st.integers(0, 1000), st.integers(0, 1000)),
    max_size=10,
)


@given(queues, st.integers(1, 3000))
def test_the_per_trigger_cut_never_exceeds_the_limit_and_shares_fairly(
    ranges: dict, limit: int
) -> None:
    start = {q: lo for q, (lo, _) in ranges.items()}
    end = {q: lo + length for q, (lo, length) in ranges.items()}
    cut = limit_range(start, end, limit)
    taken = {q: cut[q] - start[q] for q in end}
    assert all(0 <= taken[q] <= end[q] - start[q] for q in end)
    backlog = sum(end[q] - start[q] for q in end)
    assert sum(taken.values()) == min(limit, backlog)
    # Fair: a queue gets less than another only if it had nothing more to give.
    for q in end:
        for other in end:
            if taken[q] + 1 < taken[other]:
                assert taken[q] == end[q] - start[q]


A0, A1 = ("factory", "broker-a", 0), ("factory", "broker-a", 1)


def test_a_queue_that_went_back_fails_the_stream_naming_it_with_fail_on_data_loss() -> None:
    with pytest.raises(DataLossError, match=r"queue factory broker-a:1: .*went back from 50 to 3"):
        advance({A0: 10, A1: 50}, {A0: 12, A1: 3}, fail_on_data_loss=True)


def test_a_queue_that_went_back_is_read_again_from_its_start_without_fail_on_data_loss() -> None:
    options = parse_options({"nameserver": "h:1"}, streaming=True)

    ends, starts = advance({A0: 10, A1: 50}, {A0: 12, A1: 3}, fail_on_data_loss=False)
    parts = _Offsets(options).partitions(to_json({A0: 10, A1: 50}), to_json(ends), streaming=True)

    assert ends == {A0: 12, A1: 3} and starts == {A0: 10, A1: 0}
    ranges = sorted((p.value.queue, p.value.start, p.value.end) for p in parts)
    assert ranges == [(0, 10, 12), (1, 0, 3)]
    # The next trigger goes on from there as from any offset.
    assert advance(ends, {A0: 12, A1: 5}, fail_on_data_loss=False) == (
        {A0: 12, A1: 5},
        {A0: 12, A1: 3},
    )


def test_a_batch_read_with_an_end_before_its_start_reads_nothing_of_that_queue() -> None:
    options = parse_options({"nameserver": "h:1"}, streaming=False)
    parts = _Offsets(options).partitions(to_json({A0: 10, A1: 50}), to_json({A0: 12, A1: 3}))
    assert [(p.value.queue, p.value.start, p.value.end) for p in parts] == [(0, 10, 12)]


def test_a_queue_read_again_keeps_its_place_under_trigger_available_now() -> None:
    start, target = to_json({A0: 10, A1: 50}), to_json({A0: 20, A1: 50})
    assert _at_most(to_json({A0: 30, A1: 3}), target, start) == to_json({A0: 20, A1: 3})


@given(
    st.dictionaries(st.sampled_from([A0, A1]), st.integers(0, 100), min_size=1),
    st.dictionaries(st.sampled_from([A0, A1]), st.integers(0, 100)),
)
def test_queues_that_did_not_go_back_advance_to_their_end_and_unlisted_ones_stay(
    begin: dict, ends: dict
) -> None:
    ends = {q: max(e, begin.get(q, 0)) for q, e in ends.items()}
    merged, starts = advance(begin, ends, fail_on_data_loss=True)
    assert merged == {**begin, **ends}
    assert starts == begin


ranges = st.lists(
    st.tuples(st.integers(0, 1000), st.integers(1, 500)).map(lambda t: (t[0], t[0] + t[1])),
    min_size=1,
    max_size=6,
)


@given(ranges, st.integers(1, 40))
def test_min_partitions_splits_ranges_into_contiguous_pieces_covering_exactly_the_same_offsets(
    spans: list[tuple[int, int]], min_partitions: int
) -> None:
    queues = [QueueRange("t", "b", i, lo, hi) for i, (lo, hi) in enumerate(spans)]

    pieces = split_ranges(queues, min_partitions)

    total = sum(hi - lo for lo, hi in spans)
    assert len(pieces) >= min(min_partitions, total)
    assert all(p.end > p.start for p in pieces)
    for q in queues:
        mine = [p for p in pieces if p.queue == q.queue]
        assert mine[0].start == q.start and mine[-1].end == q.end
        assert all(a.end == b.start for a, b in pairwise(mine))


def test_min_partitions_is_a_positive_integer() -> None:
    assert (
        parse_options({"nameserver": "h:1", "minPartitions": "6"}, streaming=False).min_partitions
        == 6
    )
    with pytest.raises(OptionError, match="option minPartitions: must be at least 1"):
        parse_options({"nameserver": "h:1", "minPartitions": "0"}, streaming=False)
