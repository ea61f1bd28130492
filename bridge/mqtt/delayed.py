"""Delayed publish topics: `$delayed/<seconds>/<topic>` (the form EMQX and others use).

A PUBLISH to `$delayed/10/factory/alarm` is stored now and delivered in 10 seconds to the
subscribers of `factory/alarm`. This module only reads the form: `parse_delayed` returns the
target topic and the delay, or raises `DelayedTopicError` with the MQTT 5.0 reason code the
publisher gets and a sentence for the log. Pure: no I/O, no clock.

Rules:

* the topic is `$delayed` followed by `/`, a delay, `/` and a non-empty target topic; `$delayed`
  alone, or without a target, is a bad form (0x90 Topic Name invalid);
* the delay is whole seconds in ASCII digits (`0` delivers at once): a sign, a fraction, spaces
  or any other character is a bad form (0x90);
* a delay over the configured maximum is refused with 0x83 (Implementation specific error: the
  form is right, this server will not hold it that long); a maximum of 0 turns delayed publish
  off, and every `$delayed` topic gets 0x83;
* the target must be a valid topic name (no `+`/`#`, no U+0000) and must not itself be a
  delayed topic (0x90).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from bridge.mqtt.reasons import ReasonCode

__all__ = ["DELAYED_PREFIX", "DelayedTopic", "DelayedTopicError", "is_delayed", "parse_delayed"]

DELAYED_PREFIX: Final = "$delayed/"
"""Topics starting with this (or equal to `$delayed`) are delayed publishes."""

_MAX_DIGITS: Final = 10
"""Longer delays are refused before they are converted (no huge integers from a topic)."""
_MAX_SECONDS: Final = 10**_MAX_DIGITS - 1


@dataclass(slots=True, frozen=True)
class DelayedTopic:
    """A delayed publish: deliver to `topic` after `seconds`."""

    seconds: int
    topic: str


class DelayedTopicError(ValueError):
    """A `$delayed` topic that cannot be accepted: `reason` is the MQTT 5.0 reason code."""

    def __init__(self, reason: ReasonCode, why: str) -> None:
        super().__init__(why)
        self.reason = reason
        self.why = why


def is_delayed(topic: str) -> bool:
    """Whether `topic` asks for a delayed publish (well-formed or not)."""
    return topic.startswith(DELAYED_PREFIX) or topic == "$delayed"


def parse_delayed(topic: str, max_seconds: int | None = None) -> DelayedTopic | None:
    """The delay and target of a `$delayed/<seconds>/<topic>` topic; None for any other topic.

    Raises `DelayedTopicError` for a bad form (0x90) or a delay over `max_seconds` (0x83; a
    `max_seconds` of 0 refuses every delayed publish, None checks no maximum)."""
    if not is_delayed(topic):
        return None
    if max_seconds == 0:
        raise DelayedTopicError(
            ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR,
            "delayed publish is off (delayed_max_seconds=0)",
        )
    seconds_text, slash, target = topic[len(DELAYED_PREFIX) :].partition("/")
    if not seconds_text or not (seconds_text.isascii() and seconds_text.isdigit()):
        raise DelayedTopicError(
            ReasonCode.TOPIC_NAME_INVALID,
            "a delayed publish needs `$delayed/<seconds>/<topic>` with whole seconds (0-9 only)",
        )
    if not slash or not target:
        raise DelayedTopicError(
            ReasonCode.TOPIC_NAME_INVALID,
            "a delayed publish needs a topic after `$delayed/<seconds>/`",
        )
    limit = _MAX_SECONDS if max_seconds is None else min(max_seconds, _MAX_SECONDS)
    if len(seconds_text) > _MAX_DIGITS or int(seconds_text) > limit:
        raise DelayedTopicError(
            ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR,
            f"delay of {seconds_text[:12]} seconds is over delayed_max_seconds={limit}",
        )
    if "+" in target or "#" in target or "\x00" in target:
        raise DelayedTopicError(
            ReasonCode.TOPIC_NAME_INVALID,
            "the topic of a delayed publish must not contain wildcards or U+0000",
        )
    if is_delayed(target):
        raise DelayedTopicError(
            ReasonCode.TOPIC_NAME_INVALID, "a delayed publish cannot target another $delayed topic"
        )
    return DelayedTopic(int(seconds_text), target)
