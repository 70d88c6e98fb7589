"""Numbers with names on the RocketMQ wire: request and response codes, languages, flag bits.

Owns: the enums and bit constants of docs/protocol.md sections 2 and 3, spelled as RocketMQ
spells them so a grep for a Java constant lands here. Never: behaviour. A code missing from an enum
is still a valid int on the wire; the codec passes codes through as ints, and only the processors
decide which ones they serve (an unknown request code is answered with REQUEST_CODE_NOT_SUPPORTED).
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final


class RequestCode(IntEnum):
    """Request codes of docs/protocol.md section 3.1 (Java's `RequestCode`)."""

    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    UPDATE_BROKER_CONFIG = 25
    GET_BROKER_CONFIG = 26
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    GET_ALL_CONSUMER_OFFSET = 43
    GET_ALL_DELAY_OFFSET = 45
    CHECK_CLIENT_CONFIG = 46
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    # Java misspells this one GET_ROUTEINTO_BY_TOPIC; the number is what matters on the wire.
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
    GET_TOPIC_STATS_INFO = 202
    GET_CONSUMER_CONNECTION_LIST = 203
    GET_PRODUCER_CONNECTION_LIST = 204
    WIPE_WRITE_PERM_OF_BROKER = 205
    DELETE_SUBSCRIPTIONGROUP = 207
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    GET_CONSUME_STATS = 208
    DELETE_TOPIC_IN_BROKER = 215
    DELETE_TOPIC_IN_NAMESRV = 216
    GET_KVLIST_BY_NAMESPACE = 219
    RESET_CONSUMER_CLIENT_OFFSET = 220
    GET_CONSUMER_STATUS_FROM_CLIENT = 221
    INVOKE_BROKER_TO_GET_CONSUMER_STATUS = 223
    GET_TOPICS_BY_CLUSTER = 224
    QUERY_TOPIC_CONSUME_BY_WHO = 300
    GET_SYSTEM_TOPIC_LIST_FROM_NS = 304
    GET_SYSTEM_TOPIC_LIST_FROM_BROKER = 305
    GET_CONSUMER_RUNNING_INFO = 307
    CONSUME_MESSAGE_DIRECTLY = 309
    SEND_MESSAGE_V2 = 310
    VIEW_BROKER_STATS_DATA = 315
    GET_BROKER_CONSUME_STATS = 317
    SEND_BATCH_MESSAGE = 320
    QUERY_DATA_VERSION = 322


class ResponseCode(IntEnum):
    """Response codes of docs/protocol.md section 3.2 (Java's `ResponseCode`)."""

    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TRANSACTION_FAILED = 4
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    FILTER_DATA_NOT_EXIST = 27
    FILTER_DATA_NOT_LATEST = 28
    TRANSACTION_SHOULD_COMMIT = 200
    TRANSACTION_SHOULD_ROLLBACK = 201
    TRANSACTION_STATE_UNKNOW = 202  # sic: Java's spelling
    TRANSACTION_STATE_GROUP_WRONG = 203
    NO_BUYER_ID = 204
    NOT_IN_CURRENT_UNIT = 205
    CONSUMER_NOT_ONLINE = 206
    CONSUME_MSG_TIMEOUT = 207
    NO_MESSAGE = 208
    UPDATE_AND_CREATE_ACL_CONFIG_FAILED = 209
    DELETE_ACL_CONFIG_FAILED = 210
    UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED = 211
    FLOW_CONTROL = 215


class LanguageCode(IntEnum):
    """The sender's language: a name in JSON headers, this byte in ROCKETMQ binary headers."""

    JAVA = 0
    CPP = 1
    DOTNET = 2
    PYTHON = 3
    DELPHI = 4
    ERLANG = 5
    RUBY = 6
    OTHER = 7
    HTTP = 8
    GO = 9
    PHP = 10
    OMS = 11
    RUST = 12


class SerializeType(IntEnum):
    """The high byte of the frame's header word (frame.py): how the header is encoded."""

    JSON = 0
    ROCKETMQ = 1


class ConsumeType(IntEnum):
    """HeartbeatData `consumeType`: C++ sends the number, Java the name."""

    CONSUME_ACTIVELY = 0  # pull consumer
    CONSUME_PASSIVELY = 1  # push consumer


class MessageModel(IntEnum):
    """HeartbeatData `messageModel`: C++ sends the number, Java the name."""

    BROADCASTING = 0
    CLUSTERING = 1


class ConsumeFromWhere(IntEnum):
    """HeartbeatData `consumeFromWhere`: C++ sends the number (Java's ordinal), Java the name."""

    CONSUME_FROM_LAST_OFFSET = 0
    CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST = 1  # deprecated in Java
    CONSUME_FROM_MIN_OFFSET = 2  # deprecated in Java
    CONSUME_FROM_MAX_OFFSET = 3  # deprecated in Java
    CONSUME_FROM_FIRST_OFFSET = 4
    CONSUME_FROM_TIMESTAMP = 5


# The header's `flag` field. Plain ints rather than an IntFlag: they are tested on every frame, and
# an enum member costs an attribute lookup that a module constant does not.
FLAG_RESPONSE: Final = 1 << 0
FLAG_ONEWAY: Final = 1 << 1

# PULL_MESSAGE `sysFlag` bits (Java's PullSysFlag).
PULL_FLAG_COMMIT_OFFSET: Final = 1 << 0
PULL_FLAG_SUSPEND: Final = 1 << 1
PULL_FLAG_SUBSCRIPTION: Final = 1 << 2
PULL_FLAG_CLASS_FILTER: Final = 1 << 3
PULL_FLAG_LITE_PULL: Final = 1 << 4  # 4.9.x

# Topic permission bits (Java's PermName), used by TopicConfig and route data.
PERM_PRIORITY: Final = 1 << 3
PERM_READ: Final = 1 << 2
PERM_WRITE: Final = 1 << 1
PERM_INHERIT: Final = 1 << 0

# The MQVersion ordinal mqbox writes in headers it creates: Java 4.5.2's (section 2.1), the broker
# version the C++ wheel was tested against. It is informational for every client we know of, but a
# Java broker honours `maxReconsumeTimes` only from requests of version 121 or above.
VERSION_MQBOX: Final = 317

# Name server KV config requests (Java's RequestCode.PUT_KV_CONFIG and friends). They are not in
# section 3.1's table, which RequestCode mirrors exactly (tests/unit/protocol/test_codes.py), so
# they live here as plain ints; extFields `namespace`, `key` and, for PUT, `value` (headers.py).
PUT_KV_CONFIG: Final = 100
GET_KV_CONFIG: Final = 101
DELETE_KV_CONFIG: Final = 102
