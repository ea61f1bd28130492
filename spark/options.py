"""Options of the `rocketmq` data source, checked once on the driver.

Every bad option is refused with a message naming the option and what it accepts, before any
query runs. See docs/spark.md for the table of options.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from bridge.mqtt.errors import MQTTProtocolError
from bridge.mqtt.topics import validate_topic_filter
from bridge.storage.rocketmq import (
    Credentials,
    TlsOptions,
    TlsOptionsError,
    rocketmq_topic,
    tag_of,
)

EARLIEST = -2
LATEST = -1
"""Offsets in a startingOffsets/endingOffsets JSON that stand for the queue's first/next offset."""

DEFAULT_GROUP = "spark-rocketmq-source"


class OptionError(ValueError):
    """An option of the data source is missing or malformed."""


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """What to read and how: one of `nameserver` (RocketMQ) or `path` (the embedded log)."""

    nameserver: str | None
    path: str | None
    topics: tuple[str, ...] | None
    """RocketMQ topics to read; None = every data topic the NameServer lists."""
    topic_filter: str
    starting: str | dict[str, Any]
    """"earliest", "latest" or a parsed offsets JSON."""
    ending: str | dict[str, Any]
    starting_timestamp: int | None
    ending_timestamp: int | None
    max_per_trigger: int | None
    fail_on_data_loss: bool
    min_partitions: int | None
    pull_batch: int
    consumer_group: str
    request_timeout: float
    access_key: str = ""
    """The RocketMQ user requests are signed as (a cluster with authentication on); "" none."""
    secret_key: str = field(default="", repr=False)
    tls: bool = False
    tls_ca_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_verify_hostname: bool = True

    @property
    def tag_expression(self) -> str:
        """What the broker can filter on: the one tag of a filter without wildcards, else "*"."""
        if "+" in self.topic_filter or "#" in self.topic_filter:
            return "*"
        tag = tag_of(self.topic_filter)
        return "*" if "||" in tag else tag

    @property
    def matches_all(self) -> bool:
        return self.topic_filter == "#"


def _get(options: Mapping[str, str], name: str) -> str | None:
    # Spark hands options over case-insensitively; a plain dict (tests) may not be.
    for key, value in options.items():
        if key.lower() == name.lower():
            return value
    return None


def _int(options: Mapping[str, str], name: str, *, minimum: int) -> int | None:
    text = _get(options, name)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f"option {name}: {text!r} is not an integer") from None
    if value < minimum:
        raise OptionError(f"option {name}: must be at least {minimum}, got {value}")
    return value


