"""Typed extFields headers and JSON bodies: decoding from outside, encoding for real clients.

Goal: every typed header decodes what clients send (C++ numbers, Java strings, the V2 letters),
names the missing or bad field in a RemoteProtocolError answered with SYSTEM_ERROR, range-checks
numbers, and round-trips through `to_ext`; the quick SEND and PULL decoders agree with their
reference twins on any input; JSON bodies read both client dialects and refuse bad shapes.
Method: one sample per header class, field removal and corruption, hypothesis-made extFields
compared across the two decoders, and hand-written body JSON in the clients' spellings.
"""

from __future__ import annotations

import json
from typing import Any, cast

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqbox.protocol import (
    REQUEST_HEADER_BY_CODE,
    BrokerData,
    ClusterInfo,
    ConsumeFromWhere,
    ConsumerData,
    ConsumerGroupRequestHeader,
    ConsumerListBody,
    ConsumerSendMsgBackRequestHeader,
    ConsumeType,
    DataVersion,
    DeleteTopicRequestHeader,
    ExtHeader,
    GetEarliestMsgStoretimeResponseHeader,
    GetRouteInfoRequestHeader,
    HeartbeatData,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageModel,
    MessageQueue,
    OffsetResponseHeader,
    ProducerData,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    QueryConsumerOffsetRequestHeader,
    QueryMessageRequestHeader,
    QueryMessageResponseHeader,
    QueueData,
    QueueRequestHeader,
    RegisterBrokerBody,
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    RemoteProtocolError,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    SearchOffsetRequestHeader,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
    SubscriptionData,
    TopicConfig,
    TopicList,
    TopicRouteData,
    UnregisterBrokerRequestHeader,
    UnregisterClientRequestHeader,
    UpdateAndCreateTopicRequestHeader,
    UpdateConsumerOffsetRequestHeader,
    ViewMessageRequestHeader,
    normalize_ext_fields,
    parse_bool,
    validate_topic,
)

SEND = SendMessageRequestHeader(
    producer_group="PG",
    topic="test",
    default_topic="TBW102",
    default_topic_queue_nums=4,
    queue_id=-1,
    sys_flag=1,
    born_timestamp_ms=1795243948045,
    flag=7,
    properties="TAGS\x01a\x02",
    reconsume_times=2,
    unit_mode=True,
    max_reconsume_times=16,
    batch=True,
    broker_name="broker-a",
)
PULL = PullMessageRequestHeader(
    consumer_group="CG",
    topic="test",
    queue_id=3,
    queue_index=2**40,
    message_count_max=32,
    sys_flag=7,
    commit_queue_index=12,
    suspend_timeout_ms=15000,
    sub_version=1795244072543,
    subscription="TagA || TagB",
    expression_type="TAG",
)

# One instance of every typed header, every optional field set so that to_ext writes it.
SAMPLES: list[Any] = [
    GetRouteInfoRequestHeader("test", accept_standard_json_only=True),
    RegisterBrokerRequestHeader(
        "broker-a", "10.0.0.5:10911", "DefaultCluster", "10.0.0.5:10912", 0, True, 123
    ),
    RegisterBrokerResponseHeader("10.0.0.5:10912", "10.0.0.5:10911"),
    UnregisterBrokerRequestHeader("broker-a", "10.0.0.5:10911", "DefaultCluster", 1),
    DeleteTopicRequestHeader("test"),
    SEND,
    SendMessageResponseHeader("7F00000100002A9F0000000000000000", 3, 2**40, "tx-1"),
    PULL,
    PullMessageResponseHeader(10, 0, 10, 1),
    QueryConsumerOffsetRequestHeader("CG", "test", 3),
    UpdateConsumerOffsetRequestHeader("CG", "test", 3, 99),
    QueueRequestHeader("test", 3),
    SearchOffsetRequestHeader("test", 3, 1795243948045),
    OffsetResponseHeader(5),
    GetEarliestMsgStoretimeResponseHeader(1795243948045),
    ViewMessageRequestHeader(2**33),
    QueryMessageRequestHeader("test", "k1", 32, 0, 1795243948045, unique_key_query=True),
    QueryMessageResponseHeader(1795243948045, 4096),
    UnregisterClientRequestHeader("1-127.0.0.1@DEFAULT", "PG", "CG"),
    ConsumerSendMsgBackRequestHeader("CG", 913, -1, "MSGID", "test", True, 16),
    ConsumerGroupRequestHeader("CG"),
    UpdateAndCreateTopicRequestHeader("test", "TBW102", 8, 8, 6, "MULTI_TAG", 1, True),
]


