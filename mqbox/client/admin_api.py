"""Typed broker calls over a RemotingCaller (a RemotingClient or a Transport), for the admin CLI,
the clients and tests: one function per code.

Owns: building each request from typed headers (mqbox.protocol.headers), and reading each answer
into typed values: the topic admin codes (17 UPDATE_AND_CREATE_TOPIC, 215 DELETE_TOPIC_IN_BROKER,
21 GET_ALL_TOPIC_CONFIG), subscription groups (200, 201, 207), every consumer and delay offset
(43, 45; a slave's sync asks its master with these and 21), the store queries (29
SEARCH_OFFSET_BY_TIMESTAMP, 30, 31, 33 VIEW_MESSAGE_BY_ID, 12 QUERY_MESSAGE), one SEND_MESSAGE (10)
and one PULL_MESSAGE (11), RocketMQ's statistics and broker admin codes (202, 208, 203, 204, 28,
26, 25; bodies in protocol/admin_bodies.py; 315 VIEW_BROKER_STATS_DATA), and mqbox's own 10003
(reset offsets; documented beside its handler in mqbox/server/roles/processors/admin/). Never:
sockets (remoting.py), retries, routing (the caller picks the broker), or output.

Every function raises `RemotingResponseError` for a response code it does not expect (its `code`
and `remark` say what the broker meant), the `RemotingError` family for transport failures, and
RemoteProtocolError or MessageIllegalError for an answer that does not parse. "Nothing found" is
not an error where the protocol has a code for it: `query_message` returns () on 22
QUERY_NOT_FOUND, and `pull_message` returns a PullResult for each of 0/19/20/21.

mqbox's private codes and reset words come from mqbox/protocol/mqbox_codes.py, their owner.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Final

from mqbox.client.remoting import RemotingCaller, RemotingResponseError
from mqbox.config import parse_properties
from mqbox.message import StoredMessage, decode_record
from mqbox.protocol import admin_bodies
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.protocol.command import RemotingCommand, loads_json
from mqbox.protocol.errors import RemoteProtocolError
from mqbox.protocol.headers import (
    ConsumerOffsetSerializeWrapper,
    DataVersion,
    DelayOffsetSerializeWrapper,
    DeleteSubscriptionGroupRequestHeader,
    DeleteTopicRequestHeader,
    KvTable,
    MessageQueue,
    OffsetResponseHeader,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    QueryConsumerOffsetRequestHeader,
    QueryMessageRequestHeader,
    QueueRequestHeader,
    SearchOffsetRequestHeader,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
    SubscriptionGroupConfig,
    SubscriptionGroupWrapper,
    TopicConfig,
    UpdateAndCreateTopicRequestHeader,
    ViewBrokerStatsDataRequestHeader,
    ViewMessageRequestHeader,
)
from mqbox.protocol.mqbox_codes import (
    MQBOX_BROKER_STATUS,
    MQBOX_RESET_CONSUMER_OFFSET,
    RESET_TO_EARLIEST,
    RESET_TO_LATEST,
    RESET_TO_TIMESTAMP,
)

# A long poll is held up to suspendTimeoutMillis; the request must outlive it.
PULL_TIMEOUT_MARGIN_MS: Final = 3_000
PULL_CODES: Final = frozenset(
    {
        int(ResponseCode.SUCCESS),
        int(ResponseCode.PULL_NOT_FOUND),
        int(ResponseCode.PULL_RETRY_IMMEDIATELY),
        int(ResponseCode.PULL_OFFSET_MOVED),
    }
)


def _expect(client: RemotingCaller, request_code: int, response: RemotingCommand, *ok: int) -> None:
    if response.code not in ok:
        raise RemotingResponseError(client.address, request_code, response.code, response.remark)


# ---------------------------------------------------------------------------------------------
# JSON body readers: bad input from the broker is a RemoteProtocolError naming the field.


def _body(body: bytes, where: str) -> dict[str, Any]:
    document = loads_json(body) if body else None
    if not isinstance(document, dict):
        raise RemoteProtocolError(f"{where}: the body is not a JSON object")
    return document


def _object(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RemoteProtocolError(f"{where}: not a JSON object")
    return value


def _list(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise RemoteProtocolError(f"{where}: not a JSON array")
    return value


def _int(fields: dict[str, Any], key: str, where: str) -> int:
    value = fields.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RemoteProtocolError(f"{where}.{key}: {value!r} is not an integer")
    return value


def _text(fields: dict[str, Any], key: str, where: str) -> str:
    value = fields.get(key)
    if not isinstance(value, str):
        raise RemoteProtocolError(f"{where}.{key}: {value!r} is not a string")
    return value


# ---------------------------------------------------------------------------------------------
# Topic admin: 17, 215, 21


def update_and_create_topic(
    client: RemotingCaller,
    header: UpdateAndCreateTopicRequestHeader,
    *,
    timeout_ms: int | None = None,
) -> None:
    """17 UPDATE_AND_CREATE_TOPIC: create the topic, or replace its whole configuration."""
    code = RequestCode.UPDATE_AND_CREATE_TOPIC
    response = client.invoke(code, header.to_ext(), timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS)


def delete_topic_in_broker(
    client: RemotingCaller, topic: str, *, timeout_ms: int | None = None
) -> None:
    """215 DELETE_TOPIC_IN_BROKER: the broker forgets the topic's configuration (17 if it has
    none); the name server keeps its route until 216 (namesrv_api.delete_topic)."""
    code = RequestCode.DELETE_TOPIC_IN_BROKER
    response = client.invoke(code, DeleteTopicRequestHeader(topic).to_ext(), timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS)


@dataclass(frozen=True, slots=True)
class AllTopicConfig:
    """21 GET_ALL_TOPIC_CONFIG answer: every topic the broker holds, and its table version."""

    topic_config_table: dict[str, TopicConfig]  # topicConfigTable
    data_version: DataVersion  # dataVersion


def all_topic_config(client: RemotingCaller, *, timeout_ms: int | None = None) -> AllTopicConfig:
    """21 GET_ALL_TOPIC_CONFIG."""
    code = RequestCode.GET_ALL_TOPIC_CONFIG
    response = client.invoke(code, timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS)
    where = "GET_ALL_TOPIC_CONFIG"
    document = _body(response.body, where)
    table = _object(document.get("topicConfigTable", {}), f"{where}.topicConfigTable")
    return AllTopicConfig(
        {
            name: TopicConfig.from_json_value(value, f"{where}.topicConfigTable[{name!r}]")
            for name, value in table.items()
        },
        DataVersion.from_json_value(document.get("dataVersion"), f"{where}.dataVersion"),
    )


# ---------------------------------------------------------------------------------------------
# Subscription groups and offsets: 200, 201, 207, 43, 45


def update_subscription_group(
    client: RemotingCaller, config: SubscriptionGroupConfig, *, timeout_ms: int | None = None
) -> None:
    """200 UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: create the group, or replace its configuration."""
    code = RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP
    response = client.invoke(code, {}, config.to_json(), timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS)


def all_subscription_groups(
    client: RemotingCaller, *, timeout_ms: int | None = None
) -> SubscriptionGroupWrapper:
    """201 GET_ALL_SUBSCRIPTIONGROUP_CONFIG."""
    code = RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG
    response = client.invoke(code, timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS)
    return SubscriptionGroupWrapper.from_json(response.body)


def delete_subscription_group(
    client: RemotingCaller,
    group: str,
    *,
    remove_offset: bool = False,
    timeout_ms: int | None = None,
) -> None:
    """207 DELETE_SUBSCRIPTIONGROUP, with the group's offsets too when `remove_offset`."""
    code = RequestCode.DELETE_SUBSCRIPTIONGROUP
    ext = DeleteSubscriptionGroupRequestHeader(group, remove_offset).to_ext()
    response = client.invoke(code, ext, timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS)