def _offsets(options: Mapping[str, str], name: str, default: str, allowed: tuple[str, ...]) -> Any:
    text = _get(options, name)
    if text is None:
        return default
    if text.strip().lower() in allowed:
        return text.strip().lower()
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        raise OptionError(
            f"option {name}: expected {' or '.join(allowed)} or a JSON object like "
            '{"factory": {"broker-a:0": 42}}, got ' + repr(text)
        ) from None

    def valid_offset(value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= -2

    if not isinstance(parsed, dict) or not all(
        (isinstance(queues, dict) and all(valid_offset(o) for o in queues.values()))
        or valid_offset(queues)
        for queues in parsed.values()
    ):
        raise OptionError(
            f'option {name}: a JSON object of topic -> {{"broker:queue": offset}} '
            f"(offset -2 = earliest, -1 = latest) is needed, got {text!r}"
        )
    return parsed


KNOWN_OPTIONS: Final = (
    "nameserver", "path", "topicFilter", "topics", "startingOffsets", "endingOffsets",
    "startingTimestamp", "endingTimestamp", "maxMessagesPerTrigger", "failOnDataLoss",
    "pullBatchSize", "consumerGroup", "requestTimeout", "accessKey", "secretKey", "tls",
    "tlsCaFile", "tlsCertFile", "tlsKeyFile", "tlsVerifyHostname", "minPartitions",
)  # fmt: skip
"""Every option of the source (docs/spark.md's table); Spark hands them over in any case."""


def _refuse_unknown(options: Mapping[str, str]) -> None:
    """An option the source does not know is an error, never silently ignored: a habit from
    Spark's Kafka source (`maxOffsetsPerTrigger`) would otherwise read without its limit."""
    known = {name.lower(): name for name in KNOWN_OPTIONS}
    for key in options:
        if key.lower() in known:
            continue
        close = difflib.get_close_matches(key.lower(), known, n=1, cutoff=0.6)
        hint = f"; did you mean {known[close[0]]}?" if close else ""
        raise OptionError(
            f"option {key}: the rocketmq source has no such option{hint} (docs/spark.md lists them)"
        )


def parse_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Check `options` and turn them into `SourceOptions` (raises OptionError)."""
    _refuse_unknown(options)
    nameserver = _get(options, "nameserver")
    path = _get(options, "path")
    if bool(nameserver) == bool(path):
        raise OptionError(
            "give exactly one of option nameserver (RocketMQ NameServer address, host:port) "
            "or a path (the data directory of a bridge using the embedded store)"
        )
    topic_filter = _get(options, "topicFilter") or "#"
    try:
        validate_topic_filter(topic_filter)
    except MQTTProtocolError as exc:
        raise OptionError(
            f"option topicFilter: {topic_filter!r} is not an MQTT filter: {exc}"
        ) from None
    if topic_filter.startswith("$share/"):
        raise OptionError("option topicFilter: a shared subscription is not a topic filter")
    topics_text = _get(options, "topics")
    topics: tuple[str, ...] | None
    if topics_text:
        # Names are MQTT first levels, mapped as the bridge maps them ("factory", "$SYS").
        topics = tuple(sorted({rocketmq_topic(t.strip()) for t in topics_text.split(",")}))
    else:
        first = topic_filter.split("/", 1)[0]
        topics = None if first in ("+", "#") else (rocketmq_topic(first),)
    ending = _offsets(options, "endingOffsets", "latest", ("latest",))
    for batch_only in ("endingOffsets", "endingTimestamp"):
        if streaming and _get(options, batch_only) is not None:
            raise OptionError(f"option {batch_only}: only for a batch read (spark.read)")
    fail_text = (_get(options, "failOnDataLoss") or "true").strip().lower()
    if fail_text not in ("true", "false"):
        raise OptionError(f"option failOnDataLoss: true or false, got {fail_text!r}")
    max_per_trigger = _int(options, "maxMessagesPerTrigger", minimum=1)
    if max_per_trigger is not None and not streaming:
        raise OptionError("option maxMessagesPerTrigger: only for a streaming read")
    timeout_text = _get(options, "requestTimeout") or "10"
    try:
        request_timeout = float(timeout_text)
    except ValueError:
        raise OptionError(f"option requestTimeout: {timeout_text!r} is not a number") from None
    access_key = _get(options, "accessKey") or ""
    secret_key = _get(options, "secretKey") or ""
    if bool(access_key) != bool(secret_key):
        missing = "secretKey" if access_key else "accessKey"
        raise OptionError(f"option {missing}: accessKey and secretKey go together")
    tls = _bool(options, "tls", "false")
    tls_files = {name: _get(options, name) or "" for name in _TLS_FILES}
    if not tls:
        for name, value in tls_files.items():
            if value:
                raise OptionError(f"option {name}: needs option tls=true")
    else:
        try:
            TlsOptions(
                cafile=tls_files["tlsCaFile"],
                certfile=tls_files["tlsCertFile"],
                keyfile=tls_files["tlsKeyFile"],
            ).context()
        except TlsOptionsError as exc:
            option = next(name for name, f in _TLS_FILES.items() if f == exc.option)
            raise OptionError(f"option {option}: {exc}") from None
    return SourceOptions(
        nameserver=nameserver,
        path=path,
        topics=topics,
        topic_filter=topic_filter,
        starting=_offsets(
            options,
            "startingOffsets",
            "latest" if streaming else "earliest",
            ("earliest", "latest"),
        ),
        ending=ending,
        starting_timestamp=_int(options, "startingTimestamp", minimum=0),
        ending_timestamp=_int(options, "endingTimestamp", minimum=0),
        max_per_trigger=max_per_trigger,
        fail_on_data_loss=fail_text == "true",
        min_partitions=_int(options, "minPartitions", minimum=1),
        pull_batch=_int(options, "pullBatchSize", minimum=1) or 256,
        consumer_group=_get(options, "consumerGroup") or DEFAULT_GROUP,
        request_timeout=request_timeout,
        access_key=access_key,
        secret_key=secret_key,
        tls=tls,
        tls_ca_file=tls_files["tlsCaFile"],
        tls_cert_file=tls_files["tlsCertFile"],
        tls_key_file=tls_files["tlsKeyFile"],
        tls_verify_hostname=_bool(options, "tlsVerifyHostname", "true"),
    )


_TLS_FILES: Final = {"tlsCaFile": "cafile", "tlsCertFile": "certfile", "tlsKeyFile": "keyfile"}
"""Option name -> `TlsOptions` field."""


def _bool(options: Mapping[str, str], name: str, default: str) -> bool:
    text = (_get(options, name) or default).strip().lower()
    if text not in ("true", "false"):
        raise OptionError(f"option {name}: true or false, got {text!r}")
    return text == "true"


def client_security(options: SourceOptions) -> tuple[Credentials | None, TlsOptions | None]:
    """The RocketMQ client's credentials and TLS options from the source's options."""
    credentials = (
        Credentials(options.access_key, options.secret_key) if options.access_key else None
    )
    tls = None
    if options.tls:
        tls = TlsOptions(
            cafile=options.tls_ca_file,
            certfile=options.tls_cert_file,
            keyfile=options.tls_key_file,
            verify_hostname=options.tls_verify_hostname,
        )
    return credentials, tls
