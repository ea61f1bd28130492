"""Whether a message may be delivered to a client under the ACL's rules on reading.

A topic may be read when the first rule on subscribing that matches it (among those that apply
to the client, `%c`/`%u` filled in) allows it. Asking that at every delivery would put a rule
walk, or a cache lookup keyed by (client, topic), on the hot path. But a message reaches a
client only through one of its filters, and for most filters the rules give one answer to every
topic below them: `alice/#` under `allow user:alice all alice/#`, or `bench/1/t` past a
`deny all subscribe bench/+/private` that shares no topic with it. So the answer is worked out
per filter (`filter_verdict`), once per rule set:

- every filter of the session is wholly readable: its deliveries need no check at all;
- otherwise (a deny rule narrower than one of its filters, or a filter the changed rules no
  longer grant, which keeps its queue but delivers nothing the rules refuse) each topic is asked
  once and its answer kept in the session (`Session.read_verdicts`, one dictionary lookup per
  delivery, at most `VERDICTS_KEPT` topics).

The session holds the rules' generation its verdicts were reached under
(`Session.reads_judged`, set to -1 when a filter is added or another user name resumes it), so
a change of rules (SIGHUP, `acl_redis`), a session restored from disk or adopted from a node
with other rules is judged anew at its next delivery. Pure: no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge.access.acl import VERDICTS_KEPT, ReadRule, covers, overlaps
from bridge.mqtt.topics import parse_shared

if TYPE_CHECKING:
    from bridge.access.acl import Acl
    from bridge.session import Session


def filter_verdict(rules: list[ReadRule], topic_filter: str) -> bool | None:
    """True if `rules` let the client read every topic `topic_filter` can match, False if none,
    None if it depends on the topic.

    A topic of the filter is decided by the first rule matching it; such a rule shares that
    topic with the filter, and comes no later than the first rule covering the filter whole
    (which matches every topic of it). Topics no rule matches are denied, which can happen only
    when no rule covers the filter. So the decisions the filter's topics can get are among
    those of the rules overlapping it up to the first covering one, plus a denial if none
    covers; when those all agree, that is the answer for the whole filter."""
    may_allow = may_deny = False
    for pattern, allow in rules:
        if covers(pattern, topic_filter):
            if allow:
                may_allow = True
            else:
                may_deny = True
            break
        if overlaps(pattern, topic_filter):
            if allow:
                may_allow = True
            else:
                may_deny = True
            if may_allow and may_deny:
                return None
    else:
        may_deny = True
    if may_allow and may_deny:
        return None
    return may_allow


def topic_verdict(rules: list[ReadRule], topic: str) -> bool:
    """Whether the first of `rules` that matches topic name `topic` allows it (none: denied)."""
    for pattern, allow in rules:
        if covers(pattern, topic):  # a topic name is the narrowest filter
            return allow
    return False


def cleared(acl: Acl, session: Session) -> bool:
    """Whether deliveries to `session` need no check: the rules are off, or under those in
    force every filter of the session is wholly readable (the hot path asks this first)."""
    return acl.rules is None or (
        session.reads_judged == acl.generation and session.read_verdicts is None
    )


def checks_reads(acl: Acl | None, session: Session | None) -> bool:
    """Whether a delivery to `session` must ask `may_read` (rules in force, a connected session
    not `cleared`)."""
    return acl is not None and session is not None and not cleared(acl, session)


def may_read(acl: Acl, session: Session | None, username: str | None, topic: str) -> bool:
    """Whether a message on `topic` may be delivered to `session`'s client (logged in as
    `username`) under `acl`'s rules; remembers in the session what it worked out."""
    if acl.rules is None:
        return True
    if session is None:
        return True  # not connected to a session: nothing is delivered to it
    if session.reads_judged != acl.generation:
        judge(acl, session, username)
    verdicts = session.read_verdicts
    if verdicts is None:
        return True
    verdict = verdicts.get(topic)
    if verdict is None:
        verdict = topic_verdict(acl.read_rules(session.client_id, username), topic)
        if len(verdicts) >= VERDICTS_KEPT:
            verdicts.clear()
        verdicts[topic] = verdict
    return verdict


def judge(acl: Acl, session: Session, username: str | None) -> None:
    """Work out, under the rules in force, whether every filter of the session is wholly
    readable (`Session.read_verdicts` None) or its topics must be asked one by one (an empty
    dictionary to keep their answers in)."""
    rules = acl.read_rules(session.client_id, username)
    session.read_verdicts = None if _all_readable(rules, session) else {}
    session.reads_judged = acl.generation


def _all_readable(rules: list[ReadRule], session: Session) -> bool:
    """Whether the rules let the client read every topic of every filter of the session (a
    shared subscription counts as its inner filter, as SUBSCRIBE checks it)."""
    for topic_filter in session.subscriptions:
        if filter_verdict(rules, topic_filter) is not True:
            return False
    for share_filter in session.shared:
        parsed = parse_shared(share_filter)
        inner = parsed[1] if parsed is not None else share_filter
        if filter_verdict(rules, inner) is not True:
            return False
    return True
