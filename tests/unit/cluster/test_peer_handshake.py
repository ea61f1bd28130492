"""The peer link's handshake as a pure state machine: byte literals, honest pairs, and every way
a stranger can try to get in (no secret, a wrong one, a replayed or reflected proof, big frames,
frames out of turn)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.cluster import wire
from bridge.cluster.credential import PEER_LINK, derive_key
from bridge.cluster.handshake import (
    HANDSHAKE_MAX_FRAME,
    Handshake,
    HandshakeError,
    HandshakeState,
    PeerAuthenticated,
    Role,
    proof_mac,
)
from bridge.cluster.wire import AddFilters, Hello, Proof, encode

SECRET = b"s" * 32
KEY = derive_key(SECRET, PEER_LINK)
OTHER_KEY = derive_key(b"o" * 32, PEER_LINK)
NONCE_A = bytes(range(32))
NONCE_B = bytes(range(32, 64))
NONCE_C = bytes(range(64, 96))


def dialer(keys: tuple[bytes, ...] = (KEY,), nonce: bytes = NONCE_A, **kw: str) -> Handshake:
    return Handshake(Role.DIALER, "node-a", "boot-a", keys, nonce, **kw)


def acceptor(keys: tuple[bytes, ...] = (KEY,), nonce: bytes = NONCE_B) -> Handshake:
    return Handshake(Role.ACCEPTOR, "node-b", "boot-b", keys, nonce)


def pump(a: Handshake, b: Handshake) -> tuple[list[object], list[object]]:
    """Carry bytes both ways until neither side has anything to send; admit whoever
    authenticates. The events each side saw."""
    seen_a: list[object] = []
    seen_b: list[object] = []
    moved = True
    while moved:
        moved = False
        for src, dst, seen in ((a, b, seen_b), (b, a, seen_a)):
            data = src.data_to_send()
            if data:
                moved = True
                dst.receive_data(data)
                event = dst.next_event()
                if event is not None:
                    seen.append(event)
                    dst.admit()
    return seen_a, seen_b


def test_hello_carries_the_version_ids_and_nonce_in_the_documented_layout() -> None:
    assert encode(Hello(2, "n1", "b", b"\xaa" * 4)) == (
        b"\x00\x00\x00\x1c"  # length of type + fields
        b"\x01"  # Hello
        b"\x00\x00\x00\x00\x00\x00\x00\x02"  # version
        b"\x00\x00\x00\x02n1"
        b"\x00\x00\x00\x01b"
        b"\x00\x00\x00\x04\xaa\xaa\xaa\xaa"  # nonce
    )


def test_proof_is_type_20_with_the_32_byte_mac() -> None:
    assert encode(Proof(b"\x01" * 32)) == b"\x00\x00\x00\x25\x14\x00\x00\x00\x20" + b"\x01" * 32


def test_the_mac_covers_role_both_hellos_and_is_pinned_by_a_known_vector() -> None:
    hello_a = Hello(2, "node-a", "boot-a", NONCE_A)
    hello_b = Hello(2, "node-b", "boot-b", NONCE_B)
    mac = proof_mac(KEY, Role.DIALER, hello_a, hello_b)
    # Pins the transcript: a change of its layout breaks links with nodes of this version.
    assert mac.hex() == "939685dff3c9f22921f043d48077b78316166df8e8a2fa1981db5c9cd638935c"
    assert mac != proof_mac(KEY, Role.ACCEPTOR, hello_a, hello_b)
    assert mac != proof_mac(KEY, Role.DIALER, hello_a, Hello(2, "node-b", "boot-b", NONCE_C))
    assert mac != proof_mac(KEY, Role.DIALER, hello_a, Hello(2, "node-b", "boot-X", NONCE_B))
    assert mac != proof_mac(KEY, Role.DIALER, Hello(2, "node-x", "boot-a", NONCE_A), hello_b)


def test_two_holders_of_the_secret_authenticate_each_other() -> None:
    a, b = dialer(), acceptor()
    seen_a, seen_b = pump(a, b)
    assert seen_a == [PeerAuthenticated("node-b", "boot-b")]
    assert seen_b == [PeerAuthenticated("node-a", "boot-a")]
    assert a.state is b.state is HandshakeState.DONE


def test_the_exchange_is_hello_hello_proof_proof_and_the_acceptor_proves_last() -> None:
    a, b = dialer(), acceptor()
    b_hello = b.data_to_send()
    assert b_hello == encode(Hello(wire.VERSION, "node-b", "boot-b", NONCE_B))
    a_hello = a.data_to_send()
    a.receive_data(b_hello)
    assert a.next_event() is None  # the dialer waits for the acceptor's proof
    a_proof = a.data_to_send()
    expected = proof_mac(KEY, Role.DIALER, Hello(wire.VERSION, "node-a", "boot-a", NONCE_A),
                         Hello(wire.VERSION, "node-b", "boot-b", NONCE_B))  # fmt: skip
    assert a_proof == encode(Proof(expected))
    b.receive_data(a_hello + a_proof)
    assert b.next_event() == PeerAuthenticated("node-a", "boot-a")
    assert b.data_to_send() == b""  # no proof from the acceptor until the node admits the peer
    b.admit()
    a.receive_data(b.data_to_send())
    assert a.next_event() == PeerAuthenticated("node-b", "boot-b")


def test_bytes_split_anywhere_give_the_same_handshake() -> None:
    reference_a, reference_b = dialer(), acceptor()
    pump(reference_a, reference_b)
    a, b = dialer(), acceptor()
    b_hello = b.data_to_send()
    for i in range(len(b_hello)):
        a.receive_data(b_hello[i : i + 1])
        assert a.next_event() is None
    data = a.data_to_send()
    events = []
    for i in range(len(data)):
        b.receive_data(data[i : i + 1])
        events.append(b.next_event())
    assert [e for e in events if e is not None] == [PeerAuthenticated("node-a", "boot-a")]


def test_frames_after_the_handshake_are_handed_to_the_link() -> None:
    a, b = dialer(), acceptor()
    b_hello = b.data_to_send()
    b.receive_data(a.data_to_send())
    a.receive_data(b_hello)
    a.next_event()
    b.receive_data(a.data_to_send())
    assert b.next_event() is not None
    b.admit()
    sync = encode(wire.SyncBegin()) + encode(AddFilters(("x/#",)))
    a.receive_data(b.data_to_send() + sync)
    assert a.next_event() is not None
    assert a.admit() == sync


def test_a_wrong_secret_is_refused_and_learns_no_proof() -> None:
    a, b = dialer(keys=(OTHER_KEY,)), acceptor()
    b_hello = b.data_to_send()
    a.receive_data(b_hello)
    a.next_event()
    b.receive_data(a.data_to_send())
    with pytest.raises(HandshakeError, match="wrong proof of the cluster secret"):
        b.next_event()
    assert b.state is HandshakeState.FAILED
    assert b.data_to_send() == b""  # only its Hello, taken above: never a Proof


def test_a_stranger_without_a_secret_cannot_skip_the_proof() -> None:
    b = acceptor()
    b.receive_data(encode(Hello(wire.VERSION, "node-a", "boot-a", NONCE_A)))
    assert b.next_event() is None
    b.receive_data(encode(AddFilters(("#",))))
    with pytest.raises(HandshakeError, match="expected Proof, got AddFilters"):
        b.next_event()


def test_any_frame_before_hello_is_refused() -> None:
    b = acceptor()
    b.receive_data(encode(wire.Release(1, "victim", 2**64 - 1)))
    with pytest.raises(HandshakeError, match="expected Hello, got Release"):
        b.next_event()


def test_a_big_frame_before_the_handshake_is_refused_from_its_length_alone() -> None:
    b = acceptor()
    b.receive_data((64 * 1024 * 1024).to_bytes(4, "big") + b"\x08")
    with pytest.raises(HandshakeError, match=f"at most {HANDSHAKE_MAX_FRAME}"):
        b.next_event()


def test_a_replayed_dialer_transcript_fails_against_a_fresh_nonce() -> None:
    a, b = dialer(), acceptor()
    b_hello = b.data_to_send()
    captured = a.data_to_send()
    a.receive_data(b_hello)
    a.next_event()
    captured += a.data_to_send()
    b.receive_data(captured)
    assert b.next_event() is not None  # the honest original
    replayed_to = acceptor(nonce=NONCE_C)
    replayed_to.receive_data(captured)
    with pytest.raises(HandshakeError, match="wrong proof"):
        replayed_to.next_event()


def test_a_proof_reflected_back_to_its_maker_fails() -> None:
    """A stranger posing as the acceptor to an honest dialer echoes the dialer's own proof."""
    a = dialer()
    a.data_to_send()
    a.receive_data(encode(Hello(wire.VERSION, "node-b", "boot-b", NONCE_B)))
    a.next_event()
    own_proof = a.data_to_send()
    a.receive_data(own_proof)
    with pytest.raises(HandshakeError, match="wrong proof"):
        a.next_event()


