"""Property-based tests of the codec: round trips, robustness on arbitrary bytes, chunking."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.mqtt.codec import Decoder, encode
from bridge.mqtt.errors import MQTTProtocolError, PacketTooLarge
from bridge.mqtt.packets import (
    SUBACK_FAILURE,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
)

from .mqtt5_spec import SPEC_REASON_CODES, WILL, properties_for

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- strategies ------------------------------------------------------------------------------

text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
level_text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\x00/+#"), max_size=6
)
topic_names = st.lists(level_text, min_size=1, max_size=4).map("/".join).filter(bool)
topic_filters = st.lists(st.one_of(level_text, st.just("+")), min_size=1, max_size=4).map(
    "/".join
).filter(bool) | st.just("#")
packet_ids = st.integers(1, 0xFFFF)
payloads = st.binary(max_size=300)

NO_PROPS: st.SearchStrategy[dict[int, object]] = st.just({})


def props5(scope: str, level: int = 5) -> st.SearchStrategy[dict[int, object]]:
    """Valid MQTT 5.0 properties for `scope` (a packet name or WILL); none below 5.0."""
    return properties_for(scope) if level >= 5 else NO_PROPS


def reason_codes(packet: str, level: int) -> st.SearchStrategy[int]:
    return st.sampled_from(sorted(SPEC_REASON_CODES[packet])) if level >= 5 else st.just(0)


def wills(level: int) -> st.SearchStrategy[Will]:
    return st.builds(
        Will,
        topic_names,
        st.binary(max_size=20),
        st.integers(0, 2),
        st.booleans(),
        props5(WILL, level),
    )


@st.composite
def connects(draw: st.DrawFn, level: int) -> Connect:
    if level >= 5:
        protocol_level, name = 5, "MQTT"
    else:
        protocol_level, name = draw(st.sampled_from([(4, "MQTT"), (3, "MQIsdp")]))
    username = draw(st.none() | text)
    password = draw(st.none() | st.binary(max_size=10))
    if username is None and level < 5:
        password = None
    return Connect(
        draw(text),
        draw(st.booleans()),
        draw(st.integers(0, 0xFFFF)),
        username,
        password,
        draw(st.none() | wills(level)),
        protocol_level,
        name,
        draw(props5("CONNECT", level)),
    )


@st.composite
def publishes(draw: st.DrawFn, level: int) -> Publish:
    qos = draw(st.integers(0, 2))
    props = draw(props5("PUBLISH", level))
    topic = draw(topic_names)
    if 0x23 in props:
        topic = draw(st.just("") | topic_names)
    return Publish(
        topic,
        draw(payloads),
        qos,
        draw(st.booleans()),
        draw(st.booleans()) if qos else False,
        draw(packet_ids) if qos else None,
        props,
    )


def acks(
    cls: type[Puback] | type[Pubrec] | type[Pubrel] | type[Pubcomp], level: int
) -> st.SearchStrategy[Packet]:
    if level < 5:
        return st.builds(cls, packet_ids)
    name = cls.__name__.upper()
    return st.builds(cls, packet_ids, reason_codes(name, level), props5(name))


@st.composite
def connacks(draw: st.DrawFn, level: int) -> Connack:
    code = draw(reason_codes("CONNACK", level) if level >= 5 else st.integers(0, 5))
    present = draw(st.booleans()) if code == 0 else False
    return Connack(code, present, draw(props5("CONNACK", level)))


def subscriptions(level: int) -> st.SearchStrategy[Subscription]:
    if level < 5:
        return st.builds(Subscription, topic_filters, st.integers(0, 2))
    return st.builds(
        Subscription,
        topic_filters,
        st.integers(0, 2),
        st.booleans(),
        st.booleans(),
        st.integers(0, 2),
    ).filter(lambda sub: not (sub.no_local and sub.topic_filter.startswith("$share/")))


def packets(level: int) -> st.SearchStrategy[Packet]:
    suback_codes = [0, 1, 2, SUBACK_FAILURE] + ([0x83, 0x87, 0x97, 0xA2] if level >= 5 else [])
    return st.one_of(
        connects(level),
        connacks(level),
        publishes(level),
        acks(Puback, level),
        acks(Pubrec, level),
        acks(Pubrel, level),
        acks(Pubcomp, level),
        st.builds(
            Subscribe,
            packet_ids,
            st.lists(subscriptions(level), min_size=1, max_size=3),
            props5("SUBSCRIBE", level),
        ),
        st.builds(
            Suback,
            packet_ids,
            st.lists(st.sampled_from(suback_codes), min_size=1, max_size=4),
            props5("SUBACK", level),
        ),
        st.builds(
            Unsubscribe,
            packet_ids,
            st.lists(topic_filters, min_size=1, max_size=3),
            props5("UNSUBSCRIBE", level),
        ),
        st.builds(
            Unsuback,
            packet_ids,
            st.lists(st.sampled_from([0x00, 0x11, 0x80, 0x91]), max_size=3)
            if level >= 5
            else st.just([]),
            props5("UNSUBACK", level),
        ),
        st.builds(Pingreq),
        st.builds(Pingresp),
        st.builds(Disconnect, reason_codes("DISCONNECT", level), props5("DISCONNECT", level)),
        *([auths()] if level >= 5 else []),
    )


def auths() -> st.SearchStrategy[Auth]:
    """AUTH packets: the empty short form, or a reason code with properties (always with an
    Authentication Method, which every long-form AUTH needs)."""
    return st.just(Auth()) | st.builds(Auth, reason_codes("AUTH", 5), properties_for("AUTH"))


def non_connect(level: int) -> st.SearchStrategy[Packet]:
    return packets(level).filter(lambda p: not isinstance(p, Connect))


# --- helpers ---------------------------------------------------------------------------------

Outcome = tuple[list[Packet], str | None]


def new_decoder(level: int, max_packet_size: int, from_server: bool = False) -> Decoder:
    """A decoder at `level`; `from_server` for one that reads what a server sends (the 5.0
    round trips use it, as their PUBLISHes may carry Subscription Identifiers)."""
    decoder = Decoder(max_packet_size, from_server=from_server)
    decoder.protocol_level = level
    return decoder


def decode_in_chunks(
    data: bytes,
    cuts: list[int],
    level: int = 4,
    max_packet_size: int = 1 << 20,
    from_server: bool = False,
) -> Outcome:
    """Feed `data` split at `cuts`, calling packets() after each feed."""
    decoder = new_decoder(level, max_packet_size, from_server)
    got: list[Packet] = []
    bounds = [0, *sorted(set(cuts)), len(data)]
    for start, stop in itertools.pairwise(bounds):
        decoder.feed(data[start:stop])
        try:
            got.extend(decoder.packets())
        except MQTTProtocolError as error:
            got.extend(error.packets)
            return got, error.rule
    return got, None


def decode_with_next_packet(data: bytes, level: int, max_packet_size: int) -> Outcome:
    """Feed `data` byte by byte, draining with next_packet()."""
    decoder = new_decoder(level, max_packet_size)
    got: list[Packet] = []
    for index in range(len(data)):
        decoder.feed(data[index : index + 1])
        try:
            while (packet := decoder.next_packet()) is not None:
                got.append(packet)
        except MQTTProtocolError as error:
            return got, error.rule
    return got, None


def encode_all(items: list[Packet], level: int) -> bytes:
    return b"".join(encode(p, level) for p in items)


# --- round trips -----------------------------------------------------------------------------


@SETTINGS
@given(packets(4))
def test_every_mqtt_3_1_1_packet_round_trips(packet: Packet) -> None:
    decoder = Decoder()
    decoder.feed(encode(packet, 4))
    assert decoder.packets() == [packet]
    assert decoder.buffered == 0


@SETTINGS
@given(packets(5))
def test_every_mqtt_5_packet_round_trips(packet: Packet) -> None:
    decoder = new_decoder(5, 1 << 20, from_server=True)
    decoder.feed(encode(packet, 5))
    assert decoder.packets() == [packet]


@SETTINGS
@given(st.lists(non_connect(4), min_size=1, max_size=6), st.lists(st.integers(0, 4000), max_size=8))
def test_stream_split_at_random_points_decodes_to_the_same_packets(
    items: list[Packet], cuts: list[int]
) -> None:
    data = encode_all(items, 4)
    cuts = [c % (len(data) + 1) for c in cuts]
    assert decode_in_chunks(data, cuts) == (items, None)


@SETTINGS
@given(st.lists(non_connect(5), min_size=1, max_size=4), st.lists(st.integers(0, 4000), max_size=6))
def test_mqtt5_stream_split_at_random_points_decodes_to_the_same_packets(
    items: list[Packet], cuts: list[int]
) -> None:
    data = encode_all(items, 5)
    cuts = [c % (len(data) + 1) for c in cuts]
    assert decode_in_chunks(data, cuts, level=5, from_server=True) == (items, None)


# --- robustness ------------------------------------------------------------------------------


def assert_same_outcome_whole_and_bytewise(data: bytes, level: int, max_packet_size: int) -> None:
    whole = decode_in_chunks(data, [], level, max_packet_size)
    bytewise = decode_in_chunks(data, list(range(1, len(data))), level, max_packet_size)
    drained = decode_with_next_packet(data, level, max_packet_size)
    assert whole == bytewise == drained


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.sampled_from([4, 5]), st.sampled_from([1 << 20, 16]))
def test_arbitrary_bytes_decode_or_raise_protocol_error_same_whole_and_bytewise(
    data: bytes, level: int, max_packet_size: int
) -> None:
    assert_same_outcome_whole_and_bytewise(data, level, max_packet_size)


@st.composite
def mutated_streams(draw: st.DrawFn) -> tuple[bytes, int]:
    level = draw(st.sampled_from([4, 5]))
    data = bytearray(encode_all(draw(st.lists(packets(level), min_size=1, max_size=4)), level))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        if not data:
            break
        index = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[index] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set":
            data[index] = draw(st.integers(0, 255))
        elif kind == "insert":
            data.insert(index, draw(st.integers(0, 255)))
        elif kind == "delete":
            del data[index]
        else:
            del data[index:]
    return bytes(data), level


@SETTINGS
@given(mutated_streams())
def test_mutated_valid_streams_decode_or_raise_protocol_error_same_whole_and_bytewise(
    stream: tuple[bytes, int],
) -> None:
    data, level = stream
    assert_same_outcome_whole_and_bytewise(data, level, 1 << 20)


# --- max packet size -------------------------------------------------------------------------


@SETTINGS
@given(non_connect(4), st.data())
def test_max_packet_size_is_enforced_from_the_fixed_header_alone(
    packet: Packet, data: st.DataObject
) -> None:
    wire = encode(packet)
    header_len = 2
    while wire[header_len - 1] & 0x80:
        header_len += 1
    limit = data.draw(st.integers(1, len(wire) - 1), label="limit")
    decoder = Decoder(max_packet_size=limit)
    decoder.feed(wire[:header_len])
    try:
        decoder.packets()
    except PacketTooLarge as error:
        assert (error.size, error.limit) == (len(wire), limit)
    else:
        raise AssertionError("PacketTooLarge not raised")
    exact = Decoder(max_packet_size=len(wire))
    exact.feed(wire)
    assert exact.packets() == [packet]
