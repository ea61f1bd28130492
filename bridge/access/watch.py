"""Settings every node of a cluster applies at once (access rules, bans, limits): follow their
change channel in Redis, and keep the single-node copy in a file that is replaced whole.

`follow_changes` is the loop each of them runs: subscribe, re-read what may have been missed,
re-read on every change message, and on any Redis failure start over a moment later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bridge.cluster.pubsub_read import published
from bridge.cluster.redis_errors import redis_errors
from bridge.private_files import make_private_dir, open_private

log = logging.getLogger("bridge.access")

RESUBSCRIBE_DELAY = 1.0
"""Seconds before subscribing again after Redis failed."""
STOP_WAIT = 5.0
"""Seconds `stop_following` keeps cancelling a follower before leaving it behind."""


async def follow_changes(
    redis: Any,
    channel: str,
    what: str,
    subscribed: Callable[[bool], Awaitable[None]],
    changed: Callable[[], Awaitable[None]],
    failed: Callable[[], None] = lambda: None,
) -> None:
    """Forever (until cancelled): subscribe to `channel`, await `subscribed(first)` (True on
    the first subscription: re-read what changed while not listening), then `changed()` on
    every message. A Redis failure calls `failed()`, is logged naming `what`, and the loop
    subscribes again after `RESUBSCRIBE_DELAY`."""
    first = True
    while True:
        pubsub = redis.pubsub()
        try:
            await pubsub.subscribe(channel)
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                # redis-py (8.1) swallows a cancel that lands while it connects: `stop` right
                # after `start` would wait for ever on `listen()`.
                raise asyncio.CancelledError
            await subscribed(first)
            first = False
            # Not `listen()`: a connection that timed out is started over on a new one
            # (`bridge.cluster.pubsub_read`).
            async for _ in published(pubsub, channel):
                await changed()
        except redis_errors(OSError) as exc:
            failed()
            log.warning("not listening for %s changes in Redis (%s); retrying", what, exc)
        finally:
            with contextlib.suppress(*redis_errors(OSError)):
                await pubsub.aclose()
        await asyncio.sleep(RESUBSCRIBE_DELAY)


async def stop_following(task: asyncio.Task[None] | None) -> None:
    """Cancel a `follow_changes` task and wait for it to end. redis-py (8.1) can swallow a
    cancel that lands while it (re)connects, so the cancel is repeated until the task ends
    (for at most `STOP_WAIT` s: a shutdown never hangs on it)."""
    if task is None:
        return
    deadline = asyncio.get_running_loop().time() + STOP_WAIT
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=0.1)
        if asyncio.get_running_loop().time() >= deadline:
            log.warning("a Redis change follower did not stop in %.0f s: left behind", STOP_WAIT)
            return
    with contextlib.suppress(asyncio.CancelledError, Exception):
        task.result()


def replace_file(path: Path, text: str) -> None:
    """Write `text` to a temporary file, fsync it, rename it over `path`, fsync the directory:
    after a crash the file holds the old content or the new one, whole. Mode 0600."""
    make_private_dir(path.parent)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(open_private(temporary, os.O_WRONLY | os.O_TRUNC), "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