def test_an_echoed_hello_is_refused() -> None:
    a = dialer()
    a.receive_data(encode(Hello(wire.VERSION, "node-b", "boot-b", NONCE_A)))
    with pytest.raises(HandshakeError, match="bad nonce"):
        a.next_event()


def test_a_node_of_the_previous_version_is_told_which_versions_meet() -> None:
    b = acceptor()
    old_hello = b"\x00\x00\x00\x14\x01" + (1).to_bytes(8, "big") + b"\x00\x00\x00\x02n1"
    b.receive_data(old_hello + b"\x00\x00\x00\x01b")
    with pytest.raises(HandshakeError, match=f"peer protocol version 1, this node {wire.VERSION}"):
        b.next_event()


def test_the_dialer_refuses_an_answer_from_another_node_than_it_dialed() -> None:
    a = dialer(expected_peer="node-c")
    a.receive_data(encode(Hello(wire.VERSION, "node-b", "boot-b", NONCE_B)))
    with pytest.raises(HandshakeError, match="dialed node-c but node-b answered"):
        a.next_event()


def test_a_hello_claiming_this_nodes_own_id_is_refused() -> None:
    b = acceptor()
    b.receive_data(encode(Hello(wire.VERSION, "node-b", "boot-x", NONCE_A)))
    with pytest.raises(HandshakeError, match="this node itself"):
        b.next_event()


