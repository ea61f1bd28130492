"""Instructions per message of the in-process hot path, counted by valgrind's callgrind.

Run: ``.venv/bin/python tests/bench/instructions.py [--scenario qos1] [--counts 5000,15000]``;
another worktree's code: ``--pythonpath <worktree>`` (as `hot_path.py` is run for it).

On a shared VM the CPU time of one message swings by half from one hour to the next, more than
most changes move it. The number of instructions the process executes does not: this runs
`hot_path.py` under ``valgrind --tool=callgrind`` at two message counts, in parallel, and prints
(instructions at the larger count - at the smaller) / (difference in messages), so start-up,
imports and the warm-up cancel out. Repeated runs of one build agree within about 1%. It counts
the harness's own encoding and decoding too (the same for both builds), and callgrind runs the
code about 60 times slower, so a commit holds as many messages as the window allows. A
comparison of instructions, not of time: memory stalls and system calls are not in it. Needs
Debian's `valgrind` (not installed by `make test`: a tool for A/B, not a benchmark of the suite).
Each run's callgrind file is kept (``--keep DIR``) for ``callgrind_annotate --tree=calling``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from argparse import ArgumentParser
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HOT_PATH = REPO / "tests" / "bench" / "hot_path.py"
TIMEOUT_S = 1800


def count(
    scenario: str,
    messages: int,
    out: Path,
    pythonpath: str | None,
    window: int | None,
    settings: list[str],
) -> subprocess.Popen[str]:
    """hot_path.py for `messages` under callgrind, started (its file: `out`)."""
    env = dict(os.environ)
    python = [sys.executable]
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
        python.append("-P")
    command = [
        "valgrind", "--tool=callgrind", "--cache-sim=no", f"--callgrind-out-file={out}",
        *python, str(HOT_PATH), "--rounds", "1", "--scenarios", scenario,
        "--count", str(messages), "--timeout", str(TIMEOUT_S // 2),
        *(["--window", str(window)] if window else []),
        *(arg for setting in settings for arg in ("--set", setting)),
    ]  # fmt: skip
    return subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenario", default="qos1", choices=["qos1", "qos0", "fanout"])
    ap.add_argument("--counts", default="5000,15000", help="two message counts, smaller first")
    ap.add_argument("--pythonpath", help="measure the bridge of this worktree")
    ap.add_argument("--keep", type=Path, help="keep the callgrind files in this directory")
    ap.add_argument(
        "--window",
        type=int,
        help="hot_path.py's messages in flight (its default: 20); a small one shows what each "
        "commit and read costs besides its messages",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a node setting, passed to hot_path.py (e.g. acl_file=FILE); repeatable",
    )
    args = ap.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind not found: apt-get install valgrind", file=sys.stderr)
        return 2
    try:
        small, large = (int(c) for c in args.counts.split(","))
    except ValueError:
        ap.error("--counts takes two integers, e.g. 5000,15000")
    if not 0 < small < large:
        ap.error("--counts: the first must be positive and smaller than the second")
    out_dir = args.keep or Path(tempfile.mkdtemp(prefix="instructions-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = {
        n: count(
            args.scenario, n, out_dir / f"callgrind.{n}", args.pythonpath, args.window, args.set
        )
        for n in (small, large)
    }
    totals = {}
    for n, proc in runs.items():
        try:
            output, _ = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for other in runs.values():
                other.kill()
            print(f"the run of {n} messages took over {TIMEOUT_S} s", file=sys.stderr)
            return 1
        found = re.search(r"Collected : (\d+)", output)
        if proc.returncode != 0 or found is None or " ok" not in output:
            print(output[-2000:], file=sys.stderr)
            print(f"the run of {n} messages failed", file=sys.stderr)
            return 1
        totals[n] = int(found.group(1))
        print(f"{args.scenario} {n:>8,} messages: {totals[n]:>16,} instructions")
    per = (totals[large] - totals[small]) / (large - small)
    kept = f" (callgrind files in {out_dir})" if args.keep is not None else ""
    print(f"{args.scenario}: {per:,.0f} instructions per message{kept}")
    if args.keep is None:
        shutil.rmtree(out_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
