"""The C++ producer to mqbox's PushConsumer, and one consumer group of both clients.

Goal: (1) messages the official C++ producer (PyPI rocketmq==0.4.4) sends (Unicode bodies and
properties, bodies over the 4 KiB at which it compresses, delayed messages) reach a clustering
mqbox PushConsumer exactly once with the body, tags, keys and user properties they were sent
with; compressed ones arrive inflated, delayed ones after their delay. (2) A C++ PushConsumer and
an mqbox PushConsumer in ONE group on a topic of 8 queues split the queues as both clients'
averagely allocation says for the broker's sorted id list (docs/client.md B.4): once the
rebalance settled, every message is consumed exactly once, no queue is consumed by both, and the
union of their queues is all 8.
Method: one real appliance for the module; the C++ clients run in child processes
(tests/interop/cpp_client.py), the mqbox consumer and producer in the test process. Settling is
observed, not waited for by the clock: rounds of probe messages are sent until one round is
consumed by each client on its own queues only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

import pytest

from mqbox.client import MessageQueue, Producer, PushConsumer
from mqbox.client.allocate import STRATEGIES, allocate
from tests.conftest import unique_name
from tests.interop.cpp_client import (
    SEQ_PROPERTY,
    MessageView,
    SentMessage,
    acknowledged,
    assert_exactly_once,
    consumer_ids,
    cpp_child,
    create_topic,
    produce,
    property_names,
    push_spec,
    received_view,
    sample_messages,
)
from tests.support.appliance import Appliance
from tests.support.consumers import Collector, Seen, group_name
from tests.support.waiting import wait_until

pytestmark = pytest.mark.interop

WAIT_S = 60.0
DELAY_LEVEL = 1  # 1 s on a default broker
DELAY_MS = 1000
MIXED_QUEUE_COUNT = 8
PROBE_ROUNDS_MAX = 30


def mqbox_view(seen: Seen, names: Collection[str]) -> MessageView:
    """The comparable view of a message mqbox's consumer received: the user properties the
    test sent (`names`), as the C++ consumer child reports them."""
    properties = seen.property_map
    return MessageView(
        properties.get(SEQ_PROPERTY, ""),
        hashlib.sha256(seen.body).hexdigest(),
        len(seen.body),
        properties.get("TAGS", ""),
        properties.get("KEYS", ""),
        tuple(sorted((name, value) for name, value in seen.properties if name in names)),
    )


def test_mqbox_push_consumer_receives_what_the_cpp_producer_sent(
    appliance: Appliance, tmp_path: Path, reap_pids: list[int]
) -> None:
    topic = unique_name("CppToMqbox")
    create_topic(appliance, topic, 4)
    messages = sample_messages("cpp", 40, big_every=5)
    delayed = {message.seq for message in messages[3::7]}
    names = property_names(messages)
    collector = Collector("mqbox")
    with PushConsumer(
        group_name("CG_cpp_producer"),
        appliance.namesrv_address,
        consume_from="first",
        consume_batch_size=16,
        rebalance_interval_ms=1000,
    ) as consumer:
        consumer.subscribe(topic, "*", collector)
        events = produce(
            tmp_path / "producer",
            appliance,
            topic,
            messages,
            reap_pids,
            delay_levels=dict.fromkeys(delayed, DELAY_LEVEL),
        )
        assert set(acknowledged(events)) == {m.seq for m in messages}, events
        wanted = {m.seq for m in messages}
        wait_until(
            lambda: wanted <= {dict(s.properties).get(SEQ_PROPERTY) for s in collector.seen()},
            "every message at the mqbox consumer",
            WAIT_S,
        )
    seen = collector.seen()
    views = [mqbox_view(s, names) for s in seen]
    assert_exactly_once(views, messages, "mqbox consumer")
    big = [s for s in seen if len(s.body) > 4096]
    assert big, "the sample has bodies the C++ producer compresses"
    for s in seen:
        seq = s.property_map[SEQ_PROPERTY]
        if seq in delayed:
            assert s.store_timestamp_ms - s.born_timestamp_ms >= DELAY_MS - 50, (seq, s)
            assert s.topic == topic


def test_a_group_of_the_cpp_and_the_mqbox_push_consumer_splits_the_queues(
    appliance: Appliance, tmp_path: Path, reap_pids: list[int]
) -> None:
    topic = unique_name("Mixed")
    group = unique_name("CG-mixed")
    create_topic(appliance, topic, MIXED_QUEUE_COUNT)
    all_queues = {MessageQueue(topic, "broker-a", q) for q in range(MIXED_QUEUE_COUNT)}
    messages = sample_messages("mix", 400, big_every=9)
    probes = [SentMessage(f"probe-{n}", f"probe {n}") for n in range(PROBE_ROUNDS_MAX * 16)]
    names = property_names([*messages, *probes])
    collector = Collector("mqbox")
    spec = push_spec(appliance, group, topic, [*messages, *probes])
    with (
        cpp_child(tmp_path / "cpp-consumer", spec, reap_pids) as cpp,
        Producer(unique_name("PG_mixed"), appliance.namesrv_address) as producer,
    ):
        cpp.wait_started()
        consumer = PushConsumer(
            group,
            appliance.namesrv_address,
            consume_batch_size=8,
            rebalance_interval_ms=2000,
        )
        consumer.subscribe(topic, "*", collector)
        consumer.start()
        try:
            wait_until(lambda: len(consumer_ids(appliance, group)) == 2, "both members", WAIT_S)
            ids = sorted(consumer_ids(appliance, group))
            cpp_id = next(i for i in ids if i != consumer.client_id)
            ordered = sorted(all_queues, key=lambda q: q.queue_id)
            averagely = STRATEGIES["averagely"]
            mine = set(allocate(averagely, consumer.client_id, ordered, ids))
            theirs = set(allocate(averagely, cpp_id, ordered, ids))
            assert mine
            assert theirs
            assert mine | theirs == all_queues
            assert not mine & theirs
            wait_until(lambda: set(consumer.queues(topic)) == mine, "mqbox's allocation", WAIT_S)

            def send(batch: Sequence[SentMessage]) -> None:
                for message in batch:
                    producer.send(
                        topic,
                        message.body.encode("utf-8"),
                        tags=message.tags or None,
                        keys=message.keys,
                        properties=message.user_properties(),
                    )

            def consumed() -> set[str]:
                """The seqs either client received."""
                found = {str(e["properties"].get(SEQ_PROPERTY, "")) for e in cpp.messages()}
                return found | {s.property_map.get(SEQ_PROPERTY, "") for s in collector.seen()}

            def all_consumed(seqs: set[str]) -> Callable[[], bool]:
                return lambda: seqs <= consumed()

            # Probe rounds until one is consumed by each client on its own queues only.
            settled = False
            for round_number in range(PROBE_ROUNDS_MAX):
                batch = probes[round_number * 16 : (round_number + 1) * 16]
                cpp_before, mqbox_before = len(cpp.messages()), collector.count()
                send(batch)
                wait_until(all_consumed({m.seq for m in batch}), "a probe round", WAIT_S)
                cpp_queues = {int(e["queue_id"]) for e in cpp.messages()[cpp_before:]}
                mqbox_queues = {s.queue_id for s in collector.seen()[mqbox_before:]}
                if not cpp_queues & {q.queue_id for q in mine} and not mqbox_queues & {
                    q.queue_id for q in theirs
                }:
                    settled = True
                    break
            assert settled, "the rebalance never settled"
            cpp_before, mqbox_before = len(cpp.messages()), collector.count()
            send(messages)
            wanted = {m.seq for m in messages}
            wait_until(all_consumed(wanted), "every message", WAIT_S)
        finally:
            consumer.shutdown()
        cpp.finish()
    cpp_events = cpp.messages()[cpp_before:]
    mqbox_seen = collector.seen()[mqbox_before:]
    views = [received_view(e) for e in cpp_events]
    views += [mqbox_view(s, names) for s in mqbox_seen]
    views = [v for v in views if not v.seq.startswith("probe-")]
    assert_exactly_once(views, messages, "the mixed group")
    cpp_queues = {int(e["queue_id"]) for e in cpp_events}
    mqbox_queues = {s.queue_id for s in mqbox_seen}
    assert cpp_queues == {q.queue_id for q in theirs}
    assert mqbox_queues == {q.queue_id for q in mine}
    assert not cpp_queues & mqbox_queues
