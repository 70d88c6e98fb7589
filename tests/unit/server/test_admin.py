"""Goal: the admin processor serves the client, offset, lock, query and topic requests of
docs/protocol.md sections 4.3-4.5 and mqbox's own admin views: heartbeats fill the consumer
list (38), membership changes reach every member as NOTIFY_CONSUMER_IDS_CHANGED (40, a oneway
broker request with ext consumerGroup), 15 then 14 returns the offset and a new group starts by
rule 7, pulls' COMMIT_OFFSET parcels count as commits, the offsets reach consumerOffset.json on
stop, locks are exclusive per group, topics are created, listed and deleted, store queries answer
from the store the send path wrote, and bad input gets 1 (field named) or 17, never a crash;
with two admin processors every connection reaches admin.0's tables (the worker routes them);
CHECK_CLIENT_CONFIG (46) takes TAG and refuses SQL92; GET_CONSUMER_RUNNING_INFO (307) goes to
the client on its connection and its answer back, or fails on a timeout or a closed connection.

Method: two harnesses in this process. The front (tests/support/front_in_process.py: reactor,
codec, worker and admin over real rings, clients on real sockets) carries everything that needs
no store, so replies and broker requests travel the whole way to a socket. The store graph of
test_send.py (store writer, dispatcher, send and pull processors over a real store in tmp_path)
gets an admin processor of its own; requests are handed to its `handle` and replies read from its
ring to the codec, and COMMIT_OFFSET parcels are written into the pull processor's ring to it.
Time is a fake monotonic clock where expiry matters.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqbox.ipc.ring import Ring
from mqbox.message import decode_offset_msg_id, decode_record
from mqbox.protocol import RemotingCommand, make_request
from mqbox.protocol.admin_bodies import loads_fastjson
from mqbox.protocol.codes import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    ConsumeFromWhere,
    ConsumeType,
    MessageModel,
    RequestCode,
    ResponseCode,
)
from mqbox.protocol.command import encode_header
from mqbox.protocol.headers import (
    ConsumerData,
    ConsumerListBody,
    HeartbeatData,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageQueue,
    ProducerData,
    SubscriptionData,
    UpdateAndCreateTopicRequestHeader,
)
from mqbox.protocol.mqbox_codes import (
    MQBOX_RESET_CONSUMER_OFFSET,
)
from mqbox.server import admin_parcels, parcels
from mqbox.server.admin_parcels import GroupSubscriptionsReader
from mqbox.server.roles.processors.admin import AdminProcessor
from mqbox.server.roles.processors.client_manager import Subscription
from mqbox.server.topology import RoleKind
from mqbox.server.transport import Inbox, Outbox, SpillWriter
from mqbox.store import config_files
from mqbox.store.config_files import TopicConfig
from mqbox.store.layout import (
    CONSUMER_OFFSET_FILE_NAME,
    config_dir,
    consume_queue_dir,
    segment_name,
)
from tests.support.front_client import FrontClient
from tests.support.front_in_process import FrontInProcess
from tests.unit.server.test_send import StoreGraph, properties_text, send_header, small_broker

SECOND_NS = 1_000_000_000


class FakeClock:
    def __init__(self) -> None:
        self.now_ns = 1_000 * SECOND_NS

    def __call__(self) -> int:
        return self.now_ns


def heartbeat_body(
    client_id: str, group: str = "CG", topics: dict[str, str] | None = None
) -> bytes:
    subscriptions = tuple(
        SubscriptionData(topic, expression, sub_version=1)
        for topic, expression in (topics if topics is not None else {"T": "*"}).items()
    )
    data = HeartbeatData(
        client_id,
        (ProducerData("PG"),),
        (
            ConsumerData(
                group,
                ConsumeType.CONSUME_PASSIVELY,
                MessageModel.CLUSTERING,
                ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
                subscriptions,
            ),
        ),
    )
    return data.to_json()


def create_topic_ext(topic: str, queue_count: int = 4, perm: int = 6) -> dict[str, str]:
    return UpdateAndCreateTopicRequestHeader(
        topic, "TBW102", queue_count, queue_count, perm
    ).to_ext()


# --- the front: no store ------------------------------------------------------------------------


@pytest.fixture
def front(shm_instance: str, tmp_path: Path) -> Iterator[FrontInProcess]:
    built = FrontInProcess(shm_instance, tmp_path / "home" / "store")
    try:
        yield built
    finally:
        built.close()


def connect(front: FrontInProcess) -> FrontClient:
    return FrontClient("127.0.0.1", front.port, pump=front.pump)


def heartbeat(client: FrontClient, client_id: str, group: str = "CG") -> RemotingCommand:
    return client.call(RequestCode.HEART_BEAT, {}, heartbeat_body(client_id, group))


def consumer_list(client: FrontClient, group: str = "CG") -> RemotingCommand:
    return client.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})


def expect_notify(client: FrontClient, group: str = "CG") -> None:
    (notice,) = client.responses(1)
    assert notice.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED
    assert notice.flag == FLAG_ONEWAY
    assert notice.ext_fields == {"consumerGroup": group}
    assert notice.opaque >= 1 << 30


def test_heartbeat_then_consumer_list_names_the_client_and_makes_group_and_retry_topic(
    front: FrontInProcess,
) -> None:
    client = connect(front)
    try:
        response = heartbeat(client, "1-127.0.0.1@DEFAULT")
        assert response.code == ResponseCode.SUCCESS
        assert response.flag == FLAG_RESPONSE
        expect_notify(client)  # the group's membership changed: its one member hears of it
        listed = consumer_list(client)
        assert listed.code == ResponseCode.SUCCESS
        assert ConsumerListBody.from_json(listed.body).consumer_id_list == ("1-127.0.0.1@DEFAULT",)
        directory = config_dir(front.admins[0].ctx.store_root)
        groups = config_files.load_subscription_groups(directory)
        assert "CG" in groups.groups
        retry = config_files.load_topics(directory).topics["%RETRY%CG"]
        assert (retry.read_queue_nums, retry.write_queue_nums, retry.perm) == (1, 1, 6)
        reader = GroupSubscriptionsReader(front.admins[0].ctx.store_root)
        subscription = reader.get_fresh("CG", "T")
        assert subscription is not None
        assert subscription.takes_every_tag
        assert reader.get_fresh("CG", "Other") is None
        empty = consumer_list(client, "NoSuchGroup")
        assert empty.code == ResponseCode.SYSTEM_ERROR
        assert empty.remark == "no consumer for this group"
    finally:
        client.close()


def test_members_hear_of_a_join_and_the_one_left_hears_of_a_disconnect(
    front: FrontInProcess,
) -> None:
    first = connect(front)
    second = connect(front)
    try:
        assert heartbeat(first, "a").code == ResponseCode.SUCCESS
        expect_notify(first)
        assert heartbeat(second, "b").code == ResponseCode.SUCCESS
        expect_notify(second)
        expect_notify(first)
        listed = consumer_list(first)
        assert ConsumerListBody.from_json(listed.body).consumer_id_list == ("a", "b")
        second.close()
        expect_notify(first)
        listed = consumer_list(first)
        assert ConsumerListBody.from_json(listed.body).consumer_id_list == ("a",)
        assert front.admins[0].statistics_admin().notifications_sent == 4
    finally:
        first.close()


def test_unregister_and_silence_remove_clients(front: FrontInProcess) -> None:
    admin = front.admins[0]
    clock = FakeClock()
    admin.clock_ns = clock
    first = connect(front)
    second = connect(front)
    try:
        heartbeat(first, "a")
        expect_notify(first)
        heartbeat(second, "b")
        expect_notify(second)
        expect_notify(first)
        response = second.call(
            RequestCode.UNREGISTER_CLIENT,
            {"clientID": "b", "producerGroup": "", "consumerGroup": "CG"},
        )
        assert response.code == ResponseCode.SUCCESS
        expect_notify(first)
        assert admin.clients.producer_ids("PG") == ["a", "b"]  # "" named no producer group
        clock.now_ns += 121 * SECOND_NS
        admin.housekeeping(clock.now_ns)
        assert consumer_list(first).code == ResponseCode.SYSTEM_ERROR
        assert admin.clients.producer_groups() == []
    finally:
        first.close()
        second.close()


def test_update_then_query_offset_and_rule_7_for_a_new_group(front: FrontInProcess) -> None:
    client = connect(front)
    try:
        assert client.call(RequestCode.UPDATE_AND_CREATE_TOPIC, create_topic_ext("T")).code == 0
        ext = {"consumerGroup": "CG", "topic": "T", "queueId": "1", "commitOffset": "42"}
        assert client.call(RequestCode.UPDATE_CONSUMER_OFFSET, ext).code == ResponseCode.SUCCESS
        query = {"consumerGroup": "CG", "topic": "T", "queueId": "1"}
        answer = client.call(RequestCode.QUERY_CONSUMER_OFFSET, query)
        assert answer.code == ResponseCode.SUCCESS
        assert answer.ext_fields == {"offset": "42"}
        fresh = client.call(RequestCode.QUERY_CONSUMER_OFFSET, {**query, "consumerGroup": "New"})
        assert fresh.code == ResponseCode.SUCCESS
        assert fresh.ext_fields == {"offset": "0"}
        unknown = client.call(RequestCode.QUERY_CONSUMER_OFFSET, {**query, "topic": "Nope"})
        assert unknown.code == ResponseCode.TOPIC_NOT_EXIST
        missing = client.call(
            RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "CG", "topic": "T"}
        )
        assert missing.code == ResponseCode.SYSTEM_ERROR
        assert missing.remark is not None
        assert "queueId" in missing.remark
        bad_group = client.call(RequestCode.UPDATE_CONSUMER_OFFSET, {**ext, "consumerGroup": "a@b"})
        assert bad_group.code == ResponseCode.SYSTEM_ERROR
        assert bad_group.remark is not None
        assert "consumerGroup" in bad_group.remark
        negative = client.call(RequestCode.UPDATE_CONSUMER_OFFSET, {**ext, "queueId": "-1"})
        assert negative.code == ResponseCode.SYSTEM_ERROR
    finally:
        client.close()
    admin = front.admins[0]
    path = config_dir(admin.ctx.store_root) / CONSUMER_OFFSET_FILE_NAME
    assert not path.exists()  # saved every 5 s, not on each commit
    admin.on_stop()
    assert json.loads(path.read_text())["offsetTable"] == {"T@CG": {"1": 42}}


def test_a_locked_queue_is_refused_to_another_client_until_unlocked(front: FrontInProcess) -> None:
    first = connect(front)
    second = connect(front)
    queue = MessageQueue("T", "broker-a", 0)

    def lock(
        client: FrontClient, client_id: str, code: int = RequestCode.LOCK_BATCH_MQ
    ) -> RemotingCommand:
        body = LockBatchRequestBody("CG", client_id, (queue,)).to_json()
        return client.call(code, {}, body)

    try:
        granted = lock(first, "a")
        assert granted.code == ResponseCode.SUCCESS
        assert LockBatchResponseBody.from_json(granted.body).lock_ok_mq_set == (queue,)
        refused = lock(second, "b")
        assert refused.code == ResponseCode.SUCCESS
        assert LockBatchResponseBody.from_json(refused.body).lock_ok_mq_set == ()
        assert lock(first, "a").code == ResponseCode.SUCCESS  # the holder renews
        unlocked = lock(first, "a", RequestCode.UNLOCK_BATCH_MQ)
        assert (unlocked.code, unlocked.body) == (ResponseCode.SUCCESS, b"")
        granted = lock(second, "b")
        assert LockBatchResponseBody.from_json(granted.body).lock_ok_mq_set == (queue,)
        garbage = second.call(RequestCode.LOCK_BATCH_MQ, {}, b"{")
        assert garbage.code == ResponseCode.SYSTEM_ERROR
    finally:
        first.close()
        second.close()


def test_topics_are_created_listed_and_deleted(front: FrontInProcess) -> None:
    client = connect(front)
    try:
        created = client.call(RequestCode.UPDATE_AND_CREATE_TOPIC, create_topic_ext("NewTopic", 3))
        assert created.code == ResponseCode.SUCCESS
        listed = client.call(RequestCode.GET_ALL_TOPIC_CONFIG)
        assert listed.code == ResponseCode.SUCCESS
        document = json.loads(listed.body)
        assert document["topicConfigTable"]["NewTopic"]["readQueueNums"] == 3
        assert document["topicConfigTable"]["NewTopic"]["perm"] == 6
        assert document["dataVersion"]["counter"] >= 1
        updated = client.call(RequestCode.UPDATE_AND_CREATE_TOPIC, create_topic_ext("NewTopic", 5))
        assert updated.code == ResponseCode.SUCCESS
        topics = config_files.load_topics(config_dir(front.admins[0].ctx.store_root)).topics
        assert topics["NewTopic"].write_queue_nums == 5
        for bad in (create_topic_ext("bad topic"), create_topic_ext("Zero", 0)):
            answer = client.call(RequestCode.UPDATE_AND_CREATE_TOPIC, bad)
            assert answer.code == ResponseCode.SYSTEM_ERROR
            assert answer.remark
        cluster = client.call(
            RequestCode.UPDATE_AND_CREATE_TOPIC, create_topic_ext("DefaultCluster")
        )
        assert cluster.code == ResponseCode.SYSTEM_ERROR
        deleted = client.call(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "NewTopic"})
        assert deleted.code == ResponseCode.SUCCESS
        again = client.call(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "NewTopic"})
        assert again.code == ResponseCode.TOPIC_NOT_EXIST
        system = client.call(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "TBW102"})
        assert system.code == ResponseCode.SYSTEM_ERROR
    finally:
        client.close()


def test_bad_and_unknown_requests_get_codes_not_crashes(front: FrontInProcess) -> None:
    client = connect(front)
    try:
        assert client.call(999).code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        garbage = client.call(RequestCode.HEART_BEAT, {}, b"[1, 2]")
        assert garbage.code == ResponseCode.SYSTEM_ERROR
        assert garbage.remark is not None
        assert "HeartbeatData" in garbage.remark
        bad_group = client.call(RequestCode.HEART_BEAT, {}, heartbeat_body("a", "bad group"))
        assert bad_group.code == ResponseCode.SYSTEM_ERROR
        assert bad_group.remark is not None
        assert "groupName" in bad_group.remark
        no_store = client.call(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": "0"})
        assert no_store.code == ResponseCode.SYSTEM_ERROR
        unknown = client.call(RequestCode.GET_MAX_OFFSET, {"topic": "Nope", "queueId": "0"})
        assert unknown.code == ResponseCode.TOPIC_NOT_EXIST
        no_field = client.call(RequestCode.GET_MAX_OFFSET, {"queueId": "0"})
        assert no_field.code == ResponseCode.SYSTEM_ERROR
        assert no_field.remark is not None
        assert "'topic'" in no_field.remark
        status = client.call(RequestCode.GET_TOPIC_STATS_INFO, {})
        assert status.code == ResponseCode.SYSTEM_ERROR
        assert status.remark is not None
        assert "'topic'" in status.remark
        # A client's answer to a broker request is dropped, not answered.
        client.send(RemotingCommand(0, opaque=1 << 30, flag=FLAG_RESPONSE))
        assert client.call(10_000).code == ResponseCode.SUCCESS
        assert front.admins[0].client_responses == 1
    finally:
        client.close()


def answer(
    client: FrontClient, code: int, ext: dict[str, str] | None = None, body: bytes = b""
) -> RemotingCommand:
    """The response to one request, past the broker's requests (40) that come meanwhile."""
    opaque = client.request(code, ext, body)
    while True:
        (command,) = client.responses(1)
        if command.flag & FLAG_RESPONSE:
            assert command.opaque == opaque
            return command
        assert command.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED


