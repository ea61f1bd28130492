"""What operators see and use: the admin HTTP API and its OpenAPI document, metrics and their
Prometheus exposition, `$SYS` statistics and client events, and per-client metering."""
