"""Pure parts of the `rocketmq` Spark source: option checks, offset JSON, the per-trigger cut."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.storage.rocketmq import Credentials, TlsOptions
from spark.options import OptionError, client_security, parse_options
from spark.rocketmq_reader import from_json, limit_range, to_json


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
