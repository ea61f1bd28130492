"""Authorisation: which client may publish to, or subscribe to, which topics.

Rules are lines of four words, checked top to bottom; the first rule that applies decides:

    # decision  who            action     topic filter
    allow       user:admin     all        #
    deny        all            subscribe  secret/#
    allow       all            publish    devices/%c/telemetry
    allow       all            subscribe  devices/%c/cmd
    allow       user:alice     all        sensors/%u/#

* decision: `allow` or `deny`;
* who: `all`, `anonymous` (no user name), `user:NAME` or `client:CLIENTID`;
* action: `publish`, `subscribe` or `all`;
* topic filter: an MQTT filter where `%c` is the ClientId and `%u` the user name.

Lines `clientid user:NAME PREFIX` bind ClientIds starting with PREFIX to a user; they are
checked at CONNECT, not against topics (`bridge.access.clientids`).

With rules configured, a request no rule applies to is denied. A PUBLISH applies to a rule when
its topic matches the rule's filter. A SUBSCRIBE applies to a rule when every topic the client's
filter can match also matches the rule's (`sensors/#` allows `sensors/+/temp`, not the reverse).
A `deny` rule that shares only some topics with a requested filter does not refuse it: `#` is
granted past `deny all subscribe secret/#`, and messages on topics the client may not read are
left out when they are delivered (`bridge.access.reads`, which asks the topic only of filters
the rules do not answer whole), as Mosquitto and EMQX do. A substitution that cannot be made
(no user name for `%u`; a ClientId or user name with `+`, `#` or NUL) makes the rule not apply
to that client.

Pure: parsing, matching and the decision cache; `bridge.access.control` loads the rules from the
ACL file and Redis.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum

from bridge.access.ttlcache import TTLCache
from bridge.mqtt.topics import topic_matches

PUBLISH = "publish"
SUBSCRIBE = "subscribe"
CLIENTID = "clientid"
"""The action of a `clientid user:NAME PREFIX` line (`bridge.access.clientids`)."""
DEFAULT_CACHE_TTL = 60.0
DEFAULT_CACHE_SIZE = 100_000
VERDICTS_KEPT = 1_000
"""Topics whose answer one client keeps in front of the shared cache (its PUBLISHes, its
deliveries: `bridge.access.reads`), then it starts afresh: bounds what a client on many topics
makes the node hold."""


class AclError(ValueError):
    """A rule is malformed; the message says where and why."""


class Decision(Enum):
    """What a rule decides."""

    ALLOW = "allow"
    DENY = "deny"


def substitute(template: str, client_id: str, username: str | None) -> str | None:
    """`template` with `%c` and `%u` replaced, or None when a value cannot stand in a filter
    literally (missing or empty user name for `%u`; `+`, `#` or NUL in the value)."""
    if "%" not in template:
        return template
    if "%c" in template:
        if not _literal(client_id):
            return None
        template = template.replace("%c", client_id)
    if "%u" in template:
        if username is None or not _literal(username):
            return None
        template = template.replace("%u", username)
    return template


def _literal(value: str) -> bool:
    return bool(value) and "+" not in value and "#" not in value and "\x00" not in value


def _wild_first(level: str) -> bool:
    return level in ("+", "#")


def covers(rule_filter: str, requested: str) -> bool:
    """Whether every topic `requested` can match also matches `rule_filter`."""
    return _covers(rule_filter.split("/"), requested.split("/"))


def _covers(rule: list[str], req: list[str]) -> bool:
    if req and req[0].startswith("$") and rule and _wild_first(rule[0]):
        return False
    for index, level in enumerate(rule):
        if level == "#":
            return True
        if index >= len(req):
            return False
        asked = req[index]
        if level == "+":
            if asked == "#":
                return False
            continue
        if asked != level:
            return False
    return len(req) == len(rule)


def overlaps(a: str, b: str) -> bool:
    """Whether some topic matches both filters."""
    left, right = a.split("/"), b.split("/")
    dollar_left = left[0].startswith("$")
    dollar_right = right[0].startswith("$")
    if (dollar_left and _wild_first(right[0])) or (dollar_right and _wild_first(left[0])):
        return False
    for index in range(max(len(left), len(right))):
        x = left[index] if index < len(left) else None
        y = right[index] if index < len(right) else None
        if x == "#" or y == "#":
            return True
        if x is None or y is None:
            return False
        if x != y and x != "+" and y != "+":
            return False
    return True


CLIENT_EVENTS_FILTER = "$SYS/brokers/+/clients/+/+"
"""Every client event topic (`bridge.operations.systopics.event_topic`): who connected, from
which address, as which user."""


def may_see_client_events(topic_filter: str) -> bool:
    """Whether a subscription to `topic_filter` could receive client events."""
    return overlaps(topic_filter, CLIENT_EVENTS_FILTER)


@dataclass(frozen=True, slots=True)
class Rule:
    """One parsed rule."""

    decision: Decision
    who: str
    """`all`, `anonymous`, `user:NAME` or `client:ID`"""
    action: str
    """`publish`, `subscribe` or `all`"""
    topic_filter: str
    source: str = ""
    """Where the rule came from (`file:line`), for log lines."""

    def applies_to(self, client_id: str, username: str | None) -> bool:
        """Whether the rule's `who` covers this client."""
        who = self.who
        if who == "all":
            return True
        if who == "anonymous":
            return username is None
        kind, _, name = who.partition(":")
        if kind == "user":
            return username == name
        return client_id == name

    def text(self) -> str:
        """The rule as a line of the rules format."""
        if self.action == CLIENTID:
            return f"{CLIENTID} {self.who} {self.topic_filter}"
        return f"{self.decision.value} {self.who} {self.action} {self.topic_filter}"


