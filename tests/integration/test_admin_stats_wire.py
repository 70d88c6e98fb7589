"""Goal: RocketMQ's statistics and broker admin codes answer with Java 4.9's bodies, so mqadmin
and rocketmq-dashboard read them with their own classes: GET_BROKER_RUNTIME_INFO (28),
GET_BROKER_CONFIG / UPDATE_BROKER_CONFIG (26 / 25, the update persisted in the home's
broker.conf and in force in the send processor within a tick), GET_TOPIC_STATS_INFO (202),
GET_CONSUMER_CONNECTION_LIST (203), GET_PRODUCER_CONNECTION_LIST (204), GET_CONSUME_STATS (208),
QUERY_TOPIC_CONSUME_BY_WHO (300), GET_BROKER_CONSUME_STATS (317),
INVOKE_BROKER_TO_GET_CONSUMER_STATUS (223, answered by mqbox's client to 221),
CONSUME_MESSAGE_DIRECTLY (309, relayed to mqbox's push consumer and its handler),
GET_SYSTEM_TOPIC_LIST_FROM_BROKER (305), and on the name server GET_TOPICS_BY_CLUSTER (224),
GET_SYSTEM_TOPIC_LIST_FROM_NS (304) and GET_KVLIST_BY_NAMESPACE (219); unknown groups and
topics and bad headers get RocketMQ's codes.

Method: the real appliance (supervisor, every role, the real name server) on port 0 in a home of
this module's; mqbox's own Producer and PushConsumer as the clients whose heartbeats the broker
records; raw requests with RemotingClient. Each body is read with admin_bodies.loads_fastjson and
its fields compared with the Java class's field list, written below with the class it comes
from (org.apache.rocketmq.common.admin and .protocol.body, RocketMQ 4.9.7), names and JSON types.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any, Final

import pytest

from mqbox.client import ConsumeResult, Producer, PushConsumer, ReceivedMessage
from mqbox.client.remoting import RemotingClient
from mqbox.config import parse_properties
from mqbox.protocol.admin_bodies import loads_fastjson
from mqbox.protocol.codes import PUT_KV_CONFIG, RequestCode, ResponseCode
from mqbox.protocol.command import RemotingCommand, loads_json
from mqbox.protocol.headers import MessageQueue
from mqbox.server.runtime_config import home_broker_conf
from tests.support.appliance import BROKER_CONF, Appliance, running_appliance
from tests.support.consumers import Collector, group_name
from tests.support.read_back import create_topic
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

TOPIC: Final = "StatsTopic"
QUEUE_COUNT: Final = 2
MESSAGE_COUNT: Final = 6
DELIVERY_S: Final = 30.0
FAST: Final[dict[str, Any]] = {"persist_interval_ms": 200, "rebalance_interval_ms": 1000}

# Java's field lists: name -> JSON type of what fastjson writes (long and int: int, double:
# float, String and enums: str, boolean: bool, Set and List: list, Map and beans: dict).
TOPIC_OFFSET: Final[Mapping[str, type]] = {  # common.admin.TopicOffset
    "minOffset": int,
    "maxOffset": int,
    "lastUpdateTimestamp": int,
}
TOPIC_STATS_TABLE: Final[Mapping[str, type]] = {"offsetTable": dict}  # common.admin.TopicStatsTable
OFFSET_WRAPPER: Final[Mapping[str, type]] = {  # common.admin.OffsetWrapper
    "brokerOffset": int,
    "consumerOffset": int,
    "lastTimestamp": int,
}
CONSUME_STATS: Final[Mapping[str, type]] = {
    "offsetTable": dict,
    "consumeTps": float,
}  # common.admin.ConsumeStats
CONNECTION: Final[
    Mapping[str, type]
] = {  # protocol.body.Connection (language: LanguageCode by name)
    "clientId": str,
    "clientAddr": str,
    "language": str,
    "version": int,
}
CONSUMER_CONNECTION: Final[Mapping[str, type]] = {  # protocol.body.ConsumerConnection
    "connectionSet": list,
    "subscriptionTable": dict,
    "consumeType": str,
    "messageModel": str,
    "consumeFromWhere": str,
}
SUBSCRIPTION_DATA: Final[
    Mapping[str, type]
] = {  # protocol.heartbeat.SubscriptionData (filterClassSource: not sent)
    "classFilterMode": bool,
    "topic": str,
    "subString": str,
    "tagsSet": list,
    "codeSet": list,
    "subVersion": int,
    "expressionType": str,
}
PRODUCER_CONNECTION: Final[Mapping[str, type]] = {
    "connectionSet": list
}  # protocol.body.ProducerConnection
GROUP_LIST: Final[Mapping[str, type]] = {"groupList": list}  # protocol.body.GroupList
CONSUME_STATS_LIST: Final[Mapping[str, type]] = {  # protocol.body.ConsumeStatsList
    "consumeStatsList": list,
    "brokerAddr": str,
    "totalDiff": int,
}
GET_CONSUMER_STATUS_BODY: Final[Mapping[str, type]] = {  # protocol.body.GetConsumerStatusBody
    "messageQueueTable": dict,
    "consumerTable": dict,
}
CONSUME_MESSAGE_DIRECTLY_RESULT: Final[
    Mapping[str, type]
] = {  # protocol.body.ConsumeMessageDirectlyResult
    "order": bool,
    "autoCommit": bool,
    "consumeResult": str,  # CMResult by name
    "remark": str,
    "spentTimeMills": int,
}
KV_TABLE: Final[Mapping[str, type]] = {"table": dict}  # protocol.body.KVTable
TOPIC_LIST: Final[Mapping[str, type]] = {
    "topicList": list
}  # protocol.body.TopicList (brokerAddr: when set)
CM_RESULTS: Final = {"CR_SUCCESS", "CR_LATER", "CR_ROLLBACK", "CR_COMMIT"}
# Keys of AdminBrokerProcessor.prepareRuntimeInfo / DefaultMessageStore.getRuntimeInfo that
# mqbox fills (the statistics keys come with issue 16's counters).
RUNTIME_KEYS: Final = {
    "brokerVersionDesc",
    "brokerVersion",
    "bootTimestamp",
    "runtime",
    "commitLogMinOffset",
    "commitLogMaxOffset",
    "remainHowManyDataToFlush",
    "dispatchBehindBytes",
    "commitLogDiskRatio",
    "consumeQueueDiskRatio",
    "commitLogDirCapacity",
    "earliestMessageTimeStamp",
    "startAcceptSendRequestTimeStamp",
}


def assert_java_fields(value: object, fields: Mapping[str, type], where: str) -> dict[str, Any]:
    """`value` is an object with exactly the Java class's fields, each of its JSON type."""
    assert isinstance(value, dict), f"{where}: {value!r}"
    assert set(value) == set(fields), f"{where}: {sorted(value)} != {sorted(fields)}"
    for name, kind in fields.items():
        item = value[name]
        assert isinstance(item, kind), f"{where}.{name}: {item!r} is not {kind.__name__}"
        assert kind is bool or not isinstance(item, bool), f"{where}.{name}: {item!r}"
    return value


