"""`Producer`: sending messages (SEND_MESSAGE_V2) and choosing the queue a send goes to."""

from __future__ import annotations

import itertools
import random
import time
import uuid
from collections.abc import Mapping, Sequence

from bridge.storage.rocketmq.connection import BrokerUnavailable, RemotingError
from bridge.storage.rocketmq.messages import (
    KEY_SEPARATOR,
    LMQ_PREFIX,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    PROPERTY_WAIT_STORE_MSG_OK,
    send_message_v2_fields,
)
from bridge.storage.rocketmq.pool import ConnectionPool
from bridge.storage.rocketmq.routing import NameServerRouting
from bridge.storage.rocketmq.types import DEFAULT_TOPIC, SEND_STATUS_BY_CODE, SendResult
from bridge.storage.rocketmq.wire import RequestCode, ResponseCode

__all__ = ["Producer"]


class Producer:
    """The producer side of one client: its group, the round-robin over writable queues, and
    sends with retries of what is safe to retry."""

    def __init__(
        self, pool: ConnectionPool, routing: NameServerRouting, producer_group: str
    ) -> None:
        self._pool = pool
        self._routing = routing
        self._producer_group = producer_group
        self._queue_counter = itertools.count(random.randrange(1024))

    async def send(
        self,
        topic: str,
        body: bytes,
        *,
        tags: str | None = None,
        keys: Sequence[str] | str | None = None,
        properties: Mapping[str, str] | None = None,
        queue_id: int | None = None,
        broker_name: str | None = None,
        timeout: float | None = None,
        wait_store_msg_ok: bool = True,
    ) -> SendResult:
        """Send one message (SEND_MESSAGE_V2) and return where it was stored.

        The queue is chosen round-robin among the topic's writable queues unless `queue_id` (and
        `broker_name`) are given. A topic unknown to the NameServer is sent through the route of
        the default topic, so a broker with autoCreateTopicEnable creates it. Raises
        RemotingError for a refusal (e.g. TOPIC_NOT_EXIST, MESSAGE_ILLEGAL), BrokerUnavailable,
        RemotingTimeout (the message may or may not be stored).
        """
        props: dict[str, str] = {}
        if properties:
            props.update(properties)
        if tags:
            props[PROPERTY_TAGS] = tags
        if keys:
            props[PROPERTY_KEYS] = keys if isinstance(keys, str) else KEY_SEPARATOR.join(keys)
        msg_id = props.get(PROPERTY_UNIQ_KEY) or uuid.uuid4().hex.upper()
        props[PROPERTY_UNIQ_KEY] = msg_id
        props[PROPERTY_WAIT_STORE_MSG_OK] = "true" if wait_store_msg_ok else "false"

        pool = self._pool
        deadline = pool.deadline()
        attempt = 0
        while True:
            attempt += 1
            target_broker, target_queue, addr = await self.choose_queue(
                topic, queue_id, broker_name
            )
            fields = send_message_v2_fields(
                producer_group=self._producer_group,
                topic=topic,
                queue_id=target_queue,
                properties=props,
                born_timestamp=int(time.time() * 1000),
            )
            try:
                conn = await pool.connection(addr)
                response = await conn.request(
                    RequestCode.SEND_MESSAGE_V2,
                    fields,
                    body,
                    timeout=timeout or pool.request_timeout,
                )
            except BrokerUnavailable as exc:
                self._routing.invalidate_route(topic)
                if exc.maybe_delivered or not await pool.backoff(attempt, deadline):
                    raise
                continue
            status = SEND_STATUS_BY_CODE.get(response.code)
            if status is not None:
                ext = response.ext_fields
                return SendResult(
                    status=status,
                    msg_id=msg_id,
                    queue_id=int(ext.get("queueId", target_queue)),
                    queue_offset=int(ext.get("queueOffset", -1)),
                    offset_msg_id=ext.get("msgId", ""),
                    broker_name=target_broker,
                    topic=topic,
                )
            if response.code in (ResponseCode.TOPIC_NOT_EXIST, ResponseCode.NO_PERMISSION):
                self._routing.invalidate_route(topic)
            retryable = response.code in (ResponseCode.SYSTEM_BUSY, ResponseCode.SYSTEM_ERROR)
            if not retryable or not await pool.backoff(attempt, deadline):
                raise RemotingError(
                    response.code, response.remark, addr=addr, request=RequestCode.SEND_MESSAGE_V2
                )

    async def choose_queue(
        self, topic: str, queue_id: int | None = None, broker_name: str | None = None
    ) -> tuple[str, int, str]:
        """(broker name, queue id, master address) for the next send to `topic`.

        Takes the next queue of the round-robin, among those of `broker_name` or `queue_id` when
        given. A topic the NameServer does not know is routed like the default topic (and its
        cached route dropped, so the next send looks it up again, once the broker created it).
        """
        if topic.startswith(LMQ_PREFIX):
            raise ValueError(
                "LMQ queues are written through a normal topic with the INNER_MULTI_DISPATCH "
                "property, not sent to directly"
            )
        routing = self._routing
        try:
            route = await routing.get_route(topic)
            queues = route.write_queues()
        except RemotingError as exc:
            if exc.code != ResponseCode.TOPIC_NOT_EXIST:
                raise
            try:
                route = await routing.get_route(DEFAULT_TOPIC)
            except RemotingError as default_exc:
                if default_exc.code != ResponseCode.TOPIC_NOT_EXIST:
                    raise
                # Neither the topic nor the template is routed: no broker is registered.
                raise BrokerUnavailable(
                    f"no broker serves topic {topic!r} (nor {DEFAULT_TOPIC})", maybe_delivered=False
                ) from exc
            queues = route.write_queues()
            routing.invalidate_route(topic)
        if broker_name is not None:
            queues = [q for q in queues if q[0] == broker_name]
        if queue_id is not None:
            queues = [q for q in queues if q[1] == queue_id] or (
                [(queues[0][0], queue_id)] if queues else []
            )
        if not queues:
            raise BrokerUnavailable(f"no writable queue for topic {topic!r}", maybe_delivered=False)
        name, qid = queues[next(self._queue_counter) % len(queues)]
        return name, qid, route.master_addr(name)