def all_consumer_offsets(
    client: RemotingCaller, *, timeout_ms: int | None = None
) -> ConsumerOffsetSerializeWrapper:
    """43 GET_ALL_CONSUMER_OFFSET."""
    code = RequestCode.GET_ALL_CONSUMER_OFFSET
    response = client.invoke(code, timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS)
    return ConsumerOffsetSerializeWrapper.from_json(response.body)


def all_delay_offsets(
    client: RemotingCaller, *, timeout_ms: int | None = None
) -> DelayOffsetSerializeWrapper:
    """45 GET_ALL_DELAY_OFFSET."""
    code = RequestCode.GET_ALL_DELAY_OFFSET
    response = client.invoke(code, timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS)
    return DelayOffsetSerializeWrapper.from_json(response.body)


# ---------------------------------------------------------------------------------------------
# Store queries: 30, 31, 33, 12


def get_max_offset(
    client: RemotingCaller, topic: str, queue_id: int, *, timeout_ms: int | None = None
) -> int:
    """30 GET_MAX_OFFSET: the queue's entry count, i.e. the next queue_index to be written."""
    code = RequestCode.GET_MAX_OFFSET
    ext = QueueRequestHeader(topic, queue_id).to_ext()
    response = client.invoke(code, ext, timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS)
    return OffsetResponseHeader.from_ext(response.ext_fields).queue_index


