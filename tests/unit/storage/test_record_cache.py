"""The file log's record cache: bounded in bytes and entries, oldest out first, never a record
that is not durable yet; rollback and retention forget exactly what they name."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bridge.storage.base import Message
from bridge.storage.filelog.index import RecordCache

_MESSAGE = Message("t", b"x", qos=1)


def _fill(cache: RecordCache, lengths: list[int], pinned_from: int) -> list[int]:
    """Add one record per length at increasing seqs (each seq its position in the log)."""
    seqs = []
    seq = 0
    for length in lengths:
        cache.add(seq, length, (_MESSAGE, ("q",), 1), pinned_from)
        seqs.append(seq)
        seq += length
    return seqs


@given(
    st.lists(st.integers(min_value=1, max_value=300), max_size=400),
    st.integers(min_value=1, max_value=2_000),
    st.integers(min_value=1, max_value=50),
)
def test_the_newest_records_stay_within_the_bounds(
    lengths: list[int], budget: int, max_entries: int
) -> None:
    cache = RecordCache(budget, max_entries)
    seqs = _fill(cache, lengths, pinned_from=1 << 62)  # everything durable
    kept = list(cache.entries)
    assert kept == seqs[len(seqs) - len(kept) :], "the newest are kept, in order"
    assert len(kept) <= max_entries
    assert cache.bytes == sum(lengths[len(seqs) - len(kept) :]) <= budget or len(kept) == 0
    if len(kept) < len(seqs):  # one more would have broken a bound
        first = len(seqs) - len(kept) - 1
        assert cache.bytes + lengths[first] > budget or len(kept) + 1 > max_entries


def test_records_not_yet_durable_are_never_evicted() -> None:
    cache = RecordCache(budget=100, max_entries=2)
    seqs = _fill(cache, [50] * 6, pinned_from=100)  # seqs 0, 50 durable; 100.. pinned
    assert list(cache.entries) == seqs[2:]
    assert cache.bytes == 200
    cache.evict(pinned_from=1 << 62)  # the commit made them durable
    assert list(cache.entries) == seqs[4:]
    assert cache.bytes == 100


def test_rollback_and_retention_forget_exactly_their_records() -> None:
    cache = RecordCache(budget=1 << 30, max_entries=10_000)
    seqs = _fill(cache, [10] * 50, pinned_from=1 << 62)
    cache.drop_from(seqs[40])
    cache.drop_below(seqs[5])
    assert list(cache.entries) == seqs[5:40]
    assert cache.bytes == 350
    more = [s + seqs[40] for s in range(0, 100, 10)]
    for seq in more:  # the log goes on from the rolled-back position
        cache.add(seq, 10, (_MESSAGE, ("q",), 1), 1 << 62)
    assert list(cache.entries) == seqs[5:40] + more


def test_a_long_run_of_evictions_keeps_the_bookkeeping_small() -> None:
    cache = RecordCache(budget=1 << 30, max_entries=100)
    _fill(cache, [1] * 20_000, pinned_from=1 << 62)
    assert len(cache.entries) == 100
    assert cache.bytes == 100
    assert len(cache._seqs) < 10_000, "the evicted front is cut off, not kept for ever"
