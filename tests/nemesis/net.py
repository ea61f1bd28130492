"""A network of hosts on one machine: each host a Linux network namespace with one veth into a
bridge of the root namespace, where the test process, the balancer and the clients live.

    net = Network().start(["redis", "mq", "n1", "n2", "n3"])
    net.addr("n1")                     # 10.213.N.21: what n1's processes bind to
    net.command("n1", ["python", ...]) # argv that runs inside n1's namespace
    net.cut("n1", "redis")             # packets between them dropped, both ways, silently
    cuts = net.isolate("n1")           # n1 cut from every host and from the root namespace
    net.uncut(cuts)                    # those cuts undone (others stay)
    net.heal()                         # every cut undone
    net.stop()                         # namespaces, veths and bridge deleted

Cuts are nftables rules in the host's own namespace that drop what it sends to and receives from
the other side: as on a real network, a cut connection sees no error, only silence, until a
keep-alive or a timeout notices. Nothing is routed outside the bridge's /24, which exists only
on this machine.
"""

from __future__ import annotations

import os
import re
import subprocess
import weakref
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import count
from pathlib import Path

ROOT = "root"
"""The root namespace's name in cuts: the test process, the balancer and the clients."""

_NETWORKS = count(0)
_NAME = re.compile(r"^n(\d+)[a-z]-")