def get_min_offset(
    client: RemotingCaller, topic: str, queue_id: int, *, timeout_ms: int | None = None
) -> int:
    """31 GET_MIN_OFFSET: the queue's first queue_index still readable."""
    code = RequestCode.GET_MIN_OFFSET
    ext = QueueRequestHeader(topic, queue_id).to_ext()
    response = client.invoke(code, ext, timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS)
    return OffsetResponseHeader.from_ext(response.ext_fields).queue_index


def search_offset(
    client: RemotingCaller,
    topic: str,
    queue_id: int,
    timestamp_ms: int,
    *,
    timeout_ms: int | None = None,
) -> int:
    """29 SEARCH_OFFSET_BY_TIMESTAMP: the queue_index whose store time is nearest
    `timestamp_ms` (RocketMQ's rule: it may be stored a little before it; docs/protocol.md)."""
    code = RequestCode.SEARCH_OFFSET_BY_TIMESTAMP
    ext = SearchOffsetRequestHeader(topic, queue_id, timestamp_ms).to_ext()
    response = client.invoke(code, ext, timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS)
    return OffsetResponseHeader.from_ext(response.ext_fields).queue_index


def query_consumer_offset(
    client: RemotingCaller, group: str, topic: str, queue_id: int, *, timeout_ms: int | None = None
) -> int | None:
    """14 QUERY_CONSUMER_OFFSET: where the group's consumers start on the queue (its committed
    index, or 0 for a queue that still starts at 0); None for 22 QUERY_NOT_FOUND."""
    code = RequestCode.QUERY_CONSUMER_OFFSET
    ext = QueryConsumerOffsetRequestHeader(group, topic, queue_id).to_ext()
    response = client.invoke(code, ext, timeout_ms=timeout_ms)
    if response.code == ResponseCode.QUERY_NOT_FOUND:
        return None
    _expect(client, code, response, ResponseCode.SUCCESS)
    return OffsetResponseHeader.from_ext(response.ext_fields).queue_index


def decode_records(body: bytes) -> tuple[StoredMessage, ...]:
    """The stored records of a PULL, VIEW or QUERY body, back to back as in the commit log.

    Raises MessageIllegalError when the body is not whole records to its last byte."""
    messages: list[StoredMessage] = []
    position_bytes = 0
    while position_bytes < len(body):
        message = decode_record(body, position_bytes)
        assert message.size_bytes > 0  # decode_record refuses a smaller TOTALSIZE
        messages.append(message)
        position_bytes += message.size_bytes
    return tuple(messages)


def view_message(
    client: RemotingCaller, log_offset_bytes: int, *, timeout_ms: int | None = None
) -> StoredMessage:
    """33 VIEW_MESSAGE_BY_ID: the record at `log_offset_bytes` (from an offset msgId). The broker
    answers 1 SYSTEM_ERROR when no record starts there; that raises RemotingResponseError."""
    code = RequestCode.VIEW_MESSAGE_BY_ID
    ext = ViewMessageRequestHeader(log_offset_bytes).to_ext()
    response = client.invoke(code, ext, timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS)
    return decode_record(response.body)