def attempt(decoder: Any, *args: Any) -> object:
    """The decoded value, or the RemoteProtocolError the decoder raised."""
    try:
        return decoder(*args)
    except RemoteProtocolError as error:
        return error


def test_parse_bool_reads_cpp_and_java_spellings() -> None:
    for text in ("1", "true", "TRUE", "True", "tRuE"):
        assert parse_bool(text) is True
    for text in ("0", "false", "FALSE", "", "yes", "2", " true", "01"):
        assert parse_bool(text) is False


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda sample: type(sample).__name__)
def test_header_round_trips_through_string_ext(sample: ExtHeader) -> None:
    ext = sample.to_ext()
    assert all(type(key) is str and type(value) is str for key, value in ext.items())
    assert type(sample).from_ext(ext) == sample


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda sample: type(sample).__name__)
def test_header_missing_field_is_named_or_optional(sample: ExtHeader) -> None:
    ext = sample.to_ext()
    for key in ext:
        reduced = {other: value for other, value in ext.items() if other != key}
        outcome = attempt(type(sample).from_ext, reduced)
        if isinstance(outcome, RemoteProtocolError):
            assert repr(key) in str(outcome)
            assert "missing" in str(outcome)
            assert type(sample).__name__ in str(outcome)
            assert outcome.response_code == ResponseCode.SYSTEM_ERROR
        else:
            assert outcome != sample  # an optional field fell back to its default


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda sample: type(sample).__name__)
def test_header_number_field_with_text_is_named(sample: ExtHeader) -> None:
    ext = sample.to_ext()
    for key, value in ext.items():
        if value.lstrip("-").isdigit():
            with pytest.raises(RemoteProtocolError, match=f"{key!r} is 'x7'"):
                type(sample).from_ext({**ext, key: "x7"})


@pytest.mark.parametrize(
    ("key", "value", "bits"),
    [
        ("queueId", str(2**31), "32"),
        ("queueId", str(-(2**31) - 1), "32"),
        ("maxMsgNums", "99999999999", "32"),
        ("queueOffset", str(2**63), "64"),
        ("commitOffset", str(-(2**63) - 1), "64"),
        ("subVersion", "9" * 30, "64"),
    ],
)
def test_pull_numbers_out_of_range_are_refused(key: str, value: str, bits: str) -> None:
    ext = PULL.to_ext()
    with pytest.raises(RemoteProtocolError, match=f"{key!r} = .* does not fit {bits} bits"):
        PullMessageRequestHeader.from_ext({**ext, key: value})
    ext_json: dict[str, object] = {**ext, key: int(value)}
    with pytest.raises(RemoteProtocolError, match=f"{key!r}"):
        PullMessageRequestHeader.from_ext(ext_json)


def test_send_range_limits_are_exact() -> None:
    ext = SEND.to_ext()
    edge = SendMessageRequestHeader.from_ext({**ext, "queueId": str(2**31 - 1)})
    assert edge.queue_id == 2**31 - 1
    with pytest.raises(RemoteProtocolError, match="does not fit 32 bits"):
        SendMessageRequestHeader.from_ext({**ext, "queueId": 2**31})
    edge = SendMessageRequestHeader.from_ext({**ext, "bornTimestamp": -(2**63)})
    assert edge.born_timestamp_ms == -(2**63)
    with pytest.raises(RemoteProtocolError, match="does not fit 64 bits"):
        SendMessageRequestHeader.from_ext({**ext, "bornTimestamp": str(2**63)})


