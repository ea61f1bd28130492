"""Text from clients in log lines: escaped and bounded, so a ClientId, a user name, a topic or a
1 MiB DISCONNECT reason string can neither forge a log line (newlines, ANSI escapes) nor flood
the log. `client_text` is for the sites that print client-controlled strings;
`EscapingFilter` is the net under every other line; `RefusalLog` paces the lines about refused
CONNECTs and protocol faults (docs/decisions.md, "Across the rooms" and "Listeners")."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable

from bridge.access.ratelimit import LogThrottle

CLIENT_TEXT_LIMIT = 128
"""Characters of one client-controlled string kept in a log line."""

ANY_TEXT_LIMIT = 4096
"""Characters of any string argument kept by `EscapingFilter` (paths, errors: ours, but may
quote a client)."""


def _escape(text: str, backslash: bool = True) -> str:
    if text.isprintable() and not (backslash and "\\" in text):
        return text
    out = []
    for char in text:
        if char == "\\" and backslash:
            out.append("\\\\")
        elif char.isprintable():
            out.append(char)
        else:
            out.append(repr(char)[1:-1])  # \n, \x1b, \u2028: as Python writes them
    return "".join(out)


def _bounded(value: str, limit: int, backslash: bool) -> str:
    if len(value) > limit:
        return f"{_escape(value[:limit], backslash)}...[+{len(value) - limit} chars]"
    return _escape(value, backslash)


def client_text(value: str | bytes | None, limit: int = CLIENT_TEXT_LIMIT) -> str:
    """`value` fit for one log line: control and other unprintable characters escaped as in a
    Python literal (a backslash doubled), cut to `limit` characters with the original length
    said (`abc...[+1048573 chars]`). None is `-`; bytes are decoded leniently."""
    if value is None:
        return "-"
    if isinstance(value, bytes):
        value = value.decode("utf-8", "backslashreplace")
    return _bounded(value, limit, backslash=True)


def _any_text(arg: object) -> object:
    # Backslashes stay single: a string `client_text` already escaped passes unchanged.
    return _bounded(arg, ANY_TEXT_LIMIT, backslash=False) if isinstance(arg, str) else arg


class EscapingFilter(logging.Filter):
    """Escapes unprintable characters in every string argument of a record and cuts it at
    ANY_TEXT_LIMIT, so no log line is split or coloured by what it quotes. Installed on the
    process's handlers by `python -m bridge`."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite the record's string arguments in place; never drops a record."""
        args = record.args
        if isinstance(args, tuple) and args:
            record.args = tuple(_any_text(arg) for arg in args)
        elif isinstance(args, dict) and args:
            record.args = {key: _any_text(arg) for key, arg in args.items()}
        return True


class RefusalLog:
    """At most one log line per `interval` seconds for each kind of refusal (a reason code: of
    a CONNACK refusing a CONNECT, or of the DISCONNECT closing a client for a protocol fault),
    carrying how many of that kind were not logged since its last line: a flood of bad CONNECTs
    or of malformed packets costs a few lines, and each line still says how big it was."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._clock = clock
        self._throttles: dict[Hashable, LogThrottle] = {}

    def note(self, kind: Hashable) -> tuple[bool, int]:
        """One refusal of `kind`: (log it?, refusals of this kind not logged since its last
        line). The kinds are a closed set (reason codes), so the table stays small."""
        throttle = self._throttles.get(kind)
        if throttle is None:
            throttle = self._throttles[kind] = LogThrottle(self.interval)
        return throttle.note(self._clock())


def suppressed_note(suppressed: int) -> str:
    """The tail of a throttled line: `` (+N more since the last line)`` or nothing."""
    return f" (+{suppressed} more not logged since the last line)" if suppressed else ""
