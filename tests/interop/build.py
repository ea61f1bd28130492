"""Build the interop drivers once per machine, into a cache outside the checkout.

Each folder of tests/interop/ with a build.sh is one client library's driver
(tests/interop/README.md). Its build is kept in ~/.cache/mqtt-bridge/interop/<folder>-<hash>, the
hash over every file of the folder, so the pinned versions and the sources decide when it is built
again: a clean clone on a machine that built the same drivers compiles nothing.

    python3 tests/interop/build.py            # build what is missing, all folders
    python3 tests/interop/build.py node go    # some; prints each driver's run command
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = Path(
    os.environ.get("MQTT_BRIDGE_INTEROP_CACHE", Path.home() / ".cache/mqtt-bridge/interop")
)
# What a driver's folder may hold that is not an input of its build.
IGNORED = {"node_modules", "target", "__pycache__"}


def drivers() -> list[str]:
    """The folders that build a driver, by name."""
    return sorted(p.parent.name for p in HERE.glob("*/build.sh"))


def source_hash(name: str) -> str:
    """A hash of every file of the driver's folder, names and contents."""
    digest = hashlib.sha256()
    folder = HERE / name
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if path.is_dir() or IGNORED.intersection(relative.parts):
            continue
        digest.update(str(relative).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def built_dir(name: str) -> Path:
    return CACHE / f"{name}-{source_hash(name)}"


def run_command(name: str) -> list[str]:
    """The command that starts the driver; it must have been built (ensure_built)."""
    run = built_dir(name) / "run"
    if not run.exists():
        raise FileNotFoundError(f"interop driver {name!r} is not built: {run} (make test-deps)")
    # Marks the build as used, for prune.
    os.utime(run.parent)
    return [str(run)]


def ensure_built(name: str) -> Path:
    """Build the driver unless this exact source was built before; return its folder."""
    target = built_dir(name)
    if (target / "run").exists():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=CACHE))
    try:
        subprocess.run(
            ["bash", str(HERE / name / "build.sh"), str(work)], check=True, cwd=HERE / name
        )
        if not (work / "run").exists():
            raise RuntimeError(f"{name}/build.sh left no run in {work}")
        try:
            work.rename(target)
        except OSError:
            # Built meanwhile by another process: its build is the same.
            if not (target / "run").exists():
                raise
            shutil.rmtree(work, ignore_errors=True)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    prune(name, keep=target)
    return target


def prune(name: str, keep: Path) -> None:
    """Remove this driver's builds of other sources not used for two weeks.

    A build is used when a test asks for its run command (run_command). Not at once: another
    checkout on the machine (a CI clone of another revision) may be using one, and it costs only
    its disk until then.
    """
    cutoff = time.time() - 14 * 86400
    for old in CACHE.glob(f"{name}-*"):
        if old != keep and old.is_dir() and old.stat().st_mtime < cutoff:
            shutil.rmtree(old, ignore_errors=True)


def main(argv: list[str]) -> int:
    names = argv or drivers()
    unknown = sorted(set(names) - set(drivers()))
    if unknown:
        print(
            f"no such interop driver: {', '.join(unknown)} (have: {', '.join(drivers())})",
            file=sys.stderr,
        )
        return 2
    for name in names:
        try:
            folder = ensure_built(name)
        except (subprocess.CalledProcessError, RuntimeError) as err:
            print(f"building the {name} interop driver failed: {err}", file=sys.stderr)
            return 1
        print(f"{name}: {folder / 'run'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
