#!/usr/bin/env python3
"""One subscriber with 9 filters over 9 first-level topics, through RocketMQ: how long after the
last PUBACK does the last message arrive?

    .venv/bin/python tests/bench/multi_filter.py [--rounds 3] [--ours-cmd '...']

Starts a real RocketMQ 5.3.3 (SYNC_FLUSH) and one bridge node with store=rocketmq on it (the
harness's RocketMQBridge). Each round: a persistent subscriber (clean_session=0, raw MQTT 3.1.1
client, PUBACKs every QoS 1 PUBLISH) subscribes at QoS 1 to `<p>t0/+/x` ... `<p>t7/+/x` and
`<p>w/#` in one SUBSCRIBE and waits for its SUBACK; then one publisher sends 450 QoS 1 messages,
50 to each of `<p>t0/a/x` ... `<p>t7/a/x` and `<p>w/a/x`, interleaved, at most 20 unacknowledged
(like mosquitto_pub), as fast as the PUBACKs allow. `<p>` is a fresh random prefix per round, so
rounds never see each other's messages. Reported per round: messages delivered (duplicates apart),
seconds from the last PUBACK to the last delivery, p50/p99 of publish->delivery latency.

Target (issue tracker): all 450 delivered within 2 s of the last PUBACK (before: 21-30 s), i.e.
no client's queue waits behind another's parked pull. Each round is capped (`--round-timeout`);
whatever arrived by then is reported. Everything started is stopped at the end, also on Ctrl-C
and SIGTERM. Writes <results-dir>/multi-filter.json and .md; exit status 1 if a round lost
messages or failed.
"""

from __future__ import annotations

import argparse
import math
import secrets
import shlex
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bridge.mqtt.packets import Puback, Publish, Suback, Subscribe, Subscription
from tests.bench.harness.common import (
    RESULTS_DIR,
    begin,
    free_port,
    log,
    utc_now,
    write_results,
)
from tests.bench.harness.processes import stopped_at_exit
from tests.bench.harness.procfs import loadavg, run_meta
from tests.bench.harness.report import fmt_s, log_section, md_table, plain_table
from tests.bench.harness.rocketmq import RocketMQBridge, add_rocketmq_option
from tests.support.clients import RawClient, close_all_raw_clients

DEFAULT_OURS_CMD = (
    "{python} -m bridge --listen {host}:{port} --data-dir {data_dir} --log-level warning"
)
NAME = "multi-filter"
LEVELS = [f"t{i}" for i in range(8)] + ["w"]  # 9 first-level topics (after the round's prefix)
PER_TOPIC = 50
TOTAL = PER_TOPIC * len(LEVELS)  # 450
WINDOW = 20  # unacknowledged publishes at most (mosquitto_pub's default)
TARGET_TAIL_S = 2.0
DUP_GRACE_S = 1.0  # after the last expected message, wait this long for duplicates


class Subscriber(threading.Thread):
    """Reads the subscriber's connection: PUBACKs every QoS 1 PUBLISH and records the arrival
    time of each message index (the payload); repeats are counted as duplicates."""

    def __init__(self, client: RawClient) -> None:
        super().__init__(daemon=True)
        self.client = client
        self.arrivals: dict[int, float] = {}
        self.duplicates = 0
        self.error: str | None = None
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                packet = self.client.recv(0.2)
            except TimeoutError:
                continue
            except (ConnectionError, OSError) as e:
                self.error = f"subscriber: {e}"
                return
            if not isinstance(packet, Publish):
                continue
            now = time.monotonic()
            if packet.qos == 1 and packet.packet_id is not None:
                self.client.send(Puback(packet.packet_id))
            i = int(packet.payload)
            if i in self.arrivals:
                self.duplicates += 1
            else:
                self.arrivals[i] = now


