"""docker-compose.yml and what it mounts from deploy/docker/ (the image's own files and the
external linters are checked in test_deploy_image.py).

The checks read the files and need nothing installed. PyYAML is not a dependency: without it the
compose file is read by `tests.support.mini_yaml`, which understands the plain block style the
file is written in and fails the tests, saying so, if the file ever uses more of YAML than that.
"""

from __future__ import annotations

import json
import re
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from bridge.checks import load_config
from bridge.config import ENV_PREFIX, SETTINGS, ConfigError
from tests.support import mini_yaml

REPO = Path(__file__).resolve().parents[3]
COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
HAPROXY_CFG = REPO / "deploy" / "docker" / "haproxy.cfg"
BROKER_CONF = REPO / "deploy" / "docker" / "broker.conf"
SENTINEL_SH = REPO / "deploy" / "docker" / "sentinel.sh"
ROCKETMQ_SH = REPO / "deploy" / "docker" / "rocketmq.sh"
PROXY_JSON = REPO / "deploy" / "docker" / "rmq-proxy.json"


@cache
def compose() -> dict[str, Any]:
    """docker-compose.yml as data (PyYAML if installed, else the subset reader)."""
    text = COMPOSE.read_text(encoding="utf-8")
    try:
        import yaml
    except ImportError:
        try:
            data = mini_yaml.read(text)
        except mini_yaml.Unsupported as exc:
            pytest.fail(
                f"the subset YAML reader cannot read docker-compose.yml ({exc}): keep the file "
                "within the subset or make PyYAML a test dependency",
                pytrace=False,
            )
        except mini_yaml.Invalid as exc:
            pytest.fail(f"docker-compose.yml is not valid YAML: {exc}", pytrace=False)
    else:
        data = yaml.safe_load(text)
    assert isinstance(data, dict), "docker-compose.yml must be a mapping"
    return data


def services() -> dict[str, dict[str, Any]]:
    result = compose().get("services")
    assert isinstance(result, dict) and result, "docker-compose.yml has no services"
    return result


USER_SET = "u" * 64
"""What `interpolate` puts for ${VAR:?message}: a value the user must set (compose refuses to
start without it), such as the cluster secret."""


def interpolate(value: str) -> str:
    """Compose's ${VAR:-default} / ${VAR-default} with VAR unset: the default;
    ${VAR:?message}: `USER_SET`."""
    value = re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*:\?[^}]*\}", USER_SET, value)
    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::?-([^}]*))?\}", lambda m: m.group(1) or "", value)


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): interpolate(str(v)) for k, v in env.items()}


def bridges() -> dict[str, dict[str, str]]:
    """The bridge services (those configured with MQTT_BRIDGE_* variables): name -> environment."""
    found = {
        name: environment(service)
        for name, service in services().items()
        if any(key.startswith(ENV_PREFIX) for key in environment(service))
    }
    assert len(found) >= 3, f"expected three bridge services, found {sorted(found)}"
    return found


# --- docker-compose.yml -------------------------------------------------------------------------


def test_the_compose_file_parses_and_every_service_has_an_image_or_a_build():
    for name, service in services().items():
        assert isinstance(service, dict), name
        assert service.get("image") or service.get("build"), f"{name}: neither image nor build"
        if service.get("build"):
            build = service["build"]
            context = REPO / (build if isinstance(build, str) else build.get("context", "."))
            dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile")
            assert (context / (dockerfile or "Dockerfile")).is_file(), f"{name}: no Dockerfile"


def test_images_are_pinned_to_a_tag_and_never_latest():
    for name, service in services().items():
        image = service.get("image")
        if not image:
            continue
        assert ":" in image.rsplit("/", 1)[-1] or "@sha256:" in image, f"{name}: {image} untagged"
        assert not image.endswith(":latest"), f"{name}: {image}"


def test_named_volumes_are_declared_and_bind_mounts_exist():
    declared = set(compose().get("volumes") or {})
    for name, service in services().items():
        for volume in service.get("volumes") or []:
            source = str(volume).split(":", 1)[0]
            if source.startswith((".", "/")):
                assert (REPO / source).exists(), f"{name}: bind mount {source} does not exist"
            else:
                assert source in declared, f"{name}: volume {source} not under top-level volumes"


def test_depends_on_names_existing_services_with_known_conditions():
    names = set(services())
    conditions = {"service_started", "service_healthy", "service_completed_successfully"}
    for name, service in services().items():
        depends = service.get("depends_on") or {}
        for other in depends:
            assert other in names, f"{name} depends on unknown service {other}"
            if isinstance(depends, dict):
                assert depends[other].get("condition") in conditions, f"{name} -> {other}"