def queue_rows(table: dict[Any, Any], row_fields: Mapping[str, type]) -> dict[int, dict[str, Any]]:
    """An offsetTable's rows by queue id, each key a MessageQueue of TOPIC, each row checked."""
    rows: dict[int, dict[str, Any]] = {}
    for queue, row in table.items():
        assert isinstance(queue, MessageQueue), queue
        assert queue.broker_name == "broker-a"
        rows[queue.queue_id] = assert_java_fields(row, row_fields, f"row {queue}")
    return rows


def ok(response: RemotingCommand) -> Any:
    assert response.code == ResponseCode.SUCCESS, (response.code, response.remark)
    return loads_fastjson(response.body)


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    pids: list[int] = []
    with running_appliance(tmp_path_factory.mktemp("admin-stats"), pids, BROKER_CONF) as running:
        yield running


@pytest.fixture(scope="module")
def broker(appliance: Appliance) -> Iterator[RemotingClient]:
    with RemotingClient(appliance.broker_address) as client:
        yield client


@pytest.fixture(scope="module")
def namesrv(appliance: Appliance) -> Iterator[RemotingClient]:
    with RemotingClient(appliance.namesrv_address) as client:
        yield client


class Clients:
    """A producer and a push consumer of TOPIC that consumed every message sent."""

    def __init__(self, producer: Producer, consumer: PushConsumer, collector: Collector) -> None:
        self.producer = producer
        self.consumer = consumer
        self.collector = collector
        self.offset_msg_ids: list[str] = []


