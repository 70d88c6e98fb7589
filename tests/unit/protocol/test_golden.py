"""Golden frames: what the real C++ client sent and accepted decodes and encodes as it must.

Goal: the codec reads the frames of docs/protocol.md section 10 (captured from the wheel's
librocketmq) into the right commands and typed headers, and writes responses and bodies in the form
that client accepted. Method: each frame is rebuilt here byte for byte from the header JSON shown in
the document (only the trimmed Signature value is invented), decoded through a broker Connection,
and checked field by field; encoders are compared with exact expected bytes.
"""

from __future__ import annotations

import struct

from mqbox.protocol import (
    NEED_DATA,
    BrokerData,
    Connection,
    ConsumeFromWhere,
    ConsumerSendMsgBackRequestHeader,
    ConsumeType,
    GetRouteInfoRequestHeader,
    HeartbeatData,
    LanguageCode,
    MessageModel,
    PullMessageRequestHeader,
    QueueData,
    RemotingCommand,
    RequestCode,
    Role,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
    SerializeType,
    TopicRouteData,
    UnregisterClientRequestHeader,
    encode_command,
)

SIGNATURE = "kH7n0cG4vXhP8QdR1sTzYw2bLmE="
AUTH = f'"AccessKey":"","OnsChannel":"ALIYUN","Signature":"{SIGNATURE}"'
AUTH_FIELDS = {"AccessKey": "", "OnsChannel": "ALIYUN", "Signature": SIGNATURE}

# Header JSON exactly as section 10 shows it, auth values filled in. Raw strings keep the JSON
# escapes (\u0001) as the six characters the client wrote.
GET_ROUTEINFO_JSON = (
    '{"code":105,"extFields":{' + AUTH + ',"topic":"test"},'
    '"flag":0,"language":"CPP","opaque":0,"remark":"","version":63}\n'
)
SEND_JSON = (
    '{"code":10,"extFields":{' + AUTH + ',"batch":"0","bornTimestamp":"1795243948045",'
    '"defaultTopic":"TBW102","defaultTopicQueueNums":4,"flag":0,"producerGroup":"PG_test",'
    r'"properties":"KEYS\u0001k1 k2\u0002TAGS\u0001TagA\u0002UNIQ_KEY\u0001'
    r'0100007F0000901900008D1AD66D0100\u0002WAIT\u0001true\u0002",'
    '"queueId":0,"reconsumeTimes":"0","sysFlag":0,"topic":"test","unitMode":"0"},'
    '"flag":0,"language":"CPP","opaque":1,"remark":"","version":63}\n'
)
PULL_JSON = (
    '{"code":11,"extFields":{' + AUTH + ',"commitOffset":"0","consumerGroup":"CG_test",'
    '"maxMsgNums":32,"queueId":0,"queueOffset":"0","subVersion":"1795244072543",'
    '"subscription":"*","suspendTimeoutMillis":"15000","sysFlag":6,"topic":"%RETRY%CG_test"},'
    '"flag":0,"language":"CPP","opaque":6,"remark":"","version":63}\n'
)
SEND_BACK_JSON = (
    '{"code":36,"extFields":{' + AUTH + ',"delayLevel":0,"group":"CG_test","offset":"913"},'
    '"flag":0,"language":"CPP","opaque":21,"remark":"","version":63}\n'
)
UNREGISTER_JSON = (
    '{"code":35,"extFields":{' + AUTH + ',"clientID":"13973-127.0.0.1@DEFAULT",'
    '"consumerGroup":"","producerGroup":"PG_test"},'
    '"flag":0,"language":"CPP","opaque":9,"remark":"","version":63}\n'
)
HEARTBEAT_BODY = (
    b'{"clientID":"15339-127.0.0.1@DEFAULT","consumerDataSet":[{"consumeFromWhere":0,'
    b'"consumeType":1,"groupName":"CG_order","messageModel":1,"subscriptionDataSet":['
    b'{"subString":"*","subVersion":"1795243997792","topic":"%RETRY%CG_order"},'
    b'{"codeSet":[0,0],"subString":"TagB || TagA","subVersion":"1795243997792",'
    b'"tagsSet":["TagB","TagA"],"topic":"test"}]}]}\n'
)
ACCEPTED_SEND_RESPONSE_JSON = (
    '{"code":0,"extFields":{"msgId":"7F00000100009BE70000000000000000","queueId":"0",'
    '"queueOffset":"0","MSG_REGION":"DefaultRegion","TRACE_ON":"true"},"flag":1,'
    '"language":"JAVA","opaque":1,"serializeTypeCurrentRPC":"JSON","version":317}'
)
ACCEPTED_ROUTE_BODY = (
    b'{"brokerDatas":[{"brokerAddrs":{"0":"127.0.0.1:10911"},"brokerName":"broker-a",'
    b'"cluster":"DefaultCluster"}],"filterServerTable":{},"queueDatas":[{"brokerName":'
    b'"broker-a","perm":6,"readQueueNums":4,"topicSynFlag":0,"writeQueueNums":4}]}'
)
SEND_PROPERTIES = (
    "KEYS\x01k1 k2\x02TAGS\x01TagA\x02"
    "UNIQ_KEY\x010100007F0000901900008D1AD66D0100\x02WAIT\x01true\x02"
)