def _run(*argv: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if result.returncode:
        raise RuntimeError(f"{' '.join(argv)} failed: {result.stderr.strip()}")


def _delete(namespaces: Sequence[str], bridge: str) -> None:
    """Delete what a Network made (at exit too, so an interrupted run leaves nothing)."""
    for name in namespaces:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
    subprocess.run(["ip", "link", "del", bridge], capture_output=True, timeout=30)


def _sweep_stale() -> None:
    """Delete the namespaces and bridges of Networks whose process is gone (killed before its
    exit could): their names carry its PID. Another live process's are left alone."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    for line in listed.stdout.splitlines():
        name = line.split(" ", 1)[0]
        match = _NAME.match(name)
        if match and not Path(f"/proc/{match.group(1)}").exists():
            prefix = name.split("-", 1)[0]
            _delete([name], f"{prefix}br")


def _free_subnet() -> str:
    """A 10.213.X prefix no interface of the root namespace has (another run's bridge)."""
    shown = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, timeout=30)
    taken = set(re.findall(r"inet 10\.213\.(\d+)\.", shown.stdout))
    start = os.getpid() % 250
    for step in range(250):
        third = (start + step) % 250 + 1
        if str(third) not in taken:
            return f"10.213.{third}"
    raise RuntimeError("no free 10.213.X.0/24 for a test network")


class Network:
    """Hosts in namespaces `{prefix}-{host}` on the bridge `{prefix}br`, where the prefix is
    this process's PID and a letter (test runs side by side never share a name), addresses in
    a 10.213.X.0/24 no other interface has."""

    def __init__(self) -> None:
        self.prefix = f"n{os.getpid()}{'abcdefghijklmnopqrstuvwxyz'[next(_NETWORKS) % 26]}"
        self.subnet = ""
        self.bridge = f"{self.prefix}br"
        self.hosts: dict[str, int] = {}  # host -> last octet of its address
        self.cuts: Counter[frozenset[str]] = Counter()
        self._finalizer = weakref.finalize(self, _delete, [], self.bridge)

    # -- addresses and commands --------------------------------------------------------------
    @property
    def gateway(self) -> str:
        """The root namespace's address on the bridge (where the balancer's checks come from)."""
        return f"{self.subnet}.1"

    def addr(self, host: str) -> str:
        return self.gateway if host == ROOT else f"{self.subnet}.{self.hosts[host]}"

    def netns(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    def command(self, host: str, argv: Sequence[str]) -> list[str]:
        """`argv` run inside `host`'s namespace (`ip netns exec` execs it: same PID)."""
        return ["ip", "netns", "exec", self.netns(host), *argv]

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, hosts: Iterable[str]) -> Network:
        hosts = list(hosts)
        _sweep_stale()
        self.subnet = _free_subnet()
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _delete, [], self.bridge)
        _run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for octet, host in enumerate(hosts, start=11):
            self._add_host(host, octet)
        self._finalizer.detach()
        self._finalizer = weakref.finalize(
            self, _delete, [self.netns(h) for h in self.hosts], self.bridge
        )
        return self

    def _add_host(self, host: str, octet: int) -> None:
        ns, outside, inside = self.netns(host), f"{self.prefix}{octet}", f"{self.prefix}{octet}i"
        _run("ip", "netns", "add", ns)
        self.hosts[host] = octet
        _run("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
        _run("ip", "link", "set", inside, "netns", ns)
        _run("ip", "link", "set", outside, "master", self.bridge)
        _run("ip", "link", "set", outside, "up")
        _run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        _run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{self.addr(host)}/24", "dev", inside)
        _run("ip", "netns", "exec", ns, "ip", "link", "set", inside, "up")
        # Drops are rules in this table; an empty table lets everything through.
        self._nft(host, "add table inet nemesis")
        self._nft(host, "add chain inet nemesis in { type filter hook input priority 0 ; }")
        self._nft(host, "add chain inet nemesis out { type filter hook output priority 0 ; }")

    def stop(self) -> None:
        self._finalizer()

    # -- faults ----------------------------------------------------------------------------
    def cut(self, host: str, other: str) -> frozenset[str]:
        """Drop every packet between `host` and `other` (ROOT: the root namespace, where the
        balancer and the clients are), both ways, until `uncut` of what this returns (cuts
        count: two faults cutting one pair both have to end)."""
        pair = frozenset((host, other))
        self.cuts[pair] += 1
        if self.cuts[pair] == 1:
            self._render({host, other} - {ROOT})
        return pair

    def uncut(self, pairs: Iterable[frozenset[str]]) -> None:
        """End cuts `cut` made; the others stay."""
        touched: set[str] = set()
        for pair in pairs:
            self.cuts[pair] -= 1
            if self.cuts[pair] <= 0:
                del self.cuts[pair]
                touched |= pair
        self._render(touched - {ROOT})

    def isolate(self, host: str) -> list[frozenset[str]]:
        """Cut `host` from every other host and from the root namespace."""
        return [self.cut(host, other) for other in [*self.hosts, ROOT] if other != host]

    def split(self, side: Iterable[str], other_side: Iterable[str]) -> list[frozenset[str]]:
        """Cut every host of `side` from every host of `other_side`."""
        others = list(other_side)
        return [self.cut(host, other) for host in side for other in others]

    def heal(self) -> None:
        """Undo every cut: established connections that outlived them carry on."""
        self.cuts.clear()
        self._render(set(self.hosts))

    def _render(self, hosts: Iterable[str]) -> None:
        """Rewrite the drop rules of `hosts` from `cuts`, each host's in one nft transaction
        (no moment without the cuts that stay)."""
        for host in hosts:
            lines = ["flush chain inet nemesis in", "flush chain inet nemesis out"]
            for pair in self.cuts:
                if host in pair:
                    (far,) = pair - {host}
                    address = self.addr(far)
                    lines.append(f"add rule inet nemesis out ip daddr {address} drop")
                    lines.append(f"add rule inet nemesis in ip saddr {address} drop")
            result = subprocess.run(
                ["ip", "netns", "exec", self.netns(host), "nft", "-f", "-"],
                input="\n".join(lines) + "\n",
                capture_output=True,
                text=True,
                timeout=30,
            )
            if result.returncode:
                raise RuntimeError(f"nft in {host} failed: {result.stderr.strip()}")

    def _nft(self, host: str, rule: str) -> None:
        _run("ip", "netns", "exec", self.netns(host), "nft", rule)
