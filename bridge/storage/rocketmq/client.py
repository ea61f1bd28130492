"""`RocketMQClient`: the producer and pull-consumer client of a RocketMQ cluster.

The client is one object with the operations the gateway needs; each is done by the part of the
client that owns its concern, handed only what it uses:

* `ConnectionPool` (pool.py): one connection per NameServer and broker, reopened on demand,
  and bounded retries; TLS (tls.py) and request signing (acl.py) for every connection;
* `NameServerRouting` (routing.py): topic routes (cached, refreshed in the background and
  after errors), the cluster's brokers, requests to the master serving a topic;
* `Producer` (producer.py): sends and the choice of queue;
* `PullConsumer` (consumer.py): pulls (with long polling), consumer offsets, queue offsets;
* `Admin` (admin.py): the topic list, topic creation, queries by message key;
* `ConsumerMembership` (membership.py): heartbeats with consumer data, member lists,
  unregistration.

Connections and errors are in connection.py, results and routes in types.py;
`bridge.storage.rocketmq.remoting` re-exports the public names.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType

from bridge.storage.rocketmq.acl import Credentials, RequestSigner
from bridge.storage.rocketmq.admin import Admin
from bridge.storage.rocketmq.connection import RemotingConnection
from bridge.storage.rocketmq.consumer import PullConsumer
from bridge.storage.rocketmq.membership import ConsumerMembership
from bridge.storage.rocketmq.messages import StoredMessage
from bridge.storage.rocketmq.pool import ConnectionPool
from bridge.storage.rocketmq.producer import Producer
from bridge.storage.rocketmq.routing import NameServerRouting
from bridge.storage.rocketmq.tls import TlsOptions
from bridge.storage.rocketmq.types import (
    PERM_READ,
    PERM_WRITE,
    BrokerInfo,
    PullResult,
    SendResult,
    TopicRoute,
)
from bridge.storage.rocketmq.wire import DEFAULT_MAX_FRAME_SIZE, RemotingCommand

__all__ = ["RocketMQClient"]


class RocketMQClient:
    """Producer and pull-consumer client of a RocketMQ cluster, found through its NameServer(s).

    Owns its configuration (the attributes set here, fixed once constructed), its parts (see the
    module docstring) and the background task that refreshes routes and sends heartbeats.
    Every operation is bounded: at most `max_attempts` tries within `retry_deadline` seconds,
    with exponential backoff between reconnects. Use `async with RocketMQClient(...)` or call
    `start()` and `close()`.
    """

    def __init__(
        self,
        namesrv_addr: str | Sequence[str],
        *,
        client_id: str,
        producer_group: str,
        consumer_group: str | None = None,
        request_timeout: float = 3.0,
        connect_timeout: float = 3.0,
        route_refresh_interval: float = 30.0,
        heartbeat_interval: float = 30.0,
        max_attempts: int = 3,
        retry_deadline: float = 10.0,
        backoff_initial: float = 0.05,
        backoff_max: float = 1.0,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        credentials: Credentials | None = None,
        tls: TlsOptions | None = None,
    ) -> None:
        """`credentials`: sign every request (a cluster with authentication on); `tls`: open
        every connection (NameServers and brokers) over TLS. Raises ValueError for no NameServer
        and `TlsOptionsError` (a ValueError naming the option) for unusable TLS files."""
        addrs = namesrv_addr.split(";") if isinstance(namesrv_addr, str) else list(namesrv_addr)
        self.namesrv_addrs = [a.strip() for a in addrs if a.strip()]
        if not self.namesrv_addrs:
            raise ValueError("no NameServer address")
        self.client_id = client_id
        self.producer_group = producer_group
        self.consumer_group = consumer_group
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout
        self.route_refresh_interval = route_refresh_interval
        self.heartbeat_interval = heartbeat_interval
        self.max_attempts = max(1, max_attempts)
        self.retry_deadline = retry_deadline
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.max_frame_size = max_frame_size
        self.signer = RequestSigner(credentials) if credentials is not None else None
        """Signs every request, the hot path's pre-encoded sends included (None: unsigned)."""
        self.tls = tls
        self._pool = ConnectionPool(
            request_timeout=request_timeout,
            connect_timeout=connect_timeout,
            max_attempts=self.max_attempts,
            retry_deadline=retry_deadline,
            backoff_initial=backoff_initial,
            backoff_max=backoff_max,
            max_frame_size=max_frame_size,
            ssl_context=tls.context() if tls is not None else None,
            signer=self.signer,
        )
        self._routing = NameServerRouting(
            self._pool, self.namesrv_addrs, route_refresh_interval=route_refresh_interval
        )
        self._producer = Producer(self._pool, self._routing, producer_group)
        self._consumer = PullConsumer(self._pool, self._routing, consumer_group)
        self._admin = Admin(self._pool, self._routing)
        self._membership = ConsumerMembership(
            self._pool, self._routing, client_id=client_id, producer_group=producer_group
        )
        self._maintenance: asyncio.Task[None] | None = None

    # -- lifecycle

    async def start(self) -> None:
        """Start the background route refresh and heartbeat task."""
        if self._maintenance is None:
            self._maintenance = asyncio.create_task(
                self._maintain(), name=f"rocketmq-maintenance-{self.client_id}"
            )

    async def close(self) -> None:
        """Stop background work and close every connection."""
        # No connection is opened from here on, not even by the background task winding down.
        self._pool.closed = True
        if self._maintenance is not None:
            self._maintenance.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._maintenance
            self._maintenance = None
        await self._pool.close()

    async def __aenter__(self) -> RocketMQClient:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _maintain(self) -> None:
        """Refresh cached routes and send heartbeats periodically."""
        interval = min(self.route_refresh_interval, self.heartbeat_interval)
        while True:
            await asyncio.sleep(interval)
            await self._routing.refresh_routes()
            await self._membership.heartbeat()

    # -- connections and requests (ConnectionPool)

    async def connection(self, addr: str) -> RemotingConnection:
        """The open connection to `addr`, opened now if needed (one attempt)."""
        return await self._pool.connection(addr)

    async def call(
        self,
        addr: str,
        code: int,
        ext_fields: Mapping[str, str] | None = None,
        body: bytes = b"",
        *,
        timeout: float | None = None,
        idempotent: bool = True,
    ) -> RemotingCommand:
        """Send one request to `addr` with bounded retries; return the response.

        See `ConnectionPool.call` for what is retried.
        """
        return await self._pool.call(
            addr, code, ext_fields, body, timeout=timeout, idempotent=idempotent
        )

    # -- routes and brokers (NameServerRouting)

    async def get_route(self, topic: str) -> TopicRoute:
        """The topic's route: the cached one, fetched first when missing or stale.

        Raises RemotingError(TOPIC_NOT_EXIST) when the NameServer knows no such topic.
        """
        return await self._routing.get_route(topic)

    async def fetch_route(self, topic: str) -> TopicRoute:
        """Ask the NameServer for the topic's route now and cache it. Raises as `get_route`."""
        return await self._routing.fetch_route(topic)

    def invalidate_route(self, topic: str) -> None:
        """Forget the cached route of `topic` (it is fetched again on next use)."""
        self._routing.invalidate_route(topic)

    async def cluster_brokers(self) -> dict[str, BrokerInfo]:
        """Every broker set registered with the NameServer (GET_BROKER_CLUSTER_INFO), as last
        fetched."""
        return await self._routing.cluster_brokers()

    async def fetch_cluster_brokers(self) -> dict[str, BrokerInfo]:
        """Ask the NameServer for every broker set now, and keep the table."""
        return await self._routing.fetch_cluster_brokers()

    async def broker_addr(self, topic: str, broker_name: str | None = None) -> str:
        """The master address serving `topic` (or `broker_name`); any master for an LMQ."""
        return await self._routing.broker_addr(topic, broker_name)

    # -- producer (Producer)

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

        See `Producer.send` for the queue choice, retries and errors.
        """
        return await self._producer.send(
            topic,
            body,
            tags=tags,
            keys=keys,
            properties=properties,
            queue_id=queue_id,
            broker_name=broker_name,
            timeout=timeout,
            wait_store_msg_ok=wait_store_msg_ok,
        )

    async def choose_queue(
        self, topic: str, queue_id: int | None = None, broker_name: str | None = None
    ) -> tuple[str, int, str]:
        """(broker name, queue id, master address) for the next send to `topic`, for senders
        that send by themselves (`RocketMQStore`'s pipeline): `Producer.choose_queue`."""
        return await self._producer.choose_queue(topic, queue_id, broker_name)

    # -- consumer (PullConsumer)

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

        See `PullConsumer.pull` for long polling (`suspend_timeout_ms`), `subscription` and
        `expression_type`.
        """
        return await self._consumer.pull(
            topic,
            queue_id,
            offset,
            max_msgs,
            consumer_group=consumer_group,
            subscription=subscription,
            expression_type=expression_type,
            suspend_timeout_ms=suspend_timeout_ms,
            broker_name=broker_name,
            timeout=timeout,
        )

    async def query_consumer_offset(
        self,
        topic: str,
        queue_id: int,
        *,
        consumer_group: str | None = None,
        broker_name: str | None = None,
    ) -> int | None:
        """The group's committed offset in the queue, or None if it has none."""
        return await self._consumer.query_consumer_offset(
            topic, queue_id, consumer_group=consumer_group, broker_name=broker_name
        )

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
        """Commit the group's offset in the queue: `PullConsumer.update_consumer_offset`."""
        await self._consumer.update_consumer_offset(
            topic,
            queue_id,
            offset,
            consumer_group=consumer_group,
            broker_name=broker_name,
            oneway=oneway,
        )

    async def max_offset(self, topic: str, queue_id: int, *, broker_name: str | None = None) -> int:
        """The queue's max offset: the offset the next message will get."""
        return await self._consumer.max_offset(topic, queue_id, broker_name=broker_name)

    async def min_offset(self, topic: str, queue_id: int, *, broker_name: str | None = None) -> int:
        """The queue's min offset: the oldest message still retained."""
        return await self._consumer.min_offset(topic, queue_id, broker_name=broker_name)

    async def offset_at(
        self, topic: str, queue_id: int, timestamp_ms: int, *, broker_name: str | None = None
    ) -> int:
        """The offset of the queue's first message stored at or after `timestamp_ms`; the max
        offset if there is none."""
        return await self._consumer.offset_at(
            topic, queue_id, timestamp_ms, broker_name=broker_name
        )

    # -- topics and key queries (Admin)

    async def query_messages_by_key(
        self,
        topic: str,
        key: str,
        *,
        max_num: int = 32,
        begin_ms: int = 0,
        end_ms: int | None = None,
    ) -> list[StoredMessage]:
        """Messages of `topic` whose KEYS contain `key`, stored between `begin_ms` and `end_ms`.

        See `Admin.query_messages_by_key` for what the brokers' index can and cannot tell.
        """
        return await self._admin.query_messages_by_key(
            topic, key, max_num=max_num, begin_ms=begin_ms, end_ms=end_ms
        )

    async def topic_list(self) -> list[str]:
        """Every topic the NameServer knows (GET_ALL_TOPIC_LIST_FROM_NAMESERVER), sorted."""
        return await self._admin.topic_list()

    async def data_topics(self) -> list[str]:
        """The topics holding application messages (`Admin.data_topics`)."""
        return await self._admin.data_topics()

    async def create_topic(
        self,
        topic: str,
        *,
        read_queue_nums: int = 4,
        write_queue_nums: int = 4,
        perm: int = PERM_READ | PERM_WRITE,
        broker_names: Sequence[str] | None = None,
    ) -> None:
        """Create or update a topic on every master (or the named ones): UPDATE_AND_CREATE_TOPIC."""
        await self._admin.create_topic(
            topic,
            read_queue_nums=read_queue_nums,
            write_queue_nums=write_queue_nums,
            perm=perm,
            broker_names=broker_names,
        )

    # -- consumer-group membership (ConsumerMembership)

    def register_consumer(self, group: str, topics: Iterable[str]) -> None:
        """Announce this client as a member of consumer `group` in every heartbeat from now on
        (`ConsumerMembership.register_consumer`)."""
        self._membership.register_consumer(group, topics)

    def unregister_consumer(self, group: str) -> None:
        """Stop announcing `group` in heartbeats."""
        self._membership.unregister_consumer(group)

    @property
    def consumer_groups(self) -> dict[str, tuple[str, ...]]:
        """The registered consumer groups and their topics."""
        return self._membership.consumer_groups

    async def consumer_ids(self, group: str, topic: str) -> list[str]:
        """Client ids of the members of `group`, as the broker serving `topic` knows them, sorted
        (empty for a group without members)."""
        return await self._membership.consumer_ids(group, topic)

    async def unregister_client(self, group: str) -> None:
        """Leave consumer `group` now, at every master (`ConsumerMembership.unregister_client`)."""
        await self._membership.unregister_client(group)

    async def check_access(self) -> None:
        """Heartbeat every master now; RemotingError (`authentication_refused`) if a broker
        refuses this client's credentials (see `ConsumerMembership.check_access`)."""
        await self._membership.check_access()

    async def heartbeat(self) -> None:
        """Register this client with the brokers (HEART_BEAT) now; failures are logged."""
        await self._membership.heartbeat()
