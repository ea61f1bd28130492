"""RocketMQ's own benchmark Producer (org.apache.rocketmq.example.benchmark.Producer, official
Java client) for broker_ceiling.py: built from the official source release on first use (it is
not published as a jar for 5.3.x), its command line, and one run of it, read report by report
from its output."""

from __future__ import annotations

import os
import queue
import re
import shlex
import shutil
import subprocess
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tests.bench.harness.common import log
from tests.bench.harness.rocketmq import ROCKETMQ_VERSION
from tests.support.rocketmq import DEPLOY, LocalRocketMQ

SOURCE_ARTIFACT = f"org.apache.rocketmq:rocketmq-all:{ROCKETMQ_VERSION}:zip:source-release"
# Pinned like deploy/rocketmq/pom.xml pins it, so the command does not depend on Maven's default.
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.6.1"
BENCHMARK_SRC = (
    f"rocketmq-all-{ROCKETMQ_VERSION}/example/src/main/java/org/apache/rocketmq/example/benchmark/"
)
# Producer.java refers to AclClient (its -a option); nothing else of the example module.
PRODUCER_SOURCES = ("Producer.java", "AclClient.java")
PRODUCER_MAIN = "org.apache.rocketmq.example.benchmark.Producer"
# Same collector and heap bounds as the broker (deploy/rocketmq/env.sh): two shared cores, so no
# concurrent GC threads; the JIT is the JVM's default (full tiered), as for a real client.
DEFAULT_PRODUCER_JAVA_OPTS = "-Xms256m -Xmx512m -XX:+UseSerialGC"
REPORT_MS = 10_000  # the Producer's -ri; each report covers the 10 one-second snapshots before it
REPORT_RE = re.compile(
    r"Send TPS: (?P<tps>\d+) \| Max RT\(ms\): (?P<max_rt>\d+) \| "
    r"Average RT\(ms\):\s*(?P<avg_rt>[\d.]+) \| Send Failed: (?P<send_failed>\d+) \| "
    r"Response Failed: (?P<response_failed>\d+)"
)
FIRST_REPORT_TIMEOUT_S = 120.0  # JVM start + client start + 10 s on a loaded machine
NEXT_REPORT_TIMEOUT_S = 3 * REPORT_MS / 1000
T = TypeVar("T")


def java_bin(tool: str) -> str:
    """java/javac the way deploy/rocketmq/env.sh picks it: $JAVA, $JAVA_HOME/bin, else PATH."""
    if tool == "java" and os.environ.get("JAVA"):
        return os.environ["JAVA"]
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / tool, os.X_OK):
        return str(Path(home) / "bin" / tool)
    return tool


def rocketmq_lib() -> str:
    """The directory of RocketMQ 5.3.3's jars (client included), fetched by
    deploy/rocketmq/fetch.sh on first use."""
    fetched = subprocess.run(
        [str(DEPLOY / "fetch.sh")], capture_output=True, text=True, timeout=1800, check=False
    )
    if fetched.returncode != 0:
        raise RuntimeError(f"deploy/rocketmq/fetch.sh failed:\n{fetched.stderr}")
    return fetched.stdout.strip().splitlines()[-1]


def ensure_producer(cache_dir: Path) -> str:
    """Classpath of RocketMQ 5.3.3's benchmark Producer, built into cache_dir on first use.

    rocketmq-example (the jar with org.apache.rocketmq.example.benchmark) is not on Maven
    Central for 5.3.x, so the official source release is fetched with Maven and the Producer is
    compiled against the client jars of the same version that deploy/rocketmq/fetch.sh caches;
    those jars are its classpath at run time too.
    """
    lib = rocketmq_lib()
    classes = cache_dir / "classes"
    classpath = f"{classes}:{lib}/*"
    marker = cache_dir / ".complete"
    if marker.is_file() and marker.read_text() == SOURCE_ARTIFACT:
        return classpath
    cache_dir.mkdir(parents=True, exist_ok=True)
    archive = cache_dir / f"rocketmq-all-{ROCKETMQ_VERSION}-source-release.zip"
    if not archive.is_file():
        log(f"fetching {SOURCE_ARTIFACT} with Maven into {cache_dir}")
        subprocess.run(
            [
                os.environ.get("MVN", "mvn"),
                "-q",
                "-B",
                "-Dstyle.color=never",
                f"{DEPENDENCY_PLUGIN}:copy",
                f"-Dartifact={SOURCE_ARTIFACT}",
                f"-DoutputDirectory={cache_dir}",
            ],
            check=True,
            timeout=900,
        )
    src = cache_dir / "src"
    src.mkdir(exist_ok=True)
    with zipfile.ZipFile(archive) as zf:
        for name in PRODUCER_SOURCES:
            (src / name).write_bytes(zf.read(BENCHMARK_SRC + name))
    shutil.rmtree(classes, ignore_errors=True)
    subprocess.run(
        [
            java_bin("javac"),
            "-nowarn",
            "-d",
            str(classes),
            "-cp",
            f"{lib}/*",
            *(str(src / name) for name in PRODUCER_SOURCES),
        ],
        check=True,
        timeout=600,
    )
    marker.write_text(SOURCE_ARTIFACT)
    return classpath


