"""Start-up, the main loop and shutdown of one bridge node, in a clear order.

Start: open the store and restore state (node), then listen. Stop (SIGTERM/SIGINT): stop
accepting, close client connections (their queued bytes are flushed), wait for pending store
writes up to `drain_timeout`, then close the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bridge.access import AccessControl
from bridge.listeners.connection import Connection
from bridge.mqtt.reasons import ReasonCode
from bridge.node import Node
from bridge.operations.memory import HeapTrimmer
from bridge.private_files import secure_data_dir
from bridge.settings import Config, parse_listen
from bridge.state import KIND_ONLINE
from bridge.storage.base import MessageStore, MetaUpdate, StoreUnavailable

if TYPE_CHECKING:
    from bridge.operations.prometheus import Exporter

log = logging.getLogger("bridge.server")


def make_store(config: Config, session_meta: Any = None) -> MessageStore:
    """The storage backend named by `config.store` (`session_meta`: a cluster's registry)."""
    if config.store == "filelog":
        from bridge.storage.filelog import FileLogStore

        return FileLogStore(
            Path(config.data_dir),
            segment_bytes=config.segment_bytes,
            retention_bytes=config.retention_bytes,
            retention_seconds=config.retention_seconds,
            fsync=config.fsync,
            sync_interval=config.sync_interval_ms / 1000 if config.sync == "interval" else 0.0,
            inline_commit_seconds=config.inline_commit_ms / 1000,
            preallocate_bytes=config.segment_preallocate_bytes,
        )
    if config.store == "rocketmq":
        from bridge.storage.rocketmq import RocketMQStore, rocketmq_security

        credentials, tls = rocketmq_security(config)
        return RocketMQStore(
            config.rocketmq_namesrv,
            Path(config.data_dir),
            node_id=config.resolved_node_id(),
            namespace=config.rocketmq_namespace,
            send_timeout=config.rocketmq_send_timeout,
            held_reads=config.rocketmq_held_reads,
            fsync=config.fsync,
            session_meta=session_meta,
            credentials=credentials,
            tls=tls,
        )
    raise ValueError(f"unknown store {config.store!r}")


class Server:
    """Owns the node and its listeners."""

    def __init__(
        self, config: Config, store: MessageStore | None = None, *, serve_mqtt: bool = True
    ) -> None:
        """`serve_mqtt=False` runs a cluster member without MQTT listeners and sessions: the
        standalone notify (`python -m notify`)."""
        self.config = config
        self.serve_mqtt = serve_mqtt
        self.cluster: Any = None
        registry = None
        if config.clustered:
            from bridge.cluster.redis_access import RedisAccess
            from bridge.cluster.registry import RedisRegistry, redis_client

            access = RedisAccess.from_config(config)
            registry = RedisRegistry(
                redis_client(access),
                config.cluster_name,
                config.resolved_node_id(),
                wait_replicas=config.redis_wait_replicas,
                wait_timeout=config.redis_timeout / 3,
                access=access,
            )
        self.node = Node(config, store if store is not None else make_store(config, registry))
        if registry is not None:
            from bridge.cluster.cluster import Cluster

            self.cluster = Cluster(self.node, registry, config, holds_sessions=serve_mqtt)
            server_ssl = self.cluster.auth.server_ssl
            if server_ssl is not None:
                from bridge.listeners.tls import TLSAcceptor

                # Failed TLS handshakes on the peer port are counted and logged like those of
                # the MQTT listeners (the event loop alone would not say a word).
                self.cluster.accept_tls = TLSAcceptor(
                    server_ssl,
                    handshake_timeout=config.peer_handshake_timeout,
                    log_interval=config.tls_failure_log_interval,
                    metrics=self.node.metrics,
                ).factory
            self.node.join(self.cluster)
        self.listeners: list[asyncio.base_events.Server] = []
        self._stop = asyncio.Event()
        self.notifier: Any = None
        self.admin: Any = None
        """The admin HTTP API (`bridge.operations.admin.AdminAPI`) when `admin_listen` is set."""
        metrics = self.node.metrics
        self.heap = HeapTrimmer(
            config.memory_trim_interval, lambda: metrics.bytes_in + metrics.get("bytes_out")
        )

    async def start(self) -> None:
        """Restore state, then accept connections on every configured listener."""
        if not self.config.fsync:
            log.warning("fsync is OFF: acknowledged messages can be lost on power failure")
        elif self.config.sync == "interval" and self.config.store == "filelog":
            log.info(
                "sync = interval: a PUBACK/PUBREC means written to the OS and synced within "
                "%g ms (a kill -9 of this process loses nothing; a power loss may lose that "
                "window)",
                self.config.sync_interval_ms,
            )
        secure_data_dir(Path(self.config.data_dir))
        await self.node.start()
        if self.cluster is not None:
            await self.cluster.start()
            if self.serve_mqtt:
                await self.cluster.wait_synced(self.config.node_timeout)
        await self._start_notify()
        # Everything loaded so far lives as long as the process: keep it out of the garbage
        # collector's full passes, whose length is what pauses the event loop.
        gc.collect()
        gc.freeze()
        # Fewer, not longer, collections: a broker allocates short-lived objects per packet,
        # and under load the default thresholds run a full pass several times a second.
        gc.set_threshold(10_000, 50, 50)
        self.heap.start()
        if self.serve_mqtt:
            from bridge.listeners.exposure import describe_exposure
            from bridge.listeners.tls import TLSAcceptor, server_context

            config = self.config
            context = server_context(config)
            tls = (
                None
                if context is None
                else TLSAcceptor(
                    context,
                    handshake_timeout=config.connect_timeout,
                    log_interval=config.tls_failure_log_interval,
                    metrics=self.node.metrics,
                )
            )

            def connections(kind: str) -> Callable[[], asyncio.Protocol]:
                def factory() -> asyncio.Protocol:
                    conn = Connection(self.node)
                    conn.listener = kind
                    return conn

                return factory

            def secured(factory: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
                return factory if tls is None else tls.factory(factory)

            metrics = self.node.metrics
            kinds = [
                ("MQTT", config.listen, connections("tcp")),
                ("MQTT over TLS", config.tls_listen, secured(connections("tls"))),
            ]
            if config.ws_listen or config.wss_listen:
                # wsproto (2 MiB resident) only for a node with WebSocket listeners.
                from bridge.listeners.websocket import websocket_factory

                kinds += [
                    (
                        "MQTT over WebSocket",
                        config.ws_listen,
                        websocket_factory(connections("ws"), config, metrics),
                    ),
                    (
                        "MQTT over secure WebSocket",
                        config.wss_listen,
                        secured(websocket_factory(connections("wss"), config, metrics)),
                    ),
                ]
            log.log(*describe_exposure(config))
            loop = asyncio.get_running_loop()
            for what, addresses, factory in kinds:
                for address in addresses:
                    host, port = parse_listen(address)
                    listener = await loop.create_server(
                        factory,
                        host,
                        port,
                        backlog=4096,
                        reuse_address=True,
                        reuse_port=config.reuse_port or None,
                    )
                    self.listeners.append(listener)
                    for sock in listener.sockets:
                        log.info("listening for %s on %s:%s", what, *sock.getsockname()[:2])
        if self.config.admin_listen:
            from bridge.operations.admin import AdminAPI

            self.admin = AdminAPI(self)
            await self.admin.start()

    async def _start_notify(self) -> None:
        """With the RocketMQ store, run notify in this node unless it runs on its own."""
        if self.config.store != "rocketmq":
            return  # and the RocketMQ client (6 MiB resident) is never imported
        from bridge.storage.rocketmq.store import RocketMQStore

        store = self.node.store
        if not isinstance(store, RocketMQStore):
            return
        if not self.config.notify and self.serve_mqtt:
            log.info("notify is not embedded (notify=false): a separate notify must run")
            return
        from notify.embedded import embedded_notifier

        self.notifier = embedded_notifier(self.node, store)
        await self.notifier.start()
        log.info("notify embedded: consumer group %s", self.notifier.group)

    @cached_property
    def exporter(self) -> Exporter:
        """The Prometheus exposition of this server's metrics (prometheus_client is imported on
        the first scrape: 2 MiB a node that is never scraped does not hold)."""
        from bridge.operations.prometheus import Exporter

        return Exporter(self)

    def metrics_text(self) -> bytes:
        """The metrics in the Prometheus text format (the admin API's /metrics)."""
        return self.exporter.text()

    @staticmethod
    def check(config: Config) -> None:
        """Fail early, before anything starts, on settings that only load at run time
        (raises the loader's error, e.g. AuthConfigError for a bad password file,
        TLSConfigError for a bad certificate, key or CA file)."""
        from bridge.listeners.tls import server_context

        AccessControl(config)
        server_context(config)
        if config.clustered:
            from bridge.cluster.peer_auth import peer_auth

            peer_auth(config)  # PeerTLSConfigError for a bad peer certificate, key or CA

    def request_stop(self) -> None:
        """Begin an orderly shutdown (signal handlers call this)."""
        self._stop.set()

    async def serve(self) -> None:
        """Run until `request_stop`, then shut down."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.request_stop)
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGHUP, self.reload)
        await self.start()
        await self._stop.wait()
        await self.shutdown()

    def reload(self) -> None:
        """SIGHUP: re-read the password and ACL files; a bad file keeps the old one in force."""
        errors = self.node.access.reload()
        for error in errors:
            log.error("%s", error)
        if not errors:
            log.info("reloaded the password and ACL files")
        if self.cluster is not None:
            self.cluster.auth.reload_keys(self.config)

    async def shutdown(self) -> None:
        """Stop accepting, close clients, flush and close the store."""
        log.info("shutting down")
        if self.admin is not None:
            self.admin.ready = False  # /ready answers 503 from now on, through the drain
        node = self.node
        node.accepting = False
        for listener in self.listeners:
            listener.close()
        # A node shutting down is not a client failing: no wills, and no "online" records left
        # behind for the next start to treat as crashed clients.
        online = list(node.connections)
        reference = self.config.server_reference
        if not reference and self.cluster is not None:
            reference = self.cluster.another_node()
        for conn in list(node.connections.values()):
            conn.will = None
            conn.close(
                "server shutting down",
                log_it=False,
                reason_code=ReasonCode.SERVER_SHUTTING_DOWN,
                server_reference=reference,
            )
        if online:
            await node.persist_quietly([MetaUpdate(KIND_ONLINE, cid, None) for cid in online])
        for listener in self.listeners:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(listener.wait_closed(), self.config.drain_timeout)
        if self.cluster is not None:
            # Hand off: offsets durable first, then the survivors take over the sessions.
            with contextlib.suppress(StoreUnavailable):
                await node.housekeeper.flush_offsets(durable=True)
            await self.cluster.stop()
        if self.notifier is not None:
            await self.notifier.stop()
        await node.stop()
        await self.heap.stop()
        if self.admin is not None:
            await self.admin.stop()
        log.info("stopped")
