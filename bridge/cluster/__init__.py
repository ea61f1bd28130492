"""The cluster: a registry in Redis (ClientId -> node, node membership), peer links between
nodes, and the replicated subscription interest. See docs/design.md ("Cluster")."""
