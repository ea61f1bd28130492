"""The admin API's banned clients: `BansAPI`, the "bans" part of `bridge.operations.admin`.

A ban is added with `POST /banned` (`{"clientid"|"username"|"address": ..., "seconds": ...}`),
listed with `GET /banned`, read and lifted at `/banned/{kind}/{value}`. The node's ban list
(`bridge.access.banlist.BanList`) stores it where every node enforces it at once and kicks the
connected clients it names; the request parsing is `bridge.access.bans.parse_ban_request`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from aiohttp import web

from bridge.access.banlist import BanListUnavailable
from bridge.access.bans import KINDS, BanError, canonical_value, parse_ban_request
from bridge.operations.admin_bodies import read_json
from bridge.operations.admin_requests import (
    AdminPart,
    ApiError,
    keyset_page,
    page_limit,
    query_params,
)

if TYPE_CHECKING:
    from bridge.access.banlist import BanList

log = logging.getLogger("bridge.admin")

MAX_BODY = 64 * 1024
"""A ban request is a few fields; a body larger than this is not one."""


class BansAPI(AdminPart):
    """Endpoints on the bans the cluster (or the single node) enforces."""

    @property
    def bans(self) -> BanList:
        return self.api.node.bans

    async def list_bans(self, request: web.Request) -> web.Response:
        """The bans in force, by kind and value, a page at a time (optionally of one kind)."""
        params = query_params(request, ("limit", "after", "kind"))
        limit = page_limit(params)
        kind = params.get("kind")
        if kind is not None and kind not in KINDS:
            raise ApiError(400, f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        bans = {ban.key: ban for ban in self.bans.active() if kind is None or ban.kind == kind}
        page, next_after = keyset_page(sorted(bans), params.get("after"), limit)
        now = self.bans.clock()
        return web.json_response(
            {"items": [bans[key].describe(now) for key in page], "next": next_after}
        )

    async def add_ban(self, request: web.Request) -> web.Response:
        """Ban a ClientId, user name or address for `seconds` (201; 200 if it replaced one)."""
        query_params(request, ())
        data = await read_json(request, MAX_BODY, self.config.admin_body_timeout, object_only=True)
        try:
            ban = parse_ban_request(data, self.bans.clock())
        except BanError as exc:
            raise ApiError(400, str(exc)) from None
        try:
            new = await self.bans.ban(ban)
        except BanListUnavailable as exc:
            raise ApiError(503, f"ban not stored: {exc}") from None
        log.info("admin API: banned %s %r", ban.kind, ban.value)
        return web.json_response(ban.describe(self.bans.clock()), status=201 if new else 200)

    async def get_ban(self, request: web.Request) -> web.Response:
        """One ban in force."""
        query_params(request, ())
        kind, value = self._identity(request)
        ban = self.bans.get(kind, value)
        if ban is None:
            raise ApiError(404, f"no ban of {kind} {value!r} in force")
        return web.json_response(ban.describe(self.bans.clock()))

    async def lift_ban(self, request: web.Request) -> web.Response:
        """Lift a ban on every node."""
        query_params(request, ())
        kind, value = self._identity(request)
        try:
            lifted = await self.bans.unban(kind, value)
        except BanListUnavailable as exc:
            raise ApiError(503, f"ban not lifted: {exc}") from None
        if lifted is None:
            raise ApiError(404, f"no ban of {kind} {value!r} in force")
        log.info("admin API: lifted the ban of %s %r", kind, value)
        return web.json_response({"lifted": True, "kind": kind, "value": value})

    @staticmethod
    def _identity(request: web.Request) -> tuple[str, str]:
        """The kind and canonical value named by the path; ApiError 400 if they name no ban."""
        kind = request.match_info["kind"]
        try:
            return kind, canonical_value(kind, request.match_info["value"])
        except BanError as exc:
            raise ApiError(400, str(exc)) from None
