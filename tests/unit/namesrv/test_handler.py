"""NamesrvRequestHandler: every name server request code answered as RocketMQ answers it.

Goal: 103/104/105/106/205/206/216/100/101/102 give the codes, extFields and bodies of
docs/protocol.md section 4.1; an unknown code gets 3 with Java's remark; a header that does not
decode gets SYSTEM_ERROR and nothing else changes; oneway requests and stray responses get no
answer; a golden C++ GET_ROUTEINFO frame decodes, is answered, and the answer is a JSON frame with
flag 1, the echoed opaque and string-only extFields, which is what the C++ client needs.
Method: the handler is pure, so requests are built with `make_request` (or decoded from golden
bytes through a ConnectionPair) and passed in with explicit connection ids and `now_ms`; no socket
is opened.
"""

from __future__ import annotations

import logging
import zlib

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqbox.namesrv.routes import NAMESPACE_ORDER_TOPIC_CONFIG, RouteLimits, RouteTable
from mqbox.namesrv.server import NamesrvRequestHandler
from mqbox.protocol.codes import (
    DELETE_KV_CONFIG,
    GET_KV_CONFIG,
    PUT_KV_CONFIG,
    RequestCode,
    ResponseCode,
)
from mqbox.protocol.command import RemotingCommand, encode_command, make_request
from mqbox.protocol.connection import Role
from mqbox.protocol.headers import (
    ClusterInfo,
    DataVersion,
    KvTable,
    RegisterBrokerBody,
    RegisterBrokerRequestHeader,
    TopicConfig,
    TopicList,
    TopicRouteData,
)
from tests.support.connection_pair import ConnectionPair

ROUTE_JSON = (
    b'{"brokerDatas":[{"brokerAddrs":{"0":"127.0.0.1:10911"},"brokerName":"broker-a",'
    b'"cluster":"DefaultCluster"}],"filterServerTable":{},"queueDatas":[{"brokerName":'
    b'"broker-a","perm":6,"readQueueNums":4,"topicSynFlag":0,"writeQueueNums":4}]}'
)
# docs/protocol.md section 10, with the Signature value trimmed as there.
GOLDEN_GET_ROUTEINFO = (
    b'{"code":105,"extFields":{"AccessKey":"","OnsChannel":"ALIYUN","Signature":"x",'
    b'"topic":"test"},"flag":0,"language":"CPP","opaque":0,"remark":"","version":63}\n'
)

HANDLED_CODES = (
    RequestCode.REGISTER_BROKER,
    RequestCode.UNREGISTER_BROKER,
    RequestCode.GET_ROUTEINFO_BY_TOPIC,
    RequestCode.GET_BROKER_CLUSTER_INFO,
    RequestCode.WIPE_WRITE_PERM_OF_BROKER,
    RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER,
    RequestCode.DELETE_TOPIC_IN_NAMESRV,
    PUT_KV_CONFIG,
    GET_KV_CONFIG,
    DELETE_KV_CONFIG,
)
EXT_KEYS = (
    "topic",
    "brokerName",
    "brokerAddr",
    "clusterName",
    "haServerAddr",
    "brokerId",
    "compressed",
    "bodyCrc32",
    "namespace",
    "key",
    "value",
)
EXT_VALUES = (
    "",
    "0",
    "-1",
    "1",
    "true",
    "99999999999999999999",
    "1.5",
    "\ud800",
    "\x00",
    "a" * 300,
    "127.0.0.1:10911",
)
REGISTER_BODIES = (
    b"",
    b"{}",
    b"null",
    b"\xff\xfe",
    b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"t":{"topicName":"t\\ud800",'
    b'"readQueueNums":4,"writeQueueNums":4,"perm":6}},"dataVersion":{"timestamp":1,"counter":1}}}',
    b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"t":{"topicName":"t","readQueueNums":-4,'
    b'"writeQueueNums":1e30,"perm":"x"}},"dataVersion":{"timestamp":"a","counter":[]}},'
    b'"filterServerList":{}}',
    b'{"topicConfigSerializeWrapper":{"topicConfigTable":[],"dataVersion":null}}',
)


class Requests:
    """Builds requests with increasing opaques and passes them to one handler."""

    def __init__(self, *, order_message_enable: bool = False) -> None:
        self.routes = RouteTable(order_message_enable=order_message_enable)
        self.handler = NamesrvRequestHandler(self.routes)
        self._opaque = 0

    def call(
        self,
        code: int,
        ext: dict[str, str] | None = None,
        body: bytes = b"",
        *,
        connection_id: int = 1,
        now_ms: int = 0,
        oneway: bool = False,
    ) -> RemotingCommand | None:
        self._opaque += 1
        request = make_request(code, self._opaque, ext, body=body, oneway=oneway)
        response = self.handler.handle(request, connection_id, now_ms)
        if response is not None:
            assert response.is_response
            assert response.opaque == self._opaque
            assert all(type(value) is str for value in response.ext_fields.values())
        return response

    def answer(
        self, code: int, ext: dict[str, str] | None = None, body: bytes = b""
    ) -> RemotingCommand:
        response = self.call(code, ext, body)
        assert response is not None
        return response

    def register(
        self, *topics: TopicConfig, counter: int = 1, broker_id: int = 0
    ) -> RemotingCommand:
        addr = "127.0.0.1:10911" if broker_id == 0 else f"127.0.0.1:{10911 + 10 * broker_id}"
        header = RegisterBrokerRequestHeader(
            "broker-a", addr, "DefaultCluster", "127.0.0.1:10912", broker_id
        )
        configs = topics or (TopicConfig("test", 4, 4, 6),)
        body = RegisterBrokerBody(
            DataVersion(counter, 1), {config.topic_name: config for config in configs}
        )
        return self.answer(RequestCode.REGISTER_BROKER, header.to_ext(), body.to_json())


def test_register_then_route_gives_the_json_the_wheel_accepts() -> None:
    requests = Requests()
    registered = requests.register()
    assert registered.code == ResponseCode.SUCCESS
    assert registered.ext_fields == {}
    assert registered.body == b""
    route = requests.answer(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "test"})
    assert route.code == ResponseCode.SUCCESS
    assert route.body == ROUTE_JSON


def test_unknown_topic_is_17_with_javas_remark() -> None:
    response = Requests().answer(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "nope"})
    assert response.code == ResponseCode.TOPIC_NOT_EXIST
    assert response.body == b""
    assert response.remark == "No topic route info in name server for the topic: nope"


