#!/usr/bin/env python3
"""Issue 36: "login of a legitimate client from another address within 1 s during a 300-socket
wrong-password flood that also streams PUBLISH packets, with RSS growth under 256 MiB".

    .venv/bin/python -m tests.bench.login_flood [--runs 5] [--logins 5] [--modes logins-only]

Per mode and run: a fresh bridge process (tests/support/processes.py: a password file with one
Argon2id user, anonymous clients refused, `auth_cache_ttl = 0` so that every honest login is
hashed too, debug logging as in the tests), one unreported login to warm it, then the flood of
tests/support/login_flood.py from 127.0.0.2 (`streaming`: each of its 300 sockets sends a wrong
password and then 256 KiB PUBLISHes without waiting; `logins-only`: only the wrong password),
and meanwhile `--logins` honest logins from 127.0.0.1, one after the other, 0.1 s apart, each
timed from connecting to its CONNACK. Runs alternate the modes, so a drift in the machine's load
favours neither. Printed: every login's seconds, per mode p50 and max over all runs, the RSS
growth and the flood's outcomes. Exits 1 if an honest login was not accepted (the figures are
reported, never judged: the machine is shared).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bridge.access.hashes import hash_password
from tests.support.hostile_run import rss_bytes
from tests.support.login_flood import HONEST_PASSWORD, Flood, flood_source_usable, timed_login
from tests.support.processes import BridgeProcess

MODES = {"streaming": True, "logins-only": False}
"""Mode name -> whether the flood's sockets stream PUBLISHes after their CONNECT."""


def one_run(work: Path, publishes: bool, logins: int) -> tuple[list[float], int, str, int]:
    """The honest logins' seconds, the RSS growth in bytes, the flood's outcomes, and how many
    honest logins were not accepted."""
    passwd = work / "passwd"
    passwd.write_text(f"alice:{hash_password(HONEST_PASSWORD)}\n")
    passwd.chmod(0o600)
    node = BridgeProcess(
        work / "node", f"password_file={passwd}", "allow_anonymous=false", "auth_cache_ttl=0"
    )
    node.start()
    try:
        timed_login(node.port)
        rss_before = rss_bytes(node.pid)
        # Long enough for every login even at LOGIN_WAIT each; stopped once they are done.
        flood = Flood(node.port, node.pid, publishes=publishes, seconds=8.0 + logins * 2)
        flood.start()
        times: list[float] = []
        refused = 0
        try:
            if not flood.under_way.wait(8.0):
                raise SystemExit("the flood did not get going")
            for _ in range(logins):
                connack, seconds = timed_login(node.port)
                times.append(seconds)
                refused += connack is None or connack.return_code != 0
                time.sleep(0.1)
        finally:
            flood.stop()
        growth = max(flood.peak_rss, rss_bytes(node.pid)) - rss_before
        return times, growth, str(dict(flood.outcomes)), refused
    finally:
        node.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per mode")
    parser.add_argument("--logins", type=int, default=5, help="honest logins per run")
    parser.add_argument("--modes", default="streaming,logins-only", help="comma-separated")
    args = parser.parse_args()
    unusable = flood_source_usable()
    if unusable:
        print(unusable, file=sys.stderr)
        return 2
    modes = [mode for mode in args.modes.split(",") if mode]
    if not modes or any(mode not in MODES for mode in modes):
        parser.error(f"--modes: one or more of {', '.join(MODES)}")
    all_times: dict[str, list[float]] = {mode: [] for mode in modes}
    growths: dict[str, list[int]] = {mode: [] for mode in modes}
    not_accepted = 0
    for run in range(args.runs):
        for mode in modes:
            work = Path(tempfile.mkdtemp(prefix="login-flood-"))
            try:
                times, growth, outcomes, refused = one_run(work, MODES[mode], args.logins)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            all_times[mode] += times
            growths[mode].append(growth)
            not_accepted += refused
            print(
                f"run {run + 1} {mode}: honest CONNACK in {' '.join(f'{t:.2f}' for t in times)}"
                f" s; RSS +{growth / 2**20:.0f} MiB; flood {outcomes}",
                flush=True,
            )
    for mode in modes:
        times = all_times[mode]
        print(
            f"{mode}: {len(times)} logins, p50 {statistics.median(times):.2f} s, max "
            f"{max(times):.2f} s; RSS growth max {max(growths[mode]) / 2**20:.0f} MiB"
        )
    if not_accepted:
        print(f"FAILED: {not_accepted} honest logins not accepted")
    return 1 if not_accepted else 0


if __name__ == "__main__":
    sys.exit(main())
