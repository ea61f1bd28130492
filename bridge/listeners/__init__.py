"""Where clients come in: the server (start-up and shutdown), the per-connection protocol, and
the TLS and WebSocket listeners that end in the same `Connection`."""
