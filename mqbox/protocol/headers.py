"""Typed extFields headers and JSON bodies of the requests mqbox serves and sends.

Owns: one class per custom header (Java's `*RequestHeader` / `*ResponseHeader`) and per JSON body,
each with a decoder that checks everything from outside and an encoder that writes what the C++
client and Java read. Never: business rules (processors), frames (command.py).

Rules:

1. `from_ext(ext)` takes `RemotingCommand.ext_fields` and raises RemoteProtocolError naming the
   header and the wire field that is missing or bad. Its `response_code` is SYSTEM_ERROR (1),
   which is what the Java broker answers for a header it cannot decode. The SEND and PULL headers
   also take `ext_fields_json` (through `from_command`), which saves converting every value.
2. Numbers are range-checked: int32 where Java has `Integer`, int64 where it has `Long`. Parsing
   uses `int()`, which also reads surrounding blanks and `_` separators; harmless once the range
   holds, and cheaper than a stricter parser on the hot path.
3. Booleans are true for "1" or "true" in any letter case (the C++ client writes "0"/"1", Java
   "true"/"false"), false otherwise, as Java's `Boolean.parseBoolean` plus the C++ spelling.
4. `to_ext()` writes every value as a string (command.py refuses anything else) and leaves out
   optional fields that are None.
5. Python names follow docs/style.md: RocketMQ's "queue offset" is `queue_index`, its physical
   offset is `log_offset_bytes`, times are `*_ms`; each field's comment gives the wire name.

Classes are slotted and not frozen: a frozen dataclass pays an `object.__setattr__` per field in
`__init__`, and the SEND and PULL headers are built once per request on the hot path.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import IntEnum
from typing import Any, Final, Protocol, Self, TypeAlias, TypeVar

from mqbox.protocol.codes import (
    ConsumeFromWhere,
    ConsumeType,
    MessageModel,
    RequestCode,
)
from mqbox.protocol.command import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    RemotingCommand,
    dumps_json,
    loads_json,
    normalize_ext_fields,
    short_repr,
)
from mqbox.protocol.errors import RemoteProtocolError

Ext: TypeAlias = dict[str, str]


class ExtHeader(Protocol):
    """What every typed header here offers: decode from extFields, encode back."""

    @classmethod
    def from_ext(cls, ext: Ext) -> Self: ...

    def to_ext(self) -> Ext: ...


TOPIC_SIZE_BYTES_MAX: Final = 127
_TOPIC_CHARACTERS: Final = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789%|_-"
)


def validate_topic(name: str) -> str | None:
    """None if `name` is a legal topic, otherwise the remark to answer with.

    The Java broker's rule: 1 to 127 characters of `[A-Za-z0-9%|_-]`. All are ASCII, so characters
    and bytes agree, and 127 also keeps the stored record's signed topic-length byte positive.
    """
    if not name:
        return "the topic name is empty"
    if len(name) > TOPIC_SIZE_BYTES_MAX:
        return f"the topic name is {len(name)} characters long, more than {TOPIC_SIZE_BYTES_MAX}"
    if not _TOPIC_CHARACTERS.issuperset(name):
        return f"the topic name {name!r} has characters outside [A-Za-z0-9%|_-]"
    return None


def parse_bool(text: str) -> bool:
    """True for "1" or "true" in any letter case; false for anything else."""
    return text == "1" or text.lower() == "true"


def _bool_text(value: bool) -> str:
    return "true" if value else "false"


# ---------------------------------------------------------------------------------------------
# extFields readers. `where` is the header class name, for the error message.


def _missing(where: str, key: str) -> RemoteProtocolError:
    return RemoteProtocolError(f"{where}: required field {key!r} is missing")


def _text(ext: Ext, key: str, where: str) -> str:
    value = ext.get(key)
    if value is None:
        raise _missing(where, key)
    return value


def _text_or_none(ext: Ext, key: str) -> str | None:
    """An optional text field; the empty string counts as absent (C++ sends "" for "none")."""
    return ext.get(key) or None


def _parse_int(text: str, low: int, high: int, key: str, where: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise RemoteProtocolError(
            f"{where}: field {key!r} is {short_repr(text)}, not an integer"
        ) from None
    if not low <= value <= high:
        bits = 32 if high == INT32_MAX else 64
        raise RemoteProtocolError(
            f"{where}: field {key!r} = {short_repr(value)} does not fit {bits} bits"
        )
    return value


def _int32(ext: Ext, key: str, where: str) -> int:
    return _parse_int(_text(ext, key, where), INT32_MIN, INT32_MAX, key, where)


def _int64(ext: Ext, key: str, where: str) -> int:
    return _parse_int(_text(ext, key, where), INT64_MIN, INT64_MAX, key, where)


def _int32_or_none(ext: Ext, key: str, where: str) -> int | None:
    text = ext.get(key)
    return None if text is None else _parse_int(text, INT32_MIN, INT32_MAX, key, where)


def _bool(ext: Ext, key: str) -> bool:
    text = ext.get(key)
    return False if text is None else parse_bool(text)


# ---------------------------------------------------------------------------------------------
# Name server: 103, 104, 105, 216


@dataclass(slots=True)
class GetRouteInfoRequestHeader:
    """105 GET_ROUTEINFO_BY_TOPIC."""

    topic: str
    # acceptStandardJsonOnly (Java 4.9.x): a Java namesrv writes brokerAddrs keys unquoted for
    # clients older than 4.9.4 unless this is set. mqbox always writes them quoted.
    accept_standard_json_only: bool = False

    @classmethod
    def from_ext(cls, ext: Ext) -> Self:
        return cls(_text(ext, "topic", cls.__name__), _bool(ext, "acceptStandardJsonOnly"))

    def to_ext(self) -> Ext:
        ext = {"topic": self.topic}
        if self.accept_standard_json_only:
            ext["acceptStandardJsonOnly"] = "true"
        return ext


@dataclass(slots=True)
class RegisterBrokerRequestHeader:
    """103 REGISTER_BROKER (broker to namesrv); the body is a RegisterBrokerBody."""

    broker_name: str  # brokerName
    broker_addr: str  # brokerAddr: the ip:port clients connect to
    cluster_name: str  # clusterName
    ha_server_addr: str  # haServerAddr: ip:haPort
    broker_id: int  # brokerId: 0 is the master
    compressed: bool = False  # compressed: Java's deflate body; mqbox neither sends nor reads it
    body_crc32: int = 0  # bodyCrc32: CRC32 of the body & 0x7FFFFFFF; 0 means "not checked"

    @classmethod
    def from_ext(cls, ext: Ext) -> Self:
        where = cls.__name__
        return cls(
            _text(ext, "brokerName", where),
            _text(ext, "brokerAddr", where),
            _text(ext, "clusterName", where),
            _text(ext, "haServerAddr", where),
            _int64(ext, "brokerId", where),
            _bool(ext, "compressed"),
            _int32_or_none(ext, "bodyCrc32", where) or 0,
        )

    def to_ext(self) -> Ext:
        return {
            "brokerName": self.broker_name,
            "brokerAddr": self.broker_addr,
            "clusterName": self.cluster_name,
            "haServerAddr": self.ha_server_addr,
            "brokerId": str(self.broker_id),
            "compressed": _bool_text(self.compressed),
            "bodyCrc32": str(self.body_crc32),
        }


@dataclass(slots=True)
class RegisterBrokerResponseHeader:
    """103 REGISTER_BROKER response: filled only for slaves."""

    ha_server_addr: str | None = None  # haServerAddr
    master_addr: str | None = None  # masterAddr

    @classmethod
    def from_ext(cls, ext: Ext) -> Self:
        return cls(_text_or_none(ext, "haServerAddr"), _text_or_none(ext, "masterAddr"))

    def to_ext(self) -> Ext:
        ext: Ext = {}
        if self.ha_server_addr is not None:
            ext["haServerAddr"] = self.ha_server_addr
        if self.master_addr is not None:
            ext["masterAddr"] = self.master_addr
        return ext


@dataclass(slots=True)
class UnregisterBrokerRequestHeader:
    """104 UNREGISTER_BROKER."""

    broker_name: str  # brokerName
    broker_addr: str  # brokerAddr
    cluster_name: str  # clusterName
    broker_id: int  # brokerId

    @classmethod
    def from_ext(cls, ext: Ext) -> Self:
        where = cls.__name__
        return cls(
            _text(ext, "brokerName", where),
            _text(ext, "brokerAddr", where),
            _text(ext, "clusterName", where),
            _int64(ext, "brokerId", where),
        )

    def to_ext(self) -> Ext:
        return {
            "brokerName": self.broker_name,
            "brokerAddr": self.broker_addr,
            "clusterName": self.cluster_name,
            "brokerId": str(self.broker_id),
        }


@dataclass(slots=True)
class DeleteTopicRequestHeader:
    """215 DELETE_TOPIC_IN_BROKER and 216 DELETE_TOPIC_IN_NAMESRV: the same single field."""

    topic: str

    @classmethod
    def from_ext(cls, ext: Ext) -> Self:
        return cls(_text(ext, "topic", cls.__name__))

    def to_ext(self) -> Ext:
        return {"topic": self.topic}


@dataclass(slots=True)
class WipeWritePermOfBrokerRequestHeader:
    """205 WIPE_WRITE_PERM_OF_BROKER (admin to namesrv)."""

    broker_name: str  # brokerName

    @classmethod
    def from_ext(cls, ext: Ext) -> Self:
        return cls(_text(ext, "brokerName", cls.__name__))

    def to_ext(self) -> Ext:
        return {"brokerName": self.broker_name}


@dataclass(slots=True)
class WipeWritePermOfBrokerResponseHeader:
    """205 WIPE_WRITE_PERM_OF_BROKER response: how many topics lost the write permission."""

    wipe_topic_count: int  # wipeTopicCount

    @classmethod
    def from_ext(cls, ext: Ext) -> Self:
        return cls(_int32(ext, "wipeTopicCount", cls.__name__))

    def to_ext(self) -> Ext:
        return {"wipeTopicCount": str(self.wipe_topic_count)}


@dataclass(slots=True)
class PutKvConfigRequestHeader:
    """100 PUT_KV_CONFIG (codes.py): set one key of a name server KV namespace."""

    namespace: str
    key: str
    value: str

    @classmethod
    def from_ext(cls, ext: Ext) -> Self:
        where = cls.__name__
        return cls(
            _text(ext, "namespace", where), _text(ext, "key", where), _text(ext, "value", where)
        )

    def to_ext(self) -> Ext:
        return {"namespace": self.namespace, "key": self.key, "value": self.value}


@dataclass(slots=True)
class KvConfigRequestHeader:
    """101 GET_KV_CONFIG and 102 DELETE_KV_CONFIG (codes.py): the same two fields."""

    namespace: str
    key: str

    @classmethod
    def from_ext(cls, ext: Ext) -> Self:
        where = cls.__name__
        return cls(_text(ext, "namespace", where), _text(ext, "key", where))

    def to_ext(self) -> Ext:
        return {"namespace": self.namespace, "key": self.key}


@dataclass(slots=True)
class GetKvConfigResponseHeader:
    """101 GET_KV_CONFIG response: the value, present on SUCCESS only."""

    value: str | None = None

    @classmethod
    def from_ext(cls, ext: Ext) -> Self:
        return cls(ext.get("value"))

    def to_ext(self) -> Ext:
        return {} if self.value is None else {"value": self.value}


# ---------------------------------------------------------------------------------------------
# Producer: 10 / 310 / 320


# Wire names of SendMessageRequestHeader's fields in field order: code 10 spells them out, the V2
# header of 310/320 uses one letter each (docs/protocol.md section 4.2).
_SEND_KEYS: Final = (
    "producerGroup",
    "topic",
    "defaultTopic",
    "defaultTopicQueueNums",
    "queueId",
    "sysFlag",
    "bornTimestamp",
    "flag",
    "properties",
    "reconsumeTimes",
    "unitMode",
    "maxReconsumeTimes",
    "batch",
    "brokerName",
)
_SEND_KEYS_V2: Final = ("a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n")
assert len(_SEND_KEYS) == len(_SEND_KEYS_V2)
_SEND_MESSAGE: Final = int(RequestCode.SEND_MESSAGE)
_SEND_MESSAGE_V2: Final = int(RequestCode.SEND_MESSAGE_V2)
_SEND_BATCH_MESSAGE: Final = int(RequestCode.SEND_BATCH_MESSAGE)
_SEND_V2_CODES: Final = frozenset((_SEND_MESSAGE_V2, _SEND_BATCH_MESSAGE))
# mqbox's own extFields of a send (docs/protocol.md section 4.2, "The idempotent window"): a
# request carrying SEND_IDEMPOTENT_KEY = "true" asks the broker to drop each message whose
# (topic, UNIQ_KEY) it stored within its window; the answer then names the first records, and
# carries SEND_DUPLICATES_KEY (how many were dropped) when that is not 0. RocketMQ's brokers and
# clients ignore both fields.
SEND_IDEMPOTENT_KEY: Final = "mqboxIdempotent"
SEND_DUPLICATES_KEY: Final = "mqboxDuplicates"


@dataclass(slots=True)
class SendMessageRequestHeader:
    """10 SEND_MESSAGE, and the one-letter V2 header of 310 SEND_MESSAGE_V2 and 320 SEND_BATCH.

    `batch` is true when the field reads true ("1" from C++, "true" from Java) or the code is 320.
    """

    producer_group: str  # producerGroup / a
    topic: str  # topic / b
    default_topic: str  # defaultTopic / c: template for auto-creating `topic`
    default_topic_queue_nums: int  # defaultTopicQueueNums / d
    queue_id: int  # queueId / e: negative means "broker, pick one"
    sys_flag: int  # sysFlag / f: the message sysFlag
    born_timestamp_ms: int  # bornTimestamp / g
    flag: int  # flag / h: the user's flag
    properties: str = ""  # properties / i: name\x01value\x02 pairs, read as Java reads text
    reconsume_times: int = 0  # reconsumeTimes / j
    unit_mode: bool = False  # unitMode / k
    max_reconsume_times: int | None = None  # maxReconsumeTimes / l: Java only
    batch: bool = False  # batch / m
    broker_name: str | None = None  # n: 4.9.7 clients only

    @classmethod
    def from_command(cls, command: RemotingCommand) -> Self:
        """Decode the header of a SEND_MESSAGE (10), SEND_MESSAGE_V2 (310) or SEND_BATCH (320)."""
        return cls.from_ext(command.ext_fields_json, command.code)

    @classmethod
    def from_ext(cls, ext: Mapping[str, object], code: int = _SEND_MESSAGE) -> Self:
        """Decode from extFields as strings, or as decoded JSON (`ext_fields_json`).

        The hot path of every send: it reads JSON numbers as they come (the C++ client sends five)
        and converts only what it uses. Anything unusual (a missing field, a value of another JSON
        type, text that is not a number, a number out of range) goes to `from_ext_checked`, the
        reference that defines the result and names the bad field.

        Written out field by field on purpose: measured with callgrind, `type(x) is str` tests and
        chained comparisons cost less than building tuples for itemgetter, map and min/max.
        """
        (
            k_group,
            k_topic,
            k_default_topic,
            k_queue_nums,
            k_queue_id,
            k_sys_flag,
            k_born,
            k_flag,
            k_properties,
            k_reconsume,
            k_unit_mode,
            k_max_reconsume,
            k_batch,
            k_broker_name,
        ) = _SEND_KEYS_V2 if code in _SEND_V2_CODES else _SEND_KEYS
        try:
            producer_group = ext[k_group]
            topic = ext[k_topic]
            default_topic = ext[k_default_topic]
            queue_nums = ext[k_queue_nums]
            queue_id = ext[k_queue_id]
            sys_flag = ext[k_sys_flag]
            born_timestamp_ms = ext[k_born]
            flag = ext[k_flag]
        except KeyError:
            return cls.from_ext_checked(normalize_ext_fields(ext), code)
        get = ext.get
        properties = get(k_properties, "")
        reconsume_times = get(k_reconsume, 0)
        unit_mode = get(k_unit_mode, "0")
        batch = get(k_batch, "0")
        max_reconsume_times = get(k_max_reconsume)  # Java, on retry topics
        broker_name = get(k_broker_name)  # Java 4.9.7, on every V2 send
        if (
            type(producer_group) is not str
            or type(topic) is not str
            or type(default_topic) is not str
            or type(properties) is not str
            or type(unit_mode) is not str
            or type(batch) is not str
            or (broker_name is not None and type(broker_name) is not str)
        ):
            return cls.from_ext_checked(normalize_ext_fields(ext), code)
        # int() takes both JSON numbers and decimal text, but also bools and floats, which the
        # reference refuses; the type tests keep those out of the quick path. ValueError is the
        # cue to take the reference path.
        try:
            if type(queue_nums) is not int:
                if type(queue_nums) is not str:
                    raise ValueError(queue_nums)
                queue_nums = int(queue_nums)
            if type(queue_id) is not int:
                if type(queue_id) is not str:
                    raise ValueError(queue_id)
                queue_id = int(queue_id)
            if type(sys_flag) is not int:
                if type(sys_flag) is not str:
                    raise ValueError(sys_flag)
                sys_flag = int(sys_flag)
            if type(born_timestamp_ms) is not int:
                if type(born_timestamp_ms) is not str:
                    raise ValueError(born_timestamp_ms)
                born_timestamp_ms = int(born_timestamp_ms)
            if type(flag) is not int:
                if type(flag) is not str:
                    raise ValueError(flag)
                flag = int(flag)
            if type(reconsume_times) is not int:
                if type(reconsume_times) is not str:
                    raise ValueError(reconsume_times)
                reconsume_times = int(reconsume_times)
            if max_reconsume_times is not None and type(max_reconsume_times) is not int:
                if type(max_reconsume_times) is not str:
                    raise ValueError(max_reconsume_times)
                max_reconsume_times = int(max_reconsume_times)
        except ValueError:
            return cls.from_ext_checked(normalize_ext_fields(ext), code)
        if not (
            INT32_MIN <= queue_nums <= INT32_MAX
            and INT32_MIN <= queue_id <= INT32_MAX
            and INT32_MIN <= sys_flag <= INT32_MAX
            and INT64_MIN <= born_timestamp_ms <= INT64_MAX
            and INT32_MIN <= flag <= INT32_MAX
            and INT32_MIN <= reconsume_times <= INT32_MAX
            and (max_reconsume_times is None or INT32_MIN <= max_reconsume_times <= INT32_MAX)
        ):
            return cls.from_ext_checked(normalize_ext_fields(ext), code)
        return cls(
            producer_group,
            topic,
            default_topic,
            queue_nums,
            queue_id,
            sys_flag,
            born_timestamp_ms,
            flag,
            properties,
            reconsume_times,
            unit_mode != "0" and parse_bool(unit_mode),
            max_reconsume_times,
            code == _SEND_BATCH_MESSAGE or (batch != "0" and parse_bool(batch)),
            broker_name,
        )

    @classmethod
    def from_ext_checked(cls, ext: Ext, code: int = _SEND_MESSAGE) -> Self:
        """The reference decoder: plain and field by field. `from_ext` must agree with it."""
        where = cls.__name__
        keys = _SEND_KEYS_V2 if code in _SEND_V2_CODES else _SEND_KEYS
        return cls(
            producer_group=_text(ext, keys[0], where),
            topic=_text(ext, keys[1], where),
            default_topic=_text(ext, keys[2], where),
            default_topic_queue_nums=_int32(ext, keys[3], where),
            queue_id=_int32(ext, keys[4], where),
            sys_flag=_int32(ext, keys[5], where),
            born_timestamp_ms=_int64(ext, keys[6], where),
            flag=_int32(ext, keys[7], where),
            properties=ext.get(keys[8], ""),
            reconsume_times=_int32_or_none(ext, keys[9], where) or 0,
            unit_mode=_bool(ext, keys[10]),
            max_reconsume_times=_int32_or_none(ext, keys[11], where),
            batch=code == _SEND_BATCH_MESSAGE or _bool(ext, keys[12]),
            broker_name=ext.get(keys[13]),
        )

    def to_ext(self) -> Ext:
        """The code-10 header, spelled out."""
        return self._to_ext(_SEND_KEYS)

    def to_ext_v2(self) -> Ext:
        """The single-letter header of 310 / 320."""
        return self._to_ext(_SEND_KEYS_V2)

    def _to_ext(self, keys: tuple[str, ...]) -> Ext:
        ext = {
            keys[0]: self.producer_group,
            keys[1]: self.topic,
            keys[2]: self.default_topic,
            keys[3]: str(self.default_topic_queue_nums),
            keys[4]: str(self.queue_id),
            keys[5]: str(self.sys_flag),
            keys[6]: str(self.born_timestamp_ms),
            keys[7]: str(self.flag),
            keys[8]: self.properties,
            keys[9]: str(self.reconsume_times),
            keys[10]: _bool_text(self.unit_mode),
        }
        if self.max_reconsume_times is not None:
            ext[keys[11]] = str(self.max_reconsume_times)
        ext[keys[12]] = _bool_text(self.batch)
        if self.broker_name is not None:
            ext[keys[13]] = self.broker_name
        return ext


# The V2 (310 / 320) wire key of each SendMessageRequestHeader field, for a caller that fills in
# a header built once (a producer's requests to one topic differ in a few fields only).
SEND_V2_KEY_BY_FIELD: Final = dict(
    zip((item.name for item in fields(SendMessageRequestHeader)), _SEND_KEYS_V2, strict=True)
)
assert SEND_V2_KEY_BY_FIELD["queue_id"] == "e"
assert SEND_V2_KEY_BY_FIELD["batch"] == "m"


@dataclass(slots=True)
class SendMessageResponseHeader:
    """Response to 10 / 310 / 320. Every field a string; the C++ client crashes without them."""

    msg_id: str  # msgId: the offset msgId; for a batch, the ids of all elements joined by ","
    queue_id: int  # queueId
    queue_index: int  # queueOffset: for a batch, the first element's
    transaction_id: str | None = None  # transactionId

    @classmethod
    def from_command(cls, command: RemotingCommand) -> Self:
        """Decode a SEND answer's header (a producer reads one per message): straight from the
        decoded JSON when every field is a string, as brokers send them; anything else through
        from_ext, the reference, which names a bad field."""
        ext = command.ext_fields_json
        msg_id = ext.get("msgId")
        queue_id = ext.get("queueId")
        queue_index = ext.get("queueOffset")
        transaction_id = ext.get("transactionId")
        if (
            type(msg_id) is str
            and type(queue_id) is str
            and type(queue_index) is str
            and (transaction_id is None or type(transaction_id) is str)
        ):
            try:
                queue_id_value = int(queue_id)
                queue_index_value = int(queue_index)
            except ValueError:
                pass
            else:
                if (
                    INT32_MIN <= queue_id_value <= INT32_MAX
                    and INT64_MIN <= queue_index_value <= INT64_MAX
                ):
                    return cls(msg_id, queue_id_value, queue_index_value, transaction_id)
        return cls.from_ext(command.ext_fields)

    @classmethod
    def from_ext(cls, ext: Ext) -> Self:
        where = cls.__name__
        return cls(
            _text(ext, "msgId", where),
            _int32(ext, "queueId", where),
            _int64(ext, "queueOffset", where),
            ext.get("transactionId"),
        )

    def to_ext(self) -> Ext:
        if self.transaction_id is None:
            return {
                "msgId": self.msg_id,
                "queueId": str(self.queue_id),
                "queueOffset": str(self.queue_index),
            }
        return {
            "msgId": self.msg_id,
            "queueId": str(self.queue_id),
            "queueOffset": str(self.queue_index),
            "transactionId": self.transaction_id,
        }


# ---------------------------------------------------------------------------------------------
# Consumer: 11 PULL_MESSAGE and the offset family


@dataclass(slots=True)
class PullMessageRequestHeader:
    """11 PULL_MESSAGE."""

    consumer_group: str  # consumerGroup
    topic: str  # topic
    queue_id: int  # queueId
    queue_index: int  # queueOffset: the first index to read
    message_count_max: int  # maxMsgNums
    sys_flag: int  # sysFlag: PULL_FLAG_* bits of codes.py
    commit_queue_index: int  # commitOffset: valid only with PULL_FLAG_COMMIT_OFFSET
    suspend_timeout_ms: int  # suspendTimeoutMillis: the longest a held pull may wait
    sub_version: int  # subVersion
    subscription: str | None = None  # subscription: "*" or "TagA || TagB"
    expression_type: str | None = None  # expressionType: absent (TAG) from C++

    @classmethod
    def from_command(cls, command: RemotingCommand) -> Self:
        return cls.from_ext(command.ext_fields_json)

    @classmethod
    def from_ext(cls, ext: Mapping[str, object]) -> Self:
        """Decode from extFields as strings or as decoded JSON; see SendMessageRequestHeader."""
        get = ext.get
        consumer_group = get("consumerGroup")
        topic = get("topic")
        queue_id = get("queueId")
        queue_index = get("queueOffset")
        message_count_max = get("maxMsgNums")
        sys_flag = get("sysFlag")
        commit_queue_index = get("commitOffset")
        suspend_timeout_ms = get("suspendTimeoutMillis")
        sub_version = get("subVersion")
        subscription = get("subscription")
        expression_type = get("expressionType")
        if (
            type(consumer_group) is not str
            or type(topic) is not str
            or (subscription is not None and type(subscription) is not str)
            or (expression_type is not None and type(expression_type) is not str)
        ):
            return cls.from_ext_checked(normalize_ext_fields(ext))
        try:
            if type(queue_id) is not int:
                if type(queue_id) is not str:
                    raise ValueError(queue_id)
                queue_id = int(queue_id)
            if type(queue_index) is not int:
                if type(queue_index) is not str:
                    raise ValueError(queue_index)
                queue_index = int(queue_index)
            if type(message_count_max) is not int:
                if type(message_count_max) is not str:
                    raise ValueError(message_count_max)
                message_count_max = int(message_count_max)
            if type(sys_flag) is not int:
                if type(sys_flag) is not str:
                    raise ValueError(sys_flag)
                sys_flag = int(sys_flag)
            if type(commit_queue_index) is not int:
                if type(commit_queue_index) is not str:
                    raise ValueError(commit_queue_index)
                commit_queue_index = int(commit_queue_index)
            if type(suspend_timeout_ms) is not int:
                if type(suspend_timeout_ms) is not str:
                    raise ValueError(suspend_timeout_ms)
                suspend_timeout_ms = int(suspend_timeout_ms)
            if type(sub_version) is not int:
                if type(sub_version) is not str:
                    raise ValueError(sub_version)
                sub_version = int(sub_version)
        except ValueError:
            return cls.from_ext_checked(normalize_ext_fields(ext))
        if not (
            INT32_MIN <= queue_id <= INT32_MAX
            and INT64_MIN <= queue_index <= INT64_MAX
            and INT32_MIN <= message_count_max <= INT32_MAX
            and INT32_MIN <= sys_flag <= INT32_MAX
            and INT64_MIN <= commit_queue_index <= INT64_MAX
            and INT64_MIN <= suspend_timeout_ms <= INT64_MAX
            and INT64_MIN <= sub_version <= INT64_MAX
        ):
            return cls.from_ext_checked(normalize_ext_fields(ext))
        return cls(
            consumer_group,
            topic,
            queue_id,
            queue_index,
            message_count_max,
            sys_flag,
            commit_queue_index,
            suspend_timeout_ms,
            sub_version,
            subscription,
            expression_type,
        )

    @classmethod
    def from_ext_checked(cls, ext: Ext) -> Self:
        """The reference decoder: plain and field by field. `from_ext` must agree with it."""
        where = cls.__name__
        return cls(
            consumer_group=_text(ext, "consumerGroup", where),
            topic=_text(ext, "topic", where),
            queue_id=_int32(ext, "queueId", where),
            queue_index=_int64(ext, "queueOffset", where),
            message_count_max=_int32(ext, "maxMsgNums", where),
            sys_flag=_int32(ext, "sysFlag", where),
            commit_queue_index=_int64(ext, "commitOffset", where),
            suspend_timeout_ms=_int64(ext, "suspendTimeoutMillis", where),
            sub_version=_int64(ext, "subVersion", where),
            subscription=ext.get("subscription"),
            expression_type=ext.get("expressionType"),
        )

    def to_ext(self) -> Ext:
        ext = {
            "consumerGroup": self.consumer_group,
            "topic": self.topic,
            "queueId": str(self.queue_id),
            "queueOffset": str(self.queue_index),
            "maxMsgNums": str(self.message_count_max),
            "sysFlag": str(self.sys_flag),
            "commitOffset": str(self.commit_queue_index),
            "suspendTimeoutMillis": str(self.suspend_timeout_ms),
            "subVersion": str(self.sub_version),
        }
        if self.subscription is not None:
            ext["subscription"] = self.subscription
        if self.expression_type is not None:
            ext["expressionType"] = self.expression_type
        return ext


@dataclass(slots=True)
class PullMessageResponseHeader:
    """Response to 11; all four fields are required on codes 0, 19, 20 and 21."""

    next_begin_queue_index: int  # nextBeginOffset
    queue_index_min: int  # minOffset
    queue_index_max: int  # maxOffset
    suggest_which_broker_id: int = 0  # suggestWhichBrokerId

    @classmethod
    def from_ext(cls, ext: Ext) -> Self:
        where = cls.__name__
        return cls(
            _int64(ext, "nextBeginOffset", where),
            _int64(ext, "minOffset", where),
            _int64(ext, "maxOffset", where),
            _int64(ext, "suggestWhichBrokerId", where),
        )

    def to_ext(self) -> Ext:
        return {
            "nextBeginOffset": str(self.next_begin_queue_index),
            "minOffset": str(self.queue_index_min),
            "maxOffset": str(self.queue_index_max),
            "suggestWhichBrokerId": str(self.suggest_which_broker_id),
        }


@dataclass(slots=True)
class QueryConsumerOffsetRequestHeader:
    """14 QUERY_CONSUMER_OFFSET; answered with an OffsetResponseHeader or QUERY_NOT_FOUND."""

    consumer_group: str  # consumerGroup
    topic: str
    queue_id: int  # queueId

    @classmethod
    def from_ext(cls, ext: Ext) -> Self:
        where = cls.__name__
        return cls(
            _text(ext, "consumerGroup", where),
            _text(ext, "topic", where),
            _int32(ext, "queueId", where),
        )

    def to_ext(self) -> Ext:
        return {
            "consumerGroup": self.consumer_group,
            "topic": self.topic,
            "queueId": str(self.queue_id),
        }


@dataclass(slots=True)
class UpdateConsumerOffsetRequestHeader:
    """15 UPDATE_CONSUMER_OFFSET: the next index the group will consume."""

    consumer_group: str  # consumerGroup
    topic: str
    queue_id: int  # queueId
    commit_queue_index: int  # commitOffset

    @classmethod
    def from_ext(cls, ext: Ext) -> Self:
        where = cls.__name__
        return cls(
            _text(ext, "consumerGroup", where),
            _text(ext, "topic", where),
            _int32(ext, "queueId", where),
            _int64(ext, "commitOffset", where),
        )

    def to_ext(self) -> Ext:
        return {
            "consumerGroup": self.consumer_group,
            "topic": self.topic,
            "queueId": str(self.queue_id),
            "commitOffset": str(self.commit_queue_index),
        }


@dataclass(slots=True)
class QueueRequestHeader:
    """`topic` + `queueId`: 30 GET_MAX_OFFSET, 31 GET_MIN_OFFSET, 32 GET_EARLIEST_MSG_STORETIME."""

    topic: str
    queue_id: int  # queueId

    @classmethod
    def from_ext(cls, ext: Ext) -> Self:
        where = cls.__name__
        return cls(_text(ext, "topic", where), _int32(ext, "queueId", where))

    def to_ext(self) -> Ext:
        return {"topic": self.topic, "queueId": str(self.queue_id)}


GetMaxOffsetRequestHeader: TypeAlias = QueueRequestHeader
GetMinOffsetRequestHeader: TypeAlias = QueueRequestHeader
GetEarliestMsgStoretimeRequestHeader: TypeAlias = QueueRequestHeader


@dataclass(slots=True)
class SearchOffsetRequestHeader:
    """29 SEARCH_OFFSET_BY_TIMESTAMP."""

    topic: str
    queue_id: int  # queueId
    timestamp_ms: int  # timestamp

    @classmethod
    def from_ext(cls, ext: Ext) -> Self:
        where = cls.__name__
        return cls(
            _text(ext, "topic", where),
            _int32(ext, "queueId", where),
            _int64(ext, "timestamp", where),
        )

    def to_ext(self) -> Ext:
        return {
            "topic": self.topic,
            "queueId": str(self.queue_id),
            "timestamp": str(self.timestamp_ms),
        }


@dataclass(slots=True)
class OffsetResponseHeader:
    """`offset`: the answer to 14, 29, 30 and 31. C++ crashes if it is missing on code 0."""

    queue_index: int  # offset

    @classmethod
    def from_ext(cls, ext: Ext) -> Self:
        return cls(_int64(ext, "offset", cls.__name__))

    def to_ext(self) -> Ext:
        return {"offset": str(self.queue_index)}


@dataclass(slots=True)
class GetEarliestMsgStoretimeResponseHeader:
    """Answer to 32: the store time of the queue's first message."""

    timestamp_ms: int  # timestamp

    @classmethod
    def from_ext(cls, ext: Ext) -> Self:
        return cls(_int64(ext, "timestamp", cls.__name__))

    def to_ext(self) -> Ext:
        return {"timestamp": str(self.timestamp_ms)}


