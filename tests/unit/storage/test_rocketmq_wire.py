"""The RocketMQ remoting codec: frames, headers, properties and stored messages."""

from __future__ import annotations

import contextlib
import json
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.storage.rocketmq.bytes import ByteReader
from bridge.storage.rocketmq.messages import (
    MESSAGE_MAGIC_CODE,
    MessageSysFlag,
    StoredMessage,
    UnsupportedCompression,
    _decode_careful,
    _decode_plain,
    body_crc,
    decode_messages,
    decode_properties,
    encode_properties,
    encode_stored_message,
    send_message_v2_fields,
)
from bridge.storage.rocketmq.sendframe import SendFrames
from bridge.storage.rocketmq.wire import (
    FrameDecoder,
    RemotingCommand,
    RemotingProtocolError,
    RequestCode,
    ResponseCode,
    SerializeType,
    decode_command,
    encode_command,
    loads_fastjson,
)

# --- byte literals from the Java definitions --------------------------------------------------


def test_request_frame_layout() -> None:
    cmd = RemotingCommand(code=RequestCode.GET_MAX_OFFSET, opaque=7, ext_fields={"topic": "t"})
    frame = encode_command(cmd)
    total, header_field = struct.unpack(">II", frame[:8])
    assert total == len(frame) - 4
    assert header_field >> 24 == 0  # JSON
    header_len = header_field & 0xFFFFFF
    header = json.loads(frame[8 : 8 + header_len])
    assert header == {
        "code": 30,
        "language": "PYTHON",
        "version": 479,
        "opaque": 7,
        "flag": 0,
        "serializeTypeCurrentRPC": "JSON",
        "extFields": {"topic": "t"},
    }
    assert frame[8 + header_len :] == b""


def test_decode_java_json_response() -> None:
    header = (
        b'{"code":0,"extFields":{"queueOffset":"5","msgId":"7F00000100002A9F0000000000000000",'
        b'"queueId":"1"},"flag":1,"language":"JAVA","opaque":42,"serializeTypeCurrentRPC":"JSON",'
        b'"version":479}'
    )
    body = b"xyz"
    frame = struct.pack(">II", 4 + len(header) + len(body), len(header)) + header + body
    [cmd] = FrameDecoder().feed(frame)
    assert cmd.code == ResponseCode.SUCCESS
    assert cmd.is_response and not cmd.is_oneway
    assert cmd.opaque == 42
    assert cmd.language == "JAVA"
    assert cmd.ext_fields == {
        "queueOffset": "5",
        "msgId": "7F00000100002A9F0000000000000000",
        "queueId": "1",
    }
    assert cmd.body == body


def test_decode_binary_rocketmq_header() -> None:
    # code short, language byte, version short, opaque int, flag int, remark, extFields.
    ext = struct.pack(">H", 1) + b"k" + struct.pack(">I", 2) + b"vv"
    header = (
        struct.pack(">hbhii", 19, 0, 479, 9, 1)
        + struct.pack(">I", 2)
        + b"no"
        + struct.pack(">I", len(ext))
        + ext
    )
    frame = struct.pack(">I", (1 << 24) | len(header)) + header + b"B"
    cmd = decode_command(frame)
    assert (cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag) == (19, "JAVA", 479, 9, 1)
    assert cmd.remark == "no"
    assert cmd.ext_fields == {"k": "vv"}
    assert cmd.body == b"B"
    assert cmd.serialize_type == SerializeType.ROCKETMQ


def test_oneway_and_response_flags() -> None:
    assert RemotingCommand(code=15, flag=2).is_oneway
    assert RemotingCommand(code=0, flag=1).is_response


def test_codes_match_java() -> None:
    assert RequestCode.SEND_MESSAGE_V2.value == 310
    assert RequestCode.PULL_MESSAGE.value == 11
    assert RequestCode.QUERY_CONSUMER_OFFSET.value == 14
    assert RequestCode.UPDATE_CONSUMER_OFFSET.value == 15
    assert RequestCode.UPDATE_AND_CREATE_TOPIC.value == 17
    assert RequestCode.GET_MAX_OFFSET.value == 30
    assert RequestCode.GET_MIN_OFFSET.value == 31
    assert RequestCode.HEART_BEAT.value == 34
    assert RequestCode.GET_ROUTEINFO_BY_TOPIC.value == 105
    assert ResponseCode.FLUSH_DISK_TIMEOUT.value == 10
    assert ResponseCode.SLAVE_NOT_AVAILABLE.value == 11
    assert ResponseCode.FLUSH_SLAVE_TIMEOUT.value == 12
    assert ResponseCode.TOPIC_NOT_EXIST.value == 17
    assert ResponseCode.PULL_NOT_FOUND.value == 19
    assert ResponseCode.PULL_RETRY_IMMEDIATELY.value == 20
    assert ResponseCode.PULL_OFFSET_MOVED.value == 21
    assert ResponseCode.QUERY_NOT_FOUND.value == 22
    assert ResponseCode.SYSTEM_BUSY.value == 2


