"""The request headers and response bodies of RocketMQ's statistics and admin codes, in Java
4.9's field names and types (docs/protocol.md section 4.7): 202, 203, 204, 208, 221, 223, 224,
300, 309 and 317, and the fastjson text some of them are written in.

Owns: the typed request headers of those codes; the body builders, which take plain values and
give the dict a body is rendered from; `dumps_fastjson`, which renders a value whose maps may be
keyed by a `MessageQueue` as Java's fastjson does (an object as a key, which is not JSON); and
`loads_fastjson`, the reader of such text for mqbox's CLI and tests. Never: where the figures
come from (the broker's admin processor), or sockets.

fastjson writes a bean's properties in alphabetical order, a `double` with a fraction part
(`0.0`), an enum by its name, a Set as a JSON array, and a Map<MessageQueue, V> as
`{{"brokerName":"b","queueId":0,"topic":"T"}:V,...}`; the builders here follow it, so a Java
admin tool (mqadmin, rocketmq-dashboard) reads the bodies with its own classes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Self

from mqbox.message import java_utf8_decode, java_utf8_encode
from mqbox.protocol.errors import RemoteProtocolError
from mqbox.protocol.headers import MessageQueue, parse_bool

FASTJSON_DEPTH_MAX: Final = 64  # nesting a reader accepts; the bodies here nest 6 deep at most


# ---------------------------------------------------------------------------------------------
# Request headers (Java's *RequestHeader classes of org.apache.rocketmq.common.protocol.header)


def _field(ext: Mapping[str, str], key: str, where: str) -> str:
    """A required, non-empty text field (Java's @CFNotNull)."""
    value = ext.get(key)
    if not value:
        raise RemoteProtocolError(f"{where}: required field {key!r} is missing")
    return value


@dataclass(frozen=True, slots=True)
class TopicRequestHeader:
    """`topic` alone: GetTopicStatsInfoRequestHeader (202), QueryTopicConsumeByWhoRequestHeader
    (300)."""

    topic: str

    @classmethod
    def from_ext(cls, ext: Mapping[str, str]) -> Self:
        return cls(_field(ext, "topic", cls.__name__))

    def to_ext(self) -> dict[str, str]:
        return {"topic": self.topic}


@dataclass(frozen=True, slots=True)
class ProducerGroupRequestHeader:
    """GetProducerConnectionListRequestHeader (204): `producerGroup`."""

    producer_group: str

    @classmethod
    def from_ext(cls, ext: Mapping[str, str]) -> Self:
        return cls(_field(ext, "producerGroup", cls.__name__))

    def to_ext(self) -> dict[str, str]:
        return {"producerGroup": self.producer_group}


@dataclass(frozen=True, slots=True)
class GetConsumeStatsRequestHeader:
    """GetConsumeStatsRequestHeader (208): `consumerGroup`, optional `topic` (blank: every topic
    the group committed offsets for)."""

    consumer_group: str
    topic: str | None = None

    @classmethod
    def from_ext(cls, ext: Mapping[str, str]) -> Self:
        topic = ext.get("topic", "").strip()
        return cls(_field(ext, "consumerGroup", cls.__name__), topic or None)

    def to_ext(self) -> dict[str, str]:
        ext = {"consumerGroup": self.consumer_group}
        if self.topic is not None:
            ext["topic"] = self.topic
        return ext


@dataclass(frozen=True, slots=True)
class GetConsumeStatsInBrokerHeader:
    """GetConsumeStatsInBrokerHeader (317): `isOrder` (only the topics marked order)."""

    is_order: bool

    @classmethod
    def from_ext(cls, ext: Mapping[str, str]) -> Self:
        return cls(parse_bool(_field(ext, "isOrder", cls.__name__)))

    def to_ext(self) -> dict[str, str]:
        return {"isOrder": "true" if self.is_order else "false"}


@dataclass(frozen=True, slots=True)
class GetConsumerStatusRequestHeader:
    """GetConsumerStatusRequestHeader (223 admin -> broker, 221 broker -> client): `topic`,
    `group`, optional `clientAddr` (a client id: Java compares it with the members' ids)."""

    topic: str
    group: str
    client_addr: str | None = None

    @classmethod
    def from_ext(cls, ext: Mapping[str, str]) -> Self:
        where = cls.__name__
        return cls(
            _field(ext, "topic", where), _field(ext, "group", where), ext.get("clientAddr") or None
        )

    def to_ext(self) -> dict[str, str]:
        ext = {"topic": self.topic, "group": self.group}
        if self.client_addr is not None:
            ext["clientAddr"] = self.client_addr
        return ext


@dataclass(frozen=True, slots=True)
class ConsumeMessageDirectlyResultRequestHeader:
    """ConsumeMessageDirectlyResultRequestHeader (309): `consumerGroup`, `clientId`, `msgId`
    (the offset message id), and `brokerName`, which the broker adds before relaying."""

    consumer_group: str
    client_id: str
    msg_id: str
    broker_name: str | None = None

    @classmethod
    def from_ext(cls, ext: Mapping[str, str]) -> Self:
        where = cls.__name__
        return cls(
            _field(ext, "consumerGroup", where),
            _field(ext, "clientId", where),
            _field(ext, "msgId", where),
            ext.get("brokerName") or None,
        )

    def to_ext(self) -> dict[str, str]:
        ext = {"consumerGroup": self.consumer_group, "clientId": self.client_id}
        ext["msgId"] = self.msg_id
        if self.broker_name is not None:
            ext["brokerName"] = self.broker_name
        return ext


@dataclass(frozen=True, slots=True)
class GetTopicsByClusterRequestHeader:
    """GetTopicsByClusterRequestHeader (224): `cluster`."""

    cluster: str

    @classmethod
    def from_ext(cls, ext: Mapping[str, str]) -> Self:
        return cls(_field(ext, "cluster", cls.__name__))

    def to_ext(self) -> dict[str, str]:
        return {"cluster": self.cluster}


@dataclass(frozen=True, slots=True)
class GetKvListByNamespaceRequestHeader:
    """GetKVListByNamespaceRequestHeader (219): `namespace`."""

    namespace: str

    @classmethod
    def from_ext(cls, ext: Mapping[str, str]) -> Self:
        return cls(_field(ext, "namespace", cls.__name__))

    def to_ext(self) -> dict[str, str]:
        return {"namespace": self.namespace}


# ---------------------------------------------------------------------------------------------
# Bodies (Java's classes of org.apache.rocketmq.common.admin and .protocol.body). Each builder
# gives the value dumps_fastjson renders; keys are in fastjson's (alphabetical) order.


def topic_offset(min_offset: int, max_offset: int, last_update_timestamp_ms: int) -> dict[str, int]:
    """TopicOffset: one queue's row of TopicStatsTable."""
    return {
        "lastUpdateTimestamp": last_update_timestamp_ms,
        "maxOffset": max_offset,
        "minOffset": min_offset,
    }


def topic_stats_table(offsets: Mapping[MessageQueue, dict[str, int]]) -> dict[str, Any]:
    """TopicStatsTable (202): {"offsetTable": {MessageQueue: TopicOffset}}."""
    return {"offsetTable": dict(offsets)}


def offset_wrapper(
    broker_offset: int, consumer_offset: int, last_timestamp_ms: int
) -> dict[str, int]:
    """OffsetWrapper: one queue's row of ConsumeStats."""
    return {
        "brokerOffset": broker_offset,
        "consumerOffset": consumer_offset,
        "lastTimestamp": last_timestamp_ms,
    }


def consume_stats(
    offsets: Mapping[MessageQueue, dict[str, int]], consume_tps: float
) -> dict[str, Any]:
    """ConsumeStats (208): {"consumeTps": double, "offsetTable": {MessageQueue: OffsetWrapper}}."""
    return {"consumeTps": float(consume_tps), "offsetTable": dict(offsets)}


def consume_stats_list(
    broker_addr: str, groups: Sequence[tuple[str, Sequence[dict[str, Any]]]], total_diff: int
) -> dict[str, Any]:
    """ConsumeStatsList (317): {"brokerAddr", "consumeStatsList": [{group: [ConsumeStats]}],
    "totalDiff": long}, one single-key map per subscription group, as Java builds it."""
    return {
        "brokerAddr": broker_addr,
        "consumeStatsList": [{group: list(stats)} for group, stats in groups],
        "totalDiff": total_diff,
    }


def connection(client_id: str, client_addr: str, language: str, version: int) -> dict[str, Any]:
    """Connection: one client of a group (language is LanguageCode's name)."""
    return {
        "clientAddr": client_addr,
        "clientId": client_id,
        "language": language,
        "version": version,
    }


def subscription_data(
    topic: str,
    sub_string: str,
    tags: Sequence[str],
    tag_hashes: Sequence[int],
    sub_version: int,
    expression_type: str,
) -> dict[str, Any]:
    """SubscriptionData as a broker holds it (filterClassSource is not serialized)."""
    return {
        "classFilterMode": False,
        "codeSet": list(tag_hashes),
        "expressionType": expression_type,
        "subString": sub_string,
        "subVersion": sub_version,
        "tagsSet": list(tags),
        "topic": topic,
    }


def consumer_connection(
    connections: Iterable[dict[str, Any]],
    subscriptions: Mapping[str, dict[str, Any]],
    consume_type: str,
    message_model: str,
    consume_from_where: str,
) -> dict[str, Any]:
    """ConsumerConnection (203): the members, the group's subscription table (topic ->
    SubscriptionData) and its three enums by name."""
    return {
        "connectionSet": list(connections),
        "consumeFromWhere": consume_from_where,
        "consumeType": consume_type,
        "messageModel": message_model,
        "subscriptionTable": dict(subscriptions),
    }


def producer_connection(connections: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """ProducerConnection (204): {"connectionSet": [Connection]}."""
    return {"connectionSet": list(connections)}


def group_list(groups: Iterable[str]) -> dict[str, Any]:
    """GroupList (300): {"groupList": [group]}."""
    return {"groupList": sorted(groups)}


def get_consumer_status_body(
    consumer_table: Mapping[str, Mapping[MessageQueue, int]],
    message_queue_table: Mapping[MessageQueue, int] | None = None,
) -> dict[str, Any]:
    """GetConsumerStatusBody: the broker's answer to 223 fills consumerTable (client id ->
    {MessageQueue: offset}); a client's answer to 221 fills messageQueueTable."""
    return {
        "consumerTable": {client: dict(table) for client, table in consumer_table.items()},
        "messageQueueTable": dict(message_queue_table or {}),
    }


# ---------------------------------------------------------------------------------------------
# fastjson text


def dumps_fastjson(value: Any) -> bytes:
    """`value` as fastjson writes it: JSON, except that a dict key may be a MessageQueue, which
    is written as its object. Strings are JSON-escaped; the bytes are UTF-8 (Java's)."""
    parts: list[str] = []
    _write(value, parts)
    return java_utf8_encode("".join(parts))


def _write(value: Any, parts: list[str]) -> None:
    if isinstance(value, dict):
        parts.append("{")
        for index, (key, item) in enumerate(value.items()):
            if index:
                parts.append(",")
            if isinstance(key, MessageQueue):
                _write(key.to_json_value(), parts)
            else:
                assert isinstance(key, str), f"fastjson keys are strings or queues, not {key!r}"
                parts.append(json.dumps(key, ensure_ascii=False))
            parts.append(":")
            _write(item, parts)
        parts.append("}")
    elif isinstance(value, list | tuple):
        parts.append("[")
        for index, item in enumerate(value):
            if index:
                parts.append(",")
            _write(item, parts)
        parts.append("]")
    else:
        assert value is None or isinstance(value, str | int | float), repr(value)
        parts.append(json.dumps(value, ensure_ascii=False, allow_nan=False))


_WHITESPACE: Final = re.compile(r"[ \t\n\r]*")
_NUMBER: Final = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?")
_LITERALS: Final = {"true": True, "false": False, "null": None}


def loads_fastjson(data: bytes) -> Any:
    """Read fastjson text (what dumps_fastjson and the Java broker write): JSON whose object
    keys may be objects. An object key must be a MessageQueue and becomes one; RemoteProtocolError
    for anything else that is not JSON. Nesting is bounded by FASTJSON_DEPTH_MAX."""
    text = java_utf8_decode(data)
    try:
        value, at = _read(text, _skip(text, 0), 0)
    except (IndexError, ValueError) as error:
        raise RemoteProtocolError(f"the body is not fastjson text: {error}") from None
    if _skip(text, at) != len(text):
        raise RemoteProtocolError(f"the body has text after its value, at {at}")
    return value


def _skip(text: str, at: int) -> int:
    match = _WHITESPACE.match(text, at)
    assert match is not None  # the pattern matches the empty string
    return match.end()


def _read(text: str, at: int, depth: int) -> tuple[Any, int]:
    if depth > FASTJSON_DEPTH_MAX:
        raise ValueError(f"nested deeper than {FASTJSON_DEPTH_MAX}")
    first = text[at]
    if first == "{":
        return _read_object(text, at + 1, depth + 1)
    if first == "[":
        return _read_array(text, at + 1, depth + 1)
    if first == '"':
        return json.decoder.scanstring(text, at + 1)  # type: ignore[attr-defined,no-any-return]
    for word, literal in _LITERALS.items():
        if text.startswith(word, at):
            return literal, at + len(word)
    match = _NUMBER.match(text, at)
    if match is None:
        raise ValueError(f"unexpected {text[at : at + 10]!r} at {at}")
    number = match.group()
    return (float(number) if any(c in number for c in ".eE") else int(number)), match.end()


def _read_object(text: str, at: int, depth: int) -> tuple[dict[Any, Any], int]:
    result: dict[Any, Any] = {}
    at = _skip(text, at)
    if text[at] == "}":
        return result, at + 1
    while True:
        key, at = _read(text, _skip(text, at), depth)
        if isinstance(key, dict):
            key = MessageQueue.from_json_value(key, "an object key")
        elif not isinstance(key, str):
            raise ValueError(f"an object key is {key!r}")
        at = _skip(text, at)
        if text[at] != ":":
            raise ValueError(f"no ':' at {at}")
        result[key], at = _read(text, _skip(text, at + 1), depth)
        at = _skip(text, at)
        if text[at] == "}":
            return result, at + 1
        if text[at] != ",":
            raise ValueError(f"no ',' or '}}' at {at}")
        at += 1


def _read_array(text: str, at: int, depth: int) -> tuple[list[Any], int]:
    result: list[Any] = []
    at = _skip(text, at)
    if text[at] == "]":
        return result, at + 1
    while True:
        item, at = _read(text, _skip(text, at), depth)
        result.append(item)
        at = _skip(text, at)
        if text[at] == "]":
            return result, at + 1
        if text[at] != ",":
            raise ValueError(f"no ',' or ']' at {at}")
        at += 1
