"""Benchmark of topic matching: SubscriptionTrie (with and without cache) versus pygtrie.

Run: ``python tests/bench/trie_bench.py [--topics N] [--repeat R]``. Not a pytest test.

The table models a plant: 10,000 per-device command filters ``factory/line{n}/station{m}/cmd``
(100 lines x 100 stations) plus 100 wildcard filters of the shapes consoles, rule engines and
monitoring use. The publish stream is mostly device telemetry/commands (20,000 distinct topics,
chosen at random), some ``$SYS`` and some unmatched traffic.

The pygtrie contenders store the same table in a ``pygtrie.Trie`` keyed by the tuple of levels:

* ``pygtrie (public API)`` matches with a depth-first search over ``has_node``/``get``: each
  probe walks again from the root, since the public API has no node handles;
* ``pygtrie (node internals)`` walks pygtrie's private ``_root``/``children``/``value`` directly,
  which is the same algorithm as the hand-written trie on pygtrie's node objects.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pygtrie  # type: ignore[import-untyped]

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bridge.router.trie import SubscriptionTrie

Entry = tuple[str, dict[str, int]]
HAS_VALUE = pygtrie.Trie.HAS_VALUE
HAS_SUBTRIE = pygtrie.Trie.HAS_SUBTRIE
_NOVAL = pygtrie._NOVAL

LINES = 100
STATIONS = 100


# -- the table and the stream ---------------------------------------------------------------


def device_filters() -> list[tuple[str, str, int]]:
    return [
        (f"factory/line{n}/station{m}/cmd", f"dev-{n}-{m}", 1)
        for n in range(LINES)
        for m in range(STATIONS)
    ]


def wildcard_filters() -> list[tuple[str, str, int]]:
    filters: list[str] = []
    filters += [f"+/line{n}/#" for n in range(0, 100, 5)]  # 20 per-line rule engines
    filters += [f"factory/+/station{m}/#" for m in range(0, 100, 5)]  # 20 per-station views
    filters += [f"factory/line{n}/+/telemetry" for n in range(0, 100, 5)]  # 20 line dashboards
    filters += [f"factory/line{n}/station{n}/+" for n in range(20)]  # 20 debug taps
    filters += [f"$SYS/broker/+/node{i}" for i in range(10)]  # 10 $SYS monitors
    filters += [
        "factory/#",
        "#",
        "+/+/+/cmd",
        "+/+/+/telemetry",
        "factory/+/+/+",
        "$SYS/#",
        "alarms/#",
        "+/alarms",
        "factory/line3/#",
        "factory/line7/station7/#",
    ]
    assert len(filters) == 100
    return [(f, f"app-{i % 25}", i % 3) for i, f in enumerate(filters)]


def topic_stream(count: int, distinct: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    pool: list[str] = []
    while len(pool) < distinct:
        r = rng.random()
        n, m = rng.randrange(LINES), rng.randrange(STATIONS)
        if r < 0.60:
            pool.append(f"factory/line{n}/station{m}/telemetry")
        elif r < 0.90:
            pool.append(f"factory/line{n}/station{m}/cmd")
        elif r < 0.95:
            pool.append(f"$SYS/broker/load/node{rng.randrange(20)}")
        else:
            pool.append(f"other/site{n}/dev{m}")
    return [rng.choice(pool) for _ in range(count)]


# -- pygtrie contenders ---------------------------------------------------------------------


class PygtriePublic:
    """Filters in a pygtrie.Trie keyed by level tuples; matching through the public API."""

    def __init__(self) -> None:
        # Values are (filter, {subscriber: qos}) so matching need not rebuild filter strings.
        self.trie: pygtrie.Trie[str, Entry] = pygtrie.Trie()

    def subscribe(self, topic_filter: str, subscriber: str, qos: int) -> None:
        key = tuple(topic_filter.split("/"))
        entry = self.trie.get(key)
        if entry is None:
            entry = self.trie[key] = (topic_filter, {})
        entry[1][subscriber] = qos

    def match(self, topic: str) -> list[Entry]:
        levels = topic.split("/")
        n = len(levels)
        trie = self.trie
        has_node = trie.has_node
        get = trie.get
        out: list[Entry] = []

        def walk(prefix: tuple[str, ...], i: int, wild_ok: bool) -> None:
            # prefix is a node with a subtrie, matching levels[:i]
            if wild_ok:
                entry = get((*prefix, "#"))
                if entry is not None:
                    out.append(entry)
            if i == n:
                return
            for level in (levels[i], "+") if wild_ok else (levels[i],):
                key = (*prefix, level)
                flags = has_node(key)
                if flags & HAS_VALUE and i + 1 == n:
                    out.append(trie[key])
                if flags & HAS_SUBTRIE:
                    walk(key, i + 1, True)

        walk((), 0, not levels[0].startswith("$"))
        return out


class PygtrieInternals(PygtriePublic):
    """Same storage; matching walks pygtrie's private node objects (fragile, for comparison)."""

    def match(self, topic: str) -> list[Entry]:
        levels = topic.split("/")
        n = len(levels)
        out: list[Entry] = []

        def walk(node: Any, i: int) -> None:
            while True:
                children = node.children
                h = children.get("#")
                if h is not None and h.value is not _NOVAL:
                    out.append(h.value)
                if i == n:
                    if node.value is not _NOVAL:
                        out.append(node.value)
                    return
                p = children.get("+")
                if p is not None:
                    walk(p, i + 1)
                child = children.get(levels[i])
                if child is None:
                    return
                node = child
                i += 1

        root = self.trie._root
        first = levels[0]
        if first.startswith("$"):
            child = root.children.get(first)
            if child is not None:
                walk(child, 1)
        else:
            walk(root, 0)
        return out


