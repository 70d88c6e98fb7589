"""Goal: the pull processor answers every row of the PULL table of docs/protocol.md section
4.3 with its code and nextBeginOffset/minOffset/maxOffset/suggestWhichBrokerId (all strings),
sends found messages as sendfile runs of whole stored records, filters by the subscription's
tags, refuses unknown topics, unreadable topics and bad queue ids (never an existing empty
queue), holds suspend-flagged empty pulls until the dispatcher says the queue grew or the
suspend timeout passes, keeps serving other pulls meanwhile, drops what it holds for a connection
that closed, and reports its counters (MQBOX_PULL_STATUS).

Method: test_send.py's StoreGraph (store writer, dispatcher, send and pull processors as objects
in this process over real rings and a real store in tmp_path); messages go in through the send
processor, pulls are handed to the pull processor, and bodies are read from the commit-log files
the runs name and decoded with message.decode_record. Rows that need deleted files (min offset
above 0, records removed by retention) delete consume-queue or commit-log segments before the
pull processor opens them, as retention would have.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqbox.message import StoredMessage, decode_record
from mqbox.protocol import RemotingCommand, make_request
from mqbox.protocol.codes import (
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    RequestCode,
    ResponseCode,
)
from mqbox.protocol.headers import PullMessageRequestHeader
from mqbox.protocol.mqbox_codes import MQBOX_PULL_STATUS
from mqbox.server.parcels import ConnectionEvent
from mqbox.server.roles.processors.pull import PullProcessor, tag_hashes_of
from mqbox.server.roles.processors.topics import TopicConfigStore
from mqbox.store.config_files import TopicConfig
from mqbox.store.layout import commit_log_dir, consume_queue_dir, segment_name
from tests.unit.server.test_send import (
    StoreGraph,
    properties_text,
    send_header,
    small_broker,
)

PUSH_FLAGS = PULL_FLAG_SUSPEND | PULL_FLAG_SUBSCRIPTION  # what the C++ push consumer sends
PULL_CONSUMER_FLAGS = PULL_FLAG_SUBSCRIPTION  # the Python PullConsumer


@pytest.fixture
def graph(shm_instance: str, tmp_path: Path) -> Iterator[StoreGraph]:
    built = StoreGraph(shm_instance, tmp_path / "home", small_broker())
    try:
        yield built
    finally:
        built.close()


def pull_processor(graph: StoreGraph) -> PullProcessor:
    assert graph.pull is not None
    return graph.pull


def put(graph: StoreGraph, topic: str, count: int, queue_id: int = 0, tags: str = "") -> None:
    properties = properties_text(TAGS=tags) if tags else ""
    for number in range(count):
        response = graph.send_command(
            RequestCode.SEND_MESSAGE,
            send_header(topic, queue_id=queue_id, properties=properties),
            f"{topic}-{queue_id}-{number}".encode(),
        )
        assert response.code == ResponseCode.SUCCESS, response.remark


def make_topic(graph: StoreGraph, topic: str, queue_count: int = 2, perm: int = 6) -> None:
    graph.send.topics.create_if_absent(TopicConfig(topic, queue_count, queue_count, perm))


def submit_pull(
    graph: StoreGraph,
    topic: str,
    queue_index: int,
    *,
    queue_id: int = 0,
    sys_flag: int = PULL_CONSUMER_FLAGS,
    subscription: str | None = "*",
    message_count_max: int = 32,
    suspend_timeout_ms: int = 15_000,
    conn_id: int = 1,
) -> int:
    header = PullMessageRequestHeader(
        consumer_group="CG",
        topic=topic,
        queue_id=queue_id,
        queue_index=queue_index,
        message_count_max=message_count_max,
        sys_flag=sys_flag,
        commit_queue_index=0,
        suspend_timeout_ms=suspend_timeout_ms,
        sub_version=0,
        subscription=subscription,
    )
    opaque = graph.next_opaque()
    graph.submit(
        pull_processor(graph),
        make_request(RequestCode.PULL_MESSAGE, opaque, header.to_ext()),
        conn_id,
    )
    return opaque


def pull(graph: StoreGraph, topic: str, queue_index: int, **options: object) -> RemotingCommand:
    opaque = submit_pull(graph, topic, queue_index, **options)  # type: ignore[arg-type]
    return graph.wait_reply(opaque)


def offsets_of(response: RemotingCommand) -> tuple[int, int, int]:
    ext = response.ext_fields
    assert ext["suggestWhichBrokerId"] == "0"
    assert all(isinstance(value, str) for value in ext.values())
    return int(ext["nextBeginOffset"]), int(ext["minOffset"]), int(ext["maxOffset"])


def decode_body(body: bytes) -> list[StoredMessage]:
    messages = []
    position = 0
    while position < len(body):
        message = decode_record(body, position)
        messages.append(message)
        position += message.size_bytes
    assert position == len(body)
    return messages


def settle(graph: StoreGraph) -> None:
    """Let the dispatcher publish what the writer appended."""
    graph.pump(3)


# --- the table, row by row ----------------------------------------------------------------------


def test_an_empty_queue_at_offset_0_is_no_new_message(graph: StoreGraph) -> None:
    make_topic(graph, "Empty")
    response = pull(graph, "Empty", 0)
    assert response.code == ResponseCode.PULL_NOT_FOUND
    assert offsets_of(response) == (0, 0, 0)
    assert response.body == b""


def test_an_empty_queue_at_another_offset_is_offset_moved_to_0(graph: StoreGraph) -> None:
    make_topic(graph, "Empty")
    response = pull(graph, "Empty", 5)
    assert response.code == ResponseCode.PULL_OFFSET_MOVED
    assert offsets_of(response)[0] == 0


def test_found_messages_come_whole_and_in_order(graph: StoreGraph) -> None:
    make_topic(graph, "Found")
    put(graph, "Found", 10)
    settle(graph)
    response = pull(graph, "Found", 0)
    assert response.code == ResponseCode.SUCCESS
    assert offsets_of(response) == (10, 0, 10)
    messages = decode_body(response.body)
    assert [message.body for message in messages] == [f"Found-0-{n}".encode() for n in range(10)]
    assert [message.queue_index for message in messages] == list(range(10))
    middle = pull(graph, "Found", 4, message_count_max=3)
    assert offsets_of(middle) == (7, 0, 10)
    assert [message.queue_index for message in decode_body(middle.body)] == [4, 5, 6]


def test_offset_equal_to_max_is_no_new_message_at_that_offset(graph: StoreGraph) -> None:
    make_topic(graph, "AtMax")
    put(graph, "AtMax", 3)
    settle(graph)
    response = pull(graph, "AtMax", 3)
    assert response.code == ResponseCode.PULL_NOT_FOUND
    assert offsets_of(response) == (3, 0, 3)


def test_offset_past_max_is_offset_moved_to_0_when_min_is_0(graph: StoreGraph) -> None:
    make_topic(graph, "PastMax")
    put(graph, "PastMax", 3)
    settle(graph)
    response = pull(graph, "PastMax", 9)
    assert response.code == ResponseCode.PULL_OFFSET_MOVED
    assert offsets_of(response) == (0, 0, 3)


def delete_first_consume_queue_segment(graph: StoreGraph, topic: str, queue_id: int) -> None:
    directory = consume_queue_dir(graph.store_root, topic, queue_id)
    (directory / segment_name(0)).unlink()


def test_offset_below_min_and_past_max_with_min_above_0(shm_instance: str, tmp_path: Path) -> None:
    graph = StoreGraph(
        shm_instance, tmp_path / "home", small_broker(consume_queue_entry_count=4), start_pull=False
    )
    try:
        make_topic(graph, "Retained")
        put(graph, "Retained", 10)
        settle(graph)
        delete_first_consume_queue_segment(graph, "Retained", 0)  # entries 0..3, as retention
        graph.start_pull()
        below = pull(graph, "Retained", 1)
        assert below.code == ResponseCode.PULL_OFFSET_MOVED
        assert offsets_of(below) == (4, 4, 10)
        past = pull(graph, "Retained", 12)
        assert past.code == ResponseCode.PULL_OFFSET_MOVED
        assert offsets_of(past) == (10, 4, 10)  # min is not 0: next is max
        found = pull(graph, "Retained", 4)
        assert found.code == ResponseCode.SUCCESS
        assert decode_body(found.body)[0].queue_index == 4
    finally:
        graph.close()


def test_records_already_deleted_are_offset_moved_to_the_new_minimum(
    shm_instance: str, tmp_path: Path
) -> None:
    broker = small_broker(commit_log_segment_size_bytes=1 << 20, max_message_size_bytes=64 * 1024)
    graph = StoreGraph(shm_instance, tmp_path / "home", broker, start_pull=False)
    try:
        make_topic(graph, "Rolled")
        make_topic(graph, "Filler")
        for topic in ["Rolled"] * 10 + ["Filler"] * 10:  # Filler rolls to a second segment
            response = graph.send_command(
                RequestCode.SEND_MESSAGE, send_header(topic), b"r" * 60_000
            )
            assert response.code == ResponseCode.SUCCESS
        settle(graph)
        first_segment = commit_log_dir(graph.store_root) / segment_name(0)
        assert (commit_log_dir(graph.store_root) / segment_name(1 << 20)).exists()
        first_segment.unlink()  # retention took the oldest commit-log segment
        graph.start_pull()
        # The reader's minimum follows the commit log's (MessageStoreReader): every record of
        # "Rolled" is gone, so its minimum is its maximum and a pull from 0 is told to go there.
        response = pull(graph, "Rolled", 0, message_count_max=4)
        assert response.code == ResponseCode.PULL_OFFSET_MOVED
        assert offsets_of(response) == (10, 10, 10)
        later = pull(graph, "Filler", 9)
        assert later.code == ResponseCode.SUCCESS
    finally:
        graph.close()


def test_a_tag_filter_takes_matching_messages_only(graph: StoreGraph) -> None:
    make_topic(graph, "Tagged")
    for tags in ("TagA", "TagB", "TagC", "TagA", "TagD"):
        put(graph, "Tagged", 1, tags=tags)
    settle(graph)
    response = pull(graph, "Tagged", 0, subscription=" TagA || TagC ")
    assert response.code == ResponseCode.SUCCESS
    assert offsets_of(response) == (5, 0, 5)
    assert [message.queue_index for message in decode_body(response.body)] == [0, 2, 3]
    everything = pull(graph, "Tagged", 0, subscription="*")
    assert len(decode_body(everything.body)) == 5
    # Bit 2 clear: the subscription must come from the group's heartbeat; there is none here.
    unsubscribed = pull(graph, "Tagged", 0, sys_flag=0, subscription="TagZ")
    assert unsubscribed.code == ResponseCode.SUBSCRIPTION_NOT_EXIST


def test_scanned_entries_that_match_nothing_are_retry_immediately(graph: StoreGraph) -> None:
    make_topic(graph, "NoMatch")
    put(graph, "NoMatch", 4, tags="TagA")
    settle(graph)
    response = pull(graph, "NoMatch", 1, subscription="TagB")
    assert response.code == ResponseCode.PULL_RETRY_IMMEDIATELY
    assert offsets_of(response) == (4, 0, 4)
    assert response.body == b""


def test_tag_hashes_follow_the_subscription_rules() -> None:
    assert tag_hashes_of(None).size == 0
    assert tag_hashes_of("").size == 0
    assert tag_hashes_of(" * ").size == 0
    assert tag_hashes_of("a || b ||  a ").tolist() == sorted({97, 98})


# --- errors -------------------------------------------------------------------------------------


def test_an_unknown_topic_is_topic_not_exist(graph: StoreGraph) -> None:
    response = pull(graph, "Nowhere", 0)
    assert response.code == ResponseCode.TOPIC_NOT_EXIST
    assert response.remark is not None
    assert "Nowhere" in response.remark


def test_an_illegal_topic_name_is_topic_not_exist(graph: StoreGraph) -> None:
    for topic in ("%RETRY%../../etc", "", "a b"):
        assert pull(graph, topic, 0).code == ResponseCode.TOPIC_NOT_EXIST


def test_an_unknown_retry_topic_is_made_and_answers_no_new_message(graph: StoreGraph) -> None:
    response = pull(graph, "%RETRY%CG", 0, sys_flag=PULL_CONSUMER_FLAGS)
    assert response.code == ResponseCode.PULL_NOT_FOUND
    assert TopicConfigStore(graph.store_root, graph.broker).get("%RETRY%CG") is not None


def test_a_queue_id_out_of_range_is_system_error(graph: StoreGraph) -> None:
    make_topic(graph, "TwoQueues", queue_count=2)
    response = pull(graph, "TwoQueues", 0, queue_id=2)
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert response.remark is not None
    assert "queueId[2]" in response.remark
    assert pull(graph, "TwoQueues", 0, queue_id=1).code == ResponseCode.PULL_NOT_FOUND


def test_an_unreadable_topic_is_no_permission(graph: StoreGraph) -> None:
    make_topic(graph, "WriteOnly", perm=2)
    assert pull(graph, "WriteOnly", 0).code == ResponseCode.NO_PERMISSION


def test_errors_wait_out_the_error_delay(shm_instance: str, tmp_path: Path) -> None:
    graph = StoreGraph(shm_instance, tmp_path / "home", small_broker(), pull_options={})
    try:
        processor = pull_processor(graph)
        processor.error_delay_ns = 100_000_000
        started = time.monotonic()
        opaque = submit_pull(graph, "Nowhere", 0)
        graph.pump()
        assert not graph.has_reply(opaque)
        assert graph.wait_reply(opaque).code == ResponseCode.TOPIC_NOT_EXIST
        assert time.monotonic() - started >= 0.1
    finally:
        graph.close()


# --- long polling -------------------------------------------------------------------------------


def test_a_pull_without_the_suspend_bit_is_answered_at_once(graph: StoreGraph) -> None:
    make_topic(graph, "Quick")
    opaque = submit_pull(graph, "Quick", 0, sys_flag=PULL_CONSUMER_FLAGS)
    graph.pump()
    assert graph.has_reply(opaque)


def test_a_held_pull_is_answered_when_its_queue_grows(graph: StoreGraph) -> None:
    make_topic(graph, "Held")
    opaque = submit_pull(graph, "Held", 0, sys_flag=PUSH_FLAGS | PULL_FLAG_COMMIT_OFFSET)
    graph.pump(3)
    assert not graph.has_reply(opaque)
    assert pull_processor(graph).statistics_pull().held_now == 1
    other = pull(graph, "Held", 0, queue_id=1)  # another pull is served meanwhile
    assert other.code == ResponseCode.PULL_NOT_FOUND
    put(graph, "Held", 1)
    response = graph.wait_reply(opaque)
    assert response.code == ResponseCode.SUCCESS
    assert [message.body for message in decode_body(response.body)] == [b"Held-0-0"]
    statistics = pull_processor(graph).statistics_pull()
    assert (statistics.held_now, statistics.woken) == (0, 1)


def test_a_held_pull_ignores_other_queues_growing(graph: StoreGraph) -> None:
    make_topic(graph, "HeldOther")
    opaque = submit_pull(graph, "HeldOther", 0, sys_flag=PUSH_FLAGS)
    put(graph, "HeldOther", 2, queue_id=1)
    graph.pump(3)
    assert not graph.has_reply(opaque)
    put(graph, "HeldOther", 1, queue_id=0)
    assert graph.wait_reply(opaque).code == ResponseCode.SUCCESS


def test_a_held_pull_times_out_with_no_new_message(graph: StoreGraph) -> None:
    make_topic(graph, "Timeout")
    started = time.monotonic()
    opaque = submit_pull(graph, "Timeout", 0, sys_flag=PUSH_FLAGS, suspend_timeout_ms=80)
    graph.pump()
    assert not graph.has_reply(opaque)
    response = graph.wait_reply(opaque)
    assert time.monotonic() - started >= 0.08
    assert response.code == ResponseCode.PULL_NOT_FOUND
    assert offsets_of(response) == (0, 0, 0)
    assert pull_processor(graph).statistics_pull().timed_out == 1


def test_many_queues_growing_at_once_wake_every_held_pull(
    shm_instance: str, tmp_path: Path
) -> None:
    graph = StoreGraph(
        shm_instance,
        tmp_path / "home",
        small_broker(),
        dispatcher_options={"grew_key_count_max": 0},
    )
    try:
        make_topic(graph, "Many", queue_count=3)
        opaques = [
            submit_pull(graph, "Many", 0, queue_id=queue_id, sys_flag=PUSH_FLAGS, conn_id=queue_id)
            for queue_id in range(3)
        ]
        graph.pump(2)
        for queue_id in range(3):
            put(graph, "Many", 1, queue_id=queue_id)
        for opaque in opaques:
            assert graph.wait_reply(opaque).code == ResponseCode.SUCCESS
        assert graph.dispatcher.statistics().many_wakeups_sent > 0
    finally:
        graph.close()


def test_a_tag_filtered_held_pull_woken_by_other_tags_gets_retry_immediately(
    graph: StoreGraph,
) -> None:
    make_topic(graph, "HeldTags")
    opaque = submit_pull(graph, "HeldTags", 0, sys_flag=PUSH_FLAGS, subscription="TagA")
    graph.pump(2)
    put(graph, "HeldTags", 1, tags="TagB")
    response = graph.wait_reply(opaque)
    assert response.code == ResponseCode.PULL_RETRY_IMMEDIATELY
    assert offsets_of(response)[0] == 1


def test_a_closed_connection_releases_its_held_pulls_and_no_others(graph: StoreGraph) -> None:
    make_topic(graph, "HeldClosed")
    processor = pull_processor(graph)
    processor.error_delay_ns = 500_000_000  # so an error answer waits too
    gone = submit_pull(graph, "HeldClosed", 0, sys_flag=PUSH_FLAGS, conn_id=7)
    staying = submit_pull(graph, "HeldClosed", 0, sys_flag=PUSH_FLAGS, conn_id=8)
    failed = submit_pull(graph, "NoSuchTopicHere", 0, sys_flag=PUSH_FLAGS, conn_id=7)
    assert processor.statistics_pull().held_now == 2  # handle() held them; nothing is due yet
    processor.on_connection_closed(ConnectionEvent(7, 0, "127.0.0.1", 40_000))
    statistics = processor.statistics_pull()
    assert (statistics.held_now, statistics.released_on_close) == (1, 1)
    processor.on_connection_closed(ConnectionEvent(7, 0, "127.0.0.1", 40_000))  # twice: no-op
    assert processor.statistics_pull().released_on_close == 1
    put(graph, "HeldClosed", 1)
    assert graph.wait_reply(staying).code == ResponseCode.SUCCESS
    time.sleep(0.6)  # past the error delay of the unknown topic's answer
    graph.pump(3)
    assert not graph.has_reply(gone)
    assert not graph.has_reply(failed)
    statistics = processor.statistics_pull()
    assert (statistics.held_now, statistics.woken, statistics.timed_out) == (0, 1, 0)


def test_the_pull_status_view_reports_the_counters(graph: StoreGraph) -> None:
    make_topic(graph, "Viewed")
    opaque = submit_pull(graph, "Viewed", 0, sys_flag=PUSH_FLAGS)
    graph.pump(2)
    status_opaque = graph.next_opaque()
    graph.submit(pull_processor(graph), make_request(MQBOX_PULL_STATUS, status_opaque, {}), 2)
    status = graph.wait_reply(status_opaque)
    assert status.code == ResponseCode.SUCCESS
    document = json.loads(status.body)
    assert document["role"] == "pull.0"
    assert (document["pulls"], document["heldNow"], document["releasedOnClose"]) == (1, 1, 0)
    assert not graph.has_reply(opaque)
