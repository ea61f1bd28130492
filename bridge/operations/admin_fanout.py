"""Asking every node of the cluster one admin API question, for answers no single node holds:
the console's overview totals and its searches of clients and subscriptions (each node knows
only the sessions it holds; the registry in Redis maps a ClientId to its node, nothing more).

The node that is asked answers its own part directly and sends the same request (path and
query) to the admin API of every other alive member at once, as a node call: signed with the
cluster secret for that one member (`admin_node_calls`), never with the operator's token, which
must not travel to an address read from Redis. A forwarded request is answered with that node's
own part, never sent on. A member that is dead, serves no admin API, refuses the call or does
not answer in time is reported with an `error` instead of its answer, so the caller still gets
everyone else's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web
from yarl import URL

from bridge.operations.admin_node_calls import forwarded_by
from bridge.operations.admin_requests import AdminHost

FANOUT_TIMEOUT = 3.0
"""Seconds to wait for each other node's answer."""

NodeAnswer = dict[str, Any]
"""`{"id", "self", "alive", "error", "answer"}`: one member's answer (a JSON object) or why
there is none (`answer` null, `error` a message)."""


async def answer_for_every_node(
    host: AdminHost,
    request: web.Request,
    local: Callable[[], dict[str, Any]],
    merge: Callable[[list[NodeAnswer]], dict[str, Any]],
) -> web.Response:
    """The answer to `request` for the whole cluster: `merge` of every member's `local()`. A
    request forwarded by another node is answered with this node's `local()` alone."""
    if forwarded_by(request) is not None:
        return web.json_response(local())
    return web.json_response(merge(await ask_every_node(host, request, local)))


async def ask_every_node(
    host: AdminHost, request: web.Request, local: Callable[[], dict[str, Any]]
) -> list[NodeAnswer]:
    """This node's `local()` answer and every other member's answer to `request` (forwarded to
    them), by node id, dead members last. Not clustered: only this node's."""
    node_id = host.node.node_id
    cluster = host.server.cluster
    if cluster is None:
        return [_answer(node_id, True, True, local())]
    alive, dead = await host.registry_call(cluster.registry.members())
    answers: dict[str, NodeAnswer] = {node_id: _answer(node_id, True, True, local())}
    others = sorted(n for n in alive if n != node_id)
    if others:
        timeout = aiohttp.ClientTimeout(total=FANOUT_TIMEOUT)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            asked = [_ask(host, http, request, n, alive[n].get("admin") or "") for n in others]
            for answer in await asyncio.gather(*asked):
                answers[answer["id"]] = answer
    ordered = [answers[n] for n in sorted(answers)]
    return ordered + [_failed(n, False, "not alive (no heartbeat)") for n in sorted(dead)]


async def _ask(
    host: AdminHost, http: aiohttp.ClientSession, request: web.Request, node_id: str, address: str
) -> NodeAnswer:
    if not address:
        return _failed(node_id, True, "serves no admin API")
    if not host.node_calls.can_call:
        return _failed(node_id, True, "not asked: this node has no cluster secret to call it with")
    url = URL.build(
        scheme="http",
        authority=address,
        path=request.rel_url.raw_path,
        query_string=request.rel_url.raw_query_string,
        encoded=True,
    )
    headers = host.node_calls.signed_headers("GET", url, node_id)
    try:
        async with http.get(url, headers=headers) as response:
            status = response.status
            body = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return _failed(node_id, True, f"did not answer ({address}): {exc!r}")
    if status != 200 or not isinstance(body, dict):
        error = body.get("error") if isinstance(body, dict) else None
        return _failed(node_id, True, f"answered {status}: {error or 'not a JSON object'}")
    return _answer(node_id, False, True, body)


def _answer(node_id: str, is_self: bool, alive: bool, answer: dict[str, Any]) -> NodeAnswer:
    return {"id": node_id, "self": is_self, "alive": alive, "error": None, "answer": answer}


def _failed(node_id: str, alive: bool, error: str) -> NodeAnswer:
    return {"id": node_id, "self": False, "alive": alive, "error": error, "answer": None}
