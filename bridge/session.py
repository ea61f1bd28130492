"""Per-client session state: subscriptions, read positions, messages in flight, QoS 2 handshakes.

Pure bookkeeping, no I/O. The node persists what `snapshot()` returns and rebuilds a session with
`Session.restore()`.

The packet ids of messages sent to the client are derived from the message's store-wide `seq`
(`packet_id_for`). That makes them the same after a crash without writing anything before a send:
a QoS 2 PUBLISH resent after a restart carries the id the client already knows, so the client
treats it as a duplicate. Only the move to the PUBREL phase is written durably (the client may
forget the id once it has PUBCOMPed, so we must never send that PUBLISH again); see
docs/design.md.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Any, TypeVar

from bridge.fields import Fields
from bridge.router.queues import client_queue, filter_queue

PACKET_ID_SPACE = 65535

COMPLETED_ABOVE_LIMIT = 1024
"""How many QoS 2 messages completed above an unacknowledged one a session remembers
(`Session._completed_above`). Only a client that leaves one message unacknowledged while it
completes a thousand later ones reaches it; past it the oldest is forgotten (a restore may then
send that one again), so what such a client makes the server keep and write stays bounded."""


def packet_id_for(seq: int) -> int:
    """The outbound packet id of the message at store position `seq` (1..65535)."""
    return seq % PACKET_ID_SPACE + 1


class Phase(Enum):
    """Where an outbound QoS>0 message stands."""

    AWAITING_ACK = 1
    """PUBLISH sent; waiting for PUBACK (QoS 1) or PUBREC (QoS 2)."""
    AWAITING_PUBCOMP = 2
    """PUBREL sent (QoS 2); waiting for PUBCOMP."""


class InFlight(Fields):
    """A message sent to the client and not yet fully acknowledged: one per QoS 1/2 message
    sent, so a plain class rather than a dataclass (`bridge.fields`).

    Fields beyond the PUBLISH's own:
    - `message`: the stored message (`bridge.storage.base.Message`), so a resend keeps its
      properties.
    - `sub_ids`: the Subscription Identifiers it was sent with.
    """

    FIELDS = (
        "packet_id",
        "queue",
        "offset",
        "seq",
        "qos",
        "topic",
        "payload",
        "retain",
        "phase",
        "message",
        "sub_ids",
    )
    __slots__ = FIELDS

    def __init__(
        self,
        packet_id: int,
        queue: str,
        offset: int,
        seq: int,
        qos: int,
        topic: str,
        payload: bytes,
        retain: bool,
        phase: Phase = Phase.AWAITING_ACK,
        message: Any = None,
        sub_ids: tuple[int, ...] = (),
    ) -> None:
        self.packet_id = packet_id
        self.queue = queue
        self.offset = offset
        self.seq = seq
        self.qos = qos
        self.topic = topic
        self.payload = payload
        self.retain = retain
        self.phase = phase
        self.message = message
        self.sub_ids = sub_ids


@dataclass(slots=True, frozen=True)
class SubOptions:
    """The MQTT 5.0 options of one subscription beyond its QoS (3.1.1 subscriptions have none)."""

    no_local: bool = False
    """Not sent messages this client published itself (MQTT-3.8.3-3)."""
    retain_as_published: bool = False
    """Forwarded messages keep the RETAIN flag they were published with."""
    identifier: int = 0
    """The Subscription Identifier sent with every message it matches (0: none)."""


_EMPTY: Mapping[Any, Any] = MappingProxyType({})
"""What a table that was never written reads as (see `Session`)."""

K = TypeVar("K")
V = TypeVar("V")


def _put(table: dict[K, V] | None, key: K, value: V) -> dict[K, V]:
    """`table` (made if it was never written) with `key` set to `value`."""
    if table is None:
        table = {}
    table[key] = value
    return table


def _without(table: dict[K, V] | None, key: K) -> dict[K, V] | None:
    """`table` without `key`; None once nothing is left in it (it costs no memory then)."""
    if table is not None:
        table.pop(key, None)
        if not table:
            return None
    return table


class Session:
    """The state the broker keeps for one ClientId, connected or not.

    A node holds tens of thousands of idle sessions, and an empty dict is 64 bytes of each: the
    tables an idle session does not use (subscriptions, messages in flight, shared
    subscriptions, v5 options, inbound QoS 2, resend marks) exist only once written. They read
    as read-only mappings and are written through the methods beside them.
    """

    __slots__ = (
        "_completed_above", "_inbound_qos2", "_inflight", "_options", "_qos2_sent",
        "_resend_below", "_shared",
        "_subscriptions", "client_id", "connected", "cursors", "disconnected_at",
        "dropped_queue_full", "dropped_retention", "expiry", "offline_mono", "owner", "persistent",
        "read_verdicts", "reads_judged", "released",
    )  # fmt: skip

    def __init__(
        self,
        client_id: str,
        persistent: bool,
        subscriptions: dict[str, int] | None = None,
        shared: dict[str, int] | None = None,
        options: dict[str, SubOptions] | None = None,
        expiry: float | None = None,
        connected: bool = False,
        disconnected_at: float = 0.0,
        owner: str | None = None,
    ) -> None:
        self.client_id = client_id
        self.persistent = persistent
        self.owner = owner
        """The identity the session is bound to (`bridge.access.ownership`); None: unbound."""
        self.reads_judged = -1
        """The ACL rules' generation under which `read_verdicts` was worked out
        (`bridge.access.reads`); -1: not yet, or its filters or user name changed since."""
        self.read_verdicts: dict[str, bool] | None = None
        """None when every topic of its filters may be read (deliveries need no check), else
        the topics asked so far -> whether the client may read them."""
        self._subscriptions = subscriptions or None
        self._shared = shared or None
        self._options = options or None
        self.expiry = expiry
        """Seconds the session outlives its connection (MQTT 5.0 Session Expiry Interval); None
        for a 3.1.1 persistent session, which lives the node's `session_expiry_seconds`."""
        self.cursors: dict[str, int] = {}
        """Queue -> next offset to read."""
        self._resend_below: dict[str, int] | None = None
        self._inflight: dict[int, InFlight] | None = None
        self.released: set[int] | None = None
        """Seqs of QoS 2 messages whose PUBREC arrived (PUBREL phase), durable when persistent;
        None until the first (an empty set is 216 bytes, and most sessions never see QoS 2)."""
        self._completed_above: dict[int, tuple[str, int]] | None = None
        """Seq -> (queue, offset) of QoS 2 messages PUBCOMPed while an older message of their
        queue was still unacknowledged (a QoS 1 message sent before, a resend): the committed
        offset a restore resumes at lies below them, and the client, which forgot their packet
        ids at PUBCOMP, would take their PUBLISH again as new. Written with the PUBREL-phase
        set (`encode_offsets`) until the committed offset passes them. Persistent sessions
        only."""
        self._inbound_qos2: dict[int, Any] | None = None
        self._qos2_sent: dict[str, int] | None = None
        """Key -> seq of the last QoS 2 messages sent to the client, oldest first."""
        self.connected = connected
        self.disconnected_at = disconnected_at
        """Unix time the session went offline: kept in its records (a restart, another node)
        and shown by the admin API."""
        self.offline_mono = 0.0
        """The monotonic clock's reading when this process saw the session go offline (or
        took it over offline): its age is measured from here (`went_offline`); 0: unknown."""
        self.dropped_queue_full = 0
        self.dropped_retention = 0

    # -- the tables written only when used ----------------------------------------------------

    @property
    def subscriptions(self) -> Mapping[str, int]:
        """Non-shared topic filter -> granted QoS."""
        return self._subscriptions or _EMPTY

    def set_subscription(self, topic_filter: str, qos: int) -> None:
        self._subscriptions = _put(self._subscriptions, topic_filter, qos)
        self.reads_judged = -1  # the new filter may hold topics the client may not read

    def drop_subscription(self, topic_filter: str) -> None:
        self._subscriptions = _without(self._subscriptions, topic_filter)

    @property
    def inflight(self) -> Mapping[int, InFlight]:
        """Packet id -> message in flight, in send order (written by `track`, the acknowledgements
        and `drop_inflight`)."""
        return self._inflight or _EMPTY

    @property
    def shared(self) -> Mapping[str, int]:
        """`$share/{group}/{filter}` -> granted QoS."""
        return self._shared or _EMPTY

    def add_shared(self, share_filter: str, qos: int) -> None:
        self._shared = _put(self._shared, share_filter, qos)
        self.reads_judged = -1

    def drop_shared(self, share_filter: str) -> None:
        self._shared = _without(self._shared, share_filter)

    @property
    def options(self) -> Mapping[str, SubOptions]:
        """Filter (plain or shared) -> its MQTT 5.0 options, only for filters that have any."""
        return self._options or _EMPTY

    def set_options(self, topic_filter: str, options: SubOptions) -> None:
        self._options = _put(self._options, topic_filter, options)

    def drop_options(self, topic_filter: str) -> None:
        self._options = _without(self._options, topic_filter)

    @property
    def resend_below(self) -> Mapping[str, int]:
        """Queue -> offset below which messages may have been sent before (DUP=1 on resend)."""
        return self._resend_below or _EMPTY

    @resend_below.setter
    def resend_below(self, marks: dict[str, int]) -> None:
        self._resend_below = marks or None

    def set_resend_below(self, queue: str, offset: int) -> None:
        self._resend_below = _put(self._resend_below, queue, offset)

    def pop_resend_below(self, queue: str) -> int | None:
        return None if self._resend_below is None else self._resend_below.pop(queue, None)

    @property
    def inbound_qos2(self) -> Mapping[int, Any]:
        """Inbound QoS 2 packet ids received and not yet released by PUBREL (`bridge.state`)."""
        return self._inbound_qos2 or _EMPTY

    def hold_qos2_in(self, packet_id: int, state: Any) -> None:
        self._inbound_qos2 = _put(self._inbound_qos2, packet_id, state)

    def drop_qos2_in(self, packet_id: int) -> None:
        if self._inbound_qos2 is not None:
            self._inbound_qos2.pop(packet_id, None)

    # -- queues and offsets -------------------------------------------------------------------

    def queues(self) -> Iterator[str]:
        """Every queue this session reads: its private queue, then one per filter."""
        yield client_queue(self.client_id)
        for topic_filter in self.subscriptions:
            yield filter_queue(topic_filter)

    def committed(self, queue: str) -> int:
        """The lowest offset of `queue` not yet acknowledged: where a restart resumes."""
        lowest = self.cursors.get(queue, 0)
        inflight = self._inflight
        if inflight is not None:
            for out in inflight.values():
                if out.queue == queue and out.offset < lowest:
                    lowest = out.offset
        return lowest

    def start_queue(self, queue: str, end_offset: int) -> None:
        """Begin reading `queue` at `end_offset` (new messages only) unless already reading it."""
        self.cursors.setdefault(queue, end_offset)

    def forget_queue(self, queue: str) -> None:
        """Stop reading `queue` (after UNSUBSCRIBE); messages in flight stay until acknowledged."""
        self.cursors.pop(queue, None)
        self.pop_resend_below(queue)

    # -- outbound QoS -------------------------------------------------------------------------

    def window_free(self, max_inflight: int) -> int:
        """How many more QoS>0 messages may be sent now."""
        inflight = self._inflight
        return max_inflight if inflight is None else max_inflight - len(inflight)

    def in_flight(self, packet_id: int) -> bool:
        """Whether a message with this packet id awaits its acknowledgement."""
        inflight = self._inflight
        return inflight is not None and packet_id in inflight

    def track(self, out: InFlight) -> None:
        """Record a QoS>0 message as sent. (The table, once made, stays: a busy subscriber's
        window empties and fills again many times a second.)"""
        inflight = self._inflight
        if inflight is None:
            inflight = self._inflight = {}
        inflight[out.packet_id] = out

    def drop_inflight(self, packet_id: int) -> InFlight | None:
        """Forget the message in flight under `packet_id` (refused or no longer wanted)."""
        inflight = self._inflight
        return None if inflight is None else inflight.pop(packet_id, None)

    def _sent(self, packet_id: int) -> InFlight | None:
        """The message in flight under `packet_id`, if any."""
        inflight = self._inflight
        return None if inflight is None else inflight.get(packet_id)

    def on_puback(self, packet_id: int) -> InFlight | None:
        """PUBACK: the QoS 1 message is done. None if the id is unknown or not QoS 1."""
        out = self._sent(packet_id)
        if out is None or out.qos != 1:
            return None
        self.drop_inflight(packet_id)
        return out

    def on_pubrec(self, packet_id: int) -> InFlight | None:
        """PUBREC: the QoS 2 message moves to the PUBREL phase (a repeated PUBREC is harmless)."""
        out = self._sent(packet_id)
        if out is None or out.qos != 2:
            return None
        out.phase = Phase.AWAITING_PUBCOMP
        if self.released is None:
            self.released = set()
        self.released.add(out.seq)
        return out

    def on_pubcomp(self, packet_id: int) -> InFlight | None:
        """PUBCOMP: the QoS 2 message is done."""
        out = self._sent(packet_id)
        if out is None or out.phase is not Phase.AWAITING_PUBCOMP:
            return None
        self.drop_inflight(packet_id)
        if self.released is not None:
            self.released.discard(out.seq)
        if self.persistent and out.offset > self.committed(out.queue):
            done = self._completed_above = _put(
                self._completed_above, out.seq, (out.queue, out.offset)
            )
            if len(done) > COMPLETED_ABOVE_LIMIT:
                del done[next(iter(done))]
        return out

    def was_released(self, seq: int) -> bool:
        """Whether the QoS 2 message at `seq` is in its PUBREL phase (its PUBREC arrived)."""
        return self.released is not None and seq in self.released

    def _pubrel_phase(self) -> list[int]:
        """The seqs a restore must not send as PUBLISH again: those in their PUBREL phase and
        those completed above their queue's committed offset (the latter dropped here once
        the committed offset passed them or their queue is no longer read). A restore puts
        both in `released`, so each gets a PUBREL, which the client answers with PUBCOMP
        whether or not it still knows the id (MQTT-4.3.3)."""
        seqs = set(self.released or ())
        done = self._completed_above
        if done:
            committed: dict[str, int] = {}
            for seq, (queue, offset) in list(done.items()):
                if queue not in self.cursors:
                    del done[seq]
                    continue
                low = committed.get(queue)
                if low is None:
                    low = committed[queue] = self.committed(queue)
                if offset < low:
                    del done[seq]
                else:
                    seqs.add(seq)
            if not done:
                self._completed_above = None
        return sorted(seqs)

    def first_copy(self, key: str, seq: int, window: int) -> bool:
        """Whether the QoS 2 message `key` stored at `seq` may be sent: False for a second
        stored copy of a message this client was sent already. A store that cannot say whether
        a failed send stored a message gets the publisher's resend stored again under the same
        key (`bridge.node.qos2_in`), and a reader may have had the first copy. The last
        `window` keys sent are remembered (0: none, every copy is sent)."""
        if window <= 0:
            return True
        sent = self._qos2_sent
        if sent is None:
            sent = self._qos2_sent = {}
        earlier = sent.get(key)
        if earlier is not None:
            return earlier == seq  # the same copy again (a resend of it) goes out
        sent[key] = seq
        if len(sent) > window:
            del sent[next(iter(sent))]
        return True

    def qos2_copies_sent(self) -> list[tuple[str, int]]:
        """What `first_copy` remembers, oldest first: (key, seq) of the last QoS 2 messages
        sent. It goes with the session to a node that takes it over: a second stored copy of a
        message can be read there after the first was sent here (both landed late, after a
        partition healed), and only this memory keeps it from going out twice."""
        return list(self._qos2_sent.items()) if self._qos2_sent else []

    def remember_qos2_copies(self, sent: Iterable[tuple[str, int]], window: int) -> None:
        """Take over what another node's `qos2_copies_sent` said, as the oldest entries."""
        if window <= 0:
            return
        merged = dict(sent)
        merged.update(self._qos2_sent or {})
        while len(merged) > window:
            del merged[next(iter(merged))]
        self._qos2_sent = merged or None

    def forget_inflight(self) -> list[InFlight]:
        """Drop everything in flight (clean session end); returns what was dropped."""
        inflight, self._inflight = self._inflight, None
        self._completed_above = None
        return [] if inflight is None else list(inflight.values())

    def went_offline(self, seconds_ago: float = 0.0) -> None:
        """The session is offline, since `seconds_ago`. Its age is counted from here on the
        monotonic clock: a jump of the wall clock (a bad NTP step, a VM resumed, an operator's
        `date -s`) neither expires it early nor keeps it past its expiry. The Unix time is
        kept for its records, where nothing better can cross a restart or another node."""
        self.disconnected_at = time.time() - seconds_ago
        self.offline_mono = time.monotonic() - seconds_ago

    def offline_seconds(self, now: float) -> float:
        """How long the session has been offline: by the monotonic clock since `went_offline`,
        else by the wall clock `now` against `disconnected_at`."""
        if self.offline_mono:
            return time.monotonic() - self.offline_mono
        return now - self.disconnected_at

    def expired(self, now: float, default_expiry: float) -> bool:
        """Whether the session is an offline persistent one whose expiry passed by `now`
        (`offline_seconds`): its own interval (MQTT 5.0), else `default_expiry` (a 3.1.1
        session)."""
        if not self.persistent or self.connected:
            return False
        limit = default_expiry if self.expiry is None else self.expiry
        return self.offline_seconds(now) >= limit

    # -- persistence ---------------------------------------------------------------------------

    def encode_subscriptions(self) -> bytes:
        """The durable part that changes on SUBSCRIBE/UNSUBSCRIBE (with the identity the
        session is bound to, which changes only when an unbound session gets one)."""
        record: dict[str, Any] = {
            "subs": self._subscriptions or {},
            "shared": self._shared or {},
        }
        if self.options:
            record["opt"] = {
                f: [int(o.no_local), int(o.retain_as_published), o.identifier]
                for f, o in self.options.items()
            }
        if self.expiry is not None:
            record["exp"] = self.expiry
        if self.owner is not None:
            record["own"] = self.owner
        return json.dumps(record, separators=(",", ":")).encode()

    def encode_offsets(self) -> bytes:
        """Read positions, committed positions, the QoS 2 messages not to be sent again
        (`_pubrel_phase`) and when the client went offline (so session expiry survives a
        restart)."""
        committed = {queue: self.committed(queue) for queue in self.cursors}
        # What may have been sent reaches past the cursor when this session came from a node
        # whose sends are unknown and was not read that far yet: the marks go on with it.
        marks = self._resend_below or {}
        sent = {
            queue: max(cursor, marks.get(queue, cursor)) for queue, cursor in self.cursors.items()
        }
        return json.dumps(
            {
                "c": committed,
                "s": sent,
                "rel": self._pubrel_phase(),
                "d": 0.0 if self.connected else self.disconnected_at,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def restore(cls, client_id: str, subscriptions: bytes, offsets: bytes | None) -> Session:
        """Rebuild a persistent session from its durable records (after a restart)."""
        subs = json.loads(subscriptions)
        session = cls(
            client_id=client_id,
            persistent=True,
            subscriptions={str(k): int(v) for k, v in subs.get("subs", {}).items()},
            shared={str(k): int(v) for k, v in subs.get("shared", {}).items()},
            options={
                str(k): SubOptions(bool(v[0]), bool(v[1]), int(v[2]))
                for k, v in subs.get("opt", {}).items()
            },
            expiry=float(subs["exp"]) if subs.get("exp") is not None else None,
            owner=str(subs["own"]) if subs.get("own") is not None else None,
        )
        if offsets:
            data = json.loads(offsets)
            session.cursors = {str(k): int(v) for k, v in data.get("c", {}).items()}
            session.resend_below = {str(k): int(v) for k, v in data.get("s", {}).items()}
            session.released = {int(s) for s in data.get("rel", [])} or None
            session.disconnected_at = float(data.get("d", 0.0))
        return session
