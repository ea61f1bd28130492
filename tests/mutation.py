"""The pure rooms `make mutation` mutates (mutmut, see tests/README.md "Mutation testing"), the
unit tests that judge their mutants, and the pytest plugin that picks those tests and makes
hypothesis cheap enough to run them once per mutant. The plugin is loaded only there
(`-p tests.mutation` in pyproject's [tool.mutmut]); `make test` never sees it.

Tests are chosen by file name, not folder, so a test file keeps its room wherever under
tests/unit it lives: add a pattern here when a room gains a test file. mutmut then runs, for each
mutant, only the chosen tests that called the function it mutated.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings


@dataclass(frozen=True)
class Room:
    """A pure room: its mutants (mutmut names: module path, dots, then the function) and its
    own unit test files (name patterns)."""

    mutants: tuple[str, ...]
    tests: tuple[str, ...]


# In the order `make mutation` runs them: the small rooms first, the codec (the most mutants,
# the slowest property tests) last. pyproject's [tool.mutmut] only_mutate names the same files.
ROOMS: dict[str, Room] = {
    "router": Room(
        ("bridge.router.*",),
        ("test_trie*.py", "test_route_plan.py", "test_queues.py", "test_shared.py"),
    ),
    "session": Room(("bridge.session.*",), ("test_session.py",)),
    "access": Room(
        tuple(
            f"bridge.access.{module}.*"
            for module in (
                "acl",
                "reads",
                "ownership",
                "clientids",
                "bans",
                "ratelimit",
                "explain",
                "login_guard",
            )
        ),
        (
            "test_acl*.py",
            "test_bans.py",
            "test_ownership.py",
            "test_ratelimit.py",
            "test_login_queue.py",
        ),
    ),
    "spark": Room(
        ("spark.intervals.*", "spark.telemetry.*"), ("test_intervals.py", "test_telemetry.py")
    ),
    "mqtt": Room(
        ("bridge.mqtt.*",),
        ("test_codec*.py", "test_topics.py", "test_delayed_topics.py", "test_fields.py"),
    ),
}

# A property test runs once per mutant of every function it calls: a few dozen examples find
# what a wrong comparison or constant breaks; the full counts stay in `make test`. A mutant is
# killed by the first failing example: shrinking it (the slowest part of a failing property
# test, and nobody reads the example) is skipped.
MAX_EXAMPLES = int(os.environ.get("MUTATION_MAX_EXAMPLES", "30"))
PHASES = (Phase.explicit, Phase.reuse, Phase.generate)


def chosen(path: Path) -> bool:
    """True for a unit test file some room's patterns name."""
    return any(fnmatch(path.name, pattern) for room in ROOMS.values() for pattern in room.tests)


def pytest_configure(config: pytest.Config) -> None:
    settings.register_profile(
        "mutation",
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        phases=PHASES,
        suppress_health_check=[HealthCheck.too_slow],
    )
    settings.load_profile("mutation")


def pytest_ignore_collect(collection_path: Path) -> bool | None:
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return None if chosen(collection_path) else True
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests with settings of their own (`@settings(max_examples=...)`) get at most MAX_EXAMPLES,
    no shrinking and no deadline: a mutated function is slower (mutmut's trampoline) and a
    deadline would kill its mutants for time, not for a wrong answer. Hypothesis keeps a test's
    settings on this attribute; the profile alone does not reach tests that name their own."""
    for item in items:
        test = getattr(item, "obj", None)
        own = getattr(test, "_hypothesis_internal_use_settings", None)
        if isinstance(own, settings) and own.phases != PHASES:
            test._hypothesis_internal_use_settings = settings(  # type: ignore[union-attr]
                own,
                max_examples=min(own.max_examples, MAX_EXAMPLES),
                deadline=None,
                phases=PHASES,
            )