def query_message(
    client: RemotingCaller,
    header: QueryMessageRequestHeader,
    *,
    timeout_ms: int | None = None,
) -> tuple[StoredMessage, ...]:
    """12 QUERY_MESSAGE: the records the broker's index holds for the key; () on 22. The index
    matches hashes, so the caller checks KEYS / UNIQ_KEY again, as RocketMQ's clients do."""
    code = RequestCode.QUERY_MESSAGE
    response = client.invoke(code, header.to_ext(), timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND)
    if response.code == ResponseCode.QUERY_NOT_FOUND:
        return ()
    return decode_records(response.body)


def view_broker_stats_data(
    client: RemotingCaller, stats_name: str, stats_key: str, *, timeout_ms: int | None = None
) -> dict[str, dict[str, float]]:
    """315 VIEW_BROKER_STATS_DATA: BrokerStatsData as {"statsMinute" | "statsHour" | "statsDay":
    {"sum", "tps", "avgpt"}}; an unknown item raises RemotingResponseError (1)."""
    code = RequestCode.VIEW_BROKER_STATS_DATA
    ext = ViewBrokerStatsDataRequestHeader(stats_name, stats_key).to_ext()
    response = client.invoke(code, ext, timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS)
    where = "BrokerStatsData"
    document = _body(response.body, where)
    found: dict[str, dict[str, float]] = {}
    for window in ("statsMinute", "statsHour", "statsDay"):
        fields = _object(document.get(window), f"{where}.{window}")
        found[window] = {
            "sum": _int(fields, "sum", where),
            "tps": _number(fields, "tps", where),
            "avgpt": _number(fields, "avgpt", where),
        }
    return found


def _number(fields: dict[str, Any], key: str, where: str) -> float:
    value = fields.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RemoteProtocolError(f"{where}.{key}: {value!r} is not a number")
    return float(value)


# ---------------------------------------------------------------------------------------------
# One SEND (10) and one PULL (11)


def send_message(
    client: RemotingCaller,
    header: SendMessageRequestHeader,
    body: bytes,
    *,
    timeout_ms: int | None = None,
) -> SendMessageResponseHeader:
    """10 SEND_MESSAGE: one message (header.batch false), stored when this returns."""
    assert not header.batch
    code = RequestCode.SEND_MESSAGE
    response = client.invoke(code, header.to_ext(), body, timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS)
    return SendMessageResponseHeader.from_ext(response.ext_fields)


@dataclass(frozen=True, slots=True)
class PullResult:
    """A PULL answer: `code` is 0 FOUND, 19 NO_NEW_MSG, 20 NO_MATCHED_MSG or 21 OFFSET_ILLEGAL."""

    code: int
    next_begin_queue_index: int  # nextBeginOffset: where the next pull of this queue starts
    queue_index_min: int  # minOffset
    queue_index_max: int  # maxOffset
    messages: tuple[StoredMessage, ...]  # only with code 0


def pull_message(
    client: RemotingCaller, header: PullMessageRequestHeader, *, timeout_ms: int | None = None
) -> PullResult:
    """11 PULL_MESSAGE. A pull with the SUSPEND bit may be held up to suspend_timeout_ms, so the
    default timeout is that plus PULL_TIMEOUT_MARGIN_MS."""
    code = RequestCode.PULL_MESSAGE
    if timeout_ms is None:
        timeout_ms = max(header.suspend_timeout_ms, 0) + PULL_TIMEOUT_MARGIN_MS
    response = client.invoke(code, header.to_ext(), timeout_ms=timeout_ms)
    _expect(client, code, response, *PULL_CODES)
    answer = PullMessageResponseHeader.from_ext(response.ext_fields)
    messages = decode_records(response.body) if response.code == ResponseCode.SUCCESS else ()
    return PullResult(
        response.code,
        answer.next_begin_queue_index,
        answer.queue_index_min,
        answer.queue_index_max,
        messages,
    )


# ---------------------------------------------------------------------------------------------
# RocketMQ's statistics codes: 202, 208, 203, 204, 28, 26, 25 (fastjson bodies, admin_bodies.py)