def test_properties_literal() -> None:
    assert encode_properties({"TAGS": "a", "KEYS": "k1 k2"}) == "TAGS\x01a\x02KEYS\x01k1 k2\x02"
    assert decode_properties("TAGS\x01a\x02KEYS\x01k1 k2\x02") == {"TAGS": "a", "KEYS": "k1 k2"}
    # Like the broker: no trailing separator, too-short and value-less entries.
    assert decode_properties("A\x01b") == {"A": "b"}
    assert decode_properties("\x02A\x01\x02\x01xy\x02B\x01cd") == {"B": "cd"}


@pytest.mark.parametrize("bad", [{"": "x"}, {"a": ""}, {"a\x01": "x"}, {"a": "x\x02"}])
def test_properties_rejects_unencodable(bad: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        encode_properties(bad)


def test_send_v2_short_field_names() -> None:
    fields = send_message_v2_fields(
        producer_group="pg",
        topic="t",
        queue_id=3,
        properties={"TAGS": "x"},
        born_timestamp=1234,
        max_reconsume_times=16,
        broker_name="b",
    )
    assert fields == {
        "a": "pg",
        "b": "t",
        "c": "TBW102",
        "d": "4",
        "e": "3",
        "f": "0",
        "g": "1234",
        "h": "0",
        "i": "TAGS\x01x\x02",
        "j": "0",
        "k": "false",
        "l": "16",
        "m": "false",
        "n": "b",
    }


def _java_stored_message() -> bytes:
    """A message laid out field by field as MessageDecoder/CommitLog write it."""
    body = b"hello"
    topic = b"TopicA"
    props = b"TAGS\x01tg\x02KEYS\x01k1\x02UNIQ_KEY\x01ABC\x02"
    fields = [
        struct.pack(">i", MESSAGE_MAGIC_CODE),  # 2 MAGICCODE
        struct.pack(">i", zlib.crc32(body) & 0x7FFFFFFF),  # 3 BODYCRC
        struct.pack(">i", 2),  # 4 QUEUEID
        struct.pack(">i", 0),  # 5 FLAG
        struct.pack(">q", 17),  # 6 QUEUEOFFSET
        struct.pack(">q", 4096),  # 7 PHYSICALOFFSET
        struct.pack(">i", 0),  # 8 SYSFLAG
        struct.pack(">q", 1_700_000_000_000),  # 9 BORNTIMESTAMP
        bytes([10, 0, 0, 1]) + struct.pack(">i", 5555),  # 10 BORNHOST
        struct.pack(">q", 1_700_000_000_005),  # 11 STORETIMESTAMP
        bytes([127, 0, 0, 1]) + struct.pack(">i", 10911),  # 12 STOREHOST
        struct.pack(">i", 0),  # 13 RECONSUMETIMES
        struct.pack(">q", 0),  # 14 Prepared Transaction Offset
        struct.pack(">i", len(body)) + body,  # 15 BODY
        bytes([len(topic)]) + topic,  # 16 TOPIC
        struct.pack(">h", len(props)) + props,  # 17 PROPERTIES
    ]
    rest = b"".join(fields)
    return struct.pack(">i", 4 + len(rest)) + rest


def test_decode_java_stored_message() -> None:
    raw = _java_stored_message()
    [msg] = decode_messages(raw + raw)[:1]
    assert msg.topic == "TopicA"
    assert msg.body == b"hello"
    assert msg.tags == "tg"
    assert msg.keys == ["k1"]
    assert msg.msg_id == "ABC"
    assert msg.queue_id == 2
    assert msg.queue_offset == 17
    assert msg.commit_log_offset == 4096
    assert msg.born_timestamp == 1_700_000_000_000
    assert msg.store_timestamp == 1_700_000_000_005
    assert msg.born_host == "10.0.0.1:5555"
    assert msg.store_host == "127.0.0.1:10911"
    assert msg.store_size == len(raw)
    # Offset message id: store IP, port, commit-log offset.
    assert msg.offset_msg_id == "7F00000100002A9F0000000000001000"
    assert len(decode_messages(raw * 3)) == 3
    assert encode_stored_message(msg) == raw


def test_decode_compressed_and_ipv6_and_long_topic() -> None:
    msg = StoredMessage(
        topic="t" * 200,
        body=b"z" * 1000,
        properties={"TAGS": "a"},
        queue_id=0,
        queue_offset=1,
        commit_log_offset=2,
        store_timestamp=3,
        born_timestamp=4,
        born_host="[::1]:1",
        store_host="[fe80::2]:10911",
    )
    raw = encode_stored_message(msg, compress=True)
    assert len(raw) < 600
    [back] = decode_messages(raw)
    assert back.body == msg.body
    assert back.topic == msg.topic
    assert back.born_host == "[::1]:1"
    assert back.store_host == "[fe80::2]:10911"
    assert back.sys_flag & MessageSysFlag.BORNHOST_V6
    assert not back.sys_flag & MessageSysFlag.COMPRESSED
    assert len(back.offset_msg_id) == 56


def test_lz4_body_is_unsupported() -> None:
    msg = StoredMessage("t", b"x", {}, 0, 0, 0, 0, 0, "1.2.3.4:1", "1.2.3.4:2")
    raw = bytearray(encode_stored_message(msg))
    sys_flag_pos = 4 + 4 + 4 + 4 + 4 + 8 + 8
    raw[sys_flag_pos : sys_flag_pos + 4] = struct.pack(
        ">i", MessageSysFlag.COMPRESSED | MessageSysFlag.COMPRESSION_LZ4_TYPE
    )
    with pytest.raises(UnsupportedCompression):
        decode_messages(bytes(raw))


def test_decompression_bomb_is_bounded() -> None:
    msg = StoredMessage("t", b"\0" * 100_000, {}, 0, 0, 0, 0, 0, "1.2.3.4:1", "1.2.3.4:2")
    raw = encode_stored_message(msg, compress=True)
    with pytest.raises(RemotingProtocolError, match="beyond"):
        decode_messages(raw, max_body=1000)


def test_lmq_offsets() -> None:
    msg = StoredMessage(
        "t",
        b"",
        {"INNER_MULTI_DISPATCH": "%LMQ%a,%LMQ%b", "INNER_MULTI_QUEUE_OFFSET": "3,9"},
        0,
        0,
        0,
        0,
        0,
        "1.2.3.4:1",
        "1.2.3.4:2",
    )
    assert msg.lmq_offsets() == {"%LMQ%a": 3, "%LMQ%b": 9}


# --- malformed input --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "match"),
    [
        (struct.pack(">II", 4, 5), "header length"),
        (struct.pack(">II", 6, 2 << 24) + b"{}", "serialize type"),
        (struct.pack(">II", 6, 2) + b"[]", "not a JSON object"),
        (struct.pack(">II", 6, 2) + b"{}", "'code' is missing"),
        (struct.pack(">II", 5, 1) + b"{", "not valid JSON"),
        (struct.pack(">II", 14, 10) + b'{"code":"x"}'[:10], "not valid JSON"),
        (struct.pack(">II", 16, 12) + b'{"code":"1"}', "not an integer"),
        (struct.pack(">I", 2), "frame length"),
        (struct.pack(">I", 1 << 30), "frame length"),
    ],
)
def test_malformed_frames(frame: bytes, match: str) -> None:
    decoder = FrameDecoder()
    with pytest.raises(RemotingProtocolError, match=match):
        decoder.feed(frame)
    with pytest.raises(RemotingProtocolError):
        decoder.feed(b"")  # stays broken


