"""The connector's options: what `.option(...)` may say, checked once on the driver.

Owns: ReadOptions and WriteOptions (frozen, picklable: Spark ships the reader and writer objects
to its Python workers with them inside), their defaults, and the error a user sees for a bad one
(OptionError names the option, the value and what would do). docs/spark.md sections 3 and 4
list them.

Never: sockets or Spark. Spark hands options over as a case-insensitive dict of strings; names
are compared in lower case here, and an option this module does not know is logged and left
alone (Spark passes its own, such as `path` and `checkpointLocation`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from typing import Final

from mqbox.acl.signature import SessionCredentials
from mqbox.client.outgoing import check_group, check_topic
from mqbox.client.subscription import SubscriptionExpressionError, parse_tags
from mqbox.errors import MqboxError

log = logging.getLogger("mqbox.spark")

PULL_BATCH_SIZE_DEFAULT: Final = 1024
PULL_TIMEOUT_MS_DEFAULT: Final = 30_000
SEND_BATCH_SIZE_DEFAULT: Final = 1024
SEND_BATCH_BYTES_DEFAULT: Final = 1024 * 1024
SEND_TIMEOUT_MS_DEFAULT: Final = 30_000
IN_FLIGHT_MAX_DEFAULT: Final = 16
PRODUCER_GROUP_DEFAULT: Final = "mqbox_spark_writer"

_READ_NAMES: Final = frozenset(
    {
        "namesrvaddr",
        "topic",
        "subexpression",
        "startingoffsets",
        "endingoffsets",
        "startingtimestamp",
        "maxoffsetspertrigger",
        "minpartitions",
        "failondataloss",
        "consumergroup",
        "pullbatchsize",
        "pulltimeoutms",
        "includeproperties",
        "accesskey",
        "secretkey",
    }
)
_WRITE_NAMES: Final = frozenset(
    {
        "namesrvaddr",
        "topic",
        "producergroup",
        "exactlyonce",
        "sendbatchsize",
        "sendbatchbytes",
        "sendtimeoutms",
        "maxinflight",
        "accesskey",
        "secretkey",
    }
)
_SPARK_NAMES: Final = frozenset({"path", "checkpointlocation"})


class OptionError(MqboxError):
    """An option the connector cannot use; the message says which and what would do."""


def _lowered(options: Mapping[str, str]) -> dict[str, str]:
    return {str(name).lower(): str(value) for name, value in options.items()}


def _warn_unknown(options: Mapping[str, str], known: frozenset[str], what: str) -> None:
    unknown = sorted(set(options) - known - _SPARK_NAMES)
    if unknown:
        log.warning("mqbox %s: options not used: %s", what, ", ".join(unknown))


def _required(options: Mapping[str, str], name: str) -> str:
    value = options.get(name.lower(), "").strip()
    if not value:
        raise OptionError(f"option {name} is required")
    return value


def _int(options: Mapping[str, str], name: str, default: int | None, low: int) -> int | None:
    text = options.get(name.lower())
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f"option {name}={text!r} is not an integer") from None
    if value < low:
        raise OptionError(f"option {name}={value} must be at least {low}")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    text = options.get(name.lower())
    if text is None:
        return default
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise OptionError(f"option {name}={text!r} must be true or false")
    return lowered == "true"


def _topics(text: str) -> tuple[str, ...]:
    topics = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not topics:
        raise OptionError("option topic names no topic")
    for topic in topics:
        try:
            check_topic(topic)
        except MqboxError as error:
            raise OptionError(f"option topic: {error}") from None
    return topics


def _offsets_spec(options: Mapping[str, str], name: str, keywords: tuple[str, ...]) -> str | None:
    """A keyword, or JSON text whose shape offsets.offsets_from_json checks against the routes."""
    text = options.get(name.lower())
    if text is None or text.strip().lower() in keywords:
        return text
    try:
        json.loads(text)
    except json.JSONDecodeError as error:
        raise OptionError(
            f"option {name} is not JSON ({error}) nor one of {', '.join(keywords)}"
        ) from None
    return text


def _group(options: Mapping[str, str], name: str, default: str | None) -> str | None:
    group = options.get(name.lower(), default)
    if group is None:
        return None
    try:
        check_group(group)
    except MqboxError as error:
        raise OptionError(f"option {name}: {error}") from None
    return group


def _credentials(options: Mapping[str, str]) -> SessionCredentials | None:
    """accessKey and secretKey (plain ACL, docs/acl.md): both or neither."""
    access_key = options.get("accesskey", "").strip()
    secret_key = options.get("secretkey", "").strip()
    if not access_key and not secret_key:
        return None
    if not access_key or not secret_key:
        raise OptionError("give accessKey and secretKey together")
    return SessionCredentials(access_key, secret_key)


@dataclasses.dataclass(frozen=True, slots=True)
class ReadOptions:
    """A read's options (docs/spark.md section 3)."""

    namesrv_addr: str
    topics: tuple[str, ...]
    sub_expression: str = "*"
    accepted_tags: tuple[str, ...] = ()  # the expression's tags; () takes every record
    starting_offsets: str | None = None  # earliest | latest | group | JSON
    ending_offsets: str | None = None  # latest | JSON (batch only)
    starting_timestamp_ms: int | None = None
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    consumer_group: str | None = None
    pull_batch_size: int = PULL_BATCH_SIZE_DEFAULT
    pull_timeout_ms: int = PULL_TIMEOUT_MS_DEFAULT
    include_properties: bool = True
    credentials: SessionCredentials | None = None  # accessKey, secretKey: requests are signed

    @classmethod
    def parse(cls, given: Mapping[str, str], *, streaming: bool) -> ReadOptions:
        options = _lowered(given)
        _warn_unknown(options, _READ_NAMES, "source")
        expression = options.get("subexpression", "*").strip() or "*"
        try:
            tags = parse_tags(expression)
        except SubscriptionExpressionError as error:
            raise OptionError(f"option subExpression={expression!r}: {error}") from None
        starting = _offsets_spec(options, "startingOffsets", ("earliest", "latest", "group"))
        timestamp = _int(options, "startingTimestamp", None, 0)
        if starting is not None and timestamp is not None:
            raise OptionError("give startingOffsets or startingTimestamp, not both")
        ending = _offsets_spec(options, "endingOffsets", ("earliest", "latest"))
        if streaming and ending is not None:
            raise OptionError("endingOffsets is for batch reads; a stream reads on")
        if not streaming and starting is not None and starting.strip().lower() == "latest":
            raise OptionError("startingOffsets=latest reads nothing in a batch query")
        if ending is not None and ending.strip().lower() == "earliest":
            raise OptionError("endingOffsets=earliest reads nothing; use latest or JSON")
        group = _group(options, "consumerGroup", None)
        if starting is not None and starting.strip().lower() == "group" and group is None:
            raise OptionError("startingOffsets=group needs the consumerGroup option")
        max_per_trigger = _int(options, "maxOffsetsPerTrigger", None, 1)
        if max_per_trigger is not None and not streaming:
            raise OptionError("maxOffsetsPerTrigger is for streaming reads")
        return cls(
            namesrv_addr=_required(options, "namesrvAddr"),
            topics=_topics(_required(options, "topic")),
            sub_expression=expression,
            accepted_tags=tags,
            starting_offsets=starting,
            ending_offsets=ending,
            starting_timestamp_ms=timestamp,
            max_offsets_per_trigger=max_per_trigger,
            min_partitions=_int(options, "minPartitions", None, 1),
            fail_on_data_loss=_bool(options, "failOnDataLoss", True),
            consumer_group=group,
            pull_batch_size=_int(options, "pullBatchSize", PULL_BATCH_SIZE_DEFAULT, 1) or 1,
            pull_timeout_ms=_int(options, "pullTimeoutMs", PULL_TIMEOUT_MS_DEFAULT, 1) or 1,
            include_properties=_bool(options, "includeProperties", True),
            credentials=_credentials(options),
        )


