"""The BI jobs' command line refuses settings that cannot work, with a message and exit 2."""

from __future__ import annotations

import pytest

from spark.job_config import JobConfig
from spark.jobs import build_parser, job_config, main
from spark.shifts import Downtime, Shifts


def test_a_clock_allowance_not_below_the_watermark_is_refused_naming_both(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["backfill", "--path", "/nonexistent", "--out", "/nonexistent/bi"]
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--watermark", "30", "--max-clock-ahead", "30"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "clock allowance (30 s)" in error and "watermark (30 s)" in error


def test_the_default_clock_allowance_fits_the_default_watermark() -> None:
    config = JobConfig(out="bi")
    assert 0 <= config.max_clock_ahead_s < config.watermark_s


@pytest.mark.parametrize(
    ("option", "says"),
    [
        (["--timezone", "Europe/Gotham"], "unknown time zone 'Europe/Gotham'"),
        (["--planned-downtime", "Funday 12:00-13:00"], "expected a weekday"),
        (["--shifts", "06:00,25:00"], "not a time of day"),
    ],
)
def test_a_calendar_that_cannot_be_is_refused_saying_why(
    option: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["backfill", "--path", "/nonexistent", "--out", "/nonexistent/bi", *option]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    assert says in capsys.readouterr().err


def test_the_calendar_options_make_the_jobs_shifts() -> None:
    command = ["stream", "--path", "d", "--out", "o", "--checkpoint", "c",
               "--timezone", "Asia/Tokyo", "--shifts", "07:00,19:00",
               "--planned-downtime", "12:00-12:45",
               "--planned-downtime", "Sun 00:00-24:00"]  # fmt: skip
    args = build_parser().parse_args(command)
    assert job_config(args).shifts == Shifts(
        (420, 1140), "Asia/Tokyo", (Downtime(720, 765), Downtime(0, 1440, frozenset({6})))
    )
    defaults = build_parser().parse_args(["backfill", "--path", "d", "--out", "o"])
    assert job_config(defaults).shifts == Shifts()
