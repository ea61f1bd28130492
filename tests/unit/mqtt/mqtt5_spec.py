"""MQTT 5.0 facts for the codec tests, transcribed from the specification independently of
bridge.mqtt, and hypothesis strategies of valid MQTT 5.0 property blocks built on them.

`SPEC_PROPERTIES` lists, packet by packet, the properties each section 3.x allows (the codec
keeps table 2-4 the other way round, property by property), so a slip in either transcription
shows up as a failing test. `SPEC_REASON_CODES` lists the reason codes each packet defines.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

MAX_VARINT = 268_435_455

WILL = "WILL"
"""The will properties in CONNECT's payload (section 3.1.3.2)."""

SPEC_PROPERTIES: dict[str, frozenset[int]] = {
    # 3.1.2.11: Session Expiry, Receive Maximum, Maximum Packet Size, Topic Alias Maximum,
    # Request Response Information, Request Problem Information, User Property,
    # Authentication Method, Authentication Data.
    "CONNECT": frozenset({0x11, 0x21, 0x27, 0x22, 0x19, 0x17, 0x26, 0x15, 0x16}),
    # 3.1.3.2: Will Delay Interval, Payload Format Indicator, Message Expiry Interval,
    # Content Type, Response Topic, Correlation Data, User Property.
    WILL: frozenset({0x18, 0x01, 0x02, 0x03, 0x08, 0x09, 0x26}),
    # 3.2.2.3: Session Expiry, Receive Maximum, Maximum QoS, Retain Available, Maximum Packet
    # Size, Assigned Client Identifier, Topic Alias Maximum, Reason String, User Property,
    # Wildcard / Subscription Identifier / Shared Subscription Available, Server Keep Alive,
    # Response Information, Server Reference, Authentication Method, Authentication Data.
    "CONNACK": frozenset(
        {0x11, 0x21, 0x24, 0x25, 0x27, 0x12, 0x22, 0x1F, 0x26, 0x28, 0x29, 0x2A, 0x13, 0x1A}
        | {0x1C, 0x15, 0x16}
    ),
    # 3.3.2.3: Payload Format Indicator, Message Expiry Interval, Topic Alias, Response Topic,
    # Correlation Data, User Property, Subscription Identifier, Content Type.
    "PUBLISH": frozenset({0x01, 0x02, 0x23, 0x08, 0x09, 0x26, 0x0B, 0x03}),
    # 3.4.2.2 / 3.5.2.2 / 3.6.2.2 / 3.7.2.2: Reason String, User Property.
    "PUBACK": frozenset({0x1F, 0x26}),
    "PUBREC": frozenset({0x1F, 0x26}),
    "PUBREL": frozenset({0x1F, 0x26}),
    "PUBCOMP": frozenset({0x1F, 0x26}),
    # 3.8.2.1: Subscription Identifier, User Property.
    "SUBSCRIBE": frozenset({0x0B, 0x26}),
    # 3.9.2.1: Reason String, User Property.
    "SUBACK": frozenset({0x1F, 0x26}),
    # 3.10.2.1: User Property.
    "UNSUBSCRIBE": frozenset({0x26}),
    # 3.11.2.1: Reason String, User Property.
    "UNSUBACK": frozenset({0x1F, 0x26}),
    # 3.14.2.2: Session Expiry Interval, Reason String, User Property, Server Reference.
    "DISCONNECT": frozenset({0x11, 0x1F, 0x26, 0x1C}),
    # 3.15.2.2: Authentication Method, Authentication Data, Reason String, User Property.
    "AUTH": frozenset({0x15, 0x16, 0x1F, 0x26}),
}

ALL_PROPERTY_IDS = frozenset(
    {0x01, 0x02, 0x03, 0x08, 0x09, 0x0B, 0x11, 0x12, 0x13, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1A}
    | {0x1C, 0x1F, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28, 0x29, 0x2A}
)

SPEC_REASON_CODES: dict[str, frozenset[int]] = {
    "CONNACK": frozenset(
        {0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C, 0x90}
        | {0x95, 0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F}
    ),
    "PUBACK": frozenset({0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99}),
    "PUBREC": frozenset({0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99}),
    "PUBREL": frozenset({0x00, 0x92}),
    "PUBCOMP": frozenset({0x00, 0x92}),
    "DISCONNECT": frozenset(
        {0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90, 0x93}
        | {0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F, 0xA0, 0xA1}
        | {0xA2}
    ),
    "AUTH": frozenset({0x00, 0x18, 0x19}),
}

