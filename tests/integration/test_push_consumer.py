"""PushConsumer and PullConsumer against the real appliance: what arrives, what is committed,
what goes back.

Goal: (1) a push handler receives every message once with every field as the Producer sent it
and the broker stored it (topic, queue, queue offset, commit-log offset, msg id = UNIQ_KEY,
tags, keys, properties, Unicode and compressed bodies, born and store times and hosts,
reconsume times), in batches of at most consume_batch_size; (2) the tag filter delivers exactly
the subscribed tags; (3) offsets reach the broker within the persist interval and at shutdown,
as `mqbox offset show` reports them (lag 0); (4) a message its handler keeps failing comes back
from %RETRY% under its own topic with growing reconsume times, then lands in %DLQ%<group>, read
back there; (5) broadcasting members each get every message and resume from their local offset
files after a restart; (6) an offset reset (220) makes a running consumer consume again from
the reset offsets; (7) shutdown is bounded by its timeout even with a handler stuck in a call;
(8) the lite PullConsumer polls everything once and commits what it returned, assign and
subscribe exclude each other, and seek moves a queue (refusing offsets out of range); (9) flow
control stops the pulls of a queue whose handler holds its messages.
Method: one real appliance for the module (tests/conftest.py's `appliance`); consumers and
producers in the test process, with short rebalance and persist intervals where a test waits
for them; what the broker stored is read back raw (tests/support/read_back.py) and its
committed offsets through mqbox.admin.broker_ops (the code behind `mqbox offset show`).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

from mqbox.admin import broker_ops
from mqbox.client import (
    ClientStateError,
    ConsumeResult,
    MessageQueue,
    OffsetOutOfRangeError,
    Producer,
    PullConsumer,
    PushConsumer,
    ReceivedMessage,
    SendResult,
)
from mqbox.client.consumer_core import ConsumerOptions
from mqbox.client.remoting import RemotingClient
from mqbox.message import encode_offset_msg_id, pack_host
from tests.support.appliance import Appliance
from tests.support.consumers import Collector, group_name
from tests.support.read_back import (
    REQUEST_TIMEOUT_MS,
    create_topic,
    read_back_until,
    wait_dispatched,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

QUEUE_COUNT = 4
DELIVERY_S = 30.0
FAST: ConsumerOptions = {"rebalance_interval_ms": 1000, "persist_interval_ms": 500}


def topic_name(kind: str) -> str:
    return group_name(kind)


def send_all(appliance: Appliance, topic: str, count: int, **options: object) -> list[SendResult]:
    """`count` sync sends, then a wait until the broker dispatched them: an ack means the record
    is in the CommitLog, and its queue's max offset moves a moment later."""
    with Producer(group_name("PG"), appliance.namesrv_address) as producer:
        results = [
            producer.send(topic, f"message {number}".encode(), **options)  # type: ignore[arg-type]
            for number in range(count)
        ]
    with RemotingClient(appliance.broker_address, REQUEST_TIMEOUT_MS) as broker:
        wait_dispatched(broker)
    return results


def poll_until(consumer: PullConsumer, count: int) -> list[ReceivedMessage]:
    got: list[ReceivedMessage] = []
    deadline = time.monotonic() + DELIVERY_S
    while len(got) < count:
        assert time.monotonic() < deadline, f"polled {len(got)} of {count}"
        got.extend(consumer.poll(200))
    return got


def committed(appliance: Appliance, group: str, topic: str) -> dict[int, int]:
    shown = broker_ops.offset_show(appliance.namesrv_address, group, topic)
    return {row.queue_id: row.consumer_queue_index for row in shown.queues if row.topic == topic}