def _fastjson(body: bytes, where: str) -> dict[Any, Any]:
    document = admin_bodies.loads_fastjson(body) if body else None
    if not isinstance(document, dict):
        raise RemoteProtocolError(f"{where}: the body is not an object")
    return document


def _queue_table(document: dict[Any, Any], where: str) -> list[tuple[MessageQueue, dict[str, Any]]]:
    """The rows of an offsetTable keyed by MessageQueue, in (topic, queue id) order."""
    table: object = document.get("offsetTable", {})
    if not isinstance(table, dict):
        raise RemoteProtocolError(f"{where}.offsetTable: not an object")
    rows: list[tuple[MessageQueue, dict[str, Any]]] = []
    for queue, row in table.items():
        if not isinstance(queue, MessageQueue):
            raise RemoteProtocolError(f"{where}.offsetTable: key {queue!r} is not a queue")
        rows.append((queue, _object(row, f"{where}.offsetTable[]")))
    rows.sort(key=lambda item: (item[0].topic, item[0].queue_id))
    return rows


@dataclass(frozen=True, slots=True)
class QueueStatus:
    queue_id: int  # queueId
    queue_index_min: int  # minOffset
    queue_index_max: int  # maxOffset: entries written, the next index
    last_update_timestamp_ms: int  # lastUpdateTimestamp: newest store time, 0 when empty


@dataclass(frozen=True, slots=True)
class TopicStatus:
    """GET_TOPIC_STATS_INFO's TopicStatsTable: one entry per write queue, by queue id."""

    topic: str
    queues: tuple[QueueStatus, ...]


def topic_status(
    client: RemotingCaller, topic: str, *, timeout_ms: int | None = None
) -> TopicStatus:
    """GET_TOPIC_STATS_INFO (202); 17 TOPIC_NOT_EXIST raises RemotingResponseError."""
    code = RequestCode.GET_TOPIC_STATS_INFO
    ext = admin_bodies.TopicRequestHeader(topic).to_ext()
    response = client.invoke(code, ext, timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS)
    where = "TopicStatsTable"
    queues = tuple(
        QueueStatus(
            queue.queue_id,
            _int(row, "minOffset", where),
            _int(row, "maxOffset", where),
            _int(row, "lastUpdateTimestamp", where),
        )
        for queue, row in _queue_table(_fastjson(response.body, where), where)
        if queue.topic == topic
    )
    return TopicStatus(topic, queues)


@dataclass(frozen=True, slots=True)
class QueueProgress:
    topic: str
    queue_id: int  # queueId
    broker_queue_index: int  # brokerOffset: the queue's entry count
    consumer_queue_index: int  # consumerOffset: the group's next index; 0 if none committed
    last_timestamp_ms: int  # lastTimestamp: store time of the last message consumed, 0 if none

    @property
    def lag(self) -> int:
        """Entries the group has yet to consume (Java's brokerOffset - consumerOffset)."""
        return max(0, self.broker_queue_index - self.consumer_queue_index)


@dataclass(frozen=True, slots=True)
class ConsumeStats:
    """GET_CONSUME_STATS's ConsumeStats."""

    consume_tps: float  # consumeTps
    queues: tuple[QueueProgress, ...]

    @property
    def total_lag(self) -> int:
        return sum(queue.lag for queue in self.queues)


def consume_stats(
    client: RemotingCaller,
    group: str,
    topic: str | None = None,
    *,
    timeout_ms: int | None = None,
) -> ConsumeStats:
    """GET_CONSUME_STATS (208) over the topics the broker knows the group for, or only `topic`;
    an unknown group gives no queues (Java)."""
    code = RequestCode.GET_CONSUME_STATS
    ext = admin_bodies.GetConsumeStatsRequestHeader(group, topic).to_ext()
    response = client.invoke(code, ext, timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS)
    where = "ConsumeStats"
    document = _fastjson(response.body, where)
    tps = document.get("consumeTps", 0.0)
    if isinstance(tps, bool) or not isinstance(tps, int | float):
        raise RemoteProtocolError(f"{where}.consumeTps: {tps!r} is not a number")
    queues = tuple(
        QueueProgress(
            queue.topic,
            queue.queue_id,
            _int(row, "brokerOffset", where),
            _int(row, "consumerOffset", where),
            _int(row, "lastTimestamp", where),
        )
        for queue, row in _queue_table(document, where)
    )
    return ConsumeStats(float(tps), queues)


