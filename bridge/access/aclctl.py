"""Inspect ACL rules in a file or the cluster's Redis, and change those in Redis.

    python -m bridge.aclctl FILE list                       validate a rules file, print its rules
    python -m bridge.aclctl FILE explain ACTION CLIENTID TOPIC [--user USER]
    python -m bridge.aclctl redis://HOST:PORT/DB [--cluster NAME] list
    python -m bridge.aclctl redis://... add "allow user:alice publish sensors/%u/#" [--at N]
    python -m bridge.aclctl redis://... remove N
    python -m bridge.aclctl redis://... explain ACTION CLIENTID TOPIC [--user USER]

Rules in Redis are the list `<cluster>:acl` (syntax: `bridge.access.acl`); they apply after the
rules of `acl_file`. A change is checked before it is written, written in one transaction (retried
if another change came first), and announced on `<cluster>:access-changed`, so every node applies
it at once. `explain` prints the decision and the rule that made it. Rules are numbered from 1.

A Redis that asks for a password or TLS is reached with the node's settings, given as environment
variables: MQTT_BRIDGE_REDIS_USERNAME, MQTT_BRIDGE_REDIS_PASSWORD_FILE (or _PASSWORD),
MQTT_BRIDGE_REDIS_TLS, MQTT_BRIDGE_REDIS_TLS_CAFILE, _CERTFILE, _KEYFILE.

Exit status: 0 on success (`explain`: allowed), 1 on failure or a denial, 2 on usage errors.
"""

from __future__ import annotations

import argparse
import sys

from bridge.access.acl import PUBLISH, SUBSCRIBE, Acl, AclError, Rule, parse_rule, parse_rules

PROG = "python -m bridge.aclctl"


class AclCtlError(Exception):
    """An operation failed; the message is shown as is."""


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser."""
    parser = argparse.ArgumentParser(prog=PROG, description="Inspect and change ACL rules.")
    parser.add_argument("source", metavar="FILE|REDIS_URL", help="a rules file or redis://...")
    parser.add_argument("--cluster", default="mqtt", help="cluster_name (Redis; default mqtt)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("list", help="print the rules, numbered")
    add = commands.add_parser("add", help="add a rule (Redis)")
    add.add_argument("rule", help='e.g. "allow all subscribe devices/%%c/cmd"')
    add.add_argument("--at", type=int, metavar="N", help="insert as rule N (default: last)")
    remove = commands.add_parser("remove", help="remove rule N (Redis)")
    remove.add_argument("number", type=int, metavar="N")
    explain = commands.add_parser("explain", help="the decision for one request")
    explain.add_argument("action", choices=[PUBLISH, SUBSCRIBE])
    explain.add_argument("client_id", metavar="CLIENTID")
    explain.add_argument("topic", metavar="TOPIC")
    explain.add_argument("--user", default=None, help="the user name (default: anonymous)")
    return parser


def _is_redis(source: str) -> bool:
    return source.startswith(("redis://", "rediss://", "unix://"))


def _file_rules(path: str) -> list[Rule]:
    try:
        with open(path, encoding="utf-8") as fh:
            return parse_rules(fh.read().splitlines(), path)
    except OSError as exc:
        raise AclCtlError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise AclCtlError(f"{path} is not valid UTF-8") from None


class RedisRules:
    """The rules list of one cluster in Redis."""

    def __init__(self, url: str, cluster: str) -> None:
        from bridge.access.control import acl_key, changed_channel
        from bridge.cluster.redis_access import RedisAccess, RedisSetupError, sync_client
        from bridge.redact import redact_url

        try:
            self.client = sync_client(RedisAccess.from_environment(url))
        except RedisSetupError as exc:
            raise AclCtlError(f"{redact_url(url)}: {exc}") from None
        self.key = acl_key(cluster)
        self.channel = changed_channel(cluster)

    def lines(self) -> list[str]:
        return [item.decode("utf-8", "replace") for item in self.client.lrange(self.key, 0, -1)]

    def rules(self) -> list[Rule]:
        return parse_rules(self.lines(), self.key)

    def rewrite(self, change: object) -> list[str]:
        """Apply `change(lines) -> lines` atomically (WATCH/MULTI, retried), then announce it."""
        from redis.exceptions import WatchError

        for _attempt in range(10):
            with self.client.pipeline() as pipe:
                try:
                    pipe.watch(self.key)
                    lines = [item.decode() for item in pipe.lrange(self.key, 0, -1)]
                    new = change(lines)  # type: ignore[operator]
                    pipe.multi()
                    pipe.delete(self.key)
                    if new:
                        pipe.rpush(self.key, *new)
                    pipe.execute()
                except WatchError:
                    continue
            self.client.publish(self.channel, "acl")
            return list(new)
        raise AclCtlError("the rules kept changing under us; try again")


def run(args: argparse.Namespace) -> int:
    """Carry out the command; returns the exit status."""
    redis_rules = RedisRules(args.source, args.cluster) if _is_redis(args.source) else None
    if args.command in ("add", "remove") and redis_rules is None:
        raise AclCtlError(f"{args.command} changes rules in Redis; edit {args.source} instead")
    if args.command == "add":
        rule = parse_rule(args.rule, "rule")
        if rule is None:
            raise AclCtlError("the rule is empty or a comment")

        def add(lines: list[str]) -> list[str]:
            at = len(lines) + 1 if args.at is None else args.at
            if not 1 <= at <= len(lines) + 1:
                raise AclCtlError(f"--at {at}: there are {len(lines)} rules")
            return [*lines[: at - 1], rule.text(), *lines[at - 1 :]]

        assert redis_rules is not None
        redis_rules.rewrite(add)
        print(f"added: {rule.text()}")
        return 0
    if args.command == "remove":
        removed: list[str] = []

        def remove(lines: list[str]) -> list[str]:
            if not 1 <= args.number <= len(lines):
                raise AclCtlError(f"no rule {args.number}: there are {len(lines)} rules")
            removed[:] = [lines[args.number - 1]]
            return lines[: args.number - 1] + lines[args.number :]

        assert redis_rules is not None
        redis_rules.rewrite(remove)
        print(f"removed: {removed[0]}")
        return 0
    rules = redis_rules.rules() if redis_rules is not None else _file_rules(args.source)
    if args.command == "list":
        for number, rule in enumerate(rules, start=1):
            print(f"{number:4d}  {rule.text()}")
        return 0
    acl = Acl(rules, cache_ttl=0)
    decider = acl.first_applying(args.action, args.client_id, args.user, args.topic)
    if decider is None:
        print("deny (no rule applies)")
        return 1
    number = rules.index(decider) + 1
    print(f"{decider.decision.value} (rule {number}: {decider.text()})")
    return 0 if acl.decide(args.action, args.client_id, args.user, args.topic) else 1


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 failed or denied, 2 usage)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    from redis.exceptions import RedisError

    from bridge.cluster.redis_access import RedisAccess, RedisSetupError, explain
    from bridge.redact import redact_url

    try:
        return run(args)
    except (AclCtlError, AclError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except RedisError as exc:
        try:
            reason = explain(exc, RedisAccess.from_environment(args.source)) or str(exc)
        except RedisSetupError as setup:  # the settings that built the client were read before
            reason = str(setup)
        print(f"{PROG}: error: Redis {redact_url(args.source)}: {reason}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