# --------------------------------------------------------------------------- running


def java_client_command(java_opts: str, classpath: str, mq: LocalRocketMQ, home: Path) -> list[str]:
    """`java` with the options of a RocketMQ client JVM, up to its main class. user.home and the
    logback settings keep its client logs in the data dir (the client writes ~/logs/rocketmqlogs
    otherwise); deploy/rocketmq's start scripts copied rmq.tools.logback.xml there."""
    return [
        java_bin("java"),
        *shlex.split(java_opts),
        f"-Duser.home={home}",
        f"-Drmq.log.dir={mq.log_dir}",
        f"-Drmq.logback.configurationFile={home}/conf/rmq.tools.logback.xml",
        "-Drocketmq.client.logUseSlf4j=true",
        "-cp",
        classpath,
    ]


def producer_command(
    java_opts: str,
    classpath: str,
    mq: LocalRocketMQ,
    home: Path,
    *,
    topic: str,
    size: int,
    threads: int,
    keys: bool,
) -> list[str]:
    """The Producer's command line (`java_client_command`, then its own arguments)."""
    return [
        *java_client_command(java_opts, classpath, mq, home),
        PRODUCER_MAIN,
        "-n",
        mq.namesrv_addr,
        "-t",
        topic,
        "-s",
        str(size),
        "-w",
        str(threads),
        "-k",
        str(keys).lower(),
        "-y",
        "false",
        "-ri",
        str(REPORT_MS),
    ]


def _pump(stream: Any, lines: queue.Queue[str | None], out: Any) -> None:
    """Copy the Producer's output to its log file and hand every line to the main thread."""
    for line in stream:
        out.write(line)
        out.flush()
        lines.put(line)
    lines.put(None)


def run_producer(
    cmd: list[str],
    log_path: Path,
    warmup_reports: int,
    reports: int,
    sample: Callable[[int], T],
) -> tuple[list[dict[str, float]], list[T]]:
    """Run the Producer until warmup_reports + reports reports: (the parsed reports, what
    sample(its PID) returned at report number warmup_reports, or at its start if that is 0,
    and at the last one). The Producer is killed (by PID) in any case."""
    parsed: list[dict[str, float]] = []
    samples: list[T] = []
    lines: queue.Queue[str | None] = queue.Queue()
    with log_path.open("w") as out:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # a terminal's Ctrl-C reaches us, and we kill it by PID
        )
        reader = threading.Thread(target=_pump, args=(proc.stdout, lines, out), daemon=True)
        reader.start()
        try:
            if warmup_reports == 0:
                samples.append(sample(proc.pid))
            deadline = time.monotonic() + FIRST_REPORT_TIMEOUT_S
            while len(parsed) < warmup_reports + reports:
                try:
                    line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
                except queue.Empty:
                    raise RuntimeError(
                        f"the Producer's report {len(parsed) + 1} did not come in time; "
                        f"see {log_path}"
                    ) from None
                if line is None:
                    raise RuntimeError(
                        f"the Producer exited (status {proc.wait()}); see {log_path}"
                    )
                match = REPORT_RE.search(line)
                if not match:
                    continue
                parsed.append({k: float(v) for k, v in match.groupdict().items()})
                deadline = time.monotonic() + NEXT_REPORT_TIMEOUT_S
                if len(parsed) in (warmup_reports, warmup_reports + reports):
                    samples.append(sample(proc.pid))
        finally:
            proc.kill()
            proc.wait(timeout=30)
            reader.join(timeout=10)
    return parsed, samples
