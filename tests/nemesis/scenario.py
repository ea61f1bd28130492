"""One nemesis run: clients under load through a cluster while faults come and go, then the
history judged.

    result = run(cluster, [(FAULTS["node-isolated"], 3.0, 8.0)], tag="iso")
    assert result.verdict.ok, result.report()

A schedule is a list of (fault, start second, hold seconds); faults may overlap. Every client's
ClientId carries `tag`, so runs on one cluster never share a session.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from bridge.mqtt.packets import Puback, Publish
from tests.support.clients import RawClient

from .cluster import NODE_TIMEOUT, NemesisCluster
from .faults import Fault
from .history import History, Verdict, check
from .workload import Client, Publisher, Subscriber, WillClient

Schedule = list[tuple[Fault, float, float]]

DRAIN_S = 60.0
"""At most this long for the publishers to complete what they have in flight after the load,
and again for the subscribers to receive every acknowledged message."""
FINISH_S = 15.0
"""At most this long for the other clients to complete their handshakes and disconnect."""


@dataclass
class Result:
    verdict: Verdict
    recovery_s: float
    """From the last fault's end until every node answered a QoS 1 PUBLISH again."""
    history: History
    notes: list[str] = field(default_factory=list)

    def report(self) -> str:
        return "\n".join(
            [self.verdict.details(), f"served again {self.recovery_s:.1f} s after", *self.notes]
        )


def run(
    cluster: NemesisCluster, schedule: Schedule, tag: str, seed: int = 0, tail_s: float = 4.0
) -> Result:
    rng = random.Random(seed)
    subscribers = [f"{tag}-sub", f"{tag}-roam"]
    history = History(subscribers)
    lb = lambda: cluster.balancer  # noqa: E731
    stable = Subscriber(history, subscribers[0], lb, "nem/#")
    roaming = Subscriber(
        history, subscribers[1], lb, "nem/#", cluster.node_endpoints(), random.Random(seed + 1)
    )
    watcher = Subscriber(
        history, f"{tag}-wills", lb, "nemwill/#",
        record=lambda payload, _connection: history.will(payload),
    )  # fmt: skip
    listeners = [stable, roaming, watcher]
    publishers = [Publisher(history, f"{tag}-p{i}", lb, qos=1 + i % 2, rate=30.0) for i in range(4)]
    wills = [WillClient(history, f"{tag}-w{i}", lb) for i in range(4)]
    notes: list[str] = []
    try:
        for client in listeners:
            client.start()
        for client in listeners:
            if not client.subscribed.wait(30):
                raise AssertionError(f"{client.name} never subscribed: {client.error!r}")
        _wait_routed(cluster, history, tag)
        for starting in [*publishers, *wills]:
            starting.start()
        recovery = _run_schedule(cluster, schedule, wills, rng, notes)
        time.sleep(tail_s)
    finally:
        for fault, _, _ in schedule:  # whatever happened, nothing stays broken
            fault.end(cluster)
    _finish(publishers, DRAIN_S)
    _wait_delivered(history, DRAIN_S)
    _finish([*wills, stable, roaming], FINISH_S)
    _wait_wills(history, [w.client_id for w in wills], 20.0)
    _finish([watcher], FINISH_S)
    for done in [*publishers, *wills, *listeners]:
        if done.error is not None:
            notes.append(f"{done.name}: {done.error!r}")
        if done.is_alive():
            notes.append(f"{done.name} did not finish")
    notes.append(
        f"roaming take-overs {roaming.roamed}; sessions: "
        + ", ".join(f"{c.name} {c.sessions}" for c in [*publishers, stable, roaming])
    )
    verdict = check(history, [w.client_id for w in wills])
    return Result(verdict, recovery, history, notes)


def _finish(clients: Sequence[Client], within: float) -> None:
    """Ask every client to finish, and wait for them all, `within` seconds in all (a client
    still running then is noted by the caller)."""
    for client in clients:
        client.finish(within)
    deadline = time.monotonic() + within + 2
    for client in clients:
        client.join(max(0.0, deadline - time.monotonic()))


