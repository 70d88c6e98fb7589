"""Codes, flag bits and the two codec error classes.

Goal: the numbers mqbox puts on the wire are RocketMQ's (docs/protocol.md sections 2 and 3),
and the two codec errors sit where callers expect them. Method: tables copied from the document
compared with the enums. (The import boundary is tests/unit/test_layering.py's job.)
"""

from __future__ import annotations

from mqbox.errors import MqboxError
from mqbox.protocol import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    PULL_FLAG_CLASS_FILTER,
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_LITE_PULL,
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    LanguageCode,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    RequestCode,
    ResponseCode,
    SerializeType,
)

# Section 3.1, code by code.
REQUEST_CODES = {
    10: "SEND_MESSAGE",
    11: "PULL_MESSAGE",
    12: "QUERY_MESSAGE",
    14: "QUERY_CONSUMER_OFFSET",
    15: "UPDATE_CONSUMER_OFFSET",
    17: "UPDATE_AND_CREATE_TOPIC",
    21: "GET_ALL_TOPIC_CONFIG",
    25: "UPDATE_BROKER_CONFIG",
    26: "GET_BROKER_CONFIG",
    28: "GET_BROKER_RUNTIME_INFO",
    29: "SEARCH_OFFSET_BY_TIMESTAMP",
    30: "GET_MAX_OFFSET",
    31: "GET_MIN_OFFSET",
    32: "GET_EARLIEST_MSG_STORETIME",
    33: "VIEW_MESSAGE_BY_ID",
    34: "HEART_BEAT",
    35: "UNREGISTER_CLIENT",
    36: "CONSUMER_SEND_MSG_BACK",
    37: "END_TRANSACTION",
    38: "GET_CONSUMER_LIST_BY_GROUP",
    39: "CHECK_TRANSACTION_STATE",
    40: "NOTIFY_CONSUMER_IDS_CHANGED",
    41: "LOCK_BATCH_MQ",
    42: "UNLOCK_BATCH_MQ",
    43: "GET_ALL_CONSUMER_OFFSET",
    45: "GET_ALL_DELAY_OFFSET",
    46: "CHECK_CLIENT_CONFIG",
    103: "REGISTER_BROKER",
    104: "UNREGISTER_BROKER",
    105: "GET_ROUTEINFO_BY_TOPIC",
    106: "GET_BROKER_CLUSTER_INFO",
    200: "UPDATE_AND_CREATE_SUBSCRIPTIONGROUP",
    201: "GET_ALL_SUBSCRIPTIONGROUP_CONFIG",
    202: "GET_TOPIC_STATS_INFO",
    203: "GET_CONSUMER_CONNECTION_LIST",
    204: "GET_PRODUCER_CONNECTION_LIST",
    205: "WIPE_WRITE_PERM_OF_BROKER",
    207: "DELETE_SUBSCRIPTIONGROUP",
    206: "GET_ALL_TOPIC_LIST_FROM_NAMESERVER",
    208: "GET_CONSUME_STATS",
    215: "DELETE_TOPIC_IN_BROKER",
    216: "DELETE_TOPIC_IN_NAMESRV",
    219: "GET_KVLIST_BY_NAMESPACE",
    220: "RESET_CONSUMER_CLIENT_OFFSET",
    221: "GET_CONSUMER_STATUS_FROM_CLIENT",
    223: "INVOKE_BROKER_TO_GET_CONSUMER_STATUS",
    224: "GET_TOPICS_BY_CLUSTER",
    300: "QUERY_TOPIC_CONSUME_BY_WHO",
    304: "GET_SYSTEM_TOPIC_LIST_FROM_NS",
    305: "GET_SYSTEM_TOPIC_LIST_FROM_BROKER",
    307: "GET_CONSUMER_RUNNING_INFO",
    309: "CONSUME_MESSAGE_DIRECTLY",
    310: "SEND_MESSAGE_V2",
    315: "VIEW_BROKER_STATS_DATA",
    317: "GET_BROKER_CONSUME_STATS",
    320: "SEND_BATCH_MESSAGE",
    322: "QUERY_DATA_VERSION",
}