@pytest.fixture(scope="module")
def clients(appliance: Appliance) -> Iterator[Clients]:
    create_topic(appliance, TOPIC, QUEUE_COUNT)
    collector = Collector(answer=lambda _: ConsumeResult.SUCCESS)
    producer = Producer(group_name("StatsPG"), appliance.namesrv_address)
    consumer = PushConsumer(group_name("StatsCG"), appliance.namesrv_address, **FAST)
    consumer.subscribe(TOPIC, "*", collector)
    with contextlib.ExitStack() as stack:
        producer.start()
        stack.callback(producer.shutdown)
        consumer.start()
        stack.callback(consumer.shutdown)
        running = Clients(producer, consumer, collector)
        for number in range(MESSAGE_COUNT):
            result = producer.send(TOPIC, f"stats {number}".encode())
            running.offset_msg_ids.append(result.offset_msg_id)
        wait_until(lambda: collector.count() >= MESSAGE_COUNT, "every message", DELIVERY_S)
        yield running


def committed_everything(broker: RemotingClient, group: str) -> bool:
    stats = ok(broker.invoke(RequestCode.GET_CONSUME_STATS, {"consumerGroup": group}))
    rows = [row for queue, row in stats["offsetTable"].items() if queue.topic == TOPIC]
    return bool(sum(row["consumerOffset"] for row in rows) == MESSAGE_COUNT)


def sends_to_a_new_topic(producer: Producer) -> bool:
    """Whether a send to a topic nobody made yet is accepted (autoCreateTopicEnable)."""
    with contextlib.suppress(Exception):
        producer.send(group_name("AutoTopic"), b"x")
        return True
    return False


# --- the broker as a whole ---------------------------------------------------------------------


def test_runtime_info_is_a_kv_table_of_javas_keys(broker: RemotingClient, clients: Clients) -> None:
    document = loads_json(broker.invoke(RequestCode.GET_BROKER_RUNTIME_INFO).body)
    table = assert_java_fields(document, KV_TABLE, "KVTable")["table"]
    assert all(isinstance(value, str) for value in table.values())
    assert set(table) >= RUNTIME_KEYS, sorted(RUNTIME_KEYS - set(table))
    assert table["brokerVersionDesc"] == "V4_5_2"
    assert int(table["commitLogMaxOffset"]) > int(table["commitLogMinOffset"]) >= 0
    assert 0.0 < float(table["commitLogDiskRatio"]) <= 1.0
    assert table["runtime"].startswith("[ 0 days, ")
    assert int(table["earliestMessageTimeStamp"]) > 0
    assert any(key.startswith("commitLogDiskRatio_/") for key in table)


def test_broker_config_is_properties_text_with_a_version(broker: RemotingClient) -> None:
    response = broker.invoke(RequestCode.GET_BROKER_CONFIG)
    assert response.code == ResponseCode.SUCCESS
    version = loads_json(response.ext_fields["version"].encode())
    assert set(version) == {"counter", "timestamp"}  # common.DataVersion
    properties = parse_properties(response.body.decode())
    assert properties["brokerName"] == "broker-a"
    assert properties["mappedFileSizeCommitLog"] == "16777216"
    assert properties["mappedFileSizeConsumeQueue"] == "60000"
    assert properties["autoCreateTopicEnable"] == "true"