def parse_rule(line: str, source: str = "") -> Rule | None:
    """Parse one line; None for a blank line or comment. Raises AclError naming the fault."""
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    if text.split(None, 1)[0].lower() == CLIENTID:
        return _parse_clientid(text, source)
    words = text.split(None, 3)
    if len(words) != 4:
        raise AclError(f"{source}: expected 'allow|deny WHO ACTION FILTER', got {text!r}")
    decision_word, who, action, topic_filter = words
    try:
        decision = Decision(decision_word.lower())
    except ValueError:
        raise AclError(f"{source}: {decision_word!r} is not allow or deny") from None
    kind, colon, name = who.partition(":")
    if not (who in ("all", "anonymous") or (colon and kind in ("user", "client") and name)):
        raise AclError(f"{source}: {who!r} is not all, anonymous, user:NAME or client:ID")
    action = action.lower()
    if action not in (PUBLISH, SUBSCRIBE, "all"):
        raise AclError(f"{source}: {action!r} is not publish, subscribe or all")
    topic_filter = topic_filter.strip()
    problem = _filter_problem(topic_filter)
    if problem:
        raise AclError(f"{source}: filter {topic_filter!r}: {problem}")
    return Rule(decision, who, action, topic_filter, source)


def _parse_clientid(text: str, source: str) -> Rule:
    """`clientid user:NAME PREFIX`: a rule of its own kind (`bridge.access.clientids`), kept
    as an `allow` whose action is `clientid` and whose filter is the prefix, so that it goes
    wherever rules go (files, Redis, listings) and no topic check ever takes it for its own."""
    words = text.split()
    if len(words) != 3:
        raise AclError(f"{source}: expected 'clientid user:NAME PREFIX', got {text!r}")
    _, who, prefix = words
    kind, colon, name = who.partition(":")
    if not (colon and kind == "user" and name):
        raise AclError(f"{source}: a ClientId prefix is bound to a user:NAME, not {who!r}")
    if "\x00" in prefix:
        raise AclError(f"{source}: ClientId prefix {prefix!r} contains NUL")
    return Rule(Decision.ALLOW, who, CLIENTID, prefix, source)


def _filter_problem(topic_filter: str) -> str | None:
    levels = topic_filter.split("/")
    for index, level in enumerate(levels):
        if "#" in level and (level != "#" or index != len(levels) - 1):
            return "'#' must be a whole last level"
        if "+" in level and level != "+":
            return "'+' must be a whole level"
    if "\x00" in topic_filter:
        return "contains NUL"
    return None


def parse_rules(lines: Iterable[str], origin: str) -> list[Rule]:
    """Parse every line (`origin` names the file or key in errors)."""
    rules: list[Rule] = []
    for number, line in enumerate(lines, start=1):
        rule = parse_rule(line, f"{origin}:{number}")
        if rule is not None:
            rules.append(rule)
    return rules


