"""Safe defaults (issue 36, item 6): loopback until users exist, anonymous clients refused once
they do, client events private, files private."""

from __future__ import annotations

import logging
import os
import stat

import pytest

from bridge.access.acl import Acl, may_see_client_events
from bridge.checks import load_config
from bridge.config import Config, ConfigError
from bridge.listeners.exposure import describe_exposure, is_loopback_host, public_listeners
from bridge.private_files import make_private_dir, open_private, secure_data_dir


def test_the_default_listener_is_loopback_and_anonymous_clients_are_accepted_there():
    config = load_config(env={})
    assert config.listen == ["127.0.0.1:1883"]
    assert config.allow_anonymous is True
    assert public_listeners(config) == []
    level, line = describe_exposure(config)
    assert level == logging.INFO and "loopback only" in line


def test_a_public_listener_without_users_is_refused_naming_the_setting_that_allows_it():
    with pytest.raises(ConfigError, match="allow_anonymous_public=true") as raised:
        load_config(env={"MQTT_BRIDGE_LISTEN": "0.0.0.0:1883"})
    assert str(raised.value).startswith("listen: 0.0.0.0:1883 is not a loopback address")


@pytest.mark.parametrize(
    "setting",
    [
        {"MQTT_BRIDGE_WS_LISTEN": "[::]:8083"},
        {"MQTT_BRIDGE_LISTEN": "192.0.2.7:1883"},
        {"MQTT_BRIDGE_LISTEN": "broker.example:1883"},
        {"MQTT_BRIDGE_LISTEN": ":1883"},
    ],
)
def test_every_kind_of_public_address_counts_as_exposed(setting):
    with pytest.raises(ConfigError, match="not a loopback address"):
        load_config(env=setting)


def test_the_explicit_setting_exposes_anonymous_access_and_says_so_with_a_warning():
    config = load_config(
        env={"MQTT_BRIDGE_LISTEN": "0.0.0.0:1883", "MQTT_BRIDGE_ALLOW_ANONYMOUS_PUBLIC": "true"}
    )
    level, line = describe_exposure(config)
    assert level == logging.WARNING and "0.0.0.0:1883" in line


def test_users_make_a_public_listener_fine_and_refuse_anonymous_clients_by_default(tmp_path):
    passwd = tmp_path / "passwd"
    passwd.write_text("")
    config = load_config(
        env={"MQTT_BRIDGE_LISTEN": "0.0.0.0:1883", "MQTT_BRIDGE_PASSWORD_FILE": str(passwd)}
    )
    assert config.allow_anonymous is False
    assert describe_exposure(config) == (
        logging.INFO,
        "client listeners: anonymous clients refused",
    )


def test_allow_anonymous_true_with_users_on_a_public_listener_still_needs_the_setting(tmp_path):
    env = {
        "MQTT_BRIDGE_LISTEN": "0.0.0.0:1883",
        "MQTT_BRIDGE_PASSWORD_FILE": str(tmp_path / "passwd"),
        "MQTT_BRIDGE_ALLOW_ANONYMOUS": "true",
    }
    with pytest.raises(ConfigError, match="allow_anonymous_public"):
        load_config(env=env)
    assert load_config(env={**env, "MQTT_BRIDGE_ALLOW_ANONYMOUS_PUBLIC": "on"}).allow_anonymous


def test_allow_anonymous_auto_is_the_unset_default():
    assert load_config(env={"MQTT_BRIDGE_ALLOW_ANONYMOUS": "auto"}).allow_anonymous is True
    assert Config().anonymous_allowed is True
    assert Config(auth_redis=True).anonymous_allowed is False
    assert Config(password_file="p", allow_anonymous=True).anonymous_allowed is True


def test_a_tls_listener_that_requires_client_certificates_may_be_public():
    config = Config(
        tls_listen=["0.0.0.0:8883"], ws_listen=["127.0.0.1:8083"], tls_client_cert="required"
    )
    assert public_listeners(config) == []
    assert "require a client certificate" in describe_exposure(config)[1]
    config.tls_client_cert = "optional"
    assert public_listeners(config) == [("tls_listen", "0.0.0.0:8883")]


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.1", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
        ("gateway.local", False),
    ],
)
def test_loopback_hosts(host, loopback):
    assert is_loopback_host(host) is loopback


@pytest.mark.parametrize(
    ("topic_filter", "sees"),
    [
        ("$SYS/#", True),
        ("$SYS/brokers/+/clients/#", True),
        ("$SYS/brokers/n1/clients/dev-7/connected", True),
        ("$SYS/+/+/clients/+/disconnected", True),
        ("$SYS/brokers/n1/clients/connected", False),
        ("$SYS/brokers/+/uptime", False),
        ("#", False),
        ("factory/#", False),
    ],
)
def test_which_filters_could_receive_client_events(topic_filter, sees):
    assert may_see_client_events(topic_filter) is sees


def test_without_rules_private_client_events_refuse_only_the_event_subscriptions():
    acl = Acl(None, private_client_events=True)
    assert not acl.subscribe_allowed("c", "alice", "$SYS/#")
    assert acl.subscribe_allowed("c", "alice", "$SYS/brokers/+/uptime")
    assert acl.subscribe_allowed("c", "alice", "factory/#")
    assert Acl(None).subscribe_allowed("c", None, "$SYS/#")


def test_a_new_data_dir_and_its_files_are_private_whatever_the_umask(tmp_path):
    previous = os.umask(0o000)
    try:
        data = tmp_path / "a" / "data"
        secure_data_dir(data)
        fd = open_private(data / "f", os.O_WRONLY)
        os.close(fd)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700
    assert stat.S_IMODE((data / "f").stat().st_mode) == 0o600


def test_an_existing_open_data_dir_is_closed_to_others(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o755)
    secure_data_dir(data)
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    make_private_dir(data)  # existing: left as it is
    assert stat.S_IMODE(data.stat().st_mode) == 0o700


def test_the_acl_explanation_says_why_client_events_are_refused_without_rules():
    from bridge.access.acl import SUBSCRIBE
    from bridge.access.explain import explain

    refused = explain(None, SUBSCRIBE, "c", "alice", "$SYS/#", private_client_events=True)
    assert not refused.allowed and "client events are refused" in refused.reason
    assert explain(None, SUBSCRIBE, "c", "alice", "$SYS/brokers/+/uptime").allowed
    assert explain(None, SUBSCRIBE, "c", None, "$SYS/#").allowed
