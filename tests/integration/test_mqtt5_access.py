"""ACL answers for MQTT 5.0 clients on a real bridge process: a denied SUBSCRIBE gets 0x87, a
wildcard subscription is granted but leaves the denied topics out, a denied PUBLISH gets PUBACK
or PUBREC 0x87; MQTT 3.1.1 clients keep the answers 3.1.1 has (SUBACK 0x80, a PUBLISH
acknowledged and dropped). paho-mqtt is the v5 client where it reports the answer; the raw
client reads the PUBREC reason paho ignores and the 3.1.1 wire."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from bridge.mqtt.packets import SUBACK_FAILURE, Puback, Publish, Pubrec, Pubrel, Subscription
from bridge.mqtt.properties import PropertyId
from bridge.mqtt.reasons import ReasonCode
from tests.support.clients import RawClient
from tests.support.mqtt5 import RawClient5, paho5, sub_options
from tests.support.processes import BridgeProcess

pytestmark = pytest.mark.integration

P = PropertyId
R = ReasonCode

ACL = """\
deny  all subscribe test/nosubscribe
deny  all publish   test/nopublish
allow all all       #
"""


@pytest.fixture
def guarded(tmp_path: Path, bridge_factory: Callable[..., BridgeProcess]) -> BridgeProcess:
    acl = tmp_path / "acl.conf"
    acl.write_text(ACL)
    return bridge_factory(f"acl_file={acl}")


def test_denied_subscribe_gets_suback_0x87(guarded: BridgeProcess) -> None:
    with paho5(guarded.port) as client:
        assert client.subscribe(("test/nosubscribe", sub_options(1))) == [R.NOT_AUTHORIZED]
        assert client.subscribe(("test/allowed", sub_options(1))) == [1]


def test_wildcard_subscription_is_granted_but_gets_no_messages_on_the_denied_topic(
    guarded: BridgeProcess,
) -> None:
    with paho5(guarded.port) as reader, paho5(guarded.port) as publisher:
        assert reader.subscribe(("#", sub_options(1))) == [1]
        publisher.publish("test/nosubscribe", b"secret", qos=1)
        publisher.publish("test/other", b"public", qos=1)
        publisher.publish("test/nosubscribe", b"secret again", qos=0)
        message = reader.get()
        assert (message.topic, message.payload) == ("test/other", b"public")
        reader.assert_nothing(0.7)


def test_denied_publish_gets_puback_0x87_in_mqtt5(guarded: BridgeProcess) -> None:
    with paho5(guarded.port) as reader, paho5(guarded.port) as publisher:
        assert reader.subscribe(("test/#", sub_options(1))) == [1]
        assert publisher.publish("test/nopublish", b"refused", qos=1) == R.NOT_AUTHORIZED
        assert publisher.publish("test/allowed", b"accepted", qos=1) == 0
        assert reader.get().payload == b"accepted"
        reader.assert_nothing(0.5)
        assert publisher.disconnects.empty()


def test_denied_publish_gets_pubrec_0x87_at_qos2_in_mqtt5(guarded: BridgeProcess) -> None:
    client = RawClient5(guarded.port)
    client.connect("qos2-denied")
    client.send(Publish("test/nopublish", b"refused", 2, packet_id=5))
    pubrec = client.recv()
    assert isinstance(pubrec, Pubrec)
    assert (pubrec.packet_id, pubrec.reason_code) == (5, R.NOT_AUTHORIZED)
    # An error PUBREC ends the exchange: the id is free again, and an allowed message goes.
    client.send(Publish("test/allowed", b"accepted", 2, packet_id=5))
    assert client.recv() == Pubrec(5)
    client.send(Pubrel(5))
    assert client.recv().packet_id == 5


def test_mqtt_3_1_1_keeps_suback_0x80_and_acknowledges_a_denied_publish(
    guarded: BridgeProcess,
) -> None:
    watcher = RawClient5(guarded.port)
    watcher.connect("watcher")
    assert watcher.subscribe_many(Subscription("test/#", 1)) == [1]
    old = RawClient(guarded.port)
    assert old.connect("old-device").return_code == 0
    assert old.subscribe("test/nosubscribe", 1) == [SUBACK_FAILURE]
    old.send(Publish("test/nopublish", b"dropped", 1, packet_id=3))
    assert old.recv() == Puback(3)  # reason code 0: 3.1.1 has no other
    old.publish("test/nopublish", b"dropped too", 2, packet_id=4)  # PUBREC, PUBREL, PUBCOMP
    watcher.assert_nothing(0.7)
    guarded.wait_for_log("PUBLISH to 'test/nopublish' dropped: denied by the ACL")