def test_every_connection_reaches_the_tables_with_two_admin_processors(
    shm_instance: str, tmp_path: Path
) -> None:
    front = FrontInProcess(shm_instance, tmp_path / "home" / "store", admin_processor_count=2)
    clients = [connect(front) for _ in range(4)]
    try:
        front.admins[0].topics.create_if_absent(TopicConfig("PoolTopic", 2, 2, 6))
        for number, client in enumerate(clients):
            body = heartbeat_body(f"c{number}")
            assert answer(client, RequestCode.HEART_BEAT, {}, body).code == ResponseCode.SUCCESS
        for client in clients:
            listed = answer(client, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "CG"})
            assert ConsumerListBody.from_json(listed.body).consumer_id_list == (
                "c0",
                "c1",
                "c2",
                "c3",
            )
        update = {"consumerGroup": "CG", "topic": "PoolTopic", "queueId": "1", "commitOffset": "9"}
        assert answer(clients[1], RequestCode.UPDATE_CONSUMER_OFFSET, update).code == 0
        query = {"consumerGroup": "CG", "topic": "PoolTopic", "queueId": "1"}
        for client in clients:
            offset = answer(client, RequestCode.QUERY_CONSUMER_OFFSET, query)
            assert offset.ext_fields == {"offset": "9"}
        # The stateless codes still spread over the pool.
        for client in clients:
            assert answer(client, RequestCode.GET_ALL_TOPIC_CONFIG).code == ResponseCode.SUCCESS
        assert front.admins[0].statistics_admin().consumer_count == 4
        assert front.admins[1].statistics_admin().consumer_count == 0
        assert front.admins[1].statistics().requests > 0
    finally:
        for client in clients:
            client.close()
        front.close()


