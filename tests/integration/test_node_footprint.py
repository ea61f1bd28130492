"""What a node on the embedded defaults keeps out of its memory: redis-py, prometheus_client and
argon2-cffi are imported only by a node that uses Redis, is scraped or checks a password (issue
18's RSS target)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import redis.exceptions

from bridge.cluster.redis_errors import redis_errors
from tests.support.processes import free_port

# A node in a fresh interpreter: started on the defaults, one QoS 1 message through it, stopped;
# then the optional libraries it imported on the way.
NODE_SCRIPT = """
import asyncio, sys
import paho.mqtt.client as mqtt
from bridge.checks import load_config
from bridge.listeners.server import Server

async def main(port: int, data_dir: str) -> None:
    config = load_config(env={}, overrides={"listen": [f"127.0.0.1:{port}"], "data_dir": data_dir})
    server = Server(config)
    await server.start()
    got = asyncio.Event()
    loop = asyncio.get_running_loop()

    def client() -> None:
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="footprint")
        c.on_message = lambda *_: loop.call_soon_threadsafe(got.set)
        c.connect("127.0.0.1", port)
        c.subscribe("t", qos=1)
        c.loop_start()
        c.publish("t", b"x", qos=1).wait_for_publish(10)

    await asyncio.wait_for(asyncio.to_thread(client), 10)
    await asyncio.wait_for(got.wait(), 10)
    await server.shutdown()
    optional = {"redis", "prometheus_client", "argon2"}
    print(",".join(sorted({m.split(".")[0] for m in sys.modules} & optional)))

asyncio.run(main(int(sys.argv[1]), sys.argv[2]))
"""


def test_a_node_on_the_embedded_defaults_imports_no_redis_prometheus_or_argon2(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", NODE_SCRIPT, str(free_port()), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", done.stdout


def test_redis_errors_names_redis_pys_base_error_once_redis_py_is_imported() -> None:
    # This test process has imported redis-py (above): its errors are caught with the others.
    assert redis_errors(OSError) == (redis.exceptions.RedisError, OSError)
    try:
        raise redis.exceptions.ConnectionError("gone")
    except redis_errors(OSError) as exc:
        assert isinstance(exc, redis.exceptions.RedisError)


def test_redis_errors_without_redis_py_names_only_the_others() -> None:
    script = (
        "import sys\n"
        "from bridge.cluster.redis_errors import redis_errors\n"
        "assert 'redis' not in sys.modules\n"
        "assert redis_errors(OSError, TimeoutError) == (OSError, TimeoutError)\n"
        "assert redis_errors() == ()\n"
        "try:\n"
        "    raise OSError('x')\n"
        "except redis_errors(OSError):\n"
        "    print('caught')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "caught"
