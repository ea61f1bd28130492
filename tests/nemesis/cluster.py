"""The cluster the nemesis breaks: three bridge nodes over RocketMQ and a Sentinel-managed Redis,
every one a host of its own (a network namespace: `net.Network`), behind HAProxy in the root
namespace where the clients are.

    hosts   redis: master, two replicas, 3 Sentinels    mq: NameServer and broker
            n1, n2, n3: a bridge node each              root: HAProxy, the test's clients

n1's wall clock can be moved (libfaketime) and the broker's store is a tmpfs of its own, for the
faults that jump a clock and fill a disk.

The nodes run with the default `node_timeout` (6 s: a node silent that long is taken for dead)
and the fault tests' shorter `interest_grace`; a fault held 10 s is one the cluster must act on.
"""

from __future__ import annotations

import secrets
import subprocess
import uuid
from pathlib import Path

from tests.support.haproxy import LocalHAProxy
from tests.support.processes import BridgeProcess
from tests.support.redis import LocalSentinelRedis
from tests.support.redis_auth import RedisAuth
from tests.support.rocketmq import LocalRocketMQ

from .net import Network

NODES = ("n1", "n2", "n3")
MQTT_PORT = 1883
PEER_PORT = 18830
NODE_TIMEOUT = 6.0
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
CLOCK_NODE = "n1"
"""The node whose wall clock the nemesis can move (`set_clock`): it runs under libfaketime,
which reads the offset from a file at most once a second; its monotonic clock is left alone,
as a real clock step leaves it."""
BROKER_DISK_MIB = 512
"""The broker's store: a tmpfs this size (its files are sparse and mapped: a few MiB used)."""


class NemesisCluster:
    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.net = Network()
        self.name = f"nem{uuid.uuid4().hex[:6]}"
        self.secret = secrets.token_hex(32)
        self.redis: LocalSentinelRedis | None = None
        self.mq: LocalRocketMQ | None = None
        self.nodes: dict[str, BridgeProcess] = {}
        self.lb: LocalHAProxy | None = None
        self.broker_disk: Path | None = None
        """The broker's store directory, a tmpfs of its own."""
        self._mounted: list[Path] = []
        self.clock_file = work_dir / f"{CLOCK_NODE}-clock"

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> NemesisCluster:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        net = self.net.start(["redis", "mq", *NODES])
        self.redis = LocalSentinelRedis(
            self.work_dir / "redis",
            host=net.addr("redis"),
            netns=net.netns("redis"),
            replicas=2,
            min_replicas=1,  # as the nodes' redis_wait_replicas
            auth=RedisAuth(
                password=secrets.token_urlsafe(18), sentinel_password=secrets.token_urlsafe(18)
            ),
        ).start()
        self.broker_disk = self._mount_broker_disk(self.work_dir / "mq" / "store")
        self.mq = LocalRocketMQ(
            self.work_dir / "mq", host=net.addr("mq"), netns=net.netns("mq"), timer=False, acl=True
        ).start()
        for node_id in NODES:
            self.nodes[node_id] = self._node(node_id).start()
        for node_id, node in self.nodes.items():
            for other in NODES:
                if other != node_id:
                    node.wait_for_log(f"peer link to {other} up", 30)
        self.lb = LocalHAProxy(
            self.work_dir / "lb", None, [self.node_address(n) for n in NODES]
        ).start()
        for node_id in NODES:
            self.lb.wait_for_status(self.node_address(node_id), "UP", 15)

    def _mount_broker_disk(self, store: Path) -> Path:
        """The broker's store on a tmpfs of its own (`BROKER_DISK_MIB`), so a fault can fill it
        (`faults.broker-disk-full`) without filling the machine's disk."""
        store.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                "mount",
                "-t",
                "tmpfs",
                "-o",
                f"size={BROKER_DISK_MIB}m,mode=0755",
                "tmpfs",
                str(store),
            ],
            check=True,
        )
        self._mounted.append(store)
        return store

    def _node(self, node_id: str) -> BridgeProcess:
        assert self.redis is not None and self.mq is not None
        data_dir = self.work_dir / node_id / "data"
        data_dir.mkdir(parents=True, exist_ok=True)
        host = self.net.addr(node_id)
        settings = [
            "store=rocketmq",
            f"rocketmq_namesrv={self.mq.namesrv_addr}",
            *self.mq.node_settings(self.work_dir / node_id / "secrets"),
            f"rocketmq_namespace={self.name}",
            f"cluster_name={self.name}",
            f"node_id={node_id}",
            f"peer_listen={host}:{PEER_PORT}",
            f"cluster_secret={self.secret}",
            *self.redis.bridge_settings(),
            # As docs/operations.md asks with Sentinel: a write the master could not copy to its
            # replica is not taken as done (an old master resumed after a failover takes writes
            # that vanish when the Sentinels demote it).
            "redis_wait_replicas=1",
            f"node_timeout={NODE_TIMEOUT:g}",
            "interest_grace=1",
            # The clients are the test's own, on a network that exists only on this machine.
            "allow_anonymous_public=true",
        ]
        faked: list[str] = []
        if node_id == CLOCK_NODE:
            self.set_clock(0)
            faked = [
                "env",
                f"LD_PRELOAD={LIBFAKETIME}",
                f"FAKETIME_TIMESTAMP_FILE={self.clock_file}",
                "FAKETIME_CACHE_DURATION=1",
                "FAKETIME_DONT_FAKE_MONOTONIC=1",
            ]
        return BridgeProcess(
            data_dir,
            *settings,
            port=MQTT_PORT,
            host=host,
            wrap=self.net.command(node_id, faked),
        )

    def set_clock(self, seconds: int) -> None:
        """CLOCK_NODE's wall clock runs `seconds` off the machine's from its next reading of
        the offset (within a second)."""
        tmp = self.clock_file.with_suffix(".tmp")
        tmp.write_text(f"{seconds:+d}\n")
        tmp.replace(self.clock_file)

    def stop(self) -> None:
        for node in self.nodes.values():
            node.kill()
        if self.lb is not None:
            self.lb.stop()
        if self.mq is not None:
            self.mq.stop(graceful=False)
        if self.redis is not None:
            self.redis.stop()
        for mounted in self._mounted:
            subprocess.run(["umount", "-l", str(mounted)], check=False)
        self._mounted.clear()
        self.net.stop()

    # -- addresses -------------------------------------------------------------------------
    @property
    def balancer(self) -> tuple[str, int]:
        """Where clients connect (HAProxy on the loopback of the root namespace)."""
        assert self.lb is not None
        return ("127.0.0.1", self.lb.frontend_port)

    def node_address(self, node_id: str) -> str:
        return f"{self.net.addr(node_id)}:{MQTT_PORT}"

    def node_endpoints(self) -> list[tuple[str, int]]:
        """Each node's MQTT listener, for clients that pick a node themselves."""
        return [(self.net.addr(n), MQTT_PORT) for n in NODES]

    def logs(self, lines: int = 40) -> str:
        """The end of every node's log, for a failure message."""
        parts = []
        for node_id, node in self.nodes.items():
            tail = "\n".join(node.log_text().splitlines()[-lines:])
            parts.append(f"--- {node_id} ---\n{tail}")
        return "\n".join(parts)
