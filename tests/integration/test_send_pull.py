"""Goal: the real appliance stores what producers send and gives it back to consumers: single
messages, Java batches (320) and C++ batches (code 10 with batch=1, whole-batch compressed or
not) come back from PULL exactly once, in queue order, with identical bodies, flags and
properties; a held (suspend-flagged) pull is answered as soon as a message arrives, and is
dropped as soon as its connection closes (the pull processor's MQBOX_PULL_STATUS counters say
so well before the hold's 30 s timeout); and a topic auto-created by a send gets a route at the
name server.

Method: `python -m mqbox.server.supervisor` with the broker's real topology (store writer,
dispatcher, services, send, pull, admin, worker, codec, reactor) and the real name server, both
on port 0, in a fresh home with small store files; one appliance serves every test of the module.
Clients are plain sockets with the protocol's client codec (tests/support/front_client.py), the
name server is asked with mqbox.client. Pull bodies are decoded with message.decode_record. The
supervisor is stopped with SIGTERM and every process SIGKILLed by pid in the end; its shared
memory is swept.
"""

from __future__ import annotations

import contextlib
import json
import time
import zlib
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from mqbox.client.namesrv_api import get_route
from mqbox.client.remoting import RemotingClient
from mqbox.message import (
    SYSFLAG_COMPRESSED,
    BatchElement,
    StoredMessage,
    decode_record,
    encode_batch,
    encode_properties_str,
)
from mqbox.protocol import RemotingCommand
from mqbox.protocol.codes import (
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    RequestCode,
    ResponseCode,
)
from mqbox.protocol.headers import PullMessageRequestHeader, SendMessageRequestHeader
from mqbox.protocol.mqbox_codes import MQBOX_PULL_STATUS
from tests.support.appliance import Appliance, running_appliance
from tests.support.front_client import FrontClient

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    pids: list[int] = []
    with running_appliance(tmp_path_factory.mktemp("appliance"), pids) as running:
        yield running
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).kill()


# --- helpers ------------------------------------------------------------------------------------


def send_header(topic: str, queue_id: int = 0, **fields: Any) -> SendMessageRequestHeader:
    values: dict[str, Any] = {
        "producer_group": "PG",
        "topic": topic,
        "default_topic": "TBW102",
        "default_topic_queue_nums": 4,
        "queue_id": queue_id,
        "sys_flag": 0,
        "born_timestamp_ms": int(time.time() * 1000),
        "flag": 0,
        **fields,
    }
    return SendMessageRequestHeader(**values)


def properties(**values: str) -> bytes:
    return encode_properties_str(values)


def pull(
    client: FrontClient,
    topic: str,
    queue_index: int,
    *,
    queue_id: int = 0,
    sys_flag: int = PULL_FLAG_SUBSCRIPTION,
    suspend_timeout_ms: int = 15_000,
    message_count_max: int = 32,
) -> RemotingCommand:
    header = PullMessageRequestHeader(
        "CG",
        topic,
        queue_id,
        queue_index,
        message_count_max,
        sys_flag,
        0,
        suspend_timeout_ms,
        0,
        "*",
    )
    return client.call(RequestCode.PULL_MESSAGE, header.to_ext())


def decode_body(body: bytes) -> list[StoredMessage]:
    messages = []
    position = 0
    while position < len(body):
        message = decode_record(body, position)
        messages.append(message)
        position += message.size_bytes
    return messages


def pull_everything(
    client: FrontClient, topic: str, expected_count: int, queue_id: int = 0
) -> list[StoredMessage]:
    """Every message of the queue, pulled 32 at a time. A send is acknowledged once it is in the
    page cache and the dispatcher follows a moment later, so a 19 before `expected_count`
    messages arrived means "not yet"; one more pull at the end must find nothing new."""
    found: list[StoredMessage] = []
    offset = 0
    deadline = time.monotonic() + 15
    while len(found) < expected_count:
        assert time.monotonic() < deadline, f"only {len(found)} of {expected_count} messages"
        response = pull(client, topic, offset, queue_id=queue_id)
        if response.code == ResponseCode.PULL_NOT_FOUND:
            time.sleep(0.01)
            continue
        assert response.code == ResponseCode.SUCCESS, (response.code, response.remark)
        assert response.body
        found.extend(decode_body(response.body))
        offset = int(response.ext_fields["nextBeginOffset"])
    assert pull(client, topic, offset, queue_id=queue_id).code == ResponseCode.PULL_NOT_FOUND
    return found


