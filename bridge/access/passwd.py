"""Maintain the users of a password file (`bridge.access.auth.PasswordFile`) or of the cluster's
Redis (`auth_redis`).

    python -m bridge.passwd FILE add USER [--password-stdin] [--no-scram]
    python -m bridge.passwd FILE remove USER
    python -m bridge.passwd FILE list
    python -m bridge.passwd redis://HOST:PORT/DB [--cluster NAME] add|remove|list ...

With a `redis://` (or `rediss://`) URL the users are the hash `<cluster>:users` (cluster name
default `mqtt`, the setting `cluster_name`); every change is announced on
`<cluster>:access-changed`, so the nodes forget cached verifications of the old password at once.
A Redis that asks for a password or TLS is reached with the node's settings, given as environment
variables: MQTT_BRIDGE_REDIS_USERNAME, MQTT_BRIDGE_REDIS_PASSWORD_FILE (or _PASSWORD),
MQTT_BRIDGE_REDIS_TLS, MQTT_BRIDGE_REDIS_TLS_CAFILE, _CERTFILE, _KEYFILE.

`add` also stores the user's SCRAM-SHA-256 credential (MQTT 5.0 enhanced authentication,
`bridge.access.scram`): a third field on the file line, or the user's field in the hash
`<cluster>:users:scram`. Users added before, or with `--no-scram`, log in with user name and
password only; a SCRAM login of theirs fails as not authorized until their password is set again.
The credential is easier to attack offline than the Argon2id hash (PBKDF2, 4096 rounds, as
RFC 7677 asks), so `--no-scram` leaves it out where SCRAM is not wanted.

`add` creates the file if needed and replaces the hash of an existing user in place; without
`--password-stdin` it prompts twice on the terminal. The file is rewritten atomically (a temporary
file in the same directory, fsync, rename) with mode 0600, keeping every other line and comment.

Exit status: 0 on success, 1 when the operation fails (unknown user, unreadable or malformed file,
empty or mismatched password), 2 for command-line usage errors. Errors are one line on stderr.
A running bridge picks up changes when it reloads the file.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import os
import sys
import tempfile
from pathlib import Path

from bridge.access.auth import parse_line, redis_scram_value
from bridge.access.hashes import AuthConfigError, hash_password
from bridge.access.scram import make_credential, saslprep

PROG = "python -m bridge.passwd"


class PasswdError(Exception):
    """An operation failed; the message is shown to the user as is."""


def _read_lines(path: Path, missing_ok: bool) -> list[str]:
    """The file's lines with their line endings, validated; [] for a missing file if allowed."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        if missing_ok:
            return []
        raise PasswdError(f"{path}: no such file") from None
    except OSError as exc:
        raise PasswdError(f"cannot read {path}: {exc.strerror}") from None
    # Split bytes, like the bridge does: only \n, \r and \r\n end a line.
    lines: list[str] = []
    seen: set[str] = set()
    for number, raw in enumerate(data.splitlines(keepends=True), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise PasswdError(f"{path}:{number}: not valid UTF-8") from None
        lines.append(line)
        try:
            entry = parse_line(line)
        except AuthConfigError as exc:
            raise PasswdError(f"{path}:{number}: {exc}") from None
        if entry is not None:
            if entry[0] in seen:
                raise PasswdError(f"{path}:{number}: duplicate user {entry[0]!r}")
            seen.add(entry[0])
    return lines


def _username_of(line: str) -> str | None:
    entry = parse_line(line)
    return None if entry is None else entry[0]


def _check_username(username: str) -> None:
    if not username:
        raise PasswdError("user name must not be empty")
    if username != username.strip():
        raise PasswdError("user name must not start or end with whitespace")
    if username.startswith("#"):
        raise PasswdError("user name must not start with '#' (it would be a comment)")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in username):
        raise PasswdError("user name must not contain control characters")


def _warn_if_scram_cannot_find(username: str) -> None:
    """SCRAM clients send the user name prepared by SASLprep, and the bridge looks that up: a name
    SASLprep changes (or refuses) is never found by a SCRAM login."""
    try:
        unchanged = saslprep(username, allow_unassigned=True) == username
    except ValueError:
        unchanged = False
    if not unchanged:
        print(
            f"{PROG}: warning: SASLprep changes or refuses the user name {username!r}, so SCRAM "
            "logins will not find it (user name and password logins will)",
            file=sys.stderr,
        )


