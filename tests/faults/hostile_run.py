"""The few-minute hostile-client run (issue 36): one bridge process with authentication on, the
hostile clients of tests/support/hostile.py against it from 127.0.0.2-9 while honest QoS 1
traffic runs on 127.0.0.1, then the checks of tests/support/hostile_run.py. Prints the figures;
exits 1 if a check failed. Everything it starts is stopped at the end.

    python -m tests.faults.hostile_run --seconds 180     # or: make hostile SECONDS=180
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from tests.support.hostile import loopback_aliases_usable
from tests.support.hostile_run import access_settings, run_hostile
from tests.support.processes import BridgeProcess


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=180.0, help="length of the attack")
    parser.add_argument("--keep", action="store_true", help="keep the data dir and log")
    args = parser.parse_args()
    unusable = loopback_aliases_usable()
    if unusable:
        print(unusable, file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="hostile-run-"))
    node = BridgeProcess(work / "node", *access_settings(work))
    node.start()
    try:
        report = run_hostile(node, args.seconds)
    finally:
        node.stop()
    print("\n".join(report.lines()))
    problems = report.problems()
    for problem in problems:
        print(f"FAILED: {problem}")
    if args.keep or problems:
        print(f"bridge log: {node.log_path}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
