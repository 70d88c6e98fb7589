"""Goal: a SEND with DELAY > 0 is stored under SCHEDULE_TOPIC_XXXX and reaches its own topic
only once its level's delay has passed, identical but for DELAY/REAL_TOPIC/REAL_QID; a send to
`%RETRY%<group>` past its limit goes to `%DLQ%<group>`; CONSUMER_SEND_MSG_BACK reads the failed
record by its offset and stores the retry (through the schedule topic) or the dead letter, is
answered only after the store writer's ack, and refuses bad offsets, bad headers and unknown
groups (with autoCreateSubscriptionGroup off) with clear codes; the schedule role saves
delayOffset.json only for deliveries that are acknowledged and flushed, and a new schedule
process delivers again what the last one delivered after its saved offsets (at least once).

Method: test_send.py's StoreGraph (store writer, dispatcher, send and pull processors as objects
in this process over real rings and a real store in tmp_path) plus the ScheduleRole, whose clock
stands still until a test sets it (relative to the store times of the records it sent), and is
never behind the newest store time (an earlier clock would look like one that went back, which
delivers at once). The commit log's flush thread is slowed to a minute,
so a test flushes by hand and sees the offsets move only then. Deliveries are read back with
PULL through the real pull processor.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqbox.message import StoredMessage, decode_offset_msg_id, decode_properties_str
from mqbox.protocol import RemotingCommand, make_request
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.protocol.errors import RemoteProtocolError
from mqbox.protocol.headers import ConsumerSendMsgBackRequestHeader
from mqbox.server.admin_parcels import write_group_subscriptions
from mqbox.server.roles.processors.client_manager import Subscription
from mqbox.server.roles.processors.topics import SCHEDULE_TOPIC
from mqbox.server.roles.schedule import ScheduleRole
from mqbox.server.topology import RoleKind
from mqbox.store import config_files
from mqbox.store.config_files import SubscriptionGroupConfig, SubscriptionGroupTable
from mqbox.store.layout import config_dir
from tests.unit.server.test_pull import decode_body, pull
from tests.unit.server.test_send import (
    StoreGraph,
    properties_text,
    send_header,
    small_broker,
)

LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"


class ScheduleGraph(StoreGraph):
    """StoreGraph plus the schedule role, with a clock that moves only when a test sets it."""

    def __init__(self, instance: str, home: Path, **broker: object) -> None:
        super().__init__(
            instance,
            home,
            small_broker(flush_interval_commit_log_ms=60_000, message_delay_level=LEVELS, **broker),
        )
        self.time_ms = time.time_ns() // 1_000_000
        self.schedule = self.start_schedule()

    def now_ms(self) -> int:
        return max(self.time_ms, self.writer.commit_log.last_store_timestamp_ms)

    def start_schedule(self) -> ScheduleRole:
        return ScheduleRole(
            self.context(RoleKind.SCHEDULE),
            clock_ms=self.now_ms,
            persist_interval_ms=3_600_000,
            stop_wait_ms=0,
        )

    def pump(self, rounds: int = 1) -> None:
        for _ in range(rounds):
            super().pump()
            self.schedule.run_once(0)
            self.writer.run_once(0)
            self.schedule.run_once(0)
            self.dispatcher.run_once(0)

    def set_time(self, time_ms: int) -> None:
        self.time_ms = time_ms
        self.pump(4)

    def flush(self) -> None:
        self.writer.flusher.flush_now()

    def abandon_schedule(self) -> None:
        """Drop the schedule role as a SIGKILL would (its offsets file stays as it was)."""
        self.schedule.epoll.close()

    def close(self) -> None:
        self.schedule.close()
        super().close()


@pytest.fixture
def graph(shm_instance: str, tmp_path: Path) -> Iterator[ScheduleGraph]:
    built = ScheduleGraph(shm_instance, tmp_path / "home")
    try:
        subscribe_cg_to_orders(built)
        yield built
    finally:
        built.close()


def subscribe_cg_to_orders(graph: StoreGraph) -> None:
    """What admin.0 writes after CG's heartbeat subscribing to Orders: the send processor lets
    CG send back only records of the topics it consumes (group_topics.py)."""
    orders = Subscription("Orders", "*", (), (), 1)
    write_group_subscriptions(graph.store_root, {"CG": {"Orders": orders}}, 1, 1)


def send(graph: StoreGraph, topic: str, body: bytes, **properties: str) -> RemotingCommand:
    header = send_header(topic, properties=properties_text(**properties))
    return graph.send_command(RequestCode.SEND_MESSAGE, header, body)


def send_back(graph: StoreGraph, ext: dict[str, str]) -> RemotingCommand:
    opaque = graph.next_opaque()
    graph.submit(graph.send, make_request(RequestCode.CONSUMER_SEND_MSG_BACK, opaque, ext))
    return graph.wait_reply(opaque)


def send_back_ext(log_offset_bytes: int, delay_level: int = 0, **extra: str) -> dict[str, str]:
    ext = ConsumerSendMsgBackRequestHeader("CG", log_offset_bytes, delay_level).to_ext()
    return {**ext, **extra}


def log_offset_of(response: RemotingCommand) -> int:
    return decode_offset_msg_id(response.ext_fields["msgId"])[1]


def messages_in(graph: StoreGraph, topic: str, queue_id: int = 0) -> list[StoredMessage]:
    response = pull(graph, topic, 0, queue_id=queue_id)
    if response.code == ResponseCode.PULL_NOT_FOUND:
        return []
    assert response.code == ResponseCode.SUCCESS, (response.code, response.remark)
    return decode_body(response.body)


def saved_offsets(graph: StoreGraph) -> dict[str, int]:
    path = config_dir(graph.store_root) / "delayOffset.json"
    if not path.exists():
        return {}
    table: dict[str, int] = json.loads(path.read_text())["offsetTable"]
    return table


# --- DELAY --------------------------------------------------------------------------------------


def test_a_delayed_send_waits_under_the_schedule_topic_then_arrives_identical(
    graph: ScheduleGraph,
) -> None:
    response = send(graph, "DelayTopic", b"later", TAGS="TagA", KEYS="k1", DELAY="2", color="red")
    assert response.code == ResponseCode.SUCCESS, response.remark
    assert response.ext_fields["queueId"] == "0"  # the queue the client asked for
    assert response.ext_fields["queueOffset"] == "0"  # its index in the schedule queue
    scheduled = graph.read_record(log_offset_of(response))
    assert (scheduled.topic, scheduled.queue_id) == (SCHEDULE_TOPIC, 1)
    assert decode_properties_str(scheduled.properties)["REAL_TOPIC"] == "DelayTopic"

    graph.set_time(scheduled.store_timestamp_ms + 4_999)  # level 2 is 5 s
    assert messages_in(graph, "DelayTopic") == []
    assert graph.schedule.next_due_ms() == scheduled.store_timestamp_ms + 5_000

    graph.set_time(scheduled.store_timestamp_ms + 5_000)
    (delivered,) = messages_in(graph, "DelayTopic")
    assert delivered.topic == "DelayTopic"
    assert delivered.body == b"later"
    assert decode_properties_str(delivered.properties) == {
        "TAGS": "TagA",
        "KEYS": "k1",
        "color": "red",
    }
    assert delivered.born_timestamp_ms == scheduled.born_timestamp_ms
    assert graph.schedule.next_due_ms() is None
    assert graph.schedule.statistics().delivered == 1


def test_a_level_past_the_configured_ones_uses_the_last(graph: ScheduleGraph) -> None:
    response = send(graph, "FarTopic", b"x", DELAY="40")
    scheduled = graph.read_record(log_offset_of(response))
    assert scheduled.queue_id == 17
    assert decode_properties_str(scheduled.properties)["DELAY"] == "18"


def test_a_delay_that_is_not_a_number_is_message_illegal(graph: ScheduleGraph) -> None:
    response = send(graph, "BadDelay", b"x", DELAY="soon")
    assert response.code == ResponseCode.MESSAGE_ILLEGAL
    assert "DELAY" in (response.remark or "")


def test_offsets_are_saved_only_for_flushed_deliveries_and_a_new_process_delivers_again(
    graph: ScheduleGraph,
) -> None:
    for number in range(3):
        assert send(graph, "Again", f"m{number}".encode(), DELAY="1").code == 0
    graph.set_time(time.time_ns() // 1_000_000 + 1_000)
    assert len(messages_in(graph, "Again")) == 3
    graph.schedule.persist_now()
    assert saved_offsets(graph).get("1", 0) == 0  # acknowledged, not flushed yet

    graph.flush()
    assert send(graph, "Again", b"m3", DELAY="1").code == 0
    graph.schedule.persist_now()
    assert saved_offsets(graph)["1"] == 3

    graph.set_time(time.time_ns() // 1_000_000 + 1_000)  # m3 delivered, not flushed; it dies
    assert len(messages_in(graph, "Again")) == 4
    graph.abandon_schedule()
    graph.schedule = graph.start_schedule()
    graph.pump(4)
    bodies = [m.body for m in messages_in(graph, "Again")]
    assert bodies == [b"m0", b"m1", b"m2", b"m3", b"m3"]  # at least once: m3 twice

    graph.flush()
    graph.schedule.close()
    assert saved_offsets(graph)["1"] == 4
    assert set(saved_offsets(graph)) == {str(level) for level in range(1, 19)}


# --- %RETRY% sends and CONSUMER_SEND_MSG_BACK ---------------------------------------------------


def test_a_retry_topic_send_past_its_limit_goes_to_the_dlq(graph: ScheduleGraph) -> None:
    header = send_header(
        "%RETRY%CG", default_topic="", reconsume_times=3, max_reconsume_times=3, properties=""
    )
    response = graph.send_command(RequestCode.SEND_MESSAGE, header, b"dead")
    assert response.code == ResponseCode.SUCCESS, response.remark
    record = graph.read_record(log_offset_of(response))
    assert (record.topic, record.queue_id, record.reconsume_times) == ("%DLQ%CG", 0, 3)
    created = graph.send.topics.get("%DLQ%CG")
    assert created is not None
    assert (created.read_queue_nums, created.perm) == (1, 6)

    header = send_header("%RETRY%CG", default_topic="", reconsume_times=2, max_reconsume_times=3)
    response = graph.send_command(RequestCode.SEND_MESSAGE, header, b"alive")
    assert graph.read_record(log_offset_of(response)).topic == "%RETRY%CG"


def test_send_back_stores_a_delayed_retry_and_answers_after_the_ack(graph: ScheduleGraph) -> None:
    original = send(graph, "Orders", b"failed", TAGS="TagB", KEYS="order-1")
    offset = log_offset_of(original)
    opaque = graph.next_opaque()
    graph.submit(
        graph.send, make_request(RequestCode.CONSUMER_SEND_MSG_BACK, opaque, send_back_ext(offset))
    )
    assert not graph.has_reply(opaque)  # nothing before the store writer's ack
    response = graph.wait_reply(opaque)
    assert response.code == ResponseCode.SUCCESS, response.remark
    assert response.ext_fields == {}
    retry_config = graph.send.topics.get("%RETRY%CG")
    assert retry_config is not None
    assert (retry_config.write_queue_nums, retry_config.perm) == (1, 6)

    graph.pump(3)
    (scheduled,) = messages_in(graph, SCHEDULE_TOPIC, queue_id=2)
    assert decode_properties_str(scheduled.properties)["REAL_TOPIC"] == "%RETRY%CG"
    scheduled_at_ms = scheduled.store_timestamp_ms
    graph.set_time(scheduled_at_ms + 9_999)  # delayLevel 0 -> 3 + 0 -> 10 s
    assert messages_in(graph, "%RETRY%CG") == []
    graph.set_time(scheduled_at_ms + 10_000)
    (retry,) = messages_in(graph, "%RETRY%CG")
    properties = decode_properties_str(retry.properties)
    assert retry.reconsume_times == 1
    assert retry.body == b"failed"
    assert properties["RETRY_TOPIC"] == "Orders"
    assert properties["ORIGIN_MESSAGE_ID"] == original.ext_fields["msgId"]
    assert properties["WAIT"] == "false"
    assert (properties["TAGS"], properties["KEYS"]) == ("TagB", "order-1")
    assert not {"DELAY", "REAL_TOPIC", "REAL_QID"} & set(properties)

    # Its own send-back past maxReconsumeTimes (from the header) is a dead letter at once.
    ext = send_back_ext(retry.log_offset_bytes, maxReconsumeTimes="1")
    assert send_back(graph, ext).code == ResponseCode.SUCCESS
    graph.pump(3)
    (dead,) = messages_in(graph, "%DLQ%CG")
    properties = decode_properties_str(dead.properties)
    assert dead.reconsume_times == 2
    assert properties["ORIGIN_MESSAGE_ID"] == original.ext_fields["msgId"]
    assert properties["RETRY_TOPIC"] == "Orders"


def test_a_negative_delay_level_goes_straight_to_the_dlq(graph: ScheduleGraph) -> None:
    offset = log_offset_of(send(graph, "Orders", b"poison"))
    assert send_back(graph, send_back_ext(offset, delay_level=-1)).code == ResponseCode.SUCCESS
    graph.pump(3)
    (dead,) = messages_in(graph, "%DLQ%CG")
    assert dead.body == b"poison"
    assert dead.reconsume_times == 1


def test_bad_offsets_and_headers_get_clear_errors(graph: ScheduleGraph) -> None:
    offset = log_offset_of(send(graph, "Orders", b"one"))
    for bad_offset in (offset + 1, -5, 1 << 40):
        response = send_back(graph, send_back_ext(bad_offset))
        assert response.code == ResponseCode.SYSTEM_ERROR
        assert f"look message by offset failed, {bad_offset}" in (response.remark or "")
    # A header that does not parse raises RemoteProtocolError, which the processor base answers
    # with its code (1) and message (the wire test sees that answer).
    for ext, field in (
        ({"group": "CG", "delayLevel": "0"}, "offset"),
        ({"group": "CG", "offset": "12x", "delayLevel": "0"}, "offset"),
        ({"group": "CG", "offset": "0", "delayLevel": "later"}, "delayLevel"),
    ):
        with pytest.raises(RemoteProtocolError, match=field) as raised:
            graph.submit(
                graph.send,
                make_request(RequestCode.CONSUMER_SEND_MSG_BACK, graph.next_opaque(), ext),
            )
        assert raised.value.response_code == ResponseCode.SYSTEM_ERROR
    response = send_back(graph, {**send_back_ext(offset), "group": "bad group!"})
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert "retry topic" in (response.remark or "")
    assert send(graph, "Orders", b"still serving").code == ResponseCode.SUCCESS


def test_a_group_without_retry_queues_drops_what_is_sent_back(graph: ScheduleGraph) -> None:
    config_files.save_subscription_groups(
        config_dir(graph.store_root),
        SubscriptionGroupTable({"CG": SubscriptionGroupConfig("CG", retry_queue_nums=0)}),
    )
    offset = log_offset_of(send(graph, "Orders", b"dropped"))
    assert send_back(graph, send_back_ext(offset)).code == ResponseCode.SUCCESS
    assert graph.send.topics.get("%RETRY%CG") is None


def test_the_group_file_sets_the_retry_limit(graph: ScheduleGraph) -> None:
    config_files.save_subscription_groups(
        config_dir(graph.store_root),
        SubscriptionGroupTable({"CG": SubscriptionGroupConfig("CG", retry_max_times=0)}),
    )
    offset = log_offset_of(send(graph, "Orders", b"no retries"))
    assert send_back(graph, send_back_ext(offset)).code == ResponseCode.SUCCESS
    graph.pump(3)
    assert len(messages_in(graph, "%DLQ%CG")) == 1


def test_an_unknown_group_is_refused_without_auto_creation(
    shm_instance: str, tmp_path: Path
) -> None:
    graph = ScheduleGraph(shm_instance, tmp_path / "home", auto_create_subscription_group=False)
    try:
        offset = log_offset_of(send(graph, "Orders", b"x"))
        response = send_back(graph, send_back_ext(offset))
        assert response.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
        header = send_header("%RETRY%CG", default_topic="", reconsume_times=1)
        response = graph.send_command(RequestCode.SEND_MESSAGE, header, b"x")
        assert response.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
    finally:
        graph.close()