# --- tests --------------------------------------------------------------------------------------


def test_singles_and_every_batch_form_come_back_once_in_order(appliance: Appliance) -> None:
    topic = "SendPullTopic"
    client = appliance.client()
    expected: list[tuple[bytes, int, bytes]] = []  # body, flag, properties
    try:
        for number in range(5):
            props = properties(TAGS="single", KEYS=f"k{number}", UNIQ_KEY=f"S{number:030d}")
            header = send_header(topic, flag=number, properties=props.decode())
            response = client.call(RequestCode.SEND_MESSAGE, header.to_ext(), f"s{number}".encode())
            assert response.code == ResponseCode.SUCCESS, response.remark
            expected.append((f"s{number}".encode(), number, props))

        def elements(prefix: str, count: int) -> list[BatchElement]:
            return [
                BatchElement(
                    f"{prefix}{number}-".encode() * 40,
                    number,
                    properties(UNIQ_KEY=f"{prefix}{number:020d}", TAGS=prefix),
                )
                for number in range(count)
            ]

        java = elements("java", 30)
        response = client.call(
            RequestCode.SEND_BATCH_MESSAGE,
            send_header(topic, batch=True).to_ext_v2(),
            encode_batch(java),
        )
        assert response.code == ResponseCode.SUCCESS, response.remark
        assert len(response.ext_fields["msgId"].split(",")) == 30
        assert response.ext_fields["queueOffset"] == "5"
        expected += [(e.body, e.flag, e.properties) for e in java]

        cpp = elements("cpp", 40)
        ext = send_header(topic, sys_flag=SYSFLAG_COMPRESSED).to_ext()
        ext["batch"] = "1"
        plain = encode_batch(cpp)
        assert len(plain) >= 4096
        response = client.call(RequestCode.SEND_MESSAGE, ext, zlib.compress(plain, 5))
        assert response.code == ResponseCode.SUCCESS, response.remark
        assert response.ext_fields["queueOffset"] == "35"
        expected += [(e.body, e.flag, e.properties) for e in cpp]

        small = elements("tiny", 3)
        ext = send_header(topic).to_ext()
        ext["batch"] = "1"
        response = client.call(RequestCode.SEND_MESSAGE, ext, encode_batch(small))
        assert response.code == ResponseCode.SUCCESS, response.remark
        expected += [(e.body, e.flag, e.properties) for e in small]

        messages = pull_everything(client, topic, len(expected))
        assert [m.queue_index for m in messages] == list(range(len(expected)))
        assert [(m.body, m.flag, m.properties) for m in messages] == expected
        assert all(m.sysflag & SYSFLAG_COMPRESSED == 0 for m in messages)
        assert all(m.topic == topic for m in messages)
    finally:
        client.close()


def test_a_held_pull_is_answered_when_a_message_arrives(appliance: Appliance) -> None:
    topic = "HeldTopic"
    producer = appliance.client()
    consumer = appliance.client()
    try:
        response = producer.call(RequestCode.SEND_MESSAGE, send_header(topic).to_ext(), b"first")
        assert response.code == ResponseCode.SUCCESS, response.remark
        assert len(pull_everything(consumer, topic, 1)) == 1
        header = PullMessageRequestHeader(
            "CG", topic, 0, 1, 32, PULL_FLAG_SUSPEND | PULL_FLAG_SUBSCRIPTION, 0, 15_000, 0, "*"
        )
        opaque = consumer.request(RequestCode.PULL_MESSAGE, header.to_ext())
        time.sleep(0.3)
        # Requests of the same connection are served while the pull is held.
        assert pull(consumer, topic, 0).code == ResponseCode.SUCCESS
        started = time.monotonic()
        response = producer.call(RequestCode.SEND_MESSAGE, send_header(topic).to_ext(), b"late")
        assert response.code == ResponseCode.SUCCESS
        (held,) = consumer.responses(1)
        assert held.opaque == opaque
        assert time.monotonic() - started < 5
        assert held.code == ResponseCode.SUCCESS
        assert [m.body for m in decode_body(held.body)] == [b"late"]
        assert held.ext_fields["nextBeginOffset"] == "2"
    finally:
        producer.close()
        consumer.close()