@pytest.mark.parametrize(
    ("batch", "code", "expected"),
    [
        ("1", RequestCode.SEND_MESSAGE, True),
        ("true", RequestCode.SEND_MESSAGE, True),
        ("TRUE", RequestCode.SEND_MESSAGE, True),
        ("0", RequestCode.SEND_MESSAGE, False),
        ("false", RequestCode.SEND_MESSAGE, False),
        (None, RequestCode.SEND_MESSAGE, False),
        ("true", RequestCode.SEND_MESSAGE_V2, True),
        ("false", RequestCode.SEND_MESSAGE_V2, False),
        ("false", RequestCode.SEND_BATCH_MESSAGE, True),
        (None, RequestCode.SEND_BATCH_MESSAGE, True),
    ],
)
def test_send_batch_reads_one_or_true_or_code_320(
    batch: str | None, code: int, expected: bool
) -> None:
    v2 = code != RequestCode.SEND_MESSAGE
    ext = SEND.to_ext_v2() if v2 else SEND.to_ext()
    batch_key = "m" if v2 else "batch"
    del ext[batch_key]
    if batch is not None:
        ext[batch_key] = batch
    assert SendMessageRequestHeader.from_ext(ext, code).batch is expected
    assert SendMessageRequestHeader.from_ext_checked(ext, code).batch is expected


def test_send_v2_letters_decode_like_the_long_names() -> None:
    long_names = SendMessageRequestHeader.from_ext(SEND.to_ext(), RequestCode.SEND_MESSAGE)
    letters = SendMessageRequestHeader.from_ext(SEND.to_ext_v2(), RequestCode.SEND_MESSAGE_V2)
    assert long_names == letters == SEND
    assert set(SEND.to_ext_v2()) == set("abcdefghijklmn")


def test_send_unit_mode_reads_both_spellings() -> None:
    ext = SEND.to_ext()
    for text, expected in (("1", True), ("true", True), ("0", False), ("false", False)):
        assert SendMessageRequestHeader.from_ext({**ext, "unitMode": text}).unit_mode is expected


def test_send_header_with_cpp_json_numbers_matches_java_strings() -> None:
    java = SEND.to_ext()
    cpp: dict[str, object] = dict(java)
    for key in ("defaultTopicQueueNums", "queueId", "sysFlag", "flag"):
        cpp[key] = int(java[key])
    assert SendMessageRequestHeader.from_ext(cpp) == SendMessageRequestHeader.from_ext(java)


def test_send_header_refuses_a_boolean_number_as_the_reference_does() -> None:
    ext: dict[str, object] = {**SEND.to_ext(), "queueId": True}
    with pytest.raises(RemoteProtocolError, match="'queueId' is 'true'"):
        SendMessageRequestHeader.from_ext(ext)


# Values a client might put in extFields: right and wrong types, good and bad numbers.
ext_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**64), 2**64),
    st.sampled_from([0.5, 1.0, -3.0]),
    st.integers(-(2**64), 2**64).map(str),
    st.sampled_from(["", "0", "1", "true", "TRUE", "false", " 5", "5_0", "x", "-", "1e3"]),
    st.text(max_size=6),
    st.lists(st.integers(), max_size=2),
)


def ext_strategy(keys: tuple[str, ...]) -> st.SearchStrategy[dict[str, object]]:
    return st.dictionaries(st.sampled_from(keys), ext_values, max_size=len(keys))


def decode_or_error(decoder: Any, *args: Any) -> object:
    """Comparable outcome: the value, or the error's message."""
    outcome = attempt(decoder, *args)
    return ("error", str(outcome)) if isinstance(outcome, RemoteProtocolError) else outcome


SEND_KEYS = (*SEND.to_ext(), "other")
SEND_KEYS_V2 = (*SEND.to_ext_v2(), "other")


@settings(deadline=None, max_examples=400)
@given(
    base=st.sampled_from([{}, SEND.to_ext(), SEND.to_ext_v2()]),
    changes=ext_strategy(SEND_KEYS + SEND_KEYS_V2),
    code=st.sampled_from([10, 310, 320]),
)
def test_quick_send_decoder_agrees_with_its_reference(
    base: dict[str, str], changes: dict[str, object], code: int
) -> None:
    ext = {**base, **changes}
    quick = decode_or_error(SendMessageRequestHeader.from_ext, ext, code)
    reference = decode_or_error(
        SendMessageRequestHeader.from_ext_checked, normalize_ext_fields(ext), code
    )
    assert quick == reference