def test_every_field_arrives_as_sent_and_stored(appliance: Appliance) -> None:
    topic = topic_name("PushFields")
    create_topic(appliance, topic, QUEUE_COUNT)
    big = ("✓ big body " * 600).encode()  # over 4 KiB: stored compressed
    sent: dict[bytes, SendResult] = {}
    with Producer(group_name("PG"), appliance.namesrv_address) as producer:
        for number in range(40):
            body = big + str(number).encode() if number % 10 == 0 else f"消息 {number}".encode()
            sent[body] = producer.send(
                topic,
                body,
                tags=f"Tag{number % 3}",
                keys=[f"k{number}", "shared"],
                properties={"n": str(number), "名前": "値 ✓"},
            )
    stored = {
        record.queue_index + 1_000_000 * queue_id: record
        for queue_id, records in read_back_until(appliance, topic, len(sent)).items()
        for record in records
    }
    batches: list[int] = []
    collector = Collector("one")

    def handler(messages: Sequence[ReceivedMessage]) -> ConsumeResult | None:
        batches.append(len(messages))
        return collector(messages)

    group = group_name("CG")
    with PushConsumer(group, appliance.namesrv_address, consume_batch_size=8) as consumer:
        consumer.subscribe(topic, "*", handler)
        wait_until(lambda: collector.count() >= len(sent), "every message", DELIVERY_S)
    seen = collector.seen()
    assert Counter(s.body for s in seen) == Counter(list(sent))  # once each
    assert max(batches) <= 8
    for message in seen:
        result = sent[message.body]
        record = stored[message.queue_offset + 1_000_000 * message.queue_id]
        sequence = message.property_map["n"]
        assert (message.topic, message.pulled_topic) == (topic, topic)
        assert (message.broker, message.queue_id) == (
            result.queue.broker_name,
            result.queue.queue_id,
        )
        assert message.queue_offset == result.queue_offset == record.queue_index
        assert message.commit_log_offset == record.log_offset_bytes
        assert message.msg_id == result.msg_id == message.property_map["UNIQ_KEY"]
        assert message.offset_msg_id == result.offset_msg_id
        assert message.offset_msg_id == encode_offset_msg_id(
            record.store_host, record.log_offset_bytes
        )
        assert message.tags == f"Tag{int(sequence) % 3}"
        assert message.keys == (f"k{sequence}", "shared")
        assert message.property_map["名前"] == "値 ✓"
        assert message.born_timestamp_ms == record.born_timestamp_ms
        assert message.store_timestamp_ms == record.store_timestamp_ms
        assert pack_host(*message.store_host) == record.store_host
        assert pack_host(*message.born_host) == record.born_host
        assert message.reconsume_times == 0


def test_the_tag_filter_delivers_exactly_the_subscribed_tags(appliance: Appliance) -> None:
    topic = topic_name("PushTags")
    create_topic(appliance, topic, QUEUE_COUNT)
    tags = ["A", "B", "C", None, "AB"]
    with Producer(group_name("PG"), appliance.namesrv_address) as producer:
        for number in range(50):
            producer.send(topic, f"{number}".encode(), tags=tags[number % len(tags)])
    collector = Collector()
    with PushConsumer(group_name("CG"), appliance.namesrv_address, consume_batch_size=4) as c:
        c.subscribe(topic, "A || C", collector)
        wait_until(lambda: collector.count() >= 20, "the A and C messages", DELIVERY_S)
        time.sleep(1.0)  # nothing else may come
    assert collector.count() == 20
    assert {s.tags for s in collector.seen()} == {"A", "C"}


def test_offsets_reach_the_broker_periodically_and_at_shutdown(appliance: Appliance) -> None:
    topic = topic_name("PushOffsets")
    create_topic(appliance, topic, QUEUE_COUNT)
    results = send_all(appliance, topic, 30)
    ends = Counter(result.queue.queue_id for result in results)
    group = group_name("CG")
    collector = Collector()
    consumer = PushConsumer(group, appliance.namesrv_address, consume_batch_size=5, **FAST)
    consumer.subscribe(topic, "*", collector)
    consumer.start()
    try:
        wait_until(lambda: collector.count() >= 30, "every message", DELIVERY_S)
        wait_until(
            lambda: committed(appliance, group, topic) == dict(ends),
            "the periodic persistence",
            DELIVERY_S,
        )
        shown = broker_ops.offset_show(appliance.namesrv_address, group, topic)
        assert shown.total_lag == 0
        assert consumer.client_id in shown.client_ids
        more = send_all(appliance, topic, 12)
        wait_until(lambda: collector.count() >= 42, "the later messages", DELIVERY_S)
    finally:
        consumer.shutdown()
    ends.update(result.queue.queue_id for result in more)
    assert committed(appliance, group, topic) == dict(ends)  # shutdown persisted the rest
    assert consumer.statistics().offset_persist_failures == 0