def test_the_three_bridges_have_distinct_node_ids_and_peer_addresses_they_can_be_dialed_at():
    found = bridges()
    node_ids = [env.get("MQTT_BRIDGE_NODE_ID") for env in found.values()]
    advertised = [env.get("MQTT_BRIDGE_PEER_ADVERTISE") for env in found.values()]
    assert all(node_ids) and len(set(node_ids)) == len(node_ids), node_ids
    assert all(advertised) and len(set(advertised)) == len(advertised), advertised
    for name, env in found.items():
        host, _, port = env["MQTT_BRIDGE_PEER_ADVERTISE"].rpartition(":")
        # Other containers reach a bridge by its service name, on its peer_listen port.
        assert host == name, f"{name}: peer_advertise {host} is not the service name"
        assert env.get("MQTT_BRIDGE_PEER_LISTEN", "0.0.0.0:18830").endswith(f":{port}")


def test_every_mqtt_bridge_variable_in_the_compose_file_is_a_setting():
    text = COMPOSE.read_text(encoding="utf-8")
    used = set(re.findall(rf"\b{ENV_PREFIX}([A-Z0-9_]+)", text))
    for env in bridges().values():
        used |= {key[len(ENV_PREFIX) :] for key in env if key.startswith(ENV_PREFIX)}
    unknown = sorted(name for name in used if name.lower() not in SETTINGS)
    assert not unknown, f"not settings in bridge/config.py: {unknown}"


def test_each_bridge_environment_is_a_valid_cluster_configuration():
    for name, env in bridges().items():
        try:
            config = load_config(env=env)
        except ConfigError as exc:
            pytest.fail(f"{name}: {exc}", pytrace=False)
        assert config.clustered and config.store == "rocketmq", name
        assert config.admin_listen, f"{name}: the image's HEALTHCHECK needs admin_listen"


def test_every_bridge_needs_the_cluster_secret_from_the_user_and_no_default():
    raw = {name: services()[name].get("environment") or {} for name in bridges()}
    for name, env in raw.items():
        value = str(env.get("MQTT_BRIDGE_CLUSTER_SECRET", ""))
        assert value.startswith("${MQTT_BRIDGE_CLUSTER_SECRET:?"), f"{name}: {value!r}"


# The secrets every service must get from the user: (user variable, what each kind of service
# calls it). None may have a default.
REDIS_PASSWORD = "MQTT_BRIDGE_REDIS_PASSWORD"
ROCKETMQ_SECRET = "MQTT_BRIDGE_ROCKETMQ_SECRET_KEY"
SECRETS = ("MQTT_BRIDGE_CLUSTER_SECRET", REDIS_PASSWORD, ROCKETMQ_SECRET)


def raw_environment(name: str) -> dict[str, str]:
    """A service's environment as written, before interpolation."""
    env = services()[name].get("environment") or {}
    assert isinstance(env, dict), f"{name}: write environment as a mapping"
    return {str(k): str(v) for k, v in env.items()}


def required(value: str, variable: str) -> bool:
    """Whether `value` is exactly ${variable:?message}: the user must set it, no default."""
    return re.fullmatch(rf"\$\{{{variable}:\?[^}}]+\}}", value) is not None


def command_text(service: dict[str, Any]) -> str:
    command = service.get("command") or []
    return command if isinstance(command, str) else " ".join(str(part) for part in command)


def redis_servers() -> dict[str, list[str]]:
    """The redis-server services: name -> command."""
    found = {
        name: [str(part) for part in service["command"]]
        for name, service in services().items()
        if isinstance(service.get("command"), list) and service["command"][:1] == ["redis-server"]
    }
    assert len(found) >= 2, sorted(found)
    return found


def sentinels() -> list[str]:
    found = [name for name, s in services().items() if "sentinel.sh" in command_text(s)]
    assert len(found) >= 3, found
    return found


def rocketmq_servers() -> list[str]:
    """The brokers and the proxy (not the NameServer: 5.3.3's does not authenticate)."""
    found = [
        name
        for name, service in services().items()
        if re.search(r"mqbroker|mqproxy|rocketmq\.sh", command_text(service))
    ]
    assert len(found) >= 5, found  # broker, its slave, broker-b and its slave, the proxy
    return found


def test_every_secret_comes_from_a_required_variable_wherever_it_is_used():
    text = COMPOSE.read_text(encoding="utf-8")
    for variable in SECRETS:
        uses = re.findall(rf"\$\{{{variable}[^}}]*\}}", text)
        assert uses, f"{variable} is used nowhere"
        bad = [use for use in uses if not required(use, variable)]
        assert not bad, f"{variable} with a default or no message: {bad}"


