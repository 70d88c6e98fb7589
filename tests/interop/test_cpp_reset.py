"""The official C++ PushConsumer follows an offset reset made while it runs, and answers the
broker's GET_CONSUMER_RUNNING_INFO.

Goal: (1) a clustering PushConsumer that consumed a whole topic, and whose offsets the broker
holds, receives every message of the topic a second time after `mqbox offset reset --to
earliest` (broker_ops.offset_reset, the CLI's path): the broker sends it
RESET_CONSUMER_CLIENT_OFFSET (220) with the C++ body form, and the client drops its pull
requests, commits the new offsets and pulls again from them. Without 220 the consumer keeps its
own position and commits it over the reset within 5 s, so nothing is received twice. (2) An admin
asking the broker for GET_CONSUMER_RUNNING_INFO (307) of that consumer gets the client's own
answer (code 0 and its body, which C++ writes as not-quite-JSON), relayed by the broker.
Method: one real appliance for the module (tests/interop/conftest.py); the producer and the
consumer run in child processes of their own (tests/interop/cpp_client.py); the reset and the
307 go over the wire from this process.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from mqbox.admin import broker_ops
from mqbox.client.remoting import RemotingClient
from mqbox.protocol.codes import RequestCode, ResponseCode
from tests.conftest import unique_name
from tests.interop.cpp_client import (
    REQUEST_TIMEOUT_MS,
    acknowledged,
    committed_offset,
    consumer_ids,
    cpp_child,
    create_topic,
    produce,
    push_spec,
    received_view,
    sample_messages,
)
from tests.support.appliance import Appliance

pytestmark = pytest.mark.interop

QUEUE_COUNT = 2
MESSAGE_COUNT = 12
DELIVERY_TIMEOUT_S = 60.0
COMMIT_TIMEOUT_S = 30.0


def test_a_running_push_consumer_consumes_again_after_a_reset_to_earliest(
    appliance: Appliance, tmp_path: Path, reap_pids: list[int]
) -> None:
    topic = unique_name("CppReset")
    group = unique_name("CG-reset")
    create_topic(appliance, topic, QUEUE_COUNT)
    messages = sample_messages("reset", MESSAGE_COUNT)
    sent = acknowledged(produce(tmp_path / "producer", appliance, topic, messages, reap_pids))
    assert sorted(sent) == sorted(m.seq for m in messages)
    seqs = {m.seq for m in messages}

    def counts(child_messages: list[dict[str, object]]) -> Counter[str]:
        return Counter(received_view(event).seq for event in child_messages)

    spec = push_spec(appliance, group, topic, messages)
    with cpp_child(tmp_path / "consumer", spec, reap_pids) as consumer:
        consumer.wait_started()
        consumer.wait_for(
            lambda child: set(counts(child.messages())) >= seqs,
            DELIVERY_TIMEOUT_S,
            "every message once",
        )
        # The broker must hold the consumed position, so that the reset moves it back.
        deadline = time.monotonic() + COMMIT_TIMEOUT_S
        while sum(committed_offset(appliance, group, topic, q) for q in range(QUEUE_COUNT)) < (
            MESSAGE_COUNT
        ):
            assert time.monotonic() < deadline, "the consumer never committed its offsets"
            time.sleep(0.2)
        assert max(counts(consumer.messages()).values()) == 1

        (client_id,) = consumer_ids(appliance, group)
        ext = {"consumerGroup": group, "clientId": client_id, "jstackEnable": "false"}
        with RemotingClient(appliance.broker_address, REQUEST_TIMEOUT_MS) as broker:
            running = broker.invoke(RequestCode.GET_CONSUMER_RUNNING_INFO, ext)
        assert running.code == ResponseCode.SUCCESS, running.remark
        assert running.body, "the C++ client's running info came back empty"

        reset = broker_ops.offset_reset(appliance.namesrv_address, group, topic, "earliest")
        assert reset.clients_notified == 1
        assert {row.queue_index for row in reset.queues} == {0}
        consumer.wait_for(
            lambda child: all(counts(child.messages())[seq] >= 2 for seq in seqs),
            DELIVERY_TIMEOUT_S,
            "every message a second time after the reset",
        )
        consumer.finish()
    assert set(counts(consumer.messages())) == seqs
