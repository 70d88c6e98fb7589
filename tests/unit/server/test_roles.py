"""Goal: the front roles (reactor, codec, worker, admin processor) answer every request with a
proper RocketMQ response, close a connection that breaks the protocol while the others keep
working, carry large frames through spill files, send file-backed bodies with sendfile, close
slow readers and idle connections, and answer SYSTEM_ERROR for requests a dead processor held.

Method: every role as an object in this process (tests/support/front_in_process.py) over real
rings and a listening socket on 127.0.0.1 port 0; the client is a plain socket with the
protocol's client codec, and every wait pumps the roles' loops (`run_once(0)`), so each step is
deterministic and a test can stop the pipeline at any hop, drain a ring by hand or inject a
parcel. Rings, spill files and sockets are released in the fixture's `finally`.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqbox.ipc import names
from mqbox.protocol import FLAG_RESPONSE, RemotingCommand, SerializeType, make_request
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.protocol.command import encode_command, encode_command_head
from mqbox.protocol.mqbox_codes import MQBOX_NOOP
from mqbox.server import parcels, transport
from mqbox.server.roles.processors import Request
from mqbox.server.roles.worker import ConnectionInfo
from mqbox.store import layout as store_layout
from tests.support.front_client import ConnectionClosedError, FrontClient
from tests.support.front_in_process import FrontInProcess


@pytest.fixture
def small_front(shm_instance: str, tmp_path: Path) -> Iterator[FrontInProcess]:
    graph = FrontInProcess(shm_instance, tmp_path / "store", small_rings=True)
    try:
        yield graph
    finally:
        graph.close()


def connect(front: FrontInProcess, *, receive_buffer_size_bytes: int | None = None) -> FrontClient:
    """A client whose CONNECTION_OPENED the worker has seen."""
    known = len(front.workers[0].connections)
    client = FrontClient(
        "127.0.0.1",
        front.port,
        pump=front.pump,
        receive_buffer_size_bytes=receive_buffer_size_bytes,
    )
    front.pump_until(lambda: len(front.workers[0].connections) == known + 1)
    return client


def spill_files(instance: str) -> list[Path]:
    return [path for path in names.instance_paths(instance) if ".spill-" in path.name]


def test_noop_and_heartbeat_answer_success(front: FrontInProcess) -> None:
    client = connect(front)
    try:
        noop = client.call(MQBOX_NOOP)
        assert noop.code == ResponseCode.SUCCESS
        assert noop.flag & FLAG_RESPONSE
        assert noop.ext_fields == {}
        assert client.call(RequestCode.HEART_BEAT, body=b'{"clientID":"c"}').code == 0
        assert client.call(RequestCode.UNREGISTER_CLIENT, {"clientID": "c"}).code == 0
    finally:
        client.close()


def test_unknown_code_gets_request_code_not_supported_with_javas_remark(
    front: FrontInProcess,
) -> None:
    client = connect(front)
    try:
        response = client.call(77)
        assert response.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        assert response.remark == " request type 77 not supported"
    finally:
        client.close()


@pytest.mark.parametrize(
    "code",
    [
        RequestCode.SEND_MESSAGE,
        RequestCode.SEND_MESSAGE_V2,
        RequestCode.SEND_BATCH_MESSAGE,
        RequestCode.PULL_MESSAGE,
    ],
)
def test_send_and_pull_fall_back_to_admin_while_their_pools_are_empty(
    front: FrontInProcess, code: int
) -> None:
    client = connect(front)
    try:
        response = client.call(code, {"topic": "t"}, b"body")
        assert response.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        assert response.remark == f" request type {code} not supported"
        assert front.workers[0].statistics().commands_by_kind == {"admin": 1}
    finally:
        client.close()


def test_binary_header_requests_get_binary_header_responses(front: FrontInProcess) -> None:
    client = connect(front)
    try:
        client.send(make_request(MQBOX_NOOP, 9, {"k": "v"}, serialize_type=SerializeType.ROCKETMQ))
        (response,) = client.responses(1)
        assert response.serialize_type is SerializeType.ROCKETMQ
        assert (response.code, response.opaque) == (0, 9)
    finally:
        client.close()


def test_pipelined_requests_come_back_in_order(front: FrontInProcess) -> None:
    client = connect(front)
    try:
        codes = [MQBOX_NOOP if index % 3 else 55 for index in range(600)]
        frames = [
            client.connection.send(make_request(code, client.connection.next_opaque()))
            for code in codes
        ]
        client.send_raw(b"".join(frames))
        responses = client.responses(len(codes))
        assert [response.opaque for response in responses] == list(range(len(codes)))
        assert [response.code for response in responses] == [
            0 if code == MQBOX_NOOP else 3 for code in codes
        ]
    finally:
        client.close()


@pytest.mark.parametrize(
    "garbage",
    [
        struct.pack(">i", -5) + b"xxxx",  # negative length
        struct.pack(">i", 2),  # shorter than the header word
        struct.pack(">i", 64 * 1024 * 1024),  # over the 16 MiB frame limit
    ],
    ids=["negative", "too-short", "oversized"],
)
def test_a_bad_length_prefix_closes_that_connection_only(
    front: FrontInProcess, garbage: bytes
) -> None:
    bad = connect(front)
    good = connect(front)
    try:
        assert bad.call(MQBOX_NOOP).code == 0
        # The frame before the bad prefix is forwarded; its answer may find the socket closed,
        # as with Netty, which closes a channel on a decoder error without flushing.
        bad.send_raw(bad.connection.send(make_request(MQBOX_NOOP, 100)) + garbage)
        bad.wait_closed()
        assert good.call(MQBOX_NOOP).code == 0
        front.pump_until(lambda: len(front.workers[0].connections) == 1)
        assert front.reactor.statistics().protocol_closes == 1
    finally:
        bad.close()
        good.close()


def frame_with_header(header: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">iI", 4 + len(header) + len(body), len(header)) + header + body


def test_a_header_that_is_not_json_closes_the_connection_without_an_answer(
    front: FrontInProcess,
) -> None:
    bad = connect(front)
    good = connect(front)
    try:
        bad.send_raw(frame_with_header(b"not json at all"))
        bad.wait_closed()
        assert bad.connection.next_command() is not None
        assert good.call(MQBOX_NOOP).code == 0
    finally:
        bad.close()
        good.close()


def test_a_bad_header_with_a_readable_opaque_is_answered_then_closed(
    front: FrontInProcess,
) -> None:
    client = connect(front)
    try:
        client.send_raw(frame_with_header(b'{"code":"ten","opaque":5,"flag":0}'))
        (response,) = client.responses(1)
        assert response.opaque == 5
        assert response.code == ResponseCode.SYSTEM_ERROR
        assert response.remark is not None
        assert "code" in response.remark
        client.wait_closed()
        assert (
            front.codecs[0].statistics().protocol_errors
            + front.codecs[1].statistics().protocol_errors
            == 1
        )
    finally:
        client.close()


def test_a_frame_over_the_ring_inline_maximum_goes_through_spill_files(
    small_front: FrontInProcess, shm_instance: str
) -> None:
    client = connect(small_front)
    try:
        body = bytes(range(256)) * 400  # 100 KiB against a 32 KiB inline maximum
        response = client.call(RequestCode.SEND_MESSAGE, {"topic": "t"}, body)
        assert response.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        assert small_front.reactor.statistics().spill_count == 1  # FRAME
        assert sum(codec.statistics().spill_count for codec in small_front.codecs) == 1  # COMMAND
        assert small_front.workers[0].statistics().spill_count == 0  # forwarded unread
        small_front.pump(3)
        assert spill_files(shm_instance) == []
        # Many of them pipelined: the rings fill up, the roles hold the rest and catch up.
        frames = [
            client.connection.send(
                make_request(MQBOX_NOOP, client.connection.next_opaque(), body=body)
            )
            for _ in range(20)
        ]
        client.send_raw(b"".join(frames))
        assert [r.code for r in client.responses(20)] == [0] * 20
        small_front.pump(3)
        assert spill_files(shm_instance) == []
    finally:
        client.close()


def test_partial_frames_wait_in_turn_for_the_reactors_budget(front: FrontInProcess) -> None:
    """Issue 9: a frame longer than one read is buffered under a reservation of its length; the
    second of two such frames that do not fit together waits, unread, for the first."""
    reactor = front.reactor
    reactor.partial_frame_size_bytes_max = 1 << 20
    first = connect(front)
    second = connect(front)
    small = connect(front)
    try:
        body = b"p" * 700_000
        frames = [
            client.connection.send(make_request(MQBOX_NOOP, 1, body=body))
            for client in (first, second)
        ]
        first.send_raw(frames[0][:400_000])
        front.pump_until(lambda: reactor.statistics().partial_frame_reserved_bytes > 0)
        second.send_raw(frames[1][:400_000])
        front.pump_until(lambda: reactor.statistics().partial_frame_waits == 1)
        assert small.call(MQBOX_NOOP).code == 0  # frames within one read need no reservation
        assert reactor.statistics().partial_frame_reserved_bytes == len(frames[0])
        first.send_raw(frames[0][400_000:])
        (answer,) = first.responses(1)
        assert answer.code == 0
        second.send_raw(frames[1][400_000:])
        (answer,) = second.responses(1)
        assert answer.code == 0
        front.pump(3)
        assert reactor.statistics().partial_frame_reserved_bytes == 0
    finally:
        for client in (first, second, small):
            client.close()


def test_requests_in_flight_are_counted_true_through_oneway_frames(front: FrontInProcess) -> None:
    """Issue 9: the reactor forwards at most in_flight_count_max requests awaiting an answer;
    ONEWAY frames come back as NO_ANSWER from the codec, so they never hold a place."""
    reactor = front.reactor
    reactor.in_flight_count_max = 4
    client = connect(front)
    try:
        (connection,) = reactor.connections.values()
        oneway = [
            client.connection.send(
                make_request(MQBOX_NOOP, client.connection.next_opaque(), oneway=True)
            )
            for _ in range(20)
        ]
        client.send_raw(b"".join(oneway))
        assert client.call(MQBOX_NOOP).code == 0
        pipelined = [
            client.connection.send(make_request(MQBOX_NOOP, client.connection.next_opaque()))
            for _ in range(30)
        ]
        client.send_raw(b"".join(pipelined))
        assert [response.code for response in client.responses(30)] == [0] * 30
        assert reactor.statistics().in_flight_waits > 0
        front.pump_until(lambda: connection.in_flight_count == 0)
        assert connection.read_blocks == 0
    finally:
        client.close()


def write_segment(store_root: Path, segment_start: int, content: bytes) -> Path:
    path = store_layout.commit_log_dir(store_root) / store_layout.segment_name(segment_start)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def inject_response(
    front: FrontInProcess, conn_id: int, frame_head: bytes, runs: list[tuple[int, int, int]]
) -> None:
    """What a codec writes for a REPLY with a read plan, written through codec.0's own outbox."""
    outbox = front.codecs[0].reactor_outboxes[0]
    outbox.append(
        parcels.RESPONSE,
        parcels.pack_response_head(conn_id, len(runs), 0),
        parcels.pack_runs(runs),
        frame_head,
    )
    assert outbox.flush_nowait()