@dataclass(frozen=True, slots=True)
class ClientConnection:
    """Java's Connection: one client of a group on one broker."""

    client_id: str  # clientId
    client_addr: str  # clientAddr: "ip:port" as the broker sees it
    language: str  # LanguageCode's name
    version: int


def _connections(document: dict[Any, Any], where: str) -> tuple[ClientConnection, ...]:
    items = _list(document.get("connectionSet", []), f"{where}.connectionSet")
    connections = []
    for item in items:
        fields = _object(item, f"{where}.connectionSet[]")
        connections.append(
            ClientConnection(
                _text(fields, "clientId", where),
                _text(fields, "clientAddr", where),
                _text(fields, "language", where),
                _int(fields, "version", where),
            )
        )
    return tuple(sorted(connections, key=lambda connection: connection.client_id))


def consumer_connections(
    client: RemotingCaller, group: str, *, timeout_ms: int | None = None
) -> tuple[ClientConnection, ...]:
    """GET_CONSUMER_CONNECTION_LIST (203): the group's online members; () for 206
    CONSUMER_NOT_ONLINE."""
    code = RequestCode.GET_CONSUMER_CONNECTION_LIST
    response = client.invoke(code, {"consumerGroup": group}, timeout_ms=timeout_ms)
    if response.code == ResponseCode.CONSUMER_NOT_ONLINE:
        return ()
    _expect(client, code, response, ResponseCode.SUCCESS)
    return _connections(_fastjson(response.body, "ConsumerConnection"), "ConsumerConnection")


def producer_connections(
    client: RemotingCaller, group: str, *, timeout_ms: int | None = None
) -> tuple[ClientConnection, ...]:
    """GET_PRODUCER_CONNECTION_LIST (204): the producer group's members; 1 (no member) raises."""
    code = RequestCode.GET_PRODUCER_CONNECTION_LIST
    ext = admin_bodies.ProducerGroupRequestHeader(group).to_ext()
    response = client.invoke(code, ext, timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS)
    return _connections(_fastjson(response.body, "ProducerConnection"), "ProducerConnection")


def broker_runtime_info(client: RemotingCaller, *, timeout_ms: int | None = None) -> dict[str, str]:
    """GET_BROKER_RUNTIME_INFO (28): the KVTable's table."""
    code = RequestCode.GET_BROKER_RUNTIME_INFO
    response = client.invoke(code, {}, timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS)
    return dict(KvTable.from_json(response.body).table)


DISPATCHED_POLL_S: Final = 0.01


