"""Goal: over the wire, topic admin cannot break the broker through its system topics: setting
TBW102 to perm 0 (or without INHERIT), replacing SCHEDULE_TOPIC_XXXX or an RMQ_SYS_* topic, or
deleting any of them gets code 1 with Java 4.9.x's remark and changes nothing, so a send to a
new topic is still auto-created from TBW102 afterwards; a group's %RETRY% topic keeps read and
write, its %DLQ% topic write, while an ordinary topic may still be set to any perm.

Method: one real appliance (every role, the real name server, port 0); raw requests through
mqbox.client.remoting; the topic table read back with GET_ALL_TOPIC_CONFIG (21).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from mqbox.client import admin_api
from mqbox.client.remoting import RemotingClient
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.protocol.headers import (
    DeleteTopicRequestHeader,
    SendMessageRequestHeader,
    UpdateAndCreateTopicRequestHeader,
)
from tests.conftest import unique_name
from tests.support.appliance import Appliance, running_appliance

pytestmark = pytest.mark.integration

REQUEST_TIMEOUT_MS = 5000
# What a broker named broker-a in DefaultCluster (tests/support/appliance.py) refuses to touch.
SYSTEM_TOPICS = (
    "TBW102",
    "SCHEDULE_TOPIC_XXXX",
    "RMQ_SYS_TRACE_TOPIC",
    "RMQ_SYS_TRANS_HALF_TOPIC",
    "OFFSET_MOVED_EVENT",
    "SELF_TEST_TOPIC",
    "BenchmarkTest",
    "rmq_sys_anything",
    "DefaultCluster",
    "broker-a",
)


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    pids: list[int] = []
    with running_appliance(tmp_path_factory.mktemp("system-topics"), pids) as running:
        yield running


@pytest.fixture
def broker(appliance: Appliance) -> Iterator[RemotingClient]:
    with RemotingClient(appliance.broker_address, REQUEST_TIMEOUT_MS) as client:
        yield client


def update(broker: RemotingClient, topic: str, perm: int, queue_count: int = 8) -> tuple[int, str]:
    header = UpdateAndCreateTopicRequestHeader(topic, "TBW102", queue_count, queue_count, perm)
    response = broker.invoke(RequestCode.UPDATE_AND_CREATE_TOPIC, header.to_ext())
    return response.code, response.remark or ""


def delete(broker: RemotingClient, topic: str) -> tuple[int, str]:
    header = DeleteTopicRequestHeader(topic)
    response = broker.invoke(RequestCode.DELETE_TOPIC_IN_BROKER, header.to_ext())
    return response.code, response.remark or ""


def topic_table(broker: RemotingClient) -> dict[str, tuple[int, int, int]]:
    """topic -> (read queues, write queues, perm), as GET_ALL_TOPIC_CONFIG answers."""
    table = admin_api.all_topic_config(broker).topic_config_table
    return {
        name: (config.read_queue_nums, config.write_queue_nums, config.perm)
        for name, config in table.items()
    }


def send_new_topic(broker: RemotingClient) -> tuple[int, str]:
    header = SendMessageRequestHeader(
        "PG", unique_name("Fresh"), "TBW102", 4, 0, 0, int(time.time() * 1000), 0
    )
    response = broker.invoke(RequestCode.SEND_MESSAGE, header.to_ext(), b"after the probes")
    return response.code, response.remark or ""


@pytest.mark.parametrize("perm", [0, 6, 2])
def test_tbw102_cannot_lose_its_permission(broker: RemotingClient, perm: int) -> None:
    before = topic_table(broker)
    code, remark = update(broker, "TBW102", perm)
    assert code == ResponseCode.SYSTEM_ERROR
    assert remark == "The topic[TBW102] is conflict with system topic."
    assert topic_table(broker)["TBW102"] == before["TBW102"] == (8, 8, 7)
    assert send_new_topic(broker)[0] == ResponseCode.SUCCESS, send_new_topic(broker)


@pytest.mark.parametrize("topic", SYSTEM_TOPICS)
def test_system_topics_are_neither_replaced_nor_deleted(broker: RemotingClient, topic: str) -> None:
    before = topic_table(broker)
    for code, remark in (update(broker, topic, 0, 1), delete(broker, topic)):
        assert code == ResponseCode.SYSTEM_ERROR
        assert remark == f"The topic[{topic}] is conflict with system topic."
    assert topic_table(broker).get(topic) == before.get(topic)
    assert send_new_topic(broker)[0] == ResponseCode.SUCCESS, send_new_topic(broker)


def test_group_topics_keep_what_the_broker_needs(broker: RemotingClient) -> None:
    group = unique_name("CG")
    for topic, perm in (("%RETRY%" + group, 0), ("%RETRY%" + group, 4), ("%DLQ%" + group, 4)):
        code, remark = update(broker, topic, perm, 1)
        assert code == ResponseCode.SYSTEM_ERROR, (topic, perm)
        assert f"perm = {perm}" in remark
        assert topic not in topic_table(broker)
    assert update(broker, "%RETRY%" + group, 6, 1)[0] == ResponseCode.SUCCESS
    assert update(broker, "%DLQ%" + group, 2, 1)[0] == ResponseCode.SUCCESS
    assert topic_table(broker)["%DLQ%" + group] == (1, 1, 2)


def test_an_ordinary_topic_may_take_any_perm_and_be_deleted(broker: RemotingClient) -> None:
    topic = unique_name("Ordinary")
    assert update(broker, topic, 0)[0] == ResponseCode.SUCCESS
    assert topic_table(broker)[topic] == (8, 8, 0)
    assert delete(broker, topic)[0] == ResponseCode.SUCCESS
    assert topic not in topic_table(broker)
