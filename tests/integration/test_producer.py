"""The Producer against the real appliance: every kind of send stores what it was given.

Goal: (1) send, send_async, send_aio, send_oneway, send_batch and send_orderly each store every
message once, with its body (bodies of 4 KiB and more stored zlib-compressed with sysflag bit 0),
tags, keys and user properties, Unicode included, and each SendResult names its stored record
(UNIQ_KEY = msg_id, offset msgId, queue, queue offset); a batch's messages sit contiguous in
one queue in order; (2) messages of one sharding key go to one queue in send order; (3) a
delayed message reaches its topic after its level's delay, not before; (4) a topic without a
route is created by the broker from TBW102 with the producer's four queues, and the producer
then follows the topic's own route; without `create_topic_key` it is refused; (5) input errors
and a producer that is not running raise typed errors before anything is written; (6) a
pipeline of async sends completes every future; shutdown is bounded and later sends are
refused; (7) a prepared idempotent batch goes to the queue the caller chose and, sent twice, is
stored once and answered twice alike.
Method: one real appliance for the module (supervisor, every broker role, the name server; port
0; a home of its own); a Producer in the test process with latency fault avoidance on; what the
broker stored is read back over the raw protocol (tests/support/read_back.py: PULL from index
0 of every queue, records decoded with mqbox.message.decode_record).
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Iterator

import pytest

from mqbox.client import (
    ClientStateError,
    InvalidMessageError,
    Message,
    NoRouteError,
    Producer,
    SendResult,
    SendStatus,
)
from mqbox.client.outgoing import encode_batch
from mqbox.client.producer import SendOptions
from mqbox.message import (
    SYSFLAG_COMPRESSED,
    StoredMessage,
    decode_properties_str,
    encode_offset_msg_id,
)
from mqbox.protocol.codes import PERM_INHERIT
from mqbox.protocol.headers import MessageQueue
from tests.conftest import unique_name
from tests.support.appliance import Appliance
from tests.support.read_back import create_topic, read_back, read_back_until, read_queue_count

pytestmark = pytest.mark.integration

QUEUE_COUNT = 4
SYSTEM_PROPERTIES = frozenset({"UNIQ_KEY", "WAIT", "TAGS", "KEYS", "CLUSTER", "DELAY"})


@pytest.fixture
def producer(appliance: Appliance) -> Iterator[Producer]:
    with Producer(
        unique_name("PG").replace("-", "_"),
        appliance.namesrv_address,
        latency_fault_enable=True,
    ) as running:
        yield running


def records_of(appliance: Appliance, topic: str, count: int) -> list[StoredMessage]:
    stored = read_back_until(appliance, topic, count)
    return [record for queue_id in sorted(stored) for record in stored[queue_id]]


def plain_body(record: StoredMessage) -> bytes:
    if record.sysflag & SYSFLAG_COMPRESSED:
        return zlib.decompress(record.body)
    return record.body


def assert_result_names_record(result: SendResult, record: StoredMessage) -> None:
    properties = decode_properties_str(record.properties)
    assert result.status is SendStatus.SEND_OK
    assert result.msg_id == properties["UNIQ_KEY"]
    assert result.offset_msg_id == encode_offset_msg_id(record.store_host, record.log_offset_bytes)
    assert (result.queue.topic, result.queue.queue_id) == (record.topic, record.queue_id)
    assert result.queue.broker_name == "broker-a"
    assert result.queue_offset == record.queue_index


def test_every_send_kind_stores_what_it_was_given(appliance: Appliance, producer: Producer) -> None:
    topic = unique_name("ProducerKinds")
    create_topic(appliance, topic, QUEUE_COUNT)
    unicode_body = "héllo wörld ✓ 消息 🚀".encode()
    big_body = ("big ✓ " * 1200).encode()  # 8.4 KiB: compressed
    props = {"color": "红", "emoji": "🚀✨"}
    results: dict[bytes, SendResult] = {}
    results[unicode_body] = producer.send(
        topic, unicode_body, tags="TagA", keys=["k1", "k2"], properties=props
    )
    results[big_body] = producer.send(topic, big_body, tags="TagB", keys="big")
    results[b"async"] = producer.send_async(topic, b"async", tags="TagC").result(5)
    results[b"aio"] = asyncio.run(producer.send_aio(topic, b"aio", properties={"n": "1"}))
    producer.send_oneway(topic, b"oneway", keys=["ow"])
    results[b"orderly"] = producer.send_orderly(topic, b"orderly", sharding_key="order-17")
    batch: list[Message | bytes] = [
        Message(b"batch-0", tags="TagB", keys=["b0"], properties={"i": "0"}),
        b"batch-1",
    ]
    batch += [Message(f"batch-{n}".encode(), flag=n) for n in range(2, 6)]
    batch_result = producer.send_batch(topic, batch)
    assert batch_result.msg_id.count(",") == len(batch) - 1
    assert batch_result.offset_msg_id.count(",") == len(batch) - 1

    records = records_of(appliance, topic, 6 + len(batch))
    by_body = {plain_body(record): record for record in records}
    assert len(records) == len(by_body) == 6 + len(batch)
    for body, result in results.items():
        assert_result_names_record(result, by_body[body])
    unicode_properties = decode_properties_str(by_body[unicode_body].properties)
    assert unicode_properties["TAGS"] == "TagA"
    assert unicode_properties["KEYS"] == "k1 k2"
    assert {k: v for k, v in unicode_properties.items() if k not in SYSTEM_PROPERTIES} == props
    assert unicode_properties["WAIT"] == "true"
    assert by_body[big_body].sysflag & SYSFLAG_COMPRESSED
    assert len(by_body[big_body].body) < len(big_body)
    assert not by_body[unicode_body].sysflag & SYSFLAG_COMPRESSED
    assert decode_properties_str(by_body[b"oneway"].properties)["KEYS"] == "ow"

    # The batch: contiguous in one queue, in order, each element with its own UNIQ_KEY.
    elements = [by_body[f"batch-{n}".encode()] for n in range(len(batch))]
    assert {element.queue_id for element in elements} == {batch_result.queue.queue_id}
    assert [element.queue_index for element in elements] == list(
        range(batch_result.queue_offset, batch_result.queue_offset + len(batch))
    )
    uniq_keys = [decode_properties_str(element.properties)["UNIQ_KEY"] for element in elements]
    assert ",".join(uniq_keys) == batch_result.msg_id
    assert [element.flag for element in elements[2:]] == [2, 3, 4, 5]
    first = decode_properties_str(elements[0].properties)
    assert (first["TAGS"], first["KEYS"], first["i"]) == ("TagB", "b0", "0")


def test_orderly_sends_of_one_key_keep_one_queue_and_their_order(
    appliance: Appliance, producer: Producer
) -> None:
    topic = unique_name("ProducerOrderly")
    create_topic(appliance, topic, QUEUE_COUNT)
    keys = ["order-1", "order-2", "order-3", "order-42"]
    queue_of: dict[str, set[int]] = {key: set() for key in keys}
    for number in range(40):
        key = keys[number % len(keys)]
        result = producer.send_orderly(topic, f"{key}:{number}".encode(), sharding_key=key)
        queue_of[key].add(result.queue.queue_id)
    assert all(len(queues) == 1 for queues in queue_of.values()), queue_of
    stored = read_back(appliance, topic)
    for key in keys:
        (queue_id,) = queue_of[key]
        sequence = [
            int(record.body.split(b":")[1])
            for record in stored[queue_id]
            if record.body.startswith(f"{key}:".encode())
        ]
        assert sequence == sorted(sequence)
        assert len(sequence) == 10


def test_a_delayed_message_arrives_after_its_delay(
    appliance: Appliance, producer: Producer
) -> None:
    topic = unique_name("ProducerDelay")
    create_topic(appliance, topic, QUEUE_COUNT)
    sent_at = time.monotonic()
    producer.send(topic, b"later", delay_level=2, tags="TagD", properties={"p": "v"})  # 5 s
    time.sleep(1.0)
    assert sum(map(len, read_back(appliance, topic).values())) == 0
    (record,) = records_of(appliance, topic, 1)
    assert time.monotonic() - sent_at >= 4.5
    properties = decode_properties_str(record.properties)
    assert (record.body, properties["TAGS"], properties["p"]) == (b"later", "TagD", "v")


def test_a_new_topic_is_created_from_tbw102_then_followed_by_its_own_route(
    appliance: Appliance, producer: Producer
) -> None:
    topic = unique_name("ProducerAutoCreate")
    results = [producer.send(topic, f"auto {n}".encode()) for n in range(8)]
    assert all(result.status is SendStatus.SEND_OK for result in results)
    assert read_queue_count(appliance, topic) == 4  # defaultTopicQueueNums, under TBW102's 8
    # The broker registers the new topic; its own route (TBW102's perm has INHERIT, the new
    # topic's has not) then replaces the borrowed one at the next refresh.
    deadline = time.monotonic() + 10
    while True:
        producer.instance.update_route(topic)
        route = producer.instance.route(topic)
        assert route is not None
        if not route.queue_datas[0].perm & PERM_INHERIT:
            break
        assert time.monotonic() < deadline, route
        time.sleep(0.1)
    assert [queue.write_queue_nums for queue in route.queue_datas] == [4]
    assert len(records_of(appliance, topic, 8)) == 8
    with Producer("PG_no_create", appliance.namesrv_address, create_topic_key=None) as strict:
        with pytest.raises(NoRouteError, match="does not exist"):
            strict.send(unique_name("ProducerNoRoute"), b"refused")
        assert strict.statistics().attempts == 0


@pytest.mark.parametrize(
    ("topic", "body", "options", "fragment"),
    [
        ("Bad Topic", b"x", {}, "characters outside"),
        ("TBW102", b"x", {}, "template"),
        ("ProducerInput", b"", {}, "empty"),
        ("ProducerInput", b"x" * (4 * 1024 * 1024 + 1), {}, "over the maximum"),
        ("ProducerInput", b"x", {"properties": {"UNIQ_KEY": "mine"}}, "client's"),
        ("ProducerInput", b"x", {"delay_level": -1}, "negative"),
    ],
    ids=["topic", "tbw102", "empty", "too-big", "reserved-property", "negative-delay"],
)
def test_input_errors_raise_before_anything_is_sent(
    producer: Producer, topic: str, body: bytes, options: SendOptions, fragment: str
) -> None:
    for send in (producer.send, producer.send_async, producer.send_oneway):
        with pytest.raises(InvalidMessageError, match=fragment) as caught:
            send(topic, body, **options)
        assert caught.value.code == 13
    assert producer.statistics().attempts == 0


def test_async_pipeline_completes_and_shutdown_ends_the_producer(appliance: Appliance) -> None:
    topic = unique_name("ProducerPipeline")
    create_topic(appliance, topic, QUEUE_COUNT)
    producer = Producer("PG_pipeline", appliance.namesrv_address)
    with pytest.raises(ClientStateError):
        producer.send(topic, b"not started")
    producer.start()
    futures = [producer.send_async(topic, f"p{n}".encode()) for n in range(500)]
    results = [future.result(10) for future in futures]
    assert len({result.msg_id for result in results}) == 500
    assert all(result.status is SendStatus.SEND_OK for result in results)
    began = time.monotonic()
    producer.shutdown()
    assert time.monotonic() - began < 3.5
    with pytest.raises(ClientStateError):
        producer.send(topic, b"after shutdown")
    stats = producer.statistics()
    assert (stats.sent, stats.failed, stats.retries) == (500, 0, 0)
    assert len(records_of(appliance, topic, 500)) == 500


def test_a_prepared_idempotent_batch_goes_to_its_queue_and_is_stored_once(
    appliance: Appliance, producer: Producer
) -> None:
    topic = unique_name("TopicPrepared").replace("-", "_")
    create_topic(appliance, topic, QUEUE_COUNT)
    keys = [f"PREPARED-{topic}-{number}" for number in range(3)]
    message = encode_batch(topic, [b"a", b"b", b"c"], keys)
    message.idempotent = True
    producer.instance.update_route(topic)
    queue = MessageQueue(topic, producer.instance.subscribe_queues(topic)[0].broker_name, 2)
    first = producer.send_prepared_async(message, queue).result(10)
    again = producer.send_prepared_async(message, queue).result(10)
    assert first.queue == again.queue == queue
    assert (again.offset_msg_id, again.queue_offset) == (first.offset_msg_id, first.queue_offset)
    assert first.msg_id == ",".join(keys)
    records = records_of(appliance, topic, 3)
    assert [record.body for record in records] == [b"a", b"b", b"c"]
    assert {record.queue_id for record in records} == {2}
    with pytest.raises(InvalidMessageError):
        producer.send_prepared_async(message, MessageQueue("Elsewhere", queue.broker_name, 0))
