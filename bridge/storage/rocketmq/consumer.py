"""`PullConsumer`: reading queues — pulls (with long polling) and the offsets a reader needs.

Pulls (PULL_MESSAGE), a consumer group's committed offsets (QUERY_/UPDATE_CONSUMER_OFFSET), and
a queue's own offsets: its min and max (GET_MIN_/GET_MAX_OFFSET) and the offset at a time
(SEARCH_OFFSET_BY_TIMESTAMP). Every request goes to the master serving the topic.
"""

from __future__ import annotations

from bridge.storage.rocketmq.connection import RemotingError, require_success
from bridge.storage.rocketmq.messages import decode_messages
from bridge.storage.rocketmq.pool import ConnectionPool
from bridge.storage.rocketmq.routing import NameServerRouting
from bridge.storage.rocketmq.types import PULL_STATUS_BY_CODE, PullResult, PullStatus
from bridge.storage.rocketmq.wire import PullSysFlag, RequestCode, ResponseCode

__all__ = ["LONG_POLL_CHECK_SLACK", "PullConsumer"]

LONG_POLL_CHECK_SLACK = 6.0
"""Seconds a held pull may outlive its suspend time before the broker answers it."""


def _parse_tags(subscription: str) -> frozenset[str] | None:
    """Tags of a TAG expression ("a || b"), or None for "*" (everything)."""
    expression = subscription.strip()
    if not expression or expression == "*":
        return None
    return frozenset(tag.strip() for tag in expression.split("||") if tag.strip())


