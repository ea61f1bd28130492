"""MQTT 5.0 wills against a real bridge process: the Will Delay Interval (published after the
delay, not before; never if the client comes back in time; at the session's end if that is
sooner), will properties, and DISCONNECT with reason 0x04. The dying client is mosquitto_sub
killed with SIGKILL, as a device losing power would be; the watcher is paho-mqtt v5."""

from __future__ import annotations

import time

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode as PahoReasonCode

from tests.support.mqtt5 import (
    Paho5,
    mosquitto_sub_process,
    paho5,
    sub_options,
    wait_connected,
)
from tests.support.processes import BridgeProcess

pytestmark = pytest.mark.integration

DISCONNECT_WITH_WILL = 0x04


def watch_wills(watcher: Paho5) -> None:
    assert watcher.subscribe(("wills/#", sub_options(1))) == [1]


def test_delayed_will_is_published_after_the_will_delay_and_not_before(
    bridge: BridgeProcess,
) -> None:
    with paho5(bridge.port) as watcher:
        watch_wills(watcher)
        with mosquitto_sub_process(
            bridge.port,
            *("-i", "delayed-device", "-t", "devices/delayed/cmd", "-x", "60"),
            *("--will-topic", "wills/delayed-device", "--will-payload", "offline"),
            *("--will-qos", "1", "-D", "will", "will-delay-interval", "2"),
        ) as device:
            wait_connected(bridge, "delayed-device")
            device.kill()
            killed = time.monotonic()
            watcher.assert_nothing(1.3)  # not before the delay
            will = watcher.get(timeout=5)
            elapsed = time.monotonic() - killed
        assert (will.topic, will.payload, will.qos) == ("wills/delayed-device", b"offline", 1)
        assert 1.9 <= elapsed <= 5.0, elapsed


def test_delayed_will_is_never_published_if_the_client_reconnects_within_the_delay(
    bridge: BridgeProcess,
) -> None:
    with paho5(bridge.port) as watcher:
        watch_wills(watcher)
        with mosquitto_sub_process(
            bridge.port,
            *("-i", "flaky-device", "-t", "devices/flaky/cmd", "-x", "60"),
            *("--will-topic", "wills/flaky-device", "--will-payload", "offline"),
            *("-D", "will", "will-delay-interval", "2"),
        ) as device:
            wait_connected(bridge, "flaky-device")
            device.kill()
        with paho5(bridge.port, "flaky-device", clean_start=False, session_expiry=60) as back:
            assert back.session_present is True
            bridge.wait_for_log("client flaky-device: reconnected within its will delay")
            watcher.assert_nothing(3.0)  # well past the 2 s delay


def test_delayed_will_is_published_when_the_session_expires_before_the_delay(
    bridge: BridgeProcess,
) -> None:
    with paho5(bridge.port) as watcher:
        watch_wills(watcher)
        with mosquitto_sub_process(
            bridge.port,
            *("-i", "short-session", "-t", "devices/short/cmd", "-x", "1"),
            *("--will-topic", "wills/short-session", "--will-payload", "gone"),
            *("-D", "will", "will-delay-interval", "60"),
        ) as device:
            wait_connected(bridge, "short-session")
            device.kill()
            killed = time.monotonic()
            will = watcher.get(timeout=6)
            elapsed = time.monotonic() - killed
        assert will.payload == b"gone"
        assert elapsed <= 5.0, elapsed  # the 1 s session, not the 60 s delay


def test_will_properties_arrive_on_the_will(bridge: BridgeProcess) -> None:
    with paho5(bridge.port) as watcher:
        watch_wills(watcher)
        with mosquitto_sub_process(
            bridge.port,
            *("-i", "press3", "-t", "devices/press3/cmd"),
            *("--will-topic", "wills/press3", "--will-payload", '{"state":"LOST"}'),
            *("-D", "will", "user-property", "line", "1"),
            *("-D", "will", "user-property", "line", "2"),
            *("-D", "will", "content-type", "application/json"),
            *("-D", "will", "response-topic", "devices/press3/ack"),
            *("-D", "will", "correlation-data", "c-17"),
            *("-D", "will", "payload-format-indicator", "1"),
        ) as device:
            wait_connected(bridge, "press3")
            device.kill()
            will = watcher.get(timeout=5)
    assert (will.topic, will.payload) == ("wills/press3", b'{"state":"LOST"}')
    props = will.properties
    assert props.UserProperty == [("line", "1"), ("line", "2")]
    assert props.ContentType == "application/json"
    assert props.ResponseTopic == "devices/press3/ack"
    assert props.CorrelationData == b"c-17"
    assert props.PayloadFormatIndicator == 1


def test_disconnect_with_reason_0x04_publishes_the_will(bridge: BridgeProcess) -> None:
    with paho5(bridge.port) as watcher:
        watch_wills(watcher)
        with paho5(
            bridge.port, "leaving", will=("wills/leaving", b"left on purpose", 1, False, {})
        ) as leaving:
            leaving.client.disconnect(
                reasoncode=PahoReasonCode(PacketTypes.DISCONNECT, identifier=DISCONNECT_WITH_WILL)
            )
            will = watcher.get(timeout=5)
        assert (will.topic, will.payload) == ("wills/leaving", b"left on purpose")


def test_normal_disconnect_does_not_publish_the_will(bridge: BridgeProcess) -> None:
    with paho5(bridge.port) as watcher:
        watch_wills(watcher)
        with paho5(
            bridge.port, "polite", will=("wills/polite", b"should not appear", 1, False, {})
        ):
            pass  # leaves with DISCONNECT 0x00
        bridge.wait_for_log("client polite: DISCONNECT")
        watcher.assert_nothing(1.0)