@dataclass(slots=True)
class ViewMessageRequestHeader:
    """33 VIEW_MESSAGE_BY_ID: the commit log offset decoded from an offset msgId."""

    log_offset_bytes: int  # offset

    @classmethod
    def from_ext(cls, ext: Ext) -> Self:
        return cls(_int64(ext, "offset", cls.__name__))

    def to_ext(self) -> Ext:
        return {"offset": str(self.log_offset_bytes)}


@dataclass(slots=True, frozen=True)
class ViewBrokerStatsDataRequestHeader:
    """315 VIEW_BROKER_STATS_DATA: which stats item (docs/metrics.md section 2), both required."""

    stats_name: str  # statsName, e.g. TOPIC_PUT_NUMS
    stats_key: str  # statsKey: a topic, "topic@group", or the cluster name

    @classmethod
    def from_ext(cls, ext: Ext) -> Self:
        where = cls.__name__
        return cls(_text(ext, "statsName", where), _text(ext, "statsKey", where))

    def to_ext(self) -> Ext:
        return {"statsName": self.stats_name, "statsKey": self.stats_key}


@dataclass(slots=True)
class QueryMessageRequestHeader:
    """12 QUERY_MESSAGE: by key, or by UNIQ_KEY when `_UNIQUE_KEY_QUERY` is true."""

    topic: str
    key: str
    message_count_max: int  # maxNum
    begin_timestamp_ms: int  # beginTimestamp
    end_timestamp_ms: int  # endTimestamp
    unique_key_query: bool = False  # _UNIQUE_KEY_QUERY

    @classmethod
    def from_ext(cls, ext: Ext) -> Self:
        where = cls.__name__
        return cls(
            _text(ext, "topic", where),
            _text(ext, "key", where),
            _int32(ext, "maxNum", where),
            _int64(ext, "beginTimestamp", where),
            _int64(ext, "endTimestamp", where),
            _bool(ext, "_UNIQUE_KEY_QUERY"),
        )

    def to_ext(self) -> Ext:
        ext = {
            "topic": self.topic,
            "key": self.key,
            "maxNum": str(self.message_count_max),
            "beginTimestamp": str(self.begin_timestamp_ms),
            "endTimestamp": str(self.end_timestamp_ms),
        }
        if self.unique_key_query:
            ext["_UNIQUE_KEY_QUERY"] = "true"
        return ext