def pull_head(opaque: int, body_size: int) -> bytes:
    response = RemotingCommand(0, opaque=opaque, flag=FLAG_RESPONSE, ext_fields={"a": "b"})
    return encode_command_head(response, body_size)


def test_a_read_plan_response_is_sent_with_sendfile_from_the_segment(
    front: FrontInProcess, tmp_path: Path
) -> None:
    store_root = tmp_path / "store"
    segment_size = 1 << 20
    first = bytes(index % 251 for index in range(segment_size))
    write_segment(store_root, 0, first)
    second = b"S" * 4096
    write_segment(store_root, segment_size, second)
    client = connect(front)
    try:
        (conn_id,) = front.reactor.connections
        runs = [(0, 100, 5000), (0, 9000, 300_000), (segment_size, 10, 50)]
        inject_response(front, conn_id, pull_head(7, 305_050), runs)
        (response,) = client.responses(1)
        assert (response.opaque, response.ext_fields) == (7, {"a": "b"})
        assert response.body == first[100:5100] + first[9000:309_000] + second[10:60]
        assert front.reactor.statistics().sendfile_bytes == 305_050
        # A segment deleted and written again (recovery) is reopened by name, not read stale.
        write_segment(store_root, segment_size, b"T" * 4096)
        inject_response(front, conn_id, pull_head(8, 50), [(segment_size, 10, 50)])
        (again,) = client.responses(1)
        assert again.body == b"T" * 50
    finally:
        client.close()


