"""The middle of a bridge node: sessions, publish and subscribe handling, delivery, housekeeping.

Its front door is `Node`; the modules behind it are the node's helpers, each handed only the
narrow role it needs (`bridge.node.roles`).
"""

from bridge.node.node import Node, Unsettled

__all__ = ["Node", "Unsettled"]
