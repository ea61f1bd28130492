"""`ConsumerMembership`: how one client joins, shows up in and leaves consumer groups.

The brokers learn of a client from its heartbeats (HEART_BEAT, carrying its producer group and
the consumer groups it registered), list a group's members (GET_CONSUMER_LIST_BY_GROUP) and drop
a member that unregisters (UNREGISTER_CLIENT) or whose heartbeats stop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable

from bridge.storage.rocketmq.connection import RemotingError, RocketMQError, require_success
from bridge.storage.rocketmq.pool import ConnectionPool
from bridge.storage.rocketmq.routing import NameServerRouting
from bridge.storage.rocketmq.wire import (
    RemotingProtocolError,
    RequestCode,
    ResponseCode,
    loads_fastjson,
)

__all__ = ["ConsumerMembership"]

# The remoting logger, shared by connection.py, routing.py and membership.py: a logging
# configuration that names `bridge.storage.rocketmq_remoting` applies to all three.
log = logging.getLogger("bridge.storage.rocketmq_remoting")

NO_CONSUMER_REMARK = "no consumer for this group"
"""Start of the SYSTEM_ERROR remark of GET_CONSUMER_LIST_BY_GROUP for a group without members
(`ConsumerManageProcessor.getConsumerListByGroup`)."""


class ConsumerMembership:
    """The consumer groups one client announces, its heartbeats, and group member lists."""

    def __init__(
        self,
        pool: ConnectionPool,
        routing: NameServerRouting,
        *,
        client_id: str,
        producer_group: str,
    ) -> None:
        self._pool = pool
        self._routing = routing
        self._client_id = client_id
        self._producer_group = producer_group
        self._groups: dict[str, tuple[tuple[str, ...], int]] = {}
        """Consumer group -> (subscribed topics, subVersion) announced by `heartbeat`."""
        # Heartbeats and unregistrations do not interleave: an unregistration sent while a
        # heartbeat that still carries the group is under way would be undone by it.
        self._lock = asyncio.Lock()

    def register_consumer(self, group: str, topics: Iterable[str]) -> None:
        """Announce this client as a member of consumer `group` (clustering mode) from now on.

        Every `heartbeat` (periodic, or called now to announce at once) then carries the group
        as a passive (push-style) clustering consumer of `topics`, consuming from the last
        offset, subscribed to every tag; the brokers list this client among the group's members
        (`consumer_ids`). The broker keeps one subscription per group: every member should
        register the same topics. Registering again replaces the topics.
        """
        if not group:
            raise ValueError("register_consumer needs a consumer group")
        wanted = tuple(sorted(set(topics)))
        if any(not topic for topic in wanted):
            raise ValueError("topic names must be non-empty")
        current = self._groups.get(group)
        if current is not None and current[0] == wanted:
            return
        # The broker replaces a subscription only by a higher subVersion.
        version = int(time.time() * 1000)
        if current is not None:
            version = max(version, current[1] + 1)
        self._groups[group] = (wanted, version)

    def unregister_consumer(self, group: str) -> None:
        """Stop announcing `group` in heartbeats.

        The brokers drop this member once its last group heartbeat expires (channelExpiredTimeout,
        120 s by default); `unregister_client` drops it at once.
        """
        self._groups.pop(group, None)

    @property
    def consumer_groups(self) -> dict[str, tuple[str, ...]]:
        """The registered consumer groups and their topics."""
        return {group: topics for group, (topics, _) in self._groups.items()}

    async def consumer_ids(self, group: str, topic: str) -> list[str]:
        """Client ids of the members of `group`, as the broker serving `topic` knows them, sorted.

        GET_CONSUMER_LIST_BY_GROUP; a group without members (never registered, or every member
        left or expired) is answered SYSTEM_ERROR "no consumer for this group, ...", returned as
        an empty list.
        """
        response = await self._routing.broker_call(
            topic, None, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group}
        )
        if response.code == ResponseCode.SYSTEM_ERROR and (response.remark or "").startswith(
            NO_CONSUMER_REMARK
        ):
            return []
        require_success(response, RequestCode.GET_CONSUMER_LIST_BY_GROUP)
        if not response.body:
            return []
        try:
            ids = loads_fastjson(response.body).get("consumerIdList") or []
            return sorted(str(client_id) for client_id in ids)
        except (AttributeError, TypeError) as exc:
            raise RemotingProtocolError(f"malformed consumer list: {exc!r}") from None

    async def unregister_client(self, group: str) -> None:
        """Leave consumer `group` now: UNREGISTER_CLIENT to every master of the cluster.

        The group is first dropped from the heartbeats (`unregister_consumer`), so that no later
        heartbeat registers it again. A broker removes the member registered over the same
        connection, so this goes over the connections the heartbeats used. Every master is
        asked; the first failure (RemotingError, BrokerUnavailable, RemotingTimeout) is raised
        after all were tried.
        """
        self.unregister_consumer(group)
        fields = {"clientID": self._client_id, "consumerGroup": group}
        async with self._lock:
            addrs = await self._routing.master_addrs(include_cluster=True)
            errors: list[RocketMQError] = []
            for addr in addrs:
                try:
                    response = await self._pool.call(addr, RequestCode.UNREGISTER_CLIENT, fields)
                    if response.code != ResponseCode.SUCCESS:
                        raise RemotingError(
                            response.code,
                            response.remark,
                            addr=addr,
                            request=RequestCode.UNREGISTER_CLIENT,
                        )
                except RocketMQError as exc:
                    log.warning(
                        "unregistering %s of %s at %s failed: %s", self._client_id, group, addr, exc
                    )
                    errors.append(exc)
            if errors:
                raise errors[0]

    async def heartbeat(self) -> None:
        """Register this client with the brokers (HEART_BEAT) and refresh its registration.

        The heartbeat carries the producer group and the consumer groups of `register_consumer`.
        It goes to the masters of the cached routes; with consumer groups registered, to every
        master of the cluster too (a group's members must be known wherever its topics' queues
        are). Failures are logged, not raised (the next heartbeat retries).
        """
        async with self._lock:
            body = self._heartbeat_data()
            addrs = await self._routing.master_addrs(include_cluster=bool(self._groups))
            for addr in addrs:
                try:
                    conn = await self._pool.connection(addr)
                    response = await conn.request(
                        RequestCode.HEART_BEAT, {}, body, timeout=self._pool.request_timeout
                    )
                except RocketMQError as exc:
                    log.warning("heartbeat to %s failed: %s", addr, exc)
                    continue
                if response.code != ResponseCode.SUCCESS:
                    log.warning(
                        "heartbeat to %s refused: code %s, %s", addr, response.code, response.remark
                    )

    async def check_access(self) -> None:
        """Heartbeat every master of the cluster now and raise the RemotingError of the first
        one that refuses our credentials (`authentication_refused`), so a client with missing
        or wrong credentials fails when it starts, naming the setting, not at its first send.
        Other failures are left to the periodic heartbeats."""
        async with self._lock:
            body = self._heartbeat_data()
            addrs = await self._routing.master_addrs(include_cluster=True)
        for addr in addrs:
            try:
                response = await self._pool.call(addr, RequestCode.HEART_BEAT, {}, body)
            except RocketMQError as exc:
                log.warning("heartbeat to %s failed: %s", addr, exc)
                continue
            if response.code != ResponseCode.SUCCESS:
                error = RemotingError(
                    response.code, response.remark, addr=addr, request=RequestCode.HEART_BEAT
                )
                if error.authentication_refused:
                    raise error
                log.warning("heartbeat to %s refused: %s", addr, error)

    def _heartbeat_data(self) -> bytes:
        """The HEART_BEAT body: `HeartbeatData` as JSON.

        Field names and enum values are those the broker's fastjson maps onto HeartbeatData,
        ProducerData, ConsumerData and SubscriptionData (remoting/protocol/heartbeat, 5.3.3).
        """
        consumers = [
            {
                "groupName": group,
                "consumeType": "CONSUME_PASSIVELY",
                "messageModel": "CLUSTERING",
                "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                "subscriptionDataSet": [
                    {
                        "classFilterMode": False,
                        "topic": topic,
                        "subString": "*",
                        "tagsSet": [],
                        "codeSet": [],
                        "subVersion": version,
                        "expressionType": "TAG",
                    }
                    for topic in topics
                ],
                "unitMode": False,
            }
            for group, (topics, version) in sorted(self._groups.items())
        ]
        return json.dumps(
            {
                "clientID": self._client_id,
                "producerDataSet": [{"groupName": self._producer_group}],
                "consumerDataSet": consumers,
                # 0: the classic heartbeat, which always carries the full subscriptions.
                "heartbeatFingerprint": 0,
                "withoutSub": False,
            }
        ).encode()