@dataclass(slots=True)
class QueryMessageResponseHeader:
    """Answer to 12."""

    index_last_update_timestamp_ms: int  # indexLastUpdateTimestamp
    index_last_update_log_offset_bytes: int  # indexLastUpdatePhyoffset

    @classmethod
    def from_ext(cls, ext: Ext) -> Self:
        where = cls.__name__
        return cls(
            _int64(ext, "indexLastUpdateTimestamp", where),
            _int64(ext, "indexLastUpdatePhyoffset", where),
        )

    def to_ext(self) -> Ext:
        return {
            "indexLastUpdateTimestamp": str(self.index_last_update_timestamp_ms),
            "indexLastUpdatePhyoffset": str(self.index_last_update_log_offset_bytes),
        }


@dataclass(slots=True)
class UnregisterClientRequestHeader:
    """35 UNREGISTER_CLIENT. C++ sends "" for the group it does not use; that reads as None."""

    client_id: str  # clientID
    producer_group: str | None = None  # producerGroup
    consumer_group: str | None = None  # consumerGroup

    @classmethod
    def from_ext(cls, ext: Ext) -> Self:
        return cls(
            _text(ext, "clientID", cls.__name__),
            _text_or_none(ext, "producerGroup"),
            _text_or_none(ext, "consumerGroup"),
        )

    def to_ext(self) -> Ext:
        ext = {"clientID": self.client_id}
        if self.producer_group is not None:
            ext["producerGroup"] = self.producer_group
        if self.consumer_group is not None:
            ext["consumerGroup"] = self.consumer_group
        return ext


