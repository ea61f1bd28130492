"""CPU, memory and load readings from /proc for the benches: one process, a process group, a
session, a JVM's threads, the whole machine, a block device; and `CpuWindow`, which takes such
readings at the start and the end of a run.

Every reader returns None (or leaves the process out) when the process is gone: a run must not
fail because something exited between two readings.
"""

from __future__ import annotations

import os
import re
import resource
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

from tests.bench.harness.common import log, platform_name, utc_now

TICK = os.sysconf("SC_CLK_TCK")


def _stat(path: str | Path) -> tuple[str, list[str]] | None:
    """(name, fields after it) of a /proc stat file; fields[0] is the state (field 3)."""
    try:
        raw = Path(path).read_text()
    except OSError:
        return None
    # The name is in parentheses and may itself contain ") ": split at the last one.
    end = raw.rfind(")")
    return raw[raw.find("(") + 1 : end], raw[end + 2 :].split()


def proc_cpu(pid: int | None) -> float | None:
    """CPU seconds (user+sys, all threads) of one live process, or None."""
    if pid is None:
        return None
    stat = _stat(f"/proc/{pid}/stat")
    if stat is None:
        return None
    fields = stat[1]  # utime, stime: fields 14 and 15
    return (int(fields[11]) + int(fields[12])) / TICK


def _all_stats() -> list[tuple[int, list[str]]]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(f"/proc/{entry}/stat")) is not None:
            out.append((int(entry), stat[1]))
    return out


def proc_group_cpu(pgid: int) -> float:
    """CPU seconds (user+sys) of all live processes in a process group."""
    total = 0.0
    for _pid, fields in _all_stats():
        if int(fields[2]) == pgid:  # pgrp: field 5
            total += (int(fields[11]) + int(fields[12])) / TICK
    return total


def session_pids(sid: int) -> list[int]:
    """Live processes of a session (pyspark's worker daemon makes a process group of its own,
    so a process group would miss the Python workers)."""
    return [pid for pid, fields in _all_stats() if int(fields[3]) == sid]  # session: field 6


def session_cpu(sid: int) -> float:
    """CPU seconds of a session's live processes and the children they have reaped."""
    total = 0
    for pid in session_pids(sid):
        stat = _stat(f"/proc/{pid}/stat")
        if stat is not None:  # utime, stime, cutime, cstime: fields 14-17
            total += sum(int(v) for v in stat[1][11:15])
    return total / TICK


def thread_groups_cpu(pid: int | None) -> dict[str, float]:
    """CPU seconds of a JVM's live threads, summed per name with the digits dropped
    ("NettyServerCodecThread_3" -> "NettyServerCodecThread_"), from /proc/PID/task: where the
    broker's CPU goes (Linux keeps the first 15 characters of a thread's name)."""
    groups: dict[str, float] = {}
    if pid is None:
        return groups
    for task in Path(f"/proc/{pid}/task").glob("*"):
        stat = _stat(task / "stat")
        if stat is None:
            continue  # the thread ended
        name, fields = re.sub(r"\d+", "", stat[0]), stat[1]
        groups[name] = groups.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / TICK
    return groups


def children_cpu_s() -> float:
    """CPU seconds of every child process this script has waited for (loadgen runs, the
    simulator once it has exited)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def machine_times() -> tuple[float, float, float]:
    """(busy, iowait, steal) CPU seconds of the whole machine since boot, from /proc/stat."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()
    # user nice system idle iowait irq softirq steal; guest time is already in user/nice.
    vals = [int(v) for v in fields[1:9]]
    return (sum(vals) - vals[3] - vals[4]) / TICK, vals[4] / TICK, vals[7] / TICK


def machine_busy_s() -> float:
    """CPU seconds all CPUs spent not idle (or in iowait) since boot; 0.0 if unreadable."""
    try:
        return machine_times()[0]
    except OSError:
        return 0.0


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def run_meta(command: str, **extra: Any) -> dict[str, Any]:
    """What every benchmark records about its run before anything else: its command line, when
    it started, the machine's load then, its CPUs and platform; then the script's own `extra`."""
    return {
        "command": command,
        "started_at": utc_now(),
        "loadavg_start": loadavg(),
        "cpu_count": os.cpu_count(),
        "platform": platform_name(),
        **extra,
    }


def log_meta(meta: Mapping[str, Any]) -> None:
    """The first lines of a run's output, from its run_meta: the command line, the versions of
    the tools (its `versions`, if any), the CPUs, the platform and the load average now."""
    log(f"command:   {meta['command']}")
    for tool, version in meta.get("versions", {}).items():
        log(f"{tool + ':':<10} {version}")
    log(f"cpus:      {meta['cpu_count']}  ({meta['platform']}), load average {loadavg()}")


