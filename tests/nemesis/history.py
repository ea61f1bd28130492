"""What the nemesis clients saw, and the checker that judges it afterwards.

Every client appends to one `History` as it goes (times from one monotonic clock, the test
process's): each connection it opened and when the server answered CONNACK and when the
connection ended; each message it published, on which connection, when it was sent and when the
server acknowledged it (PUBACK for QoS 1, PUBREC for QoS 2: the server stored it); each message a
subscriber received as new (QoS 2 resent with the same packet id before PUBREL is the same
delivery, as the spec's "method B" has a client keep it); each will the will watcher received.

`check` turns that into a `Verdict`: what was acknowledged and not delivered to every
subscriber, QoS 2 delivered twice, a publisher's messages out of order within one of its
connections, a ClientId served by two connections at once (a server answered the older
connection to a request sent after the newer one's CONNACK), and wills not exactly once.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from dataclasses import dataclass, field


@dataclass
class Connection:
    client_id: str
    instance: str
    """The client object (two objects may use one ClientId: a take-over)."""
    opened: float
    connack: float | None = None
    session_present: bool | None = None
    closed: float | None = None
    clean_end: bool = False
    """Ended with the client's DISCONNECT."""
    answers: list[tuple[float, float]] = field(default_factory=list)
    """(request sent, answer received) of every request the server answered on it."""


@dataclass
class Sent:
    payload: str
    publisher: str
    qos: int
    connection: int
    """Index in History.connections of the connection it was first sent on."""
    sent: float
    resent: int = 0
    acked: float | None = None


@dataclass
class History:
    subscribers: list[str]
    """ClientIds subscribed (before any publish) to every published message."""
    connections: list[Connection] = field(default_factory=list)
    sent: dict[str, Sent] = field(default_factory=dict)
    deliveries: dict[str, list[tuple[float, str, int]]] = field(default_factory=dict)
    """subscriber -> (time, payload, connection index) of each new delivery, in arrival order."""
    wills: Counter[str] = field(default_factory=Counter)
    """will client -> wills received."""
    abandoned: dict[str, int] = field(default_factory=dict)
    """will client -> connections it dropped without DISCONNECT (as a device that dies)."""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        for subscriber in self.subscribers:
            self.deliveries.setdefault(subscriber, [])

    # -- recording (any client thread) -------------------------------------------------------
    def opened(self, client_id: str, instance: str, now: float) -> int:
        with self.lock:
            self.connections.append(Connection(client_id, instance, now))
            return len(self.connections) - 1

    def connacked(self, connection: int, session_present: bool, now: float) -> None:
        with self.lock:
            record = self.connections[connection]
            record.connack, record.session_present = now, session_present

    def closed(self, connection: int, now: float, clean: bool = False) -> None:
        with self.lock:
            record = self.connections[connection]
            if record.closed is None:
                record.closed, record.clean_end = now, clean

    def answered(self, connection: int, request_sent: float, now: float) -> None:
        with self.lock:
            self.connections[connection].answers.append((request_sent, now))

    def published(
        self, payload: str, publisher: str, qos: int, connection: int, now: float
    ) -> None:
        with self.lock:
            if payload in self.sent:
                self.sent[payload].resent += 1
            else:
                self.sent[payload] = Sent(payload, publisher, qos, connection, now)

    def acknowledged(self, payload: str, now: float) -> None:
        with self.lock:
            record = self.sent[payload]
            if record.acked is None:
                record.acked = now

    def delivered(self, subscriber: str, payload: str, connection: int, now: float) -> None:
        with self.lock:
            self.deliveries[subscriber].append((now, payload, connection))

    def will(self, client_id: str) -> None:
        with self.lock:
            self.wills[client_id] += 1

    def abandon(self, client_id: str) -> None:
        with self.lock:
            self.abandoned[client_id] = self.abandoned.get(client_id, 0) + 1


@dataclass
class Verdict:
    acknowledged: int
    delivered: int
    """Deliveries counted over every subscriber (a message to two subscribers counts twice)."""
    lost: dict[str, list[str]]
    """subscriber -> acknowledged payloads it never received."""
    qos2_twice: dict[str, list[str]]
    out_of_order: dict[str, list[tuple[str, str]]]
    """subscriber -> (earlier, later) pairs of one publisher's connection delivered reversed."""
    split_brain: list[str]
    """Per ClientId served twice: which connections and for how long."""
    wills_wrong: dict[str, tuple[int, int]]
    """will client -> (wills expected, wills received) where they differ."""
    never_acknowledged: int
    """Published, never acknowledged (the publisher gave up at the end): not a loss."""
    sessions_lost: list[str] = field(default_factory=list)
    """ClientIds whose persistent session was gone when they came back (CONNACK with session
    present 0 after one with a session): their subscriptions and QoS state went with it."""

    @property
    def ok(self) -> bool:
        return not (
            any(self.lost.values())
            or any(self.qos2_twice.values())
            or any(self.out_of_order.values())
            or self.split_brain
            or self.wills_wrong
            or self.sessions_lost
        )

    def summary(self) -> str:
        lost = sum(len(v) for v in self.lost.values())
        twice = sum(len(v) for v in self.qos2_twice.values())
        disorder = sum(len(v) for v in self.out_of_order.values())
        return (
            f"acknowledged {self.acknowledged}, delivered {self.delivered}, lost {lost}, "
            f"QoS 2 twice {twice}, out of order {disorder}, split-brain windows "
            f"{len(self.split_brain)}, wills wrong {len(self.wills_wrong)}, "
            f"sessions lost {len(self.sessions_lost)}, "
            f"never acknowledged {self.never_acknowledged}"
        )

    def details(self, limit: int = 5) -> str:
        lines = [self.summary()]
        for name, values in (
            ("lost", self.lost),
            ("QoS 2 twice", self.qos2_twice),
            ("out of order", self.out_of_order),
        ):
            for subscriber, items in values.items():
                if items:
                    lines.append(f"{name} at {subscriber}: {len(items)}, e.g. {items[:limit]}")
        lines += [f"split brain: {line}" for line in self.split_brain[:limit]]
        lines += [f"session lost: {client_id}" for client_id in self.sessions_lost[:limit]]
        lines += [f"wills of {c}: expected {e}, got {g}" for c, (e, g) in self.wills_wrong.items()]
        return "\n".join(lines)


