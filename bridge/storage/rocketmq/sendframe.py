"""SEND_MESSAGE_V2 frames built straight to bytes, for the store's hot path. Pure, no I/O.

`encode_command` builds any frame from a `RemotingCommand` and a dict of header fields, in a
loop over the fields. A send differs from the one before it only in its opaque, topic, queue,
birth time, properties and body, so `SendFrames` keeps the binary ("ROCKETMQ") header's fixed
parts as bytes (per topic: producer group, topic, default topic, queue count; for all: the
constant fields) and joins them with the varying ones. The result is the frame `encode_command`
makes of the same request with `SerializeType.ROCKETMQ` (the fields in another order, which the
broker does not care about); `tests/unit/storage/test_rocketmq_wire.py` decodes both and compares.

With a `RequestSigner` (a cluster with authentication on) each frame also carries AccessKey
(SecurityToken) and Signature. The signature is over the header values in key order, and the
send header's one-letter keys sort after the signer's own, so the values are fed to the
signer's pre-keyed HMAC straight from the pieces the frame is built of (per topic, the joined
values of a-d are kept too); no dict is built and nothing is sorted per send.
"""

from __future__ import annotations

import struct
from typing import Final

from bridge.storage.rocketmq.acl import SIGNATURE, RequestSigner
from bridge.storage.rocketmq.messages import MAX_PROPERTIES_BYTES, SendHeaderField
from bridge.storage.rocketmq.wire import CURRENT_VERSION, LanguageCode, RequestCode, SerializeType

__all__ = ["SendFrames"]

_FIXED: Final = struct.Struct(">hBhii")  # code, language, version, opaque, flag
_U32: Final = struct.Struct(">I")
_TOPIC_CACHE_LIMIT: Final = 4096
_ZERO: Final = b"0"
_ZERO_FALSE_FALSE: Final = b"0falsefalse"  # the values of j, k, m (see _constant)


def _field(name: str, value: str) -> bytes:
    key = name.encode()
    data = value.encode()
    return struct.pack(">H", len(key)) + key + _U32.pack(len(data)) + data


class SendFrames:
    """Builds the SEND_MESSAGE_V2 frames of one producer group (see the module docstring)."""

    __slots__ = (
        "_constant",
        "_credential_fields",
        "_signed_values",
        "_topics",
        "default_topic",
        "default_topic_queue_nums",
        "group",
        "signer",
    )

    def __init__(
        self,
        producer_group: str,
        *,
        default_topic: str = "TBW102",
        default_topic_queue_nums: int = 4,
        signer: RequestSigner | None = None,
    ) -> None:
        self.group = producer_group
        self.signer = signer
        self._credential_fields = (
            b"".join(_field(k, v) for k, v in signer.prefix_fields.items()) if signer else b""
        )
        self._signed_values: dict[str, bytes] = {}
        """Per topic: the values of fields a-d joined, what the signature covers of them."""
        self.default_topic = default_topic
        self.default_topic_queue_nums = default_topic_queue_nums
        f = SendHeaderField
        self._constant = b"".join(
            (
                _field(f.SYS_FLAG, "0"),
                _field(f.FLAG, "0"),
                _field(f.RECONSUME_TIMES, "0"),
                _field(f.UNIT_MODE, "false"),
                _field(f.BATCH, "false"),
            )
        )
        self._topics: dict[str, bytes] = {}

    def _topic_fields(self, topic: str) -> bytes:
        fields = self._topics.get(topic)
        if fields is None:
            f = SendHeaderField
            fields = b"".join(
                (
                    _field(f.PRODUCER_GROUP, self.group),
                    _field(f.TOPIC, topic),
                    _field(f.DEFAULT_TOPIC, self.default_topic),
                    _field(f.DEFAULT_TOPIC_QUEUE_NUMS, str(self.default_topic_queue_nums)),
                )
            )
            if len(self._topics) >= _TOPIC_CACHE_LIMIT:
                self._topics.clear()
                self._signed_values.clear()
            self._topics[topic] = fields
            self._signed_values[topic] = "".join(
                (self.group, topic, self.default_topic, str(self.default_topic_queue_nums))
            ).encode()
        return fields

    def _signature_field(
        self,
        signer: RequestSigner,
        topic: str,
        queue: bytes,
        born: bytes,
        props: bytes,
        body: bytes,
    ) -> bytes:
        """The Signature field of a send: the values in key order a..m (see _constant)."""
        signature = signer.signature_after_prefix(
            (
                self._signed_values[topic],  # a b c d
                queue,  # e
                _ZERO,  # f
                born,  # g
                _ZERO,  # h
                props,  # i
                _ZERO_FALSE_FALSE,  # j k m
            ),
            body,
        )
        return self._credential_fields + _field(SIGNATURE, signature)

    def frame(
        self,
        opaque: int,
        topic: str,
        queue_id: int,
        properties: str,
        born_timestamp: int,
        body: bytes,
    ) -> bytes:
        """The whole frame (length prefix included) of one send; `properties` is the encoded
        property string (`encode_properties`). ValueError if the properties are too long for
        the stored format."""
        props = properties.encode()
        if len(props) > MAX_PROPERTIES_BYTES:
            raise ValueError(f"properties exceed {MAX_PROPERTIES_BYTES} bytes")
        queue = str(queue_id).encode()
        born = str(born_timestamp).encode()
        topic_fields = self._topic_fields(topic)
        signer = self.signer
        ext = b"".join(
            (
                topic_fields,
                b"\x00\x01e",
                _U32.pack(len(queue)),
                queue,
                b"\x00\x01g",
                _U32.pack(len(born)),
                born,
                b"\x00\x01i",
                _U32.pack(len(props)),
                props,
                self._constant,
                b""
                if signer is None
                else self._signature_field(signer, topic, queue, born, props, body),
            )
        )
        header_len = _FIXED.size + 8 + len(ext)
        return b"".join(
            (
                _U32.pack(4 + header_len + len(body)),
                _U32.pack((int(SerializeType.ROCKETMQ) << 24) | header_len),
                _FIXED.pack(
                    RequestCode.SEND_MESSAGE_V2, LanguageCode.PYTHON, CURRENT_VERSION, opaque, 0
                ),
                b"\x00\x00\x00\x00",  # no remark
                _U32.pack(len(ext)),
                ext,
                body,
            )
        )