def check_client_config_body(expression_type: str | None) -> bytes:
    subscription: dict[str, object] = {"topic": "T", "subString": "a > 1", "subVersion": 1}
    if expression_type is not None:
        subscription["expressionType"] = expression_type
    return json.dumps({"clientId": "x", "group": "CG", "subscriptionData": subscription}).encode()


def test_check_client_config_accepts_tags_and_refuses_other_filters(
    front: FrontInProcess,
) -> None:
    client = connect(front)
    code = RequestCode.CHECK_CLIENT_CONFIG
    try:
        for accepted in (None, "", "TAG"):
            answer = client.call(code, {}, check_client_config_body(accepted))
            assert answer.code == ResponseCode.SUCCESS, (accepted, answer.remark)
        assert client.call(code, {}, b'{"clientId": "x", "group": "CG"}').code == 0
        refused = client.call(code, {}, check_client_config_body("SQL92"))
        assert refused.code == ResponseCode.SYSTEM_ERROR
        assert refused.remark is not None
        assert "SQL92" in refused.remark
        for garbage in (b"", b"[1]", b"{", b'{"subscriptionData": 5}'):
            answer = client.call(code, {}, garbage)
            assert answer.code == ResponseCode.SYSTEM_ERROR, garbage
            assert answer.remark
    finally:
        client.close()


