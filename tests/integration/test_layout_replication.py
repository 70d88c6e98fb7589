"""Goal: in a 2m-2s layout started by the CLI on port 0, where the slaves' broker.conf name no
haMasterAddress and every HA port is a free one, each slave learns its master's HA address from
the name server's REGISTER_BROKER answer and replicates it: messages sent to each master are on
its slave byte for byte, also after broker-a's master restarted on another port (its slave
follows after its next registration), `mqbox cluster list` shows each master "serving" and each
slave "connected"; and after SIGKILL of broker-a's master, a push consumer still gets every message
broker-a held, from broker-a-s (docs/replication.md, "How a slave finds its master").

Method: the real `mqbox` console script (tests/support/layout.py); topics created on both
masters over the raw protocol; sends with mqbox.client's Producer; each broker's commit log read
from its files up to the slave's reported offset (run/replication.json); the master's processes
killed by the PIDs its run files name.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

from mqbox.client import ClientInstance, Producer, PushConsumer, SendStatus
from mqbox.client.admin_api import all_topic_config
from mqbox.client.namesrv_api import get_route
from mqbox.client.remoting import RemotingClient
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.protocol.headers import UpdateAndCreateTopicRequestHeader
from mqbox.run_files import read_json
from mqbox.server.home import instance_name, read_replication, read_state, recorded_processes
from mqbox.server.queue_counters import StorePositions, store_positions_name
from tests.conftest import unique_name
from tests.support.appliance import sigkill_pids
from tests.support.consumers import Collector
from tests.support.layout import RunningLayout, mqbox, running_layout
from tests.support.replication import commit_log_bytes
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

WAIT_S = 90.0
PAIRS = {"broker-a": "broker-a-s", "broker-b": "broker-b-s"}  # master -> its slave
MESSAGE_COUNT = 40


def create_topic_on_masters(layout: RunningLayout, topic: str) -> None:
    header = UpdateAndCreateTopicRequestHeader(topic, "TBW102", 2, 2, 6)
    for master in PAIRS:
        with RemotingClient(layout.brokers[master], 5000) as broker:
            response = broker.invoke(RequestCode.UPDATE_AND_CREATE_TOPIC, header.to_ext())
        assert response.code == ResponseCode.SUCCESS, (response.code, response.remark)

    def routed_by_both() -> bool:
        with RemotingClient(layout.namesrv, 5000) as namesrv:
            route = get_route(namesrv, topic)
        names = {data.broker_name for data in route.queue_datas} if route else set()
        return names == set(PAIRS)

    wait_until(routed_by_both, f"both masters to route {topic}", WAIT_S)


def write_offset(layout: RunningLayout, name: str, broker_name: str) -> int:
    instance = instance_name(layout.broker_home(name), broker_name)
    positions = StorePositions.attach(store_positions_name(instance))
    try:
        return positions.write_log_offset_bytes
    finally:
        positions.close()


def slave_report(layout: RunningLayout, slave: str) -> dict[str, Any]:
    return read_replication(layout.broker_home(slave)) or {}


def slave_connected(layout: RunningLayout, slave: str) -> bool:
    return slave_report(layout, slave).get("state") == "connected"


def slave_reported(layout: RunningLayout, slave: str, end_bytes: int) -> bool:
    reported = slave_report(layout, slave).get("reported_log_offset")
    return isinstance(reported, int) and reported >= end_bytes


def topic_on(address: str, topic: str) -> bool:
    with RemotingClient(address, 5000) as broker:
        return topic in all_topic_config(broker).topic_config_table


def addresses(layout: RunningLayout) -> dict[str, str]:
    """Each broker's address now, by member name (`mqbox status`: a restart moves a broker)."""
    result = mqbox("status", "--home", str(layout.home), "--json")
    assert result.returncode == 0, result.stderr
    return {broker["name"]: broker["address"] for broker in json.loads(result.stdout)["brokers"]}


def ha_states(layout: RunningLayout) -> dict[str, str]:
    """`mqbox cluster list --json`: each broker's HA state, by its member name."""
    result = mqbox("cluster", "list", "--namesrv", layout.namesrv, "--json")
    assert result.returncode == 0, result.stderr
    names = {address: name for name, address in addresses(layout).items()}
    return {names[row["address"]]: row["ha_state"] for row in json.loads(result.stdout)["brokers"]}


