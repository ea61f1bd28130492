"""ClientId prefixes bound to users: the ACL's `clientid user:NAME PREFIX` lines.

    clientid  user:alice  alice-
    clientid  user:alice  shop-7-
    clientid  user:bob    bob-

A ClientId starting with a bound prefix belongs to the users that prefix is bound to: any other
identity (another user, a client without a user name) is refused it. A user with bound prefixes
may connect only with a ClientId under one of them. When prefixes nest (`shop-` for one user,
`shop-7-` for another), the longest one a ClientId starts with decides whose it is. A prefix
may be bound to several users (lines of the Redis rules may add to the file's). ClientIds no
prefix reserves stay free for every identity without bound prefixes.

Checked at CONNECT, once the ClientId is final (an assigned one, or the user name under
`use_username_as_clientid`, is checked like any), against the user name the ACL judges topics
by; when the rules change, connected clients whose ClientId the new rules refuse are
disconnected (`bridge.node.node`). The refusal never names the owner: that would tell an
intruder which user to attack. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

from bridge.access.acl import CLIENTID, Rule


class ClientIdPrefixes:
    """The prefixes bound to users by the `clientid` lines among `rules`."""

    __slots__ = ("_owners", "_users")

    def __init__(self, rules: Iterable[Rule]) -> None:
        self._owners: dict[str, set[str]] = {}
        """Prefix -> the user names it is bound to."""
        self._users: set[str] = set()
        """Users with at least one bound prefix."""
        for rule in rules:
            if rule.action != CLIENTID:
                continue
            name = rule.who.partition(":")[2]
            self._owners.setdefault(rule.topic_filter, set()).add(name)
            self._users.add(name)

    def __bool__(self) -> bool:
        return bool(self._owners)

    def owners(self, client_id: str) -> set[str] | None:
        """The users the longest prefix `client_id` starts with is bound to; None if no bound
        prefix reserves it."""
        best = ""
        found: set[str] | None = None
        for prefix, users in self._owners.items():
            if len(prefix) > len(best) and client_id.startswith(prefix):
                best, found = prefix, users
        return found

    def refusal(self, client_id: str, username: str | None) -> str | None:
        """Why a client logged in as `username` may not use `client_id`, in words for the log
        and the reason string; None if it may."""
        if not self._owners:
            return None
        owners = self.owners(client_id)
        if owners is not None:
            if username is not None and username in owners:
                return None
            return "the ClientId is under a prefix the ACL binds to another user"
        if username is not None and username in self._users:
            return "the ACL binds this user to ClientId prefixes this ClientId is not under"
        return None
