"""Goal: a master and its slave behave on the wire as RocketMQ 4.9's do (docs/replication.md,
"Slave service"): the admin codes 43, 45, 200, 201 and 207 answer with Java's field names and
types; the slave is in the route as brokerId 1 of the master's broker name; it refuses sends
(14, Java's remark), send-backs (1) and changes of topics and groups (1, Java's remark); it copies
the master's topics, consumer offsets, delay offsets and subscription groups (21, 43, 45, 201)
within a few sync rounds; a pull to it outside its (empty) queue keeps the consumer's offset and
suggests the master; with slaveReadEnable and accessMessageInMemoryMaxRatio=0 the master suggests
whichBrokerWhenConsumeSlowly for every pull that found messages, the group's brokerId otherwise.

Method: a real name server and two real appliances (tests/support/master_slave.py), the slave's
sync every 500 ms; requests through mqbox.client's RemotingClient and typed admin calls, bodies
checked as raw JSON. Messages are not replicated yet (the HA stream is another branch), so the
slave's queues are empty here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from mqbox.client.admin_api import (
    all_consumer_offsets,
    all_delay_offsets,
    all_subscription_groups,
    all_topic_config,
    update_and_create_topic,
    update_subscription_group,
)
from mqbox.client.namesrv_api import get_route
from mqbox.client.remoting import RemotingClient
from mqbox.protocol.codes import PULL_FLAG_SUBSCRIPTION, RequestCode, ResponseCode
from mqbox.protocol.headers import (
    ConsumerSendMsgBackRequestHeader,
    DeleteSubscriptionGroupRequestHeader,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    SendMessageRequestHeader,
    SubscriptionGroupConfig,
    UpdateAndCreateTopicRequestHeader,
    UpdateConsumerOffsetRequestHeader,
)
from tests.conftest import unique_name
from tests.support.appliance import sigkill_pids
from tests.support.master_slave import (
    BROKER_NAME,
    MASTER_CONF,
    MasterSlave,
    running_master_slave,
)
from tests.support.read_back import wait_dispatched
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

SYNC_WAIT_S = 30.0
SLAVE_REMARK_PREFIX = "service not available now. It may be caused by one of the following reasons"
READ_ONLY_REMARK = (
    "Can't modify topic or subscription group from slave broker, please execute it from master "
    "broker."
)
# Java's SubscriptionGroupConfig: each field and the JSON type fastjson writes for it.
GROUP_FIELD_TYPES = {
    "groupName": str,
    "consumeEnable": bool,
    "consumeFromMinEnable": bool,
    "consumeBroadcastEnable": bool,
    "retryQueueNums": int,
    "retryMaxTimes": int,
    "brokerId": int,
    "whichBrokerWhenConsumeSlowly": int,
    "notifyConsumerIdsChangedEnable": bool,
}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MasterSlave]:
    """One master (slaveReadEnable, ratio 0: every pull that finds messages is "behind") and its
    slave, shared by the module; every process is SIGKILLed by PID in the end."""
    pids: list[int] = []
    conf = MASTER_CONF + "slaveReadEnable=true\naccessMessageInMemoryMaxRatio=0\n"
    try:
        with running_master_slave(
            tmp_path_factory.mktemp("master-slave"), pids, master_conf=conf
        ) as running:
            yield running
    finally:
        sigkill_pids(pids)


@pytest.fixture
def suffix() -> str:
    """A name part of this test's own (topics and groups)."""
    return unique_name("slave")


@pytest.fixture
def master(pair: MasterSlave) -> Iterator[RemotingClient]:
    with RemotingClient(pair.master.broker_address) as client:
        yield client


@pytest.fixture
def slave(pair: MasterSlave) -> Iterator[RemotingClient]:
    with RemotingClient(pair.slave.broker_address) as client:
        yield client


def body_json(client: RemotingClient, code: int, ext: dict[str, str] | None = None) -> Any:
    response = client.invoke(code, ext or {})
    assert response.code == ResponseCode.SUCCESS, response.remark
    return json.loads(response.body)


def send_header(topic: str, properties: str = "") -> SendMessageRequestHeader:
    return SendMessageRequestHeader(
        "SlavePG", topic, "TBW102", 1, 0, 0, int(time.time() * 1000), 0, properties
    )


def create_topic(client: RemotingClient, topic: str, queue_count: int = 1) -> None:
    header = UpdateAndCreateTopicRequestHeader(topic, "TBW102", queue_count, queue_count, 6)
    update_and_create_topic(client, header)


