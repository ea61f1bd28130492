"""A reader of the plain block-style YAML subset docker-compose.yml is written in, for machines
without PyYAML (not a dependency). It refuses what it cannot read (`Unsupported`) instead of
misreading it, and catches broken YAML (`Invalid`).
"""

from __future__ import annotations

import json
import re
from typing import Any


class Unsupported(Exception):
    """The file uses YAML the subset reader does not understand (not an error in the file)."""


class Invalid(Exception):
    """The file is not valid YAML."""


_KEY = re.compile(
    r"""^("(?:[^"\\]|\\.)*"|'(?:[^']|'')*'|[^\s"'#\[\]{}&*!|>%@`-][^:]*?|-[^\s:][^:]*?)\s*:(?:\s+(.*))?$"""
)


def _strip_comment(text: str) -> str:
    quote = None
    escaped = False
    for index, ch in enumerate(text):
        if quote == '"' and escaped:
            escaped = False
        elif quote == '"' and ch == "\\":
            escaped = True
        elif quote is not None:
            if ch == quote:
                quote = None
        elif ch in "\"'" and (index == 0 or text[index - 1] in " [,"):
            quote = ch
        elif ch == "#" and (index == 0 or text[index - 1] in " \t"):
            return text[:index].rstrip()
    return text.rstrip()


def _scalar(text: str, where: str) -> Any:
    if text.startswith("["):
        if not text.endswith("]"):
            raise Unsupported(f"{where}: flow sequence over several lines")
        try:
            return json.loads(text)
        except ValueError:
            raise Unsupported(f"{where}: flow sequence that is not JSON") from None
    if text.startswith('"'):
        try:
            return json.loads(text)
        except ValueError:
            raise Unsupported(f"{where}: double-quoted scalar with non-JSON escapes") from None
    if text.startswith("'"):
        if len(text) < 2 or not text.endswith("'"):
            raise Invalid(f"{where}: unterminated single-quoted scalar")
        return text[1:-1].replace("''", "'")
    if text[0] in "&*{!%@`" or text in ("|", ">", "|-", ">-", "|+", ">+"):
        raise Unsupported(f"{where}: {text[:20]!r} (anchors, aliases, tags, flow or block scalars)")
    return text


def read(source: str) -> Any:
    """Parse block mappings and sequences of scalars (plain, quoted, JSON-like flow sequences)."""
    lines: list[tuple[int, str, int]] = []
    for number, raw in enumerate(source.splitlines(), start=1):
        body = raw.lstrip(" ")
        if body.startswith("\t"):
            raise Invalid(f"line {number}: tab in indentation")
        text = _strip_comment(body)
        if text:
            if text in ("---", "...") or text.startswith("%"):
                raise Unsupported(f"line {number}: document markers or directives")
            lines.append((len(raw) - len(body), text, number))

    def block(i: int, indent: int) -> tuple[Any, int]:
        if lines[i][1] == "-" or lines[i][1].startswith("- "):
            return sequence(i, indent)
        return mapping(i, indent)

    def value_after(i: int, indent: int, number: int, seq_ok: bool) -> tuple[Any, int]:
        if i < len(lines) and lines[i][0] > indent:
            return block(i, lines[i][0])
        if seq_ok and i < len(lines) and lines[i][0] == indent and lines[i][1].startswith("-"):
            return sequence(i, indent)
        return None, i

    def sequence(i: int, indent: int) -> tuple[list[Any], int]:
        items: list[Any] = []
        while i < len(lines) and lines[i][0] == indent and lines[i][1].startswith("-"):
            _, text, number = lines[i]
            rest = text[1:].strip()
            if text[1:2] not in ("", " "):
                raise Invalid(f"line {number}: '-' must be followed by a space")
            if not rest:
                item, i = value_after(i + 1, indent, number, seq_ok=False)
                items.append(item)
                continue
            if _KEY.match(rest):
                raise Unsupported(f"line {number}: mapping inside a sequence")
            items.append(_scalar(rest, f"line {number}"))
            i += 1
        if i < len(lines) and lines[i][0] > indent:
            raise Invalid(f"line {lines[i][2]}: unexpected indentation")
        return items, i

    def mapping(i: int, indent: int) -> tuple[dict[str, Any], int]:
        result: dict[str, Any] = {}
        while i < len(lines) and lines[i][0] == indent:
            _, text, number = lines[i]
            if text.startswith("- "):
                raise Invalid(f"line {number}: sequence item where a key was expected")
            match = _KEY.match(text)
            if not match:
                raise Invalid(f"line {number}: expected 'key: value', got {text!r}")
            key_text, value = match.group(1), match.group(2)
            key = _scalar(key_text, f"line {number}")
            if key == "<<":
                raise Unsupported(f"line {number}: merge keys")
            if key in result:
                raise Invalid(f"line {number}: duplicate key {key!r}")
            if value is None:
                result[key], i = value_after(i + 1, indent, number, seq_ok=True)
            else:
                result[key] = _scalar(value, f"line {number}")
                i += 1
        if i < len(lines) and lines[i][0] > indent:
            raise Invalid(f"line {lines[i][2]}: unexpected indentation")
        return result, i

    if not lines:
        return None
    document, end = block(0, lines[0][0])
    if end != len(lines):
        raise Invalid(f"line {lines[end][2]}: indentation does not match any open block")
    return document