def publish_all(port: int, topics: list[str], sent: dict[int, float], deadline: float) -> float:
    """Publish TOTAL messages round-robin over `topics` with at most WINDOW unacknowledged; the
    time of the last PUBACK. Raises TimeoutError at `deadline`."""
    pub = RawClient(port, timeout=10.0)
    pub.connect(f"mf-pub-{secrets.token_hex(4)}")
    inflight: set[int] = set()
    next_i = acked = 0
    last_ack = time.monotonic()
    while acked < TOTAL:
        while next_i < TOTAL and len(inflight) < WINDOW:
            sent[next_i] = time.monotonic()
            topic = topics[next_i % len(topics)]
            pub.send(Publish(topic, b"%d" % next_i, 1, packet_id=next_i + 1))
            inflight.add(next_i + 1)
            next_i += 1
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"publisher: {acked} of {TOTAL} PUBACKs by the round timeout")
        packet = pub.recv(remaining)
        if isinstance(packet, Puback) and packet.packet_id in inflight:
            inflight.discard(packet.packet_id)
            acked += 1
            last_ack = time.monotonic()
    pub.disconnect()
    return last_ack


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile, rounded to 0.01."""
    ordered = sorted(values)
    return round(ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)], 2) if values else None


def run_round(port: int, timeout_s: float) -> dict[str, Any]:
    prefix = f"mf{secrets.token_hex(3)}"
    filters = [f"{prefix}{lv}/+/x" for lv in LEVELS[:-1]] + [f"{prefix}{LEVELS[-1]}/#"]
    topics = [f"{prefix}{lv}/a/x" for lv in LEVELS]
    deadline = time.monotonic() + timeout_s
    result: dict[str, Any] = {"prefix": prefix, "filters": filters, "errors": []}
    sent: dict[int, float] = {}
    last_ack: float | None = None
    sub_id = f"{prefix}-sub"
    client = RawClient(port, timeout=10.0)
    client.connect(sub_id, clean_session=False)
    client.send(Subscribe(1, [Subscription(f, 1) for f in filters]))
    suback = client.recv(10.0)
    if not isinstance(suback, Suback) or any(c != 1 for c in suback.return_codes):
        raise RuntimeError(f"unexpected answer to SUBSCRIBE: {suback}")
    sub = Subscriber(client)
    sub.start()
    try:
        try:
            last_ack = publish_all(port, topics, sent, deadline)
        except (TimeoutError, ConnectionError, OSError, AssertionError) as e:
            result["errors"].append(f"publisher: {e}")
        while time.monotonic() < deadline and len(sub.arrivals) < TOTAL and sub.error is None:
            time.sleep(0.02)
        complete = len(sub.arrivals) == TOTAL
        if complete:  # a short look for duplicates, within the cap
            time.sleep(max(0.0, min(DUP_GRACE_S, deadline - time.monotonic())))
    finally:
        sub.done.set()
        sub.join(2.0)
    client.disconnect()
    if sub.error:
        result["errors"].append(sub.error)
    cleanup = RawClient(port, timeout=10.0)  # drop the persistent session
    cleanup.connect(sub_id, clean_session=True)
    cleanup.disconnect()

    arrivals = dict(sub.arrivals)

    def after_ack(times: list[float]) -> float | None:
        """Seconds from the last PUBACK to the last of `times`."""
        return None if not times or last_ack is None else round(max(times) - last_ack, 3)

    latencies = [(t - sent[i]) * 1000 for i, t in arrivals.items() if i in sent]
    tail = after_ack(list(arrivals.values()))
    by_topic = {
        lv: [t for i, t in arrivals.items() if i % len(LEVELS) == k] for k, lv in enumerate(LEVELS)
    }
    t0 = min(sent.values(), default=time.monotonic())
    result.update(
        expected=TOTAL,
        published=len(sent),
        delivered=len(arrivals),
        duplicates=sub.duplicates,
        stop_reason="complete" if complete else "timeout",
        publish_s=None if last_ack is None else round(last_ack - t0, 3),
        last_puback_to_last_delivery_s=tail,
        latency_p50_ms=percentile(latencies, 50),
        latency_p99_ms=percentile(latencies, 99),
        per_topic={
            lv: {"delivered": len(ts), "last_after_puback_s": after_ack(ts)}
            for lv, ts in by_topic.items()
        },
        target_met=bool(complete and tail is not None and tail <= TARGET_TAIL_S),
    )
    return result


def table(rounds: list[dict[str, Any]]) -> tuple[list[str], list[list[str]], set[int]]:
    """One row per round; when the target is missed, the notes give each first-level topic's
    last delivery after the last PUBACK (s)."""
    head = ["round", "delivered", "dups", "publish s", "last PUBACK->last msg s"]
    head += ["p50 ms", "p99 ms", f"<= {TARGET_TAIL_S:.0f} s", "notes"]
    body = []
    for n, r in enumerate(rounds, 1):
        notes = list(r.get("errors", []))
        if not r.get("target_met") and r.get("per_topic"):
            per = r["per_topic"].items()
            notes.insert(0, " ".join(f"{lv}:{fmt_s(v['last_after_puback_s'], 1)}" for lv, v in per))
        body.append(
            [
                str(n),
                f"{r.get('delivered', 0)}/{TOTAL}",
                str(r.get("duplicates", 0)),
                fmt_s(r.get("publish_s")),
                fmt_s(r.get("last_puback_to_last_delivery_s")),
                fmt_s(r.get("latency_p50_ms"), 1),
                fmt_s(r.get("latency_p99_ms"), 1),
                "met" if r.get("target_met") else "not met",
                "; ".join(notes),
            ]
        )
    return head, body, {1, 2, 3, 4, 5, 6}


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=3, help="rounds (default: %(default)s)")
    ap.add_argument(
        "--round-timeout", type=float, default=60.0, help="seconds per round (default: 60)"
    )
    ap.add_argument(
        "--ours-cmd",
        default=DEFAULT_OURS_CMD,
        help="command to start our broker (store=rocketmq is appended); placeholders {python} "
        "{host} {port} {data_dir} {repo} (default: %(default)s)",
    )
    ap.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    add_rocketmq_option(ap)
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.round_timeout <= 0:
        ap.error("--rounds and --round-timeout must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args, command, t0 = begin(str(Path(__file__)), argv, parse_args)
    meta: dict[str, Any] = run_meta(
        command,
        round_timeout_s=args.round_timeout,
        messages=TOTAL,
        window=WINDOW,
        target_tail_s=TARGET_TAIL_S,
    )
    log(f"command: {command}")
    args.results_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="mqtt-bench-multi-filter-"))
    b = RocketMQBridge(tmp, free_port(), args.ours_cmd, args.rocketmq_java_opts)
    meta["bridge_command"] = shlex.join(b.cmd)
    rounds: list[dict[str, Any]] = []
    failed = False
    with stopped_at_exit(b, tmp, args.results_dir, f"{NAME}-"):
        try:
            b.start()
            b.wait_ready()
            log(f"    bridge: {meta['bridge_command']}")
            for n in range(1, args.rounds + 1):
                try:
                    r = run_round(b.port, args.round_timeout)
                except (RuntimeError, TimeoutError, ConnectionError, OSError) as e:
                    r = {"errors": [str(e)], "delivered": 0}
                rounds.append(r)
                log(
                    f"    round {n}: delivered {r.get('delivered')}/{TOTAL}, last PUBACK -> "
                    f"last delivery {r.get('last_puback_to_last_delivery_s')} s {r['errors']}"
                )
        except (RuntimeError, OSError) as e:
            meta["error"] = str(e)
            log(f"    ERROR: {e}")
            failed = True
        finally:
            close_all_raw_clients()
            meta["rocketmq"] = b.info()
    failed = failed or any(r["errors"] or r.get("delivered") != TOTAL for r in rounds)
    meta["finished_at"] = utc_now()
    meta["wall_s"] = round(time.monotonic() - t0, 1)
    meta["loadavg_end"] = loadavg()
    head, body, right = table(rounds)
    caption = (
        f"{TOTAL} QoS 1 messages, 1 publisher (window {WINDOW}) -> 1 subscriber with 9 filters "
        f"over 9 first-level topics, through RocketMQ; target: all within {TARGET_TAIL_S:.0f} s "
        "of the last PUBACK"
    )
    log_section(caption, plain_table(head, body, right) if body else "(no rounds ran)")
    md = "\n".join([caption, "", *(md_table(head, body, right) if body else [])]) + "\n"
    log(write_results(args.results_dir, NAME, {"meta": meta, "rounds": rounds}, md))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