def proc_status_kib(pid: int, key: str) -> int | None:
    """A ``kB`` field (VmRSS, RssAnon, ...) of /proc/PID/status, or None if the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def proc_rss_mb(pid: int) -> float | None:
    rss = proc_status_kib(pid, "VmRSS")
    return None if rss is None else rss / 1024


def open_files(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def disk_of(path: Path) -> tuple[int, int]:
    """(major, minor) of the block device holding path."""
    dev = path.stat().st_dev
    return os.major(dev), os.minor(dev)


def disk_counters(device: tuple[int, int]) -> tuple[int | None, int | None]:
    """(writes completed, flush requests completed) of a block device, from /proc/diskstats;
    None where the device is not listed (tmpfs, overlay) or the kernel has no flush counter."""
    for line in Path("/proc/diskstats").read_text().splitlines():
        parts = line.split()
        if (int(parts[0]), int(parts[1])) == device:
            # After major, minor, name: field 5 = writes completed, field 16 = flushes (5.5+).
            return int(parts[7]), int(parts[18]) if len(parts) > 18 else None
    return None, None


class CpuWindow:
    """One measurement window: what each reader (CPU seconds so far of a process, a group, the
    machine, ...) returned when the window opened and when it was closed, and the wall time in
    between. Readers are called in their order, then the clock is read."""

    def __init__(self, readers: Mapping[str, Callable[[], float | None]]) -> None:
        self.readers = dict(readers)
        self.start = {key: read() for key, read in self.readers.items()}
        self.began = time.monotonic()
        self.end: dict[str, float | None] = {}
        self.wall = 0.0

    def close(self) -> CpuWindow:
        self.end = {key: read() for key, read in self.readers.items()}
        self.wall = max(time.monotonic() - self.began, 1e-9)
        return self

    def used(self, key: str) -> float | None:
        """Seconds `key` used in the window; None if either reading is missing."""
        a, b = self.start.get(key), self.end.get(key)
        return None if a is None or b is None else b - a

    def percent(self, seconds: float) -> float:
        """`seconds` of CPU as % of one core over the window."""
        return 100 * seconds / self.wall


def pid_readers(roles: Mapping[str, list[int]]) -> dict[str, Callable[[], float | None]]:
    """CpuWindow readers for every process of every role ("role/pid"), plus the machine's busy
    time ("machine")."""
    readers: dict[str, Callable[[], float | None]] = {
        f"{role}/{pid}": partial(proc_cpu, pid) for role, pids in roles.items() for pid in pids
    }
    readers["machine"] = machine_busy_s
    return readers


def role_usage(
    window: CpuWindow,
    roles: Mapping[str, list[int]],
    delivered: int,
    extra_cpu_s: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """What a closed window (opened with pid_readers(roles)) says per role: CPU seconds, % of
    one core and µs per delivered message. A process gone at either end is left out of its
    role; `extra_cpu_s` adds roles measured another way (a child's rusage). "others" is the
    machine's busy time no role used (other work on the box), "machine" all of it. A reader
    named "jit" (jvm_jit_cpu of the RocketMQ broker) adds the JIT's seconds, `jit_cpu_s`."""
    cpu_s = {
        role: sum(used for pid in pids if (used := window.used(f"{role}/{pid}")) is not None)
        for role, pids in roles.items()
    }
    cpu_s.update(extra_cpu_s or {})
    machine = window.used("machine") or 0.0
    per_msg = {
        role: round(v / delivered * 1e6, 1) if delivered else None for role, v in cpu_s.items()
    }
    cpu_s["others"] = max(0.0, machine - sum(cpu_s.values()))
    cpu_s["machine"] = machine
    out = {
        "run_wall_s": round(window.wall, 2),
        "cpu_s": {role: round(v, 3) for role, v in cpu_s.items()},
        "cpu_percent": {role: round(window.percent(v), 1) for role, v in cpu_s.items()},
        "us_per_msg": per_msg,
        "loadavg_after": loadavg(),
    }
    if (jit := window.used("jit")) is not None:
        out["jit_cpu_s"] = round(jit, 3)
    return out


def jvm_jit_cpu(pid: int | None) -> float | None:
    """CPU seconds of a JVM's JIT compiler threads ("C1/C2 CompilerThread"): while they are
    busy, the JVM's code is still being compiled and its CPU per message is not yet its own."""
    if pid is None or not Path(f"/proc/{pid}").is_dir():
        return None
    return sum(cpu for name, cpu in thread_groups_cpu(pid).items() if "CompilerThre" in name)
