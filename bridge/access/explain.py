"""Why the ACL allows or denies a request: each rule in order with what it did, for the console's
"explain this decision".

Pure. The decision itself is `Acl.first_applying`, the one the node uses; the per-rule outcomes
are read with the same predicates it checks (`Rule.applies_to`, `substitute`, `topic_matches` /
`covers`), and `explain` checks that they name the same deciding rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from bridge.access.acl import (
    PUBLISH,
    SUBSCRIBE,
    Acl,
    Decision,
    Rule,
    covers,
    may_see_client_events,
    overlaps,
    substitute,
)
from bridge.mqtt.topics import topic_matches

OTHER_ACTION = "other action"
OTHER_CLIENT = "not this client"
NO_SUBSTITUTION = "cannot substitute %c/%u"
NO_MATCH = "topic does not match"
DECIDES = "decides"
NOT_REACHED = "not reached"


@dataclass(frozen=True, slots=True)
class RuleOutcome:
    """What one rule did with the request."""

    rule: Rule
    outcome: str
    """`decides`, `not reached` (after the deciding rule), or why it does not apply."""
    pattern: str | None
    """The rule's filter with `%c`/`%u` substituted (None when that cannot be done)."""


@dataclass(frozen=True, slots=True)
class Explanation:
    """An ACL decision with its reasons."""

    enabled: bool
    allowed: bool
    deciding: int | None
    """Index in `steps` of the rule that decided (None: ACL off, or no rule applies)."""
    steps: list[RuleOutcome]
    reason: str
    may_filter: list[int]
    """For a granted SUBSCRIBE: indices of the deny rules on subscribing that apply to the
    client and share topics with its filter. Deliveries to such a client are checked topic by
    topic (`bridge.access.reads.may_read`), so these may leave out messages on some of the
    filter's topics."""


def explain(
    rules: list[Rule] | None,
    action: str,
    client_id: str,
    username: str | None,
    topic: str,
    *,
    private_client_events: bool = False,
) -> Explanation:
    """Why `client_id` (as `username`) may or may not `action` (PUBLISH: a topic name;
    SUBSCRIBE: a filter) on `topic` under `rules` (None: ACL off; then, with
    `private_client_events`, filters that could receive client events are refused, as
    `Acl.subscribe_allowed` does)."""
    if action not in (PUBLISH, SUBSCRIBE):
        raise ValueError(f"action must be {PUBLISH} or {SUBSCRIBE}, got {action!r}")
    if rules is None:
        if private_client_events and action == SUBSCRIBE and may_see_client_events(topic):
            reason = "ACL off with users configured: the $SYS client events are refused"
            return Explanation(False, False, None, [], reason, [])
        return Explanation(False, True, None, [], "ACL off: every request is allowed", [])
    deciding_rule = Acl(rules).first_applying(action, client_id, username, topic)
    steps: list[RuleOutcome] = []
    deciding: int | None = None
    for index, rule in enumerate(rules):
        pattern = substitute(rule.topic_filter, client_id, username)
        if deciding is not None:
            steps.append(RuleOutcome(rule, NOT_REACHED, pattern))
            continue
        outcome = _outcome(rule, pattern, action, client_id, username, topic)
        steps.append(RuleOutcome(rule, outcome, pattern))
        if outcome == DECIDES:
            deciding = index
    decided = None if deciding is None else rules[deciding]
    if decided is not deciding_rule:
        raise AssertionError(f"explanation names {decided}, the ACL decides by {deciding_rule}")
    if decided is None or deciding is None:
        return Explanation(True, False, None, steps, "no rule applies: denied", [])
    allowed = decided.decision is Decision.ALLOW
    where = f" ({decided.source})" if decided.source else ""
    verdict = "allowed" if allowed else "denied"
    reason = f"{verdict} by rule {deciding + 1}{where}: {decided.text()}"
    may_filter = []
    if allowed and action == SUBSCRIBE:
        may_filter = [
            i for i, step in enumerate(steps) if _may_filter(step, client_id, username, topic)
        ]
    return Explanation(True, allowed, deciding, steps, reason, may_filter)


def _outcome(
    rule: Rule,
    pattern: str | None,
    action: str,
    client_id: str,
    username: str | None,
    topic: str,
) -> str:
    if rule.action != "all" and rule.action != action:
        return OTHER_ACTION
    if not rule.applies_to(client_id, username):
        return OTHER_CLIENT
    if pattern is None:
        return NO_SUBSTITUTION
    matched = topic_matches(pattern, topic) if action == PUBLISH else covers(pattern, topic)
    return DECIDES if matched else NO_MATCH


def _may_filter(step: RuleOutcome, client_id: str, username: str | None, topic_filter: str) -> bool:
    rule = step.rule
    return (
        rule.decision is Decision.DENY
        and rule.action in ("all", SUBSCRIBE)
        and rule.applies_to(client_id, username)
        and step.pattern is not None
        and overlaps(step.pattern, topic_filter)
    )