class PullConsumer:
    """The consumer side of one client: its default consumer group, pulls and queue offsets."""

    def __init__(
        self, pool: ConnectionPool, routing: NameServerRouting, consumer_group: str | None
    ) -> None:
        self._pool = pool
        self._routing = routing
        self._consumer_group = consumer_group

    def _group(self, given: str | None, operation: str) -> str:
        group = given or self._consumer_group
        if not group:
            raise ValueError(f"{operation} needs a consumer group")
        return group

    async def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_msgs: int = 32,
        *,
        consumer_group: str | None = None,
        subscription: str = "*",
        expression_type: str = "TAG",
        suspend_timeout_ms: int = 0,
        broker_name: str | None = None,
        timeout: float | None = None,
    ) -> PullResult:
        """Pull up to `max_msgs` messages of one queue from `offset` (PULL_MESSAGE).

        With `suspend_timeout_ms` > 0 the broker holds the request (long polling) until a message
        arrives or the time is up, then answers NO_NEW_MSG. `subscription` is a TAG expression
        ("*" or "a || b"; the broker filters by tag hash and this client re-checks the tag), or
        with `expression_type="SQL92"` a filter on message properties that the broker evaluates
        (it needs `enablePropertyFilter=true`, else the pull fails with SYSTEM_ERROR). A held
        SQL92 pull is woken only by a matching message; a pull that skipped only unmatched ones
        answers NO_MATCHED_MSG with `next_offset` past them.
        """
        group = self._group(consumer_group, "pull")
        sys_flag = PullSysFlag.SUBSCRIPTION
        if suspend_timeout_ms > 0:
            sys_flag |= PullSysFlag.SUSPEND
        fields = {
            "consumerGroup": group,
            "topic": topic,
            "queueId": str(queue_id),
            "queueOffset": str(offset),
            "maxMsgNums": str(max_msgs),
            "sysFlag": str(sys_flag),
            "commitOffset": "0",
            "suspendTimeoutMillis": str(suspend_timeout_ms),
            "subscription": subscription,
            "subVersion": "0",
            "expressionType": expression_type,
        }
        wait = (timeout or self._pool.request_timeout) + suspend_timeout_ms / 1000
        if suspend_timeout_ms > 0:
            # The broker checks held pulls on a timer (every 5 s with long polling on), so an
            # idle long poll is answered up to ~5 s after its suspend time: allow for that.
            wait += LONG_POLL_CHECK_SLACK
        response = await self._routing.broker_call(
            topic, broker_name, RequestCode.PULL_MESSAGE, fields, wait
        )
        status = PULL_STATUS_BY_CODE.get(response.code)
        if status is None:
            raise RemotingError(response.code, response.remark, request=RequestCode.PULL_MESSAGE)
        ext = response.ext_fields
        messages = decode_messages(response.body) if status is PullStatus.FOUND else []
        wanted = _parse_tags(subscription) if expression_type == "TAG" else None
        if wanted is not None:
            messages = [m for m in messages if m.tags in wanted]
        return PullResult(
            status=status,
            next_offset=int(ext.get("nextBeginOffset", offset)),
            min_offset=int(ext.get("minOffset", 0)),
            max_offset=int(ext.get("maxOffset", 0)),
            messages=messages,
            suggest_which_broker_id=int(ext.get("suggestWhichBrokerId", 0)),
        )

    # -- a consumer group's offsets

    async def query_consumer_offset(
        self,
        topic: str,
        queue_id: int,
        *,
        consumer_group: str | None = None,
        broker_name: str | None = None,
    ) -> int | None:
        """The group's committed offset in the queue, or None if it has none."""
        group = self._group(consumer_group, "query_consumer_offset")
        fields = {
            "consumerGroup": group,
            "topic": topic,
            "queueId": str(queue_id),
            "setZeroIfNotFound": "false",
        }
        response = await self._routing.broker_call(
            topic, broker_name, RequestCode.QUERY_CONSUMER_OFFSET, fields
        )
        if response.code == ResponseCode.QUERY_NOT_FOUND:
            return None
        require_success(response, RequestCode.QUERY_CONSUMER_OFFSET)
        return int(response.ext_fields["offset"])

    async def update_consumer_offset(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        *,
        consumer_group: str | None = None,
        broker_name: str | None = None,
        oneway: bool = False,
    ) -> None:
        """Commit the group's offset in the queue (the broker persists it every few seconds).

        The broker refuses (SUBSCRIPTION_GROUP_NOT_EXIST) a group it has never seen; a pull by
        the group creates it when autoCreateSubscriptionGroup is on.
        """
        group = self._group(consumer_group, "update_consumer_offset")
        fields = {
            "consumerGroup": group,
            "topic": topic,
            "queueId": str(queue_id),
            "commitOffset": str(offset),
        }
        if oneway:
            addr = await self._routing.broker_addr(topic, broker_name)
            conn = await self._pool.connection(addr)
            await conn.oneway(RequestCode.UPDATE_CONSUMER_OFFSET, fields)
            return
        response = await self._routing.broker_call(
            topic, broker_name, RequestCode.UPDATE_CONSUMER_OFFSET, fields
        )
        require_success(response, RequestCode.UPDATE_CONSUMER_OFFSET)

    # -- a queue's own offsets

    async def max_offset(self, topic: str, queue_id: int, *, broker_name: str | None = None) -> int:
        """The queue's max offset: the offset the next message will get."""
        response = await self._routing.broker_call(
            topic,
            broker_name,
            RequestCode.GET_MAX_OFFSET,
            {"topic": topic, "queueId": str(queue_id), "committed": "true"},
        )
        require_success(response, RequestCode.GET_MAX_OFFSET)
        return int(response.ext_fields["offset"])

    async def min_offset(self, topic: str, queue_id: int, *, broker_name: str | None = None) -> int:
        """The queue's min offset: the oldest message still retained."""
        response = await self._routing.broker_call(
            topic,
            broker_name,
            RequestCode.GET_MIN_OFFSET,
            {"topic": topic, "queueId": str(queue_id)},
        )
        require_success(response, RequestCode.GET_MIN_OFFSET)
        return int(response.ext_fields["offset"])

    async def offset_at(
        self, topic: str, queue_id: int, timestamp_ms: int, *, broker_name: str | None = None
    ) -> int:
        """The offset of the queue's first message stored at or after `timestamp_ms`
        (SEARCH_OFFSET_BY_TIMESTAMP, lower boundary); the max offset if there is none."""
        response = await self._routing.broker_call(
            topic,
            broker_name,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
            {
                "topic": topic,
                "queueId": str(queue_id),
                "timestamp": str(timestamp_ms),
                "boundaryType": "LOWER",
            },
        )
        require_success(response, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP)
        return int(response.ext_fields["offset"])