def pull_answer(
    client: RemotingClient, group: str, topic: str, queue_index: int, count_max: int = 1
) -> tuple[int, PullMessageResponseHeader]:
    header = PullMessageRequestHeader(
        consumer_group=group,
        topic=topic,
        queue_id=0,
        queue_index=queue_index,
        message_count_max=count_max,
        sys_flag=PULL_FLAG_SUBSCRIPTION,
        commit_queue_index=0,
        suspend_timeout_ms=0,
        subscription="*",
        sub_version=0,
    )
    response = client.invoke(RequestCode.PULL_MESSAGE, header.to_ext())
    return response.code, PullMessageResponseHeader.from_ext(response.ext_fields)


def test_subscription_group_codes_answer_with_java_fields(
    master: RemotingClient, suffix: str
) -> None:
    group = f"G{suffix}"
    config = SubscriptionGroupConfig(
        group,
        consume_broadcast_enable=False,
        retry_queue_nums=3,
        which_broker_when_consume_slowly=2,
    )
    update_subscription_group(master, config)
    document = body_json(master, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
    assert set(document) == {"subscriptionGroupTable", "dataVersion"}
    assert {type(value) for value in document["dataVersion"].values()} == {int}
    assert set(document["dataVersion"]) == {"counter", "timestamp"}
    stored = document["subscriptionGroupTable"][group]
    assert {key: type(value) for key, value in stored.items()} == GROUP_FIELD_TYPES
    assert stored["retryQueueNums"] == 3
    assert stored["consumeBroadcastEnable"] is False
    assert stored["whichBrokerWhenConsumeSlowly"] == 2
    counter = document["dataVersion"]["counter"]

    commit = UpdateConsumerOffsetRequestHeader(group, "TBW102", 0, 7)
    assert master.invoke(RequestCode.UPDATE_CONSUMER_OFFSET, commit.to_ext()).code == 0
    delete = DeleteSubscriptionGroupRequestHeader(group, remove_offset=True)
    response = master.invoke(RequestCode.DELETE_SUBSCRIPTIONGROUP, delete.to_ext())
    assert response.code == ResponseCode.SUCCESS, response.remark
    after = all_subscription_groups(master)
    assert group not in after.subscription_group_table
    assert after.data_version.counter > counter
    assert f"TBW102@{group}" not in all_consumer_offsets(master).offset_table


def test_all_consumer_offsets_answer_with_java_fields(master: RemotingClient, suffix: str) -> None:
    group = f"G{suffix}"
    for queue_id, offset in ((0, 5), (1, 9)):
        commit = UpdateConsumerOffsetRequestHeader(group, "TBW102", queue_id, offset)
        assert master.invoke(RequestCode.UPDATE_CONSUMER_OFFSET, commit.to_ext()).code == 0
    document = body_json(master, RequestCode.GET_ALL_CONSUMER_OFFSET)
    assert set(document) == {"offsetTable"}
    assert document["offsetTable"][f"TBW102@{group}"] == {"0": 5, "1": 9}


def test_all_delay_offsets_answer_with_java_fields(
    pair: MasterSlave, master: RemotingClient, suffix: str
) -> None:
    topic = f"T{suffix}"
    create_topic(master, topic)
    header = send_header(topic, "DELAY\x011\x02")  # level 1: 1 s
    assert master.invoke(RequestCode.SEND_MESSAGE, header.to_ext(), b"later").code == 0

    def delivered() -> bool:
        document = body_json(master, RequestCode.GET_ALL_DELAY_OFFSET)
        assert set(document) == {"offsetTable"}
        return int(document["offsetTable"].get("1", 0)) >= 1

    wait_until(delivered, "the level-1 delay offset past the delivered message", SYNC_WAIT_S)
    document = body_json(master, RequestCode.GET_ALL_DELAY_OFFSET)
    assert all(
        key.isdigit() and type(value) is int for key, value in document["offsetTable"].items()
    )


def test_route_lists_the_slave_as_broker_id_1(pair: MasterSlave, master: RemotingClient) -> None:
    with RemotingClient(pair.namesrv_address) as namesrv:
        route = get_route(namesrv, "TBW102")
    assert route is not None
    (broker,) = [data for data in route.broker_datas if data.broker_name == BROKER_NAME]
    assert broker.broker_addrs == {0: pair.master.broker_address, 1: pair.slave.broker_address}


def test_slave_refuses_sends_with_javas_code_and_remark(slave: RemotingClient, suffix: str) -> None:
    header = send_header("TBW102")
    for code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2):
        ext = header.to_ext() if code == RequestCode.SEND_MESSAGE else header.to_ext_v2()
        response = slave.invoke(code, ext, b"refused")
        assert response.code == ResponseCode.SERVICE_NOT_AVAILABLE
        assert response.remark is not None
        assert response.remark.startswith(SLAVE_REMARK_PREFIX)
        assert "messages are put to the slave" in response.remark
    back = ConsumerSendMsgBackRequestHeader(f"G{suffix}", 0, 1)
    response = slave.invoke(RequestCode.CONSUMER_SEND_MSG_BACK, back.to_ext())
    assert (response.code, response.remark) == (ResponseCode.SYSTEM_ERROR, "SERVICE_NOT_AVAILABLE")