def test_slave_registration_answers_master_and_ha_addresses() -> None:
    requests = Requests()
    requests.register()
    slave = requests.register(broker_id=1)
    assert slave.ext_fields == {"haServerAddr": "127.0.0.1:10912", "masterAddr": "127.0.0.1:10911"}


def test_register_answers_the_order_topic_namespace_and_routes_use_it() -> None:
    requests = Requests(order_message_enable=True)
    ext = {"namespace": NAMESPACE_ORDER_TOPIC_CONFIG, "key": "test", "value": "broker-a:4"}
    assert requests.answer(PUT_KV_CONFIG, ext).code == ResponseCode.SUCCESS
    registered = requests.register()
    assert KvTable.from_json(registered.body) == KvTable({"test": "broker-a:4"})
    route = requests.answer(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "test"})
    assert TopicRouteData.from_json(route.body).order_topic_conf == "broker-a:4"


def test_register_checks_body_crc32_when_given() -> None:
    requests = Requests()
    header = RegisterBrokerRequestHeader(
        "broker-a", "127.0.0.1:10911", "DefaultCluster", "127.0.0.1:10912", 0
    )
    body = RegisterBrokerBody(DataVersion(1, 1), {"test": TopicConfig("test", 4, 4, 6)}).to_json()
    crc = zlib.crc32(body) & 0x7FFF_FFFF
    header.body_crc32 = crc ^ 1
    wrong = requests.answer(RequestCode.REGISTER_BROKER, header.to_ext(), body)
    assert (wrong.code, wrong.remark) == (ResponseCode.SYSTEM_ERROR, "crc32 not match")
    assert requests.routes.broker_count() == 0
    header.body_crc32 = crc
    assert requests.answer(RequestCode.REGISTER_BROKER, header.to_ext(), body).code == 0
    assert requests.routes.route("test") is not None


def test_register_refuses_compressed_bodies_and_reads_an_empty_one() -> None:
    requests = Requests()
    header = RegisterBrokerRequestHeader(
        "broker-a", "127.0.0.1:10911", "DefaultCluster", "127.0.0.1:10912", 0, compressed=True
    )
    refused = requests.answer(RequestCode.REGISTER_BROKER, header.to_ext(), b"\x78\x9c")
    assert refused.code == ResponseCode.SYSTEM_ERROR
    header.compressed = False
    assert requests.answer(RequestCode.REGISTER_BROKER, header.to_ext()).code == 0
    assert requests.routes.broker_count() == 1
    assert requests.routes.topic_list() == ()


