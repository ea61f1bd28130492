"""The BI jobs' command line refuses settings that cannot work, with a message and exit 2."""

from __future__ import annotations

import pytest

from spark.job_config import JobConfig
from spark.jobs import main


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
