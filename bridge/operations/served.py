"""What the admin API and the Prometheus exporter read of the server they serve: `Served`.

They are handed this role rather than `bridge.listeners.server.Server` itself, so the server
imports them and never the other way round.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from bridge.cluster.cluster import Cluster
    from bridge.node import Node
    from bridge.settings import Config


class Served(Protocol):
    """A running bridge server as operations see it."""

    config: Config
    node: Node
    cluster: Cluster | None
    notifier: Any
    """The embedded notify (`notify.core.Notifier`) when the node runs one, else None."""

    def metrics_text(self) -> bytes:
        """The node's metrics in the Prometheus text format."""
        ...
