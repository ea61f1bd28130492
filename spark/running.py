"""Running the streaming job's queries: started one after another, watched until the job is
told to stop (or `--for` ends, or all data is read with `--available-now`), and a query that
fails restarted alone from its checkpoint, as `RestartPolicy` allows.

`spark/jobs.py` defines the queries; this module only starts, watches and stops them.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence

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


Starters = dict[str, Callable[[], StreamingQuery]]
"""Queries by name, each as the function that starts it (`spark.stream.stream_starters`)."""


def supervise(
    stages: Sequence[Starters],
    finish: Callable[[], None],
    *,
    available_now: bool,
    deadline: float | None,
    stop: threading.Event,
    restarts: RestartPolicy | None = None,
) -> int:
    """Start the queries (each by its function in `stages`, one after another, stage by
    stage), watch them, and return the job's exit status.

    A later stage reads what an earlier one writes: with `available_now`, each stage runs until
    all its queries have read what there is, then the next starts; otherwise all run at once.
    When they end well (or `stop` is set, or `deadline` passes), they are stopped, `finish`
    runs and the status is 0. A query that fails is started again, alone, after the wait
    `restarts` gives, while the others run on (each has its own checkpoint); when it gives none
    (failures come too often) every query is stopped, the job prints why and the status is 1."""
    restarts = restarts or RestartPolicy()
    if not available_now:
        stages = [{name: start for stage in stages for name, start in stage.items()}]
    running: dict[str, StreamingQuery] = {}
    try:
        for stage in stages:
            status = _run_stage(stage, running, available_now, deadline, stop, restarts)
            if status is not None:
                return status
            if stop.is_set() or (deadline is not None and time.monotonic() >= deadline):
                break
    finally:
        _stop_all(running, stop)
    finish()
    return 0


def _run_stage(
    starters: Starters,
    running: dict[str, StreamingQuery],
    available_now: bool,
    deadline: float | None,
    stop: threading.Event,
    restarts: RestartPolicy,
) -> int | None:
    """Run one stage's queries (kept in `running`, for the caller to stop) until they are done
    or the job is told to stop: None, go on; or the job's exit status, now."""
    stage: dict[str, StreamingQuery] = {}
    for name, start in starters.items():
        stage[name] = running[name] = started(start())
    while (failed := _watch(stage, available_now, deadline, stop)) is not None:
        name, error = failed
        wait = restarts.failed(time.monotonic())
        if wait is None:
            print(f"error: query {name} failed: {error} ({restarts.limit + 1} failures "
                  f"within {restarts.window_s:.0f} s)", file=sys.stderr)  # fmt: skip
            return 1
        log.error("query %s failed (%s); restarting it from its checkpoint in %.0f s",
                  name, error, wait)  # fmt: skip
        if deadline is not None:
            wait = min(wait, max(0.0, deadline - time.monotonic()))
        if stop.wait(wait) or (deadline is not None and time.monotonic() >= deadline):
            log.info("stopping before the restart; the checkpoints hold where to resume")
            return 0
        stage[name] = running[name] = started(starters[name]())
    return None


def _watch(
    running: dict[str, StreamingQuery],
    available_now: bool,
    deadline: float | None,
    stop: threading.Event,
) -> tuple[str, str] | None:
    """Wait until a query fails, (name, first line of its error), or until the job is done:
    None when told to stop, at the deadline, when any query ended on its own (or, with
    `available_now`, when all of them have)."""
    while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
        try:
            for query in running.values():
                with contextlib.suppress(StreamingQueryException):
                    query.awaitTermination(0.2)
        except Exception:
            if stop.is_set():  # a signal to the whole process group stops the JVM too
                return None
            raise
        ended = {name: query for name, query in running.items() if not query.isActive}
        for name, query in ended.items():
            error = query.exception()
            if error is not None and not stop.is_set():
                return name, str(error).strip().splitlines()[0][:300]
        if ended and (not available_now or len(ended) == len(running)):
            return None
    return None


def _stop_all(running: dict[str, StreamingQuery], stop: threading.Event) -> None:
    for query in running.values():
        try:
            query.stop()
        except Exception as exc:  # the JVM may be going down with us
            if not stop.is_set():
                raise
            log.info("stopping %s: %s", query.name, str(exc).strip().splitlines()[0][:200])
