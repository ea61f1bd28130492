"""The telemetry query's split of a device's rows: counted, late, or a duplicate."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from spark.arrivals import Seen, sort_arrivals


def test_rows_behind_the_watermark_are_late_and_a_second_copy_is_not_counted() -> None:
    seen = Seen()
    first = sort_arrivals([(1, 1_000), (2, 2_000), (1, 1_000)], seen, watermark_ms=0)
    assert (first.counted, first.late) == ([0, 1], [])
    second = sort_arrivals([(3, 500), (2, 2_000), (4, 3_000)], seen, watermark_ms=1_500)
    assert (second.counted, second.late) == ([2], [0])
    assert seen.seqs == {2: 2_000, 4: 3_000}, "seq 1 is behind the watermark: forgotten"
    assert Seen.from_json(seen.to_json()) == seen


messages = st.dictionaries(st.integers(0, 40), st.integers(0, 10_000), min_size=1)
"""seq -> ts_ms of one device's messages (a resend is the same message: same ts)."""


@given(
    messages,
    st.lists(st.lists(st.integers(0, 40), max_size=12), min_size=1, max_size=6),
    st.lists(st.integers(0, 2_000), min_size=6, max_size=6),
)
def test_every_row_counts_once_or_is_late_or_is_a_copy_of_a_counted_one(
    ts_of: dict[int, int], batches: list[list[int]], steps: list[int]
) -> None:
    seen, watermark, counted_seqs = Seen(), 0, []
    for batch, step in zip(batches, steps, strict=False):
        rows = [(seq, ts_of[seq]) for seq in batch if seq in ts_of]
        result = sort_arrivals(rows, seen, watermark)
        assert not set(result.counted) & set(result.late)
        for position, (seq, ts) in enumerate(rows):
            if ts < watermark:
                assert position in result.late
            elif position in result.counted:
                counted_seqs.append(seq)
            else:  # dropped: a copy of a row counted before, still within the watermark
                assert seq in counted_seqs and seq in seen.seqs
        assert all(ts >= watermark for ts in seen.seqs.values())
        watermark += step  # the watermark only moves forward
    assert len(counted_seqs) == len(set(counted_seqs)), "a message was counted twice"
