"""A hostile-client run against one bridge process: honest QoS 1 traffic on 127.0.0.1 while the
hostile clients of `tests.support.hostile` attack from 127.0.0.2-9, then the checks that the
attack cost nothing it must not: every PUBACKed message reached the honest subscriber, the node
is alive and logs a new honest client in promptly, its RSS grew within a bound, and its log has
no traceback. `run_hostile` returns the figures; `HostileReport.problems` names what failed.

Used by tests/faults/test_hostile_clients.py (a short run in the suite) and by
`python -m tests.faults.hostile_run --seconds 180` (`make hostile`)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bridge.access.hashes import hash_password
from bridge.mqtt.packets import Connack, Connect, Puback, Publish
from tests.support.clients import RawClient
from tests.support.hostile import HostileClients, Login
from tests.support.processes import BridgeProcess
from tests.support.qos import ExactlyOnceReceiver

HONEST = Login("honest", b"honest-password")
HOSTILE = Login("mallory", b"mallory-password")
"""A valid user the hostile clients that log in use: an attacker with an account."""

RSS_GROWTH_BOUND = 256 * 2**20
LOGIN_BOUND = 5.0
"""Seconds a new honest login may take at the end, on a shared 2-core test box."""
MAX_HONEST_MESSAGES = 1_000_000
PUBLISH_RATE = 100.0
"""Honest messages a second at most, so that the run stays a contest of clients, not of CPU."""


def access_settings(directory: Path) -> list[str]:
    """A password file (Argon2, the default hash) for the honest and the hostile user, and the
    settings that turn authentication on with it. No cache of verified passwords: every login,
    the honest ones too, is hashed in turn with the attackers'."""
    passwd = directory / "passwd"
    passwd.write_text(
        "".join(
            f"{login.username}:{hash_password(login.password)}\n" for login in (HONEST, HOSTILE)
        )
    )
    passwd.chmod(0o600)
    return [f"password_file={passwd}", "allow_anonymous=false", "auth_cache_ttl=0"]


def rss_bytes(pid: int) -> int:
    """The resident memory of a process (VmRSS of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def honest_client(port: int, client_id: str, clean: bool = True) -> RawClient:
    """A RawClient logged in as the honest user (CONNACK 0 asserted)."""
    client = RawClient(port, timeout=10)
    client.send(Connect(client_id, clean, username=HONEST.username, password=HONEST.password))
    connack = client.recv()
    assert isinstance(connack, Connack) and connack.return_code == 0, connack
    return client


def timed_login(port: int) -> float:
    """Seconds from connecting to a new honest client's CONNACK 0."""
    started = time.monotonic()
    client = honest_client(port, f"honest-late-{started}")
    elapsed = time.monotonic() - started
    client.disconnect()
    return elapsed


class HonestSubscriber(ExactlyOnceReceiver):
    """The persistent QoS 1 subscriber to honest/#, logged in, receiving in a thread until
    `stop`, reconnecting (its session resends what was not acknowledged) if the node closes
    it. `delivered` counts every payload received."""

    def __init__(self, port: int) -> None:
        super().__init__(port, "honest-sub")
        self.reconnects = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._receive_until_stopped, daemon=True)

    def connect(self) -> RawClient:
        if self.client is not None:
            self.client.close()
        self.client = honest_client(self.port, self.client_id, clean=False)
        return self.client

    def start(self) -> None:
        self.connect()
        self.client.subscribe("honest/#", 1)  # type: ignore[union-attr]
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)
        assert not self._thread.is_alive(), "the honest subscriber did not stop"
        assert self.client is not None
        self.client.disconnect()

    def _receive_until_stopped(self) -> None:
        while not self._stop.is_set():
            try:
                assert self.client is not None
                self.handle(self.client.recv(0.5))
            except TimeoutError:
                continue
            except OSError:
                if self._stop.wait(0.5):
                    return
                self.reconnects += 1
                try:
                    self.connect()
                except (OSError, AssertionError):
                    continue


class HonestPublisher:
    """Publishes numbered QoS 1 messages to honest/N at most PUBLISH_RATE a second in a thread,
    each awaited to its PUBACK; `acked` holds the payloads the node acknowledged. A message
    without its PUBACK in 10 s (or on a broken connection) is not counted and the publisher
    logs in again."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.acked: list[str] = []
        self.unacked = 0
        self.reconnects = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._publish_until_stopped, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)
        assert not self._thread.is_alive(), "the honest publisher did not stop"

    def _publish_until_stopped(self) -> None:
        client = honest_client(self.port, "honest-pub")
        started = time.monotonic()
        for n in range(MAX_HONEST_MESSAGES):
            if self._stop.is_set():
                break
            payload = f"honest-{n:07d}:".ljust(512, ".")
            packet_id = n % 0xFFFF + 1
            try:
                client.send(Publish(f"honest/{n % 8}", payload.encode(), 1, packet_id=packet_id))
                ack = client.recv()
                assert isinstance(ack, Puback) and ack.packet_id == packet_id, ack
                self.acked.append(payload)
            except (OSError, TimeoutError):
                self.unacked += 1
                client.close()
                if self._stop.wait(0.5):
                    break
                self.reconnects += 1
                try:
                    client = honest_client(self.port, "honest-pub")
                except (OSError, AssertionError):
                    continue
            self._stop.wait(max(0.0, started + (n + 1) / PUBLISH_RATE - time.monotonic()))
        client.close()


class RssSampler:
    """Samples a process's VmRSS every 0.2 s in a thread; `peak` is the largest seen."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss_bytes(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            try:
                self.peak = max(self.peak, rss_bytes(self.pid))
            except (OSError, AssertionError):
                return  # the process is gone; the run's checks say so


