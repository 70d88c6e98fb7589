"""The client's multiplexed transport against the real appliance.

Goal: transport.py keeps its rules with a real broker on the other end: (1) many sync calls from
several threads and many async calls share one connection, and every answer reaches the call
whose opaque it carries; (2) a call that runs out of time raises RemotingTimeoutError alone, the
connection stays, and its late answer is counted and dropped; (3) close() fails every
outstanding call at once (sync and async), returns quickly, and later calls are refused;
(4) requests the broker sends unasked (NOTIFY_CONSUMER_IDS_CHANGED, GET_CONSUMER_RUNNING_INFO)
reach the handler on an idle connection, and the handler's answer reaches the broker; (5) a sync
call from a callback of the same connection is refused rather than deadlocked; (6) a broker
crash fails the outstanding calls, calls while it is down fail typed, and the next call after
it is back connects again; (7) async frames queued meanwhile go out in fewer send() calls than
frames, each frame whole and answered to its own call.
Method: one real appliance for the module (supervisor, every broker role, the name server; port
0; a home of its own); the restart test starts its own on fixed ports. Calls are real requests:
SENDs to a topic of one queue (whose answers carry distinct queue offsets), and PULLs held by
long polling on an empty queue (a call the broker answers only when its hold ends).
"""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from mqbox.client.errors import (
    ClientError,
    ClientStateError,
    RemotingClosedError,
    RemotingConnectError,
    RemotingTimeoutError,
)
from mqbox.client.instance import HeartbeatConsumer, heartbeat_body
from mqbox.client.outgoing import encode_single, send_request_ext
from mqbox.client.remoting import RemotingClient
from mqbox.client.subscription import build_subscription
from mqbox.client.transport import Transport
from mqbox.protocol.codes import (
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    ConsumeFromWhere,
    ConsumeType,
    MessageModel,
    RequestCode,
    ResponseCode,
)
from mqbox.protocol.command import RemotingCommand
from mqbox.protocol.headers import PullMessageRequestHeader
from tests.conftest import unique_name
from tests.support.appliance import Appliance, running_appliance
from tests.support.read_back import create_topic, wait_dispatched_at
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

WAIT_S = 10.0


def send_ext(topic: str, number: int) -> dict[str, str]:
    message = encode_single(topic, f"body {number}".encode(), uniq_key=f"{number:032X}")
    return send_request_ext("PG_transport", message, 0, int(time.time() * 1000))


def held_pull_ext(topic: str, hold_ms: int, queue_index: int = 0) -> dict[str, str]:
    """A PULL of queue 0 from `queue_index` (its end: 0 while it is empty), held by the broker
    for up to `hold_ms`."""
    return PullMessageRequestHeader(
        "CG_transport",
        topic,
        0,
        queue_index,
        32,
        PULL_FLAG_SUBSCRIPTION | PULL_FLAG_SUSPEND,
        0,
        hold_ms,
        0,
        "*",
    ).to_ext()


def test_many_sync_and_async_calls_share_one_connection(appliance: Appliance) -> None:
    topic = unique_name("TransportMany")
    create_topic(appliance, topic, 1)
    thread_count, per_thread, async_count = 4, 40, 200
    offsets: list[int] = []
    errors: list[BaseException] = []
    with Transport(appliance.broker_address) as transport:

        def sync_sender(first: int) -> None:
            try:
                for number in range(first, first + per_thread):
                    answer = transport.invoke(
                        RequestCode.SEND_MESSAGE_V2, send_ext(topic, number), b"x"
                    )
                    assert answer.code == ResponseCode.SUCCESS, answer.remark
                    offsets.append(int(answer.ext_fields["queueOffset"]))
            except BaseException as error:  # reported by the test thread
                errors.append(error)

        threads = [
            threading.Thread(target=sync_sender, args=(index * per_thread,))
            for index in range(thread_count)
        ]
        for thread in threads:
            thread.start()
        futures = [
            transport.invoke_async(RequestCode.SEND_MESSAGE_V2, send_ext(topic, 10_000 + n), b"y")
            for n in range(async_count)
        ]
        for thread in threads:
            thread.join(WAIT_S)
        answers = [future.result(WAIT_S) for future in futures]
        assert errors == []
        assert all(answer.code == ResponseCode.SUCCESS for answer in answers)
        offsets.extend(int(answer.ext_fields["queueOffset"]) for answer in answers)
        statistics = transport.statistics()
    total = thread_count * per_thread + async_count
    assert sorted(offsets) == list(range(total))  # every answer went to its own call
    assert statistics.connects == 1
    assert statistics.late_responses == 0
    assert statistics.outstanding == 0