# Section 3.2.
RESPONSE_CODES = {
    0: "SUCCESS",
    1: "SYSTEM_ERROR",
    2: "SYSTEM_BUSY",
    3: "REQUEST_CODE_NOT_SUPPORTED",
    4: "TRANSACTION_FAILED",
    10: "FLUSH_DISK_TIMEOUT",
    11: "SLAVE_NOT_AVAILABLE",
    12: "FLUSH_SLAVE_TIMEOUT",
    13: "MESSAGE_ILLEGAL",
    14: "SERVICE_NOT_AVAILABLE",
    15: "VERSION_NOT_SUPPORTED",
    16: "NO_PERMISSION",
    17: "TOPIC_NOT_EXIST",
    18: "TOPIC_EXIST_ALREADY",
    19: "PULL_NOT_FOUND",
    20: "PULL_RETRY_IMMEDIATELY",
    21: "PULL_OFFSET_MOVED",
    22: "QUERY_NOT_FOUND",
    23: "SUBSCRIPTION_PARSE_FAILED",
    24: "SUBSCRIPTION_NOT_EXIST",
    25: "SUBSCRIPTION_NOT_LATEST",
    26: "SUBSCRIPTION_GROUP_NOT_EXIST",
    27: "FILTER_DATA_NOT_EXIST",
    28: "FILTER_DATA_NOT_LATEST",
    200: "TRANSACTION_SHOULD_COMMIT",
    201: "TRANSACTION_SHOULD_ROLLBACK",
    202: "TRANSACTION_STATE_UNKNOW",
    203: "TRANSACTION_STATE_GROUP_WRONG",
    204: "NO_BUYER_ID",
    205: "NOT_IN_CURRENT_UNIT",
    206: "CONSUMER_NOT_ONLINE",
    207: "CONSUME_MSG_TIMEOUT",
    208: "NO_MESSAGE",
    215: "FLOW_CONTROL",
}

LANGUAGES = [
    "JAVA",
    "CPP",
    "DOTNET",
    "PYTHON",
    "DELPHI",
    "ERLANG",
    "RUBY",
    "OTHER",
    "HTTP",
    "GO",
    "PHP",
    "OMS",
    "RUST",
]


def test_request_codes_are_rocketmq_numbers_and_names() -> None:
    assert {code.value: code.name for code in RequestCode} == REQUEST_CODES


def test_response_codes_cover_the_document() -> None:
    names = {code.value: code.name for code in ResponseCode}
    assert names.items() >= RESPONSE_CODES.items()
    assert {209, 210, 211} <= set(names)  # the 4.x ACL failures


def test_language_and_serialize_codes() -> None:
    assert [language.name for language in LanguageCode] == LANGUAGES
    assert [language.value for language in LanguageCode] == list(range(len(LANGUAGES)))
    assert (SerializeType.JSON, SerializeType.ROCKETMQ) == (0, 1)


def test_flag_bits() -> None:
    assert (FLAG_RESPONSE, FLAG_ONEWAY) == (1, 2)
    pull_bits = (
        PULL_FLAG_COMMIT_OFFSET,
        PULL_FLAG_SUSPEND,
        PULL_FLAG_SUBSCRIPTION,
        PULL_FLAG_CLASS_FILTER,
        PULL_FLAG_LITE_PULL,
    )
    assert pull_bits == (1, 2, 4, 8, 16)
    # The sysflags the wheel sends (section 4.3): push 6, then 7; Python PullConsumer 4.
    assert PULL_FLAG_SUSPEND | PULL_FLAG_SUBSCRIPTION == 6
    assert PULL_FLAG_SUBSCRIPTION == 4


def test_remote_errors_are_operating_errors_answered_with_system_error() -> None:
    error = RemoteProtocolError("bad header")
    assert isinstance(error, MqboxError)
    assert isinstance(error, ProtocolError)
    assert error.response_code == ResponseCode.SYSTEM_ERROR
    assert RemoteProtocolError("x", response_code=13).response_code == 13
    assert not issubclass(LocalProtocolError, MqboxError)  # a bug, not an operating error
    assert issubclass(LocalProtocolError, ProtocolError)