def build_frame(header_json: str, body: bytes = b"") -> bytes:
    """A frame as the C++ client writes it: type byte 0, header length in the low 24 bits."""
    header = header_json.encode()
    return struct.pack(">iI", 4 + len(header) + len(body), len(header)) + header + body


def decode_one(frame: bytes) -> RemotingCommand:
    connection = Connection(Role.BROKER)
    connection.receive_data(frame)
    command = connection.next_command()
    assert isinstance(command, RemotingCommand)
    assert connection.next_command() is NEED_DATA
    return command


def test_golden_get_routeinfo_decodes_to_command_and_header() -> None:
    command = decode_one(build_frame(GET_ROUTEINFO_JSON))
    assert command.code == RequestCode.GET_ROUTEINFO_BY_TOPIC
    assert command.opaque == 0
    assert command.flag == 0
    assert not command.is_response
    assert command.language == LanguageCode.CPP
    assert command.version == 63
    assert command.remark == ""
    assert command.serialize_type == SerializeType.JSON
    assert command.ext_fields == {**AUTH_FIELDS, "topic": "test"}
    assert GetRouteInfoRequestHeader.from_ext(command.ext_fields) == GetRouteInfoRequestHeader(
        "test"
    )


def test_golden_send_decodes_numbers_as_strings_and_typed_header() -> None:
    body = bytes(range(128))
    command = decode_one(build_frame(SEND_JSON, body))
    assert command.code == RequestCode.SEND_MESSAGE
    assert command.opaque == 1
    assert command.body == body
    header = SendMessageRequestHeader.from_command(command)
    assert header == SendMessageRequestHeader(
        producer_group="PG_test",
        topic="test",
        default_topic="TBW102",
        default_topic_queue_nums=4,
        queue_id=0,
        sys_flag=0,
        born_timestamp_ms=1795243948045,
        flag=0,
        properties=SEND_PROPERTIES,
        reconsume_times=0,
        unit_mode=False,
        max_reconsume_times=None,
        batch=False,
        broker_name=None,
    )
    # The JSON numbers of the C++ client read as their decimal text.
    assert command.ext_fields["defaultTopicQueueNums"] == "4"
    assert command.ext_fields["queueId"] == "0"
    assert command.ext_fields["sysFlag"] == "0"
    assert command.ext_fields["flag"] == "0"
    assert command.ext_fields["bornTimestamp"] == "1795243948045"
    assert all(type(value) is str for value in command.ext_fields.values())
    assert SendMessageRequestHeader.from_ext(command.ext_fields) == header


def test_golden_pull_decodes_to_typed_header() -> None:
    command = decode_one(build_frame(PULL_JSON))
    assert command.code == RequestCode.PULL_MESSAGE
    assert command.opaque == 6
    header = PullMessageRequestHeader.from_command(command)
    assert header == PullMessageRequestHeader(
        consumer_group="CG_test",
        topic="%RETRY%CG_test",
        queue_id=0,
        queue_index=0,
        message_count_max=32,
        sys_flag=6,
        commit_queue_index=0,
        suspend_timeout_ms=15000,
        sub_version=1795244072543,
        subscription="*",
        expression_type=None,
    )
    assert PullMessageRequestHeader.from_ext(command.ext_fields) == header


def test_golden_send_back_decodes_to_typed_header() -> None:
    command = decode_one(build_frame(SEND_BACK_JSON))
    assert command.code == RequestCode.CONSUMER_SEND_MSG_BACK
    assert command.opaque == 21
    header = ConsumerSendMsgBackRequestHeader.from_ext(command.ext_fields)
    assert header == ConsumerSendMsgBackRequestHeader(
        group="CG_test", log_offset_bytes=913, delay_level=0
    )


