"""The official C++ client (PyPI `rocketmq==0.4.4`) reads mqbox's name server routes.

Goal: a C++ producer pointed at `python -m mqbox.namesrv` (1) sends to the broker address that a
route from mqbox named, which proves the client parsed our TopicRouteData JSON (queueDatas with
the write permission, a master address in brokerDatas) and used it; and (2) fails cleanly, with
"No route info of this topic", for a topic nobody registered, after asking the name server for
that topic and for TBW102, as docs/protocol.md section 4.1 says it does.
Method: the wrapper is not fork-safe, so the producer runs in a child `python` process (a small
script written to tmp_path, HOME pointed there for its logs) under a bounded timeout and is killed
by PID in `finally`. For (1) the "broker" is a listening socket owned by the test and registered
through mqbox's own client: nothing there answers, so only the first frame the producer sends to
it is read and checked (code 10 for our topic). For (2) the name server's statistics file,
written at SIGTERM, must list the topics the producer asked routes for, so the test cannot pass
without the route requests having happened.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mqbox.client import namesrv_api
from mqbox.client.remoting import RemotingClient
from mqbox.protocol.codes import RequestCode
from mqbox.protocol.command import RemotingCommand
from mqbox.protocol.connection import NEED_DATA, Connection, Role
from mqbox.protocol.headers import (
    DataVersion,
    RegisterBrokerBody,
    RegisterBrokerRequestHeader,
    TopicConfig,
)
from tests.conftest import unique_name
from tests.support.namesrv_process import running_namesrv

pytestmark = pytest.mark.interop

CHILD_TIMEOUT_S = 60.0
FRAME_WAIT_S = 30.0

PRODUCER_SCRIPT = """
import sys
from rocketmq.client import Message, Producer

namesrv_addr, group, topic = sys.argv[1:4]
producer = Producer(group)
producer.set_namesrv_addr(namesrv_addr)
producer.set_timeout(3000)
producer.start()
message = Message(topic)
message.set_body(b"interop")
try:
    result = producer.send_sync(message)
    print("SENT", result.status, flush=True)
except Exception as error:
    print("FAILED", type(error).__name__, error, flush=True)
producer.shutdown()
print("DONE", flush=True)
"""


def start_producer(directory: Path, namesrv_addr: str, topic: str) -> subprocess.Popen[str]:
    script = directory / "producer.py"
    script.write_text(PRODUCER_SCRIPT, encoding="utf-8")
    environment = {**os.environ, "HOME": str(directory)}  # rocketmq-cpp logs under $HOME/logs
    return subprocess.Popen(
        [sys.executable, str(script), namesrv_addr, unique_name("PG"), topic],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=directory,
        env=environment,
    )


def stop_child(child: subprocess.Popen[str]) -> None:
    if child.poll() is None:
        child.kill()
    child.wait(10)
    if child.stdout is not None:
        child.stdout.close()


def read_first_frame(listener: socket.socket) -> RemotingCommand:
    """Accept one connection on `listener` and decode the first frame the peer sends."""
    listener.settimeout(FRAME_WAIT_S)
    sock, _ = listener.accept()
    with sock:
        sock.settimeout(FRAME_WAIT_S)
        codec = Connection(Role.BROKER)
        while True:
            chunk = sock.recv(65536)
            assert chunk, "the producer closed before sending a whole frame"
            codec.receive_data(chunk)
            command = codec.next_command()
            if command is not NEED_DATA:
                assert isinstance(command, RemotingCommand)
                return command


def test_cpp_producer_sends_to_the_broker_our_route_names(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    topic = unique_name("Interop")
    with (
        running_namesrv(tmp_path / "namesrv", reap_pids) as namesrv,
        socket.socket() as fake_broker,
        RemotingClient(namesrv.address) as broker_link,
    ):
        fake_broker.bind(("127.0.0.1", 0))
        fake_broker.listen(4)
        broker_addr = f"127.0.0.1:{fake_broker.getsockname()[1]}"
        header = RegisterBrokerRequestHeader(
            "broker-a", broker_addr, "DefaultCluster", "127.0.0.1:1", 0
        )
        body = RegisterBrokerBody(DataVersion(1, 1), {topic: TopicConfig(topic, 4, 4, 6)})
        namesrv_api.register_broker(broker_link, header, body)

        child = start_producer(tmp_path, namesrv.address, topic)
        reap_pids.append(child.pid)
        try:
            send = read_first_frame(fake_broker)
        finally:
            stop_child(child)
        assert send.code == RequestCode.SEND_MESSAGE
        assert send.ext_fields["topic"] == topic
        assert int(send.ext_fields["queueId"]) in range(4)
        assert send.body == b"interop"

        assert namesrv.stop() == 0
        handler = namesrv.statistics()["handler"]
        assert topic in handler["recent_route_topics"]
        assert handler["route_found_count"] >= 1


def test_cpp_producer_fails_cleanly_on_an_unroutable_topic(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    topic = unique_name("Unroutable")
    with running_namesrv(tmp_path / "namesrv", reap_pids) as namesrv:
        child = start_producer(tmp_path, namesrv.address, topic)
        reap_pids.append(child.pid)
        try:
            output, _ = child.communicate(timeout=CHILD_TIMEOUT_S)
        finally:
            stop_child(child)
        assert child.returncode == 0, output
        assert f"No route info of this topic: {topic}" in output, output
        assert "FAILED" in output
        assert "DONE" in output

        assert namesrv.stop() == 0
        handler = namesrv.statistics()["handler"]
        assert topic in handler["recent_route_topics"]
        assert "TBW102" in handler["recent_route_topics"]
        assert handler["route_found_count"] == 0
        assert handler["route_not_found_count"] >= 2
