"""The node the console tests run against (test_console_browser.py, test_admin_console.py): the
admin API with the fixed token, a password file with one user (anonymous clients allowed too)
and an ACL file, so every page of the console has something to show. A module that imports the
`admin_node` fixture from here runs its tests on that node."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from bridge.access.hashes import hash_password
from bridge.mqtt.packets import Connect
from tests.support.admin_http import TOKEN, AdminHttp, start_admin_node
from tests.support.clients import RawClient
from tests.support.processes import BridgeProcess

USER, PASSWORD = "alice", "meter-secret"
ACL = """\
allow user:alice all       meters/#
deny  all        subscribe secret/#
allow all        publish   meters/%c/power
allow all        all       console/#
allow all        subscribe #
"""
ACL_RULES = 5


def start_console_node(
    bridge_factory: Callable[..., BridgeProcess], directory: Path
) -> tuple[BridgeProcess, AdminHttp]:
    directory.mkdir(parents=True, exist_ok=True)
    users = directory / "passwd"
    users.write_text(f"{USER}:{hash_password(PASSWORD)}\n")
    os.chmod(users, 0o600)
    acl = directory / "acl.conf"
    acl.write_text(ACL)
    return start_admin_node(
        bridge_factory,
        f"admin_token={TOKEN}",
        f"password_file={users}",
        "allow_anonymous=true",
        f"acl_file={acl}",
    )


@pytest.fixture
def admin_node(
    bridge_factory: Callable[..., BridgeProcess], tmp_path: Path
) -> tuple[BridgeProcess, AdminHttp]:
    """The console's node in place of conftest.py's admin node, for the modules that import
    this fixture: their `api` and `mqtt_port` (conftest.py) are this node's."""
    return start_console_node(bridge_factory, tmp_path / "access")


def connect_as_user(port: int, client_id: str, *, clean_session: bool = True) -> RawClient:
    """A client logged in as USER."""
    client = RawClient(port)
    client.send(Connect(client_id, clean_session, username=USER, password=PASSWORD.encode()))
    assert client.recv().return_code == 0
    return client