def test_an_update_of_a_runtime_key_is_persisted_and_in_force_at_once(
    appliance: Appliance, broker: RemotingClient, clients: Clients
) -> None:
    def update(text: str) -> RemotingCommand:
        return broker.invoke(RequestCode.UPDATE_BROKER_CONFIG, {}, body=text.encode())

    assert update("autoCreateTopicEnable=false\n").code == ResponseCode.SUCCESS
    try:
        shown = parse_properties(broker.invoke(RequestCode.GET_BROKER_CONFIG).body.decode())
        assert shown["autoCreateTopicEnable"] == "false"
        saved = parse_properties(home_broker_conf(appliance.home).read_text())
        assert saved["autoCreateTopicEnable"] == "false"
        assert saved["mapedFileSizeCommitLog"] == "16777216"  # the other lines stay
        wait_until(
            lambda: not sends_to_a_new_topic(clients.producer),
            "the send processor to refuse auto-creation",
            10.0,
        )
    finally:
        assert update("autoCreateTopicEnable=true\n").code == ResponseCode.SUCCESS
    wait_until(
        lambda: sends_to_a_new_topic(clients.producer),
        "the send processor to auto-create again",
        10.0,
    )
    for text, word in (
        ("listenPort=1\n", "listenPort is a start-time key"),
        ("noSuchKey=1\n", "noSuchKey is not a key mqbox knows"),
        ("autoCreateSubscriptionGroup=maybe\n", "autoCreateSubscriptionGroup"),
    ):
        refused = update(text)
        assert refused.code == ResponseCode.SYSTEM_ERROR, text
        assert refused.remark is not None
        assert word in refused.remark
    assert update("").code == ResponseCode.SUCCESS


def test_system_topics_of_the_broker_are_a_topic_list(broker: RemotingClient) -> None:
    document = ok(broker.invoke(RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_BROKER))
    assert_java_fields(document, TOPIC_LIST, "TopicList")
    assert "SCHEDULE_TOPIC_XXXX" in document["topicList"]


# --- topics and groups -------------------------------------------------------------------------


def test_topic_stats_has_a_topic_offset_per_queue(broker: RemotingClient, clients: Clients) -> None:
    document = ok(broker.invoke(RequestCode.GET_TOPIC_STATS_INFO, {"topic": TOPIC}))
    table = assert_java_fields(document, TOPIC_STATS_TABLE, "TopicStatsTable")["offsetTable"]
    rows = queue_rows(table, TOPIC_OFFSET)
    assert sorted(rows) == list(range(QUEUE_COUNT))
    assert sum(row["maxOffset"] for row in rows.values()) == MESSAGE_COUNT
    assert all(row["lastUpdateTimestamp"] > 0 for row in rows.values() if row["maxOffset"])
    unknown = broker.invoke(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "NoSuchStatsTopic"})
    assert (unknown.code, unknown.remark) == (
        ResponseCode.TOPIC_NOT_EXIST,
        "topic[NoSuchStatsTopic] not exist",
    )
    assert broker.invoke(RequestCode.GET_TOPIC_STATS_INFO, {}).code == ResponseCode.SYSTEM_ERROR