@settings(deadline=None, max_examples=400)
@given(
    base=st.sampled_from([{}, PULL.to_ext()]),
    changes=ext_strategy((*PULL.to_ext(), "other")),
)
def test_quick_pull_decoder_agrees_with_its_reference(
    base: dict[str, str], changes: dict[str, object]
) -> None:
    ext = {**base, **changes}
    quick = decode_or_error(PullMessageRequestHeader.from_ext, ext)
    reference = decode_or_error(
        PullMessageRequestHeader.from_ext_checked, normalize_ext_fields(ext)
    )
    assert quick == reference


SEND_ANSWER = SendMessageResponseHeader("7F00000100002A9F0000000000000000", 3, 2**40, "tx-1")


@settings(deadline=None, max_examples=400)
@given(
    base=st.sampled_from([{}, SEND_ANSWER.to_ext()]),
    changes=ext_strategy((*SEND_ANSWER.to_ext(), "other")),
)
def test_quick_send_answer_decoder_agrees_with_its_reference(
    base: dict[str, str], changes: dict[str, object]
) -> None:
    """A producer reads SEND answers with from_command; from_ext over the string form is the
    reference."""
    ext = {**base, **changes}
    command = RemotingCommand(0, ext_fields=cast(dict[str, str], ext))
    command._ext_pending = True  # JSON values, as the JSON decoder leaves them
    quick = decode_or_error(SendMessageResponseHeader.from_command, command)
    reference = decode_or_error(SendMessageResponseHeader.from_ext, normalize_ext_fields(ext))
    assert quick == reference


@settings(deadline=None, max_examples=200)
@given(
    code=st.sampled_from(sorted(REQUEST_HEADER_BY_CODE)),
    ext=st.dictionaries(st.text(max_size=20), ext_values, max_size=10),
)
def test_any_ext_gives_a_header_or_remote_protocol_error(code: int, ext: dict[str, Any]) -> None:
    outcome = attempt(REQUEST_HEADER_BY_CODE[code].from_ext, normalize_ext_fields(ext))
    if isinstance(outcome, RemoteProtocolError):
        assert outcome.response_code == ResponseCode.SYSTEM_ERROR


def test_every_request_header_code_has_a_sample() -> None:
    assert set(REQUEST_HEADER_BY_CODE.values()) <= {type(sample) for sample in SAMPLES}


def test_validate_topic_follows_the_java_rule() -> None:
    for name in ("test", "%RETRY%CG_test", "a|b", "A-Z_0-9", "x" * 127):
        assert validate_topic(name) is None
    for name in ("", "x" * 128, "has space", "dot.ted", "slash/", "ünïcode", "tab\t"):
        remark = validate_topic(name)
        assert isinstance(remark, str)
        assert remark


# ---------------------------------------------------------------------------------------------
# Bodies

JAVA_HEARTBEAT = orjson.dumps(
    {
        "clientID": "10.0.0.9@DEFAULT",
        "producerDataSet": [{"groupName": "CLIENT_INNER_PRODUCER"}, {"groupName": "PG"}],
        "consumerDataSet": [
            {
                "groupName": "CG",
                "consumeType": "CONSUME_PASSIVELY",
                "messageModel": "BROADCASTING",
                "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
                "unitMode": False,
                "subscriptionDataSet": [
                    {
                        "classFilterMode": False,
                        "topic": "test",
                        "subString": "TagA",
                        "tagsSet": ["TagA"],
                        "codeSet": [2598919],
                        "subVersion": 1795243997792,
                        "expressionType": "TAG",
                    }
                ],
            }
        ],
    }
)


