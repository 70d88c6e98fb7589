"""Restarts lose nothing: a C++ consumer resumes from its committed offsets, and a broker restart
keeps every acknowledged message and every committed offset.

Goal: (1) a clustering PushConsumer that consumed everything and shut down cleanly (the C++
client commits with UPDATE_CONSUMER_OFFSET every 5 s and at shutdown) has, on the broker, each
queue's offset one past its last consumed message; a consumer started again in the same group
then receives every message produced meanwhile once, and nothing it had already consumed.
(2) Messages acknowledged to C++ producers before the appliance is stopped with SIGTERM and
started again on the same home all come back after the restart, once and identical: raw, and
to a new group's PushConsumer; a group that had committed before the stop resumes after it.
Method: the real appliance (supervisor, every broker role, the name server; port 0; a home of
its own); one C++ client per child process (tests/interop/cpp_client.py). The check is honest
about at-least-once delivery: a redelivery is allowed only for a message whose offset was not
committed, and here the offsets are read from the broker (QUERY_CONSUMER_OFFSET) before the
second consumer starts, so the test asserts that they cover everything consumed, and then that
nothing below them comes again and everything from them on does. The second appliance has new
ports, so the clients of the second half are started with its new name server address.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from mqbox.message import StoredMessage
from tests.conftest import unique_name
from tests.interop.cpp_client import (
    SentMessage,
    acknowledged,
    assert_exactly_once,
    committed_offset,
    cpp_child,
    create_topic,
    produce,
    push_spec,
    read_back,
    received_seqs,
    received_view,
    sample_messages,
    stored_view,
    wait_routed,
)
from tests.support.appliance import Appliance, running_appliance

pytestmark = pytest.mark.interop

QUEUE_COUNT = 4
DELIVERY_TIMEOUT_S = 60.0
SETTLE_S = 3.0
CONSUMED_SETTLE_S = 1.0  # after the last callback printed, before the consumer is stopped


def produce_all(
    directory: Path,
    appliance: Appliance,
    topic: str,
    messages: list[SentMessage],
    reap_pids: list[int],
) -> None:
    events = produce(directory, appliance, topic, messages, reap_pids)
    assert sorted(acknowledged(events)) == sorted(m.seq for m in messages), events


def consume(
    directory: Path,
    appliance: Appliance,
    group: str,
    topic: str,
    expected: list[SentMessage],
    every: list[SentMessage],
    reap_pids: list[int],
) -> list[dict[str, Any]]:
    """Run one PushConsumer of `group` until it received every `expected` message, SETTLE_S
    more, then stop it in order; its message events. `every` names the properties to report."""
    seqs = {m.seq for m in expected}
    spec = push_spec(appliance, group, topic, every)
    with cpp_child(directory, spec, reap_pids) as consumer:
        consumer.wait_started()
        consumer.wait_for(
            lambda child: seqs <= received_seqs(child), DELIVERY_TIMEOUT_S, "every message"
        )
        time.sleep(SETTLE_S)
        consumer.finish()
    return list(consumer.messages())


def records_by_seq(appliance: Appliance, topic: str) -> dict[str, StoredMessage]:
    return {
        stored_view(record).seq: record
        for records in read_back(appliance, topic).values()
        for record in records
    }


def end_offsets(records: list[StoredMessage]) -> dict[int, int]:
    """Per queue id, one past the highest queue index among `records` (0 if none)."""
    ends = dict.fromkeys(range(QUEUE_COUNT), 0)
    for record in records:
        ends[record.queue_id] = max(ends[record.queue_id], record.queue_index + 1)
    return ends


def assert_committed(appliance: Appliance, group: str, topic: str, ends: dict[int, int]) -> None:
    committed = {q: committed_offset(appliance, group, topic, q) for q in range(QUEUE_COUNT)}
    assert committed == ends, f"committed {committed}, consumed up to {ends}"


def test_a_restarted_consumer_resumes_from_its_committed_offsets(
    appliance: Appliance, tmp_path: Path, reap_pids: list[int]
) -> None:
    topic = unique_name("CppResume")
    group = unique_name("CG-resume")
    create_topic(appliance, topic, QUEUE_COUNT)
    before = sample_messages("before", 24, big_every=6)
    after = sample_messages("after", 24, big_every=6)
    every = before + after
    produce_all(tmp_path / "producer-1", appliance, topic, before, reap_pids)

    first = consume(tmp_path / "consumer-1", appliance, group, topic, before, every, reap_pids)
    assert_exactly_once([received_view(e) for e in first], before, "first run")
    stored = records_by_seq(appliance, topic)
    # The clean shutdown committed everything the first run consumed.
    assert_committed(appliance, group, topic, end_offsets([stored[m.seq] for m in before]))

    produce_all(tmp_path / "producer-2", appliance, topic, after, reap_pids)
    second = consume(tmp_path / "consumer-2", appliance, group, topic, after, every, reap_pids)
    again = Counter(received_view(e).seq for e in second)
    redelivered = sorted(seq for seq in again if seq.startswith("before-"))
    assert not redelivered, f"committed messages came again: {redelivered}"
    assert_exactly_once([received_view(e) for e in second], after, "second run")


def test_a_broker_restart_between_produce_and_consume_loses_nothing(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    home = tmp_path / "home"
    topic = unique_name("CppBrokerRestart")
    old_group = unique_name("CG-old")
    new_group = unique_name("CG-new")
    consumed = sample_messages("consumed", 20, big_every=5)
    pending = sample_messages("pending", 20, big_every=5)
    every = consumed + pending
    with running_appliance(home, reap_pids) as appliance:
        create_topic(appliance, topic, QUEUE_COUNT)
        produce_all(tmp_path / "producer-1", appliance, topic, consumed, reap_pids)
        first = consume(
            tmp_path / "consumer-old-1", appliance, old_group, topic, consumed, every, reap_pids
        )
        assert_exactly_once([received_view(e) for e in first], consumed, "before")
        produce_all(tmp_path / "producer-2", appliance, topic, pending, reap_pids)
        before_stop = records_by_seq(appliance, topic)
        ends = end_offsets([before_stop[m.seq] for m in consumed])
        assert_committed(appliance, old_group, topic, ends)
        assert appliance.stop() == 0, appliance.output()

    with running_appliance(home, reap_pids) as appliance:
        wait_routed(appliance, topic)
        stored = read_back(appliance, topic)
        records = [record for queue in stored.values() for record in queue]
        assert_exactly_once([stored_view(r) for r in records], every, "stored after restart")
        for record in records:
            was = before_stop[stored_view(record).seq]
            assert (record.queue_id, record.queue_index) == (was.queue_id, was.queue_index)
        assert_committed(appliance, old_group, topic, ends)

        fresh = consume(
            tmp_path / "consumer-new", appliance, new_group, topic, every, every, reap_pids
        )
        assert_exactly_once([received_view(e) for e in fresh], every, "new group")
        resumed = consume(
            tmp_path / "consumer-old-2", appliance, old_group, topic, pending, every, reap_pids
        )
        assert_exactly_once([received_view(e) for e in resumed], pending, "old group")
