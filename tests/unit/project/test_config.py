"""Configuration: layering, validation and the README's table of settings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bridge.checks import load_config
from bridge.config import SETTINGS, Config, ConfigError

REPO = Path(__file__).resolve().parents[3]


def test_every_setting_is_documented_in_code_and_in_the_readme():
    names = set(Config.__dataclass_fields__)
    assert names == set(SETTINGS)
    readme = (REPO / "README.md").read_text()
    for name in names:
        assert f"`MQTT_BRIDGE_{name.upper()}`" in readme, name


def test_file_then_environment_then_overrides_win_in_that_order(tmp_path):
    conf = tmp_path / "b.toml"
    conf.write_text('[bridge]\nmax_inflight = 10\nlog_level = "debug"\nfsync = true\n')
    config = load_config(
        conf,
        env={"MQTT_BRIDGE_MAX_INFLIGHT": "20", "MQTT_BRIDGE_FSYNC": "false"},
        overrides={"max_inflight": "30", "listen": ["127.0.0.1:1"]},
    )
    assert config.max_inflight == 30
    assert config.fsync is False
    assert config.log_level == "debug"
    assert config.listen == ["127.0.0.1:1"]


def test_env_list_is_comma_separated():
    config = load_config(env={"MQTT_BRIDGE_LISTEN": "127.0.0.1:1883, 127.0.0.1:1884"})
    assert config.listen == ["127.0.0.1:1883", "127.0.0.1:1884"]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MQTT_BRIDGE_MAX_INFLIGHT": "many"}, "max_inflight: expected an integer"),
        ({"MQTT_BRIDGE_MAX_INFLIGHT": "0"}, "max_inflight: must be positive"),
        ({"MQTT_BRIDGE_FSYNC": "maybe"}, "fsync: expected true/false"),
        ({"MQTT_BRIDGE_LISTEN": "nohost"}, "is not HOST:PORT"),
        ({"MQTT_BRIDGE_NO_SUCH": "1"}, "unknown setting 'no_such'"),
        ({"MQTT_BRIDGE_STORE": "tape"}, "unknown backend"),
        ({"MQTT_BRIDGE_SYNC": "never"}, "sync: unknown policy 'never'"),
        (
            {"MQTT_BRIDGE_SYNC": "interval", "MQTT_BRIDGE_SYNC_INTERVAL_MS": "0"},
            "sync_interval_ms: must be above 0",
        ),
        (
            {"MQTT_BRIDGE_SYNC": "interval", "MQTT_BRIDGE_SYNC_INTERVAL_MS": "600000"},
            "sync_interval_ms: must be above 0 and at most 120,000",
        ),
        ({"MQTT_BRIDGE_ROCKETMQ_HELD_READS": "-1"}, "rocketmq_held_reads: must be 0..100000"),
    ],
)
def test_bad_values_are_refused_with_a_message_naming_the_setting(env, message):
    with pytest.raises(ConfigError, match=message):
        load_config(env=env)


def test_invalid_toml_is_reported(tmp_path):
    conf = tmp_path / "bad.toml"
    conf.write_text("max_inflight = = 3")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(conf, env={})


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bridge", *args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
    )


def test_cli_help_lists_every_setting():
    result = run_cli("--help")
    assert result.returncode == 0
    for name in SETTINGS:
        assert name in result.stdout


def test_cli_bad_setting_exits_nonzero_with_a_message_and_no_traceback():
    result = run_cli("--set", "max_inflight=lots", "--print-config")
    assert result.returncode == 2
    assert "max_inflight: expected an integer" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_missing_config_file_is_an_error_not_a_traceback():
    result = run_cli("--config", "/nonexistent/bridge.toml")
    assert result.returncode == 2
    assert "cannot read config file" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_print_config_shows_overrides():
    result = run_cli("--listen", "127.0.0.1:1999", "--data-dir", "/tmp/x", "--print-config")
    assert result.returncode == 0
    assert "listen = ['127.0.0.1:1999']" in result.stdout
    assert "data_dir = '/tmp/x'" in result.stdout


CLUSTER = {"MQTT_BRIDGE_STORE": "rocketmq", "MQTT_BRIDGE_REDIS_URL": "redis://127.0.0.1:6379/0"}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({}, "cluster_secret_file: a cluster member needs the cluster's secret"),
        ({"MQTT_BRIDGE_CLUSTER_SECRET": "short"}, "cluster_secret: the cluster secret must be"),
        (
            {"MQTT_BRIDGE_PEER_TLS_CERTFILE": "node.pem"},
            "peer_tls_certfile/peer_tls_keyfile/peer_tls_cafile: set all three",
        ),
        (
            {"MQTT_BRIDGE_CLUSTER_SECRET": "s" * 32, "MQTT_BRIDGE_PEER_HANDSHAKE_TIMEOUT": "0"},
            "peer_handshake_timeout: must be positive",
        ),
    ],
)
def test_a_cluster_member_must_authenticate_its_peer_links(extra, message):
    with pytest.raises(ConfigError, match=message):
        load_config(env={**CLUSTER, **extra})


@pytest.mark.parametrize(
    "extra",
    [
        {"MQTT_BRIDGE_CLUSTER_SECRET": "s" * 32},
        {
            "MQTT_BRIDGE_PEER_TLS_CERTFILE": "node.pem",
            "MQTT_BRIDGE_PEER_TLS_KEYFILE": "node.key",
            "MQTT_BRIDGE_PEER_TLS_CAFILE": "ca.pem",
        },
    ],
)
def test_a_secret_or_peer_tls_is_enough_for_a_cluster_member(extra):
    assert load_config(env={**CLUSTER, **extra}).clustered
