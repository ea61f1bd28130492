"""Who a session belongs to: the identity that made it, and whether a CONNECT may take it.

A session (and the live connection on it) is bound to the authenticated identity of the client
that made it: `user:NAME` for a user name (a password's, an enhanced authentication's, or a
client certificate's under `tls_cn_as_username`), `anonymous` for a client without one. The
same words name them as the ACL's `who` column does. A CONNECT with the session's ClientId by
another identity is refused (CONNACK 0x87 Not authorized; 3.1.1: 5): it neither resumes the
session nor closes the owner's connection. The binding lives and ends with the session (clean
session ended, expiry), so a ClientId is free again once its session is gone.

A node that authenticates nobody binds nothing: a user name it never checked proves no one's
identity, and refusing on it would only break clients that change the name they claim. A
session made then, or by a version before bindings, is unbound; the first identity that resumes
it under authentication becomes its owner.

Pure: no I/O. The node (`bridge.node.lifecycle`) and the cluster registry (its `claim` checks
and records the identity in Redis atomically) act on what these functions say.
"""

from __future__ import annotations

ANONYMOUS = "anonymous"
"""The identity of a client that gave no user name (when the node admits such clients)."""
USER_PREFIX = "user:"


def identity_of(username: str | None, authenticating: bool) -> str | None:
    """The identity a CONNECT acts as (`user:NAME` or `anonymous`), or None when the node
    authenticates nobody (then sessions are not bound)."""
    if not authenticating:
        return None
    return ANONYMOUS if username is None else USER_PREFIX + username


def refusal(owner: str | None, identity: str | None) -> str | None:
    """Why a CONNECT by `identity` may not take a session (or connection) bound to `owner`, in
    words for the log and the reason string; None if it may (unbound, same identity, or a node
    that binds nothing)."""
    if owner is None or identity is None or owner == identity:
        return None
    # The client is not told whose session it is: that would name a user to an intruder.
    return f"the ClientId's session belongs to another identity than {describe(identity)}"


def describe(identity: str) -> str:
    """An identity as a log line names it, the user name quoted and escaped (client input)."""
    if identity.startswith(USER_PREFIX):
        return f"user {identity[len(USER_PREFIX) :]!r}"
    return identity