def test_golden_unregister_reads_empty_group_as_none() -> None:
    command = decode_one(build_frame(UNREGISTER_JSON))
    assert command.code == RequestCode.UNREGISTER_CLIENT
    assert command.opaque == 9
    header = UnregisterClientRequestHeader.from_ext(command.ext_fields)
    assert header == UnregisterClientRequestHeader(
        client_id="13973-127.0.0.1@DEFAULT", producer_group="PG_test", consumer_group=None
    )


def test_golden_heartbeat_body_decodes_cpp_numbers_and_ignores_code_set() -> None:
    heartbeat = HeartbeatData.from_json(HEARTBEAT_BODY)
    assert heartbeat.client_id == "15339-127.0.0.1@DEFAULT"
    assert heartbeat.producer_data_set == ()  # the key is absent, as C++ leaves it out
    (consumer,) = heartbeat.consumer_data_set
    assert consumer.group_name == "CG_order"
    assert consumer.consume_type is ConsumeType.CONSUME_PASSIVELY
    assert consumer.message_model is MessageModel.CLUSTERING
    assert consumer.consume_from_where is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    retry, tagged = consumer.subscription_data_set
    assert retry.topic == "%RETRY%CG_order"
    assert retry.sub_string == "*"
    assert retry.tags_set == ()
    assert retry.sub_version == 1795243997792
    assert retry.expression_type == "TAG"
    assert tagged.topic == "test"
    assert tagged.tags_set == ("TagB", "TagA")
    assert tagged.sub_string == "TagB || TagA"


def test_golden_accepted_send_response_decodes() -> None:
    command = decode_one(build_frame(ACCEPTED_SEND_RESPONSE_JSON))
    assert command.is_response
    assert command.opaque == 1
    assert command.code == 0
    assert command.language == LanguageCode.JAVA
    assert command.remark is None
    header = SendMessageResponseHeader.from_ext(command.ext_fields)
    assert header == SendMessageResponseHeader("7F00000100009BE70000000000000000", 0, 0)


def test_send_response_encodes_in_the_form_the_wheel_accepted() -> None:
    request = decode_one(build_frame(SEND_JSON, b"x"))
    ext = SendMessageResponseHeader("7F00000100009BE70000000000000000", 0, 5).to_ext()
    response = request.make_response(0, ext)
    expected_header = (
        b'{"code":0,"extFields":{"msgId":"7F00000100009BE70000000000000000","queueId":"0",'
        b'"queueOffset":"5"},"flag":1,"language":"PYTHON","opaque":1,"remark":null,'
        b'"version":317}'
    )
    expected = struct.pack(">iI", 4 + len(expected_header), len(expected_header))
    assert encode_command(response) == expected + expected_header


def test_canonical_response_frames_reencode_byte_equal() -> None:
    headers = [
        b'{"code":0,"extFields":{"msgId":"7F00000100002A9F0000000000000000","queueId":"3",'
        b'"queueOffset":"12"},"flag":1,"language":"PYTHON","opaque":17,"remark":null,'
        b'"version":317}',
        b'{"code":19,"extFields":{"nextBeginOffset":"4","minOffset":"0","maxOffset":"4",'
        b'"suggestWhichBrokerId":"0"},"flag":1,"language":"JAVA","opaque":2147483647,'
        b'"remark":"no new message","version":317}',
        b'{"code":17,"extFields":{},"flag":1,"language":"CPP","opaque":0,'
        b'"remark":"No topic route info in name server for the topic: t","version":63}',
    ]
    for header in headers:
        for body in (b"", b"\x00\x01records"):
            frame = struct.pack(">iI", 4 + len(header) + len(body), len(header)) + header + body
            command = decode_one(frame)
            assert encode_command(command) == frame


def test_route_data_encodes_exactly_as_the_wheel_accepted() -> None:
    route = TopicRouteData(
        queue_datas=(QueueData("broker-a", 4, 4, 6, 0),),
        broker_datas=(BrokerData("DefaultCluster", "broker-a", {0: "127.0.0.1:10911"}),),
    )
    assert route.to_json() == ACCEPTED_ROUTE_BODY
    assert TopicRouteData.from_json(ACCEPTED_ROUTE_BODY) == route
