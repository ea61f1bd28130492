"""`python -m notify`: notify on its own, for a cluster whose nodes run with `notify=false`.

It joins the cluster like a node (Redis membership, peer links; the nodes replay their
subscription interest to it) but serves no MQTT clients and holds no sessions. It consumes every
first-level RocketMQ topic in the notify consumer group and tells only the nodes that have readers
of a light queue that the queue grew; messages produced straight into RocketMQ by backends are
routed into the subscribers' light queues, as the embedded notify does.

It reads the nodes' settings (file, `MQTT_BRIDGE_*` environment, `--set`), RocketMQ's included:
with a secured RocketMQ it signs as `rocketmq_access_key` and connects over TLS with
`rocketmq_tls*` like a node (docs/operations.md, "Securing a cluster: RocketMQ").
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

from bridge.__main__ import load_with_overrides, run_server


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m notify",
        description="notify for an MQTT-Bridge cluster (see `python -m bridge --help` for the "
        "settings; it needs redis_url or redis_sentinels and store=rocketmq).",
    )
    parser.add_argument("--config", metavar="FILE", help="TOML file, as the nodes use")
    parser.add_argument("--data-dir", metavar="DIR", help="directory for its small local state")
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--node-id", help="its member id (default notify-<hostname>-<pid>)")
    parser.add_argument(
        "--set", metavar="NAME=VALUE", action="append", default=[], help="any setting; repeatable"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    overrides: dict[str, object] = {
        "data_dir": args.data_dir,
        "log_level": args.log_level,
        "node_id": args.node_id or f"notify-{socket.gethostname()}-{os.getpid()}",
        "store": "rocketmq",
    }
    config = load_with_overrides("notify", args.config, overrides, args.set)
    if config is None:
        return 2
    if not config.clustered:
        print(
            "notify: configuration error: redis_url or redis_sentinels is needed (notify finds "
            "the nodes and their subscriptions through the cluster)",
            file=sys.stderr,
        )
        return 2
    config.notify = True
    from bridge.cluster.peer_auth import PeerTLSConfigError, peer_auth

    try:
        peer_auth(config)
    except PeerTLSConfigError as exc:
        print(f"notify: configuration error: {exc}", file=sys.stderr)
        return 2
    return run_server(config, "notify", serve_mqtt=False)


if __name__ == "__main__":
    sys.exit(main())
