"""The client instance's seam for consumers, against the real appliance.

Goal: what instance.py promises the consumers holds with a real broker: (1) a registered
consumer group goes out in heartbeats (the broker lists the client in the group) and
unregister_consumer takes it out again (UNREGISTER_CLIENT); (2) the requests the broker sends
for a group (NOTIFY_CONSUMER_IDS_CHANGED when the group changes, RESET_CONSUMER_CLIENT_OFFSET on
an offset reset, GET_CONSUMER_RUNNING_INFO from an admin) reach that group's hooks on the
instance's request thread, never a transport's reading thread, where a hook may make a blocking
call before answering, and its answer reaches the admin; (3) shutdown() is bounded.
Method: one real appliance (supervisor, every broker role, the name server; port 0; a home of
its own); two ClientInstances with consumer hooks of the test's own (recording what they get);
the group's membership is read with GET_CONSUMER_LIST_BY_GROUP over a raw RemotingClient.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

import pytest

from mqbox.client.admin_api import reset_consumer_offset
from mqbox.client.instance import ClientInstance, HeartbeatConsumer
from mqbox.client.remoting import RemotingClient
from mqbox.client.subscription import build_subscription
from mqbox.client.transport import Transport
from mqbox.protocol.codes import (
    ConsumeFromWhere,
    ConsumeType,
    MessageModel,
    RequestCode,
    ResponseCode,
)
from mqbox.protocol.command import RemotingCommand
from mqbox.protocol.headers import ConsumerListBody
from mqbox.protocol.mqbox_codes import RESET_TO_EARLIEST
from tests.conftest import unique_name
from tests.support.appliance import Appliance
from tests.support.read_back import create_topic
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


class RecordingHooks:
    """A consumer's side of the seam that records every broker request and the thread it ran
    on, and answers GET_CONSUMER_RUNNING_INFO after a blocking call of its own."""

    def __init__(self, instance: ClientInstance, group: str, topic: str) -> None:
        self.instance = instance
        self.group = group
        self.topic = topic
        self.requests: list[tuple[int, str]] = []  # (code, thread name)
        self.lock = threading.Lock()

    def heartbeat_consumer(self) -> HeartbeatConsumer:
        return HeartbeatConsumer(
            self.group,
            ConsumeType.CONSUME_PASSIVELY,
            MessageModel.CLUSTERING,
            ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
            (build_subscription(self.topic, "*", 1),),
        )

    def topics(self) -> Iterable[str]:
        return (self.topic,)

    def on_broker_request(self, transport: Transport, request: RemotingCommand) -> None:
        with self.lock:
            self.requests.append((request.code, threading.current_thread().name))
        if request.code == RequestCode.GET_CONSUMER_RUNNING_INFO:
            self.instance.update_route(self.topic)  # blocking: allowed on the request thread
            transport.respond(request, ResponseCode.SUCCESS, body=self.instance.client_id.encode())

    def codes(self) -> list[int]:
        with self.lock:
            return [code for code, _ in self.requests]


def consumer_ids(appliance: Appliance, group: str) -> tuple[str, ...]:
    with RemotingClient(appliance.broker_address) as broker:
        answer = broker.invoke(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
    if answer.code != ResponseCode.SUCCESS:
        return ()
    return ConsumerListBody.from_json(answer.body).consumer_id_list


def started_consumer(
    appliance: Appliance, group: str, topic: str
) -> tuple[ClientInstance, RecordingHooks]:
    instance = ClientInstance(appliance.namesrv_address)
    instance.start()
    hooks = RecordingHooks(instance, group, topic)
    instance.register_consumer(group, hooks)
    instance.update_route(topic)  # a new broker address: a heartbeat goes out at once
    return instance, hooks


def test_groups_join_by_heartbeat_and_leave_by_unregister(appliance: Appliance) -> None:
    topic = unique_name("InstanceJoin")
    group = unique_name("CG-join")
    create_topic(appliance, topic, 2)
    instance, _ = started_consumer(appliance, group, topic)
    try:
        wait_until(lambda: consumer_ids(appliance, group) == (instance.client_id,), "the join")
        instance.unregister_consumer(group)
        wait_until(lambda: consumer_ids(appliance, group) == (), "the leave")
        assert instance.statistics().heartbeats_sent >= 1
    finally:
        instance.shutdown()


def test_broker_requests_reach_their_group_on_the_request_thread(appliance: Appliance) -> None:
    topic = unique_name("InstanceRequests")
    group = unique_name("CG-requests")
    create_topic(appliance, topic, 2)
    first, first_hooks = started_consumer(appliance, group, topic)
    second, second_hooks = started_consumer(appliance, group, topic)
    try:
        wait_until(lambda: len(consumer_ids(appliance, group)) == 2, "both members")
        notify = RequestCode.NOTIFY_CONSUMER_IDS_CHANGED
        wait_until(lambda: notify in first_hooks.codes(), "40 at the first member")
        with RemotingClient(appliance.broker_address) as admin:
            ext = {"consumerGroup": group, "clientId": second.client_id, "jstackEnable": "false"}
            answer = admin.invoke(RequestCode.GET_CONSUMER_RUNNING_INFO, ext)
            assert (answer.code, answer.body) == (ResponseCode.SUCCESS, second.client_id.encode())
            reset = reset_consumer_offset(admin, group, topic, RESET_TO_EARLIEST)
            assert reset.clients_notified == 2
        reset_code = RequestCode.RESET_CONSUMER_CLIENT_OFFSET
        wait_until(
            lambda: all(reset_code in h.codes() for h in (first_hooks, second_hooks)),
            "220 at every member",
        )
        assert RequestCode.GET_CONSUMER_RUNNING_INFO in second_hooks.codes()
        threads = {name for hooks in (first_hooks, second_hooks) for _, name in hooks.requests}
        assert all(name.startswith("mqbox-client-requests-") for name in threads), threads
    finally:
        began = time.monotonic()
        first.shutdown()
        second.shutdown()
        assert time.monotonic() - began < 6.5
