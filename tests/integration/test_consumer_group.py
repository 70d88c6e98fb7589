"""A consumer group under load: it grows from 1 to 3 clients and shrinks back without losing a
message, and every allocation strategy splits the queues without overlap or gap.

Goal: (1) while a producer keeps sending, a clustering group of PushConsumers on a topic of 8
queues grows 1 -> 2 -> 3 clients and shrinks back 3 -> 2 -> 1; every acknowledged message is
consumed at least once (the duplicates, at-least-once redeliveries around each handover, are
counted and reported, and stay below the messages in flight around the rebalances); while 3
clients run, their queues, once settled, are disjoint and cover every queue of the topic and
of the group's %RETRY% topic; (2) groups using averagely_by_circle and consistent_hash split
their queues without overlap or gap too.
Method: one real appliance for the module; consumers and the load producer (tests/support/
consumers.py) in the test process; each consumer reports its queues (PushConsumer.queues());
rebalances are driven by the broker's NOTIFY_CONSUMER_IDS_CHANGED plus a 2 s round; counts go
to the test's properties (pytest --junitxml, or -s for the printed line).
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from mqbox.client import MessageQueue, Producer, PushConsumer
from tests.support.appliance import Appliance
from tests.support.consumers import Collector, Load, group_name
from tests.support.read_back import create_topic
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

QUEUE_COUNT = 8
SETTLE_S = 30.0
PHASE_S = 2.0


def settled(consumers: list[PushConsumer], topic: str, group: str) -> bool:
    """The members' queues are disjoint and cover the topic's 8 queues and the retry queue."""
    held = [queue for consumer in consumers for queue in consumer.queues()]
    wanted = {MessageQueue(topic, "broker-a", queue_id) for queue_id in range(QUEUE_COUNT)}
    wanted.add(MessageQueue(f"%RETRY%{group}", "broker-a", 0))
    return len(held) == len(set(held)) and set(held) == wanted


def received_by(collectors: list[Collector]) -> Counter[bytes]:
    return sum((collector.bodies() for collector in collectors), Counter())


def start(
    appliance: Appliance,
    group: str,
    topic: str,
    collector: Callable[..., object],
    allocate: str = "averagely",
) -> PushConsumer:
    consumer = PushConsumer(
        group,
        appliance.namesrv_address,
        allocate=allocate,
        consume_batch_size=16,
        rebalance_interval_ms=2000,
        persist_interval_ms=500,
    )
    consumer.subscribe(topic, "*", collector)  # type: ignore[arg-type]
    consumer.start()
    return consumer


@pytest.fixture
def load_producer(appliance: Appliance) -> Iterator[Producer]:
    with Producer(group_name("PG"), appliance.namesrv_address) as producer:
        yield producer


def test_a_group_grows_and_shrinks_under_load_without_losing_a_message(
    appliance: Appliance, load_producer: Producer, record_property: Callable[[str, object], None]
) -> None:
    topic = group_name("GroupLoad")
    group = group_name("CG")
    create_topic(appliance, topic, QUEUE_COUNT)
    collectors = [Collector(name) for name in ("A", "B", "C")]
    members: list[PushConsumer] = []
    try:
        with Load(load_producer, topic) as load:
            members.append(start(appliance, group, topic, collectors[0]))
            time.sleep(PHASE_S)
            members.append(start(appliance, group, topic, collectors[1]))
            time.sleep(PHASE_S)
            members.append(start(appliance, group, topic, collectors[2]))
            wait_until(lambda: settled(members, topic, group), "3 members settled", SETTLE_S)
            held = {consumer.client_id: consumer.queues() for consumer in members}
            time.sleep(PHASE_S)
            members.pop().shutdown()
            wait_until(lambda: settled(members, topic, group), "2 members settled", SETTLE_S)
            time.sleep(PHASE_S)
            members.pop().shutdown()
            wait_until(lambda: settled(members, topic, group), "1 member settled", SETTLE_S)
            time.sleep(PHASE_S)
        sent = Counter(load.acknowledged)
        wait_until(
            lambda: not sent - received_by(collectors),
            "every acknowledged message consumed",
            SETTLE_S,
        )
        statistics = [consumer.statistics() for consumer in members]
    finally:
        for consumer in members:
            consumer.shutdown()
    received = received_by(collectors)
    assert not sent - received  # nothing lost
    assert set(received) <= set(sent)
    duplicates = sum(received.values()) - len(received)
    per_member = {c.label: c.count() for c in collectors}
    record_property("messages", len(sent))
    record_property("duplicates", duplicates)
    record_property("per_member", per_member)
    record_property("rebalances_of_A", statistics[0].rebalances)
    sys.stderr.write(
        f"\ngroup under load: {len(sent)} messages, {duplicates} duplicates, per member "
        f"{per_member}, A's rebalances {statistics[0].rebalances}, queue changes "
        f"{statistics[0].queue_changes}, load send failures {load.failures}\n"
    )
    assert all(count > 0 for count in per_member.values())
    assert duplicates < len(sent) // 2
    assert len({queue for queues in held.values() for queue in queues}) == QUEUE_COUNT + 1


@pytest.mark.parametrize("allocate", ["averagely_by_circle", "consistent_hash"])
def test_every_strategy_splits_the_queues_without_overlap_or_gap(
    appliance: Appliance, allocate: str
) -> None:
    topic = group_name("GroupSplit")
    group = group_name("CG")
    create_topic(appliance, topic, QUEUE_COUNT)
    members = [start(appliance, group, topic, Collector(), allocate) for _ in range(3)]
    try:
        wait_until(lambda: settled(members, topic, group), "3 members settled", SETTLE_S)
    finally:
        for consumer in members:
            consumer.shutdown()
