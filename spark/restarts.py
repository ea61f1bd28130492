"""When the streaming job restarts its failed queries, and when it gives up.

A query of the BI stream fails for reasons that pass: a broker group restarting, or Spark's
Python worker not connecting back within Spark's fixed 10 s while the machine is busy. A
restart from the checkpoints is exactly-once, so the job restarts. It waits before each restart,
twice as long as before while failures follow one another (a busy minute is waited out, not met
four times in a row), and gives up only when more than `limit` failures fall within `window_s`.
Failures older than the window are forgotten: a job that runs for months restarts as often as
it needs to over that time, and exits only when something stays broken.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class RestartPolicy:
    """Counts a job's recent failures and answers how long to wait before the next restart."""

    limit: int = 10
    """Failures within `window_s` that are restarted; one more and the job gives up."""
    window_s: float = 600.0
    """How long a failure counts against the job."""
    first_wait_s: float = 2.0
    """The wait after a failure with none other in the window; each further one doubles it."""
    max_wait_s: float = 60.0
    """The longest wait between restarts."""
    _failures: deque[float] = field(default_factory=deque, repr=False)

    def failed(self, now: float) -> float | None:
        """Record a failure at `now` (monotonic seconds). Returns the seconds to wait before
        restarting, or None when the job should give up."""
        self._failures.append(now)
        while self._failures[0] <= now - self.window_s:
            self._failures.popleft()
        recent = len(self._failures)
        if recent > self.limit:
            return None
        return min(self.max_wait_s, self.first_wait_s * 2 ** (recent - 1))