# --- strategies of valid values --------------------------------------------------------------

text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFF_FFFF)
flag = st.integers(0, 1)

VALID_VALUES: dict[int, st.SearchStrategy[Any]] = {
    0x01: flag,
    0x02: u32,
    0x03: text,
    0x08: text,
    0x09: st.binary(max_size=8),
    0x0B: st.lists(st.integers(1, MAX_VARINT), min_size=1, max_size=2),
    0x11: u32,
    0x12: text,
    0x13: u16,
    0x15: text,
    0x16: st.binary(max_size=8),
    0x17: flag,
    0x18: u32,
    0x19: flag,
    0x1A: text,
    0x1C: text,
    0x1F: text,
    0x21: st.integers(1, 0xFFFF),
    0x22: u16,
    0x23: st.integers(1, 0xFFFF),
    0x24: flag,
    0x25: flag,
    0x26: st.lists(st.tuples(text, text), min_size=1, max_size=2),
    0x27: st.integers(1, 0xFFFF_FFFF),
    0x28: flag,
    0x29: flag,
    0x2A: flag,
}
"""A strategy of values the specification allows, per property identifier."""

SAMPLE_VALUES: dict[int, Any] = {
    0x01: 1,
    0x02: 60,
    0x03: "text/plain",
    0x08: "reply/here",
    0x09: b"\x01\x02",
    0x0B: [7],
    0x11: 3600,
    0x12: "assigned",
    0x13: 30,
    0x15: "SCRAM-SHA-1",
    0x16: b"data",
    0x17: 0,
    0x18: 5,
    0x19: 1,
    0x1A: "resp",
    0x1C: "other.example",
    0x1F: "because",
    0x21: 10,
    0x22: 5,
    0x23: 3,
    0x24: 1,
    0x25: 0,
    0x26: [("k", "v")],
    0x27: 1024,
    0x28: 1,
    0x29: 1,
    0x2A: 0,
}
"""One valid value per property identifier, for byte-level tests."""


@st.composite
def properties_for(draw: st.DrawFn, scope: str) -> dict[int, Any]:
    """Random valid properties for `scope` (a packet name or WILL), honouring the rules that
    tie properties together: one Subscription Identifier in SUBSCRIBE, Authentication Data only
    with an Authentication Method, and an Authentication Method in every long-form AUTH."""
    allowed = sorted(SPEC_PROPERTIES[scope])
    props: dict[int, Any] = draw(
        st.fixed_dictionaries({}, optional={pid: VALID_VALUES[pid] for pid in allowed})
    )
    if scope == "SUBSCRIBE" and 0x0B in props:
        props[0x0B] = props[0x0B][:1]
    if (scope == "AUTH" or 0x16 in props) and 0x15 not in props:
        props[0x15] = draw(text)
    return props


# --- property bytes, written without the codec -----------------------------------------------

_BYTE = frozenset({0x01, 0x17, 0x19, 0x24, 0x25, 0x28, 0x29, 0x2A})
_TWO_BYTE = frozenset({0x13, 0x21, 0x22, 0x23})
_FOUR_BYTE = frozenset({0x02, 0x11, 0x18, 0x27})
_BINARY = frozenset({0x09, 0x16})
_STRING = frozenset({0x03, 0x08, 0x12, 0x15, 0x1A, 0x1C, 0x1F})


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        value, digit = divmod(value, 128)
        out.append(digit | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _string(data: str | bytes) -> bytes:
    raw = data.encode() if isinstance(data, str) else data
    return len(raw).to_bytes(2, "big") + raw


def property_bytes(identifier: int, value: Any) -> bytes:
    """One property (identifier and value; each element of a list value for the repeatable
    ones) as section 2.2.2.2 lays it out."""
    if isinstance(value, list):
        return b"".join(property_bytes(identifier, item) for item in value)
    head = bytes((identifier,))
    if identifier in _BYTE:
        return head + bytes((value,))
    if identifier in _TWO_BYTE:
        return head + value.to_bytes(2, "big")
    if identifier in _FOUR_BYTE:
        return head + value.to_bytes(4, "big")
    if identifier == 0x0B:
        return head + _varint(value)
    if identifier in _STRING or identifier in _BINARY:
        return head + _string(value)
    name, text = value
    return head + _string(name) + _string(text)


def block(*properties: bytes) -> bytes:
    """A property block: its length, then the properties given (from `property_bytes`)."""
    content = b"".join(properties)
    return _varint(len(content)) + content
