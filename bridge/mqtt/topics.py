"""Topic names, topic filters and the reference matcher (MQTT 3.1.1 section 4.7).

A *topic name* is what a PUBLISH carries; it never contains wildcards. A *topic filter* is what a
SUBSCRIBE carries; it may contain the single-level wildcard ``+`` and the multi-level wildcard
``#``. A shared subscription filter ``$share/{group}/{filter}`` (MQTT 5.0 section 4.8.2, also
accepted from 3.1.1 clients) names a group and an ordinary filter.

`topic_matches` is the plain, level-by-level reference matcher; the router may use a faster index
but must agree with it.
"""

from __future__ import annotations

from bridge.mqtt.errors import MQTTProtocolError

__all__ = [
    "MAX_TOPIC_BYTES",
    "SHARE_PREFIX",
    "parse_shared",
    "topic_matches",
    "validate_topic_filter",
    "validate_topic_name",
]

MAX_TOPIC_BYTES = 65535
"""Topic names and filters must not encode to more than this many UTF-8 bytes (MQTT-4.7.3-3)."""

SHARE_PREFIX = "$share/"
"""The prefix of a shared subscription filter."""


def _check_common(topic: str, what: str) -> None:
    """Checks every topic name and filter shares: non-empty, no U+0000, well-formed, short."""
    if not topic:
        raise MQTTProtocolError("MQTT-4.7.3-1", f"{what} must be at least one character long")
    if "\x00" in topic:
        raise MQTTProtocolError("MQTT-4.7.3-2", f"{what} must not contain U+0000")
    # A str of n code points encodes to at most 4n bytes; only long ones need encoding.
    if len(topic) > MAX_TOPIC_BYTES // 4:
        try:
            size = len(topic.encode("utf-8"))
        except UnicodeEncodeError:
            raise MQTTProtocolError(
                "MQTT-1.5.3-1", f"{what} contains a surrogate code point"
            ) from None
        if size > MAX_TOPIC_BYTES:
            raise MQTTProtocolError(
                "MQTT-4.7.3-3", f"{what} encodes to {size} bytes, more than {MAX_TOPIC_BYTES}"
            )
    elif not topic.isascii():
        try:
            topic.encode("utf-8")
        except UnicodeEncodeError:
            raise MQTTProtocolError(
                "MQTT-1.5.3-1", f"{what} contains a surrogate code point"
            ) from None


def validate_topic_name(topic: str) -> None:
    """Raise `MQTTProtocolError` unless `topic` is a valid topic name (for PUBLISH or a will).

    Rules: at least one character (MQTT-4.7.3-1), no U+0000 (MQTT-4.7.3-2), no wildcard
    characters ``+``/``#`` (MQTT-4.7.1-1; MQTT-3.3.2-2 for PUBLISH), at most 65535 UTF-8 bytes
    (MQTT-4.7.3-3) and no surrogate code points (MQTT-1.5.3-1).
    """
    _check_common(topic, "topic name")
    if "+" in topic or "#" in topic:
        raise MQTTProtocolError(
            "MQTT-4.7.1-1", f"topic name {topic!r} must not contain wildcard characters"
        )


def _check_filter_levels(topic_filter: str) -> None:
    """Wildcard placement: '#' only as the whole last level, '+' only as a whole level."""
    if "#" in topic_filter:
        index = topic_filter.find("#")
        if index != len(topic_filter) - 1 or (index > 0 and topic_filter[index - 1] != "/"):
            raise MQTTProtocolError(
                "MQTT-4.7.1-2",
                f"'#' in topic filter {topic_filter!r} must be the whole last level",
            )
    if "+" in topic_filter:
        for level in topic_filter.split("/"):
            if "+" in level and level != "+":
                raise MQTTProtocolError(
                    "MQTT-4.7.1-3",
                    f"'+' in topic filter {topic_filter!r} must occupy a whole level",
                )


