"""Goal: on the real appliance, the admin requests behave on the wire as RocketMQ clients need:
a heartbeat puts the client in the consumer list (38); when one of two members disconnects, the
other gets NOTIFY_CONSUMER_IDS_CHANGED (40, oneway, ext consumerGroup) on its own connection;
UPDATE_CONSUMER_OFFSET then QUERY_CONSUMER_OFFSET returns the offset, and a new group gets 0/0
(checklist rule 7); a queue locked by one client is refused to another until unlocked; a topic
made with UPDATE_AND_CREATE_TOPIC shows in GET_ALL_TOPIC_CONFIG and, within a few seconds, in
the name server's route; committed offsets are in consumerOffset.json after an orderly stop; an
offset reset (mqbox's 10003 and Java's 222) reaches each live member of the group as a oneway
RESET_CONSUMER_CLIENT_OFFSET (220) on its own connection, with the body its language reads
(a JSON list for C++, Java's map keyed by queue for the others), and 222 follows Java's rules;
and GET_CONSUMER_RUNNING_INFO (307) goes to the consumer on its connection and comes back.

Method: `python -m mqbox.server.supervisor` with the broker's real topology and the real name
server, both on port 0, in a fresh home; clients are plain sockets with the protocol's client
codec (tests/support/front_client.py), the name server is asked with mqbox.client. The
supervisor is stopped with SIGTERM and every process it started is SIGKILLed by pid in the end;
its shared memory is swept.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqbox.client.namesrv_api import get_route
from mqbox.client.remoting import RemotingClient
from mqbox.protocol import RemotingCommand
from mqbox.protocol.codes import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUBSCRIPTION,
    ConsumeFromWhere,
    ConsumeType,
    LanguageCode,
    MessageModel,
    RequestCode,
    ResponseCode,
)
from mqbox.protocol.headers import (
    ConsumerData,
    ConsumerListBody,
    HeartbeatData,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageQueue,
    SendMessageRequestHeader,
    SubscriptionData,
    UpdateAndCreateTopicRequestHeader,
)
from mqbox.protocol.mqbox_codes import INVOKE_BROKER_TO_RESET_OFFSET, MQBOX_RESET_CONSUMER_OFFSET
from tests.support.appliance import Appliance, running_appliance
from tests.support.front_client import FrontClient
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

ROUTE_WAIT_S = 15.0


class WireClient(FrontClient):
    """A raw protocol client that sets aside the broker's requests (NOTIFY_CONSUMER_IDS_CHANGED)
    arriving between a request and its response."""

    def __init__(self, port: int) -> None:
        super().__init__("127.0.0.1", port)
        self.notices: list[RemotingCommand] = []

    def answer(
        self, code: int, ext: dict[str, str] | None = None, body: bytes = b""
    ) -> RemotingCommand:
        opaque = self.request(code, ext, body)
        while True:
            (command,) = self.responses(1)
            if command.flag & FLAG_RESPONSE and command.opaque == opaque:
                return command
            self.notices.append(command)

    def wait_notice(self, group: str) -> None:
        if not self.notices:
            self.notices.extend(self.responses(1))
        notice = self.notices.pop(0)
        assert notice.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED
        assert notice.flag == FLAG_ONEWAY
        assert notice.ext_fields == {"consumerGroup": group}


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    pids: list[int] = []
    with running_appliance(tmp_path_factory.mktemp("admin-wire"), pids) as running:
        yield running


def store_config_dir(appliance: Appliance) -> Path:
    matches = list(appliance.home.glob("**/config/topics.json"))
    assert len(matches) == 1, matches
    return matches[0].parent


# --- helpers ------------------------------------------------------------------------------------


def heartbeat_body(client_id: str, group: str) -> bytes:
    """A push consumer's heartbeat, as the C++ client sends it (enum numbers, no producers)."""
    data = HeartbeatData(
        client_id,
        (),
        (
            ConsumerData(
                group,
                ConsumeType.CONSUME_PASSIVELY,
                MessageModel.CLUSTERING,
                ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
                (
                    SubscriptionData("WireTopic", "TagA || TagB", ("TagA", "TagB"), 1),
                    SubscriptionData(f"%RETRY%{group}", "*", (), 1),
                ),
            ),
        ),
    )
    return data.to_json()


def heartbeat(client: WireClient, client_id: str, group: str) -> None:
    response = client.answer(RequestCode.HEART_BEAT, {}, heartbeat_body(client_id, group))
    assert response.code == ResponseCode.SUCCESS, response.remark


