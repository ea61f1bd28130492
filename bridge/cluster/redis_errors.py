"""The errors of redis-py, for `except` clauses of code that runs with or without Redis.

redis-py is 10 MiB of a node's resident memory; a node on the embedded defaults never talks to
Redis, so it never imports it. Such a node cannot meet a Redis error either: until redis-py is
imported, `redis_errors` names only the other errors it is given.
"""

from __future__ import annotations

import sys


def redis_errors(*others: type[BaseException]) -> tuple[type[BaseException], ...]:
    """`others`, and redis-py's base error once redis-py is imported."""
    exceptions = sys.modules.get("redis.exceptions")
    if exceptions is None:
        return others
    return (exceptions.RedisError, *others)