def test_java_heartbeat_reads_enum_names_and_numbers() -> None:
    heartbeat = HeartbeatData.from_json(JAVA_HEARTBEAT)
    assert heartbeat.producer_data_set == (
        ProducerData("CLIENT_INNER_PRODUCER"),
        ProducerData("PG"),
    )
    assert heartbeat.consumer_data_set == (
        ConsumerData(
            "CG",
            ConsumeType.CONSUME_PASSIVELY,
            MessageModel.BROADCASTING,
            ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
            (SubscriptionData("test", "TagA", ("TagA",), 1795243997792, "TAG", False),),
            False,
        ),
    )


def test_heartbeat_round_trips_and_reads_empty_sets() -> None:
    heartbeat = HeartbeatData.from_json(JAVA_HEARTBEAT)
    assert HeartbeatData.from_json(heartbeat.to_json()) == heartbeat
    assert HeartbeatData.from_json(b'{"clientID":"c"}\n') == HeartbeatData("c")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "body is empty"),
        (b"[]", "a JSON object"),
        (b"{}", "clientID"),
        (b'{"clientID":1}', "clientID"),
        (b'{"clientID":"c","consumerDataSet":{}}', "consumerDataSet"),
        (b'{"clientID":"c","producerDataSet":[{"groupName":null}]}', "groupName"),
        (
            b'{"clientID":"c","consumerDataSet":[{"groupName":"g","consumeType":7,'
            b'"messageModel":1,"consumeFromWhere":0}]}',
            "consumeType",
        ),
        (
            b'{"clientID":"c","consumerDataSet":[{"groupName":"g","consumeType":1,'
            b'"messageModel":"SOMETIMES","consumeFromWhere":0}]}',
            "messageModel",
        ),
        (
            b'{"clientID":"c","consumerDataSet":[{"groupName":"g","consumeType":1,'
            b'"messageModel":1,"consumeFromWhere":true}]}',
            "consumeFromWhere",
        ),
        (
            b'{"clientID":"c","consumerDataSet":[{"groupName":"g","consumeType":1,'
            b'"messageModel":1,"consumeFromWhere":0,"subscriptionDataSet":[{"topic":"t",'
            b'"subString":"*","subVersion":"soon"}]}]}',
            "subVersion",
        ),
    ],
)
def test_bad_heartbeat_names_the_problem(body: bytes, message: str) -> None:
    with pytest.raises(RemoteProtocolError, match=message):
        HeartbeatData.from_json(body)


def test_lock_batch_bodies_round_trip_in_both_directions() -> None:
    request_body = (
        b'{"clientId":"1-127.0.0.1@DEFAULT","consumerGroup":"CG_order",'
        b'"mqSet":[{"brokerName":"broker-a","queueId":2,"topic":"test"}]}'
    )
    request = LockBatchRequestBody.from_json(request_body)
    queue = MessageQueue("test", "broker-a", 2)
    assert request == LockBatchRequestBody("CG_order", "1-127.0.0.1@DEFAULT", (queue,))
    assert LockBatchRequestBody.from_json(request.to_json()) == request
    response = LockBatchResponseBody((queue,))
    assert response.to_json() == (
        b'{"lockOKMQSet":[{"brokerName":"broker-a","queueId":2,"topic":"test"}]}'
    )
    assert LockBatchResponseBody.from_json(response.to_json()) == response
    with pytest.raises(RemoteProtocolError, match="queueId"):
        LockBatchRequestBody.from_json(request_body.replace(b":2,", b':"two",'))


def test_consumer_list_body_round_trips() -> None:
    body = ConsumerListBody(("1-127.0.0.1@DEFAULT", "2-127.0.0.1@DEFAULT"))
    assert body.to_json() == b'{"consumerIdList":["1-127.0.0.1@DEFAULT","2-127.0.0.1@DEFAULT"]}'
    assert ConsumerListBody.from_json(body.to_json()) == body