@dataclasses.dataclass(frozen=True, slots=True)
class WriteOptions:
    """A write's options (docs/spark.md section 4)."""

    namesrv_addr: str
    topic: str | None = None  # overrides the topic column
    producer_group: str = PRODUCER_GROUP_DEFAULT
    exactly_once: bool = True
    send_batch_size: int = SEND_BATCH_SIZE_DEFAULT
    send_batch_bytes: int = SEND_BATCH_BYTES_DEFAULT
    send_timeout_ms: int = SEND_TIMEOUT_MS_DEFAULT
    max_in_flight: int = IN_FLIGHT_MAX_DEFAULT
    credentials: SessionCredentials | None = None  # accessKey, secretKey: requests are signed

    @classmethod
    def parse(cls, given: Mapping[str, str]) -> WriteOptions:
        options = _lowered(given)
        _warn_unknown(options, _WRITE_NAMES, "sink")
        topic = options.get("topic")
        if topic is not None:
            topic = topic.strip()
            try:
                check_topic(topic)
            except MqboxError as error:
                raise OptionError(f"option topic: {error}") from None
        group = _group(options, "producerGroup", PRODUCER_GROUP_DEFAULT)
        assert group is not None
        return cls(
            namesrv_addr=_required(options, "namesrvAddr"),
            topic=topic,
            producer_group=group,
            exactly_once=_bool(options, "exactlyOnce", True),
            send_batch_size=_int(options, "sendBatchSize", SEND_BATCH_SIZE_DEFAULT, 1) or 1,
            send_batch_bytes=_int(options, "sendBatchBytes", SEND_BATCH_BYTES_DEFAULT, 1024)
            or 1024,
            send_timeout_ms=_int(options, "sendTimeoutMs", SEND_TIMEOUT_MS_DEFAULT, 1) or 1,
            max_in_flight=_int(options, "maxInFlight", IN_FLIGHT_MAX_DEFAULT, 1) or 1,
            credentials=_credentials(options),
        )