def test_a_processor_reply_with_runs_reaches_the_client_through_codec_and_reactor(
    front: FrontInProcess, tmp_path: Path
) -> None:
    """What a PULL processor will do: reply_with_runs -> REPLY -> RESPONSE -> sendfile."""
    content = bytes(index % 199 for index in range(70_000))
    write_segment(tmp_path / "store", 1 << 30, content)
    client = connect(front)
    try:
        (conn_id,) = front.reactor.connections
        admin = front.admins[0]
        request = Request(conn_id, 31, 11, 0, 0, b"\x7f\0\0\x01", 1, 0, b"", 0)
        response = request.make_response(0, {"nextBeginOffset": "5"})
        admin.reply_with_runs(request, response, [(1 << 30, 10, 1000), (1 << 30, 60_000, 9000)])
        (received,) = client.responses(1)
        assert (received.opaque, received.code) == (31, 0)
        assert received.ext_fields == {"nextBeginOffset": "5"}
        assert received.body == content[10:1010] + content[60_000:69_000]
    finally:
        client.close()


def test_a_reply_over_the_frame_limit_becomes_system_error(front: FrontInProcess) -> None:
    client = connect(front)
    try:
        (conn_id,) = front.reactor.connections
        admin = front.admins[0]
        request = Request(conn_id, 32, 12, 0, 0, b"\0\0\0\0", 0, 0, b"", 0)
        admin.frame_size_bytes_max = 1024
        admin.reply(request, request.make_response(0, {}, body=b"x" * 2000))
        (received,) = client.responses(1)
        assert (received.opaque, received.code) == (32, ResponseCode.SYSTEM_ERROR)
        assert admin.statistics().replies_too_large == 1
    finally:
        client.close()


