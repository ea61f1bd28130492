"""`mqtt-bridge` / `python -m bridge`: run one bridge node."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from bridge import __version__
from bridge.checks import load_config
from bridge.logtext import EscapingFilter
from bridge.private_files import PROCESS_UMASK
from bridge.redact import shown
from bridge.settings import ENV_PREFIX, SETTINGS, Config, ConfigError


def build_parser() -> argparse.ArgumentParser:
    """The command line; every setting can also come from a TOML file or the environment."""
    defaults = Config()
    epilog_lines = ["settings (TOML key, env var MQTT_BRIDGE_<NAME>, default):"]
    for name, doc in SETTINGS.items():
        epilog_lines.append(f"  {name:<26} {doc} [default: {getattr(defaults, name)}]")
    parser = argparse.ArgumentParser(
        prog="mqtt-bridge",
        description=(
            "MQTT-Bridge: an MQTT 3.1.1 and 5.0 broker node with durable storage, "
            "clustered over Redis and RocketMQ."
        ),
        epilog="\n".join(epilog_lines),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", metavar="FILE", help="TOML file ([bridge] table or top level)")
    parser.add_argument(
        "--listen", metavar="HOST:PORT", action="append", help="listener; repeatable"
    )
    parser.add_argument("--data-dir", metavar="DIR", help="directory of the embedded store")
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--node-id", help="this node's id")
    parser.add_argument(
        "--set",
        metavar="NAME=VALUE",
        action="append",
        default=[],
        help="any other setting, e.g. --set max_inflight=64; repeatable",
    )
    parser.add_argument("--print-config", action="store_true", help="print the settings and exit")
    parser.add_argument("--version", action="version", version=f"mqtt-bridge {__version__}")
    return parser


def load_with_overrides(
    prog: str, config_file: str | None, overrides: dict[str, object], items: list[str]
) -> Config | None:
    """The configuration from a file, `overrides` and `--set NAME=VALUE` items; None (after an
    error message on stderr) if an item or a value is bad."""
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            print(f"{prog}: error: --set expects NAME=VALUE, got {item!r}", file=sys.stderr)
            return None
        overrides[name.strip().replace("-", "_")] = value
    try:
        return load_config(config_file, overrides=overrides)
    except ConfigError as exc:
        print(f"{prog}: configuration error: {exc}", file=sys.stderr)
        return None


async def _cancel_the_rest(wait: float) -> None:
    """Cancel every other task of a start that failed, again and again until they end or `wait`
    seconds passed: redis-py (8.1) swallows a cancel that lands while it connects, and the
    single cancel of `asyncio.run`'s clean-up would then wait for ever."""
    loop = asyncio.get_running_loop()
    current = asyncio.current_task()
    deadline = loop.time() + wait
    while loop.time() < deadline:
        rest = [task for task in asyncio.all_tasks() if task is not current and not task.done()]
        if not rest:
            return
        for task in rest:
            task.cancel()
        await asyncio.wait(rest, timeout=0.1)


def run_server(config: Config, prog: str, *, serve_mqtt: bool = True) -> int:
    """Configure logging and run a Server until SIGTERM/SIGINT; the process exit code."""
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for handler in logging.getLogger().handlers:
        handler.addFilter(EscapingFilter())  # one record, one line, whatever it quotes
    from bridge.cluster.redis_access import RedisSetupError
    from bridge.listeners.server import Server
    from bridge.storage.base import StoreUnavailable

    async def run() -> None:
        try:
            await Server(config, serve_mqtt=serve_mqtt).serve()
        except RedisSetupError:
            await _cancel_the_rest(5.0)
            raise

    try:
        import uvloop

        uvloop.run(run())
    except ImportError:  # pragma: no cover - uvloop is a dependency; fall back for odd platforms
        asyncio.run(run())
    except (OSError, StoreUnavailable) as exc:
        # StoreUnavailable: the store cannot open (RocketMQ unreachable, credentials refused);
        # its message names the cause and the setting, a traceback would add nothing.
        logging.getLogger(prog).error("cannot start: %s", exc)
        return 1
    except RedisSetupError as exc:  # refused credentials, TLS: the message names the setting
        logging.getLogger(prog).error("cannot start: %s", exc)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, configure logging, run the server until SIGTERM/SIGINT."""
    args = build_parser().parse_args(argv)
    overrides: dict[str, object] = {
        "listen": args.listen,
        "data_dir": args.data_dir,
        "log_level": args.log_level,
        "node_id": args.node_id,
    }
    config = load_with_overrides("mqtt-bridge", args.config, overrides, args.set)
    if config is None:
        return 2
    # Files libraries write under data_dir are private too (bridge.private_files).
    os.umask(PROCESS_UMASK)
    if args.print_config:
        for name in SETTINGS:
            print(f"{name} = {shown(name, getattr(config, name))!r}")
        return 0
    from bridge.access.acl import AclError
    from bridge.access.hashes import AuthConfigError
    from bridge.cluster.peer_auth import PeerTLSConfigError
    from bridge.listeners.server import Server
    from bridge.listeners.tls import TLSConfigError

    try:
        Server.check(config)
    except (AuthConfigError, AclError, TLSConfigError, PeerTLSConfigError) as exc:
        print(f"mqtt-bridge: configuration error: {exc}", file=sys.stderr)
        return 2
    return run_server(config, "bridge")


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["ENV_PREFIX", "main"]
