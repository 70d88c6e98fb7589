"""The name server process and the blocking client, over real sockets on 127.0.0.1.

Goal: `python -m mqbox.namesrv` on port 0 reports its port in the ready file; a registered broker's
topic routes as the exact JSON of docs/protocol.md section 4.1 and an unknown topic gets 17; a
broker that stops registering is evicted after the (shrunk) expiry and its connection closed;
closing the registering connection removes its routes at once; garbage and an oversized frame
length close only the offending connection; a peer that never reads is closed once its unread
answers pass the bound; SIGTERM exits 0 promptly. The client raises its own errors for refused
connections and silent peers, and BrokerRegistrar keeps registering with the name servers that
work while another is dead, and unregisters on stop.
Method: one name server process per test (tests/support/namesrv_process.py, killed by PID
through `reap_pids`), driven with RemotingClient and raw sockets. Waits poll with deadlines and
also check the state before the event, so that a route that was never there cannot pass for an
evicted one. The outbox bound is tested on an in-process NamesrvServer, whose limit can be shrunk.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mqbox.client import namesrv_api
from mqbox.client.registration import BrokerRegistrar
from mqbox.client.remoting import (
    RemotingClient,
    RemotingClosedError,
    RemotingConnectError,
    RemotingTimeoutError,
)
from mqbox.config import NamesrvConfig
from mqbox.namesrv.server import NamesrvServer
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.protocol.command import RemotingCommand, make_request
from mqbox.protocol.connection import Connection, Role
from mqbox.protocol.headers import (
    DataVersion,
    RegisterBrokerBody,
    RegisterBrokerRequestHeader,
    TopicConfig,
)
from tests.conftest import unique_name
from tests.support.namesrv_process import NamesrvProcess, running_namesrv

pytestmark = pytest.mark.integration

WAIT_S = 10.0


def registration(
    broker_name: str, broker_port: int, *topics: str, counter: int = 1
) -> tuple[RegisterBrokerRequestHeader, RegisterBrokerBody]:
    header = RegisterBrokerRequestHeader(
        broker_name,
        f"127.0.0.1:{broker_port}",
        "DefaultCluster",
        f"127.0.0.1:{broker_port + 1}",
        0,
    )
    body = RegisterBrokerBody(
        DataVersion(counter, 1_700_000_000_000),
        {topic: TopicConfig(topic, 4, 4, 6) for topic in topics},
    )
    return header, body


def route_json(broker_name: str, broker_port: int) -> bytes:
    return (
        b'{"brokerDatas":[{"brokerAddrs":{"0":"127.0.0.1:%d"},"brokerName":"%s",'
        b'"cluster":"DefaultCluster"}],"filterServerTable":{},"queueDatas":[{"brokerName":'
        b'"%s","perm":6,"readQueueNums":4,"topicSynFlag":0,"writeQueueNums":4}]}'
        % (broker_port, broker_name.encode(), broker_name.encode())
    )


def wait_until(condition: Callable[[], bool], timeout_s: float = WAIT_S) -> float:
    """Poll until `condition()`; the seconds it took. Fails the test on timeout."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"condition not met within {timeout_s} s")
        time.sleep(0.02)
    return time.monotonic() - start


def has_route(address: str, topic: str) -> bool:
    with RemotingClient(address, 2000) as client:
        return namesrv_api.get_route(client, topic) is not None


@pytest.fixture
def namesrv(tmp_path: Path, reap_pids: list[int]) -> Iterator[NamesrvProcess]:
    """A name server with RocketMQ's default expiry (120 s): nothing is evicted during a test."""
    with running_namesrv(tmp_path / "namesrv", reap_pids) as namesrv:
        yield namesrv