def test_request_decodes_its_command_only_when_asked() -> None:
    command = make_request(MQBOX_NOOP, 77, {"topic": "t", "queueId": "3"}, body=b"payload")
    frame = encode_command(command)
    header_size = struct.unpack_from(">I", frame, 4)[0] & 0xFFFFFF
    request = Request(9, 77, MQBOX_NOOP, 0, 0, b"\0\0\0\0", 0, header_size, frame[8:], 0)
    response = request.make_response(0, {})
    assert (response.opaque, response.flag, response.serialize_type) == (
        77,
        FLAG_RESPONSE,
        SerializeType.JSON,
    )
    assert request.command.ext_fields == {"topic": "t", "queueId": "3"}
    assert request.command.body == b"payload"
    assert Request.of(command).command is command


def test_a_reply_that_would_spill_past_the_budget_is_answered_system_busy(
    front: FrontInProcess,
) -> None:
    """Issue 9: a processor's reply over the ring's inline maximum needs room in the instance's
    spill budget; without it the client gets SYSTEM_BUSY (2) and a remark, not the bytes."""
    client = connect(front)
    admin = front.admins[0]
    admin.spill_budget = transport.SpillBudget(front.instance, 1 << 20)
    body = b"r" * (admin.inline_size_bytes_max + 1)
    other = transport.SpillWriter(front.instance, "test.0")
    try:
        (conn_id,) = front.reactor.connections
        full = other.write([b"o" * (1 << 20)])
        request = Request.of(make_request(MQBOX_NOOP, 7), conn_id)
        admin.reply(request, request.make_response(0, {}, body=body))
        (busy,) = client.responses(1)
        assert (busy.opaque, busy.code) == (7, ResponseCode.SYSTEM_BUSY)
        assert "mqboxSpillBytesMax" in (busy.remark or "")
        (names.SHM_DIRECTORY / full).unlink()
        request = Request.of(make_request(MQBOX_NOOP, 8), conn_id)
        admin.reply(request, request.make_response(0, {}, body=body))
        (whole,) = client.responses(1)
        assert (whole.opaque, whole.code, whole.body) == (8, 0, body)
    finally:
        client.close()


