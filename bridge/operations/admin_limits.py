"""The admin API's limits endpoints (`LimitsAPI`, the "limits" part of
`bridge.operations.admin.AdminAPI`): read and change the connection and rate limits at run time.

`GET /limits` answers the limits in force, the configured defaults and the overrides;
`PUT /limits` changes the named ones (a number; null goes back to the configured default) on
every node of a cluster at once (`bridge.access.limits`); `DELETE /limits` drops every override.
A value that breaks a limit's rules gets 400 naming the limit; an override that cannot be stored
(Redis down, data_dir not writable) gets 503, and nothing changes.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from aiohttp import web

from bridge.access.limits import LimitsUnavailable
from bridge.access.ratelimit import LimitError, parse_changes
from bridge.operations.admin_bodies import read_json
from bridge.operations.admin_requests import AdminPart, ApiError, query_params

if TYPE_CHECKING:
    from bridge.access.limits import LimitControl

log = logging.getLogger("bridge.admin")

MAX_BODY = 64 * 1024


class LimitsAPI(AdminPart):
    """Endpoints on the node's (and cluster's) limits."""

    @property
    def limits(self) -> LimitControl:
        return self.api.node.limits

    async def get_limits(self, request: web.Request) -> web.Response:
        """The limits in force, the configured defaults and the overrides."""
        query_params(request, ())
        return web.json_response(self._state())

    async def put_limits(self, request: web.Request) -> web.Response:
        """Override the named limits (null: back to the default), cluster-wide."""
        query_params(request, ())
        data = await read_json(request, MAX_BODY, self.config.admin_body_timeout, object_only=False)
        try:
            changes = parse_changes(data)
        except LimitError as exc:
            raise ApiError(400, str(exc)) from None
        try:
            await self.limits.change(changes)
        except LimitsUnavailable as exc:
            raise ApiError(503, f"limits not changed: {exc}") from None
        log.info(
            "admin API: limits set: %s",
            ", ".join(f"{k}={'default' if v is None else v}" for k, v in changes.items()),
        )
        return web.json_response(self._state())

    async def reset_limits(self, request: web.Request) -> web.Response:
        """Drop every override: the configured limits apply again."""
        query_params(request, ())
        try:
            await self.limits.reset()
        except LimitsUnavailable as exc:
            raise ApiError(503, f"limits not reset: {exc}") from None
        log.info("admin API: limits back to the configured ones")
        return web.json_response(self._state())

    def _state(self) -> dict[str, Any]:
        limits = self.limits
        return {
            "scope": limits.scope,
            "limits": limits.current.as_dict(),
            "defaults": limits.defaults.as_dict(),
            "overrides": dict(limits.overrides),
        }
