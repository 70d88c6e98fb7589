"""Goal: with two admin processors (mqboxAdminProcessorCount=2) the stateful admin requests work
from every connection, whichever admin processor `conn % 2` would pick: heartbeats from six
connections all land in one consumer list (38) that every connection reads the same, an offset
committed (15) on one connection is what every other one queries (14) and what the consumer
progress view (10002) reports, a queue locked (41) from one connection is refused to the others
until unlocked (42), and a closed connection leaves the list. Without the worker's routing of
admin_parcels.MEMBER_ZERO_CODES to admin.0, about half of these connections get SYSTEM_ERROR.

Method: `python -m mqbox.server.supervisor` with the broker's real topology and two admin
processors, the real name server, both on port 0, in a fresh home (tests/support/appliance.py);
raw protocol clients over plain sockets; SIGTERM, then SIGKILL by pid of every process it
started, then the shared-memory sweep. Connection ids are numbered in accept order, so six
connections cover both admin processors.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from mqbox.protocol.admin_bodies import loads_fastjson
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.protocol.headers import (
    ConsumerListBody,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageQueue,
)
from tests.integration.test_admin_wire import WireClient, create_topic, heartbeat
from tests.support.appliance import BROKER_CONF, Appliance, running_appliance

pytestmark = pytest.mark.integration

CONNECTION_COUNT = 6
GROUP = "PoolGroup"
TOPIC = "WireTopic"  # the topic heartbeat() subscribes to: 208 skips the others (Java)


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    pids: list[int] = []
    conf = BROKER_CONF + "mqboxAdminProcessorCount=2\n"
    with running_appliance(tmp_path_factory.mktemp("admin-pool"), pids, conf) as running:
        assert {"admin.0", "admin.1"} <= set(running.roles), running.roles
        yield running


@pytest.fixture
def clients(appliance: Appliance) -> Iterator[list[WireClient]]:
    opened = [WireClient(appliance.broker_port) for _ in range(CONNECTION_COUNT)]
    try:
        yield opened
    finally:
        for client in opened:
            client.close()


def listed(client: WireClient) -> tuple[str, ...]:
    response = client.answer(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": GROUP})
    assert response.code == ResponseCode.SUCCESS, response.remark
    return ConsumerListBody.from_json(response.body).consumer_id_list


def test_heartbeats_offsets_lists_and_locks_work_from_every_connection(
    clients: list[WireClient],
) -> None:
    create_topic(clients[0], TOPIC, 2)
    client_ids = [f"{number}-127.0.0.1@POOL" for number in range(CONNECTION_COUNT)]
    for client, client_id in zip(clients, client_ids, strict=True):
        heartbeat(client, client_id, GROUP)
    for client in clients:
        assert listed(client) == tuple(sorted(client_ids))

    for number, client in enumerate(clients):
        update = {
            "consumerGroup": GROUP,
            "topic": TOPIC,
            "queueId": str(number % 2),
            "commitOffset": str(100 + number),
        }
        assert client.answer(RequestCode.UPDATE_CONSUMER_OFFSET, update).code == 0
        for reader in clients:
            query = {"consumerGroup": GROUP, "topic": TOPIC, "queueId": str(number % 2)}
            answer = reader.answer(RequestCode.QUERY_CONSUMER_OFFSET, query)
            assert answer.code == ResponseCode.SUCCESS, answer.remark
            assert answer.ext_fields == {"offset": str(100 + number)}
    for client in clients:
        stats = client.answer(
            RequestCode.GET_CONSUME_STATS, {"consumerGroup": GROUP, "topic": TOPIC}
        )
        assert stats.code == ResponseCode.SUCCESS, stats.remark
        table = loads_fastjson(stats.body)["offsetTable"]
        assert [table[queue]["consumerOffset"] for queue in sorted(table, key=str)] == [104, 105]
        members = client.answer(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": GROUP})
        assert members.code == ResponseCode.SUCCESS, members.remark
        connections = loads_fastjson(members.body)["connectionSet"]
        assert sorted(c["clientId"] for c in connections) == sorted(client_ids)

    queue = MessageQueue(TOPIC, "broker-a", 0)

    def lock(client: WireClient, client_id: str, code: int) -> tuple[MessageQueue, ...]:
        body = LockBatchRequestBody(GROUP, client_id, (queue,)).to_json()
        response = client.answer(code, {}, body)
        assert response.code == ResponseCode.SUCCESS, response.remark
        if code == RequestCode.UNLOCK_BATCH_MQ:
            return ()
        return LockBatchResponseBody.from_json(response.body).lock_ok_mq_set

    assert lock(clients[0], client_ids[0], RequestCode.LOCK_BATCH_MQ) == (queue,)
    for client, client_id in zip(clients[1:], client_ids[1:], strict=True):
        assert lock(client, client_id, RequestCode.LOCK_BATCH_MQ) == ()
    lock(clients[0], client_ids[0], RequestCode.UNLOCK_BATCH_MQ)
    assert lock(clients[3], client_ids[3], RequestCode.LOCK_BATCH_MQ) == (queue,)

    clients[1].close()
    remaining = tuple(sorted(client_ids[:1] + client_ids[2:]))
    for client in (clients[0], *clients[2:]):
        assert wait_listed(client, remaining) == remaining


def wait_listed(client: WireClient, expected: tuple[str, ...]) -> tuple[str, ...]:
    """The consumer list once it equals `expected`, or the last one seen after 10 s."""
    deadline = time.monotonic() + 10
    found = listed(client)
    while found != expected and time.monotonic() < deadline:
        time.sleep(0.05)
        found = listed(client)
    return found