@dataclass
class HostileReport:
    """The figures of one run and what they must satisfy."""

    seconds: float
    acked: int = 0
    delivered: int = 0
    """Distinct acknowledged messages the honest subscriber received."""
    lost: list[str] = field(default_factory=list)
    duplicates: int = 0
    publisher_unacked: int = 0
    reconnects: int = 0
    hostile: dict[str, int] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)
    rss_before: int = 0
    rss_peak: int = 0
    rss_after: int = 0
    login_seconds: float | None = None
    alive: bool = True
    traceback: str = ""

    def problems(self) -> list[str]:
        """What the run must not have done, each as a sentence; empty when it passed."""
        found = []
        if not self.alive:
            found.append("the bridge died")
        if self.acked == 0:
            found.append("no honest message was acknowledged")
        if self.lost:
            found.append(f"{len(self.lost)} acknowledged messages lost, e.g. {self.lost[:3]}")
        growth = self.rss_peak - self.rss_before
        if growth >= RSS_GROWTH_BOUND:
            found.append(f"RSS grew {growth / 2**20:.0f} MiB (bound {RSS_GROWTH_BOUND >> 20})")
        if self.login_seconds is None or self.login_seconds >= LOGIN_BOUND:
            found.append(f"a new honest login took {self.login_seconds} s (bound {LOGIN_BOUND})")
        if self.traceback:
            found.append(f"the bridge logged a traceback:\n{self.traceback}")
        return found

    def lines(self) -> list[str]:
        """The figures, for a person."""
        mib = 2**20
        login = "none" if self.login_seconds is None else f"{self.login_seconds:.2f} s"
        return [
            f"hostile run of {self.seconds:.0f} s",
            f"honest: {self.acked} acked, {self.delivered} delivered ({self.duplicates} "
            f"duplicates), {len(self.lost)} lost; {self.publisher_unacked} publishes without "
            f"PUBACK; {self.reconnects} honest reconnects",
            f"hostile: {self.hostile}",
            *(f"  {key}: {n}" for key, n in sorted(self.outcomes.items())),
            f"RSS: before {self.rss_before / mib:.0f} MiB, peak {self.rss_peak / mib:.0f} MiB, "
            f"after {self.rss_after / mib:.0f} MiB",
            f"new honest login at the end: {login}",
        ]


def run_hostile(node: BridgeProcess, seconds: float, drain_seconds: float = 20.0) -> HostileReport:
    """Honest traffic and every hostile kind against `node` for `seconds`, then up to
    `drain_seconds` for the subscriber to receive what was acknowledged; the figures."""
    report = HostileReport(seconds)
    timed_login(node.port)  # warm: the login path is imported and the hash checked once
    subscriber = HonestSubscriber(node.port)
    subscriber.start()
    publisher = HonestPublisher(node.port)
    hostile = HostileClients(node.port, HOSTILE, seconds)
    sampler = RssSampler(node.pid)
    report.rss_before = sampler.peak
    sampler.start()
    publisher.start()
    hostile.start()
    try:
        hostile.join()
    finally:
        publisher.stop()
    acked = set(publisher.acked)
    pending = set(acked)
    deadline = time.monotonic() + drain_seconds
    while pending and time.monotonic() < deadline:
        time.sleep(0.2)  # the subscriber thread adds to `delivered`: look, never iterate it
        pending = {payload for payload in pending if payload not in subscriber.delivered}
    subscriber.stop()
    sampler.stop()
    report.acked = len(acked)
    report.delivered = len(acked & subscriber.delivered.keys())
    report.lost = sorted(acked - subscriber.delivered.keys())
    report.duplicates = sum(n - 1 for n in subscriber.delivered.values() if n > 1)
    report.publisher_unacked = publisher.unacked
    report.reconnects = publisher.reconnects + subscriber.reconnects
    report.hostile = hostile.summary()
    report.outcomes = dict(hostile.outcomes)
    report.alive = node.proc is not None and node.proc.poll() is None
    if report.alive:
        report.rss_after = rss_bytes(node.pid)
        report.rss_peak = max(sampler.peak, report.rss_after)
        try:
            report.login_seconds = timed_login(node.port)
        except (OSError, AssertionError):
            report.login_seconds = None
    log = node.log_text()
    if "Traceback" in log:
        at = log.index("Traceback")
        report.traceback = log[max(0, at - 500) : at + 3000]
    return report
