"""`NameServerRouting`: where a topic's messages live, as the NameServers tell it.

Topic routes (cached, refreshed when stale, on demand and by the client's background task),
the cluster's broker sets, master addresses, and requests to the master serving a topic (the
route is dropped when that master cannot be reached, so the next request looks it up again).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

from bridge.storage.rocketmq.connection import (
    BrokerUnavailable,
    RemotingError,
    RemotingTimeout,
    RocketMQError,
)
from bridge.storage.rocketmq.messages import LMQ_PREFIX
from bridge.storage.rocketmq.pool import ConnectionPool
from bridge.storage.rocketmq.types import BrokerInfo, TopicRoute, parse_brokers, parse_route
from bridge.storage.rocketmq.wire import (
    RemotingCommand,
    RemotingProtocolError,
    RequestCode,
    ResponseCode,
    loads_fastjson,
)

__all__ = ["NameServerRouting"]

# The remoting logger, shared by connection.py, routing.py and membership.py: a logging
# configuration that names `bridge.storage.rocketmq_remoting` applies to all three.
log = logging.getLogger("bridge.storage.rocketmq_remoting")

_CLUSTER_REFETCH_SECONDS = 1.0


class NameServerRouting:
    """The route cache and broker lookups of one client; requests go through its `pool`."""

    def __init__(
        self, pool: ConnectionPool, namesrv_addrs: list[str], *, route_refresh_interval: float
    ) -> None:
        self._pool = pool
        self._namesrv_addrs = namesrv_addrs
        self._route_refresh_interval = route_refresh_interval
        self._routes: dict[str, TopicRoute] = {}
        self._route_locks: dict[str, asyncio.Lock] = {}
        self._namesrv_index = 0
        self._cluster_brokers: dict[str, BrokerInfo] = {}
        self._cluster_failed_at = 0.0
        """When a broker found in the cluster table last could not be reached."""
        self._cluster_fetched_at = 0.0

    async def namesrv_call(
        self, code: int, ext_fields: Mapping[str, str] | None = None
    ) -> RemotingCommand:
        """A request to the NameServers, trying each in turn (bounded); RemotingError unless the
        answer is SUCCESS."""
        pool = self._pool
        deadline = pool.deadline()
        last: Exception | None = None
        for attempt in range(1, pool.max_attempts + len(self._namesrv_addrs)):
            addr = self._namesrv_addrs[self._namesrv_index % len(self._namesrv_addrs)]
            try:
                conn = await pool.connection(addr)
                response = await conn.request(code, ext_fields, timeout=pool.request_timeout)
            except (BrokerUnavailable, RemotingTimeout) as exc:
                last = exc
                self._namesrv_index += 1
                if not await pool.backoff(attempt, deadline):
                    break
            else:
                if response.code != ResponseCode.SUCCESS:
                    raise RemotingError(
                        response.code, response.remark, addr="NameServer", request=code
                    )
                return response
        assert last is not None
        raise last

    async def get_route(self, topic: str) -> TopicRoute:
        """The topic's route: the cached one, fetched first when missing or stale.

        Raises RemotingError(TOPIC_NOT_EXIST) when the NameServer knows no such topic.
        """
        route = self._routes.get(topic)
        if (
            route is not None
            and time.monotonic() - route.fetched_at < self._route_refresh_interval * 2
        ):
            return route
        return await self._fetch_route(topic, route)

    async def fetch_route(self, topic: str) -> TopicRoute:
        """Ask the NameServer for the topic's route now and cache it (a route that changed:
        a broker group added, a queue's permissions). Raises as `get_route`."""
        return await self._fetch_route(topic, self._routes.get(topic))

    async def _fetch_route(self, topic: str, seen: TopicRoute | None) -> TopicRoute:
        """Fetch the route of `topic` in place of `seen`, the cached one the caller found
        wanting: one fetch at a time per topic, and a caller that waited for another's fetch
        takes its result."""
        lock = self._route_locks.setdefault(topic, asyncio.Lock())
        async with lock:
            current = self._routes.get(topic)
            if current is not None and current is not seen:
                return current  # refreshed while we waited
            response = await self.namesrv_call(
                RequestCode.GET_ROUTEINFO_BY_TOPIC,
                {"topic": topic, "acceptStandardJsonOnly": "true"},
            )
            route = parse_route(topic, response.body)
            self._routes[topic] = route
            return route

    def invalidate_route(self, topic: str) -> None:
        """Forget the cached route of `topic` (it is fetched again on next use)."""
        self._routes.pop(topic, None)

    async def refresh_routes(self) -> None:
        """Fetch every cached route again; forget those of topics the NameServer no longer
        knows. Other failures are logged (the route stays until it is used or goes stale)."""
        for topic in list(self._routes):
            try:
                await self.fetch_route(topic)
            except RemotingError as exc:
                if exc.code == ResponseCode.TOPIC_NOT_EXIST:
                    self.invalidate_route(topic)
            except RocketMQError as exc:
                log.warning("route refresh of %s failed: %s", topic, exc)

    async def cluster_brokers(self) -> dict[str, BrokerInfo]:
        """Every broker set registered with the NameServer (GET_BROKER_CLUSTER_INFO): the
        table last fetched, fetched first if there is none."""
        if self._cluster_brokers:
            return self._cluster_brokers
        return await self.fetch_cluster_brokers()

    async def fetch_cluster_brokers(self) -> dict[str, BrokerInfo]:
        """Ask the NameServer for every broker set now, and keep the table."""
        response = await self.namesrv_call(RequestCode.GET_BROKER_CLUSTER_INFO)
        try:
            table = loads_fastjson(response.body).get("brokerAddrTable") or {}
            self._cluster_brokers = parse_brokers(table.values())
            self._cluster_fetched_at = time.monotonic()
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RemotingProtocolError(f"malformed cluster info: {exc!r}") from None
        return self._cluster_brokers

    def _cluster_stale(self) -> bool:
        """Whether the cluster table should be fetched again before it is used: a broker in it
        could not be reached since it was fetched (at most once a second)."""
        now = time.monotonic()
        return (
            self._cluster_failed_at > self._cluster_fetched_at
            and now - self._cluster_fetched_at >= _CLUSTER_REFETCH_SECONDS
        )

    async def broker_addr(self, topic: str, broker_name: str | None = None) -> str:
        """The master address serving `topic` (or `broker_name`; its slave while the group's
        master is gone).

        LMQ queues ("%LMQ%...") have no route of their own: one lives on every broker group
        that stored a message for it. The named group's master serves it, or its slave while
        the master is gone (a SYNC_MASTER's slave holds every message the master acknowledged);
        without a name, the first master.
        """
        if topic.startswith(LMQ_PREFIX):
            brokers = await (
                self.fetch_cluster_brokers() if self._cluster_stale() else self.cluster_brokers()
            )
            if broker_name:
                info = brokers.get(broker_name)
                addr = info.read_addr if info is not None else None
                if addr is not None:
                    return addr
            else:
                for name in sorted(brokers):
                    if brokers[name].master_addr:
                        return brokers[name].master_addr or ""
            raise BrokerUnavailable(
                f"no broker of {broker_name or 'any group'} serves {topic!r}", maybe_delivered=False
            )
        route = await self.get_route(topic)
        if broker_name:
            # A request about one group's queues (a pull, an offset): its slave answers while
            # the master is gone.
            info = route.brokers.get(broker_name)
            if info is not None and not info.master_addr and info.read_addr:
                return info.read_addr
        return route.master_addr(broker_name)

    async def master_addrs(self, *, include_cluster: bool) -> list[str]:
        """Master addresses of the cached routes, plus every master of the cluster if asked.

        The cluster's brokers are fetched again from the NameServer (brokers may have joined);
        when that fails, the last known ones are used.
        """
        addrs = {
            broker.master_addr
            for route in list(self._routes.values())
            for broker in route.brokers.values()
            if broker.master_addr
        }
        if include_cluster:
            try:
                brokers = await self.fetch_cluster_brokers()
            except (RocketMQError, RemotingProtocolError) as exc:
                log.warning("cluster broker lookup failed, using the last known: %s", exc)
                brokers = self._cluster_brokers
            addrs.update(info.master_addr for info in brokers.values() if info.master_addr)
        return sorted(addrs)

    async def broker_call(
        self,
        topic: str,
        broker_name: str | None,
        code: int,
        fields: Mapping[str, str],
        timeout: float | None = None,
        *,
        body: bytes = b"",
        idempotent: bool = True,
    ) -> RemotingCommand:
        """A request to the master serving `topic` (for a light queue of `broker_name`: its
        master, or its slave while the master is gone); the route (or the cluster table) is
        looked up again after that fails."""
        addr = await self.broker_addr(topic, broker_name)
        try:
            return await self._pool.call(
                addr, code, fields, body, timeout=timeout, idempotent=idempotent
            )
        except BrokerUnavailable:
            if topic.startswith(LMQ_PREFIX):
                self._cluster_failed_at = time.monotonic()
            self.invalidate_route(topic)
            raise
