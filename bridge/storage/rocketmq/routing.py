"""NameServer lookups of `RocketMQClient`: topic routes (cached), cluster brokers, master addresses.

`NameServerRouting` is mixed into `RocketMQClient` (bridge/storage/rocketmq_client.py), which
owns the state and the connections; the annotations below only name the part used here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from bridge.storage.rocketmq.connection import (
    BrokerUnavailable,
    RemotingConnection,
    RemotingError,
    RemotingTimeout,
)
from bridge.storage.rocketmq.messages import LMQ_PREFIX
from bridge.storage.rocketmq.types import BrokerInfo, TopicRoute, parse_brokers, parse_route
from bridge.storage.rocketmq.wire import (
    RemotingCommand,
    RemotingProtocolError,
    RequestCode,
    ResponseCode,
    loads_fastjson,
)

__all__ = ["NameServerRouting"]


class NameServerRouting:
    """Route and broker lookups for `RocketMQClient`; not usable on its own."""

    if TYPE_CHECKING:
        # Owned and initialised by RocketMQClient; declared here for the type checker only.
        namesrv_addrs: list[str]
        request_timeout: float
        route_refresh_interval: float
        max_attempts: int
        retry_deadline: float
        _routes: dict[str, TopicRoute]
        _route_locks: dict[str, asyncio.Lock]
        _namesrv_index: int
        _cluster_brokers: dict[str, BrokerInfo]

        async def connection(self, addr: str) -> RemotingConnection: ...

        async def _backoff(self, attempt: int, deadline: float) -> bool: ...

    async def _namesrv_call(
        self, code: int, ext_fields: Mapping[str, str] | None = None
    ) -> RemotingCommand:
        """A request to the NameServers, trying each in turn (bounded); RemotingError unless the
        answer is SUCCESS."""
        deadline = time.monotonic() + self.retry_deadline
        last: Exception | None = None
        for attempt in range(1, self.max_attempts + len(self.namesrv_addrs)):
            addr = self.namesrv_addrs[self._namesrv_index % len(self.namesrv_addrs)]
            try:
                conn = await self.connection(addr)
                response = await conn.request(code, ext_fields, timeout=self.request_timeout)
            except (BrokerUnavailable, RemotingTimeout) as exc:
                last = exc
                self._namesrv_index += 1
                if not await self._backoff(attempt, deadline):
                    break
            else:
                if response.code != ResponseCode.SUCCESS:
                    raise RemotingError(
                        response.code, response.remark, addr="NameServer", request=code
                    )
                return response
        assert last is not None
        raise last

    async def get_route(self, topic: str, *, refresh: bool = False) -> TopicRoute:
        """The topic's route (cached; fetched when missing, stale or `refresh`).

        Raises RemotingError(TOPIC_NOT_EXIST) when the NameServer knows no such topic.
        """
        route = self._routes.get(topic)
        if (
            route is not None
            and not refresh
            and time.monotonic() - route.fetched_at < self.route_refresh_interval * 2
        ):
            return route
        lock = self._route_locks.setdefault(topic, asyncio.Lock())
        async with lock:
            current = self._routes.get(topic)
            if current is not None and current is not route:
                return current  # refreshed while we waited
            response = await self._namesrv_call(
                RequestCode.GET_ROUTEINFO_BY_TOPIC,
                {"topic": topic, "acceptStandardJsonOnly": "true"},
            )
            route = parse_route(topic, response.body)
            self._routes[topic] = route
            return route

    def invalidate_route(self, topic: str) -> None:
        """Forget the cached route of `topic` (it is fetched again on next use)."""
        self._routes.pop(topic, None)

    async def cluster_brokers(self, *, refresh: bool = False) -> dict[str, BrokerInfo]:
        """Every broker set registered with the NameServer (GET_BROKER_CLUSTER_INFO)."""
        if self._cluster_brokers and not refresh:
            return self._cluster_brokers
        response = await self._namesrv_call(RequestCode.GET_BROKER_CLUSTER_INFO)
        try:
            table = loads_fastjson(response.body).get("brokerAddrTable") or {}
            self._cluster_brokers = parse_brokers(table.values())
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RemotingProtocolError(f"malformed cluster info: {exc!r}") from None
        return self._cluster_brokers

    async def broker_addr(self, topic: str, broker_name: str | None = None) -> str:
        """The master address serving `topic` (or `broker_name`).

        LMQ queues ("%LMQ%...") have no route of their own: they live on every broker with
        enableLmq, so any master (or the named one) serves them.
        """
        if topic.startswith(LMQ_PREFIX):
            brokers = await self.cluster_brokers()
            names = [broker_name] if broker_name else sorted(brokers)
            for name in names:
                info = brokers.get(name)
                if info is not None and info.master_addr:
                    return info.master_addr
            raise BrokerUnavailable(f"no master broker for {topic!r}", maybe_delivered=False)
        route = await self.get_route(topic)
        return route.master_addr(broker_name)
