"""The admin API's view of access control (`AccessAPI`, the "access" part of
`bridge.operations.admin.AdminAPI`): the users (password file, the cluster's Redis), the ACL
rules in force, and why a request would be allowed or denied (`bridge.access.explain`).

Read-only: users and rules are changed with `python -m bridge.passwd` and `python -m
bridge.aclctl`, which tell every node at once. Password hashes and SCRAM credentials are never
shown, only whether a user has one. What is answered is this node's view: the Redis users and
rules are the cluster's, an ACL or password file is this node's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from bridge.access.acl import PUBLISH, SUBSCRIBE
from bridge.access.control import acl_key, scram_key, users_key
from bridge.access.explain import explain
from bridge.mqtt.errors import MQTTProtocolError
from bridge.mqtt.topics import parse_shared, validate_topic_filter, validate_topic_name
from bridge.operations.admin_requests import (
    AdminPart,
    ApiError,
    keyset_page,
    page_limit,
    query_params,
)

if TYPE_CHECKING:
    from bridge.access.control import AccessControl


class AccessAPI(AdminPart):
    """Endpoints on the node's users and ACL rules."""

    @property
    def access(self) -> AccessControl:
        return self.api.node.access

    async def users(self, request: web.Request) -> web.Response:
        """The user names this node authenticates, by name, with where each is defined."""
        params = query_params(request, ("limit", "after"))
        limit = page_limit(params)
        config = self.config
        sources: dict[str, set[str]] = {}
        scram: set[str] = set()
        password_file = self.access.password_file
        if password_file is not None:
            for name in password_file.usernames:
                sources.setdefault(name, set()).add("file")
                if password_file.scram_credential(name) is not None:
                    scram.add(name)
        if config.auth_redis and self.access.redis is not None:
            redis = self.access.redis
            names = await self.api.registry_call(redis.hkeys(users_key(config.cluster_name)))
            with_scram = await self.api.registry_call(redis.hkeys(scram_key(config.cluster_name)))
            for raw in names:
                sources.setdefault(raw.decode("utf-8", "replace"), set()).add("redis")
            redis_scram = {raw.decode("utf-8", "replace") for raw in with_scram}
            # A name in the file is authenticated by the file (bridge.access.control).
            scram |= {n for n in redis_scram if "file" not in sources.get(n, ())}
        page, next_after = keyset_page(sorted(sources), params.get("after"), limit)
        items = [
            {"username": name, "sources": sorted(sources[name]), "scram": name in scram}
            for name in page
        ]
        return web.json_response(
            {
                "authenticating": self.access.authenticating,
                "allow_anonymous": config.anonymous_allowed,
                "password_file": config.password_file or None,
                "redis_users": users_key(config.cluster_name) if config.auth_redis else None,
                "items": items,
                "next": next_after,
            }
        )

    async def rules(self, request: web.Request) -> web.Response:
        """The ACL rules in force, in the order they are checked."""
        query_params(request, ())
        config = self.config
        rules = self.access.acl.rules
        items = [
            {
                "index": index,
                "decision": rule.decision.value,
                "who": rule.who,
                "action": rule.action,
                "filter": rule.topic_filter,
                "source": rule.source or None,
                "text": rule.text(),
            }
            for index, rule in enumerate(rules or ())
        ]
        return web.json_response(
            {
                "enabled": rules is not None,
                "acl_file": config.acl_file or None,
                "redis_rules": acl_key(config.cluster_name) if config.acl_redis else None,
                "cache_ttl": config.acl_cache_ttl,
                "items": items,
            }
        )

    async def explain(self, request: web.Request) -> web.Response:
        """Whether a client may publish to a topic or subscribe to a filter, and which rule
        decides (the rules in force, without the decision cache)."""
        params = query_params(request, ("clientid", "username", "topic", "action"))
        client_id = params.get("clientid", "")
        if not client_id:
            raise ApiError(400, "clientid is required")
        topic = params.get("topic", "")
        if not topic:
            raise ApiError(400, "topic is required")
        action = params.get("action", PUBLISH)
        if action not in (PUBLISH, SUBSCRIBE):
            raise ApiError(400, f"action must be {PUBLISH} or {SUBSCRIBE}, got {action!r}")
        checked = _checked_topic(action, topic)
        username = params.get("username")
        acl = self.access.acl
        answer = explain(
            acl.rules,
            action,
            client_id,
            username,
            checked,
            private_client_events=acl.private_client_events,
        )
        steps = [
            {
                "index": index,
                "rule": step.rule.text(),
                "source": step.rule.source or None,
                "pattern": step.pattern,
                "outcome": step.outcome,
            }
            for index, step in enumerate(answer.steps)
        ]
        body: dict[str, Any] = {
            "client_id": client_id,
            "username": username,
            "action": action,
            "topic": topic,
            "checked": checked,
            "acl_enabled": answer.enabled,
            "allowed": answer.allowed,
            "deciding_rule": answer.deciding,
            "reason": answer.reason,
            "steps": steps,
            "may_filter_deliveries": answer.may_filter,
        }
        return web.json_response(body)


def _checked_topic(action: str, topic: str) -> str:
    """What the ACL is asked about: the topic name, or the filter (a shared subscription's
    filter without `$share/group/`, as the node checks it)."""
    try:
        if action == PUBLISH:
            validate_topic_name(topic)
            return topic
        validate_topic_filter(topic)
    except MQTTProtocolError as exc:
        what = "topic" if action == PUBLISH else "filter"
        raise ApiError(400, f"bad {what}: {exc.args[-1]}") from None
    shared = parse_shared(topic)
    return shared[1] if shared is not None else topic