def test_ready_file_names_a_listening_port_and_route_is_the_exact_json(
    namesrv: NamesrvProcess,
) -> None:
    assert namesrv.port > 0
    broker = unique_name("broker")
    topic = unique_name("topic")
    with RemotingClient(namesrv.address) as broker_link, RemotingClient(namesrv.address) as asker:
        outcome = namesrv_api.register_broker(broker_link, *registration(broker, 10911, topic))
        assert (outcome.master_addr, outcome.ha_server_addr) == (None, None)
        response = asker.invoke(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        assert response.code == ResponseCode.SUCCESS
        assert response.body == route_json(broker, 10911)
        assert namesrv_api.topic_list(asker) == (topic,)
        info = namesrv_api.cluster_info(asker)
        assert info.cluster_addr_table == {"DefaultCluster": (broker,)}


def test_unknown_topic_is_17_and_unknown_code_is_3(namesrv: NamesrvProcess) -> None:
    with RemotingClient(namesrv.address) as client:
        response = client.invoke(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})
        assert response.code == ResponseCode.TOPIC_NOT_EXIST
        assert namesrv_api.get_route(client, "TBW102") is None
        unknown = client.invoke(RequestCode.SEND_MESSAGE, {"topic": "t"})
        assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        assert unknown.remark == " request type 10 not supported"