def running_info_ext(client_id: str, group: str = "CG") -> dict[str, str]:
    return {"consumerGroup": group, "clientId": client_id, "jstackEnable": "false"}


def test_running_info_goes_to_the_client_and_its_answer_comes_back(
    front: FrontInProcess,
) -> None:
    consumer = connect(front)
    admin = connect(front)
    code = RequestCode.GET_CONSUMER_RUNNING_INFO
    try:
        assert heartbeat(consumer, "c-1").code == ResponseCode.SUCCESS
        expect_notify(consumer)
        offline = admin.call(code, running_info_ext("c-2"))
        assert offline.code == ResponseCode.SYSTEM_ERROR
        assert offline.remark == "The Consumer <CG> <c-2> not online"
        opaque = admin.request(code, running_info_ext("c-1"))
        (forwarded,) = consumer.responses(1)
        assert forwarded.code == code
        assert forwarded.flag & FLAG_RESPONSE == 0
        assert forwarded.ext_fields == running_info_ext("c-1")
        assert forwarded.opaque >= 1 << 30
        body = b'{"properties":{},"mqTable":{{"topic":"T"}:{}}}'  # not JSON, as C++ writes it
        consumer.send(RemotingCommand(0, opaque=forwarded.opaque, flag=FLAG_RESPONSE, body=body))
        (answer,) = admin.responses(1)
        assert (answer.opaque, answer.code, answer.body) == (opaque, ResponseCode.SUCCESS, body)
        statistics = front.admins[0].statistics_admin()
        assert (statistics.client_calls_relayed, statistics.client_calls_pending) == (1, 0)
    finally:
        consumer.close()
        admin.close()