@pytest.mark.parametrize(
    ("dialer_keys", "acceptor_keys"),
    [
        ((KEY,), (KEY, OTHER_KEY)),  # step 1: the new secret added second on the acceptor
        ((OTHER_KEY, KEY), (KEY, OTHER_KEY)),  # step 2: moved first on the dialer only
        ((OTHER_KEY, KEY), (OTHER_KEY,)),  # step 3: the old one removed on the acceptor
    ],
)
def test_a_rotation_step_keeps_old_and_new_nodes_linked(
    dialer_keys: tuple[bytes, ...], acceptor_keys: tuple[bytes, ...]
) -> None:
    seen_a, seen_b = pump(dialer(keys=dialer_keys), acceptor(keys=acceptor_keys))
    assert len(seen_a) == len(seen_b) == 1


def test_without_a_secret_the_hellos_alone_end_the_handshake() -> None:
    """Peer TLS alone: the certificates authenticated both ends before the first byte."""
    a, b = dialer(keys=()), acceptor(keys=())
    seen_a, seen_b = pump(a, b)
    assert seen_a == [PeerAuthenticated("node-b", "boot-b")]
    assert seen_b == [PeerAuthenticated("node-a", "boot-a")]


def test_admit_before_authentication_is_a_bug_not_a_way_in() -> None:
    with pytest.raises(RuntimeError):
        acceptor().admit()


@given(st.binary(max_size=300))
def test_arbitrary_bytes_wait_or_raise_the_handshake_error(data: bytes) -> None:
    for step in (1, len(data) or 1):
        b = acceptor()
        try:
            for i in range(0, len(data), step):
                b.receive_data(data[i : i + step])
                assert b.next_event() is None
        except HandshakeError:
            assert b.state is HandshakeState.FAILED
