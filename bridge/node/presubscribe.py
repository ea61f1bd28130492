"""Pre-subscription: filters every client is subscribed to when it connects.

Configured as `[QOS:]FILTER` entries (`presubscribe = ["1:devices/%c/cmd"]`); `%c` stands for the
ClientId and `%u` for the user name (see `bridge.access.acl.substitute` for when a substitution is
refused). Pure: parsing and expansion only; the node applies the result.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from bridge.access.acl import substitute
from bridge.mqtt.errors import MQTTProtocolError
from bridge.mqtt.topics import validate_topic_filter

DEFAULT_QOS = 1


class PresubscribeError(ValueError):
    """A `presubscribe` entry is malformed; the message names it."""


@dataclass(frozen=True, slots=True)
class Presubscription:
    """One configured filter template and the QoS it is granted with."""

    template: str
    qos: int

    def expand(self, client_id: str, username: str | None) -> str | None:
        """The filter for this client, or None when it cannot be made for it (no user name for
        `%u`, or a ClientId/user name that would add levels or wildcards)."""
        return substitute(self.template, client_id, username)


def parse_presubscriptions(entries: Iterable[str]) -> list[Presubscription]:
    """Parse `[QOS:]FILTER` entries; raises PresubscribeError naming a bad one."""
    parsed: list[Presubscription] = []
    for entry in entries:
        qos = DEFAULT_QOS
        template = entry.strip()
        head, sep, rest = template.partition(":")
        if sep and head in ("0", "1", "2"):
            qos, template = int(head), rest
        if not template:
            raise PresubscribeError(f"{entry!r}: empty filter")
        # Check the template with stand-ins, so `devices/%c/cmd` is checked as a filter.
        try:
            validate_topic_filter(template.replace("%c", "c").replace("%u", "u"))
        except MQTTProtocolError as exc:
            raise PresubscribeError(f"{entry!r}: {exc}") from None
        if template.startswith("$share/"):
            raise PresubscribeError(f"{entry!r}: shared subscriptions cannot be pre-subscribed")
        parsed.append(Presubscription(template, qos))
    return parsed
