"""The official C++ producer's every send form is stored by mqbox exactly as it was acknowledged.

Goal: sync, async (send_async, every callback awaited), oneway, orderly (send_orderly with the
wrapper's hashing selector) and batch (send_batch, compressed or not) sends from the C++ client
in the wheel end up in the broker's queues: every acknowledged message exactly once, with the
body, tags, keys and user properties it was sent with (Unicode ones and bodies over the 4 KiB
at which the client compresses included), nothing else; a send's answer names the stored
record (its UNIQ_KEY is the returned msgId, its queue index the returned offset); messages of
one order key sit in one queue in send order; a batch is stored as its messages, contiguous and
in order.
Method: one real appliance for the module (supervisor, every broker role, the name server; port
0; a home of its own); each producer runs in its own child process (tests/interop/cpp_client.py:
a script, HOME in tmp, a bounded wait, SIGKILL by PID), and prints one JSON line per result. What
the broker stored is read back over the raw protocol, PULL from index 0 of every queue, each
record decoded with mqbox.message.decode_record and its body inflated when compressed.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest

from mqbox.message import StoredMessage, decode_properties_str
from tests.conftest import unique_name
from tests.interop.cpp_client import (
    SentMessage,
    acknowledged,
    assert_exactly_once,
    create_topic,
    produce,
    read_back,
    read_back_until,
    sample_messages,
    stored_view,
)
from tests.support.appliance import Appliance

pytestmark = pytest.mark.interop

QUEUE_COUNT = 4


def flatten(stored: dict[int, list[StoredMessage]]) -> list[StoredMessage]:
    return [record for queue_id in sorted(stored) for record in stored[queue_id]]


def assert_answers_name_the_records(
    records: list[StoredMessage], sent: dict[str, dict[str, object]]
) -> None:
    """Each acknowledged send's msgId is the stored UNIQ_KEY and its offset the queue index."""
    for record in records:
        view = stored_view(record)
        answer = sent[view.seq]
        unique_key = decode_properties_str(record.properties).get("UNIQ_KEY")
        assert unique_key == answer["msg_id"], (view.seq, unique_key, answer)
        assert record.queue_index == answer["offset"], (view.seq, record.queue_index, answer)


def assert_queue_indexes_dense(stored: dict[int, list[StoredMessage]]) -> None:
    for queue_id, records in stored.items():
        assert [r.queue_index for r in records] == list(range(len(records))), queue_id
        assert all(r.queue_id == queue_id for r in records)


def test_sync_sends_to_an_auto_created_topic_are_stored_once_and_identical(
    appliance: Appliance, tmp_path: Path, reap_pids: list[int]
) -> None:
    topic = unique_name("CppSync")  # not created: the broker creates it from TBW102
    messages = sample_messages("sync", 24, big_every=6)
    events = produce(tmp_path / "producer", appliance, topic, messages, reap_pids)
    sent = acknowledged(events)
    assert sorted(sent) == sorted(m.seq for m in messages), events
    stored = read_back(appliance, topic)
    assert len(stored) >= 1
    assert_queue_indexes_dense(stored)
    records = flatten(stored)
    assert_exactly_once([stored_view(r) for r in records], messages, "stored")
    assert_answers_name_the_records(records, sent)
    assert len([queue for queue in stored.values() if queue]) > 1, "round robin over queues"


def test_async_sends_are_all_answered_and_stored_once_and_identical(
    appliance: Appliance, tmp_path: Path, reap_pids: list[int]
) -> None:
    topic = unique_name("CppAsync")
    create_topic(appliance, topic, QUEUE_COUNT)
    messages = sample_messages("async", 40, big_every=10)
    events = produce(tmp_path / "producer", appliance, topic, messages, reap_pids, method="async")
    (callbacks,) = [e for e in events if e["event"] == "callbacks"]
    assert callbacks["count"] == len(messages), events
    sent = acknowledged(events)
    assert sorted(sent) == sorted(m.seq for m in messages), events
    stored = read_back(appliance, topic)
    assert_queue_indexes_dense(stored)
    records = flatten(stored)
    assert_exactly_once([stored_view(r) for r in records], messages, "stored")
    assert_answers_name_the_records(records, sent)


