"""Fixtures of the storage contract suite: every backend runs the same tests.

Tests are synchronous and drive one event loop (uvloop, as the broker does) through `run`, which
keeps the loop alive between calls so background work (group commits) carries on. A backend is
added by registering a factory in `BACKENDS`.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import uvloop

from bridge.storage import FileLogStore, MessageStore
from bridge.storage.base import ReadResult
from bridge.storage.rocketmq import Credentials, TlsOptions
from bridge.storage.rocketmq.store import RocketMQStore

T = TypeVar("T")
Run = Callable[[Coroutine[Any, Any, T]], T]


def _filelog(path: Path, **options: Any) -> MessageStore:
    return FileLogStore(path, **options)


def _filelog_interval(path: Path, **options: Any) -> MessageStore:
    """The embedded store with `sync = interval` (10 ms): acknowledged once written."""
    return FileLogStore(path, **{"sync_interval": 0.01, **options})


def _rocketmq(
    path: Path,
    *,
    namesrv: str,
    credentials: Credentials | None = None,
    tls: TlsOptions | None = None,
    **options: Any,
) -> MessageStore:
    # One namespace per store location: tests sharing the session's broker never see each
    # other's queues, and a reopened store finds its own again.
    namespace = f"t{zlib.crc32(str(path).encode()):08x}-"
    return RocketMQStore(
        namesrv, path, namespace=namespace, node_id="contract", credentials=credentials, tls=tls
    )


BACKENDS: dict[str, Callable[..., MessageStore]] = {
    "filelog": _filelog,
    "filelog-interval": _filelog_interval,
    "rocketmq": _rocketmq,
    "rocketmq-acl-tls": _rocketmq,
}
"""Backend name -> factory(data path, **options). Options a backend does not know are dropped.
`filelog-interval` is the embedded store under `sync = interval`, whose contract is the same.
`rocketmq-acl-tls` is RocketMQ with authentication on and TLS only: every request signed (the
send hot path's pre-built frames included), every connection TLS."""
NEEDS_ROCKETMQ = {"rocketmq": "rocketmq", "rocketmq-acl-tls": "secured_rocketmq"}
"""Backend -> the session fixture of the RocketMQ it runs on."""


class OnePartView:
    """A store seen through queue names: with one log (or one RocketMQ broker group, as here)
    every queue has exactly one part, and the contract is the same whatever the backend names
    its parts. Stored.queues come back as queue names too."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def part(self, queue: str) -> str:
        parts = self.store.parts(queue)
        assert len(parts) == 1, parts
        return parts[0]

    def end_offset(self, queue: str) -> int:
        return self.store.end_offset(self.part(queue))

    async def track_queue(self, queue: str) -> int:
        return await self.store.track_queue(self.part(queue))

    def note_end(self, queue: str, end: int) -> None:
        self.store.note_end(self.part(queue), end)

    def backlog(self, queue: str, offset: int) -> tuple[int, int]:
        return self.store.backlog(self.part(queue), offset)

    async def read(self, queue: str, offset: int, limit: int) -> ReadResult:
        return self._named(await self.store.read(self.part(queue), offset, limit))

    def read_cached(self, queue: str, offset: int, limit: int) -> ReadResult | None:
        result = self.store.read_cached(self.part(queue), offset, limit)
        return self._named(result) if result is not None else None

    def _named(self, result: ReadResult) -> ReadResult:
        of = self.store.queue_of_part
        for stored in result.messages:
            stored.queues = tuple(of(p) or p for p in stored.queues)
        return result


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
        return OnePartView(store)  # type: ignore[return-value]

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
def store_factory(
    backend: str, tmp_path: Path, run: Run[Any], request: pytest.FixtureRequest
) -> Iterator[StoreFactory]:
    factory = StoreFactory(backend, tmp_path / "store")
    if backend in NEEDS_ROCKETMQ:
        mq = request.getfixturevalue(NEEDS_ROCKETMQ[backend])
        factory.options["namesrv"] = mq.namesrv_addr
        if backend == "rocketmq-acl-tls":
            factory.options.update(credentials=mq.credentials, tls=mq.tls_options)
    yield factory
    run(factory.close())


@pytest.fixture
def store(store_factory: StoreFactory, run: Run[Any]) -> MessageStore:
    """An open store of the backend under test."""
    opened: MessageStore = run(store_factory.open())
    return opened
