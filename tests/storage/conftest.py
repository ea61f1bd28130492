"""Fixtures of the storage contract suite: every backend runs the same tests.

Tests are synchronous and drive one event loop (uvloop, as the broker does) through `run`, which
keeps the loop alive between calls so background work (group commits) carries on. A backend is
added by registering a factory in `BACKENDS`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import uvloop

from bridge.storage import FileLogStore, MessageStore

T = TypeVar("T")
Run = Callable[[Coroutine[Any, Any, T]], T]


def _filelog(path: Path, **options: Any) -> MessageStore:
    return FileLogStore(path, **options)


BACKENDS: dict[str, Callable[..., MessageStore]] = {"filelog": _filelog}
"""Backend name -> factory(data path, **options). Options a backend does not know are dropped."""


class StoreFactory:
    """Opens a backend's store on one data location and can reopen it (a restart)."""

    def __init__(self, backend: str, path: Path) -> None:
        self.backend = backend
        self.path = path
        self.current: MessageStore | None = None
        self.options: dict[str, Any] = {}

    async def open(self, **options: Any) -> MessageStore:
        """Open the store (closing the current one first); `options` stick for reopens."""
        await self.close()
        self.options.update(options)
        store = BACKENDS[self.backend](self.path, **self.options)
        await store.open()
        self.current = store
        return store

    async def reopen(self) -> MessageStore:
        """Close the store cleanly and open it again on the same data."""
        return await self.open()

    async def close(self) -> None:
        if self.current is not None:
            store, self.current = self.current, None
            await store.close()


@pytest.fixture
def run() -> Iterator[Run[Any]]:
    """Run a coroutine to completion on the test's event loop (kept between calls)."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        yield runner.run


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_factory(backend: str, tmp_path: Path, run: Run[Any]) -> Iterator[StoreFactory]:
    factory = StoreFactory(backend, tmp_path / "store")
    yield factory
    run(factory.close())


@pytest.fixture
def store(store_factory: StoreFactory, run: Run[Any]) -> MessageStore:
    """An open store of the backend under test."""
    opened: MessageStore = run(store_factory.open())
    return opened
