"""A session's positions in the parts of the queues it reads.

A store may hold a queue in several parts with offsets of their own (RocketMQ: one per broker
group, see `MessageStore.parts`); a session keeps one cursor per part, under the part's name.
These helpers start, stop and complete those cursors; everything else (delivery, wakes,
backlogs) works on parts as on any queue.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from bridge.session import Session
from bridge.storage.base import MessageStore, StoreUnavailable

__all__ = [
    "learn_ends",
    "parts_read",
    "queues_read",
    "start_new_parts",
    "start_reading",
    "start_reading_at",
    "stop_reading",
]

Ends = Callable[[str], int]
"""A part's end now; raises StoreUnavailable when it cannot be known."""


async def start_reading(store: MessageStore, session: Session, queue: str) -> None:
    """Begin reading every part of `queue` the session does not read yet, each at its end now
    (new messages only). Raises StoreUnavailable when an end cannot be learned."""
    missing = [part for part in store.parts(queue) if part not in session.cursors]
    if not missing:
        return
    if len(missing) == 1:
        ends = [await store.track_queue(missing[0])]
    else:
        ends = await asyncio.gather(*(store.track_queue(part) for part in missing))
    for part, end in zip(missing, ends, strict=True):
        session.start_queue(part, end)


def start_reading_at(store: MessageStore, session: Session, queue: str, ends: Ends) -> None:
    """`start_reading` with the parts' ends from `ends` (no await: the caller registers the
    queue's filter in the same step, so no message routed to it in between is skipped)."""
    missing = [part for part in store.parts(queue) if part not in session.cursors]
    found = [(part, ends(part)) for part in missing]  # all or none
    for part, end in found:
        session.start_queue(part, end)


async def learn_ends(store: MessageStore, session: Session, queues: Iterable[str]) -> Ends:
    """The ends of the parts of `queues` the session does not read yet, asked of the store at
    once; a part whose end could not be learned raises StoreUnavailable when looked up. With
    `store.traits.local_ends` nothing is asked: the store's own ends are the truth."""
    if store.traits.local_ends:
        return store.end_offset
    parts = list(
        dict.fromkeys(p for q in queues for p in store.parts(q) if p not in session.cursors)
    )
    answers = await asyncio.gather(
        *(store.track_queue(part) for part in parts), return_exceptions=True
    )
    known = dict(zip(parts, answers, strict=True))

    def end_of(part: str) -> int:
        answer = known.get(part)
        if isinstance(answer, int):
            return answer
        if isinstance(answer, StoreUnavailable):
            raise answer
        if isinstance(answer, BaseException):
            raise StoreUnavailable(str(answer)) from answer
        return store.end_offset(part)  # not asked (already read): never called then

    return end_of


def parts_read(store: MessageStore, session: Session, queue: str) -> list[str]:
    """The parts of `queue` the session has a cursor for."""
    of = store.queue_of_part
    return [part for part in session.cursors if part == queue or of(part) == queue]


def stop_reading(store: MessageStore, session: Session, queue: str) -> None:
    """Stop reading every part of `queue` (after UNSUBSCRIBE)."""
    for part in parts_read(store, session, queue):
        session.forget_queue(part)


def queues_read(store: MessageStore, session: Session) -> set[str]:
    """The queues whose parts the session reads."""
    of = store.queue_of_part
    return {of(part) or part for part in session.cursors}


def start_new_parts(store: MessageStore, session: Session) -> bool:
    """Give a session a cursor at 0 for every part of its queues it has none for, and move
    positions kept under a queue's own name (written before queues had parts) to their part.

    Used when a session is restored and when a store learns of new parts (a broker group
    added): a part the session has no position in was not known when the session began to
    read the queue, so everything in it came after (offset 0). True if anything changed.
    """
    changed = False
    upgrade = store.upgrade_part
    for name in list(session.cursors):
        part = upgrade(name)
        if part != name:
            session.cursors[part] = session.cursors.pop(name)
            below = session.pop_resend_below(name)
            if below is not None:
                session.set_resend_below(part, below)
            changed = True
    for queue in queues_read(store, session):
        for part in store.parts(queue):
            if part not in session.cursors:
                session.start_queue(part, 0)
                changed = True
    return changed


async def reread_ends(
    store: MessageStore, parts: Iterable[str], limit: asyncio.Semaphore
) -> list[str]:
    """Ask the store for the end of each of `parts` (at most `limit` at once); one it cannot
    tell is left as it is known. Returns those it could not tell."""
    failed: list[str] = []

    async def reread(part: str) -> None:
        async with limit:
            try:
                await store.track_queue(part)
            except StoreUnavailable:
                failed.append(part)

    await asyncio.gather(*(reread(part) for part in parts))
    return failed