def test_consumer_connection_lists_the_member_and_its_subscriptions(
    broker: RemotingClient, clients: Clients
) -> None:
    group = clients.consumer.group
    document = ok(broker.invoke(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": group}))
    assert_java_fields(document, CONSUMER_CONNECTION, "ConsumerConnection")
    (member,) = document["connectionSet"]
    assert_java_fields(member, CONNECTION, "Connection")
    assert member["clientId"] == clients.consumer.client_id
    assert member["clientAddr"].startswith("127.0.0.1:")
    assert member["language"] == "PYTHON"
    assert (document["consumeType"], document["messageModel"]) == (
        "CONSUME_PASSIVELY",
        "CLUSTERING",
    )
    subscription = document["subscriptionTable"][TOPIC]
    assert_java_fields(subscription, SUBSCRIPTION_DATA, "SubscriptionData")
    assert subscription["subString"] == "*"
    offline = broker.invoke(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "Nobody"})
    assert (offline.code, offline.remark) == (
        ResponseCode.CONSUMER_NOT_ONLINE,
        "the consumer group[Nobody] not online",
    )
    bad = broker.invoke(RequestCode.GET_CONSUMER_CONNECTION_LIST, {})
    assert bad.code == ResponseCode.SYSTEM_ERROR


def test_producer_connection_comes_from_the_producers_heartbeat(
    broker: RemotingClient, clients: Clients
) -> None:
    group = clients.producer.group
    ext = {"producerGroup": group}

    def listed() -> bool:
        return broker.invoke(RequestCode.GET_PRODUCER_CONNECTION_LIST, ext).code == 0

    wait_until(listed, "the producer's heartbeat", 10.0)
    document = ok(broker.invoke(RequestCode.GET_PRODUCER_CONNECTION_LIST, ext))
    assert_java_fields(document, PRODUCER_CONNECTION, "ProducerConnection")
    (member,) = document["connectionSet"]
    assert assert_java_fields(member, CONNECTION, "Connection")["clientId"] == (
        clients.producer.instance.client_id
    )
    unknown = broker.invoke(RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": "None1"})
    assert (unknown.code, unknown.remark) == (
        ResponseCode.SYSTEM_ERROR,
        "the producer group[None1] not exist",
    )


def test_consume_stats_show_what_the_group_committed(
    broker: RemotingClient, clients: Clients
) -> None:
    group = clients.consumer.group
    wait_until(lambda: committed_everything(broker, group), "the group's commits", DELIVERY_S)
    ext = {"consumerGroup": group, "topic": TOPIC}
    document = ok(broker.invoke(RequestCode.GET_CONSUME_STATS, ext))
    table = assert_java_fields(document, CONSUME_STATS, "ConsumeStats")["offsetTable"]
    rows = queue_rows(table, OFFSET_WRAPPER)
    assert sorted(rows) == list(range(QUEUE_COUNT))
    for row in rows.values():
        assert row["brokerOffset"] == row["consumerOffset"]
        assert (row["lastTimestamp"] > 0) == (row["consumerOffset"] > 0)
    nobody = ok(broker.invoke(RequestCode.GET_CONSUME_STATS, {"consumerGroup": "Nobody"}))
    assert nobody == {"consumeTps": 0.0, "offsetTable": {}}
    assert broker.invoke(RequestCode.GET_CONSUME_STATS, {}).code == ResponseCode.SYSTEM_ERROR


def test_topic_consumed_by_names_the_group(broker: RemotingClient, clients: Clients) -> None:
    document = ok(broker.invoke(RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": TOPIC}))
    assert_java_fields(document, GROUP_LIST, "GroupList")
    assert clients.consumer.group in document["groupList"]
    nobody = ok(broker.invoke(RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": "NobodysTopic"}))
    assert nobody == {"groupList": []}


def test_broker_consume_stats_list_every_group(broker: RemotingClient, clients: Clients) -> None:
    group = clients.consumer.group
    wait_until(lambda: committed_everything(broker, group), "the group's commits", DELIVERY_S)
    document = ok(broker.invoke(RequestCode.GET_BROKER_CONSUME_STATS, {"isOrder": "false"}))
    assert_java_fields(document, CONSUME_STATS_LIST, "ConsumeStatsList")
    by_group = {
        name: stats for entry in document["consumeStatsList"] for name, stats in entry.items()
    }
    for stats in by_group[group]:
        table = assert_java_fields(stats, CONSUME_STATS, "ConsumeStats")["offsetTable"]
        queue_rows(table, OFFSET_WRAPPER)
    assert document["totalDiff"] >= 0
    order_only = ok(broker.invoke(RequestCode.GET_BROKER_CONSUME_STATS, {"isOrder": "true"}))
    assert all(not stats for entry in order_only["consumeStatsList"] for stats in entry.values())
    assert broker.invoke(RequestCode.GET_BROKER_CONSUME_STATS, {}).code == 1


# --- calls to clients --------------------------------------------------------------------------


def test_consumer_status_gathers_each_members_answer_to_221(
    broker: RemotingClient, clients: Clients
) -> None:
    group = clients.consumer.group
    wait_until(lambda: committed_everything(broker, group), "the group's commits", DELIVERY_S)
    ext = {"topic": TOPIC, "group": group}
    document = ok(broker.invoke(RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, ext))
    assert_java_fields(document, GET_CONSUMER_STATUS_BODY, "GetConsumerStatusBody")
    table = document["consumerTable"][clients.consumer.client_id]
    assert {queue.topic for queue in table} == {TOPIC}
    assert sum(table.values()) == MESSAGE_COUNT
    other = ok(
        broker.invoke(
            RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, {**ext, "clientAddr": "someone"}
        )
    )
    assert other["consumerTable"] == {}
    nobody = broker.invoke(
        RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, {"topic": TOPIC, "group": "Nobody"}
    )
    assert (nobody.code, nobody.remark) == (
        ResponseCode.SYSTEM_ERROR,
        "No Any Consumer online in the consumer group: [Nobody]",
    )


def test_consume_message_directly_runs_the_handler_and_answers_javas_result(
    broker: RemotingClient, clients: Clients
) -> None:
    group = clients.consumer.group
    before = clients.collector.count()
    ext = {
        "consumerGroup": group,
        "clientId": clients.consumer.client_id,
        "msgId": clients.offset_msg_ids[0],
    }
    document = ok(broker.invoke(RequestCode.CONSUME_MESSAGE_DIRECTLY, ext))
    assert_java_fields(document, CONSUME_MESSAGE_DIRECTLY_RESULT, "ConsumeMessageDirectlyResult")
    assert document["consumeResult"] == "CR_SUCCESS"
    assert document["consumeResult"] in CM_RESULTS
    assert clients.collector.count() == before + 1
    seen: ReceivedMessage | Any = clients.collector.seen()[-1]
    assert seen.body == b"stats 0"
    offline = broker.invoke(RequestCode.CONSUME_MESSAGE_DIRECTLY, {**ext, "clientId": "nobody"})
    assert (offline.code, offline.remark) == (
        ResponseCode.SYSTEM_ERROR,
        f"The Consumer <{group}> <nobody> not online",
    )
    bad_id = broker.invoke(RequestCode.CONSUME_MESSAGE_DIRECTLY, {**ext, "msgId": "XYZ"})
    assert bad_id.code == ResponseCode.SYSTEM_ERROR


# --- the name server ---------------------------------------------------------------------------


def test_name_server_lists_topics_by_cluster_and_system_topics(
    namesrv: RemotingClient, clients: Clients
) -> None:
    def routed() -> bool:
        found = ok(namesrv.invoke(RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": "DefaultCluster"}))
        return TOPIC in found["topicList"]

    wait_until(routed, "the topic's registration", 40.0)
    document = ok(namesrv.invoke(RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": "DefaultCluster"}))
    assert_java_fields(document, TOPIC_LIST, "TopicList")
    none = ok(namesrv.invoke(RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": "NoSuchCluster"}))
    assert none == {"topicList": []}
    assert namesrv.invoke(RequestCode.GET_TOPICS_BY_CLUSTER, {}).code == ResponseCode.SYSTEM_ERROR
    system = ok(namesrv.invoke(RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS))
    assert_java_fields(system, {**TOPIC_LIST, "brokerAddr": str}, "TopicList")
    assert {"DefaultCluster", "broker-a"} <= set(system["topicList"])
    assert system["brokerAddr"] == clients.producer.instance.master_address("broker-a")


def test_name_server_kv_list_by_namespace(namesrv: RemotingClient) -> None:
    put = {"namespace": "STATS_NS", "key": "k1", "value": "v1"}
    assert namesrv.invoke(PUT_KV_CONFIG, put).code == ResponseCode.SUCCESS
    document = ok(namesrv.invoke(RequestCode.GET_KVLIST_BY_NAMESPACE, {"namespace": "STATS_NS"}))
    assert assert_java_fields(document, KV_TABLE, "KVTable")["table"] == {"k1": "v1"}
    empty = namesrv.invoke(RequestCode.GET_KVLIST_BY_NAMESPACE, {"namespace": "EMPTY_NS"})
    assert (empty.code, empty.remark) == (
        ResponseCode.QUERY_NOT_FOUND,
        "No config item, Namespace: EMPTY_NS",
    )