def test_every_bridge_gets_the_redis_password_and_the_rocketmq_credentials():
    brokers_user = {raw_environment(name).get("ROCKETMQ_ACL_USER") for name in rocketmq_servers()}
    assert len(brokers_user) == 1, brokers_user
    for name in bridges():
        env = raw_environment(name)
        assert required(env.get(REDIS_PASSWORD, ""), REDIS_PASSWORD), name
        # Servers and Sentinels share the password (deploy/docker/sentinel.sh).
        assert required(env.get("MQTT_BRIDGE_REDIS_SENTINEL_PASSWORD", ""), REDIS_PASSWORD), name
        assert required(env.get(ROCKETMQ_SECRET, ""), ROCKETMQ_SECRET), name
        assert env.get("MQTT_BRIDGE_ROCKETMQ_ACCESS_KEY") in brokers_user, name
        assert not any("PASSWORD_FILE" in key or "SECRET_KEY_FILE" in key for key in env), name


def test_every_redis_server_requires_the_password_and_replicates_with_it():
    for name, command in redis_servers().items():
        options = {
            command[i]: command[i + 1]
            for i in range(1, len(command) - 1)
            if command[i].startswith("--")
        }
        assert required(options.get("--requirepass", ""), REDIS_PASSWORD), name
        # Either server may be the replica after a failover.
        assert required(options.get("--masterauth", ""), REDIS_PASSWORD), name
        # The health check's redis-cli logs in with it.
        assert required(raw_environment(name).get("REDISCLI_AUTH", ""), REDIS_PASSWORD), name


def test_every_sentinel_gets_the_redis_password_and_writes_it_on_every_start():
    for name in sentinels():
        env = raw_environment(name)
        assert required(env.get("REDIS_PASSWORD", ""), REDIS_PASSWORD), name
        assert required(env.get("REDISCLI_AUTH", ""), REDIS_PASSWORD), name
    script = SENTINEL_SH.read_text(encoding="utf-8")
    assert ': "${REDIS_PASSWORD:?' in script
    # Outside the first-start branch: a reused sentinel.conf gets the current password.
    tail = script[script.rindex("\nfi\n") :]
    for directive in ("requirepass", "sentinel sentinel-pass", "sentinel auth-pass"):
        assert directive in tail, directive


def test_every_rocketmq_server_turns_authentication_on_with_the_users_credentials():
    for name in rocketmq_servers():
        service = services()[name]
        command = command_text(service)
        assert "rocketmq.sh" in command, f"{name}: not started by deploy/docker/rocketmq.sh"
        env = raw_environment(name)
        assert required(env.get("ROCKETMQ_ACL_PASSWORD", ""), ROCKETMQ_SECRET), name
        mounted = [str(v).split(":")[0] for v in service.get("volumes") or []]
        assert "./deploy/docker/rocketmq.sh" in mounted, name
        for source in mounted:
            if source.endswith(".conf"):
                settings = _properties(REPO / source)
                assert settings.get("authenticationEnabled") == "true", source
                assert settings.get("authorizationEnabled") == "true", source
                # The credentials come from the environment, never from the repository.
                assert "initAuthenticationUser" not in settings, source
                assert "innerClientAuthenticationCredentials" not in settings, source
            elif source.endswith(".json"):
                proxy = json.loads((REPO / source).read_text(encoding="utf-8"))
                assert proxy.get("authenticationEnabled") is True, source
                assert proxy.get("authorizationEnabled") is True, source
                assert "innerClientAuthenticationCredentials" not in proxy, source