def test_running_info_fails_on_a_timeout_or_when_the_client_goes(front: FrontInProcess) -> None:
    front.admins[0].client_call_timeout_ns = 300_000_000
    consumer = connect(front)
    admin = connect(front)
    code = RequestCode.GET_CONSUMER_RUNNING_INFO
    try:
        assert heartbeat(consumer, "slow").code == ResponseCode.SUCCESS
        expect_notify(consumer)
        late = admin.call(code, running_info_ext("slow"))  # answered at a tick, within 1.3 s
        assert late.code == ResponseCode.CONSUME_MSG_TIMEOUT
        assert late.remark is not None
        assert "no answer within 300 ms" in late.remark
        (forwarded,) = consumer.responses(1)
        consumer.send(RemotingCommand(0, opaque=forwarded.opaque, flag=FLAG_RESPONSE))
        opaque = admin.request(code, running_info_ext("slow"))
        consumer.responses(1)
        consumer.close()
        (gone,) = admin.responses(1)
        assert (gone.opaque, gone.code) == (opaque, ResponseCode.SYSTEM_ERROR)
        assert gone.remark is not None
        assert "connection closed" in gone.remark
        statistics = front.admins[0].statistics_admin()
        assert (statistics.client_calls_failed, statistics.client_calls_relayed) == (2, 0)
        assert statistics.client_responses == 1  # the answer that came too late
    finally:
        consumer.close()
        admin.close()


