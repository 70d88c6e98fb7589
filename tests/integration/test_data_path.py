"""Goal: the broker's data path (reactor -> codec -> worker -> processor -> codec -> reactor) works
as real processes forked by the real supervisor: requests are answered (no-op -> 0, unknown
code -> 3 with Java's remark), garbage or an oversized length closes that connection only while
another keeps working, pipelined requests come back in order, frames above a ring's inline
maximum pass through spill files, and a role killed with SIGKILL is re-forked and serves the
next request; after a processor dies, every request still gets an answer.

Method: `python -m mqbox.server.supervisor --no-namesrv` on 127.0.0.1 port 0 with the front
topology of tests/support/broker_front.py (reactor, codecs, worker, admin; no send, pull or store
roles, so SEND and PULL fall back to the admin processor). Clients are plain sockets with the
protocol's client codec. Each broker is stopped with SIGTERM and its processes SIGKILLed by PID
in `finally`; its shared memory is swept.
"""

from __future__ import annotations

import contextlib
import os
import signal
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqbox.ipc import names
from mqbox.protocol import make_request
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.protocol.mqbox_codes import MQBOX_NOOP
from tests.support.broker_front import FrontBroker, running_front
from tests.support.front_client import FrontClient

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontBroker]:
    """One front with small rings (64 KiB: 32 KiB inline) shared by the tests that kill nothing."""
    pids: list[int] = []
    home = tmp_path_factory.mktemp("front")
    with running_front(home, pids, small_rings=True, codec_count=2) as running:
        yield running
    for pid in pids:  # running_front stopped them; this only covers its own failure
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def client_of(broker: FrontBroker) -> FrontClient:
    return FrontClient(broker.host, broker.port)


def test_noop_answers_success_and_unknown_codes_get_3(broker: FrontBroker) -> None:
    client = client_of(broker)
    try:
        assert client.call(MQBOX_NOOP).code == ResponseCode.SUCCESS
        assert client.call(RequestCode.HEART_BEAT, body=b'{"clientID":"x"}').code == 0
        unknown = client.call(4242)
        assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        assert unknown.remark == " request type 4242 not supported"
        send = client.call(RequestCode.SEND_MESSAGE, {"topic": "t"}, b"hello")
        assert send.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    finally:
        client.close()


@pytest.mark.parametrize(
    "garbage",
    [b"\xff\xff\xff\xff garbage bytes", struct.pack(">i", 1 << 30) + b"...."],
    ids=["garbage", "oversized-length"],
)
def test_garbage_closes_that_connection_only(broker: FrontBroker, garbage: bytes) -> None:
    good = client_of(broker)
    bad = client_of(broker)
    try:
        assert good.call(MQBOX_NOOP).code == 0
        assert bad.call(MQBOX_NOOP).code == 0
        bad.send_raw(garbage)
        bad.wait_closed()
        assert good.call(MQBOX_NOOP).code == 0
        again = client_of(broker)
        try:
            assert again.call(MQBOX_NOOP).code == 0
        finally:
            again.close()
    finally:
        good.close()
        bad.close()


def test_many_pipelined_requests_come_back_in_order(broker: FrontBroker) -> None:
    clients = [client_of(broker) for _ in range(3)]
    try:
        count = 2000
        for client in clients:
            frames = [
                client.connection.send(
                    make_request(MQBOX_NOOP if index % 5 else 999, client.connection.next_opaque())
                )
                for index in range(count)
            ]
            client.send_raw(b"".join(frames))
        for client in clients:
            responses = client.responses(count)
            assert [response.opaque for response in responses] == list(range(count))
            assert [response.code for response in responses] == [
                0 if index % 5 else 3 for index in range(count)
            ]
    finally:
        for client in clients:
            client.close()


def test_frames_over_the_inline_maximum_pass_through_spill_files(broker: FrontBroker) -> None:
    client = client_of(broker)
    try:
        body = os.urandom(100 * 1024)  # 32 KiB inline maximum in these rings
        frames = [
            client.connection.send(
                make_request(MQBOX_NOOP, client.connection.next_opaque(), body=body)
            )
            for _ in range(30)
        ]
        client.send_raw(b"".join(frames))
        responses = client.responses(30)
        assert [response.code for response in responses] == [0] * 30
        big = client.call(RequestCode.SEND_MESSAGE, {"topic": "t"}, os.urandom(3 << 20))
        assert big.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        assert client.call(MQBOX_NOOP).code == 0
        leftovers = [p for p in names.instance_paths(broker.instance) if ".spill-" in p.name]
        assert leftovers == []
    finally:
        client.close()


@pytest.mark.crash
def test_a_sigkilled_codec_is_reforked_and_serves_the_next_request(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    with running_front(tmp_path / "home", reap_pids, codec_count=1) as front:
        client = FrontClient(front.host, front.port)
        try:
            assert client.call(MQBOX_NOOP).code == 0
            old_pid = front.role_pid("codec.0")
            os.kill(old_pid, signal.SIGKILL)
            front.wait_role_restarted("codec.0", old_pid)
            assert client.call(MQBOX_NOOP).code == 0  # the same connection
            fresh = FrontClient(front.host, front.port)
            try:
                assert fresh.call(4242).code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
            finally:
                fresh.close()
        finally:
            client.close()


@pytest.mark.crash
def test_every_request_is_answered_when_the_processor_dies_midway(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    """SIGKILL the admin processor under a pipelined load: each request gets a response, from
    the restarted processor (records still in its ring) or SYSTEM_ERROR from the worker's
    in-flight table (records the dead process had taken)."""
    with running_front(tmp_path / "home", reap_pids, codec_count=1) as front:
        client = FrontClient(front.host, front.port)
        try:
            assert client.call(MQBOX_NOOP).code == 0
            count = 3000
            frames = [
                client.connection.send(make_request(MQBOX_NOOP, client.connection.next_opaque()))
                for _ in range(count)
            ]
            client.send_raw(b"".join(frames[: count // 2]))
            old_pid = front.role_pid("admin.0")
            os.kill(old_pid, signal.SIGKILL)
            client.send_raw(b"".join(frames[count // 2 :]))
            front.wait_role_restarted("admin.0", old_pid)
            answered: dict[int, set[int]] = {}
            # Duplicates are allowed (an answer and an error for one request), loss is not. The
            # first call (opaque 0) may get a late SYSTEM_ERROR too: its COMPLETED notice can
            # still be on its way to the worker when the processor dies (worker.py).
            expected = set(range(1, count + 1))
            while not expected <= answered.keys():
                (response,) = client.responses(1)
                answered.setdefault(response.opaque, set()).add(response.code)
            assert answered.keys() <= expected | {0}
            assert all(codes <= {0, 1} for codes in answered.values())
            opaque = client.request(MQBOX_NOOP)
            while True:  # skip what is still on its way for the requests above
                (response,) = client.responses(1)
                if response.opaque == opaque:
                    break
            assert response.code == 0
        finally:
            client.close()


def test_two_reactors_share_the_listening_socket(tmp_path: Path, reap_pids: list[int]) -> None:
    with running_front(tmp_path / "home", reap_pids, reactor_count=2, codec_count=2) as front:
        clients = [FrontClient(front.host, front.port) for _ in range(12)]
        try:
            for client in clients:
                assert client.call(MQBOX_NOOP).code == 0
            for client in clients:
                assert client.call(4242).code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        finally:
            for client in clients:
                client.close()