def test_slave_refuses_changes_of_topics_and_groups(slave: RemotingClient, suffix: str) -> None:
    header = UpdateAndCreateTopicRequestHeader(f"T{suffix}", "TBW102", 1, 1, 6)
    requests = [
        (RequestCode.UPDATE_AND_CREATE_TOPIC, header.to_ext(), b""),
        (RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "TBW102"}, b""),
        (
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
            {},
            SubscriptionGroupConfig(f"G{suffix}").to_json(),
        ),
        (RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": f"G{suffix}"}, b""),
    ]
    for code, ext, body in requests:
        response = slave.invoke(code, ext, body)
        assert (response.code, response.remark) == (ResponseCode.SYSTEM_ERROR, READ_ONLY_REMARK)


def test_slave_copies_the_masters_metadata(
    pair: MasterSlave, master: RemotingClient, slave: RemotingClient, suffix: str
) -> None:
    topic = f"T{suffix}"
    group = f"G{suffix}"
    create_topic(master, topic, queue_count=2)
    update_subscription_group(master, SubscriptionGroupConfig(group, retry_max_times=3))
    commit = UpdateConsumerOffsetRequestHeader(group, topic, 1, 42)
    assert master.invoke(RequestCode.UPDATE_CONSUMER_OFFSET, commit.to_ext()).code == 0
    header = send_header(topic, "DELAY\x011\x02")
    assert master.invoke(RequestCode.SEND_MESSAGE, header.to_ext(), b"later").code == 0

    def copied() -> bool:
        topics = all_topic_config(slave).topic_config_table
        groups = all_subscription_groups(slave).subscription_group_table
        offsets = all_consumer_offsets(slave).offset_table
        delay = all_delay_offsets(slave).offset_table
        return (
            topic in topics
            and topics[topic].read_queue_nums == 2
            and group in groups
            and groups[group].retry_max_times == 3
            and offsets.get(f"{topic}@{group}") == {1: 42}
            and delay == all_delay_offsets(master).offset_table
            and delay.get(1, 0) >= 1
        )

    wait_until(copied, "the master's topic, group, offsets and delay offsets on the slave", 60)
    # The topic table is the master's, version and all.
    assert all_topic_config(slave).data_version == all_topic_config(master).data_version


def test_master_suggests_the_slave_for_pulls_behind_the_memory_share(
    master: RemotingClient, suffix: str
) -> None:
    topic = f"T{suffix}"
    group = f"G{suffix}"
    create_topic(master, topic)
    for number in range(3):
        assert (
            master.invoke(
                RequestCode.SEND_MESSAGE, send_header(topic).to_ext(), b"%d" % number
            ).code
            == 0
        )
    # The pulls below read at 0, 3 (the end) and 1: all three messages must be pullable.
    wait_dispatched(master)
    code, answer = pull_answer(master, group, topic, 0)
    assert (code, answer.suggest_which_broker_id) == (ResponseCode.SUCCESS, 1)
    # Nothing scanned (the consumer is at the end): the group's brokerId, 0.
    code, answer = pull_answer(master, group, topic, 3)
    assert (code, answer.suggest_which_broker_id) == (ResponseCode.PULL_NOT_FOUND, 0)
    # The group's own setting decides which slave.
    update_subscription_group(
        master, SubscriptionGroupConfig(group, which_broker_when_consume_slowly=2)
    )
    code, answer = pull_answer(master, group, topic, 1)
    assert (code, answer.suggest_which_broker_id) == (ResponseCode.SUCCESS, 2)


def test_slave_pull_outside_its_queue_keeps_the_offset_and_suggests_the_master(
    pair: MasterSlave, master: RemotingClient, slave: RemotingClient, suffix: str
) -> None:
    topic = f"T{suffix}"
    create_topic(master, topic)
    wait_until(
        lambda: topic in all_topic_config(slave).topic_config_table,
        "the topic on the slave",
        SYNC_WAIT_S,
    )
    code, answer = pull_answer(slave, f"G{suffix}", topic, 5)
    assert code == ResponseCode.PULL_RETRY_IMMEDIATELY
    assert answer.next_begin_queue_index == 5
    assert answer.suggest_which_broker_id == 0
