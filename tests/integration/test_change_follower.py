"""The loop that follows a settings change channel in Redis (`bridge.access.watch.follow_changes`)
against a real Redis, through a connection whose socket fails as a long network cut makes it
fail."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.support.redis import LocalRedis

FOLLOWER = textwrap.dedent(
    """
    import asyncio, errno, sys
    from redis import asyncio as aioredis
    from bridge.access.watch import follow_changes

    class Recording:
        '''The client, with the pubsub objects the follower made.'''
        def __init__(self, client):
            self.client, self.made = client, []
        def pubsub(self):
            self.made.append(self.client.pubsub())
            return self.made[-1]

    async def main():
        redis = Recording(aioredis.Redis.from_url(sys.argv[1]))
        firsts = []
        async def subscribed(first):
            firsts.append(first)
        async def changed():
            pass
        task = asyncio.create_task(follow_changes(redis, "changes", "test", subscribed, changed))
        while not firsts:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # the follower now waits in its blocking read
        # What the transport does when the kernel reports the TCP connection timed out.
        reader = redis.made[0].connection._reader
        reader.set_exception(TimeoutError(errno.ETIMEDOUT, "Connection timed out"))
        while len(firsts) < 2:
            await asyncio.sleep(0.05)
        print("subscribed again", flush=True)
        task.cancel()

    asyncio.run(main())
    """
)


def test_a_follower_whose_socket_timed_out_subscribes_again_instead_of_spinning(
    redis_server: LocalRedis,
) -> None:
    """redis-py answers a blocking pubsub read whose socket failed with ETIMEDOUT as "no
    message", and `listen()` reads the dead socket again at once without yielding: a node whose
    link to Redis was cut long enough spun at 100% CPU and served nothing (found by the nemesis).
    The follower must start over on a new connection instead."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", FOLLOWER, redis_server.url],
            capture_output=True,
            text=True,
            timeout=15,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            "the follower never subscribed again (its event loop spun on the dead socket)"
        ) from exc
    assert done.returncode == 0, done.stderr[-2000:]
    assert "subscribed again" in done.stdout