def test_bad_header_or_body_is_system_error_and_changes_nothing() -> None:
    requests = Requests()
    missing = requests.answer(RequestCode.GET_ROUTEINFO_BY_TOPIC, {})
    assert missing.code == ResponseCode.SYSTEM_ERROR
    assert missing.remark is not None
    assert "'topic'" in missing.remark
    header = RegisterBrokerRequestHeader("broker-a", "127.0.0.1:10911", "C", "127.0.0.1:1", 0)
    garbage = requests.answer(RequestCode.REGISTER_BROKER, header.to_ext(), b"{not json")
    assert garbage.code == ResponseCode.SYSTEM_ERROR
    assert requests.routes.broker_count() == 0
    assert requests.handler.statistics().bad_header_count == 2


def test_unregister_removes_the_route() -> None:
    requests = Requests()
    requests.register()
    ext = {
        "brokerName": "broker-a",
        "brokerAddr": "127.0.0.1:10911",
        "clusterName": "DefaultCluster",
        "brokerId": "0",
    }
    assert requests.answer(RequestCode.UNREGISTER_BROKER, ext).code == ResponseCode.SUCCESS
    route = requests.answer(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "test"})
    assert route.code == ResponseCode.TOPIC_NOT_EXIST
    # Unregistering again is still SUCCESS, as in Java.
    assert requests.answer(RequestCode.UNREGISTER_BROKER, ext).code == ResponseCode.SUCCESS


def test_cluster_info_and_topic_list_bodies() -> None:
    requests = Requests()
    requests.register(TopicConfig("t1", 1, 1, 6), TopicConfig("t2", 1, 1, 6))
    info = requests.answer(RequestCode.GET_BROKER_CLUSTER_INFO)
    assert orjson.loads(info.body) == {
        "brokerAddrTable": {
            "broker-a": {
                "brokerAddrs": {"0": "127.0.0.1:10911"},
                "brokerName": "broker-a",
                "cluster": "DefaultCluster",
            }
        },
        "clusterAddrTable": {"DefaultCluster": ["broker-a"]},
    }
    assert ClusterInfo.from_json(info.body) == requests.routes.cluster_info()
    topics = requests.answer(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
    assert orjson.loads(topics.body) == {"topicList": ["t1", "t2"]}
    assert TopicList.from_json(topics.body).topic_list == ("t1", "t2")


def test_delete_topic_and_wipe_write_perm() -> None:
    requests = Requests()
    requests.register(TopicConfig("t1", 1, 1, 6), TopicConfig("t2", 1, 1, 6))
    wiped = requests.answer(RequestCode.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"})
    assert wiped.code == ResponseCode.SUCCESS
    assert wiped.ext_fields == {"wipeTopicCount": "2"}
    route = requests.routes.route("t1")
    assert route is not None
    assert route.queue_datas[0].perm == 4
    deleted = requests.answer(RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "t1"})
    assert deleted.code == ResponseCode.SUCCESS
    assert requests.routes.topic_list() == ("t2",)


def test_kv_config_round_trip_and_not_found() -> None:
    requests = Requests()
    key = {"namespace": "ns", "key": "k"}
    missing = requests.answer(GET_KV_CONFIG, key)
    assert missing.code == ResponseCode.QUERY_NOT_FOUND
    assert missing.remark == "No config item, Namespace: ns Key: k"
    assert requests.answer(PUT_KV_CONFIG, {**key, "value": "v"}).code == ResponseCode.SUCCESS
    found = requests.answer(GET_KV_CONFIG, key)
    assert (found.code, found.ext_fields) == (ResponseCode.SUCCESS, {"value": "v"})
    assert requests.answer(DELETE_KV_CONFIG, key).code == ResponseCode.SUCCESS
    assert requests.answer(GET_KV_CONFIG, key).code == ResponseCode.QUERY_NOT_FOUND
    put_without_value = requests.answer(PUT_KV_CONFIG, key)
    assert put_without_value.code == ResponseCode.SYSTEM_ERROR


def test_unknown_code_is_3_with_javas_remark() -> None:
    requests = Requests()
    for code in (RequestCode.SEND_MESSAGE, RequestCode.QUERY_DATA_VERSION, 9999):
        response = requests.answer(code)
        assert response.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        assert response.remark == f" request type {int(code)} not supported"
    assert requests.handler.statistics().unsupported_count == 3


def test_oneway_requests_and_stray_responses_get_no_answer() -> None:
    requests = Requests()
    assert requests.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "t"}, oneway=True) is None
    stray = make_request(RequestCode.GET_ROUTEINFO_BY_TOPIC, 5).make_response(0)
    assert requests.handler.handle(stray, 1, 0) is None
    statistics = requests.handler.statistics()
    assert statistics.request_count == 1
    assert statistics.route_not_found_count == 1