ReadRule = tuple[str, bool]
"""A rule on subscribing as it stands for one client: its filter (`%c`/`%u` filled in) and
whether it allows."""


class Acl:
    """The rules in force and a cache of decisions.

    `rules=None` means authorisation is off: everything is allowed (and nothing cached), except,
    with `private_client_events`, subscriptions that could receive client events (their IP
    addresses, user names and ClientIds are for operators; with rules, one naming `$SYS` must
    allow them). Decisions are cached per (ClientId, user name, action, topic) for `cache_ttl`
    seconds; `replace` swaps the rules and empties the cache at once, so a change is never hidden
    by a cached decision.
    """

    def __init__(
        self,
        rules: list[Rule] | None = None,
        *,
        cache_ttl: float = DEFAULT_CACHE_TTL,
        cache_size: int = DEFAULT_CACHE_SIZE,
        clock: Callable[[], float] = time.monotonic,
        private_client_events: bool = False,
    ) -> None:
        self.rules = rules
        self.private_client_events = private_client_events
        self._cache: TTLCache[tuple[str, str | None, str, str], bool] = TTLCache(
            cache_ttl, cache_size, clock
        )
        self._read_rules: dict[tuple[str, str | None], list[ReadRule]] = {}
        self.cache_hits = 0
        self.cache_misses = 0
        self.generation = 0
        """Counts the rule sets put in force (`replace`): a verdict reached under the rules
        of one generation holds until the next (`bridge.access.reads`)."""

    @property
    def enabled(self) -> bool:
        """Whether rules are in force."""
        return self.rules is not None

    def replace(self, rules: list[Rule] | None) -> None:
        """Put new rules in force and forget every cached decision."""
        self.rules = rules
        self.generation += 1
        self._cache.clear()
        self._read_rules.clear()

    def allows(self, action: str, client_id: str, username: str | None, topic: str) -> bool:
        """Whether `client_id` (logged in as `username`) may `action` (PUBLISH: a topic name;
        SUBSCRIBE: a filter) on `topic`."""
        if self.rules is None:
            return True
        key = (client_id, username, action, topic)
        cached = self._cache.get(key)
        if cached is not None:
            self.cache_hits += 1
            return cached
        self.cache_misses += 1
        allowed = self.decide(action, client_id, username, topic)
        self._cache.put(key, allowed)
        return allowed

    def subscribe_allowed(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        """Whether a SUBSCRIBE to `topic_filter` is granted: the first rule that covers it
        decides (deny rules that share only some topics with it filter deliveries instead)."""
        if self.rules is None and self.private_client_events:
            return not may_see_client_events(topic_filter)
        return self.allows(SUBSCRIBE, client_id, username, topic_filter)

    def read_rules(self, client_id: str, username: str | None) -> list[ReadRule]:
        """The rules on subscribing that apply to this client, in order, each as its filter
        with `%c`/`%u` filled in and whether it allows: what decides which topics the client
        may read (`bridge.access.reads`). Kept per client until the rules change."""
        key = (client_id, username)
        kept = self._read_rules.get(key)
        if kept is not None:
            return kept
        found: list[ReadRule] = []
        for rule in self.rules or ():
            if rule.action not in ("all", SUBSCRIBE) or not rule.applies_to(client_id, username):
                continue
            pattern = substitute(rule.topic_filter, client_id, username)
            if pattern is not None:
                found.append((pattern, rule.decision is Decision.ALLOW))
        if len(self._read_rules) >= self._cache.size:
            self._read_rules.clear()
        self._read_rules[key] = found
        return found

    def decide(self, action: str, client_id: str, username: str | None, topic: str) -> bool:
        """The decision without the cache: the first rule that applies, else deny."""
        rule = self.first_applying(action, client_id, username, topic)
        return rule is not None and rule.decision is Decision.ALLOW

    def first_applying(
        self, action: str, client_id: str, username: str | None, topic: str
    ) -> Rule | None:
        """The rule that decides, or None when none applies."""
        for rule in self.rules or ():
            if rule.action != "all" and rule.action != action:
                continue
            if not rule.applies_to(client_id, username):
                continue
            pattern = substitute(rule.topic_filter, client_id, username)
            if pattern is None:
                continue
            if topic_matches(pattern, topic) if action == PUBLISH else covers(pattern, topic):
                return rule
        return None
