"""Goal (issue 9, part 3): the name server's resources are bounded by configuration. Past
`mqboxConnectionCountMax` a connection is accepted and closed at once (the others keep being
served); a connection that sends nothing for `serverChannelMaxIdleTimeSeconds` is closed, while
an active one stays; the KV table refuses entries past `mqboxKvNamespaceEntryCountMax` and
`mqboxKvEntryCountMax`, keys and values past their size limits, with SYSTEM_ERROR (1) and a
remark, and still replaces existing keys at the limit; a registration adding a broker past
`mqboxNamesrvBrokerCountMax` gets SYSTEM_ERROR and topics past `mqboxNamesrvTopicCountMax` stay out
of routes, while registered brokers keep re-registering; at start the soft descriptor limit is
raised to the hard one; out of descriptors (EMFILE), the loop backs off instead of spinning.

Method: `python -m mqbox.namesrv` per test (tests/support/namesrv_process.py) with a namesrv.conf
that shrinks the limits, driven with raw sockets and RemotingClient. The descriptor tests start
it with RLIMIT_NOFILE set in the child before exec; the CPU is read with psutil over one second
while more connections wait in the listen backlog than the process has descriptors for (before
the back-off this measured about 100 % of a core).
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from mqbox.client.remoting import RemotingClient
from mqbox.protocol.codes import (
    DELETE_KV_CONFIG,
    GET_KV_CONFIG,
    PUT_KV_CONFIG,
    RequestCode,
    ResponseCode,
)
from mqbox.protocol.headers import (
    DataVersion,
    RegisterBrokerBody,
    RegisterBrokerRequestHeader,
    TopicConfig,
)
from tests.support.namesrv_process import NamesrvProcess, running_namesrv
from tests.support.raw_sockets import closed_by_peer, cpu_percent_over, soft_file_limit

pytestmark = pytest.mark.integration

WAIT_S: Final = 10.0
CPU_PERCENT_MAX: Final = 20.0


def write_conf(directory: Path, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "namesrv.conf"
    path.write_text(text, encoding="utf-8")
    return path


@contextlib.contextmanager
def limited_namesrv(tmp_path: Path, reap_pids: list[int], conf: str) -> Iterator[NamesrvProcess]:
    config_file = write_conf(tmp_path, conf)
    with running_namesrv(tmp_path, reap_pids, config_file=config_file) as namesrv:
        yield namesrv


def connect(namesrv: NamesrvProcess) -> socket.socket:
    return socket.create_connection((namesrv.host, namesrv.port), timeout=WAIT_S)


def test_connections_past_the_cap_are_closed_at_once(tmp_path: Path, reap_pids: list[int]) -> None:
    with limited_namesrv(tmp_path, reap_pids, "mqboxConnectionCountMax=8\n") as namesrv:
        kept = [connect(namesrv) for _ in range(7)]
        with RemotingClient(namesrv.address) as client:
            client.connect()  # the eighth, and in use
            refused = [connect(namesrv) for _ in range(3)]
            assert all(closed_by_peer(sock, WAIT_S) for sock in refused)
            assert not any(closed_by_peer(sock, 0.2) for sock in kept)
            response = client.invoke(GET_KV_CONFIG, {"namespace": "n", "key": "k"})
            assert response.code == ResponseCode.QUERY_NOT_FOUND
        for sock in (*kept, *refused):
            sock.close()
        assert namesrv.stop() == 0
        assert namesrv.statistics()["connection_refused_count"] == 3
        assert "mqboxConnectionCountMax" in namesrv.log_text()


def test_an_idle_connection_is_closed_and_an_active_one_kept(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    with limited_namesrv(tmp_path, reap_pids, "serverChannelMaxIdleTimeSeconds=1\n") as namesrv:
        idle = connect(namesrv)
        with RemotingClient(namesrv.address) as active:
            started = time.monotonic()
            while time.monotonic() - started < 2.5:
                response = active.invoke(GET_KV_CONFIG, {"namespace": "n", "key": "k"})
                assert response.code == ResponseCode.QUERY_NOT_FOUND
                time.sleep(0.3)
            assert closed_by_peer(idle, 0.1)
        idle.close()


def put(client: RemotingClient, namespace: str, key: str, value: str = "v") -> tuple[int, str]:
    response = client.invoke(PUT_KV_CONFIG, {"namespace": namespace, "key": key, "value": value})
    return response.code, response.remark or ""


def test_the_kv_table_is_bounded_per_namespace_in_total_and_in_sizes(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    conf = (
        "mqboxKvNamespaceEntryCountMax=3\n"
        "mqboxKvEntryCountMax=5\n"
        "mqboxKvKeyBytesMax=16\n"
        "mqboxKvValueBytesMax=32\n"
    )
    with (
        limited_namesrv(tmp_path, reap_pids, conf) as namesrv,
        RemotingClient(namesrv.address) as client,
    ):
        assert [put(client, "a", f"k{index}")[0] for index in range(3)] == [0, 0, 0]
        code, remark = put(client, "a", "k3")
        assert code == ResponseCode.SYSTEM_ERROR
        assert "mqboxKvNamespaceEntryCountMax" in remark
        assert put(client, "a", "k0", "replaced") == (0, "")  # a key it holds: no growth
        assert [put(client, "b", f"k{index}")[0] for index in range(2)] == [0, 0]
        code, remark = put(client, "c", "k0")
        assert code == ResponseCode.SYSTEM_ERROR
        assert "mqboxKvEntryCountMax" in remark
        code, remark = put(client, "a", "k" * 17)
        assert (code, "mqboxKvKeyBytesMax" in remark) == (ResponseCode.SYSTEM_ERROR, True)
        code, remark = put(client, "n" * 17, "k")
        assert (code, "mqboxKvKeyBytesMax" in remark) == (ResponseCode.SYSTEM_ERROR, True)
        code, remark = put(client, "a", "k0", "\u00e9" * 17)  # 34 bytes of UTF-8
        assert (code, "mqboxKvValueBytesMax" in remark) == (ResponseCode.SYSTEM_ERROR, True)
        value = client.invoke(GET_KV_CONFIG, {"namespace": "a", "key": "k0"})
        assert value.ext_fields["value"] == "replaced"
        deleted = client.invoke(DELETE_KV_CONFIG, {"namespace": "b", "key": "k0"})
        assert deleted.code == ResponseCode.SUCCESS
        assert put(client, "c", "k0") == (0, "")  # room again


def register(
    client: RemotingClient, name: str, addr: str, *topics: str, counter: int = 1
) -> tuple[int, str]:
    header = RegisterBrokerRequestHeader(name, addr, "DefaultCluster", addr, 0)
    body = RegisterBrokerBody(
        DataVersion(counter, 1), {topic: TopicConfig(topic, 4, 4, 6) for topic in topics}
    )
    response = client.invoke(RequestCode.REGISTER_BROKER, header.to_ext(), body=body.to_json())
    return response.code, response.remark or ""


def routed(client: RemotingClient, topic: str) -> bool:
    response = client.invoke(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    return response.code == ResponseCode.SUCCESS


def test_brokers_and_topics_in_routes_are_bounded(tmp_path: Path, reap_pids: list[int]) -> None:
    conf = "mqboxNamesrvBrokerCountMax=2\nmqboxNamesrvTopicCountMax=3\n"
    with limited_namesrv(tmp_path, reap_pids, conf) as namesrv:
        with RemotingClient(namesrv.address) as client:
            assert register(client, "b0", "127.0.0.1:1", "t0", "t1") == (0, "")
            assert register(client, "b1", "127.0.0.1:2", "t1", "t2", "t3") == (0, "")
            assert [routed(client, f"t{n}") for n in range(4)] == [True, True, True, False]
            code, remark = register(client, "b2", "127.0.0.1:3", "t4")
            assert code == ResponseCode.SYSTEM_ERROR
            assert remark.endswith("mqboxNamesrvBrokerCountMax=2")
            assert register(client, "b0", "127.0.0.1:1", "t0", counter=2) == (0, "")
            assert not routed(client, "t4")
        assert namesrv.stop() == 0
        handler = namesrv.statistics()["handler"]
        assert (handler["registration_refused_count"], handler["topic_refused_count"]) == (1, 1)
        assert handler["failure_count"] == 0
        assert "mqboxNamesrvTopicCountMax=3" in namesrv.log_text()


def test_the_soft_descriptor_limit_is_raised_to_the_hard_one(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    with running_namesrv(tmp_path, reap_pids, file_limit=(64, 4096)) as namesrv:
        assert soft_file_limit(namesrv.process.pid) == 4096


def test_out_of_descriptors_the_loop_backs_off_instead_of_spinning(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    with running_namesrv(tmp_path, reap_pids, file_limit=(48, 48)) as namesrv:
        # More connections than descriptors: the kernel completes them into the backlog, the
        # name server's accept fails with EMFILE once its table is full.
        sockets = [connect(namesrv) for _ in range(80)]
        try:
            cpu_percent = cpu_percent_over(namesrv.process.pid, 1.0)
            assert cpu_percent < CPU_PERCENT_MAX, f"{cpu_percent:.0f} % of a core"
            # Freeing descriptors lets the waiting connections in.
            for sock in sockets[:40]:
                sock.close()
            assert not closed_by_peer(sockets[-1], 1.0)
        finally:
            for sock in sockets:
                sock.close()
        assert "accept" in namesrv.log_text()
