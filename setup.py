"""Build of mqtt-bridge: the modules every message passes through are compiled with mypyc.

Everything else is in pyproject.toml. The compiled modules are the same sources as the pure
Python ones: `MQTT_BRIDGE_COMPILE=0` (or no mypy at build time) builds a pure-Python package,
which behaves the same and is slower. In a source checkout `make compile` builds them in place
(next to their .py files) and `make pure` removes them; see docs/decisions.md
"Building, testing and deployment".
"""

from __future__ import annotations

import os
import sys

from setuptools import setup

# The publish -> store -> deliver path and what it calls per message (issue 18's profile).
COMPILED = [
    "bridge/fields.py",
    "bridge/mqtt/decoder.py",
    "bridge/mqtt/body_decoders.py",
    "bridge/mqtt/fast_encoders.py",
    "bridge/mqtt/encoder.py",
    "bridge/mqtt/properties.py",
    "bridge/mqtt/topics.py",
    "bridge/mqtt/packets.py",
    "bridge/router/trie.py",
    "bridge/router/plan.py",
    "bridge/router/queues.py",
    "bridge/router/shared.py",
    "bridge/session.py",
    "bridge/state.py",
    "bridge/node/stamp.py",
    "bridge/node/publish.py",
    "bridge/node/wakes.py",
    "bridge/node/copies.py",
    "bridge/node/delivery.py",
    "bridge/node/congestion.py",
    "bridge/node/flow.py",
    "bridge/storage/message.py",
    "bridge/storage/records.py",
    "bridge/storage/filelog/files.py",
    "bridge/storage/filelog/index.py",
    "bridge/storage/filelog/store.py",
    "bridge/storage/filelog/commit.py",
    "bridge/storage/filelog/segments.py",
    "bridge/storage/filelog/reading.py",
    "bridge/storage/filelog/undo.py",
    "bridge/listeners/inbound.py",
    "bridge/listeners/delivery_acks.py",
    "bridge/listeners/outbox.py",
    "bridge/listeners/connection.py",
    # The ACL asked at every PUBLISH and delivery (issue 36).
    "bridge/access/acl.py",
    "bridge/access/reads.py",
    "bridge/access/ttlcache.py",
    "bridge/counters.py",
]


def compiled_modules() -> list:
    if os.environ.get("MQTT_BRIDGE_COMPILE", "1") == "0":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("mypyc not found: building mqtt-bridge as pure Python", file=sys.stderr)
        return []
    return mypycify(COMPILED, opt_level="3", group_name="bridge._native")


setup(ext_modules=compiled_modules())