def _run_schedule(
    cluster: NemesisCluster,
    schedule: Schedule,
    wills: list[WillClient],
    rng: random.Random,
    notes: list[str],
) -> float:
    """Play the schedule; during each fault one will client dies. Returns the recovery time
    after the last fault ended."""
    start = time.monotonic()
    events = sorted(
        [(at, 0, index) for index, (_, at, _) in enumerate(schedule)]
        + [(at + hold, 1, index) for index, (_, at, hold) in enumerate(schedule)]
    )
    alive = list(wills)
    for at, ending, index in events:
        time.sleep(max(0.0, start + at - time.monotonic()))
        fault = schedule[index][0]
        if ending:
            fault.end(cluster)
            notes.append(f"{time.monotonic() - start:5.1f} s  end {fault.name}")
        else:
            fault.begin(cluster)
            notes.append(f"{time.monotonic() - start:5.1f} s  begin {fault.name}")
            if alive:
                alive.pop(rng.randrange(len(alive))).abandon()
    return _wait_served(cluster, 4 * NODE_TIMEOUT + 30)


def _wait_routed(cluster: NemesisCluster, history: History, tag: str, timeout: float = 30) -> None:
    """Publish probes through each node until every subscriber got one from each: the
    subscriptions are known cluster-wide before the load starts."""
    deadline = time.monotonic() + timeout
    for host, port in cluster.node_endpoints():
        probe = RawClient(port, host=host)
        try:
            probe.connect(f"{tag}-probe", clean_session=True)
            for index in range(1000):
                payload = f"probe-{host}-{index}"
                probe.publish("nem/probe", payload.encode(), 1, packet_id=index % 60000 + 1)
                probe.publish("nemwill/probe", payload.encode(), 1, packet_id=index % 60000 + 1)
                time.sleep(0.1)
                got = {
                    s
                    for s, arrivals in history.deliveries.items()
                    if any(p.startswith(f"probe-{host}-") for _, p, _ in arrivals)
                }
                if got == set(history.deliveries) and any(
                    w.startswith(f"probe-{host}-") for w in history.wills
                ):
                    break
                if time.monotonic() > deadline:
                    raise AssertionError(f"probes through {host} did not reach {got}")
        finally:
            probe.close()
    for will in [w for w in history.wills if w.startswith("probe-")]:
        del history.wills[will]


def _wait_served(cluster: NemesisCluster, timeout: float) -> float:
    """Seconds until every node answers a QoS 1 PUBLISH from a new connection with PUBACK."""
    start = time.monotonic()
    waiting = set(cluster.node_endpoints())
    while waiting and time.monotonic() - start < timeout:
        for host, port in sorted(waiting):
            try:
                client = RawClient(port, timeout=1.0, host=host)
            except OSError:
                continue
            try:
                client.connect(f"served-{host}", clean_session=True)
                client.send(Publish("served/probe", b"x", 1, packet_id=1))
                if isinstance(client.recv(1.0), Puback):
                    waiting.discard((host, port))
            except (ConnectionError, OSError, TimeoutError, AssertionError):
                pass
            finally:
                client.close()
        time.sleep(0.1)
    if waiting:
        return float("inf")
    return time.monotonic() - start


def _wait_delivered(history: History, timeout: float) -> None:
    """Until every subscriber has every acknowledged message (or the time is up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with history.lock:
            acked = {p for p, s in history.sent.items() if s.acked is not None}
            done = all(
                acked <= {p for _, p, _ in arrivals} for arrivals in history.deliveries.values()
            )
        if done:
            return
        time.sleep(0.2)


def _wait_wills(history: History, will_clients: list[str], timeout: float) -> None:
    """Until each abandoned will client's will arrived (the server may need 1.5 keep-alives)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with history.lock:
            if all(history.wills.get(c, 0) >= history.abandoned.get(c, 0) for c in will_clients):
                break
        time.sleep(0.2)
    time.sleep(1.0)  # a second will, if the server sent one, lands in the history too