def check(history: History, will_clients: list[str] = ()) -> Verdict:  # type: ignore[assignment]
    """Judge a finished history (every client stopped)."""
    acked = {p: s for p, s in history.sent.items() if s.acked is not None}
    lost: dict[str, list[str]] = {}
    twice: dict[str, list[str]] = {}
    disorder: dict[str, list[tuple[str, str]]] = {}
    delivered_total = 0
    for subscriber, arrivals in history.deliveries.items():
        counts = Counter(payload for _, payload, _ in arrivals)
        delivered_total += len(arrivals)
        lost[subscriber] = sorted(p for p in acked if p not in counts)
        twice[subscriber] = sorted(
            p for p, n in counts.items() if n > 1 and p in history.sent and history.sent[p].qos == 2
        )
        disorder[subscriber] = _out_of_order(history, arrivals)
    return Verdict(
        acknowledged=len(acked),
        delivered=delivered_total,
        lost=lost,
        qos2_twice=twice,
        out_of_order=disorder,
        split_brain=_split_brain(history.connections),
        wills_wrong=_wills_wrong(history, list(will_clients)),
        never_acknowledged=len(history.sent) - len(acked),
        sessions_lost=_sessions_lost(history.connections),
    )


def _sessions_lost(connections: list[Connection]) -> list[str]:
    """Every client here keeps a persistent session: once a CONNACK said it had one, a later
    CONNACK without one means the server lost it."""
    had: set[str] = set()
    lost: list[str] = []
    for connection in sorted(
        (c for c in connections if c.connack is not None), key=lambda c: c.connack or 0.0
    ):
        if connection.session_present:
            had.add(connection.client_id)
        elif connection.client_id in had and connection.client_id not in lost:
            lost.append(connection.client_id)
    return lost


def _out_of_order(
    history: History, arrivals: list[tuple[float, str, int]]
) -> list[tuple[str, str]]:
    """Messages one publisher sent once each on one connection must first arrive in the order
    sent (MQTT orders one client's messages to a topic; a message resent after a reconnect may
    legitimately overtake, so it is left out)."""
    last: dict[int, tuple[float, str]] = {}  # publisher connection -> (sent time, payload)
    seen: set[str] = set()
    reversed_pairs = []
    for _, payload, _ in arrivals:
        record = history.sent.get(payload)
        if record is None or payload in seen:
            continue
        seen.add(payload)
        if record.resent:
            continue
        previous = last.get(record.connection)
        if previous is not None and previous[0] > record.sent:
            reversed_pairs.append((previous[1], payload))
        if previous is None or previous[0] < record.sent:
            last[record.connection] = (record.sent, payload)
    return reversed_pairs


def _split_brain(connections: list[Connection]) -> list[str]:
    """A connection is served after a newer connection of its ClientId got CONNACK when the
    server answers on it a request the client sent after that CONNACK: two sessions live."""
    by_client: dict[str, list[Connection]] = defaultdict(list)
    for connection in connections:
        if connection.connack is not None:
            by_client[connection.client_id].append(connection)
    found = []
    for client_id, conns in by_client.items():
        conns.sort(key=lambda c: c.connack or 0.0)
        for index, older in enumerate(conns):
            for newer in conns[index + 1 :]:
                assert newer.connack is not None
                late = [answer for sent, answer in older.answers if sent > newer.connack]
                if late:
                    found.append(
                        f"{client_id}: {older.instance}'s connection answered "
                        f"{len(late)} requests sent up to {max(late) - newer.connack:.2f} s "
                        f"after {newer.instance} got CONNACK"
                    )
                    break
    return found


def _wills_wrong(history: History, will_clients: list[str]) -> dict[str, tuple[int, int]]:
    """A will client abandoned n times (connection dropped without DISCONNECT, never resumed)
    gets exactly n wills; one that only ever disconnected cleanly gets none."""
    wrong = {}
    for client_id in will_clients:
        expected = history.abandoned.get(client_id, 0)
        got = history.wills.get(client_id, 0)
        if got != expected:
            wrong[client_id] = (expected, got)
    return wrong
