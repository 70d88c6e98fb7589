"""Goal: with real processes, only brokers change the name server's broker tables
(docs/security.md). (a) A name server whose mqboxNamesrvBrokerWhiteList names 127.0.0.2 refuses
103 and 205 from a peer at 127.0.0.1 with 16 and a remark, and routes nothing of the fake broker,
while the same registration from 127.0.0.2 is served. (b) With the default white-list (`local`),
a fake registration of a running broker's (brokerName, brokerId) at another address is refused
with 16 and the route keeps naming the real broker; a real broker restarting on its own address
is accepted, even while a registration for that address is still live.

Method: `python -m mqbox.namesrv` on port 0 (tests/support/namesrv_process.py) with a config
file; raw remoting requests on FrontClient sockets, bound to a chosen loopback source address
for (a); the real appliance (`python -m mqbox.server.supervisor --no-namesrv`) for (b),
restarted on the port it first got.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

import pytest

from mqbox.client import namesrv_api
from mqbox.client.remoting import RemotingClient
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.protocol.command import RemotingCommand
from mqbox.protocol.headers import (
    DataVersion,
    RegisterBrokerBody,
    RegisterBrokerRequestHeader,
    TopicConfig,
    WipeWritePermOfBrokerRequestHeader,
)
from tests.support.appliance import running_supervisor
from tests.support.front_client import FrontClient
from tests.support.namesrv_process import NamesrvProcess, running_namesrv

pytestmark = pytest.mark.integration

WAIT_S: Final = 30.0


def register(
    namesrv: NamesrvProcess,
    broker_name: str,
    broker_addr: str,
    topic: str,
    *,
    client: FrontClient | None = None,
) -> RemotingCommand:
    """103 for `broker_name` id 0 at `broker_addr` serving `topic`, on `client` or a new one."""
    header = RegisterBrokerRequestHeader(broker_name, broker_addr, "DefaultCluster", "", 0)
    body = RegisterBrokerBody(DataVersion(1, 1), {topic: TopicConfig(topic, 4, 4, 6)})
    if client is not None:
        return client.call(RequestCode.REGISTER_BROKER, header.to_ext(), body.to_json())
    sender = FrontClient(namesrv.host, namesrv.port)
    try:
        return sender.call(RequestCode.REGISTER_BROKER, header.to_ext(), body.to_json())
    finally:
        sender.close()


def route_addresses(namesrv: NamesrvProcess, topic: str) -> dict[str, dict[int, str]] | None:
    """brokerName -> brokerId -> address of the topic's route; None when it has none."""
    with RemotingClient(namesrv.address, 2000) as client:
        route = namesrv_api.get_route(client, topic)
    if route is None:
        return None
    return {data.broker_name: dict(data.broker_addrs) for data in route.broker_datas}


def wait_until(what: str, condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {WAIT_S} s"
        time.sleep(0.05)


def test_a_broker_outside_the_white_list_can_neither_register_nor_wipe(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    config = tmp_path / "namesrv.conf"
    config.write_text("mqboxNamesrvBrokerWhiteList=127.0.0.2\n", encoding="utf-8")
    with running_namesrv(tmp_path / "ns", reap_pids, config_file=config) as namesrv:
        fake = register(namesrv, "fake-broker", "127.0.0.1:19999", "RealTopic")
        assert fake.code == ResponseCode.NO_PERMISSION
        assert "mqboxNamesrvBrokerWhiteList" in (fake.remark or "")
        assert route_addresses(namesrv, "RealTopic") is None

        # A registration lasts while its connection does: keep this one open.
        broker_b = FrontClient(namesrv.host, namesrv.port, source_host="127.0.0.2")
        try:
            allowed = register(namesrv, "broker-b", "127.0.0.2:10911", "RealTopic", client=broker_b)
            assert allowed.code == ResponseCode.SUCCESS, allowed.remark
            assert route_addresses(namesrv, "RealTopic") == {"broker-b": {0: "127.0.0.2:10911"}}
            wipe_from_outside(namesrv)
        finally:
            broker_b.close()


def wipe_from_outside(namesrv: NamesrvProcess) -> None:
    """205 for broker-b from 127.0.0.1, outside the white-list: refused, the perm stays 6."""
    wiper = FrontClient(namesrv.host, namesrv.port)
    try:
        ext = WipeWritePermOfBrokerRequestHeader("broker-b").to_ext()
        wiped = wiper.call(RequestCode.WIPE_WRITE_PERM_OF_BROKER, ext)
    finally:
        wiper.close()
    assert wiped.code == ResponseCode.NO_PERMISSION
    with RemotingClient(namesrv.address, 2000) as client:
        route = namesrv_api.get_route(client, "RealTopic")
    assert route is not None
    assert route.queue_datas[0].perm == 6


@contextlib.contextmanager
def running_broker(
    home: Path, namesrv: NamesrvProcess, reap_pids: list[int], port: int
) -> Iterator[int]:
    """The appliance registering with `namesrv`, on `port` (0 = any); yields its port."""
    home.mkdir(parents=True, exist_ok=True)
    conf = home / "broker.conf"
    conf.write_text(
        f"brokerIP1=127.0.0.1\nnamesrvAddr={namesrv.address}\nregisterNameServerPeriod=1000\n"
        "mapedFileSizeCommitLog=16777216\nmapedFileSizeConsumeQueue=60000\n"
        "mqboxSendProcessorCount=1\nmqboxPullProcessorCount=1\n",
        encoding="utf-8",
    )
    arguments = ["--config", str(conf), "--broker-port", str(port), "--no-namesrv"]
    with running_supervisor(home, arguments, reap_pids) as (_process, ready, _output):
        yield int(str(ready["broker"]).rsplit(":", 1)[1])


def test_a_fake_broker_cannot_take_a_running_brokers_place_and_a_restart_keeps_it(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    with running_namesrv(tmp_path / "ns", reap_pids) as namesrv:
        with running_broker(tmp_path / "broker", namesrv, reap_pids, 0) as port:
            real = f"127.0.0.1:{port}"
            wait_until("broker-a routed", lambda: route_addresses(namesrv, "TBW102") is not None)
            fake = register(namesrv, "broker-a", "127.0.0.1:1", "TBW102")
            assert fake.code == ResponseCode.NO_PERMISSION
            assert real in (fake.remark or "")
            assert route_addresses(namesrv, "TBW102") == {"broker-a": {0: real}}
        wait_until("broker-a gone", lambda: route_addresses(namesrv, "TBW102") is None)

        # Its old registration still live (say its host froze, the connection stayed open):
        # the broker restarting on its own address takes its place all the same.
        stale = FrontClient(namesrv.host, namesrv.port)
        try:
            held = register(namesrv, "broker-a", real, "Ghost", client=stale)
            assert held.code == ResponseCode.SUCCESS, held.remark
            with running_broker(tmp_path / "broker", namesrv, reap_pids, port) as again:
                assert again == port
                wait_until(
                    "the restarted broker routed",
                    lambda: route_addresses(namesrv, "TBW102") == {"broker-a": {0: real}},
                )
        finally:
            stale.close()
