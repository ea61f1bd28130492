"""Random schedules of faults on one nemesis cluster (`make nemesis`, not part of `make test`).

    python -m tests.nemesis.schedules --runs 20 --seconds 60 --seed 7

Each run draws, from its seed, faults that start at random seconds of the run and last 3-15 s,
so they overlap (a node cut from Redis while the broker is frozen, a split while a node is
paused); the same seed draws the same schedule, printed before the run, so a failure replays
with `--seed S --runs 1`. Every run is judged as the fault tests judge one fault; the command
exits non-zero if any run broke a rule, and prints a line of counts per run.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

from .cluster import NODE_TIMEOUT, NemesisCluster
from .faults import FAULTS
from .scenario import Schedule, run


def draw(seed: int, seconds: float, known_failing: frozenset[str] = frozenset()) -> Schedule:
    """The schedule of run `seed`: about one fault per 10 s, each from a random second of the
    first three quarters of the run, held 3-15 s (one fault of each kind at most at a time)."""
    rng = random.Random(seed)
    names = sorted(set(FAULTS) - known_failing)
    schedule: Schedule = []
    busy: dict[str, float] = {}
    for _ in range(max(1, int(seconds / 10))):
        name = rng.choice(names)
        at = round(rng.uniform(2.0, seconds * 0.75), 1)
        hold = round(rng.uniform(3.0, 15.0), 1)
        if busy.get(name, -1.0) >= at:
            continue
        busy[name] = at + hold
        schedule.append((FAULTS[name], at, hold))
    return sorted(schedule, key=lambda item: item[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each run's load")
    parser.add_argument("--seed", type=int, default=None, help="seed of the first run")
    parser.add_argument(
        "--include-known",
        action="store_true",
        help="draw also the faults tests/nemesis/test_faults.py marks as failing today",
    )
    args = parser.parse_args(argv)
    if not 1 <= args.runs <= 200 or not 10 <= args.seconds <= 600:
        parser.error("--runs must be 1..200 and --seconds 10..600")
    from .test_faults import KNOWN  # the faults whose failure is known and not fixed yet

    first = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    failed = 0
    with tempfile.TemporaryDirectory(prefix="nemesis-") as work:
        cluster = NemesisCluster(Path(work)).start()
        try:
            for seed in range(first, first + args.runs):
                schedule = draw(
                    seed, args.seconds, frozenset() if args.include_known else frozenset(KNOWN)
                )
                plan = ", ".join(f"{f.name} at {at:g} s for {hold:g} s" for f, at, hold in schedule)
                print(f"seed {seed}: {plan}", flush=True)
                started = time.monotonic()
                last_end = max(at + hold for _, at, hold in schedule)
                try:
                    result = run(
                        cluster,
                        schedule,
                        tag=f"s{seed}",
                        seed=seed,
                        tail_s=max(4.0, args.seconds - last_end),
                    )
                except (AssertionError, ConnectionError, OSError, TimeoutError) as exc:
                    # The cluster did not even let the run start or end (a node that answers no
                    # CONNECT, say): a failed run, with what stopped it.
                    failed += 1
                    print(f"seed {seed}: FAILED before it could be judged: {exc!r}", flush=True)
                    print(cluster.logs(), flush=True)
                    continue
                ok = result.verdict.ok and result.recovery_s <= 2 * NODE_TIMEOUT
                failed += not ok
                took = time.monotonic() - started
                print(
                    f"seed {seed}: {'ok' if ok else 'FAILED'} in {took:.0f} s: "
                    f"{result.verdict.summary()}, served again {result.recovery_s:.1f} s after",
                    flush=True,
                )
                if not ok:
                    print(result.report(), flush=True)
        finally:
            cluster.stop()
    print(f"{args.runs - failed} of {args.runs} runs kept every rule (first seed {first})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