@dataclass(slots=True)
class ConsumerSendMsgBackRequestHeader:
    """36 CONSUMER_SEND_MSG_BACK: a message the consumer failed to process."""

    group: str
    log_offset_bytes: int  # offset: the failed message's commit log offset
    delay_level: int  # delayLevel: 0 lets the broker decide, negative goes to the DLQ
    origin_msg_id: str | None = None  # originMsgId: Java only
    origin_topic: str | None = None  # originTopic: Java only
    unit_mode: bool = False  # unitMode
    max_reconsume_times: int | None = None  # maxReconsumeTimes: Java only

    @classmethod
    def from_ext(cls, ext: Ext) -> Self:
        where = cls.__name__
        return cls(
            _text(ext, "group", where),
            _int64(ext, "offset", where),
            _int32(ext, "delayLevel", where),
            _text_or_none(ext, "originMsgId"),
            _text_or_none(ext, "originTopic"),
            _bool(ext, "unitMode"),
            _int32_or_none(ext, "maxReconsumeTimes", where),
        )

    def to_ext(self) -> Ext:
        ext = {
            "group": self.group,
            "offset": str(self.log_offset_bytes),
            "delayLevel": str(self.delay_level),
            "unitMode": _bool_text(self.unit_mode),
        }
        if self.origin_msg_id is not None:
            ext["originMsgId"] = self.origin_msg_id
        if self.origin_topic is not None:
            ext["originTopic"] = self.origin_topic
        if self.max_reconsume_times is not None:
            ext["maxReconsumeTimes"] = str(self.max_reconsume_times)
        return ext