# --- the store graph: queries ---------------------------------------------------------------------


class AdminOnStore:
    """An admin processor beside test_send.py's store graph; replies read from its codec ring."""

    def __init__(self, graph: StoreGraph) -> None:
        self.graph = graph
        self.admin = AdminProcessor(graph.context(RoleKind.ADMIN), spin_ns_max=0)
        ring = Ring.attach(graph.topology.ring("admin.0", "codec.0").name)
        self.replies = Inbox(ring, "admin.0")
        self.commits = Outbox(
            Ring.attach(graph.topology.ring("pull.0", "admin.0").name),
            SpillWriter(graph.instance, "pull.0"),
        )
        self.requests = Outbox(
            Ring.attach(graph.topology.ring("worker.0", "admin.0").name),
            SpillWriter(graph.instance, "worker.0"),
        )
        self._opaque = 1000

    def ask(
        self, code: int, ext: dict[str, str] | None = None, body: bytes = b""
    ) -> RemotingCommand:
        """Send one request the way the worker does (a COMMAND parcel on its ring) and return
        the admin's one reply."""
        self._opaque += 1
        command = make_request(code, self._opaque, ext or {}, body=body)
        header = encode_header(command)
        head = parcels.pack_command_head(
            1, command.opaque, code, command.flag, command.version, b"\x7f\0\0\1", 40_001, 0,
            int(command.language), len(header), 0,
        )  # fmt: skip
        self.requests.append(parcels.COMMAND, head, header, body)
        assert self.requests.flush_nowait()
        self.admin.run_once(0)
        batch = self.replies.drain_nowait()
        found: list[RemotingCommand] = []
        for parcel_type, buffer, offset, size in self.replies.parcels(batch):
            assert parcel_type == parcels.REPLY
            # Bodies of stored records come as commit-log runs (sendfile); the graph reads them.
            found.append(self.graph._decode_reply(buffer, offset, size).command)
        self.replies.release(batch)
        (reply,) = found
        assert reply.opaque == self._opaque
        return reply

    def close(self) -> None:
        self.admin.close()
        self.admin.epoll.close()


@pytest.fixture
def stored(shm_instance: str, tmp_path: Path) -> Iterator[AdminOnStore]:
    graph = StoreGraph(
        shm_instance, tmp_path / "home", small_broker(consume_queue_entry_count=4), start_pull=False
    )
    harness: AdminOnStore | None = None
    try:
        graph.send.topics.create_if_absent(TopicConfig("Q", 2, 2, 6))
        harness = AdminOnStore(graph)
        yield harness
    finally:
        if harness is not None:
            harness.close()
        graph.close()


def put(graph: StoreGraph, topic: str, count: int, queue_id: int = 0) -> list[int]:
    """Send `count` messages with KEYS k<n>; their commit-log offsets."""
    offsets: list[int] = []
    for number in range(count):
        header = send_header(
            topic, queue_id=queue_id, properties=properties_text(KEYS=f"k{number}")
        )
        response = graph.send_command(RequestCode.SEND_MESSAGE, header, f"m{number}".encode())
        assert response.code == ResponseCode.SUCCESS, response.remark
        offsets.append(decode_offset_msg_id(response.ext_fields["msgId"])[1])
    graph.pump(3)
    return offsets


def offset_of(response: RemotingCommand) -> int:
    assert response.code == ResponseCode.SUCCESS, response.remark
    return int(response.ext_fields["offset"])


