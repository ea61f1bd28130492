"""QoS 0/1 messages read before they are durable, and taking them back when their write fails.

The embedded store can make a message readable as soon as it is appended (`MessageStore.submit`'s
`early`), so an online subscriber gets it while the group commit's fsync runs, and its latency
does not include the disk's. The publisher's PUBACK still waits for the commit. A crash before the
commit loses the record, not an acknowledged message: the publisher was never acknowledged and
sends it again, a duplicate that QoS 1 allows. QoS 2 is never read early: its subscriber must not
get a message twice.

A write that fails is rolled back, and the offsets it held are given to the next messages. A
reader that already went past them would skip those messages, so the store calls `rewind`
first: every cursor past a queue's new end goes back to it. What was sent from the rolled-back
offsets stays in flight under its packet id until the client acknowledges it; a later message
that gets the same id waits for that (`Delivery._send`), so an old PUBACK cannot complete it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from bridge.session import Session

log = logging.getLogger("bridge.node")


def rewind(
    sessions: Iterable[Session], ends: dict[str, int], moved: Callable[[Session], None]
) -> int:
    """Move every cursor past its queue's new end (`ends`, queue -> end) back to it; `moved`
    is told of each session whose cursor moved. Returns how many sessions moved."""
    count = 0
    for session in sessions:
        cursors = session.cursors
        changed = False
        for queue, end in ends.items():
            cursor = cursors.get(queue)
            if cursor is not None and cursor > end:
                cursors[queue] = end
                changed = True
                sent = session.resend_below.get(queue)
                if sent is not None and sent > end:
                    session.set_resend_below(queue, end)
        if changed:
            count += 1
            moved(session)
            log.warning(
                "client %s was sent messages whose write then failed; it may get them again "
                "when their publishers resend them",
                session.client_id,
            )
    return count