# -- running --------------------------------------------------------------------------------


def build(factory: Callable[[], Any], table: list[tuple[str, str, int]]) -> tuple[Any, float]:
    start = time.perf_counter()
    router = factory()
    for topic_filter, subscriber, qos in table:
        router.subscribe(topic_filter, subscriber, qos)
    return router, time.perf_counter() - start


def time_per_call(fn: Callable[[str], object], topics: list[str], repeat: int) -> float:
    """Best-of-``repeat`` microseconds per call over the whole stream."""
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        start = time.perf_counter()
        for topic in topics:
            fn(topic)
        elapsed = time.perf_counter() - start
        gc.enable()
        best = min(best, elapsed)
    return best / len(topics) * 1e6


def normalise(result: list[Entry]) -> dict[str, dict[str, int]]:
    return {f: dict(subs) for f, subs in result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=100_000)
    parser.add_argument("--distinct", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    table = device_filters() + wildcard_filters()
    stream = topic_stream(args.topics, args.distinct)
    hot = topic_stream(args.topics, 1_000, seed=11)
    print(f"python {sys.version.split()[0]}, pygtrie {pygtrie.__version__}")
    print(f"table: {len(table)} filters")
    print(f"stream: {len(stream)} publishes over {args.distinct} distinct topics")
    print(f"hot stream: {len(hot)} publishes over 1000 distinct topics\n")

    nocache, t_nocache = build(lambda: SubscriptionTrie(cache_size=0), table)
    public, t_public = build(PygtriePublic, table)
    internals, t_internals = build(PygtrieInternals, table)
    assert isinstance(nocache, SubscriptionTrie)
    assert isinstance(public, PygtriePublic)
    assert isinstance(internals, PygtrieInternals)

    # All contenders must agree before their speed means anything.
    for topic in stream[:5_000] + hot[:1_000]:
        expected = normalise(nocache.match(topic))
        assert normalise(public.match(topic)) == expected, topic
        assert normalise(internals.match(topic)) == expected, topic
    matches = sum(len(nocache.match(t)) for t in stream) / len(stream)
    print(f"average matching filters per publish: {matches:.2f}\n")

    def cached(size: int) -> SubscriptionTrie:
        trie, _ = build(lambda: SubscriptionTrie(cache_size=size), table)
        assert isinstance(trie, SubscriptionTrie)
        return trie

    rows: list[tuple[str, float, float | None]] = []

    def row(
        name: str,
        match: Callable[[str], object],
        topics: list[str],
        repeat: int = args.repeat,
        build_s: float | None = None,
    ) -> None:
        # Timed here, in table order: each trie is built just before its first row.
        rows.append((name, time_per_call(match, topics, repeat), build_s))

    row("(a) SubscriptionTrie, no cache", nocache.match, stream, build_s=t_nocache)
    c4k = cached(4096)
    row("(b) SubscriptionTrie, cache 4096, 20k distinct", c4k.match, stream)
    c32k = cached(32768)
    row("(b) SubscriptionTrie, cache 32768, 20k distinct", c32k.match, stream)
    row("(a) SubscriptionTrie, no cache, hot stream", nocache.match, hot)
    row("(b) SubscriptionTrie, cache 4096, hot stream", c4k.match, hot)
    row("(c) pygtrie, public API", public.match, stream, 1, t_public)
    row("(c') pygtrie, node internals", internals.match, stream, build_s=t_internals)
    row("match_subscribers, no cache", nocache.match_subscribers, stream)
    row("match_subscribers, cache 4096", c4k.match_subscribers, stream)
    row("match_subscribers, cache 4096, hot stream", c4k.match_subscribers, hot)

    print(f"{'contender':<50} {'us/match':>9} {'build ms':>9}")
    for name, us, build_s in rows:
        built = f"{build_s * 1e3:9.1f}" if build_s is not None else f"{'':>9}"
        print(f"{name:<50} {us:9.2f} {built}")


if __name__ == "__main__":
    main()