def test_a_failing_message_is_retried_then_dead_lettered(appliance: Appliance) -> None:
    topic = topic_name("PushRetry")
    create_topic(appliance, topic, 1)
    group = group_name("CG")
    (result,) = send_all(appliance, topic, 1, tags="R", keys="retry-key")
    collector = Collector(answer=lambda _: ConsumeResult.RECONSUME_LATER)
    with PushConsumer(
        group,
        appliance.namesrv_address,
        max_reconsume_times=2,
        retry_delay_level=1,  # 1 s rather than 10 s, 30 s, ...
        **FAST,
    ) as consumer:
        consumer.subscribe(topic, "*", collector)
        wait_until(lambda: collector.count() >= 3, "the message and its 2 retries", DELIVERY_S)
        # The handler's third answer is sent back (to the DLQ) after it returned.
        wait_until(lambda: consumer.statistics().sent_back >= 3, "the third send-back", DELIVERY_S)
        time.sleep(2.5)  # a fourth delivery would come within a second
        statistics = consumer.statistics()
    seen = collector.seen()
    assert [s.reconsume_times for s in seen] == [0, 1, 2]
    assert [s.pulled_topic for s in seen] == [topic, f"%RETRY%{group}", f"%RETRY%{group}"]
    assert {s.topic for s in seen} == {topic}  # retries show the topic it was sent to
    assert {s.msg_id for s in seen} == {result.msg_id}
    assert {s.tags for s in seen} == {"R"}
    assert statistics.sent_back == 3
    dead = [
        r for records in read_back_until(appliance, f"%DLQ%{group}", 1).values() for r in records
    ]
    assert len(dead) == 1
    assert dead[0].reconsume_times == 3
    assert dead[0].body == b"message 0"


def test_broadcasting_members_get_everything_and_resume_from_their_files(
    appliance: Appliance, tmp_path: Path
) -> None:
    topic = topic_name("PushBroadcast")
    create_topic(appliance, topic, QUEUE_COUNT)
    group = group_name("CG")
    send_all(appliance, topic, 20)

    def member(name: str, collector: Collector) -> PushConsumer:
        consumer = PushConsumer(
            group,
            appliance.namesrv_address,
            model="broadcasting",
            consume_from="first",
            instance_name=name,
            offset_store_dir=tmp_path,
            rebalance_interval_ms=1000,
            persist_interval_ms=500,
        )
        consumer.subscribe(topic, "*", collector)
        consumer.start()
        return consumer

    first, second = Collector("first"), Collector("second")
    members = [member("member-1", first), member("member-2", second)]
    try:
        wait_until(lambda: first.count() >= 20 and second.count() >= 20, "both", DELIVERY_S)
        client_ids = [consumer.client_id for consumer in members]
    finally:
        for consumer in members:
            consumer.shutdown()
    assert first.bodies() == second.bodies() == Counter(f"message {n}".encode() for n in range(20))
    files = sorted(tmp_path.glob("*/*/offsets.json"))
    assert [path.parent.parent.name for path in files] == sorted(client_ids)
    send_all(appliance, topic, 5)
    again = Collector("again")
    restarted = member("member-1", again)
    try:
        wait_until(lambda: again.count() >= 5, "the new messages", DELIVERY_S)
        time.sleep(1.0)
    finally:
        restarted.shutdown()
    assert sorted(again.bodies()) == [f"message {n}".encode() for n in range(5)]
    assert again.count() == 5  # the 20 of before are not consumed again


def test_an_offset_reset_makes_a_running_consumer_consume_again(appliance: Appliance) -> None:
    topic = topic_name("PushReset")
    create_topic(appliance, topic, 2)
    send_all(appliance, topic, 10)
    group = group_name("CG")
    collector = Collector()
    with PushConsumer(group, appliance.namesrv_address, **FAST) as consumer:
        consumer.subscribe(topic, "*", collector)
        wait_until(lambda: collector.count() >= 10, "every message", DELIVERY_S)
        wait_until(lambda: sum(committed(appliance, group, topic).values()) == 10, "commits")
        reset = broker_ops.offset_reset(appliance.namesrv_address, group, topic, "earliest")
        assert reset.clients_notified >= 1
        wait_until(lambda: collector.count() >= 20, "the messages once more", DELIVERY_S)
    assert collector.bodies() == Counter({f"message {n}".encode(): 2 for n in range(10)})


def test_shutdown_is_bounded_with_a_handler_stuck_in_a_call(appliance: Appliance) -> None:
    topic = topic_name("PushStuck")
    create_topic(appliance, topic, 1)
    send_all(appliance, topic, 3)
    stuck = threading.Event()
    release = threading.Event()

    def handler(messages: Sequence[ReceivedMessage]) -> ConsumeResult:
        stuck.set()
        release.wait(60)
        return ConsumeResult.SUCCESS

    consumer = PushConsumer(group_name("CG"), appliance.namesrv_address)
    consumer.subscribe(topic, "*", handler)
    consumer.start()
    try:
        assert stuck.wait(DELIVERY_S)
        began = time.monotonic()
        consumer.shutdown(timeout_ms=2000)
        assert time.monotonic() - began < 3.0
        with pytest.raises(ClientStateError):
            consumer.start()
    finally:
        release.set()