def wait_dispatched(client: RemotingCaller, timeout_s: float) -> None:
    """Until the broker's `dispatchBehindBytes` (GET_BROKER_RUNTIME_INFO) is 0: then every send it
    answered before the call is pullable, counted in max offsets and stats, and found by key (the
    store writer publishes its write position before it answers; the dispatcher its counts and
    index before its dispatched position, docs/store.md). TimeoutError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while (behind := broker_runtime_info(client).get("dispatchBehindBytes")) != "0":
        if time.monotonic() >= deadline:
            raise TimeoutError(f"the dispatcher stayed {behind} bytes behind for {timeout_s:g} s")
        time.sleep(DISPATCHED_POLL_S)


def broker_config(client: RemotingCaller, *, timeout_ms: int | None = None) -> dict[str, str]:
    """GET_BROKER_CONFIG (26): the Java-properties body as a dict."""
    code = RequestCode.GET_BROKER_CONFIG
    response = client.invoke(code, {}, timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS)
    try:
        return parse_properties(response.body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise RemoteProtocolError(
            f"GET_BROKER_CONFIG: the body is not properties: {error}"
        ) from None


def update_broker_config(
    client: RemotingCaller, values: dict[str, str], *, timeout_ms: int | None = None
) -> None:
    """UPDATE_BROKER_CONFIG (25) with `values` as a Java-properties body; 1 (a key that cannot
    change at run time, a bad value) raises RemotingResponseError."""
    code = RequestCode.UPDATE_BROKER_CONFIG
    body = "".join(f"{key}={value}\n" for key, value in values.items()).encode("utf-8")
    response = client.invoke(code, {}, body=body, timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS)


# ---------------------------------------------------------------------------------------------
# mqbox's own code: 10003


@dataclass(frozen=True, slots=True)
class QueueReset:
    queue_id: int  # queueId
    previous_queue_index: int  # previousOffset: -1 if none was committed
    queue_index: int  # offset: the group's next index now


@dataclass(frozen=True, slots=True)
class ResetResult:
    """MQBOX_RESET_CONSUMER_OFFSET answer: every read queue of the topic on this broker."""

    group: str
    topic: str
    queues: tuple[QueueReset, ...]
    clients_notified: int = 0  # online members told with RESET_CONSUMER_CLIENT_OFFSET (220)


def reset_consumer_offset(
    client: RemotingCaller,
    group: str,
    topic: str,
    to: str,
    timestamp_ms: int | None = None,
    *,
    timeout_ms: int | None = None,
) -> ResetResult:
    """MQBOX_RESET_CONSUMER_OFFSET (10003): `to` is RESET_TO_EARLIEST, RESET_TO_LATEST or
    RESET_TO_TIMESTAMP (then `timestamp_ms`, ms since the epoch, is required)."""
    assert to in (RESET_TO_EARLIEST, RESET_TO_LATEST, RESET_TO_TIMESTAMP)
    assert (timestamp_ms is not None) == (to == RESET_TO_TIMESTAMP)
    ext = {"consumerGroup": group, "topic": topic, "to": to}
    if timestamp_ms is not None:
        ext["timestamp"] = str(timestamp_ms)
    response = client.invoke(MQBOX_RESET_CONSUMER_OFFSET, ext, timeout_ms=timeout_ms)
    _expect(client, MQBOX_RESET_CONSUMER_OFFSET, response, ResponseCode.SUCCESS)
    where = "MQBOX_RESET_CONSUMER_OFFSET"
    document = _body(response.body, where)
    queues = []
    for item in _list(document.get("queues"), f"{where}.queues"):
        fields = _object(item, f"{where}.queues[]")
        queues.append(
            QueueReset(
                _int(fields, "queueId", where),
                _int(fields, "previousOffset", where),
                _int(fields, "offset", where),
            )
        )
    # Brokers before 220 was sent leave clientsNotified out; none was told then.
    notified = _int(document, "clientsNotified", where) if "clientsNotified" in document else 0
    return ResetResult(
        _text(document, "group", where), _text(document, "topic", where), tuple(queues), notified
    )


# ---------------------------------------------------------------------------------------------
# MQBOX_BROKER_STATUS (10010)


@dataclass(frozen=True, slots=True)
class BrokerStatus:
    """MQBOX_BROKER_STATUS answer: a broker's identity and replication."""

    cluster_name: str  # clusterName
    broker_name: str  # brokerName
    broker_id: int  # brokerId
    broker_role: str  # brokerRole: ASYNC_MASTER, SYNC_MASTER or SLAVE
    version: str  # version
    ha_state: str  # haState: "n/a" until replication reports
    slave_lag_bytes: int | None  # slaveLagBytes
    slave_lag_messages: int | None  # slaveLagMessages


def broker_status(client: RemotingCaller, *, timeout_ms: int | None = None) -> BrokerStatus:
    """MQBOX_BROKER_STATUS (10010)."""
    response = client.invoke(MQBOX_BROKER_STATUS, {}, timeout_ms=timeout_ms)
    _expect(client, MQBOX_BROKER_STATUS, response, ResponseCode.SUCCESS)
    where = "MQBOX_BROKER_STATUS"
    document = _body(response.body, where)

    def count_or_none(key: str) -> int | None:
        return None if document.get(key) is None else _int(document, key, where)

    return BrokerStatus(
        _text(document, "clusterName", where),
        _text(document, "brokerName", where),
        _int(document, "brokerId", where),
        _text(document, "brokerRole", where),
        _text(document, "version", where),
        _text(document, "haState", where),
        count_or_none("slaveLagBytes"),
        count_or_none("slaveLagMessages"),
    )