def _fake_rocketmq_bin(directory: Path) -> None:
    """`mqbroker` and `mqproxy` that print the config file they are given."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "mqbroker").write_text('while [ "$1" != -c ]; do shift; done; cat "$2"\n')
    (directory / "mqproxy").write_text('cat "$2"\n')


@pytest.mark.parametrize("role", ["broker", "proxy"])
def test_the_rocketmq_script_adds_the_credentials_from_the_environment(
    role: str, tmp_path: Path
) -> None:
    _fake_rocketmq_bin(tmp_path / "bin")
    source = BROKER_CONF if role == "broker" else PROXY_JSON
    env = {
        "PATH": "/usr/bin:/bin",
        "TMPDIR": str(tmp_path),
        "ROCKETMQ_ACL_USER": "mqtt",
        "ROCKETMQ_ACL_PASSWORD": "s3cret-pw",
    }
    result = subprocess.run(
        ["sh", str(ROCKETMQ_SH), role, str(source)],
        cwd=tmp_path / "bin",
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    inner = {"accessKey": "mqtt", "secretKey": "s3cret-pw"}
    if role == "broker":
        settings = dict(
            line.split("=", 1)
            for line in result.stdout.splitlines()
            if "=" in line and not line.startswith("#")
        )
        assert json.loads(settings["initAuthenticationUser"]) == {
            "username": "mqtt",
            "password": "s3cret-pw",
        }
        assert json.loads(settings["innerClientAuthenticationCredentials"]) == inner
        assert settings["enableLmq"] == "true"  # the rest of the file is kept
    else:
        proxy = json.loads(result.stdout)
        assert json.loads(proxy["innerClientAuthenticationCredentials"]) == inner
        assert proxy["proxyMode"] == "cluster"
    # Without the password, or with one the files cannot hold unquoted, it refuses to start.
    for password in (None, 'pw"quoted', "pw with spaces"):
        bad = {k: v for k, v in env.items() if k != "ROCKETMQ_ACL_PASSWORD"}
        if password is not None:
            bad["ROCKETMQ_ACL_PASSWORD"] = password
        refused = subprocess.run(
            ["sh", str(ROCKETMQ_SH), role, str(source)],
            cwd=tmp_path / "bin",
            env=bad,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert refused.returncode != 0 and "ROCKETMQ_ACL_PASSWORD" in refused.stderr, password


def _properties(path: Path) -> dict[str, str]:
    settings = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            settings[key.strip()] = value.strip()
    return settings


def test_the_sentinels_watch_the_master_name_the_bridges_ask_for():
    names = {env.get("MQTT_BRIDGE_REDIS_MASTER_NAME", "mqtt-bridge") for env in bridges().values()}
    assert len(names) == 1, names
    sentinels = {
        name: environment(service)
        for name, service in services().items()
        if "sentinel.sh" in json.dumps(service.get("command"))
    }
    assert len(sentinels) >= 3, sorted(sentinels)
    for name, env in sentinels.items():
        assert env.get("MASTER_NAME", "mqtt-bridge") in names, name
        assert env.get("SENTINEL_ANNOUNCE") == name, name
    listed = {
        entry.rsplit(":", 1)[0]
        for env in bridges().values()
        for entry in env["MQTT_BRIDGE_REDIS_SENTINELS"].split(",")
    }
    assert listed == set(sentinels)


def test_the_broker_config_enables_light_queues_and_registers_under_its_service_name():
    settings = _properties(BROKER_CONF)
    assert settings.get("enableLmq") == "true"
    assert settings.get("enableMultiDispatch") == "true"
    assert settings.get("autoCreateTopicEnable") == "true"
    assert settings.get("brokerIP1") in services()
    namesrvs = {env["MQTT_BRIDGE_ROCKETMQ_NAMESRV"] for env in bridges().values()}
    for namesrv in namesrvs:
        assert namesrv.split(":")[0] in services(), namesrv


def test_haproxy_balances_over_exactly_the_bridge_services():
    servers: dict[str, int] = {}
    section = ""
    settings: set[str] = set()
    for raw in HAPROXY_CFG.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if not raw[0].isspace():
            section = line
            continue
        if section.startswith("backend"):
            words = line.split()
            if words[0] == "server":
                host, _, port = words[2].rpartition(":")
                servers[host] = int(port)
            else:
                settings.add(" ".join(words))
    assert set(servers) == set(bridges()), f"haproxy.cfg servers {sorted(servers)}"
    for name, env in bridges().items():
        mqtt_port = int(env.get("MQTT_BRIDGE_LISTEN", "0.0.0.0:1883").split(",")[0].rsplit(":")[1])
        assert servers[name] == mqtt_port, name
    assert "balance leastconn" in settings
    mounted = [
        volume
        for service in services().values()
        for volume in service.get("volumes") or []
        if str(volume).startswith("./deploy/docker/haproxy.cfg:")
    ]
    assert mounted, "deploy/docker/haproxy.cfg is not mounted by any service"


def test_the_subset_reader_reads_this_file_and_refuses_what_it_cannot_read():
    """The fallback reader itself: it rejects what it cannot read instead of misreading it,
    catches broken YAML, and reads this repository's file as the tests above see it."""
    assert mini_yaml.read("a:\n  - x\n  - 'it''s'\nb: \"q # not a comment\"  # a comment\n") == {
        "a": ["x", "it's"],
        "b": "q # not a comment",
    }
    assert mini_yaml.read('a:\n- 1\n- ["x", "y"]\n') == {"a": ["1", ["x", "y"]]}
    for bad in ("a: 1\na: 2\n", "a:\n  b: 1\n   c: 2\n", "a:\n\tb: 1\n", "a: 1\n  b: 2\n"):
        with pytest.raises(mini_yaml.Invalid):
            mini_yaml.read(bad)
    for unsupported in ("a: &x 1\n", "a:\n  <<: *x\n", "a:\n  - b: 1\n", "a: [1,\n  2]\n"):
        with pytest.raises(mini_yaml.Unsupported):
            mini_yaml.read(unsupported)
    data = mini_yaml.read(
        COMPOSE.read_text(encoding="utf-8")
    )  # mini_yaml.Unsupported here fails the test
    assert set(data["services"]) == set(services())
    assert data["services"]["haproxy"]["healthcheck"]["test"][0] == "CMD"
