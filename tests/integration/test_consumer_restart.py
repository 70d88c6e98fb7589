"""Consumers across a broker restart, and where new groups start when the broker has deleted
old messages.

Goal: (1) a PushConsumer consuming while a producer keeps sending goes on after the appliance
(broker and name server) is stopped and started again on the same home and ports: it
reconnects by itself and every message acknowledged before, during (none can be) and after the
restart is consumed at least once; (2) on a broker whose retention already deleted the first
messages of a queue (so QUERY_CONSUMER_OFFSET answers 22 for a new group), consume_from does
what docs/client.md B.6 says: `first` starts at 0, is told OFFSET_ILLEGAL, and after Java's
10 s repair consumes from the broker's minimum on (nothing lost, nothing below it); `last`
starts at the queue's end and gets only what is sent later; `timestamp` starts at the message
stored nearest its time.
Method: appliances of the test's own (tests/support/appliance.py): the restart reuses the first
one's ports; the retention one has 64 KiB commit-log segments kept for 0 hours and a cleaning
every 300 ms (as tests/integration/test_retention.py), so its queue's minimum moves past 0 once
a few segments were written. Consumers and producers run in the test process.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from pathlib import Path

import pytest

from mqbox.client import MessageQueue, Producer, PushConsumer
from mqbox.client.pull import max_offset, min_offset
from mqbox.client.remoting import RemotingClient
from tests.integration.test_retention import BROKER_CONF as RETENTION_CONF
from tests.support.appliance import running_appliance
from tests.support.consumers import Collector, Load, group_name
from tests.support.read_back import create_topic
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

QUEUE_COUNT = 4
WAIT_S = 40.0
OLD_COUNT = 300  # about 1.1 KB each: five 64 KiB segments


def test_a_consumer_goes_on_after_the_broker_restarts(tmp_path: Path, reap_pids: list[int]) -> None:
    home = tmp_path / "appliance"
    topic = group_name("Restart")
    group = group_name("CG")
    collector = Collector()
    with running_appliance(home, reap_pids) as first:
        create_topic(first, topic, QUEUE_COUNT)
        ports = (first.broker_port, int(first.namesrv_address.rsplit(":", 1)[1]))
        producer = Producer(group_name("PG"), first.namesrv_address)
        producer.start()
        consumer = PushConsumer(
            group,
            first.namesrv_address,
            consume_batch_size=8,
            rebalance_interval_ms=1000,
            persist_interval_ms=500,
        )
        consumer.subscribe(topic, "*", collector)
        consumer.start()
        load = Load(producer, topic, "before")
        with load:
            wait_until(lambda: collector.count() >= 200, "consumption before", WAIT_S)
    try:
        sent = Counter(load.acknowledged)
        with running_appliance(
            home, reap_pids, broker_port=ports[0], namesrv_port=ports[1]
        ) as back:
            with Load(producer, topic, "after") as after:
                wait_until(lambda: len(after.acknowledged) >= 200, "sends after", WAIT_S)
            sent.update(after.acknowledged)
            wait_until(lambda: not sent - collector.bodies(), "every message consumed", WAIT_S)
            transports = consumer.instance.statistics().transports
            assert any(t.connects >= 2 for t in transports if t.address == back.broker_address)
            statistics = consumer.statistics()
    finally:
        consumer.shutdown()
        producer.shutdown()
    received = collector.bodies()
    assert not sent - received
    assert set(received) <= set(sent)
    assert statistics.pull_failures > 0  # it did see the broker go


def test_consume_from_first_last_and_timestamp_on_a_broker_that_deleted_old_messages(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    topic = group_name("ConsumeFrom")
    queue = MessageQueue(topic, "broker-a", 0)
    with running_appliance(tmp_path / "appliance", reap_pids, RETENTION_CONF) as appliance:
        create_topic(appliance, topic, 1)
        with (
            RemotingClient(appliance.broker_address) as broker,
            Producer(group_name("PG"), appliance.namesrv_address) as producer,
        ):
            for number in range(OLD_COUNT):
                producer.send(topic, f"old {number:04d} ".encode() * 100)
            wait_until(lambda: min_offset(broker, topic, 0) > 0, "retention to delete", WAIT_S)
            time.sleep(1.5)
            timestamp_ms = time.time_ns() // 1_000_000
            time.sleep(0.5)
            for number in range(5):
                producer.send(topic, f"new {number}".encode())
            wait_until(  # the queue's index follows the store a moment after the answers
                lambda: max_offset(broker, topic, 0) == OLD_COUNT + 5, "the new messages", WAIT_S
            )
            collectors = {kind: Collector(kind) for kind in ("first", "last", "timestamp")}
            consumers = []
            with contextlib.ExitStack() as stack:
                for kind, collector in collectors.items():
                    consumer = PushConsumer(
                        group_name(f"CG_{kind}"),
                        appliance.namesrv_address,
                        consume_from=kind,
                        consume_timestamp=timestamp_ms,
                        consume_batch_size=32,
                        rebalance_interval_ms=1000,
                        persist_interval_ms=500,
                    )
                    consumer.subscribe(topic, "*", collector)
                    consumer.start()
                    stack.callback(consumer.shutdown)
                    consumers.append(consumer)
                wait_until(
                    lambda: all(queue in consumer.queues() for consumer in consumers),
                    "every consumer holding the queue",
                    WAIT_S,
                )
                time.sleep(1.0)  # `last` has read its start offset
                for number in range(3):
                    producer.send(topic, f"late {number}".encode())
                wait_until(
                    lambda: OLD_COUNT + 7 in {s.queue_offset for s in collectors["first"].seen()},
                    "`first` from the minimum, after the OFFSET_ILLEGAL repair",
                    WAIT_S,
                )
                # Retention goes on deleting while the consumers start, so the minimum is read
                # now: `first` must have everything from there (the last segment stays).
                lowest = min_offset(broker, topic, 0)
                wait_until(lambda: collectors["last"].count() >= 3, "`last`", WAIT_S)
                wait_until(lambda: collectors["timestamp"].count() >= 8, "`timestamp`", WAIT_S)
                time.sleep(1.0)
                first_statistics = consumers[0].statistics()
    offsets = {kind: [s.queue_offset for s in c.seen()] for kind, c in collectors.items()}
    assert lowest > 0
    assert sorted(offsets["first"]) == list(range(lowest, OLD_COUNT + 8))
    assert first_statistics.offset_illegal >= 1
    assert sorted(offsets["last"]) == [OLD_COUNT + 5, OLD_COUNT + 6, OLD_COUNT + 7]
    assert sorted(offsets["timestamp"]) == list(range(OLD_COUNT, OLD_COUNT + 8))
