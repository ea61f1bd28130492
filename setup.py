"""Build of mqtt-bridge: the modules every message passes through are compiled with mypyc.

Everything else is in pyproject.toml. The compiled modules are the same sources as the pure
Python ones, so a pure-Python package behaves the same, only slower. `MQTT_BRIDGE_COMPILE`:
unset (or 1) compiles and falls back to pure Python where that fails (no C compiler: a user
installing the sdist where no wheel fits); `required` fails the build instead (releases); `0`
builds pure Python on purpose. In a source checkout `make compile` builds them in place
(next to their .py files) and `make pure` removes them; see docs/decisions.md
"Building, testing and deployment".
"""

from __future__ import annotations

import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, CompileError, ExecError, PlatformError

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
    "bridge/node/stalls.py",
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
        if os.environ.get("MQTT_BRIDGE_COMPILE") == "required":
            raise
        print("mypyc not found: building mqtt-bridge as pure Python", file=sys.stderr)
        return []
    return mypycify(COMPILED, opt_level="3", group_name="bridge._native")


class BuildExtOrPure(build_ext):
    """Compile the hot path; where that cannot be done (no C compiler, no Python headers), build
    the pure-Python package instead, which behaves the same, and say so.

    This is what a user gets who installs from the sdist where no wheel fits. A release build
    sets MQTT_BRIDGE_COMPILE=required (the Dockerfile, `make dist`), so that a broken compiler
    fails the build instead of shipping the slower package unnoticed.
    """

    def run(self) -> None:
        try:
            super().run()
        except (CCompilerError, ExecError, PlatformError, CompileError, OSError) as err:
            if os.environ.get("MQTT_BRIDGE_COMPILE") == "required":
                raise
            print(
                f"compiling the hot path failed ({err}): building mqtt-bridge as pure Python",
                file=sys.stderr,
            )
            # A module built before the failure must not be packaged without the rest: its
            # import would need the shared library that did not build.
            for ext in self.extensions:
                built = self.get_ext_fullpath(ext.name)
                if os.path.exists(built):
                    os.remove(built)
            self.extensions = []


setup(ext_modules=compiled_modules(), cmdclass={"build_ext": BuildExtOrPure})
