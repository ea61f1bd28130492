"""Tables and cells of every bench report: a plain-text table for the terminal, the same as
Markdown for docs/performance.md, and how figures, ratios, payloads, percentages and missing
values are written in them. Also how a figure is read out of a loadgen result."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.bench.harness.common import log

MISSING = "—"


@dataclass(frozen=True)
class ReportSection:
    """A part a script adds to a report: its `doc` under `key` in the JSON, its Markdown
    (appended to the .md) and the text printed with the other tables."""

    key: str
    doc: Any
    markdown: str
    text: str


def plain_table(head: list[str], body: list[list[str]], right: set[int]) -> str:
    """Columns padded to their widest cell, two spaces apart; columns in `right` right-aligned."""
    widths = [max(len(h), *(len(row[i]) for row in body)) for i, h in enumerate(head)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(cells)
        ).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(head), sep, *(line(r) for r in body)])


def log_section(caption: str, text: str) -> None:
    """A table (or any block of lines) on the terminal: a blank line, its caption, the text."""
    log("")
    log(caption)
    log(text)


def md_table(head: list[str], body: list[list[str]], right: set[int]) -> list[str]:
    """The same table as Markdown lines; columns in `right` right-aligned."""
    align = ["---:" if i in right else "---" for i in range(len(head))]
    return [
        "| " + " | ".join(head) + " |",
        "|" + "|".join(align) + "|",
        *("| " + " | ".join(row) + " |" for row in body),
    ]


def fmt_val(v: float | None, label: str) -> str:
    """A figure: rates (labels ending in /s) as whole numbers, everything else to 3 decimals."""
    if v is None:
        return MISSING
    if label.endswith("/s"):
        return f"{v:,.0f}"
    return f"{v:.3f}"


def fmt_ratio(v: float | None) -> str:
    return f"{v:.2f}x" if v is not None else MISSING


def fmt_pct(v: Any) -> str:
    """A CPU share already in percent, rounded to whole percent."""
    return f"{v:.0f}%" if isinstance(v, int | float) else MISSING


def fmt_s(value: float | int | None, digits: int = 2) -> str:
    """Seconds (or any figure) for a table cell."""
    return MISSING if value is None else f"{value:.{digits}f}"


def fmt_rate(value: float | None) -> str:
    """A rate with thousands separators for a table cell."""
    return MISSING if value is None else f"{value:,.0f}"


def payload_label(n: int) -> str:
    return f"{n} B" if n < 1024 else f"{n // 1024} KB"


def get_path(d: dict[str, Any], dotted: str) -> float | None:
    """The number at a dotted path ("latency.p50_ms") of a result, or None."""
    cur: Any = d
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return float(cur) if isinstance(cur, int | float) else None


def completed(r: dict[str, Any]) -> bool:
    """A loadgen result with figures (not failed, skipped or missing)."""
    return "fatal" not in r and "delivered" in r


def result_value(r: dict[str, Any], path: str) -> float | None:
    """A figure of a loadgen result; None unless the run completed."""
    return get_path(r, path) if completed(r) else None


def rate_not_held(r: dict[str, Any]) -> bool:
    """A fixed-rate run whose publisher fell more than 10% of its messages behind schedule (its
    QoS 1 window was full): its latency is not latency "at" that rate."""
    samples = (r.get("latency") or {}).get("samples")
    return bool(samples) and (r.get("late_sends") or 0) > samples / 10