def test_async_frames_queued_meanwhile_share_one_write(appliance: Appliance) -> None:
    """Rule 8: 500 async SENDs issued back to back are written in fewer send() calls than frames;
    every one is stored once and answered to its own call (distinct queue offsets of one queue)."""
    topic = unique_name("TransportCoalesce")
    create_topic(appliance, topic, 1)
    count = 500
    with Transport(appliance.broker_address) as transport:
        futures = [
            transport.invoke_async(RequestCode.SEND_MESSAGE_V2, send_ext(topic, n), b"z")
            for n in range(count)
        ]
        answers = [future.result(WAIT_S) for future in futures]
        statistics = transport.statistics()
    assert all(answer.code == ResponseCode.SUCCESS for answer in answers)
    assert sorted(int(answer.ext_fields["queueOffset"]) for answer in answers) == list(range(count))
    assert statistics.frames_written == count
    assert statistics.writes < count


def test_a_call_times_out_alone_and_its_late_answer_is_dropped(appliance: Appliance) -> None:
    topic = unique_name("TransportTimeout")
    create_topic(appliance, topic, 1)
    with Transport(appliance.broker_address) as transport:
        started = time.monotonic()
        with pytest.raises(RemotingTimeoutError):
            transport.invoke(RequestCode.PULL_MESSAGE, held_pull_ext(topic, 1000), timeout_ms=200)
        assert 0.15 < time.monotonic() - started < 0.9
        answer = transport.invoke(RequestCode.SEND_MESSAGE_V2, send_ext(topic, 1), b"z")
        assert answer.code == ResponseCode.SUCCESS
        # The held pull ends (the send above wakes it, or its hold runs out) and is dropped.
        wait_until(lambda: transport.statistics().late_responses == 1, "the late answer")
        statistics = transport.statistics()
    assert (statistics.connects, statistics.timeouts, statistics.channel_failures) == (1, 1, 0)


def test_close_fails_outstanding_calls_at_once_and_never_hangs(appliance: Appliance) -> None:
    topic = unique_name("TransportClose")
    create_topic(appliance, topic, 1)
    transport = Transport(appliance.broker_address)
    futures = [
        transport.invoke_async(RequestCode.PULL_MESSAGE, held_pull_ext(topic, 10_000), b"", 15_000)
        for _ in range(5)
    ]
    sync_errors: list[BaseException] = []

    def held_sync_call() -> None:
        try:
            transport.invoke(RequestCode.PULL_MESSAGE, held_pull_ext(topic, 10_000), b"", 15_000)
        except BaseException as error:  # reported by the test thread
            sync_errors.append(error)

    caller = threading.Thread(target=held_sync_call)
    caller.start()
    wait_until(lambda: transport.statistics().outstanding == 6, "six calls outstanding")
    started = time.monotonic()
    transport.close()
    assert time.monotonic() - started < 1.0
    caller.join(WAIT_S)
    assert not caller.is_alive()
    for future in futures:
        assert isinstance(future.exception(1.0), RemotingClosedError)
    assert len(sync_errors) == 1
    assert isinstance(sync_errors[0], RemotingClosedError)
    with pytest.raises(RemotingClosedError):
        transport.invoke(RequestCode.SEND_MESSAGE_V2, send_ext(topic, 1), b"late")


def heartbeat(transport: Transport, client_id: str, group: str, topic: str) -> None:
    consumer = HeartbeatConsumer(
        group,
        ConsumeType.CONSUME_PASSIVELY,
        MessageModel.CLUSTERING,
        ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        (build_subscription(topic, "*", int(time.time() * 1000)),),
    )
    body = heartbeat_body(client_id, [], [consumer])
    answer = transport.invoke(RequestCode.HEART_BEAT, {}, body)
    assert answer.code == ResponseCode.SUCCESS, answer.remark