def test_the_lite_consumer_polls_once_and_commits_what_it_returned(appliance: Appliance) -> None:
    topic = topic_name("LitePoll")
    create_topic(appliance, topic, QUEUE_COUNT)
    results = send_all(appliance, topic, 40)
    group = group_name("SG")
    got: list[ReceivedMessage] = []
    with PullConsumer(group, appliance.namesrv_address, auto_commit=False) as consumer:
        consumer.subscribe(topic, "*")
        with pytest.raises(ClientStateError, match="mutually exclusive"):
            consumer.assign([MessageQueue(topic, "broker-a", 0)])
        deadline = time.monotonic() + DELIVERY_S
        while len(got) < 40 and time.monotonic() < deadline:
            batch = consumer.poll(500)
            assert len(batch) <= 10  # pull_batch_size: one pulled batch per poll
            got.extend(batch)
        assert consumer.poll(300) == []
        # Nothing committed yet: GET_CONSUME_STATS shows 0 (Java's rule).
        assert committed(appliance, group, topic) == dict.fromkeys(range(QUEUE_COUNT), 0)
        done = consumer.commit()
    assert sorted(m.body for m in got) == sorted(f"message {n}".encode() for n in range(40))
    ends = Counter(result.queue.queue_id for result in results)
    assert {queue.queue_id: offset for queue, offset in done.items()} == dict(ends)
    assert committed(appliance, group, topic) == dict(ends)


def test_the_lite_consumer_assigns_and_seeks(appliance: Appliance) -> None:
    topic = topic_name("LiteSeek")
    create_topic(appliance, topic, 1)
    send_all(appliance, topic, 10)
    queue = MessageQueue(topic, "broker-a", 0)
    group = group_name("SG")
    with PullConsumer(group, appliance.namesrv_address) as consumer:
        consumer.assign([queue])
        consumer.seek(queue, 7)
        got = poll_until(consumer, 3)
        assert [m.queue_offset for m in got] == [7, 8, 9]
        with pytest.raises(OffsetOutOfRangeError) as raised:
            consumer.seek(queue, 11)
        assert (raised.value.min_offset, raised.value.max_offset) == (0, 10)
        consumer.seek_to_begin(queue)
        again = poll_until(consumer, 10)
        assert [m.queue_offset for m in again] == list(range(10))
        assert consumer.assignment() == [queue]
    # auto-commit committed what poll returned, at shutdown; assign registered nothing
    assert committed(appliance, group, topic) == {0: 10}
    assert broker_ops.offset_show(appliance.namesrv_address, group, topic).client_ids == ()


def test_flow_control_stops_pulling_while_the_handler_holds_the_queue(
    appliance: Appliance,
) -> None:
    """(9) docs/client.md B.7 checks 4 to 6: with the handler blocked, a queue with
    `pull_threshold_count` messages cached is not pulled again (the waits are counted); once the
    handler lets go, everything arrives."""
    topic = topic_name("PushFlow")
    create_topic(appliance, topic, 1)
    send_all(appliance, topic, 300)
    release = threading.Event()
    collector = Collector(answer=lambda _: ConsumeResult.SUCCESS if release.wait(60) else None)
    threshold, batch = 20, 8
    with PushConsumer(
        group_name("CG"),
        appliance.namesrv_address,
        consume_from="first",
        threads=1,
        consume_batch_size=4,
        pull_batch_size=batch,
        pull_threshold_count=threshold,
        rebalance_interval_ms=1000,
    ) as consumer:
        consumer.subscribe(topic, "*", collector)
        wait_until(
            lambda: consumer.statistics().flow_control_waits >= 5, "flow control waits", DELIVERY_S
        )
        held = consumer.statistics().pulled_messages
        # A pull goes out while fewer than `threshold` are cached: at most one batch over it.
        assert threshold <= held <= threshold + batch
        assert collector.count() <= 4  # the one call the handler is stuck in
        release.set()
        wait_until(lambda: collector.count() >= 300, "every message", DELIVERY_S)
    assert sorted(s.queue_offset for s in collector.seen()) == list(range(300))
