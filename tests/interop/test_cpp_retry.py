"""A C++ consumer that answers RECONSUME_LATER gets the message again, through %RETRY%.

Goal: a clustering PushConsumer of the official C++ client (PyPI rocketmq 0.4.4) that returns
RECONSUME_LATER on the first delivery of each message receives each message a second time, with
reconsumeTimes 1, under its own topic (the client renames `%RETRY%<group>` back to RETRY_TOPIC),
with the body, tags, keys and user properties that were sent; on the broker each retry sits in
`%RETRY%<group>` with RETRY_TOPIC and ORIGIN_MESSAGE_ID. This is the path the C++
client takes on any failed callback: CONSUMER_SEND_MSG_BACK (36) with delayLevel 0 to the
record's STOREHOST, then a delayed delivery through SCHEDULE_TOPIC_XXXX.

Method: a real appliance of the module's own (supervisor, every broker role, the name server;
port 0; a home of its own) with messageDelayLevel "1s ..." so a retry takes a second, not ten;
the consumer runs in a child process (tests/interop/cpp_client.py's CppChild, with a script of
this module: the wrapper's `subscribe` turns an exception into success because it re-raises
inside ctypes, so the script registers a raw callback that returns the client's RECONSUME_LATER
value itself). Messages are sent one at a time with mqbox's client, each once the consumer saw
the one before: C++ 1.2.3 hands a whole pull to one listener call and sends back every message
of a failed call, while the wrapper's C callback stops at the first failure, so a pull of
several new messages would bring some back "again" that the callback never saw the first time
(measured: they then arrive first with reconsumeTimes 1). The topic and `%RETRY%<group>` are
created and routed before the consumer starts: a C++ consumer that finds no route waits 30 s for
the next refresh.
Bounded waits; every child and the appliance are SIGKILLed by pid at the end.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import pytest

from mqbox.client import admin_api
from mqbox.client.remoting import RemotingClient
from mqbox.message import decode_properties_str, encode_properties_str
from mqbox.protocol.headers import SendMessageRequestHeader
from tests.conftest import unique_name
from tests.interop.cpp_client import (
    REQUEST_TIMEOUT_MS,
    CppChild,
    SentMessage,
    cpp_child,
    create_topic,
    property_names,
    read_back,
    received_view,
    sample_messages,
)
from tests.support.appliance import BROKER_CONF, Appliance, module_appliance

pytestmark = pytest.mark.interop

QUEUE_COUNT = 2
MESSAGE_COUNT = 12
DELAY_LEVELS = " ".join(["1s"] * 18)
DELIVERY_TIMEOUT_S = 90.0
SETTLE_S = 3.0

RETRY_CONSUMER_SCRIPT: Final = r'''
"""A C++ PushConsumer that answers RECONSUME_LATER to the first delivery of each message."""
import hashlib
import json
import os
import sys
import threading

from rocketmq.client import PushConsumer, RecvMessage
from rocketmq.exceptions import ffi_check
from rocketmq.ffi import _CConsumeStatus, dll

with open(sys.argv[1], encoding="utf-8") as spec_file:
    spec = json.load(spec_file)
lock = threading.Lock()
seen = set()


def emit(**event):
    line = json.dumps(event)
    with lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def text(value):
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return str(value)


def on_message(_consumer, handle):
    message = RecvMessage(handle)
    body = message.body or b""
    properties = {}
    for name in spec["property_names"]:
        value = text(message.get_property(name))
        if value:
            properties[name] = value
    seq = properties.get("mqboxSeq", "")
    with lock:
        first = seq not in seen
        seen.add(seq)
    emit(
        event="message",
        topic=text(message.topic),
        queue_id=message.queue_id,
        reconsume_times=message.reconsume_times,
        tags=text(message.tags),
        keys=text(message.keys),
        sha256=hashlib.sha256(body).hexdigest(),
        size=len(body),
        properties=properties,
        retry_topic=text(message.get_property("RETRY_TOPIC")),
        answer="later" if first else "success",
    )
    if first:
        return _CConsumeStatus.RECONSUME_LATER.value
    return _CConsumeStatus.CONSUME_SUCCESS.value


consumer = PushConsumer(spec["group"])
consumer.set_namesrv_addr(spec["namesrv"])
ffi_check(dll.Subscribe(consumer._handle, spec["topic"].encode(), b"*"))
consumer._register_callback(on_message)
consumer.start()
emit(event="started", pid=os.getpid())
sys.stdin.readline()  # "stop", or end of file when the test went away
consumer.shutdown()
emit(event="done")
sys.stdout.flush()
os._exit(0)  # no wrapper __del__ at interpreter exit
'''


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    """A running appliance whose delay levels are all one second; every process it started is
    SIGKILLed by pid at the end."""
    conf = BROKER_CONF + f"messageDelayLevel={DELAY_LEVELS}\n"
    with module_appliance(tmp_path_factory.mktemp("appliance"), conf) as running:
        yield running


def retry_consumer(
    directory: Path, spec: Mapping[str, Any], reap_pids: list[int]
) -> contextlib.AbstractContextManager[CppChild]:
    """RETRY_CONSUMER_SCRIPT in a child `python`, run as cpp_client.cpp_child runs its own."""
    return cpp_child(directory, spec, reap_pids, RETRY_CONSUMER_SCRIPT)


def deliveries_by_seq(child: CppChild) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in child.messages():
        found[received_view(event).seq].append(event)
    return found


def first_delivery_of(seq: str) -> Callable[[CppChild], bool]:
    return lambda child: seq in deliveries_by_seq(child)


def send_one(broker: RemotingClient, topic: str, queue_id: int, message: SentMessage) -> None:
    properties = {
        **message.user_properties(),
        "TAGS": message.tags,
        "KEYS": message.keys,
        "UNIQ_KEY": uuid.uuid4().hex.upper(),
        "WAIT": "true",
    }
    header = SendMessageRequestHeader(
        producer_group="PG",
        topic=topic,
        default_topic="TBW102",
        default_topic_queue_nums=QUEUE_COUNT,
        queue_id=queue_id,
        sys_flag=0,
        born_timestamp_ms=int(time.time() * 1000),
        flag=0,
        properties=encode_properties_str({k: v for k, v in properties.items() if v}).decode(),
    )
    admin_api.send_message(broker, header, message.body.encode("utf-8"))


def test_reconsume_later_brings_each_message_back_through_the_retry_topic(
    appliance: Appliance, tmp_path: Path, reap_pids: list[int]
) -> None:
    topic = unique_name("CppRetry")
    group = unique_name("CG-retry")
    retry_topic = "%RETRY%" + group
    create_topic(appliance, topic, QUEUE_COUNT)
    create_topic(appliance, retry_topic, 1)
    messages: list[SentMessage] = sample_messages("retry", MESSAGE_COUNT)
    wanted = {message.seq: message.view() for message in messages}
    spec = {
        "namesrv": appliance.namesrv_address,
        "group": group,
        "topic": topic,
        "property_names": property_names(messages),
    }

    def retried_all(child: CppChild) -> bool:
        delivered = deliveries_by_seq(child)
        return all(
            any(event["reconsume_times"] >= 1 for event in delivered.get(seq, ())) for seq in wanted
        )

    with retry_consumer(tmp_path / "consumer", spec, reap_pids) as consumer:
        consumer.wait_started()
        with RemotingClient(appliance.broker_address, REQUEST_TIMEOUT_MS) as broker:
            for index, message in enumerate(messages):
                send_one(broker, topic, index % QUEUE_COUNT, message)
                consumer.wait_for(
                    first_delivery_of(message.seq),
                    DELIVERY_TIMEOUT_S,
                    f"the first delivery of {message.seq}",
                )
        consumer.wait_for(retried_all, DELIVERY_TIMEOUT_S, "every message a second time")
        time.sleep(SETTLE_S)
        consumer.finish()

    delivered = deliveries_by_seq(consumer)
    assert set(delivered) == set(wanted)
    for seq, events in delivered.items():
        first, *again = events
        assert (first["reconsume_times"], first["answer"]) == (0, "later"), events
        assert again, f"{seq} came only once: {events}"
        assert again[0]["reconsume_times"] == 1, events
        assert again[0]["answer"] == "success", events
        for event in events:
            assert event["topic"] == topic, event  # %RETRY% renamed back by the client
            assert received_view(event) == wanted[seq], event
        assert again[0]["retry_topic"] == topic, again[0]

    stored = [record for queue in read_back(appliance, retry_topic).values() for record in queue]
    assert len(stored) >= MESSAGE_COUNT
    for record in stored:
        properties = decode_properties_str(record.properties)
        assert record.reconsume_times == 1
        assert properties["RETRY_TOPIC"] == topic
        assert len(properties["ORIGIN_MESSAGE_ID"]) == 32
        assert not {"DELAY", "REAL_TOPIC", "REAL_QID"} & set(properties)