@dataclass(slots=True)
class ConsumerGroupRequestHeader:
    """`consumerGroup` alone: 38 GET_CONSUMER_LIST_BY_GROUP and 40 NOTIFY_CONSUMER_IDS_CHANGED."""

    consumer_group: str  # consumerGroup

    @classmethod
    def from_ext(cls, ext: Ext) -> Self:
        return cls(_text(ext, "consumerGroup", cls.__name__))

    def to_ext(self) -> Ext:
        return {"consumerGroup": self.consumer_group}


GetConsumerListByGroupRequestHeader: TypeAlias = ConsumerGroupRequestHeader
NotifyConsumerIdsChangedRequestHeader: TypeAlias = ConsumerGroupRequestHeader


# ---------------------------------------------------------------------------------------------
# Admin: 17 UPDATE_AND_CREATE_TOPIC


TOPIC_FILTER_TYPES: Final = ("SINGLE_TAG", "MULTI_TAG")


def _topic_filter_type(ext: Ext, where: str) -> str:
    """topicFilterType, which Java turns into its TopicFilterType enum (valueOf): anything else
    fails the request there, and here."""
    value = _text(ext, "topicFilterType", where)
    if value not in TOPIC_FILTER_TYPES:
        raise RemoteProtocolError(
            f"{where}.topicFilterType: {short_repr(value)} is not one of {TOPIC_FILTER_TYPES}"
        )
    return value


@dataclass(slots=True)
class UpdateAndCreateTopicRequestHeader:
    """17 UPDATE_AND_CREATE_TOPIC (Java's CreateTopicRequestHeader)."""

    topic: str
    default_topic: str  # defaultTopic
    read_queue_nums: int  # readQueueNums
    write_queue_nums: int  # writeQueueNums
    perm: int  # PERM_* bits of codes.py
    topic_filter_type: str = "SINGLE_TAG"  # topicFilterType
    topic_sys_flag: int = 0  # topicSysFlag
    order: bool = False

    @classmethod
    def from_ext(cls, ext: Ext) -> Self:
        where = cls.__name__
        return cls(
            _text(ext, "topic", where),
            _text(ext, "defaultTopic", where),
            _int32(ext, "readQueueNums", where),
            _int32(ext, "writeQueueNums", where),
            _int32(ext, "perm", where),
            _topic_filter_type(ext, where),
            _int32_or_none(ext, "topicSysFlag", where) or 0,
            _bool(ext, "order"),
        )

    def to_ext(self) -> Ext:
        return {
            "topic": self.topic,
            "defaultTopic": self.default_topic,
            "readQueueNums": str(self.read_queue_nums),
            "writeQueueNums": str(self.write_queue_nums),
            "perm": str(self.perm),
            "topicFilterType": self.topic_filter_type,
            "topicSysFlag": str(self.topic_sys_flag),
            "order": _bool_text(self.order),
        }


# The request header class of each code that has one, for routing and tests.
REQUEST_HEADER_BY_CODE: Final[dict[int, type[ExtHeader]]] = {
    RequestCode.SEND_MESSAGE: SendMessageRequestHeader,
    RequestCode.SEND_MESSAGE_V2: SendMessageRequestHeader,
    RequestCode.SEND_BATCH_MESSAGE: SendMessageRequestHeader,
    RequestCode.PULL_MESSAGE: PullMessageRequestHeader,
    RequestCode.QUERY_MESSAGE: QueryMessageRequestHeader,
    RequestCode.QUERY_CONSUMER_OFFSET: QueryConsumerOffsetRequestHeader,
    RequestCode.UPDATE_CONSUMER_OFFSET: UpdateConsumerOffsetRequestHeader,
    RequestCode.UPDATE_AND_CREATE_TOPIC: UpdateAndCreateTopicRequestHeader,
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: SearchOffsetRequestHeader,
    RequestCode.GET_MAX_OFFSET: QueueRequestHeader,
    RequestCode.GET_MIN_OFFSET: QueueRequestHeader,
    RequestCode.GET_EARLIEST_MSG_STORETIME: QueueRequestHeader,
    RequestCode.VIEW_MESSAGE_BY_ID: ViewMessageRequestHeader,
    RequestCode.UNREGISTER_CLIENT: UnregisterClientRequestHeader,
    RequestCode.CONSUMER_SEND_MSG_BACK: ConsumerSendMsgBackRequestHeader,
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: ConsumerGroupRequestHeader,
    RequestCode.NOTIFY_CONSUMER_IDS_CHANGED: ConsumerGroupRequestHeader,
    RequestCode.REGISTER_BROKER: RegisterBrokerRequestHeader,
    RequestCode.UNREGISTER_BROKER: UnregisterBrokerRequestHeader,
    RequestCode.GET_ROUTEINFO_BY_TOPIC: GetRouteInfoRequestHeader,
    RequestCode.DELETE_TOPIC_IN_BROKER: DeleteTopicRequestHeader,
    RequestCode.DELETE_TOPIC_IN_NAMESRV: DeleteTopicRequestHeader,
}


# ---------------------------------------------------------------------------------------------
# JSON bodies. Readers of decoded JSON values; `where` names the body and path for the message.


def _bad(where: str, expected: str, value: object) -> RemoteProtocolError:
    return RemoteProtocolError(f"{where}: expected {expected}, got {short_repr(value)}")


def _json_object(value: object, where: str) -> dict[str, Any]:
    if type(value) is not dict:
        raise _bad(where, "a JSON object", value)
    return value


def _json_list(value: object, where: str) -> list[Any]:
    if type(value) is not list:
        raise _bad(where, "a JSON array", value)
    return value


def _json_list_or_empty(value: object, where: str) -> list[Any]:
    """An array that may be absent or null: C++ leaves out empty producer and consumer sets."""
    return [] if value is None else _json_list(value, where)


def _json_text(value: object, where: str) -> str:
    if type(value) is not str:
        raise _bad(where, "a JSON string", value)
    return value


def _json_int(value: object, where: str, low: int = INT64_MIN, high: int = INT64_MAX) -> int:
    """A JSON integer, or a string holding one (C++ writes 64-bit values as strings)."""
    if type(value) is int:
        number = value
    elif type(value) is str:
        try:
            number = int(value)
        except ValueError:
            raise _bad(where, "an integer", value) from None
    else:
        raise _bad(where, "an integer", value)
    if not low <= number <= high:
        raise _bad(where, f"an integer in [{low}, {high}]", number)
    return number


def _json_int32(value: object, where: str) -> int:
    return _json_int(value, where, INT32_MIN, INT32_MAX)


def _json_bool(value: object, where: str) -> bool:
    """A JSON boolean, or C++'s 0/1 spelt as a number or a string."""
    if type(value) is bool:
        return value
    if type(value) is str:
        return parse_bool(value)
    if type(value) is int:
        return value != 0
    raise _bad(where, "a boolean", value)


