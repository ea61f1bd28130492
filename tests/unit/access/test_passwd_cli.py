"""The password file command line, `python -m bridge.passwd`."""

from __future__ import annotations

import io
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.access import passwd
from bridge.access.auth import AuthResult, PasswordFile
from bridge.access.hashes import hash_password
from bridge.access.passwd import main

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _fast_hashes(monkeypatch):
    """Cheap scrypt parameters for the in-process runs (the subprocess test uses real ones)."""
    monkeypatch.setattr(passwd, "hash_password", lambda pw: hash_password(pw, n=2**10))


def run(monkeypatch, capsys, *argv, stdin=None):
    """Run main() in-process; returns (exit code, stdout, stderr)."""
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return code, out, err


def mode(path):
    return stat.S_IMODE(path.stat().st_mode)


def test_add_list_remove(tmp_path, monkeypatch, capsys):
    path = tmp_path / "passwd"
    code, out, err = run(
        monkeypatch, capsys, path, "add", "alice", "--password-stdin", stdin="pw1\n"
    )
    assert (code, err) == (0, "")
    assert "added user 'alice'" in out
    assert mode(path) == 0o600
    run(monkeypatch, capsys, path, "add", "bob", "--password-stdin", stdin="pw2\nignored\n")
    assert run(monkeypatch, capsys, path, "list") == (0, "alice\nbob\n", "")

    users = PasswordFile(path)
    assert users.authenticate("c", "alice", b"pw1") is AuthResult.ACCEPTED
    assert users.authenticate("c", "bob", b"pw2") is AuthResult.ACCEPTED

    code, out, _ = run(monkeypatch, capsys, path, "remove", "alice")
    assert code == 0 and "removed user 'alice'" in out
    assert run(monkeypatch, capsys, path, "list") == (0, "bob\n", "")
    assert mode(path) == 0o600


def test_add_existing_user_changes_password_in_place(tmp_path, monkeypatch, capsys):
    path = tmp_path / "passwd"
    for name in ("alice", "bob", "carol"):
        run(monkeypatch, capsys, path, "add", name, "--password-stdin", stdin="old\n")
    code, out, _ = run(monkeypatch, capsys, path, "add", "bob", "--password-stdin", stdin="new\r\n")
    assert code == 0 and "updated password of user 'bob'" in out
    assert run(monkeypatch, capsys, path, "list")[1] == "alice\nbob\ncarol\n"
    users = PasswordFile(path)
    assert users.authenticate("c", "bob", b"new") is AuthResult.ACCEPTED
    assert users.authenticate("c", "bob", b"old") is AuthResult.BAD_CREDENTIALS
    assert users.authenticate("c", "alice", b"old") is AuthResult.ACCEPTED


def test_rewrite_is_atomic_and_keeps_comments_and_other_lines(tmp_path, monkeypatch, capsys):
    path = tmp_path / "passwd"
    bob = f"bob:{hash_password('b', n=2**10)}"
    original = f"# managed by ops\n\n{bob}\r\n  # trailing comment\n"
    path.write_text(original, newline="")
    path.chmod(0o644)
    inode = path.stat().st_ino
    code, _, _ = run(monkeypatch, capsys, path, "add", "alice", "--password-stdin", stdin="a\n")
    assert code == 0
    text = path.read_bytes().decode()
    assert text.startswith(original)  # every byte of the old content, CRLF included
    assert text[len(original) :].startswith("alice:scrypt$")
    assert path.stat().st_ino != inode  # replaced by rename, not rewritten in place
    assert mode(path) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["passwd"]  # no temp file left behind

    run(monkeypatch, capsys, path, "remove", "alice")
    assert path.read_bytes().decode() == original


def test_file_without_final_newline(tmp_path, monkeypatch, capsys):
    path = tmp_path / "passwd"
    path.write_text("# no newline at end")
    run(monkeypatch, capsys, path, "add", "alice", "--password-stdin", stdin="a\n")
    assert path.read_text().startswith("# no newline at end\nalice:scrypt$")


def test_symlinked_file_is_updated_through_the_link(tmp_path, monkeypatch, capsys):
    real = tmp_path / "real"
    link = tmp_path / "link"
    real.write_text("# x\n")
    link.symlink_to(real)
    run(monkeypatch, capsys, link, "add", "alice", "--password-stdin", stdin="a\n")
    assert link.is_symlink()
    assert run(monkeypatch, capsys, real, "list")[1] == "alice\n"