def pull_status(appliance: Appliance) -> dict[str, Any]:
    """The pull processor's counters (MQBOX_PULL_STATUS); the appliance has one pull processor."""
    client = appliance.client()
    try:
        response = client.call(MQBOX_PULL_STATUS)
    finally:
        client.close()
    assert response.code == ResponseCode.SUCCESS, response.remark
    document: dict[str, Any] = json.loads(response.body)
    assert document["role"] == "pull.0"
    return document


def test_a_held_pull_is_dropped_when_its_connection_closes(appliance: Appliance) -> None:
    topic = "HeldThenClosedTopic"
    producer = appliance.client()
    consumer = appliance.client()
    try:
        response = producer.call(RequestCode.SEND_MESSAGE, send_header(topic).to_ext(), b"only")
        assert response.code == ResponseCode.SUCCESS, response.remark
        assert len(pull_everything(consumer, topic, 1)) == 1
        before = pull_status(appliance)
        header = PullMessageRequestHeader(
            "CG", topic, 0, 1, 32, PULL_FLAG_SUSPEND | PULL_FLAG_SUBSCRIPTION, 0, 30_000, 0, "*"
        )
        consumer.request(RequestCode.PULL_MESSAGE, header.to_ext())
        deadline = time.monotonic() + 5
        while pull_status(appliance)["heldNow"] != before["heldNow"] + 1:
            assert time.monotonic() < deadline, "the pull was never held"
            time.sleep(0.05)
        consumer.close()
        started = time.monotonic()
        while True:
            status = pull_status(appliance)
            if status["releasedOnClose"] == before["releasedOnClose"] + 1:
                break
            # The hold lasts 30 s; released at its timeout instead would mean the close was lost.
            assert time.monotonic() - started < 5, status
            time.sleep(0.05)
        assert status["heldNow"] == before["heldNow"]
        assert status["timedOut"] == before["timedOut"]
    finally:
        producer.close()
        consumer.close()


def test_an_auto_created_topic_gets_a_route_at_the_name_server(appliance: Appliance) -> None:
    topic = "RoutedAutoTopic"
    client = appliance.client()
    try:
        response = client.call(
            RequestCode.SEND_MESSAGE,
            send_header(topic, queue_id=-1, default_topic_queue_nums=3).to_ext(),
            b"routed",
        )
        assert response.code == ResponseCode.SUCCESS, response.remark
    finally:
        client.close()
    deadline = time.monotonic() + 15
    with RemotingClient(appliance.namesrv_address) as namesrv:
        route = get_route(namesrv, topic)
        while route is None and time.monotonic() < deadline:
            time.sleep(0.2)
            route = get_route(namesrv, topic)
        assert route is not None, "no route for the auto-created topic"
        (queue_data,) = route.queue_datas
        assert (queue_data.read_queue_nums, queue_data.write_queue_nums) == (3, 3)
        assert route.broker_datas[0].broker_addrs[0] == f"127.0.0.1:{appliance.broker_port}"
        tbw102 = get_route(namesrv, "TBW102")
        assert tbw102 is not None


def test_errors_come_with_their_codes(appliance: Appliance) -> None:
    client = appliance.client()
    try:
        unknown = client.call(
            RequestCode.SEND_MESSAGE, send_header("NoSuchTopic", default_topic="").to_ext(), b"x"
        )
        assert unknown.code == ResponseCode.TOPIC_NOT_EXIST
        started = time.monotonic()
        missing = pull(client, "NoSuchTopicEither", 0)
        assert missing.code == ResponseCode.TOPIC_NOT_EXIST
        assert time.monotonic() - started >= 0.9  # pull errors wait out the error delay
    finally:
        client.close()