def test_silent_broker_is_evicted_after_the_expiry_and_its_connection_closed(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    expire_ms = 600
    topic = unique_name("topic")
    with (
        running_namesrv(tmp_path, reap_pids, scan_interval_ms=100, expire_ms=expire_ms) as namesrv,
        RemotingClient(namesrv.address) as broker_link,
    ):
        namesrv_api.register_broker(broker_link, *registration("broker-a", 10911, topic))
        registered_at = time.monotonic()
        assert has_route(namesrv.address, topic)
        wait_until(lambda: not has_route(namesrv.address, topic))
        silent_s = time.monotonic() - registered_at
        assert silent_s >= expire_ms / 1000
        # The name server closed the evicted broker's connection, as Java closes the channel.
        with pytest.raises(RemotingClosedError):
            broker_link.invoke(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        assert namesrv.stop() == 0
        assert namesrv.statistics()["broker_evicted_count"] == 1
        assert "evicted after silence" in namesrv.log_text()


def test_registering_again_keeps_a_broker_past_the_expiry(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    topic = unique_name("topic")
    with (
        running_namesrv(tmp_path, reap_pids, scan_interval_ms=100, expire_ms=600) as namesrv,
        RemotingClient(namesrv.address) as broker_link,
    ):
        for _ in range(8):  # 1.6 s in all, well past the expiry
            namesrv_api.register_broker(broker_link, *registration("broker-a", 10911, topic))
            time.sleep(0.2)
        assert has_route(namesrv.address, topic)


def test_closing_the_registering_connection_removes_its_routes(namesrv: NamesrvProcess) -> None:
    topic = unique_name("topic")
    other_topic = unique_name("topic")
    with RemotingClient(namesrv.address) as other_link:
        namesrv_api.register_broker(other_link, *registration("broker-b", 20911, other_topic))
        broker_link = RemotingClient(namesrv.address)
        namesrv_api.register_broker(broker_link, *registration("broker-a", 10911, topic))
        assert has_route(namesrv.address, topic)
        broker_link.close()
        took_s = wait_until(lambda: not has_route(namesrv.address, topic))
        assert took_s < 5  # not the 120 s eviction
        assert has_route(namesrv.address, other_topic)


def raw_connection(address: str) -> socket.socket:
    host, port = address.split(":")
    sock = socket.create_connection((host, int(port)), timeout=WAIT_S)
    return sock


def assert_closed_by_peer(sock: socket.socket) -> None:
    """The server closes the socket: recv sees EOF (or a reset) before the timeout."""
    sock.settimeout(WAIT_S)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass


@pytest.mark.parametrize(
    "garbage",
    [
        pytest.param(struct.pack(">iI", 12, 8) + b"not json", id="bad-json-header"),
        pytest.param(struct.pack(">iI", 0x7FFF_FFF0, 8), id="oversized-length"),
        pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", id="http"),
        pytest.param(struct.pack(">iI", 12, 0x0500_0008) + b"{}{}{}{}", id="bad-serialize-type"),
    ],
)
def test_garbage_closes_only_that_connection(namesrv: NamesrvProcess, garbage: bytes) -> None:
    topic = unique_name("topic")
    with RemotingClient(namesrv.address) as bystander:
        namesrv_api.register_broker(bystander, *registration("broker-a", 10911, topic))
        with raw_connection(namesrv.address) as sock:
            sock.sendall(garbage)
            assert_closed_by_peer(sock)
        # The bystander's connection, and the routes registered over it, are untouched.
        assert namesrv_api.get_route(bystander, topic) is not None
        assert bystander.skipped_frame_count == 0
    assert namesrv.stop() == 0
    statistics = namesrv.statistics()
    assert statistics["protocol_error_close_count"] == 1
    assert statistics["broker_closed_count"] == 1  # the bystander's, at its own close


def test_half_closed_peer_still_gets_its_answer(namesrv: NamesrvProcess) -> None:
    codec = Connection(Role.CLIENT)
    request = make_request(RequestCode.GET_ROUTEINFO_BY_TOPIC, 7, {"topic": "TBW102"})
    with raw_connection(namesrv.address) as sock:
        sock.sendall(codec.send(request))
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(WAIT_S)
        while (chunk := sock.recv(65536)) != b"":
            codec.receive_data(chunk)
        codec.receive_data(b"")
    response = codec.next_command()
    assert isinstance(response, RemotingCommand)
    assert (response.opaque, response.code) == (7, ResponseCode.TOPIC_NOT_EXIST)


def test_config_file_enables_order_topic_conf_in_routes(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    config_file = tmp_path / "namesrv.conf"
    config_file.write_text("listenPort = 9876\norderMessageEnable = true\n", encoding="utf-8")
    topic = unique_name("topic")
    # --listen-port 0 overrides the file's port, as every flag overrides the file.
    with (
        running_namesrv(tmp_path / "namesrv", reap_pids, config_file=config_file) as namesrv,
        RemotingClient(namesrv.address) as client,
    ):
        namesrv_api.put_kv_config(client, "ORDER_TOPIC_CONFIG", topic, "broker-a:4")
        assert namesrv_api.get_kv_config(client, "ORDER_TOPIC_CONFIG", topic) == "broker-a:4"
        namesrv_api.register_broker(client, *registration("broker-a", 10911, topic))
        route = namesrv_api.get_route(client, topic)
        assert route is not None
        assert route.order_topic_conf == "broker-a:4"
        namesrv_api.delete_kv_config(client, "ORDER_TOPIC_CONFIG", topic)
        assert namesrv_api.get_kv_config(client, "ORDER_TOPIC_CONFIG", topic) is None
        assert namesrv_api.wipe_write_perm(client, "broker-a") == 1
        namesrv_api.delete_topic(client, topic)
        assert namesrv_api.get_route(client, topic) is None


def test_sigterm_exits_zero_promptly_and_writes_statistics(namesrv: NamesrvProcess) -> None:
    with RemotingClient(namesrv.address) as client:
        namesrv_api.get_route(client, "TBW102")
        start = time.monotonic()
        assert namesrv.stop(timeout_s=5) == 0
        assert time.monotonic() - start < 2
    statistics = namesrv.statistics()
    assert statistics["handler"]["request_count_by_code"] == {"105": 1}
    assert statistics["handler"]["recent_route_topics"] == ["TBW102"]
    with pytest.raises(RemotingConnectError):
        RemotingClient(namesrv.address, 1000).connect()


def test_second_namesrv_on_a_taken_port_exits_one(namesrv: NamesrvProcess) -> None:
    process = subprocess.run(
        [sys.executable, "-m", "mqbox.namesrv", "--listen-port", str(namesrv.port)],
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert process.returncode == 1
    assert b"cannot listen" in process.stderr


# -- the client ---------------------------------------------------------------------------------


def test_client_raises_connect_error_when_nothing_listens() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Nothing listens on the port now (bound but never listening, then closed).
    with RemotingClient(f"127.0.0.1:{port}", 1000) as client, pytest.raises(RemotingConnectError):
        client.invoke(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "t"})


def test_client_times_out_on_a_silent_peer_and_skips_unrelated_frames() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        client = RemotingClient(address, 300)
        with client:
            start = time.monotonic()
            with pytest.raises(RemotingTimeoutError):
                client.invoke(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "t"})
            assert 0.25 < time.monotonic() - start < 3
            assert not client.connected
            peer, _ = listener.accept()
            peer.close()

            # A peer that first sends a request and an answer to someone else, then the answer.
            def answer_once() -> None:
                sock, _ = listener.accept()
                with sock:
                    codec = Connection(Role.BROKER)
                    codec.receive_data(sock.recv(65536))
                    request = codec.next_command()
                    assert isinstance(request, RemotingCommand)
                    stray = make_request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, 99)
                    late = make_request(105, 12345).make_response(17)
                    mine = request.make_response(0, {"k": "v"})
                    sock.sendall(codec.send(stray) + codec.send(late) + codec.send(mine))
                    sock.recv(1)

            server = threading.Thread(target=answer_once)
            server.start()
            response = client.invoke(
                RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "t"}, timeout_ms=5000
            )
            assert (response.code, response.ext_fields) == (0, {"k": "v"})
            assert client.skipped_frame_count == 2
        server.join(WAIT_S)


def test_client_reports_a_closed_connection() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        client = RemotingClient(f"127.0.0.1:{listener.getsockname()[1]}", 5000)
        client.connect()
        peer, _ = listener.accept()
        peer.close()
        with client, pytest.raises(RemotingClosedError):
            client.invoke(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "t"})


