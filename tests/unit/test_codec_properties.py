"""Property-based tests of the codec: round trips, robustness on arbitrary bytes, chunking."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.mqtt.codec import Decoder, encode
from bridge.mqtt.errors import MQTTProtocolError, PacketTooLarge
from bridge.mqtt.packets import (
    SUBACK_FAILURE,
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
from bridge.mqtt.properties import MAX_VARINT

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

props5 = st.fixed_dictionaries(
    {},
    optional={
        0x01: st.integers(0, 1),
        0x02: st.integers(0, 0xFFFF_FFFF),
        0x03: text,
        0x09: st.binary(max_size=8),
        0x0B: st.lists(st.integers(1, MAX_VARINT), min_size=1, max_size=2),
        0x1F: text,
        0x21: st.integers(0, 0xFFFF),
        0x26: st.lists(st.tuples(text, text), min_size=1, max_size=2),
    },
)


def wills(level: int) -> st.SearchStrategy[Will]:
    return st.builds(
        Will,
        topic_names,
        st.binary(max_size=20),
        st.integers(0, 2),
        st.booleans(),
        props5 if level >= 5 else st.just({}),
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
        draw(props5) if level >= 5 else {},
    )


@st.composite
def publishes(draw: st.DrawFn, level: int) -> Publish:
    qos = draw(st.integers(0, 2))
    props = draw(props5) if level >= 5 else {}
    topic = draw(topic_names)
    if level >= 5 and draw(st.booleans()):
        props[0x23] = draw(st.integers(1, 0xFFFF))
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
    return st.builds(cls, packet_ids, st.integers(0, 255), props5)


@st.composite
def connacks(draw: st.DrawFn, level: int) -> Connack:
    code = draw(st.integers(0, 255 if level >= 5 else 5))
    present = draw(st.booleans()) if code == 0 else False
    return Connack(code, present, draw(props5) if level >= 5 else {})


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
    )


def packets(level: int) -> st.SearchStrategy[Packet]:
    no_props: st.SearchStrategy[dict[int, object]] = st.just({})
    props = props5 if level >= 5 else no_props
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
            Subscribe, packet_ids, st.lists(subscriptions(level), min_size=1, max_size=3), props
        ),
        st.builds(
            Suback,
            packet_ids,
            st.lists(st.sampled_from(suback_codes), min_size=1, max_size=4),
            props,
        ),
        st.builds(Unsubscribe, packet_ids, st.lists(topic_filters, min_size=1, max_size=3), props),
        st.builds(
            Unsuback,
            packet_ids,
            st.lists(st.sampled_from([0x00, 0x11, 0x80, 0x91]), max_size=3)
            if level >= 5
            else st.just([]),
            props,
        ),
        st.builds(Pingreq),
        st.builds(Pingresp),
        st.builds(Disconnect, st.integers(0, 255), props) if level >= 5 else st.builds(Disconnect),
    )


def non_connect(level: int) -> st.SearchStrategy[Packet]:
    return packets(level).filter(lambda p: not isinstance(p, Connect))


# --- helpers ---------------------------------------------------------------------------------

Outcome = tuple[list[Packet], str | None]


def new_decoder(level: int, max_packet_size: int) -> Decoder:
    decoder = Decoder(max_packet_size)
    decoder.protocol_level = level
    return decoder


def decode_in_chunks(
    data: bytes, cuts: list[int], level: int = 4, max_packet_size: int = 1 << 20
) -> Outcome:
    """Feed `data` split at `cuts`, calling packets() after each feed."""
    decoder = new_decoder(level, max_packet_size)
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
    decoder = new_decoder(5, 1 << 20)
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
    assert decode_in_chunks(data, cuts, level=5) == (items, None)


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
