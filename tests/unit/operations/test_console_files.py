"""The console's allow-list (bridge.operations.console_files): what is in it, and that a name
is only ever a key, never a path."""

from __future__ import annotations

import os
from pathlib import Path

from bridge.operations.admin_console import CONSOLE_DIR
from bridge.operations.console_files import ConsoleFiles


def test_only_the_directorys_own_regular_files_of_known_kinds_are_listed(tmp_path: Path) -> None:
    console = tmp_path / "console"
    console.mkdir()
    (console / "index.html").write_text("<p>index</p>")
    (console / "app.js").write_text("export {}")
    (console / ".hidden.js").write_text("hidden")
    (console / "notes.txt").write_text("not a console kind")
    (console / "sub").mkdir()
    (console / "sub" / "deep.js").write_text("not directly in the directory")
    outside = tmp_path / "secret.html"
    outside.write_text("secret")
    os.symlink(outside, console / "linked.html")
    files = ConsoleFiles(console)
    assert files.names == {"index.html", "app.js"}
    found = files.get("index.html")
    assert found is not None and (found.body, found.content_type) == (b"<p>index</p>", "text/html")


def test_names_that_look_like_paths_are_unknown(tmp_path: Path) -> None:
    console = tmp_path / "console"
    console.mkdir()
    (console / "index.html").write_text("index")
    (tmp_path / "secret.html").write_text("secret")
    files = ConsoleFiles(console)
    for name in (
        str(tmp_path / "secret.html"),
        "../secret.html",
        "..\\secret.html",
        "./index.html",
        "index.html/",
        "index.html\x00.js",
        "INDEX.HTML",
    ):
        assert files.get(name) is None, name


def test_files_are_read_at_start_up_so_a_later_swap_is_not_served(tmp_path: Path) -> None:
    console = tmp_path / "console"
    console.mkdir()
    page = console / "index.html"
    page.write_text("original")
    files = ConsoleFiles(console)
    page.unlink()
    os.symlink(tmp_path / "elsewhere.html", page)
    found = files.get("index.html")
    assert found is not None and found.body == b"original"


def test_the_shipped_console_is_served_whole() -> None:
    names = ConsoleFiles(CONSOLE_DIR).names
    assert "index.html" in names and "app.js" in names and "console.css" in names
    assert names == {
        p.name for p in CONSOLE_DIR.iterdir() if p.suffix in (".html", ".js", ".css", ".svg")
    }