def write_atomically(path: Path, lines: list[str]) -> None:
    """Replace `path` with `lines`: temp file in the same directory, fsync, os.replace, mode 0600.

    The owner and group of an existing file are kept where permitted (e.g. when run as root on a
    file owned by the bridge's user), so the bridge can still read it.
    """
    target = Path(os.path.realpath(path))  # keep a symlink pointing at the updated file
    try:
        old = target.stat()
    except FileNotFoundError:
        old = None
    except OSError as exc:
        raise PasswdError(f"cannot access {path}: {exc.strerror}") from None
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise PasswdError(f"cannot write in {target.parent}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            os.fchmod(fh.fileno(), 0o600)
            if old is not None:
                with contextlib.suppress(OSError):
                    os.fchown(fh.fileno(), old.st_uid, old.st_gid)
            fh.write("".join(lines))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp_name, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise PasswdError(f"cannot write {path}: {exc.strerror}") from None
    with contextlib.suppress(OSError):  # make the rename itself durable
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _read_password(from_stdin: bool) -> str:
    if from_stdin:
        line = sys.stdin.readline()
        password = line.removesuffix("\n").removesuffix("\r")
    else:
        if not _interactive():
            raise PasswdError("no terminal to prompt for the password; use --password-stdin")
        try:
            password = getpass.getpass("Password: ")
            again = getpass.getpass("Password (again): ")
        except (EOFError, KeyboardInterrupt):
            raise PasswdError("aborted") from None
        if password != again:
            raise PasswdError("passwords do not match")
    if not password:
        raise PasswdError("empty password")
    return password


def _interactive() -> bool:
    return sys.stdin.isatty()


def cmd_add(path: Path, username: str, from_stdin: bool, scram: bool = True) -> str:
    """Add `username` or change its password (and SCRAM credential, if `scram`); returns the
    message to print."""
    _check_username(username)
    lines = _read_lines(path, missing_ok=True)
    password = _read_password(from_stdin)
    entry = f"{username}:{hash_password(password)}"
    if scram:
        entry += f":{make_credential(password).encode()}"
        _warn_if_scram_cannot_find(username)
    for index, line in enumerate(lines):
        if _username_of(line) == username:
            ending = line[len(line.rstrip("\r\n")) :] or "\n"
            lines[index] = entry + ending
            verb = "updated password of"
            break
    else:
        if lines and not lines[-1].endswith(("\n", "\r")):
            lines[-1] += "\n"
        lines.append(entry + "\n")
        verb = "added"
    write_atomically(path, lines)
    return f"{verb} user {username!r} in {path}"


def cmd_remove(path: Path, username: str) -> str:
    """Remove `username`; returns the message to print."""
    lines = _read_lines(path, missing_ok=False)
    kept = [line for line in lines if _username_of(line) != username]
    if len(kept) == len(lines):
        raise PasswdError(f"{path}: no user {username!r}")
    write_atomically(path, kept)
    return f"removed user {username!r} from {path}"


def cmd_list(path: Path) -> list[str]:
    """The user names in the file, in file order."""
    names = [_username_of(line) for line in _read_lines(path, missing_ok=False)]
    return [name for name in names if name is not None]


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Maintain mqtt-bridge users (Argon2id hashes and SCRAM-SHA-256 credentials) "
        "in a file or Redis.",
    )
    parser.add_argument(
        "file", metavar="FILE", help="the password file, or redis://HOST:PORT/DB for Redis users"
    )
    parser.add_argument(
        "--cluster", default="mqtt", help="cluster_name of the bridges (Redis users; default mqtt)"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add = commands.add_parser(
        "add",
        help="add a user or change its password",
        description="Add a user or change its password. The Argon2id hash serves user name and "
        "password logins; the SCRAM-SHA-256 credential stored with it serves MQTT 5.0 SCRAM "
        "logins. Users stored without one (older entries, --no-scram) fail SCRAM logins as not "
        "authorized until their password is set again.",
    )
    add.add_argument("username", metavar="USER")
    add.add_argument(
        "--password-stdin",
        action="store_true",
        help="read the password from the first line of stdin instead of prompting",
    )
    add.add_argument(
        "--no-scram",
        dest="scram",
        action="store_false",
        help="store no SCRAM-SHA-256 credential (the user cannot log in with SCRAM; a stolen "
        "file or Redis then holds only the Argon2id hash, which is harder to guess from)",
    )
    remove = commands.add_parser("remove", help="remove a user")
    remove.add_argument("username", metavar="USER")
    commands.add_parser("list", help="list the user names")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 failed, 2 usage error)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed by argparse
        return exc.code if isinstance(exc.code, int) else 2
    if args.file.startswith(("redis://", "rediss://", "unix://")):
        return _redis_main(args)
    args.file = Path(args.file)
    try:
        if args.command == "add":
            print(cmd_add(args.file, args.username, args.password_stdin, args.scram))
        elif args.command == "remove":
            print(cmd_remove(args.file, args.username))
        else:
            for name in cmd_list(args.file):
                print(name)
    except PasswdError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    return 0


def _redis_main(args: argparse.Namespace) -> int:
    from redis.exceptions import RedisError

    from bridge.access.control import changed_channel, scram_key, users_key
    from bridge.cluster.redis_access import RedisAccess, RedisSetupError, explain, sync_client
    from bridge.redact import redact_url

    key = users_key(args.cluster)
    scram_hash = scram_key(args.cluster)
    shown_url = redact_url(args.file)
    try:
        access = RedisAccess.from_environment(args.file)
        client = sync_client(access)
    except RedisSetupError as exc:
        print(f"{PROG}: error: {shown_url}: {exc}", file=sys.stderr)
        return 1
    try:
        if args.command == "add":
            _check_username(args.username)
            password = _read_password(args.password_stdin)
            stored = hash_password(password)
            with client.pipeline(transaction=True) as pipe:  # both or neither
                pipe.hset(key, args.username, stored)
                if args.scram:
                    value = redis_scram_value(make_credential(password), stored)
                    pipe.hset(scram_hash, args.username, value)
                    _warn_if_scram_cannot_find(args.username)
                else:
                    pipe.hdel(scram_hash, args.username)
                added = pipe.execute()[0]
            client.publish(changed_channel(args.cluster), f"user {args.username}")
            verb = "added" if added else "updated password of"
            print(f"{verb} user {args.username!r} in {key}")
        elif args.command == "remove":
            with client.pipeline(transaction=True) as pipe:
                pipe.hdel(key, args.username)
                pipe.hdel(scram_hash, args.username)
                removed = pipe.execute()[0]
            if not removed:
                raise PasswdError(f"{key}: no user {args.username!r}")
            client.publish(changed_channel(args.cluster), f"user {args.username}")
            print(f"removed user {args.username!r} from {key}")
        else:
            names = client.hkeys(key)
            for name in sorted(n.decode() if isinstance(n, bytes) else str(n) for n in names):
                print(name)
    except PasswdError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except RedisError as exc:
        reason = explain(exc, access) or str(exc)
        print(f"{PROG}: error: Redis {shown_url}: {reason}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