# -- BrokerRegistrar ------------------------------------------------------------------------------


def test_registrar_registers_with_live_namesrvs_despite_a_dead_one_and_unregisters(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    with (
        running_namesrv(tmp_path / "first", reap_pids) as first,
        running_namesrv(tmp_path / "second", reap_pids) as second,
    ):
        check_registrar(first, second)


def check_registrar(first: NamesrvProcess, second: NamesrvProcess) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{probe.getsockname()[1]}"
    topics = [unique_name("topic")]

    def source() -> tuple[RegisterBrokerRequestHeader, RegisterBrokerBody]:
        return registration("broker-a", 10911, *topics, counter=len(topics))

    registrar = BrokerRegistrar(
        f"{first.address};{dead};{second.address}",
        source,
        period_ms=60_000,
        retry_ms=100,
        timeout_ms=2000,
    )
    registrar.start()
    try:
        wait_until(
            lambda: has_route(first.address, topics[0]) and has_route(second.address, topics[0])
        )

        def settled() -> bool:
            first_seen, dead_seen, second_seen = registrar.statistics()
            return (
                first_seen.success_count >= 1
                and second_seen.success_count >= 1
                and dead_seen.failure_count >= 2
            )

        wait_until(settled)
        assert not registrar.wait_registered(100)  # the dead one never accepts
        first_seen, dead_seen, _ = registrar.statistics()
        assert (first_seen.address, dead_seen.address) == (first.address, dead)
        assert first_seen.last_error is None
        assert dead_seen.success_count == 0
        assert dead_seen.last_error is not None
        # A new topic goes out at once on register_now, not after the 60 s period.
        topics.append(unique_name("topic"))
        registrar.register_now()
        wait_until(
            lambda: has_route(first.address, topics[1]) and has_route(second.address, topics[1])
        )
    finally:
        registrar.stop()
    assert not has_route(first.address, topics[0])
    assert not has_route(second.address, topics[0])
    assert "unregistered" in first.log_text()


# -- the outbox bound, in process ------------------------------------------------------------------


def test_peer_that_never_reads_is_closed_when_its_answers_pass_the_bound() -> None:
    server = NamesrvServer(NamesrvConfig(listen_port=0), outbox_size_bytes_max=64 * 1024)
    loop = threading.Thread(target=server.serve, name="namesrv-under-test")
    loop.start()
    keeper = RemotingClient(f"127.0.0.1:{server.port}")
    try:
        namesrv_api.register_broker(keeper, *registration("broker-a", 10911, "t"))
        burst = (
            Connection(Role.CLIENT).send(make_request(RequestCode.GET_BROKER_CLUSTER_INFO, 0))
            * 2000
        )
        with socket.socket() as greedy:
            greedy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            greedy.connect(("127.0.0.1", server.port))
            greedy.settimeout(WAIT_S)
            # Far more answers than the socket buffers and the 64 KiB bound hold; the server
            # closes the connection part way, which ends the loop with a broken pipe or a reset.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                for _ in range(200):
                    greedy.sendall(burst)
            assert_closed_by_peer(greedy)
        # Everyone else is still served.
        assert namesrv_api.get_route(keeper, "t") is not None
    finally:
        keeper.close()
        server.request_stop()
        loop.join(WAIT_S)
    assert not loop.is_alive()
    statistics = server.statistics()  # the loop has ended: no other thread touches the server
    assert statistics.slow_reader_close_count == 1
    assert statistics.protocol_error_close_count == 0