def heartbeat_as_cpp(client: WireClient, client_id: str, group: str) -> None:
    """The same heartbeat with the language the C++ client names in its header."""
    opaque = client.connection.next_opaque()
    body = heartbeat_body(client_id, group)
    client.send(
        RemotingCommand(RequestCode.HEART_BEAT, LanguageCode.CPP, 63, opaque, 0, None, {}, body)
    )
    while True:
        (command,) = client.responses(1)
        if command.flag & FLAG_RESPONSE and command.opaque == opaque:
            assert command.code == ResponseCode.SUCCESS, command.remark
            return
        client.notices.append(command)


def next_request(client: WireClient, code: int) -> RemotingCommand:
    """The next broker request of `code` on the client's connection, past the others."""
    deadline = time.monotonic() + 10
    while True:
        while client.notices:
            notice = client.notices.pop(0)
            if notice.code == code:
                return notice
        assert time.monotonic() < deadline, f"no broker request {code} came"
        client.notices.extend(client.responses(1))


def consumer_ids(client: WireClient, group: str) -> tuple[str, ...] | None:
    """The group's consumer list, or None for "no consumer for this group"."""
    command = client.answer(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
    if command.code == ResponseCode.SYSTEM_ERROR:
        assert command.remark == "no consumer for this group"
        return None
    assert command.code == ResponseCode.SUCCESS
    return ConsumerListBody.from_json(command.body).consumer_id_list


def create_topic(client: WireClient, topic: str, queue_count: int) -> None:
    header = UpdateAndCreateTopicRequestHeader(topic, "TBW102", queue_count, queue_count, 6)
    response = client.answer(RequestCode.UPDATE_AND_CREATE_TOPIC, header.to_ext())
    assert response.code == ResponseCode.SUCCESS, response.remark


# --- tests --------------------------------------------------------------------------------------


def test_a_heartbeat_puts_the_client_in_the_consumer_list(appliance: Appliance) -> None:
    client = WireClient(appliance.broker_port)
    try:
        assert consumer_ids(client, "WireListGroup") is None
        heartbeat(client, "100-127.0.0.1@DEFAULT", "WireListGroup")
        client.wait_notice("WireListGroup")
        assert consumer_ids(client, "WireListGroup") == ("100-127.0.0.1@DEFAULT",)
    finally:
        client.close()


def test_the_member_left_behind_hears_of_a_disconnect(appliance: Appliance) -> None:
    group = "WireNotifyGroup"
    staying = WireClient(appliance.broker_port)
    leaving = WireClient(appliance.broker_port)
    try:
        heartbeat(staying, "1-127.0.0.1@A", group)
        staying.wait_notice(group)
        heartbeat(leaving, "2-127.0.0.1@B", group)
        leaving.wait_notice(group)
        staying.wait_notice(group)
        assert consumer_ids(staying, group) == ("1-127.0.0.1@A", "2-127.0.0.1@B")
        leaving.close()
        staying.wait_notice(group)
        assert consumer_ids(staying, group) == ("1-127.0.0.1@A",)
    finally:
        staying.close()
        leaving.close()


def test_update_then_query_offset_and_a_new_group_starts_at_0(appliance: Appliance) -> None:
    client = WireClient(appliance.broker_port)
    try:
        create_topic(client, "WireOffsetTopic", 2)
        update = {
            "consumerGroup": "WireOffsetGroup",
            "topic": "WireOffsetTopic",
            "queueId": "1",
            "commitOffset": "17",
        }
        assert client.answer(RequestCode.UPDATE_CONSUMER_OFFSET, update).code == 0
        query = {"consumerGroup": "WireOffsetGroup", "topic": "WireOffsetTopic", "queueId": "1"}
        answer = client.answer(RequestCode.QUERY_CONSUMER_OFFSET, query)
        assert answer.code == ResponseCode.SUCCESS
        assert answer.ext_fields == {"offset": "17"}
        fresh = client.answer(
            RequestCode.QUERY_CONSUMER_OFFSET, {**query, "consumerGroup": "WireNewGroup"}
        )
        assert fresh.code == ResponseCode.SUCCESS
        assert fresh.ext_fields == {"offset": "0"}
        max_offset = client.answer(
            RequestCode.GET_MAX_OFFSET, {"topic": "WireOffsetTopic", "queueId": "1"}
        )
        assert max_offset.code == ResponseCode.SUCCESS
        assert max_offset.ext_fields == {"offset": "0"}
    finally:
        client.close()


def test_a_pulls_commit_moves_an_offset_forward_never_behind_a_later_update(
    appliance: Appliance,
) -> None:
    """A PULL's commitOffset reaches admin.0 over the pull processor's ring, beside the worker's
    ring that brings the UPDATE_CONSUMER_OFFSET sent after it on the same connection, so it may
    arrive second: an orderly consumer's last pull of a queue it hands over, and the offset it
    persists before it unlocks. The UPDATE's index must stay (without forward_only, the pull's
    won in about a quarter of the rounds here)."""
    topic, group = "WirePullCommitTopic", "WirePullCommitGroup"
    client = WireClient(appliance.broker_port)
    query = {"consumerGroup": group, "topic": topic, "queueId": "0"}

    def pull_with_commit(commit_offset: int) -> dict[str, str]:
        return {
            "consumerGroup": group,
            "topic": topic,
            "queueId": "0",
            "queueOffset": "0",
            "maxMsgNums": "32",
            "sysFlag": str(PULL_FLAG_COMMIT_OFFSET | PULL_FLAG_SUBSCRIPTION),
            "commitOffset": str(commit_offset),
            "suspendTimeoutMillis": "0",
            "subVersion": "0",
            "subscription": "*",
        }

    def committed() -> str:
        return client.answer(RequestCode.QUERY_CONSUMER_OFFSET, query).ext_fields["offset"]

    try:
        create_topic(client, topic, 1)
        pulled = client.answer(RequestCode.PULL_MESSAGE, pull_with_commit(1))
        assert pulled.code == ResponseCode.PULL_NOT_FOUND, pulled.remark
        wait_until(lambda: committed() == "1", "the pull's commit stored", 10.0)
        for round_number in range(1, 101):
            pull = client.request(RequestCode.PULL_MESSAGE, pull_with_commit(2 * round_number))
            update = {**query, "commitOffset": str(2 * round_number + 1)}
            persist = client.request(RequestCode.UPDATE_CONSUMER_OFFSET, update)
            answers: dict[int, RemotingCommand] = {}
            while not {pull, persist} <= answers.keys():
                (command,) = client.responses(1)
                if command.flag & FLAG_RESPONSE:
                    answers[command.opaque] = command
            assert answers[pull].code == ResponseCode.PULL_NOT_FOUND, answers[pull].remark
            assert answers[persist].code == ResponseCode.SUCCESS, answers[persist].remark
            assert committed() == str(2 * round_number + 1), round_number
    finally:
        client.close()


def test_a_locked_queue_is_refused_to_another_client_until_unlocked(appliance: Appliance) -> None:
    first = WireClient(appliance.broker_port)
    second = WireClient(appliance.broker_port)
    queue = MessageQueue("WireLockTopic", "broker-a", 0)

    def lock(client: WireClient, client_id: str, code: int) -> RemotingCommand:
        body = LockBatchRequestBody("WireLockGroup", client_id, (queue,)).to_json()
        started = time.monotonic()
        response = client.answer(code, {}, body)
        assert time.monotonic() - started < 1.0  # the C++ client waits 1 s
        assert response.code == ResponseCode.SUCCESS
        return response

    def granted(response: RemotingCommand) -> tuple[MessageQueue, ...]:
        return LockBatchResponseBody.from_json(response.body).lock_ok_mq_set

    try:
        assert granted(lock(first, "a", RequestCode.LOCK_BATCH_MQ)) == (queue,)
        assert granted(lock(second, "b", RequestCode.LOCK_BATCH_MQ)) == ()
        lock(first, "a", RequestCode.UNLOCK_BATCH_MQ)
        assert granted(lock(second, "b", RequestCode.LOCK_BATCH_MQ)) == (queue,)
        assert granted(lock(first, "a", RequestCode.LOCK_BATCH_MQ)) == ()
    finally:
        first.close()
        second.close()


def test_a_created_topic_is_listed_and_routed(appliance: Appliance) -> None:
    topic = "WireCreatedTopic"
    client = WireClient(appliance.broker_port)
    try:
        create_topic(client, topic, 3)
        listed = client.answer(RequestCode.GET_ALL_TOPIC_CONFIG)
        assert listed.code == ResponseCode.SUCCESS
        config = json.loads(listed.body)["topicConfigTable"][topic]
        assert (config["readQueueNums"], config["writeQueueNums"], config["perm"]) == (3, 3, 6)
    finally:
        client.close()
    deadline = time.monotonic() + ROUTE_WAIT_S
    with RemotingClient(appliance.namesrv_address) as namesrv:
        route = get_route(namesrv, topic)
        while route is None and time.monotonic() < deadline:
            time.sleep(0.2)
            route = get_route(namesrv, topic)
    assert route is not None, "the name server has no route for the created topic"
    (queue_data,) = route.queue_datas
    assert (queue_data.read_queue_nums, queue_data.write_queue_nums) == (3, 3)


def test_a_consumer_groups_retry_topic_is_routed(appliance: Appliance) -> None:
    client = WireClient(appliance.broker_port)
    try:
        heartbeat(client, "7-127.0.0.1@DEFAULT", "WireRetryGroup")
    finally:
        client.close()
    deadline = time.monotonic() + ROUTE_WAIT_S
    with RemotingClient(appliance.namesrv_address) as namesrv:
        route = get_route(namesrv, "%RETRY%WireRetryGroup")
        while route is None and time.monotonic() < deadline:
            time.sleep(0.2)
            route = get_route(namesrv, "%RETRY%WireRetryGroup")
    assert route is not None
    (queue_data,) = route.queue_datas
    assert (queue_data.read_queue_nums, queue_data.perm) == (1, 6)


def test_committed_offsets_are_saved_by_an_orderly_stop(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    with running_appliance(tmp_path / "stop", reap_pids) as appliance:
        client = WireClient(appliance.broker_port)
        try:
            create_topic(client, "WireStopTopic", 1)
            update = {
                "consumerGroup": "WireStopGroup",
                "topic": "WireStopTopic",
                "queueId": "0",
                "commitOffset": "5",
            }
            assert client.answer(RequestCode.UPDATE_CONSUMER_OFFSET, update).code == 0
        finally:
            client.close()
        config_dir = store_config_dir(appliance)
        assert appliance.stop() == 0
        saved = json.loads((config_dir / "consumerOffset.json").read_text())
        assert saved["offsetTable"]["WireStopTopic@WireStopGroup"] == {"0": 5}


def send_to_queue(client: WireClient, topic: str, queue_id: int, count: int) -> None:
    for number in range(count):
        header = SendMessageRequestHeader(
            "WirePG", topic, "TBW102", 4, queue_id, 0, int(time.time() * 1000), 0
        )
        response = client.answer(RequestCode.SEND_MESSAGE, header.to_ext(), f"m{number}".encode())
        assert response.code == ResponseCode.SUCCESS, response.remark


def java_reset_body(broker_name: str, topic: str, offsets: dict[int, int]) -> bytes:
    """ResetOffsetBody as fastjson writes a Map<MessageQueue, Long>: object keys, not JSON."""
    entries = ",".join(
        f'{{"brokerName":"{broker_name}","queueId":{queue_id},"topic":"{topic}"}}:{offset}'
        for queue_id, offset in sorted(offsets.items())
    )
    return f'{{"offsetTable":{{{entries}}}}}'.encode()


def expect_reset_notice(
    client: WireClient, topic: str, group: str, timestamp: str, is_force: str
) -> RemotingCommand:
    notice = next_request(client, RequestCode.RESET_CONSUMER_CLIENT_OFFSET)
    assert notice.flag == FLAG_ONEWAY
    assert notice.ext_fields == {
        "topic": topic,
        "group": group,
        "timestamp": timestamp,
        "isForce": is_force,
    }
    return notice


def test_an_offset_reset_tells_each_live_member_in_its_language(appliance: Appliance) -> None:
    topic = "WireResetTopic"
    group = "WireResetGroup"
    admin = WireClient(appliance.broker_port)
    java = WireClient(appliance.broker_port)
    cpp = WireClient(appliance.broker_port)
    try:
        create_topic(admin, topic, 2)
        with RemotingClient(appliance.namesrv_address) as namesrv:
            deadline = time.monotonic() + ROUTE_WAIT_S
            while (route := get_route(namesrv, topic)) is None:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        broker_name = route.broker_datas[0].broker_name
        heartbeat(java, "1-127.0.0.1@JAVA", group)
        heartbeat_as_cpp(cpp, "2-127.0.0.1@CPP", group)
        send_to_queue(admin, topic, 1, 3)
        wait_until(  # the queue's index follows the store a moment after the answers
            lambda: (
                admin.answer(
                    RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": "1"}
                ).ext_fields
                == {"offset": "3"}
            ),
            "queue 1's three messages in its index",
        )

        ext = {"consumerGroup": group, "topic": topic, "to": "latest"}
        reset = admin.answer(MQBOX_RESET_CONSUMER_OFFSET, ext)
        assert reset.code == ResponseCode.SUCCESS, reset.remark
        assert json.loads(reset.body)["clientsNotified"] == 2
        notice = expect_reset_notice(cpp, topic, group, "-1", "true")
        assert json.loads(notice.body) == {
            "offsetTable": [
                {"brokerName": broker_name, "offset": 0, "queueId": 0, "topic": topic},
                {"brokerName": broker_name, "offset": 3, "queueId": 1, "topic": topic},
            ]
        }
        notice = expect_reset_notice(java, topic, group, "-1", "true")
        assert notice.body == java_reset_body(broker_name, topic, {0: 0, 1: 3})

        # Java's 222: without isForce a queue only moves back; the broker stores it too.
        ext = {"topic": topic, "group": group, "timestamp": "0", "isForce": "false"}
        invoked = admin.answer(INVOKE_BROKER_TO_RESET_OFFSET, ext)
        assert invoked.code == ResponseCode.SUCCESS, invoked.remark
        assert invoked.body == java_reset_body(broker_name, topic, {0: 0, 1: 0})
        expect_reset_notice(cpp, topic, group, "0", "false")
        expect_reset_notice(java, topic, group, "0", "false")
        query = {"consumerGroup": group, "topic": topic, "queueId": "1"}
        assert admin.answer(RequestCode.QUERY_CONSUMER_OFFSET, query).ext_fields == {"offset": "0"}

        # Nobody online: 206 and nothing changes; an unknown topic: 1.
        update = {
            "consumerGroup": "WireNobody",
            "topic": topic,
            "queueId": "1",
            "commitOffset": "2",
        }
        assert admin.answer(RequestCode.UPDATE_CONSUMER_OFFSET, update).code == 0
        ext = {"topic": topic, "group": "WireNobody", "timestamp": "-1", "isForce": "true"}
        offline = admin.answer(INVOKE_BROKER_TO_RESET_OFFSET, ext)
        assert offline.code == ResponseCode.CONSUMER_NOT_ONLINE
        assert offline.remark is not None
        query = {"consumerGroup": "WireNobody", "topic": topic, "queueId": "1"}
        assert admin.answer(RequestCode.QUERY_CONSUMER_OFFSET, query).ext_fields == {"offset": "2"}
        ext = {"topic": "WireNoSuchTopic", "group": group, "timestamp": "-1", "isForce": "true"}
        unknown = admin.answer(INVOKE_BROKER_TO_RESET_OFFSET, ext)
        assert unknown.code == ResponseCode.SYSTEM_ERROR
        assert unknown.remark is not None
        assert "no topic in this broker" in unknown.remark
    finally:
        admin.close()
        java.close()
        cpp.close()


def test_running_info_is_asked_of_the_consumer_and_its_answer_relayed(
    appliance: Appliance,
) -> None:
    group = "WireRunningGroup"
    consumer = WireClient(appliance.broker_port)
    admin = WireClient(appliance.broker_port)
    code = RequestCode.GET_CONSUMER_RUNNING_INFO
    ext = {"consumerGroup": group, "clientId": "3-127.0.0.1@RUN", "jstackEnable": "false"}
    try:
        heartbeat(consumer, "3-127.0.0.1@RUN", group)
        opaque = admin.request(code, ext)
        asked = next_request(consumer, code)
        assert asked.flag == 0
        assert asked.ext_fields == ext
        body = b'{"mqTable":{{"brokerName":"b","queueId":0,"topic":"T"}:{}}}'
        consumer.send(
            RemotingCommand(
                0, LanguageCode.CPP, 63, asked.opaque, FLAG_RESPONSE, None, {"k": "v"}, body
            )
        )
        (answer,) = admin.responses(1)
        assert (answer.opaque, answer.code, answer.body) == (opaque, ResponseCode.SUCCESS, body)
        assert answer.ext_fields == {"k": "v"}
        offline = admin.answer(code, {**ext, "clientId": "nobody"})
        assert offline.code == ResponseCode.SYSTEM_ERROR
        assert offline.remark == f"The Consumer <{group}> <nobody> not online"
    finally:
        consumer.close()
        admin.close()
