"""The RocketMQ store's write path: submitted messages on their way to the broker, in order.

`new_send` turns a message into what is sent (SEND_MESSAGE_V2 properties, light queues to
dispatch to). `SendPipeline` sends them in submission order over one connection per broker,
pipelined (without waiting for earlier answers) but at most `send_window` at a time, matches
the answers, fails sends not answered within `send_timeout`, and completes the callbacks in
submission order whatever order the answers take (see "Order" and "Durability" in store.py).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from bridge.storage.base import (
    DurableCallback,
    Message,
    RecordsNotWritten,
    StaleOwner,
    StoreUnavailable,
)
from bridge.storage.rocketmq.acl import authentication_hint
from bridge.storage.rocketmq.client import RocketMQClient
from bridge.storage.rocketmq.connection import (
    BrokerUnavailable,
    RemotingConnection,
    RemotingError,
    RocketMQError,
    refusal_message,
)
from bridge.storage.rocketmq.groups import BrokerGroups, group_seq, part_name
from bridge.storage.rocketmq.mapping import MULTI_DISPATCH, PROP_NOTIFY_SKIP, to_rocketmq
from bridge.storage.rocketmq.messages import (
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    PROPERTY_WAIT_STORE_MSG_OK,
    encode_properties,
)
from bridge.storage.rocketmq.queues import QueueEnds
from bridge.storage.rocketmq.sendframe import SendFrames
from bridge.storage.rocketmq.types import DEFAULT_TOPIC
from bridge.storage.rocketmq.wire import RemotingCommand, ResponseCode

__all__ = ["Send", "SendPipeline", "new_send"]

# The store's logger: these are the store's sends.
log = logging.getLogger("bridge.storage.rocketmq")

_SEND_OK = ResponseCode.SUCCESS
_NOT_DURABLE: dict[int, str] = {
    ResponseCode.FLUSH_DISK_TIMEOUT: "the broker did not flush it to disk in time",
    ResponseCode.FLUSH_SLAVE_TIMEOUT: "the broker's slave did not confirm it in time",
    ResponseCode.SLAVE_NOT_AVAILABLE: "the broker's slave is not available",
}


@dataclass(slots=True)
class Send:
    """One submitted message on its way to the broker."""

    topic: str
    tag: str
    keys: str
    properties: dict[str, str]
    body: bytes
    queues: tuple[str, ...]
    """The bridge queues it is stored on (their parts on the group it goes to count it)."""
    size: int
    callback: DurableCallback | None
    group: str = ""
    """The broker group it was sent to."""
    group_tag: int = 0
    """That group's tag in seqs."""
    meta_durable: asyncio.Future[None] | None = None
    sent_at: float = 0.0
    conn: RemotingConnection | None = None
    opaque: int = -1
    done: bool = False
    seq: int | None = None
    error: BaseException | None = None


@dataclass(slots=True)
class _Target:
    """Where a RocketMQ topic's messages go: one broker group's queues, round-robin."""

    addr: str
    broker: str
    queue_ids: list[int]
    tag: int
    """The group's tag in the seqs of its messages."""
    counter: Any = field(default_factory=itertools.count)


def _seq_of(offset_msg_id: str) -> int:
    """The commit-log offset in a broker message id (store host + port + offset, hex)."""
    return int(offset_msg_id[-16:], 16)


def new_send(
    message: Message,
    queues: tuple[str, ...],
    dispatch: str,
    callback: DurableCallback | None,
    notify_skip: str = "",
) -> Send:
    """What sending `message` for the bridge `queues` takes; `dispatch` names their light
    queues (the INNER_MULTI_DISPATCH property, "" for none); `notify_skip` is the notifier that
    has nothing to do for it (`PROP_NOTIFY_SKIP`, "" for none)."""
    topic, tag, keys, properties, body = to_rocketmq(message, ())
    if dispatch:
        properties[MULTI_DISPATCH] = dispatch
    if notify_skip:
        properties[PROP_NOTIFY_SKIP] = notify_skip
    properties[PROPERTY_TAGS] = tag
    if keys:
        properties[PROPERTY_KEYS] = keys
    properties[PROPERTY_UNIQ_KEY] = os.urandom(16).hex().upper()
    properties[PROPERTY_WAIT_STORE_MSG_OK] = "true"
    size = len(message.payload) + len(message.topic.encode())
    return Send(topic, tag, keys, properties, body, queues, size, callback)