def test_interactive_prompts_twice(tmp_path, monkeypatch, capsys):
    path = tmp_path / "passwd"
    answers = iter(["typed", "typed"])
    monkeypatch.setattr(passwd, "_interactive", lambda: True)
    monkeypatch.setattr(passwd.getpass, "getpass", lambda prompt: next(answers))
    assert run(monkeypatch, capsys, path, "add", "alice")[0] == 0
    assert PasswordFile(path).authenticate("c", "alice", b"typed") is AuthResult.ACCEPTED

    answers = iter(["one", "two"])
    code, _, err = run(monkeypatch, capsys, path, "add", "alice")
    assert code == 1 and err == "python -m bridge.passwd: error: passwords do not match\n"

    def interrupted(prompt):
        raise KeyboardInterrupt

    monkeypatch.setattr(passwd.getpass, "getpass", interrupted)
    assert run(monkeypatch, capsys, path, "add", "alice")[:2] == (1, "")
    assert PasswordFile(path).authenticate("c", "alice", b"typed") is AuthResult.ACCEPTED


@pytest.mark.parametrize(
    ("setup", "argv", "stdin", "message"),
    [
        (None, ["remove", "alice"], None, "no such file"),
        (None, ["list"], None, "no such file"),
        ("users", ["remove", "mallory"], None, "no user 'mallory'"),
        ("users", ["add", "bob", "--password-stdin"], "\n", "empty password"),
        ("users", ["add", "bob", "--password-stdin"], "", "empty password"),
        ("users", ["add", "bob"], None, "no terminal to prompt"),
        ("users", ["add", "#bob", "--password-stdin"], "x\n", "would be a comment"),
        ("users", ["add", " bob", "--password-stdin"], "x\n", "whitespace"),
        ("users", ["add", "", "--password-stdin"], "x\n", "must not be empty"),
        ("users", ["add", "b\x01b", "--password-stdin"], "x\n", "control characters"),
        ("broken", ["list"], None, r"passwd:2: expected username:hash"),
        ("broken", ["add", "bob", "--password-stdin"], "x\n", r"passwd:2: expected"),
        ("dir", ["list"], None, "cannot read"),
    ],
)
def test_errors_are_one_line_with_exit_code_1(
    tmp_path, monkeypatch, capsys, setup, argv, stdin, message
):
    path = tmp_path / "passwd"
    if setup == "users":
        path.write_text(f"# users\nalice:{hash_password('a', n=2**10)}\n")
    elif setup == "broken":
        path.write_text("# users\ngarbage\n")
    elif setup == "dir":
        path.mkdir()
    before = path.read_bytes() if path.is_file() else None
    monkeypatch.setattr(passwd, "_interactive", lambda: False)
    code, out, err = run(monkeypatch, capsys, path, *argv, stdin=stdin if stdin is not None else "")
    assert code == 1
    assert out == ""
    assert err.startswith("python -m bridge.passwd: error: ")
    assert err.count("\n") == 1 and err.endswith("\n")
    assert re.search(message, err), err
    if before is not None:
        assert path.read_bytes() == before  # untouched


def test_usage_errors_exit_2(tmp_path, capsys):
    assert main([]) == 2
    assert main([str(tmp_path / "p"), "frobnicate"]) == 2
    assert main([str(tmp_path / "p"), "add"]) == 2
    assert "usage:" in capsys.readouterr().err
    assert main(["--help"]) == 0
    assert "add" in capsys.readouterr().out


def test_unwritable_directory_is_an_error(tmp_path, monkeypatch, capsys):
    code, _, err = run(
        monkeypatch,
        capsys,
        tmp_path / "missing-dir" / "passwd",
        "add",
        "alice",
        "--password-stdin",
        stdin="a\n",
    )
    assert code == 1 and "cannot write in" in err and err.count("\n") == 1


def test_as_a_subprocess_with_real_cost(tmp_path):
    path = tmp_path / "passwd"
    path.write_text("# users of the bridge\n")

    def cli(*argv, stdin=""):
        return subprocess.run(
            [sys.executable, "-m", "bridge.passwd", str(path), *argv],
            input=stdin,
            capture_output=True,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            timeout=30,
        )

    added = cli("add", "alice", "--password-stdin", stdin="s3cret\n")
    assert added.returncode == 0, added.stderr
    assert mode(path) == 0o600
    assert path.read_text().startswith("# users of the bridge\nalice:$argon2id$v=19$")
    assert cli("list").stdout == "alice\n"
    assert PasswordFile(path).authenticate("c", "alice", b"s3cret") is AuthResult.ACCEPTED

    missing = cli("remove", "bob")
    assert missing.returncode == 1
    assert missing.stderr == f"python -m bridge.passwd: error: {path}: no user 'bob'\n"
    empty = cli("add", "bob", "--password-stdin", stdin="")
    assert (empty.returncode, empty.stderr.count("\n")) == (1, 1)
    assert "Traceback" not in empty.stderr
    assert cli("nonsense").returncode == 2

    assert cli("remove", "alice").returncode == 0
    assert path.read_text() == "# users of the bridge\n"
