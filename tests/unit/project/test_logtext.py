"""Client text in log lines (bridge.logtext): escaped, cut, and refusals paced."""

from __future__ import annotations

import logging

from bridge.logtext import EscapingFilter, RefusalLog, client_text, suppressed_note


def test_client_text_escapes_control_characters_and_backslashes_as_a_python_literal():
    assert client_text("a\nb\x1b[31m\\c\u2028") == "a\\nb\\x1b[31m\\\\c\\u2028"
    assert client_text("plain/topic é") == "plain/topic é"
    assert client_text(None) == "-"
    assert client_text(b"\xffid") == "\\\\xffid"


def test_client_text_cuts_long_text_and_says_how_much_was_cut():
    assert client_text("x" * 1000, limit=10) == "xxxxxxxxxx...[+990 chars]"
    assert client_text("x" * 10, limit=10) == "x" * 10


def test_the_filter_makes_every_string_argument_one_line_without_escaping_twice():
    record = logging.LogRecord(
        "t", logging.INFO, __file__, 1, "%s %s %d", ("a\nb", client_text("c\nd"), 7), None
    )
    assert EscapingFilter().filter(record)
    assert record.getMessage() == "a\\nb c\\nd 7"


def test_refusals_log_one_line_per_interval_per_kind_with_the_count_of_the_rest():
    now = [0.0]
    refusals = RefusalLog(10.0, clock=lambda: now[0])
    shown = [refusals.note(0x86) for _ in range(100)]
    assert shown[0] == (True, 0)
    assert all(entry == (False, 0) for entry in shown[1:])
    assert refusals.note(0x87) == (True, 0)  # another kind has its own pace
    now[0] = 10.0
    assert refusals.note(0x86) == (True, 99)
    assert suppressed_note(99) == " (+99 more not logged since the last line)"
    assert suppressed_note(0) == ""


def test_interval_zero_logs_every_refusal():
    refusals = RefusalLog(0.0, clock=lambda: 5.0)
    assert [refusals.note("x") for _ in range(3)] == [(True, 0)] * 3