def validate_topic_filter(topic_filter: str) -> None:
    """Raise `MQTTProtocolError` unless `topic_filter` is a valid topic filter.

    Rules: at least one character (MQTT-4.7.3-1), no U+0000 (MQTT-4.7.3-2), at most 65535 UTF-8
    bytes (MQTT-4.7.3-3), ``#`` only as the whole last level (MQTT-4.7.1-2), ``+`` only as a whole
    level (MQTT-4.7.1-3). A shared filter ``$share/{group}/{filter}`` needs a non-empty group
    (MQTT-4.8.2-1) without ``/``, ``+`` or ``#``, followed by ``/`` and a valid filter
    (MQTT-4.8.2-2).
    """
    _check_common(topic_filter, "topic filter")
    if topic_filter.startswith(SHARE_PREFIX):
        group, inner = _split_shared(topic_filter)
        if "+" in group or "#" in group:
            raise MQTTProtocolError(
                "MQTT-4.8.2-2",
                f"share name {group!r} must not contain '/', '+' or '#'",
            )
        if not inner:
            raise MQTTProtocolError(
                "MQTT-4.8.2-2",
                f"shared subscription {topic_filter!r} must end in a topic filter",
            )
        _check_filter_levels(inner)
        return
    _check_filter_levels(topic_filter)


def _split_shared(topic_filter: str) -> tuple[str, str]:
    rest = topic_filter[len(SHARE_PREFIX) :]
    group, slash, inner = rest.partition("/")
    if not group:
        raise MQTTProtocolError(
            "MQTT-4.8.2-1", f"shared subscription {topic_filter!r} needs a non-empty share name"
        )
    if not slash:
        raise MQTTProtocolError(
            "MQTT-4.8.2-2",
            f"share name in {topic_filter!r} must be followed by '/' and a topic filter",
        )
    return group, inner


def parse_shared(topic_filter: str) -> tuple[str, str] | None:
    """Split ``$share/{group}/{filter}`` into ``(group, filter)``; None for an ordinary filter.

    This only splits; call `validate_topic_filter` first. A ``$share/`` filter without a share name
    or without the ``/`` after it cannot be split and raises `MQTTProtocolError` (MQTT-4.8.2-1,
    MQTT-4.8.2-2).
    """
    if not topic_filter.startswith(SHARE_PREFIX):
        return None
    return _split_shared(topic_filter)


def topic_limit_error(topic: str, max_length: int, max_levels: int) -> str | None:
    """The configured limits on a topic name or filter (`max_topic_length` in UTF-8 bytes,
    `max_topic_levels`): a message naming the fault, or None."""
    # A UTF-8 character is at most 4 bytes: most topics need no encoding to be checked.
    if len(topic) * 4 > max_length and len(topic.encode()) > max_length:
        return f"topic longer than max_topic_length={max_length}"
    if topic.count("/") + 1 > max_levels:
        return f"topic has more than max_topic_levels={max_levels} levels"
    return None


def topic_matches(topic_filter: str, topic: str) -> bool:
    """Whether the (non-shared) `topic_filter` matches the topic name `topic`.

    Level by level: ``+`` matches exactly one level (possibly empty), ``#`` matches the parent level
    and any number of child levels (so ``sport/#`` matches ``sport``). A filter starting with a
    wildcard never matches a topic starting with ``$`` (MQTT-4.7.2-1). Both arguments are assumed
    valid; strip ``$share/{group}/`` from shared filters before calling.
    """
    if topic[:1] == "$" and topic_filter[:1] in ("+", "#"):
        return False
    filter_levels = topic_filter.split("/")
    topic_levels = topic.split("/")
    n_topic = len(topic_levels)
    for index, level in enumerate(filter_levels):
        if level == "#":
            return True
        if index >= n_topic:
            return False
        if level != "+" and level != topic_levels[index]:
            return False
    return len(filter_levels) == n_topic