_EnumT = TypeVar("_EnumT", bound=IntEnum)


def _json_enum(value: object, enum: type[_EnumT], where: str) -> _EnumT:
    """An enum written as its number (C++) or its name (Java)."""
    try:
        if type(value) is int:
            return enum(value)
        if type(value) is str:
            return enum[value]
    except (ValueError, KeyError):
        pass
    raise _bad(where, f"a {enum.__name__} number or name", value)


def _body_object(body: bytes, where: str) -> dict[str, Any]:
    if not body:
        raise RemoteProtocolError(f"{where}: the body is empty")
    return _json_object(loads_json(body), where)


@dataclass(slots=True, frozen=True)
class SubscriptionData:
    """One topic a consumer group subscribes to, from a heartbeat."""

    topic: str
    sub_string: str  # subString: "*" or "TagA || TagB"
    tags_set: tuple[str, ...] = ()  # tagsSet; codeSet is never trusted (C++ sends zeros)
    sub_version: int = 0  # subVersion: a string from C++, a number from Java
    expression_type: str = "TAG"  # expressionType: absent from C++
    class_filter_mode: bool = False  # classFilterMode

    @classmethod
    def from_json_value(cls, value: object, where: str) -> Self:
        fields = _json_object(value, where)
        tags = _json_list_or_empty(fields.get("tagsSet"), f"{where}.tagsSet")
        expression_type = fields.get("expressionType")
        return cls(
            _json_text(fields.get("topic"), f"{where}.topic"),
            _json_text(fields.get("subString"), f"{where}.subString"),
            tuple(_json_text(tag, f"{where}.tagsSet[]") for tag in tags),
            _json_int(fields.get("subVersion", 0), f"{where}.subVersion"),
            "TAG"
            if expression_type is None
            else _json_text(expression_type, f"{where}.expressionType"),
            _json_bool(fields.get("classFilterMode", False), f"{where}.classFilterMode"),
        )

    def to_json_value(self) -> dict[str, Any]:
        return {
            "classFilterMode": self.class_filter_mode,
            "expressionType": self.expression_type,
            "subString": self.sub_string,
            "subVersion": self.sub_version,
            "tagsSet": list(self.tags_set),
            "topic": self.topic,
        }


@dataclass(slots=True, frozen=True)
class ProducerData:
    group_name: str  # groupName

    @classmethod
    def from_json_value(cls, value: object, where: str) -> Self:
        fields = _json_object(value, where)
        return cls(_json_text(fields.get("groupName"), f"{where}.groupName"))

    def to_json_value(self) -> dict[str, Any]:
        return {"groupName": self.group_name}


@dataclass(slots=True, frozen=True)
class ConsumerData:
    group_name: str  # groupName
    consume_type: ConsumeType  # consumeType
    message_model: MessageModel  # messageModel
    consume_from_where: ConsumeFromWhere  # consumeFromWhere
    subscription_data_set: tuple[SubscriptionData, ...] = ()  # subscriptionDataSet
    unit_mode: bool = False  # unitMode: absent from C++

    @classmethod
    def from_json_value(cls, value: object, where: str) -> Self:
        fields = _json_object(value, where)
        subscriptions = _json_list_or_empty(
            fields.get("subscriptionDataSet"), f"{where}.subscriptionDataSet"
        )
        return cls(
            _json_text(fields.get("groupName"), f"{where}.groupName"),
            _json_enum(fields.get("consumeType"), ConsumeType, f"{where}.consumeType"),
            _json_enum(fields.get("messageModel"), MessageModel, f"{where}.messageModel"),
            _json_enum(
                fields.get("consumeFromWhere"), ConsumeFromWhere, f"{where}.consumeFromWhere"
            ),
            tuple(
                SubscriptionData.from_json_value(item, f"{where}.subscriptionDataSet[]")
                for item in subscriptions
            ),
            _json_bool(fields.get("unitMode", False), f"{where}.unitMode"),
        )

    def to_json_value(self) -> dict[str, Any]:
        """Java's spelling: enum names."""
        return {
            "consumeFromWhere": self.consume_from_where.name,
            "consumeType": self.consume_type.name,
            "groupName": self.group_name,
            "messageModel": self.message_model.name,
            "subscriptionDataSet": [item.to_json_value() for item in self.subscription_data_set],
            "unitMode": self.unit_mode,
        }


@dataclass(slots=True, frozen=True)
class HeartbeatData:
    """34 HEART_BEAT body. Both spellings are read: C++ (enum numbers, empty sets left out) and
    Java (enum names, every key present)."""

    client_id: str  # clientID
    producer_data_set: tuple[ProducerData, ...] = ()  # producerDataSet
    consumer_data_set: tuple[ConsumerData, ...] = ()  # consumerDataSet

    @classmethod
    def from_json(cls, body: bytes) -> Self:
        where = cls.__name__
        fields = _body_object(body, where)
        producers = _json_list_or_empty(fields.get("producerDataSet"), f"{where}.producerDataSet")
        consumers = _json_list_or_empty(fields.get("consumerDataSet"), f"{where}.consumerDataSet")
        return cls(
            _json_text(fields.get("clientID"), f"{where}.clientID"),
            tuple(
                ProducerData.from_json_value(item, f"{where}.producerDataSet[]")
                for item in producers
            ),
            tuple(
                ConsumerData.from_json_value(item, f"{where}.consumerDataSet[]")
                for item in consumers
            ),
        )

    def to_json(self) -> bytes:
        return dumps_json(
            {
                "clientID": self.client_id,
                "consumerDataSet": [item.to_json_value() for item in self.consumer_data_set],
                "producerDataSet": [item.to_json_value() for item in self.producer_data_set],
            }
        )


@dataclass(slots=True, frozen=True)
class MessageQueue:
    """One queue of one topic on one broker (Java's MessageQueue)."""

    topic: str
    broker_name: str  # brokerName
    queue_id: int  # queueId

    @classmethod
    def from_json_value(cls, value: object, where: str) -> Self:
        fields = _json_object(value, where)
        return cls(
            _json_text(fields.get("topic"), f"{where}.topic"),
            _json_text(fields.get("brokerName"), f"{where}.brokerName"),
            _json_int32(fields.get("queueId"), f"{where}.queueId"),
        )

    def to_json_value(self) -> dict[str, Any]:
        return {"brokerName": self.broker_name, "queueId": self.queue_id, "topic": self.topic}


@dataclass(slots=True, frozen=True)
class LockBatchRequestBody:
    """41 LOCK_BATCH_MQ and 42 UNLOCK_BATCH_MQ body."""

    consumer_group: str  # consumerGroup
    client_id: str  # clientId
    mq_set: tuple[MessageQueue, ...] = ()  # mqSet
    only_this_broker: bool = False  # onlyThisBroker: Java 4.9.x

    @classmethod
    def from_json(cls, body: bytes) -> Self:
        where = cls.__name__
        fields = _body_object(body, where)
        queues = _json_list_or_empty(fields.get("mqSet"), f"{where}.mqSet")
        return cls(
            _json_text(fields.get("consumerGroup"), f"{where}.consumerGroup"),
            _json_text(fields.get("clientId"), f"{where}.clientId"),
            tuple(MessageQueue.from_json_value(item, f"{where}.mqSet[]") for item in queues),
            _json_bool(fields.get("onlyThisBroker", False), f"{where}.onlyThisBroker"),
        )

    def to_json(self) -> bytes:
        return dumps_json(
            {
                "clientId": self.client_id,
                "consumerGroup": self.consumer_group,
                "mqSet": [queue.to_json_value() for queue in self.mq_set],
                "onlyThisBroker": self.only_this_broker,
            }
        )


UnlockBatchRequestBody: TypeAlias = LockBatchRequestBody


@dataclass(slots=True, frozen=True)
class LockBatchResponseBody:
    """41 LOCK_BATCH_MQ answer: the queues this client now holds."""

    lock_ok_mq_set: tuple[MessageQueue, ...] = ()  # lockOKMQSet

    @classmethod
    def from_json(cls, body: bytes) -> Self:
        where = cls.__name__
        fields = _body_object(body, where)
        queues = _json_list_or_empty(fields.get("lockOKMQSet"), f"{where}.lockOKMQSet")
        return cls(
            tuple(MessageQueue.from_json_value(item, f"{where}.lockOKMQSet[]") for item in queues)
        )

    def to_json(self) -> bytes:
        return dumps_json({"lockOKMQSet": [queue.to_json_value() for queue in self.lock_ok_mq_set]})


@dataclass(slots=True, frozen=True)
class ConsumerListBody:
    """38 GET_CONSUMER_LIST_BY_GROUP answer."""

    consumer_id_list: tuple[str, ...] = ()  # consumerIdList

    @classmethod
    def from_json(cls, body: bytes) -> Self:
        where = cls.__name__
        fields = _body_object(body, where)
        ids = _json_list_or_empty(fields.get("consumerIdList"), f"{where}.consumerIdList")
        return cls(tuple(_json_text(item, f"{where}.consumerIdList[]") for item in ids))

    def to_json(self) -> bytes:
        return dumps_json({"consumerIdList": list(self.consumer_id_list)})


