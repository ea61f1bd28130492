"""What every setting of a bridge node is: its name, type and default (`Config`), what it does
(`SETTINGS`, from which the README's configuration table is written, so the two cannot drift),
and the error a bad value raises.

This room holds the data only, and imports nothing of the bridge. Reading it from a TOML file, the
environment and the command line is `bridge.config` (the front door, which re-exports these
names); each room checks that its values can work together (its `settings_checks.py`), and
`bridge.checks` runs every room's check.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

KiB = 1024
MiB = 1024 * KiB


@dataclass(slots=True)
class Config:
    """Every setting of a bridge node, with its default."""

    listen: list[str] = field(default_factory=lambda: ["127.0.0.1:1883"])
    tls_listen: list[str] = field(default_factory=list)
    ws_listen: list[str] = field(default_factory=list)
    wss_listen: list[str] = field(default_factory=list)
    ws_path: str = "/mqtt"
    ws_allowed_origins: list[str] = field(default_factory=list)
    tls_certfile: str = ""
    tls_keyfile: str = ""
    tls_cafile: str = ""
    tls_crlfile: str = ""
    tls_client_cert: str = "none"
    tls_cn_as_username: bool = False
    tls_failure_log_interval: float = 10.0
    data_dir: str = "./data"
    log_level: str = "info"
    node_id: str = ""
    store: str = "filelog"
    rocketmq_namesrv: str = "127.0.0.1:19876"
    rocketmq_namespace: str = ""
    rocketmq_send_timeout: float = 5.0
    rocketmq_held_reads: int = 1000
    rocketmq_access_key: str = ""
    rocketmq_secret_key: str = ""
    rocketmq_secret_key_file: str = ""
    rocketmq_tls: bool = False
    rocketmq_tls_cafile: str = ""
    rocketmq_tls_certfile: str = ""
    rocketmq_tls_keyfile: str = ""
    rocketmq_tls_verify_hostname: bool = True
    notify: bool = True
    password_file: str = ""
    allow_anonymous: bool | None = None
    allow_anonymous_public: bool = False
    auth_redis: bool = False
    auth_cache_ttl: float = 60.0
    acl_file: str = ""
    acl_redis: bool = False
    acl_cache_ttl: float = 60.0
    presubscribe: list[str] = field(default_factory=list)
    admin_listen: str = ""
    admin_token: str = ""
    metrics_public: bool = True
    admin_header_timeout: float = 10.0
    admin_keepalive_timeout: float = 60.0
    admin_body_timeout: float = 30.0
    admin_max_connections: int = 100
    sys_interval: float = 10.0
    client_events: bool = True
    client_events_qos: int = 1
    metering_interval: float = 10.0
    metering_redis_url: str = ""
    fsync: bool = True
    sync: str = "commit"
    sync_interval_ms: float = 10.0
    inline_commit_ms: float = 1.0
    store_qos0: bool = True
    deliver_before_commit: bool = True
    segment_bytes: int = 64 * MiB
    segment_preallocate_bytes: int = 1 * MiB
    retention_bytes: int = 1024 * MiB
    retention_seconds: float = 7 * 24 * 3600.0
    max_packet_size: int = 1 * MiB
    max_topic_length: int = 4096
    max_topic_levels: int = 128
    max_inflight: int = 32
    qos2_copy_window: int = 1024
    max_inbound_pending: int = 1000
    receive_maximum: int = 1000
    topic_alias_maximum: int = 64
    max_message_properties: int = 8192
    delayed_max_seconds: int = 3 * 24 * 3600
    delayed_max_pending: int = 100_000
    delayed_max_bytes: int = 256 * MiB
    delayed_max_bytes_per_client: int = 16 * MiB
    retained_max_messages: int = 100_000
    retained_max_bytes: int = 256 * MiB
    retained_max_messages_per_client: int = 10_000
    retained_max_bytes_per_client: int = 16 * MiB
    max_subscriptions_per_client: int = 1000
    max_awaiting_rel: int = 1000
    max_will_bytes: int = 64 * KiB
    server_reference: str = ""
    max_queued_messages: int = 10000
    max_queued_bytes: int = 64 * MiB
    session_expiry_seconds: float = 7 * 24 * 3600.0
    max_keepalive: int = 0
    connect_timeout: float = 10.0
    refused_connect_log_interval: float = 10.0
    protocol_fault_log_interval: float = 10.0
    max_unauthenticated: int = 4096
    max_unauthenticated_per_address: int = 128
    max_unauthenticated_bytes: int = 64 * 1024
    login_queue: int = 256
    login_queue_per_address: int = 16
    login_failure_delay: float = 0.5
    login_failure_delay_max: float = 4.0
    allow_zero_length_clientid: bool = True
    use_username_as_clientid: bool = False
    max_connections: int = 0
    connection_rate: float = 0.0
    connection_rate_wait: float = 5.0
    client_publish_rate: float = 0.0
    client_publish_bytes_rate: int = 0
    flapping_max_connects: int = 0
    flapping_window: float = 60.0
    flapping_ban_seconds: float = 300.0
    flapping_failed_logins: bool = True
    write_buffer_high: int = 16 * MiB
    slow_consumer_timeout: float = 30.0
    qos0_publisher_wait: float = 1.0
    offset_flush_interval: float = 0.2
    memory_trim_interval: float = 10.0
    drain_timeout: float = 5.0
    reuse_port: bool = False
    redis_url: str = ""
    redis_sentinels: str = ""
    redis_master_name: str = "mqtt-bridge"
    redis_timeout: float = 3.0
    redis_wait_replicas: int = 0
    redis_username: str = ""
    redis_password: str = ""
    redis_password_file: str = ""
    redis_sentinel_username: str = ""
    redis_sentinel_password: str = ""
    redis_sentinel_password_file: str = ""
    redis_tls: bool = False
    redis_tls_cafile: str = ""
    redis_tls_certfile: str = ""
    redis_tls_keyfile: str = ""
    cluster_name: str = "mqtt"
    cluster_secret: str = ""
    cluster_secret_file: str = ""
    peer_listen: str = "0.0.0.0:18830"
    peer_advertise: str = ""
    peer_tls_certfile: str = ""
    peer_tls_keyfile: str = ""
    peer_tls_cafile: str = ""
    peer_handshake_timeout: float = 5.0
    node_timeout: float = 6.0
    takeover_timeout: float = 3.0
    interest_grace: float = 5.0
    interest_confirm_timeout: float = 0.5

    @property
    def has_user_source(self) -> bool:
        """Whether clients are authenticated: a password file, Redis users or certificate CNs."""
        return bool(self.password_file or self.auth_redis or self.tls_cn_as_username)

    @property
    def anonymous_allowed(self) -> bool:
        """`allow_anonymous` resolved: unset means true without a user source, false with one
        (Mosquitto 2.0's rule), so configuring users never leaves the door open by accident."""
        if self.allow_anonymous is None:
            return not self.has_user_source
        return self.allow_anonymous

    @property
    def clustered(self) -> bool:
        """Whether this node is a cluster member (a Redis registry is configured)."""
        return bool(self.redis_url or self.redis_sentinels)

    def resolved_node_id(self) -> str:
        """The node id, defaulting to `<hostname>-<first listener port>`."""
        if self.node_id:
            return self.node_id
        port = self.listen[0].rsplit(":", 1)[-1] if self.listen else "0"
        return f"{socket.gethostname()}-{port}"


SETTINGS: dict[str, str] = {
    "listen": "TCP listener `HOST:PORT`; repeatable (`--listen`), comma-separated in the env var. "
    "A non-loopback address while anonymous clients are accepted needs allow_anonymous_public",
    "tls_listen": "MQTT over TLS listeners `HOST:PORT` (usually 8883); need tls_certfile/keyfile",
    "ws_listen": "MQTT over WebSocket listeners `HOST:PORT` (usually 8083)",
    "wss_listen": "MQTT over secure WebSocket listeners `HOST:PORT` (usually 8084)",
    "ws_path": "HTTP path of the WebSocket listeners (other paths get 404)",
    "ws_allowed_origins": "browser origins `https://HOST[:PORT]` (or `*`) a WebSocket upgrade may "
    "come from besides the listener's own host; others get HTTP 403 (no Origin: allowed)",
    "tls_certfile": "PEM server certificate (chain) of the TLS and WSS listeners",
    "tls_keyfile": "PEM private key of tls_certfile",
    "tls_cafile": "PEM CA bundle that client certificates must chain to",
    "tls_crlfile": "PEM certificate revocation list(s) of tls_cafile's CAs: a revoked client "
    "certificate fails the handshake (needs tls_client_cert optional or required)",
    "tls_client_cert": "`none`, `optional` or `required`: ask TLS clients for a certificate",
    "tls_cn_as_username": "a verified client certificate's CN is the user name (no password)",
    "tls_failure_log_interval": "at most one log line per this many seconds about failed TLS "
    "handshakes (each one is counted)",
    "data_dir": "directory of the embedded store (log segments, snapshot)",
    "log_level": "`debug`, `info`, `warning` or `error`",
    "node_id": "this node's id in message properties and logs (default `<hostname>-<port>`)",
    "store": "message store backend: `filelog` (embedded) or `rocketmq` (see docs/design.md)",
    "rocketmq_namesrv": "RocketMQ NameServer(s) `HOST:PORT`, `;`-separated (store=rocketmq)",
    "rocketmq_namespace": "prefix of this gateway's light queues, to share one RocketMQ cluster",
    "rocketmq_send_timeout": "seconds to wait for SEND_OK before a publish is not acknowledged",
    "rocketmq_held_reads": "light-queue parts this node keeps a pull held at the end of, so the "
    "broker answers it as a message arrives (its subscribers get it without waiting for the "
    "publishing node's wake; docs/design.md); 0: none, read on wakes only",
    "rocketmq_access_key": "RocketMQ user (AccessKey) every request is signed as, for brokers "
    "with authentication on (docs/operations.md); empty: unsigned",
    "rocketmq_secret_key": "that user's SecretKey (password); a secret: prefer "
    "rocketmq_secret_key_file or the environment variable; never logged",
    "rocketmq_secret_key_file": "file holding rocketmq_secret_key (its first line that is not "
    "blank or a `#` comment; keep it mode 600)",
    "rocketmq_tls": "connect to the NameServers and brokers over TLS",
    "rocketmq_tls_cafile": "PEM CA bundle the RocketMQ servers' certificates must chain to "
    "(empty: the system's CAs)",
    "rocketmq_tls_certfile": "PEM client certificate for RocketMQ servers that ask for one",
    "rocketmq_tls_keyfile": "PEM private key of rocketmq_tls_certfile",
    "rocketmq_tls_verify_hostname": "check that a RocketMQ server's certificate names the "
    "address connected to (brokers: the IP the NameServer lists)",
    "notify": "run notify inside this node (store=rocketmq); `false` when it runs on its own",
    "password_file": "file of `user:hash` lines (`python -m bridge.passwd`); empty: no auth",
    "allow_anonymous": "accept CONNECT without user name (false: CONNACK 5); unset: true "
    "without a user source, false once password_file, auth_redis or tls_cn_as_username is set",
    "allow_anonymous_public": "let client listeners bind a non-loopback address while anonymous "
    "clients are accepted (false: such a configuration is refused at start-up)",
    "auth_redis": "also check users in the cluster's Redis (`bridge.passwd redis://...`)",
    "auth_cache_ttl": "seconds a successful password check is remembered (0: never)",
    "acl_file": "file of per-topic publish/subscribe rules (docs/operations.md); empty: all",
    "acl_redis": "also ACL rules from the cluster's Redis; changes apply on every node at once",
    "acl_cache_ttl": "seconds an ACL decision is cached (cleared whenever the rules change)",
    "presubscribe": "filters every client gets on connect, `[QOS:]FILTER` with `%c`/`%u`",
    "admin_listen": "admin HTTP API `HOST:PORT` (empty: off); keep it on a private network",
    "admin_token": "bearer token of the admin API (empty: one is generated into data_dir)",
    "metrics_public": "serve /metrics on the admin listener without the token (for Prometheus)",
    "admin_header_timeout": "seconds an admin API connection has to send a request's line and "
    "headers, from connecting or from its first byte after an answer; then it is closed",
    "admin_keepalive_timeout": "seconds an idle admin API connection is kept open between requests",
    "admin_body_timeout": "seconds an admin API request's body may take to arrive (then 408)",
    "admin_max_connections": "admin API connections open at once; one more is closed on arrival "
    "(bounds the sockets strangers can hold, so they cannot starve the MQTT listeners)",
    "sys_interval": "seconds between `$SYS/brokers/<node>/...` statistics (0: off)",
    "client_events": "publish `$SYS/brokers/<node>/clients/<id>/connected|disconnected` events",
    "client_events_qos": "QoS of the client events (1: stored, so persistent subscribers get all)",
    "metering_interval": "seconds between flushes of per-client/user counters to Redis (0: off)",
    "metering_redis_url": "Redis for metering `redis://HOST:PORT/DB` (default: the cluster's)",
    "fsync": "fsync each group commit before PUBACK/PUBREC; `false` is NOT durable (benchmarks)",
    "sync": (
        "embedded store: when an acknowledged message reaches the disk. `commit`: a PUBACK/PUBREC "
        "waits for its commit's fdatasync. `interval`: it waits for the write to the OS (kill -9 "
        "of the process loses nothing), the log is synced at least every `sync_interval_ms` (a "
        "power loss or kernel crash may lose that window)"
    ),
    "sync_interval_ms": "with `sync = interval`: the most time written data goes unsynced",
    "inline_commit_ms": (
        "group commits (write + fsync) run on the event loop while they take at most this many "
        "ms on average, else on a writer thread (0: always the thread)"
    ),
    "store_qos0": "also write QoS 0 messages to the store (not awaited), for analytics",
    "deliver_before_commit": (
        "embedded store: send a QoS 1 message to online subscribers while its commit runs (the "
        "PUBACK still waits for it; a failed write may make them duplicates); false: once durable"
    ),
    "segment_bytes": "size at which a log segment file is closed and a new one started",
    "segment_preallocate_bytes": "zeros written ahead of the active segment's records, so "
    "that a commit's fsync writes data only (0: none)",
    "retention_bytes": "total log size kept; oldest segments are deleted beyond it",
    "retention_seconds": "age after which a segment is deleted",
    "max_packet_size": "largest MQTT packet accepted, in bytes; larger ones close the connection",
    "max_topic_length": "longest topic name or filter, in UTF-8 bytes",
    "max_topic_levels": "most `/`-separated levels in a topic name or filter",
    "max_inflight": "unacknowledged QoS 1/2 messages in flight to one client",
    "qos2_copy_window": (
        "RocketMQ: QoS 2 message keys each session remembers, so that a second stored copy of a "
        "message it was sent (a resend stored again after a store failure) is not sent (0: off)"
    ),
    "max_inbound_pending": "QoS 1/2 publishes of one client awaiting storage before reading pauses",
    "receive_maximum": "MQTT 5.0: QoS 1/2 messages a client may have unacknowledged towards the "
    "bridge (told in CONNACK; more gets DISCONNECT 0x93)",
    "topic_alias_maximum": "MQTT 5.0: topic aliases a client may use towards the bridge (0: none)",
    "max_message_properties": "MQTT 5.0: bytes of user properties, content type, response "
    "topic and correlation data one message may carry (more: PUBACK/PUBREC 0x97, CONNACK 0x97 "
    "for a will)",
    "delayed_max_seconds": "longest delay of a `$delayed/<seconds>/<topic>` publish (longer: "
    "PUBACK/PUBREC 0x83, 3.1.1: disconnect); 0 turns delayed publish off. With store=rocketmq "
    "keep it within the broker's timerMaxDelaySec (3 days by default)",
    "delayed_max_pending": "delayed publishes waiting on the embedded store (their payloads wait "
    "in the log; each keeps a small index record in memory); more get 0x97 (3.1.1: "
    "disconnect). RocketMQ's broker holds its own",
    "delayed_max_bytes": "bytes of payload and topic the embedded store's delayed publishes "
    "hold together, on disk in its log (retention keeps them until due); more get 0x97 (3.1.1: "
    "disconnect)",
    "delayed_max_bytes_per_client": "bytes of payload and topic one client's delayed publishes "
    "waiting in the embedded store's log may hold; more get 0x97 (3.1.1: disconnect)",
    "retained_max_messages": "retained messages kept (the cluster's, every node holds them all); "
    "a retained PUBLISH for a new topic beyond it gets PUBACK/PUBREC 0x97 (QoS 0 and 3.1.1: "
    "disconnect); clearing one is always allowed",
    "retained_max_bytes": "bytes of payload and topic all retained messages hold together "
    "(beyond: as retained_max_messages)",
    "retained_max_messages_per_client": "retained messages one publisher's ClientId may have set "
    "(beyond: as retained_max_messages)",
    "retained_max_bytes_per_client": "bytes of payload and topic of the retained messages one "
    "publisher's ClientId may have set (beyond: as retained_max_messages)",
    "max_subscriptions_per_client": "topic filters (shared ones included) one session may hold; "
    "a new filter beyond gets SUBACK 0x97 (3.1.1: 0x80); replacing a filter does not count",
    "max_awaiting_rel": "QoS 2 messages one client may have PUBRECed and not yet released "
    "(PUBREL); one more closes a 3.1.1 connection; a v5 client is told a Receive Maximum no "
    "larger (beyond it: DISCONNECT 0x93)",
    "max_will_bytes": "largest will payload a CONNECT may carry; larger gets CONNACK 0x97 "
    "(3.1.1: 3, server unavailable)",
    "server_reference": "MQTT 5.0: the address v5 clients are told to use instead when this "
    "node shuts down (DISCONNECT 0x8B), e.g. the load balancer's; empty: another live node's",
    "max_queued_messages": "messages queued for an offline session before the oldest drop "
    "(a connected subscriber past it slows its publishers instead)",
    "max_queued_bytes": "bytes queued for an offline session before the oldest drop "
    "(a connected subscriber past it slows its publishers instead)",
    "session_expiry_seconds": "a persistent session offline this long is discarded",
    "max_keepalive": "largest keepalive granted, in seconds (0: whatever the client asks)",
    "connect_timeout": "seconds a new connection has from being accepted to its CONNACK: the "
    "CONNECT, the password check (and its wait in the queue), SCRAM's AUTH round trips; then it "
    "is closed (a CONNECT still being decided: CONNACK 0x89 / 3)",
    "refused_connect_log_interval": "at most one log line per this many seconds for each kind "
    "of refused CONNECT (reason code), saying how many more were refused (each is counted; 0: "
    "every one)",
    "protocol_fault_log_interval": "at most one log line per this many seconds for each kind "
    "of protocol fault a client is closed for (malformed packet, protocol error, packet too "
    "large...: the reason code), saying how many more were closed (each is counted in "
    "protocol_faults; 0: every one)",
    "max_unauthenticated": "sockets without a CONNACK yet this node holds (0: unlimited); one "
    "more is closed at once, unread",
    "max_unauthenticated_per_address": "sockets without a CONNACK yet from one IP address (0: "
    "unlimited); one more is closed at once, unread. Behind a proxy that hides client "
    "addresses raise it or set 0",
    "max_unauthenticated_bytes": "bytes a client may send before its CONNACK (its CONNECT and "
    "what it sends after it without waiting); more closes it (v5: CONNACK 0x95). Raise it for "
    "wills larger than 64 KiB",
    "login_queue": "password checks waiting for the hashing threads, at most; one more is "
    "answered at once with CONNACK 0x89 (3.1.1: 3)",
    "login_queue_per_address": "password checks from one IP address waiting, at most (0: only "
    "login_queue); more get CONNACK 0x89 / 3. Waiting checks get the threads in turn by address; "
    "an address whose logins failed lately queues apart and hashes on a thread of its own at the "
    "lowest CPU priority",
    "login_failure_delay": "seconds a failed login waits before its refusal, doubling with each "
    "failure from the same address in a row (0: no wait); the hashing threads are free meanwhile",
    "login_failure_delay_max": "longest wait of a failed login's refusal (at most half "
    "connect_timeout, so that the refusal is sent)",
    "allow_zero_length_clientid": "accept an empty ClientId with clean session (an id is assigned)",
    "use_username_as_clientid": "the ClientId is the client's user name, whatever it sent (as "
    "Mosquitto's option; 5.0 clients get it as Assigned Client Identifier); no user name: refused",
    "max_connections": "client sockets this node holds (0: unlimited); a CONNECT beyond gets "
    "CONNACK 0x97 (3.1.1: 3); changeable at run time (`PUT /api/v1/limits`)",
    "connection_rate": "new connections a second this node takes (0: unlimited); more CONNECTs "
    "wait for their turn; changeable at run time",
    "connection_rate_wait": "seconds a CONNECT may wait for connection_rate; later ones get "
    "CONNACK 0x9F (3.1.1: 3); changeable at run time",
    "client_publish_rate": "PUBLISH packets a second one client may send (0: unlimited); a faster "
    "one has its socket read later, nothing is dropped; changeable at run time",
    "client_publish_bytes_rate": "bytes a second one client may send (0: unlimited); a faster one "
    "has its socket read later, nothing is dropped; changeable at run time",
    "flapping_max_connects": "a ClientId connecting more often than this within flapping_window "
    "is banned for flapping_ban_seconds (0: no flapping detection)",
    "flapping_window": "seconds over which a ClientId's connects are counted (cluster-wide)",
    "flapping_ban_seconds": "how long a flapping ClientId is banned (CONNACK 0x8A / 5)",
    "flapping_failed_logins": "failed logins count as connects of their ClientId for flapping "
    "detection (when flapping_max_connects is set)",
    "write_buffer_high": "bytes buffered for a client's socket before QoS 0 messages to it drop",
    "slow_consumer_timeout": "seconds a client may keep its buffer over the limit before it is cut",
    "qos0_publisher_wait": "seconds a QoS 0 publisher's socket may go unread while a subscriber "
    "it feeds has a full buffer; one slower than that drops QoS 0 past write_buffer_high (0: "
    "publishers never wait)",
    "offset_flush_interval": "seconds between writes of acknowledged delivery offsets",
    "memory_trim_interval": "seconds between hand-backs of freed heap memory to the system, "
    "after traffic (glibc malloc_trim; 0: never)",
    "drain_timeout": "seconds to wait for pending writes on shutdown",
    "reuse_port": "share the MQTT port with other node processes (SO_REUSEPORT): one per core",
    "redis_url": "Redis of the cluster registry, `redis://HOST:PORT/DB`; set to run as a cluster",
    "redis_sentinels": "Sentinels `HOST:PORT,...` instead of redis_url (follows failovers)",
    "redis_master_name": "the master name the Sentinels monitor",
    "redis_timeout": "seconds a Redis command may take before it counts as failed",
    "redis_wait_replicas": "replicas that must confirm each registry write (WAIT); 1 with Sentinel",
    "redis_username": "Redis 6 ACL user of every Redis connection (registry, metering, the CLIs); "
    "empty: `default`, the `requirepass` user",
    "redis_password": "password of redis_username (Redis `requirepass` or an ACL user's); "
    "prefer redis_password_file (not with a password in redis_url)",
    "redis_password_file": "file holding the Redis password (its first line; keep it 0600)",
    "redis_sentinel_username": "ACL user of the Sentinels themselves (empty: `default`)",
    "redis_sentinel_password": "the Sentinels' own password (their `requirepass`); the "
    "servers they monitor use redis_username/redis_password; prefer redis_sentinel_password_file",
    "redis_sentinel_password_file": "file holding the Sentinels' password (its first line; keep "
    "it 0600)",
    "redis_tls": "speak TLS to Redis and its Sentinels (a `rediss://` URL does too)",
    "redis_tls_cafile": "PEM CA bundle that Redis's certificate must chain to (default: the "
    "system's)",
    "redis_tls_certfile": "PEM client certificate for Redis servers that ask for one "
    "(`tls-auth-clients yes`)",
    "redis_tls_keyfile": "PEM private key of redis_tls_certfile",
    "cluster_name": "prefix of this cluster's Redis keys (several clusters may share a Redis)",
    "cluster_secret": "the cluster's shared secret (at least 32 characters): peer links and "
    "node-to-node admin calls prove it; prefer cluster_secret_file",
    "cluster_secret_file": "file holding the cluster's secrets, one a line: the first proves this "
    "node, every line is accepted (rotation); keep it 0600; `openssl rand -hex 32 > FILE` makes "
    "one",
    "peer_listen": "`HOST:PORT` for links from other nodes (port 0: any free port)",
    "peer_advertise": "`HOST:PORT` other nodes dial (default: peer_listen, hostname for 0.0.0.0)",
    "peer_tls_certfile": "PEM certificate this node presents on peer links (mutual TLS; with "
    "peer_tls_keyfile and peer_tls_cafile)",
    "peer_tls_keyfile": "PEM private key of peer_tls_certfile",
    "peer_tls_cafile": "PEM cluster CA that every peer's certificate must chain to",
    "peer_handshake_timeout": "seconds a peer link may take to authenticate before it is closed",
    "node_timeout": "seconds without a heartbeat before a node counts as dead",
    "takeover_timeout": "seconds to wait for the old node to release a ClientId taken over",
    "interest_grace": "seconds a node keeps advertising a filter after its last local subscriber",
    "interest_confirm_timeout": "seconds a SUBACK waits for the peers to confirm a new filter; "
    "a peer that does not is handled as a lost link (its link is closed and re-synced) and the "
    "SUBACK goes out (0: SUBACK at once, without confirmation)",
}

ENV_PREFIX = "MQTT_BRIDGE_"


class ConfigError(Exception):
    """A setting has a bad name or value; the message says which and why."""


def require_positive(config: Config, names: tuple[str, ...]) -> None:
    """Raise ConfigError naming the first of these settings that is not above 0."""
    for name in names:
        value = getattr(config, name)
        if value <= 0:
            raise ConfigError(f"{name}: must be positive, got {value}")


def parse_listen(address: str) -> tuple[str, int]:
    """Split `HOST:PORT` (IPv6 as `[::1]:1883`) into host and port, or raise ConfigError."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ConfigError(f"listen: {address!r} is not HOST:PORT")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ConfigError(f"listen: port {port} out of range")
    return host.strip("[]") or "0.0.0.0", port
