#!/usr/bin/env python3
"""Where the bridge's memory per idle connection goes: a diagnostic, not a benchmark.

Run from the repository root::

    .venv/bin/python tests/bench/conn_memory_profile.py [--connections 5000] [--loops uvloop]

conn_capacity.py measures *how much* VmRSS an idle connection costs; this says *what* it is.
It runs a bridge node in-process (the same `Server` that ``python -m bridge`` runs, default
settings, embedded store in a temp dir), opens ``--warmup`` idle connections with the Go load
generator (idle mode: CONNECT with clean session, keepalive 600 s, nothing after the CONNACK) so
that one-time costs are out of the way, measures, opens ``--connections`` more, measures again
and divides the difference by their number:

- VmRSS per connection, as conn_capacity.py reports it;
- objects the garbage collector tracks, by type: how many of each a connection adds and their
  ``sys.getsizeof`` (strings and bytes are not tracked, tracemalloc sees them);
- with tracemalloc: the bytes Python allocated per connection, by the line of bridge code that
  caused the allocation (the most recent frame in ``bridge/``; allocations with no bridge frame,
  e.g. uvloop accepting a socket, by their own innermost frame). VmRSS minus these traced bytes
  is the cost outside Python's view: malloc's headers and fragmentation, and anything C code
  allocates with plain malloc (libuv, the ssl/socket modules).

Reading the tracemalloc table: a block is charged to where it was first allocated, and CPython
recycles some blocks through free lists without freeing them (small dicts and their key
tables, tuples, lists, floats). Such a block keeps its first traceback when it is reused, so a
line can carry a block that really belongs to another structure (a 120-byte block charged to a
``create_future()`` line is the key table of a one-entry dict with str keys, e.g. a session's
``cursors``). The totals are right; cross-check single lines with the object census.

Each measurement runs in a fresh child process (one per event loop, with and without
tracemalloc, whose own bookkeeping would inflate VmRSS), so that memory freed by one run is not
reused by the next. `bridge.__main__` picks uvloop when it is installed; ``--loops
uvloop,asyncio`` measures both (asyncio: the standard library's selector event loop).

Bounded: every loadgen command has a time cap, each child process a hard timeout, and the
node and the loadgen are always stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import linecache
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bridge.checks import load_config
from bridge.listeners.server import Server
from tests.bench.harness.common import HOST, REPO, free_port, log
from tests.bench.harness.loadgen import add_loadgen_options, build_loadgen, idle_command
from tests.bench.harness.procfs import proc_status_kib
from tests.bench.harness.report import plain_table

BRIDGE_DIR = str(REPO / "bridge") + os.sep
LOOPS = ("uvloop", "asyncio")
TRACE_FRAMES = 15  # deep enough to reach the bridge frame under asyncio's and uvloop's own
COMMAND_TIMEOUT_S = 60.0
CHILD_TIMEOUT_S = 300.0
SETTLE_S = 1.0


# --------------------------------------------------------------------------- child: one pass


class IdleClients:
    """The Go loadgen in idle mode, driven from the event loop (see loadgen/idle.go)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, loadgen: str, port: int, sources: str) -> IdleClients:
        cmd = idle_command(
            loadgen, port, sources, f"{COMMAND_TIMEOUT_S:.0f}", f"{CHILD_TIMEOUT_S:.0f}"
        )
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        return cls(proc)

    async def command(self, line: str) -> dict[str, Any]:
        """Run one command; raise if any connection failed (the figures would be wrong)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()
        raw = await asyncio.wait_for(self.proc.stdout.readline(), COMMAND_TIMEOUT_S + 10)
        if not raw:
            raise RuntimeError(f"loadgen exited (code {await self.proc.wait()}) on {line!r}")
        reply: dict[str, Any] = json.loads(raw)
        if reply.get("failed") or reply.get("op") == "error":
            raise RuntimeError(f"loadgen {line!r}: {reply.get('failed_by')} {reply['errors'][:3]}")
        return reply

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


def object_census() -> tuple[Counter[str], Counter[str]]:
    """Count and ``sys.getsizeof`` of every object the garbage collector tracks, by type."""
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for obj in gc.get_objects():
        kind = type(obj)
        name = f"{kind.__module__}.{kind.__qualname__}"
        counts[name] += 1
        sizes[name] += sys.getsizeof(obj)
    return counts, sizes


def blame(traceback: tracemalloc.Traceback) -> str:
    """The bridge line an allocation is charged to: its most recent frame in bridge/, else
    its own innermost frame."""
    frames = list(traceback)
    frame = next((f for f in reversed(frames) if f.filename.startswith(BRIDGE_DIR)), frames[-1])
    path = frame.filename
    for prefix in (str(REPO) + os.sep, os.path.dirname(os.__file__) + os.sep):
        if path.startswith(prefix):
            path = path[len(prefix) :]
            break
    code = linecache.getline(frame.filename, frame.lineno).strip()
    return f"{path}:{frame.lineno}  {code[:70]}"


def measure(trace: bool) -> dict[str, Any]:
    """VmRSS first (as the server has it), then a full collection and the census/snapshot."""
    rss = proc_status_kib(os.getpid(), "VmRSS")
    gc.collect()
    counts, sizes = object_census()
    out: dict[str, Any] = {"rss_kib": rss, "counts": counts, "sizes": sizes}
    if trace:
        # Leave out the profiler's own bookkeeping: the earlier snapshot and census are alive.
        out["snapshot"] = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, __file__)]
        )
    return out


async def one_pass(args: argparse.Namespace) -> dict[str, Any]:
    """Warm up, measure, open the connections, measure again; the per-connection differences."""
    tmp = Path(tempfile.mkdtemp(prefix="mqtt-memprofile-"))
    port = free_port()
    config = load_config(
        overrides={
            "listen": [f"{HOST}:{port}"],
            "data_dir": str(tmp / "data"),
            "log_level": "warning",
            "max_connections": "0",
        }
    )
    server = Server(config)
    clients: IdleClients | None = None
    try:
        await server.start()
        clients = await IdleClients.start(args.loadgen, port, args.sources)
        await clients.command(f"open {args.warmup}")
        await asyncio.sleep(SETTLE_S)
        before = measure(args.trace)
        await clients.command(f"open {args.connections}")
        await asyncio.sleep(SETTLE_S)
        after = measure(args.trace)
        ping = await clients.command("ping")
        held = args.warmup + args.connections
        if ping["ok"] != held or len(server.node.connections) != held:
            raise RuntimeError(
                f"{ping['ok']} PINGRESP and {len(server.node.connections)} connections on the "
                f"node, expected {held}"
            )
        n = args.connections
        result: dict[str, Any] = {
            "loop": type(asyncio.get_running_loop()).__module__.split(".")[0],
            "connections": n,
            "rss_kib_per_conn": (after["rss_kib"] - before["rss_kib"]) / n,
            "objects_per_conn": {
                name: {
                    "count": (after["counts"][name] - before["counts"][name]) / n,
                    "bytes": (after["sizes"][name] - before["sizes"][name]) / n,
                }
                for name in after["counts"]
                if after["counts"][name] != before["counts"][name]
            },
        }
        if args.trace:
            by_line: Counter[str] = Counter()
            blocks: Counter[str] = Counter()
            for diff in after["snapshot"].compare_to(before["snapshot"], "traceback"):
                key = blame(diff.traceback)
                by_line[key] += diff.size_diff
                blocks[key] += diff.count_diff
            result["traced_bytes_per_conn"] = sum(by_line.values()) / n
            result["traced_per_conn"] = {
                key: {"bytes": size / n, "blocks": blocks[key] / n} for key, size in by_line.items()
            }
        return result
    finally:
        if clients is not None:
            await clients.stop()
        await server.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def run_child(args: argparse.Namespace) -> int:
    if args.trace:
        tracemalloc.start(TRACE_FRAMES)
    coro: Coroutine[Any, Any, dict[str, Any]] = one_pass(args)
    if args.child == "uvloop":
        import uvloop

        result = uvloop.run(coro)
    else:
        result = asyncio.run(coro)
    print(json.dumps(result))
    return 0


# --------------------------------------------------------------------------- parent


def spawn_pass(args: argparse.Namespace, loop: str, trace: bool) -> dict[str, Any]:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        loop,
        "--loadgen",
        str(args.loadgen),
        "--connections",
        str(args.connections),
        "--warmup",
        str(args.warmup),
        "--sources",
        args.sources,
    ] + (["--trace"] if trace else [])
    label = f"{loop}, {'with' if trace else 'without'} tracemalloc"
    log(f"--- {label}: {args.warmup:,} warm-up + {args.connections:,} measured connections")
    t0 = time.monotonic()
    try:
        p = subprocess.run(
            cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False, cwd=REPO
        )
    except subprocess.TimeoutExpired as e:
        raise SystemExit(f"error: {label} did not finish within {CHILD_TIMEOUT_S:.0f} s") from e
    if p.returncode != 0 or not p.stdout.strip():
        raise SystemExit(f"error: {label} failed ({shlex.join(cmd)}):\n{p.stderr[-3000:]}")
    log(f"    done in {time.monotonic() - t0:.0f} s")
    result: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return result


def report(loop: str, plain: dict[str, Any], traced: dict[str, Any], top: int) -> list[str]:
    rss = plain["rss_kib_per_conn"] * 1024
    traced_total = traced["traced_bytes_per_conn"]
    out = [
        "",
        f"=== {loop}: per idle connection",
        f"VmRSS:                        {rss:8.0f} B  ({plain['rss_kib_per_conn']:.2f} KiB)",
        f"allocated by Python (traced): {traced_total:8.0f} B",
        f"outside Python's view:        {rss - traced_total:8.0f} B  (malloc overhead and "
        "fragmentation, C libraries' own malloc)",
        "",
        f"top {top} allocation sites (tracemalloc, charged to the most recent bridge/ frame):",
    ]
    sites = sorted(traced["traced_per_conn"].items(), key=lambda kv: -kv[1]["bytes"])
    rows = [
        [f"{v['bytes']:.0f}", f"{v['blocks']:.2f}", key]
        for key, v in sites[:top]
        if abs(v["bytes"]) >= 1
    ]
    rest = sum(v["bytes"] for _key, v in sites[top:])
    rows.append([f"{rest:.0f}", "", "(all other sites)"])
    out.append(plain_table(["bytes", "blocks", "site"], rows, right={0, 1}))
    out += ["", "objects tracked by the garbage collector (without tracemalloc), per connection:"]
    objects = sorted(plain["objects_per_conn"].items(), key=lambda kv: -kv[1]["bytes"])
    rows = [
        [f"{v['count']:.2f}", f"{v['bytes']:.0f}", name]
        for name, v in objects
        if abs(v["count"]) >= 0.01
    ][:top]
    out.append(plain_table(["count", "getsizeof B", "type"], rows, right={0, 1}))
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--loops", default="uvloop,asyncio", help="event loops (default: %(default)s)")
    ap.add_argument(
        "--connections", type=int, default=5000, help="measured connections (default: %(default)s)"
    )
    ap.add_argument(
        "--warmup", type=int, default=500, help="connections opened first (default: %(default)s)"
    )
    ap.add_argument(
        "--sources",
        default="127.0.0.2,127.0.0.3",
        help="loopback addresses the clients connect from (default: %(default)s)",
    )
    ap.add_argument("--top", type=int, default=25, help="rows per table (default: %(default)s)")
    add_loadgen_options(ap, results=False)
    ap.add_argument("--json", type=Path, help="also write the raw figures to this file")
    ap.add_argument("--child", choices=LOOPS, help=argparse.SUPPRESS)
    ap.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not 0 < args.connections + args.warmup <= 15_000:
        ap.error("--connections plus --warmup must be in 1..15000 (one process holds them)")
    args.loop_list = [name.strip() for name in args.loops.split(",") if name.strip()]
    if not args.loop_list or any(name not in LOOPS for name in args.loop_list):
        ap.error(f"--loops: choose from {', '.join(LOOPS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.child:
        return run_child(args)
    args.loadgen = args.loadgen or str(build_loadgen(args.cache_dir))
    results: dict[str, Any] = {}
    lines: list[str] = []
    for loop in args.loop_list:
        plain = spawn_pass(args, loop, trace=False)
        traced = spawn_pass(args, loop, trace=True)
        results[loop] = {"without_tracemalloc": plain, "with_tracemalloc": traced}
        lines += report(loop, plain, traced, args.top)
    for line in lines:
        log(line)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        log(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
