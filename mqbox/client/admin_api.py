"""Typed broker calls over a RemotingCaller (a RemotingClient or a Transport), for the admin CLI,
the clients and tests: one function per code.

Owns: building each request from typed headers (mqbox.protocol.headers), and reading each answer
into typed values: the topic admin codes (17 UPDATE_AND_CREATE_TOPIC, 215 DELETE_TOPIC_IN_BROKER,
21 GET_ALL_TOPIC_CONFIG), the store queries (30, 31, 33 VIEW_MESSAGE_BY_ID, 12 QUERY_MESSAGE),
one SEND_MESSAGE (10) and one PULL_MESSAGE (11), and mqbox's own admin views (10001 topic status,
10002 consumer progress, 10003 reset offsets; their ext and bodies are documented beside their
handlers in mqbox/server/roles/processors/admin/). Never: sockets (remoting.py), retries, routing
(the caller picks the broker), or output.

Every function raises `RemotingResponseError` for a response code it does not expect (its `code`
and `remark` say what the broker meant), the `RemotingError` family for transport failures, and
RemoteProtocolError or MessageIllegalError for an answer that does not parse. "Nothing found" is
not an error where the protocol has a code for it: `query_message` returns () on 22
QUERY_NOT_FOUND, and `pull_message` returns a PullResult for each of 0/19/20/21.

mqbox's private codes and reset words come from mqbox/protocol/mqbox_codes.py, their owner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from mqbox.client.remoting import RemotingCaller, RemotingResponseError
from mqbox.message import StoredMessage, decode_record
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.protocol.command import RemotingCommand, loads_json
from mqbox.protocol.errors import RemoteProtocolError
from mqbox.protocol.headers import (
    DataVersion,
    DeleteTopicRequestHeader,
    OffsetResponseHeader,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    QueryMessageRequestHeader,
    QueueRequestHeader,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
    TopicConfig,
    UpdateAndCreateTopicRequestHeader,
    ViewMessageRequestHeader,
)
from mqbox.protocol.mqbox_codes import (
    MQBOX_BROKER_STATUS,
    MQBOX_CONSUMER_PROGRESS,
    MQBOX_RESET_CONSUMER_OFFSET,
    MQBOX_TOPIC_STATUS,
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
# mqbox's own views: 10001, 10002, 10003


@dataclass(frozen=True, slots=True)
class QueueStatus:
    queue_id: int  # queueId
    queue_index_min: int  # minOffset
    queue_index_max: int  # maxOffset: entries written, the next index
    last_update_timestamp_ms: int  # lastUpdateTimestamp: newest store time, 0 when empty


@dataclass(frozen=True, slots=True)
class TopicStatus:
    """MQBOX_TOPIC_STATUS answer: one entry per queue id below max(read, write queue count)."""

    topic: str
    queues: tuple[QueueStatus, ...]


def topic_status(
    client: RemotingCaller, topic: str, *, timeout_ms: int | None = None
) -> TopicStatus:
    """MQBOX_TOPIC_STATUS (10001); 17 TOPIC_NOT_EXIST raises RemotingResponseError."""
    response = client.invoke(MQBOX_TOPIC_STATUS, {"topic": topic}, timeout_ms=timeout_ms)
    _expect(client, MQBOX_TOPIC_STATUS, response, ResponseCode.SUCCESS)
    where = "MQBOX_TOPIC_STATUS"
    document = _body(response.body, where)
    queues = []
    for item in _list(document.get("queues"), f"{where}.queues"):
        fields = _object(item, f"{where}.queues[]")
        queues.append(
            QueueStatus(
                _int(fields, "queueId", where),
                _int(fields, "minOffset", where),
                _int(fields, "maxOffset", where),
                _int(fields, "lastUpdateTimestamp", where),
            )
        )
    return TopicStatus(_text(document, "topic", where), tuple(queues))


@dataclass(frozen=True, slots=True)
class QueueProgress:
    topic: str
    queue_id: int  # queueId
    broker_queue_index: int  # brokerOffset: the queue's entry count
    consumer_queue_index: int  # consumerOffset: the group's next index; -1 if none committed
    lag: int  # entries the group has yet to consume


@dataclass(frozen=True, slots=True)
class ConsumerProgress:
    """MQBOX_CONSUMER_PROGRESS answer."""

    group: str
    client_ids: tuple[str, ...]  # clientIds: the group's live consumers on this broker
    total_lag: int  # totalLag
    queues: tuple[QueueProgress, ...]


def consumer_progress(
    client: RemotingCaller,
    group: str,
    topic: str | None = None,
    *,
    timeout_ms: int | None = None,
) -> ConsumerProgress:
    """MQBOX_CONSUMER_PROGRESS (10002) over every topic the group is known for, or only `topic`.
    26 SUBSCRIPTION_GROUP_NOT_EXIST (a group nobody knows) raises RemotingResponseError."""
    ext = {"consumerGroup": group}
    if topic is not None:
        ext["topic"] = topic
    response = client.invoke(MQBOX_CONSUMER_PROGRESS, ext, timeout_ms=timeout_ms)
    _expect(client, MQBOX_CONSUMER_PROGRESS, response, ResponseCode.SUCCESS)
    where = "MQBOX_CONSUMER_PROGRESS"
    document = _body(response.body, where)
    queues = []
    for item in _list(document.get("queues"), f"{where}.queues"):
        fields = _object(item, f"{where}.queues[]")
        queues.append(
            QueueProgress(
                _text(fields, "topic", where),
                _int(fields, "queueId", where),
                _int(fields, "brokerOffset", where),
                _int(fields, "consumerOffset", where),
                _int(fields, "lag", where),
            )
        )
    client_ids = tuple(
        str(item) for item in _list(document.get("clientIds", []), f"{where}.clientIds")
    )
    return ConsumerProgress(
        _text(document, "group", where),
        client_ids,
        _int(document, "totalLag", where),
        tuple(queues),
    )


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