class SendPipeline:
    """The sends of one store: queued, in flight, answered, completed in order.

    Handed the client whose connections it sends over, the broker groups (which one each topic
    goes to), the queue ends it counts confirmed messages in, and the store's `stats` (it
    counts "sent", "send_failures", "send_timeouts").
    """

    def __init__(
        self,
        client: RocketMQClient,
        groups: BrokerGroups,
        ends: QueueEnds,
        stats: dict[str, int],
        *,
        send_timeout: float,
        send_window: int,
    ) -> None:
        self._client = client
        self._groups = groups
        self._ends = ends
        self._stats = stats
        self.send_timeout = send_timeout
        self.send_window = send_window
        self._running = False
        self._sendq: deque[Send] = deque()
        self._inflight: deque[Send] = deque()
        self._window_open: asyncio.Event | None = None
        self._pump_task: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._targets: dict[str, _Target] = {}
        self._frames = SendFrames(client.producer_group, signer=client.signer)

    @property
    def pending(self) -> int:
        """Sends not completed yet: queued, or sent and waiting (for their answer or for the
        completion of earlier ones)."""
        return len(self._sendq) + len(self._inflight)

    def start(self) -> None:
        """Start failing sends the broker does not answer in time."""
        self._running = True
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    def stop(self, error: StoreUnavailable) -> None:
        """Stop sending; every send not completed yet fails with `error`."""
        self._running = False
        for task in (self._pump_task, self._sweeper):
            if task is not None:
                task.cancel()
        self._fail_all(error)

    def enqueue(self, send: Send) -> None:
        """Queue a send behind the others; start the pump if it is not running."""
        self._sendq.append(send)
        if self._pump_task is None:
            self._pump_task = asyncio.get_running_loop().create_task(self._pump())

    async def _pump(self) -> None:
        """Send queued messages in order; a message whose meta is not yet durable holds back
        the ones after it (so the broker sees them in submission order)."""
        client = self._client
        try:
            while self._sendq:
                if len(self._inflight) >= self.send_window:
                    # Bounded pipeline: a burst queues here rather than in the broker's send
                    # queue, which refuses requests that wait there too long.
                    self._window_open = asyncio.Event()
                    await self._window_open.wait()
                    continue
                send = self._sendq[0]
                if send.meta_durable is not None and not send.meta_durable.done():
                    await asyncio.wait([send.meta_durable])
                self._sendq.popleft()
                failed = None if send.meta_durable is None else send.meta_durable.exception()
                if failed is not None:
                    # A StaleOwner stays one: the caller tells a client taken over from an outage.
                    if not isinstance(failed, StaleOwner):
                        maybe = isinstance(failed, StoreUnavailable) and failed.maybe_stored
                        failed = RecordsNotWritten(str(failed), maybe_stored=maybe)
                    # Callbacks run from the in-flight queue, in order: a send that never
                    # entered it would never be answered (its publisher waiting forever).
                    self._inflight.append(send)
                    self._finish(send, None, failed)
                    self._complete_in_order()
                    continue
                target = None
                try:
                    target = self._targets.get(send.topic) or await self._route(send.topic)
                    send.group = target.broker
                    send.group_tag = target.tag
                    conn = await client.connection(target.addr)
                    queue_id = target.queue_ids[next(target.counter) % len(target.queue_ids)]
                    opaque = conn.new_opaque()
                    frame = self._frames.frame(
                        opaque,
                        send.topic,
                        queue_id,
                        encode_properties(send.properties),
                        int(time.time() * 1000),
                        send.body,
                    )
                    send.sent_at = time.monotonic()
                    send.conn = conn
                    send.opaque = opaque
                    self._inflight.append(send)
                    conn.send_frame_nowait(
                        opaque,
                        frame,
                        lambda response, error, send=send: self._answered(send, response, error),
                    )
                except (RocketMQError, OSError, ValueError) as exc:
                    self._targets.pop(send.topic, None)
                    if target is not None and isinstance(exc, (BrokerUnavailable, OSError)):
                        self._group_failed(target.broker, send.topic)
                    maybe = isinstance(exc, BrokerUnavailable) and exc.maybe_delivered
                    error = StoreUnavailable(f"RocketMQ send failed: {exc}", maybe_stored=maybe)
                    if send not in self._inflight:
                        self._inflight.append(send)
                    self._finish(send, None, error)
                    # The broker is unreachable: everything queued behind fails now too (the
                    # publishers resend) instead of each waiting for its own reconnect attempts.
                    if not isinstance(exc, ValueError):
                        while self._sendq:
                            behind = self._sendq.popleft()
                            self._inflight.append(behind)
                            self._finish(behind, None, StoreUnavailable(str(error)))
                    self._complete_in_order()
                    continue
                if not conn.writable:
                    await conn.drained()
        finally:
            self._pump_task = None
            if self._sendq and self._running:
                self._pump_task = asyncio.get_running_loop().create_task(self._pump())

    async def _route(self, topic: str) -> _Target:
        """The broker group a RocketMQ topic's messages go to (`BrokerGroups.pick`) among those
        that take writes for it: the groups whose queues of the topic are writable, and, where
        the topic does not exist yet, those whose default topic is (a broker with
        autoCreateTopicEnable creates it on the first message). The target is kept for the
        next sends once the topic's own route has the group."""
        client = self._client
        own: dict[str, list[int]] = {}
        addrs: dict[str, str] = {}
        try:
            route = await client.get_route(topic)
        except RemotingError as exc:
            if exc.code != ResponseCode.TOPIC_NOT_EXIST:
                raise
        else:
            for name, qid in route.write_queues():
                own.setdefault(name, []).append(qid)
                addrs[name] = route.master_addr(name)
        try:
            default = await client.get_route(DEFAULT_TOPIC)
        except RemotingError as exc:
            if exc.code != ResponseCode.TOPIC_NOT_EXIST:
                raise
        else:
            for name, _qid in default.write_queues():
                addrs.setdefault(name, default.master_addr(name))
        group = self._groups.pick(topic, addrs)
        if group is None:
            raise BrokerUnavailable(
                f"no broker group takes writes of {topic!r}", maybe_delivered=False
            )
        queue_ids = sorted(own.get(group, ()))
        target = _Target(addrs[group], group, queue_ids or [0], self._groups.tag(group))
        if queue_ids:
            self._targets[topic] = target
        return target

    def forget_targets(self, groups: frozenset[str]) -> None:
        """Route the next sends of every topic that goes to one of `groups` anew."""
        for name in [t for t, target in self._targets.items() if target.broker in groups]:
            del self._targets[name]

    def _group_failed(self, group: str, topic: str) -> None:
        """A group's master did not take a send: its topics go elsewhere for a while, and the
        routes are looked up again (the NameServer drops a master that went away)."""
        self._groups.failed(group)
        for name in [t for t, target in self._targets.items() if target.broker == group]:
            del self._targets[name]
        self._client.invalidate_route(topic)
        self._client.invalidate_route(DEFAULT_TOPIC)

    def _answered(
        self, send: Send, response: RemotingCommand | None, error: BaseException | None
    ) -> None:
        if send.done:
            return
        if response is None:
            self._targets.pop(send.topic, None)
            if send.group:
                self._group_failed(send.group, send.topic)
            self._finish(
                send,
                None,
                StoreUnavailable(f"RocketMQ connection lost: {error}", maybe_stored=True),
            )
        elif response.code == _SEND_OK:
            try:
                seq = group_seq(_seq_of(response.ext_fields["msgId"]), send.group_tag)
            except (KeyError, ValueError):
                self._finish(send, None, StoreUnavailable("SEND_OK without a message id"))
            else:
                self._finish(send, seq, None)
        else:
            reason = _NOT_DURABLE.get(response.code)
            if response.code in (ResponseCode.TOPIC_NOT_EXIST, ResponseCode.NO_PERMISSION):
                self._targets.pop(send.topic, None)
                self._client.invalidate_route(send.topic)
            refused = response.code == ResponseCode.NO_PERMISSION and (
                authentication_hint(response.remark or "") is not None
            )
            if refused:
                # Our credentials, not the group: every group would answer the same.
                reason = refusal_message(
                    response.code, response.remark, addr=send.conn.addr if send.conn else ""
                )
            elif send.group and (response.code == ResponseCode.NO_PERMISSION or reason is not None):
                # Drained (no write permission), or its slave does not confirm (SYNC_MASTER):
                # the group cannot make messages durable now, so its topics go elsewhere.
                self._group_failed(send.group, send.topic)
            self._finish(
                send,
                None,
                StoreUnavailable(
                    f"RocketMQ did not store the message: {reason or response.remark} "
                    f"(code {response.code})",
                    maybe_stored=reason is not None and not refused,
                ),
            )
        self._complete_in_order()

    def _finish(self, send: Send, seq: int | None, error: BaseException | None) -> None:
        send.done = True
        send.seq = seq
        send.error = error
        if error is None:
            self._stats["sent"] += 1
            if send.queues:
                group = send.group
                self._ends.count_stored(
                    [part_name(group, q) for q in send.queues], send.size, send.keys
                )
        else:
            self._stats["send_failures"] += 1

    def _complete_in_order(self) -> None:
        inflight = self._inflight
        while inflight and inflight[0].done:
            send = inflight.popleft()
            if send.callback is None:
                if send.error is not None:
                    log.debug("QoS 0 message not stored: %s", send.error)
                continue
            try:
                send.callback(send.seq, send.error)
            except Exception:
                log.exception("a durability callback failed")
        if self._window_open is not None and len(inflight) <= self.send_window // 2:
            self._window_open.set()
            self._window_open = None

    async def _sweep(self) -> None:
        """Fail sends the broker has not answered within `send_timeout`."""
        interval = min(0.25, self.send_timeout / 4)
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            expired = False
            for send in self._inflight:
                if send.done or not send.sent_at:
                    continue
                if now - send.sent_at < self.send_timeout:
                    break
                if send.conn is not None:
                    send.conn.forget(send.opaque)
                self._stats["send_timeouts"] += 1
                self._finish(
                    send,
                    None,
                    StoreUnavailable(
                        f"RocketMQ did not answer a send within {self.send_timeout:.1f} s",
                        maybe_stored=True,
                    ),
                )
                expired = True
            if expired:
                self._targets.clear()
                self._complete_in_order()

    def _fail_all(self, error: StoreUnavailable) -> None:
        while self._sendq:
            self._inflight.append(self._sendq.popleft())
        for send in self._inflight:
            if not send.done:
                self._finish(send, None, error)
        self._complete_in_order()
