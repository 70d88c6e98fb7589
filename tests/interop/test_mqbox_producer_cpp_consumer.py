"""What mqbox's Producer sends, the official C++ PushConsumer receives identical.

Goal: messages sent by mqbox.client.Producer (sync, async, oneway, orderly and batch sends;
Unicode bodies and properties; bodies over the 4 KiB at which the producer compresses; delayed
messages) are delivered to a clustering C++ PushConsumer (PyPI rocketmq==0.4.4) exactly once,
with the body, tags, keys and user properties they were sent with; the C++ consumer reports as
the message id the UNIQ_KEY the Producer returned; the compressed bodies are stored compressed
(sysflag bit 0) and inflated by the C++ consumer; a delayed message arrives no sooner than its
level's delay.
Method: one real appliance for the module (tests/interop/conftest.py); the C++ consumer runs in
a child process of its own (tests/interop/cpp_client.py: a script, HOME in tmp, JSON lines out,
"stop" in, a bounded wait, SIGKILL by PID), the Producer in the test process. The consumer is
running before anything is sent, and keeps running SETTLE_S after the last expected message so
a duplicate has time to show. What the broker stored is read back raw as well.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from mqbox.client import Message, Producer, SendOptions, SendResult
from mqbox.message import SYSFLAG_COMPRESSED
from tests.conftest import unique_name
from tests.interop.cpp_client import (
    SentMessage,
    assert_exactly_once,
    cpp_child,
    create_topic,
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
DELAY_LEVEL = 2  # 5 s on a default broker
DELAY_S = 5.0


def as_message(message: SentMessage) -> Message:
    return Message(
        message.body.encode("utf-8"),
        tags=message.tags or None,
        keys=message.keys,
        properties=message.user_properties(),
    )


def test_cpp_push_consumer_receives_what_the_mqbox_producer_sent(
    appliance: Appliance, tmp_path: Path, reap_pids: list[int]
) -> None:
    topic = unique_name("MqboxToCpp")
    group = unique_name("CG-mqbox-producer")
    create_topic(appliance, topic, QUEUE_COUNT)
    messages = sample_messages("mq", 60, big_every=5)
    sync, asynchronous, oneway, orderly, batch = (messages[i::6] for i in range(5))
    delayed = messages[5::6]
    spec = push_spec(appliance, group, topic, messages)
    results: dict[str, SendResult] = {}
    with cpp_child(tmp_path / "consumer", spec, reap_pids) as consumer:
        consumer.wait_started()
        with Producer("PG_mqbox_interop", appliance.namesrv_address) as producer:
            options = {m.seq: as_message(m) for m in messages}

            def send(kind: str, message: SentMessage) -> None:
                sent = options[message.seq]
                keywords: SendOptions = {
                    "tags": sent.tags,
                    "keys": sent.keys,
                    "properties": sent.properties,
                }
                if kind == "sync":
                    results[message.seq] = producer.send(topic, sent.body, **keywords)
                elif kind == "async":
                    results[message.seq] = producer.send_async(topic, sent.body, **keywords).result(
                        10
                    )
                elif kind == "oneway":
                    producer.send_oneway(topic, sent.body, **keywords)
                elif kind == "orderly":
                    results[message.seq] = producer.send_orderly(
                        topic, sent.body, sharding_key=message.seq, **keywords
                    )
                else:
                    keywords["delay_level"] = DELAY_LEVEL
                    results[message.seq] = producer.send(topic, sent.body, **keywords)

            delayed_at = time.monotonic()
            for message in delayed:
                send("delayed", message)
            for kind, group_of in (
                ("sync", sync),
                ("async", asynchronous),
                ("oneway", oneway),
                ("orderly", orderly),
            ):
                for message in group_of:
                    send(kind, message)
            batch_result = producer.send_batch(topic, [options[m.seq] for m in batch])
            for message, uniq_key in zip(batch, batch_result.msg_id.split(","), strict=True):
                results[message.seq] = SendResult(
                    batch_result.status,
                    uniq_key,
                    "",
                    batch_result.queue,
                    batch_result.queue_offset,
                )
        seqs = {m.seq for m in messages}
        consumer.wait_for(
            lambda child: seqs <= received_seqs(child), DELIVERY_TIMEOUT_S, "every message"
        )
        time.sleep(SETTLE_S)
        consumer.finish()
    delivered = consumer.messages()
    assert {event["topic"] for event in delivered} == {topic}
    assert_exactly_once([received_view(e) for e in delivered], messages, "delivered")
    by_seq = {received_view(event).seq: event for event in delivered}
    for seq, result in results.items():
        assert by_seq[seq]["msg_id"] == result.msg_id, seq
    stored = {
        stored_view(r).seq: r for records in read_back(appliance, topic).values() for r in records
    }
    big = [m for m in messages if len(m.body.encode("utf-8")) >= 4096]
    assert big
    assert all(stored[m.seq].sysflag & SYSFLAG_COMPRESSED for m in big if m not in batch)
    for message in delayed:
        record = stored[message.seq]
        assert record.store_timestamp_ms - record.born_timestamp_ms >= (DELAY_S - 0.5) * 1000
    assert time.monotonic() - delayed_at >= DELAY_S