def test_statistics_count_codes_and_recent_route_topics() -> None:
    requests = Requests()
    requests.register()
    for topic in ("test", "TBW102", "test"):
        requests.answer(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    statistics = requests.handler.statistics()
    assert statistics.request_count_by_code == {103: 1, 105: 3}
    assert statistics.recent_route_topics == ("test", "TBW102", "test")
    assert (statistics.route_found_count, statistics.route_not_found_count) == (2, 1)
    assert statistics.registration_count == 1


def test_golden_cpp_route_request_gets_a_json_answer_the_client_can_read() -> None:
    requests = Requests()
    requests.register()
    pair = ConnectionPair()
    header_size = len(GOLDEN_GET_ROUTEINFO)
    frame = (4 + header_size).to_bytes(4, "big") + header_size.to_bytes(4, "big")
    (request,) = pair.deliver(Role.CLIENT, frame + GOLDEN_GET_ROUTEINFO)
    response = requests.handler.handle(request, 1, 0)
    assert response is not None
    wire = pair.broker.send(response)
    assert wire[4] == 0  # serialize type JSON: the C++ client reads nothing else
    header = orjson.loads(wire[8 : 8 + int.from_bytes(wire[5:8], "big")])
    assert (header["code"], header["flag"], header["opaque"]) == (0, 1, 0)
    assert header["extFields"] == {}
    assert wire.endswith(ROUTE_JSON)


class _FailingRoutes(RouteTable):
    """A route table with a bug in 105: the request boundary must absorb it."""

    __slots__ = ()

    def route(self, topic: str) -> TopicRouteData | None:
        if topic == "boom":
            raise RuntimeError("a bug in the route table")
        return super().route(topic)


def test_an_unexpected_exception_is_system_error_and_the_next_request_is_served(
    caplog: pytest.LogCaptureFixture,
) -> None:
    requests = Requests()
    requests.routes = _FailingRoutes()
    requests.handler = NamesrvRequestHandler(requests.routes)
    requests.register()
    with caplog.at_level(logging.ERROR, logger="mqbox.namesrv"):
        failed = requests.answer(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "boom"})
    assert failed.code == ResponseCode.SYSTEM_ERROR
    assert failed.remark == "mqbox: unexpected RuntimeError handling this request"
    assert "a bug in the route table" in caplog.text  # the traceback is logged
    assert requests.handler.statistics().failure_count == 1
    served = requests.answer(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "test"})
    assert served.code == ResponseCode.SUCCESS
    assert served.body == ROUTE_JSON


def test_a_registration_past_the_broker_limit_is_refused_and_changes_nothing() -> None:
    requests = Requests()
    requests.routes = RouteTable(route_limits=RouteLimits(broker_count_max=1, topic_count_max=2))
    requests.handler = NamesrvRequestHandler(requests.routes)
    assert requests.register().code == ResponseCode.SUCCESS
    refused = requests.register(broker_id=1)
    assert refused.code == ResponseCode.SYSTEM_ERROR
    assert (refused.remark or "").endswith("mqboxNamesrvBrokerCountMax=1")
    cluster = ClusterInfo.from_json(requests.answer(RequestCode.GET_BROKER_CLUSTER_INFO).body)
    assert list(cluster.broker_addr_table["broker-a"].broker_addrs.values()) == ["127.0.0.1:10911"]
    past = requests.register(*(TopicConfig(f"t{n}", 4, 4, 6) for n in range(3)), counter=2)
    assert past.code == ResponseCode.SUCCESS
    statistics = requests.handler.statistics()
    assert (statistics.registration_refused_count, statistics.topic_refused_count) == (1, 2)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([int(code) for code in HANDLED_CODES]),
    st.dictionaries(
        st.sampled_from(EXT_KEYS),
        st.one_of(st.sampled_from(EXT_VALUES), st.text(max_size=8)),
        max_size=len(EXT_KEYS),
    ),
    st.one_of(st.sampled_from(REGISTER_BODIES), st.binary(max_size=64)),
)
def test_no_request_reaches_the_boundary(code: int, ext: dict[str, str], body: bytes) -> None:
    """Any header values and bodies, good or bad, get an answer from the handler itself: the
    request boundary is a last resort, and any request that reaches it is a bug."""
    requests = Requests()
    requests.register()
    response = requests.call(code, ext, body)
    assert response is not None
    encode_command(response)
    for follow_up in (RequestCode.GET_ROUTEINFO_BY_TOPIC, RequestCode.GET_BROKER_CLUSTER_INFO):
        answer = requests.answer(follow_up, {"topic": ext.get("topic", "test")})
        encode_command(answer)
    assert requests.handler.statistics().failure_count == 0
    requests.routes.check_invariants()
