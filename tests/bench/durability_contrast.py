"""Durability side by side: QoS 1 messages acknowledged to a publisher while a persistent
subscriber is offline, then kill -9 of the broker, restart, reconnect: how many arrive?

Runs this bridge and Mosquitto (Debian's, `persistence true` with its default autosave) the same
way and prints the count for each. Usage: `.venv/bin/python tests/bench/durability_contrast.py
[--messages N]`. Not a pass/fail test: it documents the difference the product exists for.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bridge.mqtt.packets import Puback, Publish
from tests.support.clients import RawClient, close_all_raw_clients
from tests.support.processes import BridgeProcess, MosquittoProcess


def run(broker: BridgeProcess | MosquittoProcess, count: int) -> tuple[int, int]:
    """(acknowledged, delivered after kill -9 and restart); the broker is killed by PID at the
    end whatever happens."""
    try:
        return _run(broker, count)
    finally:
        broker.kill()
        close_all_raw_clients()


def _run(broker: BridgeProcess | MosquittoProcess, count: int) -> tuple[int, int]:
    broker.start()
    port = broker.port
    sub = RawClient(port)
    sub.connect("contrast-sub", clean_session=False)
    sub.subscribe("contrast/#", 1)
    sub.disconnect()
    pub = RawClient(port)
    pub.connect("contrast-pub")
    acked = 0
    for i in range(count):
        pub.publish("contrast/t", b"m%d" % i, 1, packet_id=i % 60000 + 1)
        acked += 1
    pub.close()
    time.sleep(0.5)  # give a periodic saver every chance it would get in a quiet second
    broker.kill()
    broker.start()
    sub = RawClient(port)
    sub.connect("contrast-sub", clean_session=False)
    seen: set[bytes] = set()
    while True:
        try:
            packet = sub.recv(2.0)
        except (TimeoutError, ConnectionError):
            break
        if isinstance(packet, Publish):
            seen.add(packet.payload)
            if packet.qos == 1:
                sub.send(Puback(packet.packet_id or 0))
    sub.close()
    return acked, len(seen)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        results = {
            "mqtt-bridge (embedded store, fsync on)": run(
                BridgeProcess(base / "bridge"), args.messages
            ),
            "mosquitto (persistence true, default autosave)": run(
                MosquittoProcess(base / "mosquitto"), args.messages
            ),
        }
    print("QoS 1 messages acknowledged while the subscriber was offline, then kill -9 + restart:")
    for name, (acked, delivered) in results.items():
        print(
            f"  {name:<48} acknowledged {acked:>6}  delivered {delivered:>6}  "
            f"lost {acked - delivered:>6}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
