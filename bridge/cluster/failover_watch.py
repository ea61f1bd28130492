"""No registry write to a master the Sentinels are deposing: one it confirmed could be lost.

A registry write counts once a replica has it (`WAIT`, `redis_wait_replicas`), so that a Sentinel
failover keeps it. One case defeats that. A master that stops answering for a while (paused, a
long fork, a stalled VM) and wakes up just as the Sentinels judge it down takes writes again
while they promote one of its replicas. The replica they promoted has left it; the other one
still follows it until the Sentinels point it at the new master a second or so later, and it
answers `WAIT`. Then it resynchronises from the new master, and what the old one took is gone:
the nemesis saw a claim and a QoS 2 marker so confirmed and then rolled back, and QoS 2
messages delivered twice because of it.

The Sentinels announce such a failover on their event channels before it happens (`+odown`,
the master objectively down; `+try-failover`). So the registry's client follows those events
on every Sentinel, and from the first `+odown` of its master until the failover ends
(`+switch-master`), or is abandoned (`-failover-abort-*`, or `-odown` with no failover started),
its connections to the master refuse to send (a connection error: the write did not happen, and
the caller says Redis is unavailable, as while the master is down anyway). A command that was
answered after such an announcement, having been sent before it, counts as failed too: it may
be the very write the failover rolls back. A gate that no Sentinel ever reopens opens by itself
after `GATE_MAX` seconds. Where no Sentinel can be heard, writes go on as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from bridge.cluster.pubsub_read import published

log = logging.getLogger("bridge.cluster")

GATE_MAX = 30.0
"""Seconds after which writes go to the master again although no end of its failover was heard
(Sentinel's `failover-timeout` is longer, but a node that missed the end must not stop writing
for ever)."""
RECONNECT_DELAY = 1.0
"""Seconds before a Sentinel whose event connection failed is subscribed to again."""
CHANNELS = (
    "+odown",
    "-odown",
    "+try-failover",
    "+switch-master",
    "-failover-abort-not-elected",
    "-failover-abort-no-good-slave",
    "-failover-abort-slave-timeout",
)


class FailoverWatch:
    """Whether the Sentinels are deposing the master (`suspected`), from their events."""

    def __init__(
        self,
        master_name: str,
        sentinels: list[tuple[str, int]] | None = None,
        sentinel_options: dict[str, Any] | None = None,
    ) -> None:
        self.master_name = master_name
        self.sentinels = sentinels or []
        self.sentinel_options = sentinel_options or {}
        self.suspected_since: float | None = None
        """When the first `+odown` of this gate was heard (monotonic); None: writes go on."""
        self.generation = 0
        """Counts the gates closed: a command sent in an earlier one and answered later may
        have been taken by a master being deposed."""
        self._failing_over = False
        self._master = ""
        """The master the last `+switch-master` named ("ip:port"; "" before any)."""
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def suspected(self) -> bool:
        """True while writes to the master must wait."""
        since = self.suspected_since
        if since is None:
            return False
        if time.monotonic() - since > GATE_MAX:
            self._open(f"no end of its failover heard in {GATE_MAX:.0f} s")
            return False
        return True

    def event(self, channel: str, data: str) -> None:
        """One Sentinel event, as published on `channel` with `data`."""
        words = data.split()
        if channel == "+switch-master":
            # "<name> <old ip> <old port> <new ip> <new port>"
            if words and words[0] == self.master_name:
                self._master = ":".join(words[3:5])
                self._open(f"failover ended: the master is {self._master}")
            return
        # "master <name> <ip> <port> ..."
        if len(words) < 4 or words[0] != "master" or words[1] != self.master_name:
            return
        if self._master and ":".join(words[2:4]) != self._master:
            return  # a slower Sentinel's news of the master deposed already
        if channel == "+odown":
            self._close()
        elif channel == "+try-failover":
            self._failing_over = True
            self._close()
        elif channel == "-odown":
            if not self._failing_over:
                self._open("the master answers the Sentinels again, no failover started")
        elif channel.startswith("-failover-abort"):
            self._open(f"failover abandoned ({channel})")

    def _close(self) -> None:
        if self.suspected_since is None:
            self.suspected_since = time.monotonic()
            self.generation += 1
            log.warning(
                "the Sentinels judge the Redis master %s down: no registry write goes to it "
                "until its failover ends (a write it took now could be rolled back)",
                self.master_name,
            )

    def _open(self, why: str) -> None:
        if self.suspected_since is not None:
            log.warning("registry writes go on (%s)", why)
        self.suspected_since = None
        self._failing_over = False

    # -- following the Sentinels -----------------------------------------------------------------

    def start(self) -> None:
        """Follow every Sentinel's events (in the running loop; once)."""
        if self._tasks or not self.sentinels:
            return
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._follow(host, port)) for host, port in self.sentinels]

    async def stop(self) -> None:
        """Stop following (a client being closed)."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)

    async def _follow(self, host: str, port: int) -> None:
        from redis import asyncio as aioredis
        from redis.exceptions import RedisError

        while True:
            client = aioredis.Redis(host=host, port=port, **self.sentinel_options)
            pubsub = client.pubsub()
            try:
                await pubsub.subscribe(*CHANNELS)
                async for message in published(pubsub, f"Sentinel {host}:{port}'s events"):
                    self.event(_text(message["channel"]), _text(message["data"]))
            except (RedisError, OSError) as exc:
                log.debug("Sentinel %s:%s events not followed: %r", host, port, exc)
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()
                with contextlib.suppress(RedisError, OSError):
                    await client.aclose()
            await asyncio.sleep(RECONNECT_DELAY)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
