"""`make mutation`: mutmut over the pure rooms, one room at a time, then each room's score.

    python -m tests.mutation_run [--jobs N] [--room-timeout S] [--score-only] [ROOM ...]

Run from the repository root on pure Python (`make pure`: mutmut mutates the .py files, a
compiled module would run instead). Rooms and their tests are in tests/mutation.py. mutmut keeps
its work in ./mutants (ignored by git): results of earlier runs are kept there and the rooms
named are run again. The score of a room is killed / (killed + survived + timeouts +
suspicious); mutants no chosen test calls ("no tests") are counted and listed apart.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from fnmatch import fnmatch
from pathlib import Path

from tests.mutation import ROOMS

MUTANTS = Path("mutants")

# mutmut's exit codes for a mutant (mutmut/stats.py), in the words this report uses.
KILLED = {1, 3}
SURVIVED = {0}
NO_TESTS = {5, 33}
TIMEOUT = {36, -24, 24, 152, 255}


def status(exit_code: int | None) -> str:
    """A mutant's result: killed, survived, timeout, no tests, not run or suspicious."""
    if exit_code is None:
        return "not run"
    for name, codes in (
        ("killed", KILLED),
        ("survived", SURVIVED),
        ("no tests", NO_TESTS),
        ("timeout", TIMEOUT),
    ):
        if exit_code in codes:
            return name
    return "suspicious"


def results() -> dict[str, int | None]:
    """Every mutant mutmut made, by name, with its last exit code."""
    found: dict[str, int | None] = {}
    for meta in MUTANTS.rglob("*.py.meta"):
        found.update(json.loads(meta.read_text())["exit_code_by_key"])
    return found


def room_results(room: str, found: dict[str, int | None]) -> dict[str, str]:
    patterns = ROOMS[room].mutants
    return {
        name: status(code)
        for name, code in found.items()
        if any(fnmatch(name, pattern) for pattern in patterns)
    }


def report(rooms: list[str]) -> None:
    found = results()
    for room in rooms:
        statuses = room_results(room, found)
        counts = Counter(statuses.values())
        judged = sum(counts[s] for s in ("killed", "survived", "timeout", "suspicious"))
        score = 100.0 * counts["killed"] / judged if judged else 0.0
        print(
            f"{room}: {score:.1f}% killed {counts['killed']}/{judged}, "
            f"survived {counts['survived']}, timeout {counts['timeout']}, "
            f"suspicious {counts['suspicious']}, no tests {counts['no tests']}, "
            f"not run {counts['not run']}"
        )
        for name, what in sorted(statuses.items()):
            if what not in ("killed", "not run"):
                print(f"    {what}: {name}")


def run_room(room: str, jobs: int, timeout: float, again: set[str]) -> bool:
    """mutmut run over one room's mutants (only those whose last result is in `again`, if
    given); False if it failed or ran out of time."""
    names: tuple[str, ...] | list[str] = ROOMS[room].mutants
    if again:
        names = sorted(n for n, s in room_results(room, results()).items() if s in again)
        if not names:
            return True
    command = [
        str(Path(sys.executable).with_name("mutmut")),
        "run",
        "--max-children",
        str(jobs),
        *names,
    ]
    env = {**os.environ, "MQTT_BRIDGE_COMPILE": "0"}
    print(f"== {room}: {' '.join(command[:5])} ... ({len(names)} names)", flush=True)
    # Its own process group: mutmut forks a worker per mutant, and a room out of time is
    # stopped with all of them.
    mutmut = subprocess.Popen(command, env=env, start_new_session=True)
    try:
        return mutmut.wait(timeout=timeout) == 0
    except subprocess.TimeoutExpired:
        os.killpg(mutmut.pid, signal.SIGTERM)
        try:
            mutmut.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(mutmut.pid, signal.SIGKILL)
            mutmut.wait()
        print(f"== {room}: stopped after {timeout:.0f} s", flush=True)
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rooms", nargs="*", help=f"default: all, in order: {' '.join(ROOMS)}")
    parser.add_argument("--jobs", type=int, default=2, help="mutants run at once")
    parser.add_argument(
        "--room-timeout", type=float, default=3600.0, help="seconds one room may take"
    )
    parser.add_argument("--score-only", action="store_true", help="report the last results")
    parser.add_argument(
        "--again",
        default="",
        help="run only the mutants whose last result is one of these (e.g. survived,timeout)",
    )
    args = parser.parse_args()
    rooms = args.rooms or list(ROOMS)
    unknown = sorted(set(rooms) - set(ROOMS))
    if unknown:
        parser.error(f"no room named {', '.join(unknown)}")
    if list(Path("bridge").rglob("*.so")):
        print("compiled modules found: run `make pure` first", file=sys.stderr)
        return 2
    ok = True
    if not args.score_only:
        for room in rooms:
            again = {s.strip() for s in args.again.split(",") if s.strip()}
            ok = run_room(room, args.jobs, args.room_timeout, again) and ok
    report(rooms)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