def test_queue_bounds_time_search_and_rule_7_come_from_the_store(stored: AdminOnStore) -> None:
    put(stored.graph, "Q", 10, queue_id=0)
    put(stored.graph, "Q", 3, queue_id=1)
    # Retention took queue 0's first consume-queue segment (entries 0..3) before the admin
    # opened the queue.
    (consume_queue_dir(stored.graph.store_root, "Q", 0) / segment_name(0)).unlink()
    queue0 = {"topic": "Q", "queueId": "0"}
    queue1 = {"topic": "Q", "queueId": "1"}
    assert offset_of(stored.ask(RequestCode.GET_MAX_OFFSET, queue0)) == 10
    assert offset_of(stored.ask(RequestCode.GET_MIN_OFFSET, queue0)) == 4
    assert offset_of(stored.ask(RequestCode.GET_MAX_OFFSET, queue1)) == 3
    assert offset_of(stored.ask(RequestCode.GET_MIN_OFFSET, queue1)) == 0
    earliest = stored.ask(RequestCode.GET_EARLIEST_MSG_STORETIME, queue1)
    assert earliest.code == ResponseCode.SUCCESS
    first_ms = int(earliest.ext_fields["timestamp"])
    assert first_ms > 0
    search = stored.ask(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {**queue1, "timestamp": "0"})
    assert offset_of(search) == 0
    later = stored.ask(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {**queue1, "timestamp": str(2**62)})
    assert offset_of(later) == 2  # every entry is earlier: the last entry, not the max offset
    group = {"consumerGroup": "New"}
    assert offset_of(stored.ask(RequestCode.QUERY_CONSUMER_OFFSET, {**group, **queue1})) == 0
    moved = stored.ask(RequestCode.QUERY_CONSUMER_OFFSET, {**group, **queue0})
    assert moved.code == ResponseCode.QUERY_NOT_FOUND  # min offset 4: consumeFromWhere decides
    # The queue grows after the admin opened it: the published count is taken each time.
    put(stored.graph, "Q", 2, queue_id=1)
    assert offset_of(stored.ask(RequestCode.GET_MAX_OFFSET, queue1)) == 5


def test_view_by_offset_and_query_by_key_return_stored_records(stored: AdminOnStore) -> None:
    """The records come as commit-log runs the reactor sends with sendfile (issue 9)."""
    log_offsets = put(stored.graph, "Q", 5)
    viewed = stored.ask(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(log_offsets[3])})
    assert viewed.code == ResponseCode.SUCCESS
    message = decode_record(viewed.body)
    assert (message.body, message.queue_index, message.log_offset_bytes) == (
        b"m3",
        3,
        log_offsets[3],
    )
    missing = stored.ask(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(log_offsets[3] + 1)})
    assert missing.code == ResponseCode.SYSTEM_ERROR
    query = {"topic": "Q", "key": "k2", "maxNum": "32", "beginTimestamp": "0"}
    found = stored.ask(RequestCode.QUERY_MESSAGE, {**query, "endTimestamp": str(2**62)})
    assert found.code == ResponseCode.SUCCESS
    (message,) = [decode_record(found.body)]
    assert message.body == b"m2"
    assert found.ext_fields["indexLastUpdatePhyoffset"] == str(log_offsets[2])
    assert int(found.ext_fields["indexLastUpdateTimestamp"]) == message.store_timestamp_ms
    none = stored.ask(RequestCode.QUERY_MESSAGE, {**query, "key": "zz", "endTimestamp": "9"})
    assert none.code == ResponseCode.QUERY_NOT_FOUND
    unknown = stored.ask(RequestCode.QUERY_MESSAGE, {**query, "topic": "X", "endTimestamp": "9"})
    assert unknown.code == ResponseCode.TOPIC_NOT_EXIST


def test_commit_parcels_from_pulls_count_as_commits(stored: AdminOnStore) -> None:
    stored.commits.append(
        admin_parcels.COMMIT_OFFSET, admin_parcels.pack_commit_offset("CG", "Q", 1, 7)
    )
    stored.commits.append(
        admin_parcels.COMMIT_OFFSET, admin_parcels.pack_commit_offset("bad@group", "Q", 1, 7)
    )
    assert stored.commits.flush_nowait()
    stored.admin.run_once(0)
    query = {"consumerGroup": "CG", "topic": "Q", "queueId": "1"}
    assert offset_of(stored.ask(RequestCode.QUERY_CONSUMER_OFFSET, query)) == 7
    statistics = stored.admin.statistics_admin()
    assert (statistics.commit_parcels, statistics.commit_parcels_refused) == (2, 1)


