"""`python -m notify`: notify on its own, for a cluster whose nodes run with `notify=false`.

It joins the cluster like a node (Redis membership, peer links; the nodes replay their
subscription interest to it) but serves no MQTT clients and holds no sessions. It consumes every
first-level RocketMQ topic in the notify consumer group and tells only the nodes that have readers
of a light queue that the queue grew; messages produced straight into RocketMQ by backends are
routed into the subscribers' light queues, as the embedded notify does.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys

from bridge.config import ConfigError, load_config


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
    for item in args.set:
        name, sep, value = item.partition("=")
        if not sep:
            print(f"notify: error: --set expects NAME=VALUE, got {item!r}", file=sys.stderr)
            return 2
        overrides[name.strip().replace("-", "_")] = value
    try:
        config = load_config(args.config, overrides=overrides)
    except ConfigError as exc:
        print(f"notify: configuration error: {exc}", file=sys.stderr)
        return 2
    if not config.clustered:
        print(
            "notify: configuration error: redis_url or redis_sentinels is needed (notify finds "
            "the nodes and their subscriptions through the cluster)",
            file=sys.stderr,
        )
        return 2
    config.notify = True
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from bridge.server import Server

    async def run() -> None:
        await Server(config, serve_mqtt=False).serve()

    try:
        import uvloop

        uvloop.run(run())
    except ImportError:  # pragma: no cover - uvloop is a dependency
        asyncio.run(run())
    except OSError as exc:
        logging.getLogger("notify").error("cannot start: %s", exc)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