def test_truncated_stored_message() -> None:
    raw = _java_stored_message()
    for cut in (1, 4, 30, len(raw) - 1):
        with pytest.raises(RemotingProtocolError):
            decode_messages(raw[:cut])
    bad_magic = bytearray(raw)
    bad_magic[4:8] = b"\0\0\0\0"
    with pytest.raises(RemotingProtocolError, match="magic"):
        decode_messages(bytes(bad_magic))


# --- property-based ---------------------------------------------------------------------------

_text = st.text(st.characters(codec="utf-8"), max_size=30)
_prop_text = st.text(
    st.characters(codec="utf-8", exclude_characters="\x01\x02"),
    min_size=1,
    max_size=20,
)
_int32 = st.integers(-(2**31), 2**31 - 1)
_int16 = st.integers(-(2**15), 2**15 - 1)


@st.composite
def commands(draw: st.DrawFn) -> RemotingCommand:
    kind = draw(st.sampled_from(SerializeType))
    binary = kind == SerializeType.ROCKETMQ
    return RemotingCommand(
        code=draw(_int16 if binary else _int32),
        opaque=draw(_int32),
        flag=draw(_int32),
        remark=draw(st.none() | (_text.filter(bool) if binary else _text)),
        ext_fields=draw(st.dictionaries(_text, _text, max_size=5)),
        body=draw(st.binary(max_size=100)),
        language=draw(st.sampled_from(["JAVA", "PYTHON", "OTHER", "GO"])),
        version=draw(_int16 if binary else _int32),
        serialize_type=kind,
    )


