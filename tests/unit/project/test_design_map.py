"""docs/design.md's map of the rooms names every module under `bridge/`, so a newcomer can find
the room of any file, and a module added without a place on the map fails here."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _map_section() -> str:
    text = (REPO / "docs" / "design.md").read_text()
    start = text.index("## A map of the rooms")
    return text[start : text.index("\n## ", start + 1)]


def _room_rows(section: str) -> dict[str, str]:
    """Each table row by the first path it names (`bridge/node/`, `bridge/session.py`, ...)."""
    rows = {}
    for line in section.splitlines():
        found = re.match(r"\| `(bridge/[^`]*)`", line)
        if found:
            rows[found.group(1)] = line
    return rows


def _on_the_map(module: Path, section: str, rows: dict[str, str]) -> bool:
    relative = module.relative_to(REPO / "bridge").as_posix()
    if f"`{relative}`" in section:  # in the list of the other modules
        return True
    folders = relative.split("/")[:-1]
    if not folders:  # a top-level module, named in a row of its own
        return any(module.name in row for path, row in rows.items() if "/" not in path[7:])
    # Named in the row of its room (`bridge/storage/` names the modules of `filelog/` too).
    for depth in range(len(folders), 0, -1):
        row = rows.get("bridge/" + "/".join(folders[:depth]) + "/", "")
        if module.name in row or f"`{module.stem}" in row:
            return True
    return False


def test_every_module_under_bridge_is_on_the_map_of_the_rooms() -> None:
    section = _map_section()
    rows = _room_rows(section)
    modules = [
        path
        for path in sorted((REPO / "bridge").rglob("*.py"))
        if path.name != "__init__.py" and "__pycache__" not in path.parts
    ]
    assert len(modules) > 100
    missing = [str(m.relative_to(REPO)) for m in modules if not _on_the_map(m, section, rows)]
    assert not missing, f"add these to docs/design.md's map of the rooms: {missing}"


def test_the_map_names_no_module_that_does_not_exist() -> None:
    section = _map_section()
    listed = re.findall(r"^  - `([\w/]+\.py)`", section, re.M)
    assert listed
    assert [path for path in listed if not (REPO / "bridge" / path).is_file()] == []