@dataclass(slots=True, frozen=True)
class QueueData:
    """One broker's queues of a topic, in route data."""

    broker_name: str  # brokerName
    read_queue_nums: int  # readQueueNums
    write_queue_nums: int  # writeQueueNums
    perm: int
    topic_sys_flag: int = 0  # topicSynFlag (4.5.2 spelling, written) or topicSysFlag (4.9.x)

    @classmethod
    def from_json_value(cls, value: object, where: str) -> Self:
        fields = _json_object(value, where)
        sys_flag = fields.get("topicSysFlag", fields.get("topicSynFlag", 0))
        return cls(
            _json_text(fields.get("brokerName"), f"{where}.brokerName"),
            _json_int32(fields.get("readQueueNums"), f"{where}.readQueueNums"),
            _json_int32(fields.get("writeQueueNums"), f"{where}.writeQueueNums"),
            _json_int32(fields.get("perm"), f"{where}.perm"),
            _json_int32(sys_flag, f"{where}.topicSysFlag"),
        )

    def to_json_value(self) -> dict[str, Any]:
        """Numbers as JSON numbers: the C++ client calls asInt() and drops a route with strings."""
        return {
            "brokerName": self.broker_name,
            "perm": self.perm,
            "readQueueNums": self.read_queue_nums,
            "topicSynFlag": self.topic_sys_flag,
            "writeQueueNums": self.write_queue_nums,
        }


@dataclass(slots=True, frozen=True)
class BrokerData:
    """One broker name's addresses by broker id (0 is the master)."""

    cluster: str
    broker_name: str  # brokerName
    broker_addrs: dict[int, str] = field(default_factory=dict)  # brokerAddrs

    @classmethod
    def from_json_value(cls, value: object, where: str) -> Self:
        fields = _json_object(value, where)
        addresses = _json_object(fields.get("brokerAddrs", {}), f"{where}.brokerAddrs")
        return cls(
            _json_text(fields.get("cluster"), f"{where}.cluster"),
            _json_text(fields.get("brokerName"), f"{where}.brokerName"),
            {
                _json_int(broker_id, f"{where}.brokerAddrs key"): _json_text(
                    address, f"{where}.brokerAddrs[{broker_id!r}]"
                )
                for broker_id, address in addresses.items()
            },
        )

    def to_json_value(self) -> dict[str, Any]:
        """brokerAddrs keys are quoted decimal strings: standard JSON, which C++ also reads."""
        return {
            "brokerAddrs": {
                str(broker_id): self.broker_addrs[broker_id]
                for broker_id in sorted(self.broker_addrs)
            },
            "brokerName": self.broker_name,
            "cluster": self.cluster,
        }


@dataclass(slots=True, frozen=True)
class TopicRouteData:
    """105 GET_ROUTEINFO_BY_TOPIC answer (docs/protocol.md section 4.1)."""

    queue_datas: tuple[QueueData, ...] = ()  # queueDatas
    broker_datas: tuple[BrokerData, ...] = ()  # brokerDatas
    # orderTopicConf, "brokerA:8;brokerB:8". When set, the C++ client builds its publish queues from
    # it alone, so it is written only when not empty.
    order_topic_conf: str | None = None

    @classmethod
    def from_json(cls, body: bytes) -> Self:
        where = cls.__name__
        fields = _body_object(body, where)
        queues = _json_list_or_empty(fields.get("queueDatas"), f"{where}.queueDatas")
        brokers = _json_list_or_empty(fields.get("brokerDatas"), f"{where}.brokerDatas")
        order_topic_conf = fields.get("orderTopicConf")
        return cls(
            tuple(QueueData.from_json_value(item, f"{where}.queueDatas[]") for item in queues),
            tuple(BrokerData.from_json_value(item, f"{where}.brokerDatas[]") for item in brokers),
            None
            if not order_topic_conf
            else _json_text(order_topic_conf, f"{where}.orderTopicConf"),
        )

    def to_json(self) -> bytes:
        """Keys sorted as in the route the C++ wheel accepted; filterServerTable always {}."""
        route: dict[str, Any] = {
            "brokerDatas": [broker.to_json_value() for broker in self.broker_datas],
            "filterServerTable": {},
        }
        if self.order_topic_conf:
            route["orderTopicConf"] = self.order_topic_conf
        route["queueDatas"] = [queue.to_json_value() for queue in self.queue_datas]
        return dumps_json(route)


@dataclass(slots=True, frozen=True)
class TopicConfig:
    """One topic's configuration, as a broker registers it."""

    topic_name: str  # topicName
    read_queue_nums: int  # readQueueNums
    write_queue_nums: int  # writeQueueNums
    perm: int
    topic_filter_type: str = "SINGLE_TAG"  # topicFilterType: SINGLE_TAG or MULTI_TAG
    topic_sys_flag: int = 0  # topicSysFlag
    order: bool = False

    @classmethod
    def from_json_value(cls, value: object, where: str) -> Self:
        fields = _json_object(value, where)
        return cls(
            _json_text(fields.get("topicName"), f"{where}.topicName"),
            _json_int32(fields.get("readQueueNums"), f"{where}.readQueueNums"),
            _json_int32(fields.get("writeQueueNums"), f"{where}.writeQueueNums"),
            _json_int32(fields.get("perm"), f"{where}.perm"),
            _json_text(fields.get("topicFilterType", "SINGLE_TAG"), f"{where}.topicFilterType"),
            _json_int32(fields.get("topicSysFlag", 0), f"{where}.topicSysFlag"),
            _json_bool(fields.get("order", False), f"{where}.order"),
        )

    def to_json_value(self) -> dict[str, Any]:
        return {
            "order": self.order,
            "perm": self.perm,
            "readQueueNums": self.read_queue_nums,
            "topicFilterType": self.topic_filter_type,
            "topicName": self.topic_name,
            "topicSysFlag": self.topic_sys_flag,
            "writeQueueNums": self.write_queue_nums,
        }


@dataclass(slots=True, frozen=True)
class DataVersion:
    """A broker's topic table version: bumped on every change, compared by the namesrv."""

    counter: int
    timestamp_ms: int  # timestamp

    @classmethod
    def from_json_value(cls, value: object, where: str) -> Self:
        fields = _json_object(value, where)
        return cls(
            _json_int(fields.get("counter"), f"{where}.counter"),
            _json_int(fields.get("timestamp"), f"{where}.timestamp"),
        )

    def to_json_value(self) -> dict[str, Any]:
        return {"counter": self.counter, "timestamp": self.timestamp_ms}


@dataclass(slots=True, frozen=True)
class RegisterBrokerBody:
    """103 REGISTER_BROKER body, uncompressed (`compressed` false)."""

    data_version: DataVersion  # topicConfigSerializeWrapper.dataVersion
    topic_config_table: dict[str, TopicConfig] = field(default_factory=dict)
    filter_server_list: tuple[str, ...] = ()  # filterServerList

    @classmethod
    def from_json(cls, body: bytes) -> Self:
        where = cls.__name__
        fields = _body_object(body, where)
        wrapper = _json_object(
            fields.get("topicConfigSerializeWrapper"), f"{where}.topicConfigSerializeWrapper"
        )
        table = _json_object(wrapper.get("topicConfigTable", {}), f"{where}.topicConfigTable")
        servers = _json_list_or_empty(fields.get("filterServerList"), f"{where}.filterServerList")
        return cls(
            DataVersion.from_json_value(wrapper.get("dataVersion"), f"{where}.dataVersion"),
            {
                topic: TopicConfig.from_json_value(config, f"{where}.topicConfigTable[{topic!r}]")
                for topic, config in table.items()
            },
            tuple(_json_text(item, f"{where}.filterServerList[]") for item in servers),
        )

    def to_json(self) -> bytes:
        return dumps_json(
            {
                "filterServerList": list(self.filter_server_list),
                "topicConfigSerializeWrapper": {
                    "dataVersion": self.data_version.to_json_value(),
                    "topicConfigTable": {
                        topic: config.to_json_value()
                        for topic, config in self.topic_config_table.items()
                    },
                },
            }
        )


@dataclass(slots=True, frozen=True)
class ClusterInfo:
    """106 GET_BROKER_CLUSTER_INFO answer."""

    broker_addr_table: dict[str, BrokerData] = field(default_factory=dict)  # brokerAddrTable
    cluster_addr_table: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def from_json(cls, body: bytes) -> Self:
        where = cls.__name__
        fields = _body_object(body, where)
        brokers = _json_object(fields.get("brokerAddrTable", {}), f"{where}.brokerAddrTable")
        clusters = _json_object(fields.get("clusterAddrTable", {}), f"{where}.clusterAddrTable")
        return cls(
            {
                name: BrokerData.from_json_value(broker, f"{where}.brokerAddrTable[{name!r}]")
                for name, broker in brokers.items()
            },
            {
                cluster: tuple(
                    _json_text(name, f"{where}.clusterAddrTable[{cluster!r}][]")
                    for name in _json_list(names, f"{where}.clusterAddrTable[{cluster!r}]")
                )
                for cluster, names in clusters.items()
            },
        )

    def to_json(self) -> bytes:
        return dumps_json(
            {
                "brokerAddrTable": {
                    name: broker.to_json_value() for name, broker in self.broker_addr_table.items()
                },
                "clusterAddrTable": {
                    cluster: list(names) for cluster, names in self.cluster_addr_table.items()
                },
            }
        )