def test_broker_requests_reach_the_handler_and_its_answer_the_broker(
    appliance: Appliance,
) -> None:
    topic = unique_name("TransportRequests")
    group = unique_name("CG-requests")
    create_topic(appliance, topic, 1)
    received: list[RemotingCommand] = []

    def handler(transport: Transport, request: RemotingCommand) -> None:
        received.append(request)
        if request.code == RequestCode.GET_CONSUMER_RUNNING_INFO:
            transport.respond(request, ResponseCode.SUCCESS, {}, body=b"running fine")

    with (
        Transport(appliance.broker_address, request_handler=handler) as first,
        Transport(appliance.broker_address) as second,
    ):
        heartbeat(first, "10.0.0.1@first", group, topic)
        heartbeat(second, "10.0.0.1@second", group, topic)  # the group changes: 40 to both
        wait_until(
            lambda: any(r.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED for r in received),
            "NOTIFY_CONSUMER_IDS_CHANGED on the idle first connection",
        )
        (notice, *_) = received
        assert notice.ext_fields["consumerGroup"] == group
        assert notice.is_oneway
        with RemotingClient(appliance.broker_address) as admin:
            ext = {"consumerGroup": group, "clientId": "10.0.0.1@first", "jstackEnable": "false"}
            answer = admin.invoke(RequestCode.GET_CONSUMER_RUNNING_INFO, ext)
        assert (answer.code, answer.body) == (ResponseCode.SUCCESS, b"running fine")
        wait_until(  # answered "not supported" by default; read by its idle check
            lambda: second.statistics().broker_requests >= 1,
            "NOTIFY_CONSUMER_IDS_CHANGED on the second connection",
        )


def test_a_sync_call_from_a_callback_of_its_connection_is_refused(appliance: Appliance) -> None:
    topic = unique_name("TransportCallback")
    create_topic(appliance, topic, 1)
    outcome: Future[BaseException | None] = Future()
    with Transport(appliance.broker_address) as transport:

        def callback(response: RemotingCommand | None, error: ClientError | None) -> None:
            try:
                transport.invoke(RequestCode.SEND_MESSAGE_V2, send_ext(topic, 2), b"inner")
            except BaseException as raised:  # handed to the test thread
                outcome.set_result(raised)
            else:
                outcome.set_result(None)

        transport.invoke_callback(
            RequestCode.SEND_MESSAGE_V2, send_ext(topic, 1), b"outer", callback
        )
        assert isinstance(outcome.result(WAIT_S), ClientStateError)


def test_a_broker_crash_fails_outstanding_calls_and_the_next_call_reconnects(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    topic = unique_name("TransportRestart")
    home = tmp_path / "appliance"
    with running_appliance(home, reap_pids) as first:
        create_topic(first, topic, 1)
        broker_port = first.broker_port
        namesrv_port = int(first.namesrv_address.rsplit(":", 1)[1])
        transport = Transport(first.broker_address)
        assert transport.invoke(RequestCode.SEND_MESSAGE_V2, send_ext(topic, 1), b"a").code == 0
        # Held at the queue's end, 1, once the dispatcher counted the send: a pull from 0 would
        # be answered with it, and one from 1 before it is counted would be told to move.
        wait_dispatched_at(first.broker_address)
        held = transport.invoke_async(
            RequestCode.PULL_MESSAGE, held_pull_ext(topic, 20_000, queue_index=1), b"", 25_000
        )
        first.kill()  # a crash: an orderly stop may answer the held pull first
        assert isinstance(held.exception(WAIT_S), RemotingClosedError)
    with pytest.raises((RemotingConnectError, RemotingClosedError)):
        transport.invoke(RequestCode.SEND_MESSAGE_V2, send_ext(topic, 2), b"down")
    with (
        running_appliance(
            home, reap_pids, broker_port=broker_port, namesrv_port=namesrv_port
        ) as second,
        contextlib.closing(transport),
    ):
        assert second.broker_address == first.broker_address
        answer = transport.invoke(RequestCode.SEND_MESSAGE_V2, send_ext(topic, 3), b"back")
        assert answer.code == ResponseCode.SUCCESS
        assert int(answer.ext_fields["queueOffset"]) == 1  # the first send survived the restart
        assert transport.statistics().connects == 2
