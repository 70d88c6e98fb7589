"""What a broker stored, read back over the raw protocol, and topics made ready for a test.

Owns: creating a topic on a broker and waiting until the name server routes it (`create_topic`,
`wait_routed`), waiting until the dispatcher has caught up with the CommitLog (`wait_dispatched`
on a connection, `wait_dispatched_at` on an address), and reading back every record of a topic's
queues (`read_back`, `read_back_until`: first that wait, then PULL with the subscription flag from
index 0, 32 at a time, each body decoded record by record with mqbox.message.decode_record).

The wait matters: a send is acknowledged once its record is in the CommitLog, and the dispatcher
makes it pullable, counted (max offset, topic and consume stats) and indexed (query by key or
unique key) a moment later, as RocketMQ's reput service does. A test that reads any of these
right after an acknowledged send waits first; one that checks something was NOT stored waits
too, so a record stored by mistake is dispatched before the check and fails it.
Used by the interop tests (tests/interop/cpp_client.py re-exports these), the client's
integration tests and every wire test that reads dispatched state. Never: the client under test
(the read-back uses RemotingClient), fixed ports or names.
"""

from __future__ import annotations

import json
import time
from typing import Final

from mqbox.client import admin_api
from mqbox.client.namesrv_api import get_route
from mqbox.client.remoting import RemotingClient
from mqbox.message import StoredMessage, decode_record
from mqbox.protocol.codes import PULL_FLAG_SUBSCRIPTION, RequestCode, ResponseCode
from mqbox.protocol.headers import PullMessageRequestHeader, UpdateAndCreateTopicRequestHeader
from tests.support.appliance import Appliance

ROUTE_WAIT_S: Final = 15.0
READ_BACK_TIMEOUT_S: Final = 20.0
REQUEST_TIMEOUT_MS: Final = 5000
READ_BACK_GROUP: Final = "mqbox_interop_read_back"


def create_topic(appliance: Appliance, topic: str, queue_count: int) -> None:
    """UPDATE_AND_CREATE_TOPIC (perm 6), then wait until the name server routes it: a C++
    consumer that finds no route waits 30 s for its next refresh."""
    header = UpdateAndCreateTopicRequestHeader(topic, "TBW102", queue_count, queue_count, 6)
    with RemotingClient(appliance.broker_address, REQUEST_TIMEOUT_MS) as broker:
        response = broker.invoke(RequestCode.UPDATE_AND_CREATE_TOPIC, header.to_ext())
    assert response.code == ResponseCode.SUCCESS, (response.code, response.remark)
    wait_routed(appliance, topic)


def wait_routed(appliance: Appliance, topic: str) -> None:
    deadline = time.monotonic() + ROUTE_WAIT_S
    with RemotingClient(appliance.namesrv_address, REQUEST_TIMEOUT_MS) as namesrv:
        while get_route(namesrv, topic) is None:
            assert time.monotonic() < deadline, f"the name server never routed {topic}"
            time.sleep(0.1)


def read_queue_count(appliance: Appliance, topic: str) -> int:
    """readQueueNums of `topic` in the broker's GET_ALL_TOPIC_CONFIG."""
    with RemotingClient(appliance.broker_address, REQUEST_TIMEOUT_MS) as broker:
        response = broker.invoke(RequestCode.GET_ALL_TOPIC_CONFIG)
    assert response.code == ResponseCode.SUCCESS, (response.code, response.remark)
    table = json.loads(response.body)["topicConfigTable"]
    assert topic in table, f"the broker has no topic {topic}"
    return int(table[topic]["readQueueNums"])


def pull_queue(
    broker: RemotingClient, topic: str, queue_id: int, subscription: str = "*"
) -> list[StoredMessage]:
    """Every record of one queue from index 0: PULL (subscription flag, no suspend) 32 at a time
    until PULL_NOT_FOUND, each body decoded record by record."""
    found: list[StoredMessage] = []
    queue_index = 0
    deadline = time.monotonic() + READ_BACK_TIMEOUT_S
    while True:
        assert time.monotonic() < deadline, f"{topic}:{queue_id} did not end at {queue_index}"
        header = PullMessageRequestHeader(
            READ_BACK_GROUP,
            topic,
            queue_id,
            queue_index,
            32,
            PULL_FLAG_SUBSCRIPTION,
            0,
            0,
            0,
            subscription,
        )
        response = broker.invoke(RequestCode.PULL_MESSAGE, header.to_ext())
        if response.code == ResponseCode.PULL_NOT_FOUND:
            return found
        assert response.code in (ResponseCode.SUCCESS, ResponseCode.PULL_RETRY_IMMEDIATELY), (
            response.code,
            response.remark,
        )
        next_index = int(response.ext_fields["nextBeginOffset"])
        if response.code == ResponseCode.SUCCESS:
            records = decode_records(response.body)
            assert {(r.topic, r.queue_id) for r in records} == {(topic, queue_id)}, records
            found.extend(records)
        assert next_index > queue_index, (response.code, response.ext_fields)
        queue_index = next_index


def decode_records(body: bytes) -> list[StoredMessage]:
    records: list[StoredMessage] = []
    position = 0
    while position < len(body):
        record = decode_record(body, position)
        records.append(record)
        position += record.size_bytes
    return records


def wait_dispatched(broker: RemotingClient) -> None:
    """Until GET_BROKER_RUNTIME_INFO's dispatchBehindBytes is 0: every record the CommitLog held
    when this was called is in its consume queue and the index, and counted. The store writer
    publishes its write position before it answers a send, and the dispatcher publishes the
    queue counts before its dispatched position, so after this every acknowledged send is
    readable by pull, max offset, stats and query."""
    admin_api.wait_dispatched(broker, READ_BACK_TIMEOUT_S)


def wait_dispatched_at(broker_address: str) -> None:
    """`wait_dispatched` over a connection of its own to `broker_address` (for tests whose own
    client is a raw socket, a CLI or the client under test)."""
    with RemotingClient(broker_address, REQUEST_TIMEOUT_MS) as broker:
        wait_dispatched(broker)


def read_back(appliance: Appliance, topic: str) -> dict[int, list[StoredMessage]]:
    """Every stored record of every queue of `topic`, by queue id, in queue order, once the
    dispatcher has caught up with every record written before the call."""
    queue_count = read_queue_count(appliance, topic)
    with RemotingClient(appliance.broker_address, REQUEST_TIMEOUT_MS) as broker:
        wait_dispatched(broker)
        return {queue_id: pull_queue(broker, topic, queue_id) for queue_id in range(queue_count)}


def read_back_until(
    appliance: Appliance, topic: str, count: int, timeout_s: float = READ_BACK_TIMEOUT_S
) -> dict[int, list[StoredMessage]]:
    """read_back() until it holds at least `count` records or the time is up (a oneway send is
    stored some time after the client returned)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stored = read_back(appliance, topic)
        if sum(map(len, stored.values())) >= count or time.monotonic() > deadline:
            return stored
        time.sleep(0.2)
