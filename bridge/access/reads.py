"""Whether a message may be delivered to a client under the ACL's rules on reading.

A SUBSCRIBE is granted only for a filter an `allow` rule covers whole, so most deliveries need
no check: every topic of a granted filter is readable. Two things break that. A `deny` rule
narrower than the filter leaves some of its topics out (`Acl.filters_reads`: those clients are
checked topic by topic). And the rules change (SIGHUP, `acl_redis`), or a session's filters
were granted elsewhere (restored from disk after the file was edited, adopted from a node with
other rules): a filter no rule grants any more must not go on delivering.

So a session carries the rules' generation under which all its filters were last found granted
(`Session.reads_cleared`). Its deliveries pay one integer comparison while that holds; after a
change of rules the first delivery checks its filters once (with the ACL's cached decisions),
and a session with a filter no longer granted is checked topic by topic, like one a deny rule
applies to. Pure: no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge.mqtt.topics import parse_shared

if TYPE_CHECKING:
    from bridge.access.acl import Acl
    from bridge.session import Session


def may_read(acl: Acl, session: Session | None, username: str | None, topic: str) -> bool:
    """Whether a message on `topic` may be delivered to `session`'s client (logged in as
    `username`) under `acl`'s rules; remembers in the session when no check is needed."""
    if acl.rules is None:
        return True
    if session is None:
        return True  # not connected to a session: nothing is delivered to it
    generation = acl.generation
    if session.reads_cleared == generation:
        return True
    client_id = session.client_id
    if not acl.filters_reads(client_id, username) and _all_granted(acl, session, username):
        session.reads_cleared = generation
        return True
    return acl.may_read(client_id, username, topic)


def _all_granted(acl: Acl, session: Session, username: str | None) -> bool:
    """Whether every filter of the session is one the rules grant (a shared subscription is
    checked as its inner filter, as SUBSCRIBE checks it)."""
    client_id = session.client_id
    for topic_filter in session.subscriptions:
        if not acl.subscribe_allowed(client_id, username, topic_filter):
            return False
    for share_filter in session.shared:
        parsed = parse_shared(share_filter)
        inner = parsed[1] if parsed is not None else share_filter
        if not acl.subscribe_allowed(client_id, username, inner):
            return False
    return True