def test_a_read_plan_of_a_missing_segment_closes_the_connection(front: FrontInProcess) -> None:
    client = connect(front)
    try:
        (conn_id,) = front.reactor.connections
        inject_response(front, conn_id, pull_head(7, 10), [(1 << 30, 0, 10)])
        with pytest.raises(ConnectionClosedError):
            client.responses(1)
        front.pump_until(lambda: not front.workers[0].connections)
    finally:
        client.close()


def test_a_peer_that_stops_reading_is_closed_when_its_output_passes_the_limit(
    shm_instance: str, tmp_path: Path
) -> None:
    """The reactor's response budget (mqboxResponseBufferBytesMax) closes the connection that
    holds the most unsent answers."""
    front = FrontInProcess(
        shm_instance,
        tmp_path / "store",
        reactor_options={"response_buffer_size_bytes_max": 256 * 1024},
    )
    client = connect(front, receive_buffer_size_bytes=4096)
    try:
        (conn_id,) = front.reactor.connections
        frame = encode_command(RemotingCommand(0, opaque=1, flag=FLAG_RESPONSE, body=b"z" * 60_000))
        outbox = front.codecs[0].reactor_outboxes[0]
        # Responses for a client that reads nothing, until the kernel's socket buffers are full
        # and the reactor's queue passes its limit.
        for _ in range(1000):
            outbox.append(parcels.RESPONSE, parcels.pack_response_head(conn_id, 0, 0), frame)
            outbox.flush_nowait()
            front.pump()
            if front.reactor.statistics().slow_reader_closes:
                break
        assert front.reactor.statistics().slow_reader_closes == 1
        front.pump_until(lambda: not front.workers[0].connections)
    finally:
        client.close()
        front.close()


def test_an_idle_connection_is_closed_by_the_worker(shm_instance: str, tmp_path: Path) -> None:
    front = FrontInProcess(
        shm_instance, tmp_path / "store", worker_options={"connection_idle_ms": 50}
    )
    busy = connect(front)
    idle = connect(front)
    try:
        worker = front.workers[0]
        time.sleep(0.06)
        assert busy.call(MQBOX_NOOP).code == 0  # activity keeps this one
        assert worker.close_idle_connections(time.monotonic_ns()) == 1
        idle.wait_closed()
        front.pump_until(lambda: len(worker.connections) == 1)
        assert busy.call(MQBOX_NOOP).code == 0
        assert worker.statistics().idle_closes == 1
    finally:
        busy.close()
        idle.close()
        front.close()