@given(st.lists(commands(), max_size=5), st.integers(1, 50))
def test_frames_round_trip(cmds: list[RemotingCommand], chunk: int) -> None:
    stream = b"".join(encode_command(c) for c in cmds)
    decoder = FrameDecoder()
    out: list[RemotingCommand] = []
    for i in range(0, len(stream), chunk):
        out.extend(decoder.feed(stream[i : i + chunk]))
    assert out == cmds
    assert decoder.buffered == 0


@given(st.dictionaries(_prop_text, _prop_text, max_size=10))
def test_properties_round_trip(props: dict[str, str]) -> None:
    assert decode_properties(encode_properties(props)) == props


_hosts = st.sampled_from(["127.0.0.1:10911", "10.1.2.3:1", "[::1]:80", "[2001:db8::7]:65535"])


@st.composite
def stored_messages(draw: st.DrawFn) -> StoredMessage:
    return StoredMessage(
        topic=draw(st.text(min_size=1, max_size=140).filter(lambda t: len(t.encode()) < 300)),
        body=draw(st.binary(max_size=200)),
        properties=draw(st.dictionaries(_prop_text, _prop_text, max_size=5)),
        queue_id=draw(_int32),
        queue_offset=draw(st.integers(0, 2**62)),
        commit_log_offset=draw(st.integers(0, 2**62)),
        store_timestamp=draw(st.integers(0, 2**45)),
        born_timestamp=draw(st.integers(0, 2**45)),
        born_host=draw(_hosts),
        store_host=draw(_hosts),
        flag=draw(_int32),
        reconsume_times=draw(st.integers(0, 100)),
    )


@given(st.lists(stored_messages(), max_size=4), st.booleans())
def test_stored_messages_round_trip(msgs: list[StoredMessage], compress: bool) -> None:
    raw = b"".join(encode_stored_message(m, compress=compress) for m in msgs)
    back = decode_messages(raw)
    assert len(back) == len(msgs)
    for sent, got in zip(msgs, back, strict=True):
        assert (got.topic, got.body, got.properties) == (sent.topic, sent.body, sent.properties)
        assert (got.queue_id, got.queue_offset, got.commit_log_offset) == (
            sent.queue_id,
            sent.queue_offset,
            sent.commit_log_offset,
        )
        assert (got.born_host, got.store_host) == (sent.born_host, sent.store_host)
        assert (got.born_timestamp, got.store_timestamp) == (
            sent.born_timestamp,
            sent.store_timestamp,
        )
        if not compress:
            assert got.body_crc == body_crc(sent.body)


@given(stored_messages(), st.binary(max_size=40), st.integers(0, 200))
def test_the_fast_path_of_the_message_decoder_reads_what_the_careful_one_reads(
    msg: StoredMessage, tail: bytes, cut: int
) -> None:
    """The one-call fast path (V1, IPv4, uncompressed) gives the same message as the field by
    field path, or declines and leaves it to that path; it never accepts bytes the careful path
    refuses, even cut short or followed by garbage."""
    raw = encode_stored_message(msg)
    for data in (raw, raw + tail, raw[: max(0, len(raw) - cut)], raw[:36] + tail):
        fast = _decode_plain(data, 0, len(data))
        try:
            careful: StoredMessage | None = _decode_careful(ByteReader(data, "t"), 1 << 20)
        except RemotingProtocolError:
            careful = None
        if fast is not None:
            assert fast == careful