@dataclass(slots=True, frozen=True)
class TopicList:
    """206 GET_ALL_TOPIC_LIST_FROM_NAMESERVER answer."""

    topic_list: tuple[str, ...] = ()  # topicList
    broker_addr: str | None = None  # brokerAddr: optional in Java

    @classmethod
    def from_json(cls, body: bytes) -> Self:
        where = cls.__name__
        fields = _body_object(body, where)
        topics = _json_list_or_empty(fields.get("topicList"), f"{where}.topicList")
        broker_addr = fields.get("brokerAddr")
        return cls(
            tuple(_json_text(topic, f"{where}.topicList[]") for topic in topics),
            None if broker_addr is None else _json_text(broker_addr, f"{where}.brokerAddr"),
        )

    def to_json(self) -> bytes:
        value: dict[str, Any] = {"topicList": list(self.topic_list)}
        if self.broker_addr is not None:
            value["brokerAddr"] = self.broker_addr
        return dumps_json(value)


@dataclass(slots=True, frozen=True)
class KvTable:
    """One name server KV namespace, `{"table":{...}}`: the 103 REGISTER_BROKER response body."""

    table: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, body: bytes) -> Self:
        where = cls.__name__
        fields = _body_object(body, where)
        table = _json_object(fields.get("table", {}), f"{where}.table")
        return cls(
            {
                _json_text(key, f"{where}.table key"): _json_text(value, f"{where}.table[{key!r}]")
                for key, value in table.items()
            }
        )

    def to_json(self) -> bytes:
        return dumps_json({"table": dict(self.table)})


# ---------------------------------------------------------------------------------------------
# Admin and slave synchronisation: subscription groups (200, 201, 207), all consumer offsets (43),
# all delay offsets (45). Java's bodies are fastjson dumps of its manager
# objects (docs/protocol.md section 4.5); fastjson writes integer map keys bare (`{0:12}`), which
# `_body_object_lenient` accepts, and mqbox writes them quoted, which fastjson reads back.

_BARE_INTEGER_KEY: Final = re.compile(rb"([{,]\s*)(-?\d+)(\s*:)")


def _body_object_lenient(body: bytes, where: str) -> dict[str, Any]:
    """_body_object, also reading fastjson's bare integer keys. Topic and group names hold no
    brace, comma or colon, so a string never matches the pattern."""
    try:
        return _body_object(body, where)
    except RemoteProtocolError:
        quoted = _BARE_INTEGER_KEY.sub(rb'\1"\2"\3', body)
        if quoted == body:
            raise
        return _body_object(quoted, where)


@dataclass(slots=True, frozen=True)
class SubscriptionGroupConfig:
    """Java's SubscriptionGroupConfig (common/subscription), the 200 body and the values of the
    201 body; field types as Java's: booleans, int retryQueueNums and retryMaxTimes, long
    brokerId and whichBrokerWhenConsumeSlowly. Absent fields take Java's defaults."""

    group_name: str  # groupName
    consume_enable: bool = True  # consumeEnable
    consume_from_min_enable: bool = True  # consumeFromMinEnable
    consume_broadcast_enable: bool = True  # consumeBroadcastEnable
    retry_queue_nums: int = 1  # retryQueueNums
    retry_max_times: int = 16  # retryMaxTimes
    broker_id: int = 0  # brokerId
    which_broker_when_consume_slowly: int = 1  # whichBrokerWhenConsumeSlowly
    notify_consumer_ids_changed_enable: bool = True  # notifyConsumerIdsChangedEnable

    @classmethod
    def from_json_value(cls, value: object, where: str) -> Self:
        fields_ = _json_object(value, where)
        default = cls("")

        def flag(key: str, fallback: bool) -> bool:
            return _json_bool(fields_.get(key, fallback), f"{where}.{key}")

        return cls(
            _json_text(fields_.get("groupName"), f"{where}.groupName"),
            flag("consumeEnable", default.consume_enable),
            flag("consumeFromMinEnable", default.consume_from_min_enable),
            flag("consumeBroadcastEnable", default.consume_broadcast_enable),
            _json_int32(fields_.get("retryQueueNums", 1), f"{where}.retryQueueNums"),
            _json_int32(fields_.get("retryMaxTimes", 16), f"{where}.retryMaxTimes"),
            _json_int(fields_.get("brokerId", 0), f"{where}.brokerId"),
            _json_int(
                fields_.get("whichBrokerWhenConsumeSlowly", 1),
                f"{where}.whichBrokerWhenConsumeSlowly",
            ),
            flag("notifyConsumerIdsChangedEnable", default.notify_consumer_ids_changed_enable),
        )

    @classmethod
    def from_json(cls, body: bytes) -> Self:
        return cls.from_json_value(_body_object(body, cls.__name__), cls.__name__)

    def to_json_value(self) -> dict[str, Any]:
        return {
            "brokerId": self.broker_id,
            "consumeBroadcastEnable": self.consume_broadcast_enable,
            "consumeEnable": self.consume_enable,
            "consumeFromMinEnable": self.consume_from_min_enable,
            "groupName": self.group_name,
            "notifyConsumerIdsChangedEnable": self.notify_consumer_ids_changed_enable,
            "retryMaxTimes": self.retry_max_times,
            "retryQueueNums": self.retry_queue_nums,
            "whichBrokerWhenConsumeSlowly": self.which_broker_when_consume_slowly,
        }

    def to_json(self) -> bytes:
        return dumps_json(self.to_json_value())


@dataclass(slots=True, frozen=True)
class SubscriptionGroupWrapper:
    """201 GET_ALL_SUBSCRIPTIONGROUP_CONFIG body (Java's SubscriptionGroupManager.encode):
    `{"subscriptionGroupTable":{group:config},"dataVersion":{..}}`."""

    subscription_group_table: dict[str, SubscriptionGroupConfig]  # subscriptionGroupTable
    data_version: DataVersion  # dataVersion

    @classmethod
    def from_json(cls, body: bytes) -> Self:
        where = cls.__name__
        fields_ = _body_object(body, where)
        table = _json_object(fields_.get("subscriptionGroupTable", {}), f"{where}.table")
        return cls(
            {
                group: SubscriptionGroupConfig.from_json_value(config, f"{where}[{group!r}]")
                for group, config in table.items()
            },
            DataVersion.from_json_value(fields_.get("dataVersion"), f"{where}.dataVersion"),
        )

    def to_json(self) -> bytes:
        return dumps_json(
            {
                "dataVersion": self.data_version.to_json_value(),
                "subscriptionGroupTable": {
                    group: config.to_json_value()
                    for group, config in self.subscription_group_table.items()
                },
            }
        )


def _queue_offset_table(value: object, where: str) -> dict[int, int]:
    return {
        _json_int32(queue_id, f"{where} key"): _json_int(offset, f"{where}[{queue_id}]")
        for queue_id, offset in _json_object(value, where).items()
    }


@dataclass(slots=True, frozen=True)
class ConsumerOffsetSerializeWrapper:
    """43 GET_ALL_CONSUMER_OFFSET body (Java's ConsumerOffsetManager.encode):
    `{"offsetTable":{"<topic>@<group>":{"<queueId>":<offset>}}}`, int queue ids, long offsets."""

    offset_table: dict[str, dict[int, int]]  # offsetTable: "topic@group" -> queueId -> offset

    @classmethod
    def from_json(cls, body: bytes) -> Self:
        where = cls.__name__
        fields_ = _body_object_lenient(body, where)
        table = _json_object(fields_.get("offsetTable", {}), f"{where}.offsetTable")
        return cls(
            {
                key: _queue_offset_table(offsets, f"{where}.offsetTable[{key!r}]")
                for key, offsets in table.items()
            }
        )

    def to_json(self) -> bytes:
        return dumps_json(
            {
                "offsetTable": {
                    key: {str(queue_id): offset for queue_id, offset in sorted(offsets.items())}
                    for key, offsets in self.offset_table.items()
                }
            }
        )


@dataclass(slots=True, frozen=True)
class DelayOffsetSerializeWrapper:
    """45 GET_ALL_DELAY_OFFSET body (Java's ScheduleMessageService.encode):
    `{"offsetTable":{"<delayLevel>":<offset>}}`, int levels, long offsets."""

    offset_table: dict[int, int]  # offsetTable: delay level -> queue offset

    @classmethod
    def from_json(cls, body: bytes) -> Self:
        where = cls.__name__
        fields_ = _body_object_lenient(body, where)
        return cls(_queue_offset_table(fields_.get("offsetTable", {}), f"{where}.offsetTable"))

    def to_json(self) -> bytes:
        return dumps_json(
            {
                "offsetTable": {
                    str(level): offset for level, offset in sorted(self.offset_table.items())
                }
            }
        )


@dataclass(slots=True)
class DeleteSubscriptionGroupRequestHeader:
    """207 DELETE_SUBSCRIPTIONGROUP: `groupName`, and `removeOffset` (4.9.x; absent = false)."""

    group_name: str  # groupName
    remove_offset: bool = False  # removeOffset

    @classmethod
    def from_ext(cls, ext: Ext) -> Self:
        return cls(_text(ext, "groupName", cls.__name__), _bool(ext, "removeOffset"))

    def to_ext(self) -> Ext:
        return {"groupName": self.group_name, "removeOffset": _bool_text(self.remove_offset)}