def test_oneway_sends_are_stored_once_and_identical(
    appliance: Appliance, tmp_path: Path, reap_pids: list[int]
) -> None:
    topic = unique_name("CppOneway")
    create_topic(appliance, topic, QUEUE_COUNT)
    messages = sample_messages("oneway", 24, big_every=8)
    events = produce(tmp_path / "producer", appliance, topic, messages, reap_pids, method="oneway")
    handed = [e["seq"] for e in events if e["event"] == "sent_oneway"]
    assert sorted(handed) == sorted(m.seq for m in messages), events
    # Oneway has no answer: the client may have closed before the broker stored the last ones.
    stored = read_back_until(appliance, topic, len(messages))
    assert_queue_indexes_dense(stored)
    assert_exactly_once([stored_view(r) for r in flatten(stored)], messages, "stored")


def test_orderly_sends_of_one_key_land_in_one_queue_in_send_order(
    appliance: Appliance, tmp_path: Path, reap_pids: list[int]
) -> None:
    topic = unique_name("CppOrderly")
    create_topic(appliance, topic, QUEUE_COUNT)
    order_keys = ["order-alpha", "order-beta", "order-gamma", "order-delta", "order-épsilon"]
    messages: list[SentMessage] = []
    args: list[int] = []
    for index, base in enumerate(sample_messages("orderly", 40)):
        order_key = order_keys[(index * 7 + index // 3) % len(order_keys)]
        messages.append(SentMessage(base.seq, base.body, base.tags, order_key, base.properties))
        args.append(zlib.crc32(order_key.encode("utf-8")) & 0x7FFF_FFFF)
    events = produce(
        tmp_path / "producer",
        appliance,
        topic,
        messages,
        reap_pids,
        method="orderly",
        order_args=args,
    )
    sent = acknowledged(events)
    assert sorted(sent) == sorted(m.seq for m in messages), events
    stored = read_back(appliance, topic)
    assert_queue_indexes_dense(stored)
    records = flatten(stored)
    assert_exactly_once([stored_view(r) for r in records], messages, "stored")
    assert_answers_name_the_records(records, sent)
    where = {stored_view(r).seq: (r.queue_id, r.queue_index) for r in records}
    for order_key in order_keys:
        in_send_order = [
            (message, arg)
            for message, arg in zip(messages, args, strict=True)
            if message.keys == order_key
        ]
        queues = {where[message.seq][0] for message, _ in in_send_order}
        # The hashing selector picks arg % queue count from the queues 0..3 the route lists.
        assert queues == {in_send_order[0][1] % QUEUE_COUNT}, (order_key, queues)
        indexes = [where[message.seq][1] for message, _ in in_send_order]
        assert indexes == sorted(indexes), (order_key, indexes)


def test_batches_are_stored_as_their_messages_contiguous_and_in_order(
    appliance: Appliance, tmp_path: Path, reap_pids: list[int]
) -> None:
    topic = unique_name("CppBatch")
    create_topic(appliance, topic, QUEUE_COUNT)
    small = sample_messages("batch-small", 10)  # about 1 KiB in all: sent as it is
    large = sample_messages("batch-large", 8, big_every=2)  # over 4 KiB: the whole batch zlibbed
    single = sample_messages("batch-single", 1)
    messages = small + large + single
    batches = [
        list(range(len(small))),
        list(range(len(small), len(small) + len(large))),
        [len(messages) - 1],
    ]
    events = produce(
        tmp_path / "producer",
        appliance,
        topic,
        messages,
        reap_pids,
        method="batch",
        batches=batches,
    )
    answers = [e for e in events if e["event"] == "batch_sent" and e["status"] == "OK"]
    assert len(answers) == len(batches), events
    stored = read_back(appliance, topic)
    assert_queue_indexes_dense(stored)
    records = flatten(stored)
    assert_exactly_once([stored_view(r) for r in records], messages, "stored")
    where = {stored_view(r).seq: (r.queue_id, r.queue_index) for r in records}
    for answer in answers:
        places = [where[seq] for seq in answer["seqs"]]
        assert len({queue_id for queue_id, _ in places}) == 1, places
        first = places[0][1]
        assert [index for _, index in places] == list(range(first, first + len(places)))
        assert answer["offset"] == first, (answer, places)