def test_requests_a_dead_processor_held_are_answered_with_system_error(
    front: FrontInProcess,
) -> None:
    client = connect(front)
    try:
        assert client.call(MQBOX_NOOP).code == 0
        worker = front.workers[0]
        opaque = client.request(MQBOX_NOOP)
        # The request travels to the admin processor's ring; the processor takes it and dies.
        admin_inbox = front.admins[0].worker_inboxes[0]
        for _ in range(1000):
            front.reactor.run_once(0)
            for codec in front.codecs:
                codec.run_once(0)
            worker.run_once(0)
            if admin_inbox.ring.readable():
                break
        batch = admin_inbox.drain_nowait()
        assert batch.count == 1
        admin_inbox.release(batch)
        assert worker.on_processor_restarted("admin.0") == 1
        (response,) = client.responses(1)
        assert (response.opaque, response.code) == (opaque, ResponseCode.SYSTEM_ERROR)
        assert response.remark is not None
        assert "admin.0" in response.remark
        assert worker.statistics().in_flight == 0
        assert client.call(MQBOX_NOOP).code == 0
    finally:
        client.close()


def test_answered_requests_leave_the_in_flight_table(front: FrontInProcess) -> None:
    client = connect(front)
    try:
        for _ in range(5):
            assert client.call(MQBOX_NOOP).code == 0
        worker = front.workers[0]
        time.sleep(parcels.COMPLETED_FLUSH_INTERVAL_NS / 1e9)
        front.pump_until(lambda: worker.statistics().in_flight == 0)
        assert worker.on_processor_restarted("admin.0") == 0
    finally:
        client.close()


def test_connection_events_reach_the_worker_table(front: FrontInProcess) -> None:
    client = connect(front)
    worker = front.workers[0]
    (info,) = worker.connections.values()
    assert (info.peer_host, info.peer_port) == client.sock.getsockname()
    assert client.call(MQBOX_NOOP).code == 0
    assert info.request_count == 1
    client.close()
    front.pump_until(lambda: not worker.connections)
    assert worker.statistics().connections_closed == 1
    assert not front.reactor.connections


def test_close_connection_for_an_unknown_id_still_reports_it_closed(
    front: FrontInProcess,
) -> None:
    """A reactor's predecessor left this id in the tables: the CLOSED lets them forget it."""
    stale_conn_id = parcels.make_conn_id(0, 1, 12345)
    worker = front.workers[0]
    worker.connections[stale_conn_id] = ConnectionInfo(stale_conn_id, "10.0.0.1", 1, 0, 0)
    outbox = front.codecs[stale_conn_id % 2].reactor_outboxes[0]
    outbox.append(parcels.CLOSE_CONNECTION, parcels.pack_close_connection(stale_conn_id, 0))
    assert outbox.flush_nowait()
    front.pump_until(lambda: stale_conn_id not in worker.connections)
    assert worker.statistics().connections_closed == 1
    assert front.reactor.statistics().connections_closed == 0  # it had no such socket


def test_statistics_are_plain_counters(front: FrontInProcess) -> None:
    client = connect(front)
    try:
        assert client.call(MQBOX_NOOP).code == 0
    finally:
        client.close()
    for statistics in (
        front.reactor.statistics(),
        front.codecs[0].statistics(),
        front.workers[0].statistics(),
        front.admins[0].statistics(),
    ):
        json.dumps(dataclasses.asdict(statistics))
        assert statistics.turn_count > 0
    assert front.reactor.statistics().frames_received == 1
    assert front.admins[0].statistics().replies == 1


def test_client_socket_is_served_by_codec_conn_mod_c(front: FrontInProcess) -> None:
    clients = [connect(front) for _ in range(4)]
    try:
        for client in clients:
            assert client.call(MQBOX_NOOP).code == 0
        decoded = [codec.statistics().frames_decoded for codec in front.codecs]
        assert decoded == [2, 2]
        for conn_id in front.reactor.connections:
            assert parcels.reactor_of(conn_id) == 0
    finally:
        for client in clients:
            client.close()