def test_route_data_writes_order_conf_only_when_set_and_reads_the_4_9_spelling() -> None:
    route = TopicRouteData(
        queue_datas=(QueueData("broker-a", 8, 8, 6, 0),),
        broker_datas=(BrokerData("c", "broker-a", {1: "10.0.0.6:10911", 0: "10.0.0.5:10911"}),),
        order_topic_conf="broker-a:8",
    )
    value = json.loads(route.to_json())
    assert list(value) == ["brokerDatas", "filterServerTable", "orderTopicConf", "queueDatas"]
    assert value["filterServerTable"] == {}
    assert value["brokerDatas"][0]["brokerAddrs"] == {"0": "10.0.0.5:10911", "1": "10.0.0.6:10911"}
    assert list(value["brokerDatas"][0]["brokerAddrs"]) == ["0", "1"]
    assert type(value["queueDatas"][0]["readQueueNums"]) is int
    assert TopicRouteData.from_json(route.to_json()) == route
    newer = (
        route.to_json().replace(b"topicSynFlag", b"topicSysFlag").replace(b'Flag":0', b'Flag":2')
    )
    assert TopicRouteData.from_json(newer).queue_datas[0].topic_sys_flag == 2
    assert b"orderTopicConf" not in TopicRouteData().to_json()


def test_register_broker_body_round_trips_and_reads_java_json() -> None:
    java = (
        b'{"filterServerList":[],"topicConfigSerializeWrapper":{"dataVersion":'
        b'{"counter":3,"timestamp":1795243948045,"stateVersion":0},"topicConfigTable":'
        b'{"test":{"order":false,"perm":6,"readQueueNums":4,"topicFilterType":"SINGLE_TAG",'
        b'"topicName":"test","topicSysFlag":0,"writeQueueNums":4}}}}'
    )
    body = RegisterBrokerBody.from_json(java)
    assert body == RegisterBrokerBody(
        DataVersion(3, 1795243948045), {"test": TopicConfig("test", 4, 4, 6)}
    )
    assert RegisterBrokerBody.from_json(body.to_json()) == body
    with pytest.raises(RemoteProtocolError, match="dataVersion"):
        RegisterBrokerBody.from_json(b'{"topicConfigSerializeWrapper":{}}')


def test_cluster_info_and_topic_list_round_trip() -> None:
    info = ClusterInfo(
        {"broker-a": BrokerData("c", "broker-a", {0: "10.0.0.5:10911"})},
        {"c": ("broker-a",)},
    )
    assert json.loads(info.to_json()) == {
        "brokerAddrTable": {
            "broker-a": {
                "brokerAddrs": {"0": "10.0.0.5:10911"},
                "brokerName": "broker-a",
                "cluster": "c",
            }
        },
        "clusterAddrTable": {"c": ["broker-a"]},
    }
    assert ClusterInfo.from_json(info.to_json()) == info
    topics = TopicList(("a", "b"))
    assert topics.to_json() == b'{"topicList":["a","b"]}'
    assert TopicList.from_json(topics.to_json()) == topics


body_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "clientID",
                    "consumerDataSet",
                    "groupName",
                    "mqSet",
                    "queueDatas",
                    "brokerAddrs",
                    "topicConfigSerializeWrapper",
                    "dataVersion",
                    "topicList",
                    "x",
                ]
            ),
            children,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@pytest.mark.parametrize("depth", [255, 1000, 1023])
def test_json_bodies_nested_as_deep_as_orjson_reads_are_refused_with_a_short_remark(
    depth: int,
) -> None:
    """Found by the fuzz test: the remark's repr of such a value raised RecursionError."""
    nested = b"[" * depth + b"]" * depth
    for body in (nested, b'{"consumerGroup":' + nested + b',"mqSet":' + nested + b"}"):
        with pytest.raises(RemoteProtocolError) as refused:
            LockBatchRequestBody.from_json(body)
        assert len(str(refused.value)) < 200


@settings(deadline=None, max_examples=300)
@given(value=body_json)
def test_any_json_body_gives_a_value_or_remote_protocol_error(value: object) -> None:
    body = json.dumps(value).encode()
    for decoder in (
        HeartbeatData.from_json,
        LockBatchRequestBody.from_json,
        LockBatchResponseBody.from_json,
        ConsumerListBody.from_json,
        TopicRouteData.from_json,
        RegisterBrokerBody.from_json,
        ClusterInfo.from_json,
        TopicList.from_json,
    ):
        attempt(decoder, body)  # anything but RemoteProtocolError propagates
