"""The official C++ consumers get from mqbox every message they should, once and identical.

Goal: (1) a clustering PushConsumer subscribed with "TagA || TagB" receives every TagA and TagB
message exactly once and none of the others, with the body, tags, keys and user properties the
C++ producer sent: Unicode bodies and properties, bodies over the 4 KiB at which the producer
compresses, and a 1 MiB body (stored compressed, inflated by the consumer) included; (2) two
PushConsumers of one group split the topic's queues between them (each gets some, no queue goes
to both) and together lose nothing; (3) a PullConsumer (the wrapper's `pull` generator) reads
every queue from offset 0, in queue order, every message once.
Method: one real appliance for the module (supervisor, every broker role, the name server; port
0; a home of its own); the producer and every consumer run in child processes of their own
(tests/interop/cpp_client.py: a script, HOME in tmp, JSON lines out, "stop" in, a bounded wait,
SIGKILL by PID). A consumer child prints one JSON line per delivered message from the client's
callback threads, under a lock. Topics are created first and routed (a consumer that finds no
route waits 30 s for the next refresh); groups are new, so each starts at offset 0 (checklist
rule 7). After the last expected message a consumer keeps running for SETTLE_S more, so that a
duplicate or an unwanted message has time to show.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from mqbox.message import SYSFLAG_COMPRESSED
from tests.conftest import unique_name
from tests.interop.cpp_client import (
    SentMessage,
    acknowledged,
    assert_exactly_once,
    consumer_ids,
    cpp_child,
    create_topic,
    produce,
    push_spec,
    read_back,
    received_seqs,
    received_view,
    sample_messages,
    stored_view,
)
from tests.support.appliance import Appliance

pytestmark = pytest.mark.interop

QUEUE_COUNT = 4
DELIVERY_TIMEOUT_S = 60.0
SETTLE_S = 3.0
REBALANCE_SETTLE_S = 3.0
MEBIBYTE = 1 << 20


def mebibyte_message(seq: str) -> SentMessage:
    """A TagA message with a Unicode body of just over 1 MiB (UTF-8)."""
    pieces = []
    size = 0
    index = 0
    while size < MEBIBYTE:
        piece = f"{index:07d} ünïcødé ✓ 消息 "
        pieces.append(piece)
        size += len(piece.encode("utf-8"))
        index += 1
    return SentMessage(
        seq,
        "".join(pieces),
        tags="TagA",
        keys="big-key",
        properties=(("size", "1MiB"), ("名前", "大きい ✓")),
    )


def produce_all(
    directory: Path,
    appliance: Appliance,
    topic: str,
    messages: list[SentMessage],
    reap_pids: list[int],
) -> None:
    events = produce(directory, appliance, topic, messages, reap_pids)
    sent = acknowledged(events)
    assert sorted(sent) == sorted(m.seq for m in messages), events


def test_push_consumer_with_a_tag_expression_gets_each_match_once_and_identical(
    appliance: Appliance, tmp_path: Path, reap_pids: list[int]
) -> None:
    topic = unique_name("CppPushTags")
    group = unique_name("CG-tags")
    create_topic(appliance, topic, QUEUE_COUNT)
    messages = [*sample_messages("tags", 40, big_every=5), mebibyte_message("tags-big")]
    produce_all(tmp_path / "producer", appliance, topic, messages, reap_pids)
    stored = {stored_view(r).seq: r for q in read_back(appliance, topic).values() for r in q}
    assert stored["tags-big"].sysflag & SYSFLAG_COMPRESSED, "the 1 MiB body is stored zlibbed"
    assert len(stored["tags-big"].body) < MEBIBYTE
    wanted = [m for m in messages if m.tags in ("TagA", "TagB")]
    wanted_seqs = {m.seq for m in wanted}
    assert len(wanted) < len(messages)
    assert "tags-big" in wanted_seqs

    spec = push_spec(appliance, group, topic, messages, "TagA || TagB")
    with cpp_child(tmp_path / "consumer", spec, reap_pids) as consumer:
        consumer.wait_started()
        consumer.wait_for(
            lambda child: wanted_seqs <= received_seqs(child),
            DELIVERY_TIMEOUT_S,
            "every TagA and TagB message",
        )
        time.sleep(SETTLE_S)
        consumer.finish()
    delivered = consumer.messages()
    assert {e["topic"] for e in delivered} == {topic}
    assert_exactly_once([received_view(e) for e in delivered], wanted, "delivered")
    for event in delivered:
        record = stored[received_view(event).seq]
        assert (event["queue_id"], event["queue_offset"]) == (record.queue_id, record.queue_index)


def test_two_push_consumers_of_one_group_split_the_queues_and_lose_nothing(
    appliance: Appliance, tmp_path: Path, reap_pids: list[int]
) -> None:
    topic = unique_name("CppPushSplit")
    group = unique_name("CG-split")
    create_topic(appliance, topic, QUEUE_COUNT)
    messages = sample_messages("split", 48)
    spec = push_spec(appliance, group, topic, messages)
    seqs = {m.seq for m in messages}
    with (
        cpp_child(tmp_path / "consumer-1", spec, reap_pids) as first,
        cpp_child(tmp_path / "consumer-2", spec, reap_pids) as second,
    ):
        first.wait_started()
        second.wait_started()
        deadline = time.monotonic() + 30
        while len(consumer_ids(appliance, group)) < 2:
            assert time.monotonic() < deadline, consumer_ids(appliance, group)
            time.sleep(0.1)
        # Both rebalance at once on NOTIFY_CONSUMER_IDS_CHANGED; let the queues change hands
        # before anything is produced, so that no queue is read by both.
        time.sleep(REBALANCE_SETTLE_S)
        produce_all(tmp_path / "producer", appliance, topic, messages, reap_pids)
        first.wait_for(
            lambda _: seqs <= received_seqs(first) | received_seqs(second),
            DELIVERY_TIMEOUT_S,
            "every message at one of the two",
        )
        time.sleep(SETTLE_S)
        first.finish()
        second.finish()
    got_first = first.messages()
    got_second = second.messages()
    assert got_first, "the first consumer got nothing"
    assert got_second, "the second consumer got nothing"
    queues_first = {e["queue_id"] for e in got_first}
    queues_second = {e["queue_id"] for e in got_second}
    assert not queues_first & queues_second, (queues_first, queues_second)
    assert queues_first | queues_second == set(range(QUEUE_COUNT))
    assert_exactly_once(
        [received_view(e) for e in got_first + got_second], messages, "delivered to the group"
    )


def test_pull_consumer_reads_every_queue_from_offset_0_in_order(
    appliance: Appliance, tmp_path: Path, reap_pids: list[int]
) -> None:
    topic = unique_name("CppPull")
    create_topic(appliance, topic, QUEUE_COUNT)
    messages = sample_messages("pull", 36, big_every=9)
    produce_all(tmp_path / "producer", appliance, topic, messages, reap_pids)
    spec = {**push_spec(appliance, unique_name("CG-pull"), topic, messages), "mode": "pull"}
    with cpp_child(tmp_path / "consumer", spec, reap_pids) as consumer:
        consumer.finish(DELIVERY_TIMEOUT_S)  # it ends by itself once every queue said NO_NEW_MSG
    delivered = consumer.messages()
    assert_exactly_once([received_view(e) for e in delivered], messages, "pulled")
    for queue_id in range(QUEUE_COUNT):
        indexes = [e["queue_offset"] for e in delivered if e["queue_id"] == queue_id]
        assert indexes == list(range(len(indexes))), (queue_id, indexes)
        assert indexes, f"nothing pulled from queue {queue_id}"