def learned_master(layout: RunningLayout, slave: str) -> str:
    """The master's HA address the slave learned from the name server (run/master.json; ""
    before the first answer that named one)."""
    document = read_json(layout.broker_home(slave) / "run" / "master.json") or {}
    return str(document.get("ha_server_addr") or "")


def following(layout: RunningLayout, slave: str, other_than: str) -> bool:
    """The slave learned a master other than `other_than` and is connected to it."""
    report = slave_report(layout, slave)
    learned = learned_master(layout, slave)
    connected = report.get("state") == "connected" and report.get("master") == learned
    return connected and learned != other_than


def send(layout: RunningLayout, topic: str, numbers: range, keys: dict[str, set[str]]) -> None:
    """Send one message per number; each must be SEND_OK (a SYNC_MASTER: the slave has it)."""
    with Producer(unique_name("LayoutP").replace("-", "_"), layout.namesrv) as producer:
        for number in numbers:
            result = producer.send(topic, b"body-%d" % number, keys=f"k{number}")
            assert result.status is SendStatus.SEND_OK, result.status
            keys[result.queue.broker_name].add(f"k{number}")


def test_slaves_learn_and_follow_their_masters_and_serve_after_a_kill(tmp_path: Path) -> None:
    with running_layout(tmp_path / "layout") as layout:
        for slave in PAIRS.values():
            wait_until(
                functools.partial(following, layout, slave, ""),
                f"{slave} to learn its master and connect",
                WAIT_S,
            )
        topic = unique_name("LayoutHA")
        create_topic_on_masters(layout, topic)
        keys_by_broker: dict[str, set[str]] = {master: set() for master in PAIRS}
        send(layout, topic, range(MESSAGE_COUNT // 2), keys_by_broker)

        # broker-a's master restarts on another port: its slave follows after its next
        # registration (registerNameServerPeriod, 30 s) and catches up.
        old_master = learned_master(layout, "broker-a-s")
        assert mqbox("stop", "--home", str(layout.home), "--broker", "broker-a").returncode == 0
        started = mqbox("start", "--home", str(layout.home), "--broker", "broker-a", "--daemon")
        assert started.returncode == 0, started.stderr
        wait_until(
            functools.partial(following, layout, "broker-a-s", old_master),
            "broker-a-s to follow its master's new HA address",
            WAIT_S,
        )
        send(layout, topic, range(MESSAGE_COUNT // 2, MESSAGE_COUNT), keys_by_broker)
        assert all(keys_by_broker.values()), keys_by_broker  # each master got some

        for master, slave in PAIRS.items():
            end_bytes = write_offset(layout, master, master)
            wait_until(
                functools.partial(slave_reported, layout, slave, end_bytes),
                f"{slave} to report {end_bytes}",
                WAIT_S,
            )
            ours = commit_log_bytes(layout.broker_home(slave), end_bytes, master)
            assert len(ours) == end_bytes
            assert ours == commit_log_bytes(layout.broker_home(master), end_bytes, master)

        expected = {
            "broker-a": "serving",
            "broker-b": "serving",
            "broker-a-s": "connected",
            "broker-b-s": "connected",
        }
        wait_until(lambda: ha_states(layout) == expected, "cluster list's HA states", WAIT_S)

        # The slave has the topic's config from its master's (slave_sync) ...
        wait_until(
            functools.partial(topic_on, layout.brokers["broker-a-s"], topic),
            "the topic on broker-a-s",
            WAIT_S,
        )
        # ... then broker-a's master dies (its supervisor and every role): broker-a-s serves.
        master_state = read_state(layout.broker_home("broker-a")) or {}
        sigkill_pids([pid for _, pid, _ in recorded_processes(master_state)])
        instance = ClientInstance(layout.namesrv, route_refresh_interval_ms=300)
        instance.start()
        try:
            collector = Collector()
            group = unique_name("LayoutG").replace("-", "_")
            with PushConsumer(group, instance=instance, consume_from="first") as consumer:
                consumer.subscribe(topic, "*", collector)
                wait_until(
                    lambda: collector.count() >= MESSAGE_COUNT, "every message consumed", WAIT_S
                )
        finally:
            instance.shutdown()
        from_a = {
            key for seen in collector.seen() if seen.broker == "broker-a" for key in seen.keys
        }
        assert from_a == keys_by_broker["broker-a"]
        assert collector.bodies() == {b"body-%d" % number: 1 for number in range(MESSAGE_COUNT)}
