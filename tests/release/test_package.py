"""The release as users install it: the sdist and the wheel built from this checkout, each
installed into a fresh virtual environment outside it, then the README's tour run through the
installed `mqtt-bridge` (a persistent subscriber gets what was published while it was away, across
a kill -9), and the container image's entrypoint run as a plain process with the image's
environment until its own health check passes.

The wheel is built from the checkout as `make dist` does, with the hot path compiled (a compiler
that fails the build fails the test); its C is compiled through ccache when the machine has it,
so an unchanged hot path costs mypyc's analysis only. The sdist is installed the way a user gets
it where no wheel fits and no C compiler is found (CC=false): the pure-Python package, which must
behave the same. The dependencies come from PyPI (pip's own cache keeps them on this machine).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import pytest

import bridge
from tests.support.processes import free_port, wait_for_port
from tests.unit.project.test_deploy_image import dockerfile_instructions

REPO = Path(__file__).resolve().parents[2]

# Building the wheel (mypyc's analysis of the hot path, and its C when ccache does not have it)
# and installing the dependencies take minutes on a busy box, not the 120 s a test gets.
pytestmark = pytest.mark.timeout(900)

# Builds and installs are work without a deadline: niced, they leave the CPU to the servers and
# Spark jobs the other workers' tests are waiting on (a Python worker Spark starts has 10 s to
# connect back, and missed them beside a C compile on two cores).
NICE = ["nice", "-n", "10"]


def run(args: list[str], *, timeout: float = 600, **kw: Any) -> str:
    """Run a command to completion; its output, or a failure showing it."""
    result = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)
    assert result.returncode == 0, (
        f"{args} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    return result.stdout


def build_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MQTT_BRIDGE_", "PYTHON"))}
    ccache = shutil.which("ccache")
    if ccache:
        cc = run(
            [sys.executable, "-c", "import sysconfig; print(sysconfig.get_config_var('CC'))"]
        ).strip()
        env.update(CCACHE_BASEDIR=str(REPO), CCACHE_NOHASHDIR="1", CC=f"{ccache} {cc}")
    return {**env, **extra}


@dataclass
class Release:
    sdist: Path
    wheel: Path


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    """The sdist and the compiled wheel, built with pypa/build from this checkout."""
    out = tmp_path_factory.mktemp("dist")
    # What an earlier build left in build/ would be packaged again (a module removed since).
    for stale in (*REPO.glob("build/lib.*"), *REPO.glob("build/bdist.*")):
        shutil.rmtree(stale, ignore_errors=True)
    build = [*NICE, sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out)]
    run([*build, "--sdist", str(REPO)], env=build_env())
    run([*build, "--wheel", str(REPO)], env=build_env(MQTT_BRIDGE_COMPILE="required"), cwd=REPO)
    (sdist,) = out.glob("mqtt_bridge-*.tar.gz")
    (wheel,) = out.glob("mqtt_bridge-*.whl")
    return Release(sdist, wheel)


@dataclass
class Installed:
    """A fresh virtual environment, outside the checkout, with mqtt-bridge installed."""

    venv: Path
    work: Path

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)

    def env(self, **extra: str) -> dict[str, str]:
        """An environment that sees this venv only: no MQTT_BRIDGE_* settings, no PYTHONPATH."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("MQTT_BRIDGE_", "PYTHON", "VIRTUAL_ENV"))
        }
        env["PATH"] = f"{self.venv / 'bin'}:{env.get('PATH', '')}"
        return {**env, **extra}

    def python(self, code: str) -> str:
        return run([self.bin("python"), "-c", code], cwd=self.work, env=self.env()).strip()


def install(tmp: Path, target: Path, **env: str) -> Installed:
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    installed = Installed(venv, tmp / "work")
    installed.work.mkdir()
    run(
        [*NICE, installed.bin("pip"), "install", "-q", "--disable-pip-version-check", str(target)],
        cwd=installed.work,
        env=installed.env(**env),
    )
    return installed