# --- fuzz: arbitrary bytes decode or raise our own error ------------------------------------


def _valid_prefix() -> bytes:
    return encode_command(RemotingCommand(code=0, ext_fields={"a": "b"}, body=b"x"))


@settings(max_examples=300)
@given(st.binary(max_size=300), st.booleans())
def test_fuzz_frames(data: bytes, with_prefix: bool) -> None:
    if with_prefix:
        data = _valid_prefix() + data
    for chunks in ([data], [data[i : i + 1] for i in range(len(data))]):
        decoder = FrameDecoder(max_frame_size=1 << 20)
        try:
            for chunk in chunks:
                for cmd in decoder.feed(chunk):
                    assert isinstance(cmd, RemotingCommand)
        except RemotingProtocolError:
            pass


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_fuzz_frame_bodies(header: bytes) -> None:
    for kind in (0, 1):
        frame = struct.pack(">I", (kind << 24) | len(header)) + header
        with contextlib.suppress(RemotingProtocolError):
            decode_command(frame)


@settings(max_examples=300)
@given(st.binary(max_size=300), st.integers(0, 200), st.binary(max_size=8))
def test_fuzz_stored_messages(noise: bytes, at: int, patch: bytes) -> None:
    base = bytearray(_java_stored_message() + noise)
    at = min(at, len(base))
    base[at : at + len(patch)] = patch
    for data in (noise, bytes(base)):
        with contextlib.suppress(RemotingProtocolError):
            decode_messages(data)


# --- fastjson bodies --------------------------------------------------------------------------


def test_fastjson_integer_keys() -> None:
    # GET_BROKER_CLUSTER_INFO as the 5.3.3 NameServer writes it.
    body = (
        b'{"brokerAddrTable":{"broker-a":{"brokerAddrs":{0:"127.0.0.1:31911"},'
        b'"brokerName":"broker-a","cluster":"DefaultCluster","enableActingMaster":false}},'
        b'"clusterAddrTable":{"DefaultCluster":["broker-a"]}}'
    )
    data = loads_fastjson(body)
    assert data["brokerAddrTable"]["broker-a"]["brokerAddrs"] == {"0": "127.0.0.1:31911"}
    assert loads_fastjson(b'{"a":[1,2,{3:"x,4:"}]}') == {"a": [1, 2, {"3": "x,4:"}]}


@settings(max_examples=200)
@given(st.binary(max_size=200))
def test_fuzz_fastjson(data: bytes) -> None:
    with contextlib.suppress(RemotingProtocolError):
        loads_fastjson(data)


@given(
    st.integers(0, 2**31 - 1),
    st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40),
    st.integers(0, 15),
    st.dictionaries(
        st.text(
            st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"),
            min_size=1,
            max_size=10,
        ),
        st.text(
            st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"),
            min_size=1,
            max_size=30,
        ),
        max_size=5,
    ),
    st.integers(0, 2**45),
    st.binary(max_size=64),
)
def test_a_prebuilt_send_frame_is_the_frame_the_generic_encoder_makes(
    opaque: int, topic: str, queue_id: int, props: dict[str, str], born: int, body: bytes
) -> None:
    """`SendFrames` (the hot path's SEND_MESSAGE_V2) and `encode_command` of the same request in
    the binary header decode to the same command."""
    fast = SendFrames("mqtt-bridge").frame(
        opaque, topic, queue_id, encode_properties(props), born, body
    )
    generic = encode_command(
        RemotingCommand(
            code=RequestCode.SEND_MESSAGE_V2,
            opaque=opaque,
            ext_fields=send_message_v2_fields(
                producer_group="mqtt-bridge",
                topic=topic,
                queue_id=queue_id,
                properties=props,
                born_timestamp=born,
            ),
            body=body,
            serialize_type=SerializeType.ROCKETMQ,
        )
    )
    assert len(fast) == len(generic)
    assert decode_command(fast[4:]) == decode_command(generic[4:])


def test_a_prebuilt_send_frame_refuses_properties_too_long_for_the_stored_format() -> None:
    with pytest.raises(ValueError, match="properties exceed"):
        SendFrames("g").frame(1, "t", 0, "k\x01" + "v" * 40_000 + "\x02", 0, b"x")
