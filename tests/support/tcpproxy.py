"""A fault-injecting TCP proxy on loopback, for peer links between bridge nodes.

    proxy = TcpProxy(target_port).start()   # listens on proxy.port, forwards to target_port
    proxy.frames["Forward"]                   # peer-link frames seen, by type (both directions)
    proxy.cut(); ...; proxy.heal()            # drop all connections, refuse new ones; then allow
    proxy.sent[0]                             # the first bytes each connection's client sent
    TcpProxy(target_port, delay=0.2)          # every byte arrives 0.2 s late (a slow network)

It runs its own event loop in a thread, so a test can use it between real node processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter

from bridge.cluster.wire import PeerDecoder, PeerProtocolError
from tests.support.processes import free_port

CAPTURE = 4096
"""Bytes of each connection's client side kept in `TcpProxy.sent`."""


class TcpProxy:
    """Forwards 127.0.0.1:`port` to 127.0.0.1:`target_port`; counts peer-link frames."""

    def __init__(self, target_port: int, port: int | None = None, delay: float = 0.0) -> None:
        self.target_port = target_port
        self.delay = delay
        self.port = port or free_port()
        self.frames: Counter[str] = Counter()
        self.sent: list[bytearray] = []
        """Per connection, the first `CAPTURE` bytes its client sent (a handshake transcript)."""
        self._lock = threading.Lock()
        self._cut = False
        self._stopping = False
        self._loop = asyncio.new_event_loop()
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.base_events.Server | None = None

    def start(self) -> TcpProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(5)
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def cut(self) -> None:
        """Drop every proxied connection now and refuse new ones until `heal`."""
        self._cut = True
        asyncio.run_coroutine_threadsafe(self._close_all(stop=False), self._loop).result(5)

    def heal(self) -> None:
        self._cut = False

    def count(self, frame_type: str) -> int:
        with self._lock:
            return self.frames[frame_type]

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def _close_all(self, stop: bool) -> None:
        for writer in list(self._writers):
            with contextlib.suppress(Exception):
                writer.transport.abort()
        self._writers.clear()
        if stop and self._server is not None:
            self._server.close()

    async def _shutdown(self) -> None:
        """Close the listener and every connection, and let each connection's task finish and
        close its transports before the loop stops. The tasks are not cancelled: asyncio's
        server callback neither closes the client's transport of a cancelled task nor keeps
        quiet about it, and a transport left to the garbage collector surfaces as an "unclosed
        transport" warning in whichever later test happens to collect it."""
        self._stopping = True
        await self._close_all(stop=True)
        current = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not current]
        if tasks:
            _done, stuck = await asyncio.wait(tasks, timeout=3)
            for task in stuck:
                task.cancel()
            await asyncio.gather(*stuck, return_exceptions=True)
        await self._close_all(stop=True)
        for _ in range(3):  # an aborted transport closes its socket one loop turn later
            await asyncio.sleep(0)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Forward one connection; whatever ends it (either side, a cut, a stop), both of its
        transports are aborted on the way out."""
        self._writers.add(writer)
        up_writer: asyncio.StreamWriter | None = None
        try:
            if self._cut or self._stopping:
                return
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
            except OSError:
                return
            self._writers.add(up_writer)
            if self._cut or self._stopping:  # cut or stopped while the upstream connection opened
                return
            capture = bytearray()
            self.sent.append(capture)
            await asyncio.gather(
                self._pipe(reader, up_writer, capture),
                self._pipe(up_reader, writer),
                return_exceptions=True,
            )
        finally:
            for w in (writer, up_writer):
                if w is not None:
                    self._writers.discard(w)
                    w.transport.abort()

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        capture: bytearray | None = None,
    ) -> None:
        decoder = PeerDecoder()
        counting = True
        while True:
            data = await reader.read(65536)
            if not data or self._cut:
                writer.transport.abort()
                return
            if capture is not None and len(capture) < CAPTURE:
                capture += data[: CAPTURE - len(capture)]
            if counting:
                decoder.receive_data(data)
                try:
                    frames = decoder.frames()
                except PeerProtocolError:
                    counting = False  # not a peer link: just forward
                    frames = []
                with self._lock:
                    for frame in frames:
                        self.frames[type(frame).__name__] += 1
            if self.delay:
                self._loop.call_later(self.delay, _write_quietly, writer, data)  # keeps order
            else:
                writer.write(data)
                await writer.drain()


def _write_quietly(writer: asyncio.StreamWriter, data: bytes) -> None:
    with contextlib.suppress(Exception):
        if not writer.transport.is_closing():
            writer.write(data)