def test_topic_stats_consume_stats_and_reset(stored: AdminOnStore) -> None:
    put(stored.graph, "Q", 6, queue_id=0)
    status = stored.ask(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "Q"})
    assert status.code == ResponseCode.SUCCESS
    table = loads_fastjson(status.body)["offsetTable"]
    queues = [(queue.queue_id, table[queue]) for queue in sorted(table, key=lambda q: q.queue_id)]
    assert [(i, q["minOffset"], q["maxOffset"]) for i, q in queues] == [(0, 0, 6), (1, 0, 0)]
    assert queues[0][1]["lastUpdateTimestamp"] > 0
    assert queues[1][1]["lastUpdateTimestamp"] == 0
    commit = {"consumerGroup": "CG", "topic": "Q", "queueId": "0", "commitOffset": "2"}
    assert stored.ask(RequestCode.UPDATE_CONSUMER_OFFSET, commit).code == ResponseCode.SUCCESS
    stats = loads_fastjson(stored.ask(RequestCode.GET_CONSUME_STATS, {"consumerGroup": "CG"}).body)
    rows = sorted(
        (q.queue_id, r["brokerOffset"], r["consumerOffset"])
        for q, r in stats["offsetTable"].items()
    )
    assert rows == [(0, 6, 2), (1, 0, 0)]
    nobody = stored.ask(RequestCode.GET_CONSUME_STATS, {"consumerGroup": "Nobody"})
    assert nobody.code == ResponseCode.SUCCESS
    assert loads_fastjson(nobody.body)["offsetTable"] == {}
    reset = {"consumerGroup": "CG", "topic": "Q", "to": "latest"}
    answer = stored.ask(MQBOX_RESET_CONSUMER_OFFSET, reset)
    assert answer.code == ResponseCode.SUCCESS
    assert json.loads(answer.body)["queues"] == [
        {"queueId": 0, "previousOffset": 2, "offset": 6},
        {"queueId": 1, "previousOffset": -1, "offset": 0},
    ]
    saved = config_files.load_consumer_offsets(config_dir(stored.graph.store_root))
    assert saved[("Q", "CG")] == {0: 6, 1: 0}
    earliest = stored.ask(MQBOX_RESET_CONSUMER_OFFSET, {**reset, "to": "earliest"})
    assert [q["offset"] for q in json.loads(earliest.body)["queues"]] == [0, 0]
    by_time = stored.ask(
        MQBOX_RESET_CONSUMER_OFFSET, {**reset, "to": "timestamp", "timestamp": str(2**62)}
    )
    assert [q["offset"] for q in json.loads(by_time.body)["queues"]] == [5, 0]
    no_time = stored.ask(MQBOX_RESET_CONSUMER_OFFSET, {**reset, "to": "timestamp"})
    assert no_time.code == ResponseCode.SYSTEM_ERROR
    assert no_time.remark is not None
    assert "'timestamp'" in no_time.remark
    bad_to = stored.ask(MQBOX_RESET_CONSUMER_OFFSET, {**reset, "to": "yesterday"})
    assert bad_to.code == ResponseCode.SYSTEM_ERROR


# --- admin_parcels: the COMMIT_OFFSET parcel and the group-subscriptions file --------------------


def test_commit_offset_parcels_round_trip_any_names() -> None:
    for group, topic in (("CG", "T"), ("组", "%RETRY%组"), ("g\udc80", "t")):
        payload = admin_parcels.pack_commit_offset(group, topic, 3, 2**40)
        assert admin_parcels.unpack_commit_offset(payload, 0, len(payload)) == (
            group.replace("\udc80", "?"),  # wire text (message.py): a lone surrogate is '?'
            topic,
            3,
            2**40,
        )


def test_the_subscriptions_reader_follows_the_file_and_keeps_the_last_good_table(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    reader = GroupSubscriptionsReader(tmp_path, clock_ns=clock)
    assert reader.get("CG", "T") is None
    manager_table = {
        "CG": {
            "T": Subscription("T", "TagA || TagB", ("TagA", "TagB"), (1, 2), 9),
        }
    }
    admin_parcels.write_group_subscriptions(tmp_path, manager_table, 1, 0)
    assert reader.get("CG", "T") is None  # looked 0 ns ago: not yet
    subscription = reader.get_fresh("CG", "T")
    assert subscription == manager_table["CG"]["T"]
    clock.now_ns += admin_parcels.RELOAD_CHECK_INTERVAL_NS
    admin_parcels.write_group_subscriptions(tmp_path, {}, 2, 0)
    assert reader.get("CG", "T") is None  # the group left
    admin_parcels.subscriptions_path(tmp_path).write_text('{"groups": 5}')
    assert reader.get_fresh("CG", "T") is None  # a bad file leaves the last good (empty) table
    assert reader.bad_file_count == 1
    admin_parcels.subscriptions_path(tmp_path).unlink()
    assert reader.get_fresh("CG", "T") is None