@pytest.fixture(scope="module")
def from_wheel(release: Release, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    return install(tmp_path_factory.mktemp("wheel-install"), release.wheel)


COMPILED_FILE = "import bridge.mqtt.decoder as m; print(m.__file__)"


class Node:
    """The installed `mqtt-bridge` as a process of its own, killed by PID at the end."""

    def __init__(
        self, installed: Installed, args: list[str], env: dict[str, str] | None = None
    ) -> None:
        self.log = installed.work / f"node-{uuid.uuid4().hex[:6]}.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [installed.bin("mqtt-bridge"), *args],
                cwd=installed.work,
                env=env or installed.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def the_tour(installed: Installed) -> None:
    """The README's tour: a persistent QoS 1 subscriber, a publish, the subscriber away while more
    is published and the node is killed with kill -9 and started again: it gets everything."""
    port, admin = free_port(), free_port()
    data = installed.work / f"data-{port}"
    args = [
        "--listen",
        f"127.0.0.1:{port}",
        "--data-dir",
        str(data),
        "--set",
        f"admin_listen=127.0.0.1:{admin}",
    ]
    node = Node(installed, args)
    try:
        wait_for_port(port, proc=node.proc)
        sub = [
            "mosquitto_sub",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-q",
            "1",
            "-c",
            "-i",
            "terminal-7",
            "-t",
            "factory/#",
            "-v",
        ]
        pub = ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "-q", "1"]
        # Subscribe once (the session is made), then go away: -E ends mosquitto_sub once the
        # broker acknowledged the subscription (a fixed -W 1 could end it before, on a busy box).
        run([*sub, "-E", "-W", "60"])
        run([*pub, "-t", "factory/line1/press3", "-m", '{"state":"RUNNING"}'])
        node.kill()
        node = Node(installed, args)
        wait_for_port(port, proc=node.proc)
        run([*pub, "-t", "factory/line1/press4", "-m", '{"state":"DOWN"}'])
        got = run([*sub, "-C", "2", "-W", "20"])
        assert got.splitlines() == [
            'factory/line1/press3 {"state":"RUNNING"}',
            'factory/line1/press4 {"state":"DOWN"}',
        ]
        wait_for_port(admin, proc=node.proc)
        with urlopen(f"http://127.0.0.1:{admin}/console/", timeout=10) as response:
            page = response.read().decode()
        assert "<html" in page.lower()
    finally:
        node.kill()
    assert "Traceback" not in node.text(), node.text()[-3000:]


def test_the_wheel_in_a_fresh_venv_is_compiled_tells_its_version_and_runs_the_tour(
    from_wheel: Installed,
) -> None:
    version = run(
        [from_wheel.bin("mqtt-bridge"), "--version"], cwd=from_wheel.work, env=from_wheel.env()
    )

    assert version.strip() == f"mqtt-bridge {bridge.__version__}"
    assert from_wheel.python(COMPILED_FILE).endswith(".so")
    assert str(REPO) not in from_wheel.python("import bridge; print(bridge.__file__)")
    the_tour(from_wheel)


def test_the_sdist_without_a_c_compiler_installs_the_pure_python_package_which_runs_the_tour(
    release: Release, tmp_path: Path
) -> None:
    installed = install(tmp_path, release.sdist, CC="false")

    assert installed.python(COMPILED_FILE).endswith(".py")
    assert not list(installed.venv.rglob("bridge/**/*.so"))
    the_tour(installed)


def image_environment() -> tuple[dict[str, str], list[str], list[str]]:
    """The final stage's ENV, ENTRYPOINT and HEALTHCHECK command (exec form) of the Dockerfile."""
    instructions = dockerfile_instructions()
    final = instructions[max(i for i, (word, _) in enumerate(instructions) if word == "FROM") :]
    env: dict[str, str] = {}
    entrypoint: list[str] = []
    health: list[str] = []
    for word, rest in final:
        if word == "ENV":
            env.update(re.findall(r"(\w+)=(\S+)", rest))
        elif word == "ENTRYPOINT":
            entrypoint = json.loads(rest)
        elif word == "HEALTHCHECK":
            health = json.loads(rest.split("CMD", 1)[1])
    return env, entrypoint, health


def test_the_image_entrypoint_in_the_image_environment_passes_its_health_check_and_stops_on_sigterm(
    from_wheel: Installed, tmp_path: Path
) -> None:
    env, entrypoint, health = image_environment()
    port, admin = free_port(), free_port()
    # The image's settings, with loopback and free ports instead of the container's 0.0.0.0 and
    # fixed ports (an anonymous broker is not opened to the machine's network for a test; that
    # the image's 0.0.0.0 with anonymous clients is a valid configuration is checked in
    # tests/unit/project/test_deploy_image.py), and a data folder of the test's.
    assert env["MQTT_BRIDGE_LISTEN"].startswith("0.0.0.0:")
    env["MQTT_BRIDGE_LISTEN"] = f"127.0.0.1:{port}"
    env["MQTT_BRIDGE_ADMIN_LISTEN"] = f"127.0.0.1:{admin}"
    env["MQTT_BRIDGE_DATA_DIR"] = str(tmp_path / "data")
    env.pop("VIRTUAL_ENV", None)
    env.pop("PATH", None)
    full_env = from_wheel.env(**env)
    assert entrypoint == ["mqtt-bridge"]
    node = Node(from_wheel, [], env=full_env)
    try:
        wait_for_port(admin, proc=node.proc)
        # The image's HEALTHCHECK, as Docker runs it inside the container (its `python` is the
        # venv's, first on PATH).
        check = subprocess.run(
            health, cwd=from_wheel.work, env=full_env, capture_output=True, text=True, timeout=30
        )
        os.killpg(node.proc.pid, signal.SIGTERM)
        exit_code = node.proc.wait(30)
    finally:
        node.kill()

    assert check.returncode == 0, check.stderr
    assert exit_code == 0, node.text()[-3000:]
    assert "Traceback" not in node.text()
