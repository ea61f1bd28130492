"""The telemetry query's split of a bucket of devices' rows: counted, late, or a duplicate."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from spark.arrivals import BucketSeen, Seen, sort_bucket


def test_rows_behind_the_watermark_are_late_and_a_second_copy_is_not_counted() -> None:
    seen = BucketSeen()
    first = sort_bucket([("a", 1, 1_000), ("a", 2, 2_000), ("a", 1, 1_000)], seen, watermark_ms=0)
    assert (first.counted, first.late) == ([0, 1], [])
    second = sort_bucket(
        [("a", 3, 500), ("a", 2, 2_000), ("a", 4, 3_000)], seen, watermark_ms=1_500
    )
    assert (second.counted, second.late) == ([2], [0])
    assert seen.devices == {"a": Seen({2: 2_000, 4: 3_000})}, "seq 1 is behind: forgotten"
    assert BucketSeen.from_json(seen.to_json()) == seen


def test_devices_of_a_bucket_keep_their_own_seqs_and_a_device_with_none_left_is_forgotten() -> None:
    seen = BucketSeen()
    first = sort_bucket([("a", 1, 1_000), ("b", 1, 5_000), ("a", 1, 1_000)], seen, 0)
    assert (first.counted, first.late) == ([0, 1], []), "seq 1 of b is not a copy of a's"
    second = sort_bucket([("b", 2, 6_000)], seen, watermark_ms=2_000)
    assert seen.devices == {"b": Seen({1: 5_000, 2: 6_000})}, "a: nothing within the watermark"
    assert (second.counted, second.late) == ([0], [])
    assert BucketSeen.from_json(seen.to_json()) == seen


messages = st.dictionaries(
    st.tuples(st.sampled_from("abc"), st.integers(0, 20)), st.integers(0, 10_000), min_size=1
)
"""(device, seq) -> ts_ms of a bucket's messages (a resend is the same message: same ts)."""


@given(
    messages,
    st.lists(
        st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 20)), max_size=12),
        min_size=1,
        max_size=6,
    ),
    st.lists(st.integers(0, 2_000), min_size=6, max_size=6),
)
def test_every_row_counts_once_or_is_late_or_is_a_copy_and_devices_do_not_interfere(
    ts_of: dict[tuple[str, int], int],
    batches: list[list[tuple[str, int]]],
    steps: list[int],
) -> None:
    together = BucketSeen()
    alone = {device: BucketSeen() for device in "abc"}
    watermark, counted = 0, []
    for batch, step in zip(batches, steps, strict=False):
        rows = [(d, seq, ts_of[d, seq]) for d, seq in batch if (d, seq) in ts_of]
        result = sort_bucket(rows, together, watermark)
        assert not set(result.counted) & set(result.late)
        for position, (device, seq, ts) in enumerate(rows):
            if ts < watermark:
                assert position in result.late
            elif position in result.counted:
                counted.append((device, seq))
            else:  # dropped: a copy of a row counted before, still within the watermark
                assert (device, seq) in counted and seq in together.devices[device].seqs
        for seen in together.devices.values():
            assert seen.seqs and all(ts >= watermark for ts in seen.seqs.values())
        # The same rows sorted one device at a time reach the same decisions.
        for device in "abc":
            positions = [p for p, row in enumerate(rows) if row[0] == device]
            own = sort_bucket([rows[p] for p in positions], alone[device], watermark)
            assert [positions[p] for p in own.counted] == [
                p for p in result.counted if rows[p][0] == device
            ]
            assert [positions[p] for p in own.late] == [
                p for p in result.late if rows[p][0] == device
            ]
        watermark += step  # the watermark only moves forward
    assert len(counted) == len(set(counted)), "a message was counted twice"
