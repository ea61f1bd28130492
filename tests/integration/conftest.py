"""Fixtures of the admin API tests (test_admin_*.py): `admin_node`, a bridge process with the
admin API on a free port, the fixed token (admin_http.TOKEN), /metrics behind the token and
small packets; `api`, its AdminHttp client; `mqtt_port`, its MQTT port. Built on
`bridge_factory` from tests/conftest.py, so the node is killed and its log checked after each
test."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.support.admin_http import MAX_PACKET, TOKEN, AdminHttp, start_admin_node
from tests.support.processes import BridgeProcess


@pytest.fixture
def admin_node(bridge_factory: Callable[..., BridgeProcess]) -> tuple[BridgeProcess, AdminHttp]:
    """A node with a fixed token, /metrics behind the token and small packets."""
    return start_admin_node(
        bridge_factory,
        f"admin_token={TOKEN}",
        "metrics_public=false",
        f"max_packet_size={MAX_PACKET}",
    )


@pytest.fixture
def api(admin_node: tuple[BridgeProcess, AdminHttp]) -> AdminHttp:
    return admin_node[1]


@pytest.fixture
def mqtt_port(admin_node: tuple[BridgeProcess, AdminHttp]) -> int:
    return admin_node[0].port
