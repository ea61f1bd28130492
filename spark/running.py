"""Running the streaming job's queries: started one after another, awaited until the job is
told to stop (or `--for` ends, or all data is read with `--available-now`), and restarted from
their checkpoints when one fails, as `RestartPolicy` allows.

`spark/jobs.py` defines the queries; this module only starts, watches and stops them.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable

from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming import StreamingQuery

from spark.restarts import RestartPolicy

log = logging.getLogger("spark.jobs")

_INITIALIZING = ("Initializing StreamExecution", "Initializing sources")
"""A query's status messages until its source is running (Spark's `StreamExecution`)."""

SOURCE_START_TIMEOUT_S = 60.0
"""The longest wait for one query's source before the next query starts anyway."""


def started(query: StreamingQuery) -> StreamingQuery:
    """`query`, once its source runs: the source's Python worker has connected back to Spark,
    or the query has failed trying. The queries' workers so start one after another: Spark
    gives each 10 s to connect back, which four starting at once can miss on a busy machine."""
    deadline = time.monotonic() + SOURCE_START_TIMEOUT_S
    while query.isActive and query.status["message"] in _INITIALIZING:
        if time.monotonic() > deadline:
            log.warning("query %s: its source is still starting; starting the next", query.name)
            break
        time.sleep(0.1)
    return query


def supervise(
    start: Callable[[], list[StreamingQuery]],
    finish: Callable[[], None],
    *,
    available_now: bool,
    deadline: float | None,
    stop: threading.Event,
    restarts: RestartPolicy | None = None,
) -> int:
    """Start the queries (`start`), wait for them, and return the job's exit status.

    When they end well (or `stop` is set, or `deadline` passes), `finish` runs and the status
    is 0. A query that fails stops them all; they are started again after the wait `restarts`
    gives, and when it gives none (failures come too often) the job prints why and the status
    is 1."""
    restarts = restarts or RestartPolicy()
    while True:
        failed = await_queries(start(), available_now, deadline, stop)
        if failed is None:
            finish()
            return 0
        wait = restarts.failed(time.monotonic())
        if wait is None:
            print(f"error: query {failed[0]} failed: {failed[1]} ({restarts.limit + 1} failures "
                  f"within {restarts.window_s:.0f} s)", file=sys.stderr)  # fmt: skip
            return 1
        log.error("query %s failed (%s); restarting from the checkpoints in %.0f s",
                  *failed, wait)  # fmt: skip
        if deadline is not None:
            wait = min(wait, max(0.0, deadline - time.monotonic()))
        if stop.wait(wait) or (deadline is not None and time.monotonic() >= deadline):
            log.info("stopping before the restart; the checkpoints hold where to resume")
            return 0


def await_queries(
    queries: list[StreamingQuery],
    available_now: bool,
    deadline: float | None,
    stop: threading.Event,
) -> tuple[str, str] | None:
    """Wait as asked, then stop the queries; None when they ended well (or were asked to
    stop), else (query name, first line of its error)."""
    failure = None
    while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
        try:
            for query in queries:
                with contextlib.suppress(StreamingQueryException):
                    query.awaitTermination(0.2)
        except Exception:
            if stop.is_set():  # a signal to the whole process group stops the JVM too
                break
            raise
        ended = [q for q in queries if not q.isActive]
        failure = next(
            ((q.name or "?", str(q.exception())) for q in ended if q.exception() is not None),
            None,
        )
        if failure is not None or (ended and (not available_now or len(ended) == len(queries))):
            break
    for query in queries:
        try:
            query.stop()
        except Exception as exc:  # the JVM may be going down with us
            if not stop.is_set():
                raise
            log.info("stopping %s: %s", query.name, str(exc).strip().splitlines()[0][:200])
    if failure is None or stop.is_set():
        return None
    return failure[0], failure[1].strip().splitlines()[0][:300]
