"""Goal: `mqbox start --layout etc/examples/2m-2s` runs a name server and four brokers on one host,
each a full broker with its own home, store and ports (its HTTP endpoint's too: /metrics answers
on each); `status` shows each broker with its role, the name server routes two broker names with
ids 0 and 1, `cluster list` shows each broker's role and a replication state that fits it; one
broker stops and starts alone (`--broker NAME`) while the others serve; `stop` ends everything.
A key that changes RocketMQ's behaviour and that mqbox does not implement stops `mqbox start` with
one line naming the key and the file.

Method: the real `mqbox` console script (tests/support/layout.py) on the shipped example with
every port 0 and a home of the test's own; the name server's view through `mqbox cluster list`
(GET_BROKER_CLUSTER_INFO, then MQBOX_BROKER_STATUS of each broker); every process found by the
run files' PIDs and killed in the end.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from mqbox.ipc import names
from mqbox.server.home import instance_name, read_http, read_state, recorded_processes
from tests.support.appliance import sigkill_pids
from tests.support.cli import foreground_mqbox
from tests.support.layout import (
    EXAMPLE_2M_2S,
    RunningLayout,
    layout_pids,
    mqbox,
    parse_started,
    running_layout,
)

pytestmark = pytest.mark.integration

ROLES = {
    "broker-a": ("broker-a", 0, "SYNC_MASTER"),
    "broker-a-s": ("broker-a", 1, "SLAVE"),
    "broker-b": ("broker-b", 0, "SYNC_MASTER"),
    "broker-b-s": ("broker-b", 1, "SLAVE"),
}
# What replication may report this early (test_layout_replication.py waits for the settled ones).
HA_STATES = {"SYNC_MASTER": {"no-slave", "serving"}, "SLAVE": {"connecting", "connected"}}
WAIT_S = 60.0


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def json_of(*arguments: str) -> Any:
    result = mqbox(*arguments, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def cluster(layout: RunningLayout) -> dict[tuple[str, int], dict[str, Any]]:
    listed = json_of("cluster", "list", "--namesrv", layout.namesrv)
    return {(row["broker_name"], row["broker_id"]): row for row in listed["brokers"]}


def layout_status(layout: RunningLayout) -> dict[str, dict[str, Any]]:
    report = json_of("status", "--home", str(layout.home))
    assert report["running"]
    assert report["namesrv"] == layout.namesrv
    return {broker["name"]: broker for broker in report["brokers"]}


def gone(pids: list[int]) -> bool:
    return not any(
        psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        for pid in pids
    )


def test_a_2m_2s_layout_starts_serves_stops_one_broker_and_stops(tmp_path: Path) -> None:
    home = tmp_path / "layout"
    with running_layout(home) as layout:
        assert set(layout.brokers) == set(ROLES)
        assert len(set(layout.brokers.values())) == 4  # four listening ports

        # status: every broker running, with its role and a home, store and HA port of its own.
        brokers = layout_status(layout)
        assert set(brokers) == set(ROLES)
        for name, (broker_name, broker_id, role) in ROLES.items():
            broker = brokers[name]
            assert (broker["broker_name"], broker["broker_id"], broker["role"]) == (
                broker_name,
                broker_id,
                role,
            )
            assert broker["running"]
            assert broker["address"] == layout.brokers[name]
            assert broker["ha_port"] == int(broker["address"].rsplit(":", 1)[1]) + 1
            assert broker["processes_up"] == broker["process_count"] > 5
            assert broker["home"] == str(layout.broker_home(name))
            assert broker["ha_state"] in HA_STATES[role]
            state = read_state(layout.broker_home(name)) or {}
            assert state["broker"]["store_root"] == str(
                layout.broker_home(name) / "store" / broker_name
            )
        table = mqbox("status", "--home", str(home))
        assert table.returncode == 0, table.stderr
        for name in ROLES:
            assert name in table.stdout

        # Every broker's HTTP endpoint serves /metrics on a port of its own (--broker-port 0
        # gives it any free port; run/http.json in the broker's home names it and the serving
        # process, which is that broker's own).
        http_ports = set()
        for name, (broker_name, _, _) in ROLES.items():
            broker_home = layout.broker_home(name)
            http = read_http(broker_home) or {}
            assert "url" in http, (name, http)
            broker_pids = {pid for _, pid, _ in recorded_processes(read_state(broker_home) or {})}
            assert http["pid"] in broker_pids, (name, http, broker_pids)
            http_ports.add(int(http["port"]))
            with urllib.request.urlopen(f"{http['url']}metrics", timeout=10) as answer:
                assert answer.status == 200
                metrics = answer.read().decode()
            assert f'broker="{broker_name}"' in metrics, metrics[:2000]
        assert len(http_ports) == len(ROLES), http_ports

        # The name server: two broker names, ids 0 and 1 each; each broker tells its role.
        wait_until(lambda: len(cluster(layout)) == 4, "four registrations")
        rows = cluster(layout)
        assert set(rows) == {(name, id_) for name, id_, _ in ROLES.values()}
        for name, (broker_name, broker_id, role) in ROLES.items():
            row = rows[(broker_name, broker_id)]
            assert row["address"] == layout.brokers[name]
            assert row["role"] == role
            assert row["version"].startswith("mqbox")
            assert row["ha_state"] in HA_STATES[role]

        # One broker stops alone: the others keep running and stay registered.
        slave_pids = layout_pids(home)
        stopped = mqbox("stop", "--home", str(home), "--broker", "broker-a-s")
        assert stopped.returncode == 0, stopped.stderr
        brokers = layout_status(layout)
        assert not brokers["broker-a-s"]["running"]
        assert all(brokers[name]["running"] for name in ROLES if name != "broker-a-s")
        wait_until(lambda: ("broker-a", 1) not in cluster(layout), "the slave to unregister")
        assert len(cluster(layout)) == 3
        stopped_pids = set(slave_pids) - set(layout_pids(home))
        wait_until(lambda: gone(sorted(stopped_pids)), "the stopped broker's processes to end")

        # ... and starts alone again, registering with the layout's name server.
        again = mqbox("start", "--home", str(home), "--broker", "broker-a-s", timeout_s=600)
        assert again.returncode == 0, again.stderr
        assert "broker-a-s" in again.stdout
        assert layout_status(layout)["broker-a-s"]["running"]
        wait_until(lambda: ("broker-a", 1) in cluster(layout), "the slave to register again")

        # A second layout start in the same home is refused; so is an unknown broker name.
        second = mqbox("start", "--home", str(home), "--layout", str(EXAMPLE_2M_2S))
        assert second.returncode != 0
        assert "already running" in second.stderr
        single = mqbox("start", "--daemon", "--home", str(home), "--broker-port", "0")
        assert single.returncode != 0
        assert "holds a layout" in single.stderr
        unknown = mqbox("stop", "--home", str(home), "--broker", "broker-c")
        assert unknown.returncode != 0
        assert "broker-c" in unknown.stderr

        # stop: every broker and the name server end, their shared memory is gone.
        pids = layout_pids(home)
        done = mqbox("stop", "--home", str(home))
        assert done.returncode == 0, done.stderr
        assert "layout stopped" in done.stdout
        wait_until(lambda: gone(pids), "every process of the layout to end", 20)
        for name, (broker_name, _, _) in ROLES.items():
            instance = instance_name(layout.broker_home(name), broker_name)
            assert names.instance_paths(instance) == []
        after = mqbox("status", "--home", str(home))
        assert after.returncode != 0
        assert "not running" in after.stderr


def test_a_foreground_layout_stops_everything_on_ctrl_c(tmp_path: Path) -> None:
    home = tmp_path / "layout"
    command = ["start", "--home", str(home), "--layout", str(EXAMPLE_2M_2S)]
    command += ["--namesrv-port", "0", "--broker-port", "0"]
    popen = foreground_mqbox(*command)
    pids: list[int] = [popen.pid]
    try:
        assert popen.stdout is not None
        lines = [popen.stdout.readline() for _ in range(2 + len(ROLES))]
        assert set(parse_started(home, "".join(lines)).brokers) == set(ROLES), lines
        pids += layout_pids(home)
        os.killpg(popen.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground group
        assert popen.wait(timeout=120) == 0, popen.stderr.read() if popen.stderr else ""
        assert "layout stopped" in popen.stdout.read()
        wait_until(lambda: gone(pids), "every process of the layout to end", 20)
        assert not (home / "run" / "layout.json").exists()
    finally:
        pids += layout_pids(home)
        sigkill_pids(pids)
        for stream in (popen.stdout, popen.stderr):
            if stream is not None:
                stream.close()


@pytest.mark.crash
def test_brokers_outliving_a_killed_name_server_block_a_new_start_and_stop_ends_them(
    tmp_path: Path,
) -> None:
    home = tmp_path / "layout"
    with running_layout(home) as layout:
        namesrv_pid = int(json_of("status", "--home", str(home))["namesrv_pid"])
        broker_pids = [pid for pid in layout_pids(home) if pid != namesrv_pid]
        os.kill(namesrv_pid, signal.SIGKILL)
        wait_until(lambda: gone([namesrv_pid]), "the name server to die")
        status = mqbox("status", "--home", str(home))
        assert status.returncode != 0
        assert "name server is not running" in status.stderr
        again = mqbox("start", "--home", str(home), "--layout", str(EXAMPLE_2M_2S))
        assert again.returncode != 0
        assert "brokers of an earlier layout still run" in again.stderr
        assert not gone(broker_pids)  # the refused start touched nothing
        stopped = mqbox("stop", "--home", str(home))
        assert stopped.returncode == 0, stopped.stderr
        wait_until(lambda: gone(broker_pids), "every broker to end", 20)
        assert layout.brokers  # the layout had started


def _conf(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_a_behaviour_changing_key_mqbox_lacks_stops_the_start_with_one_line(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    conf = _conf(tmp_path / "broker.conf", "brokerName = broker-a\nenablePropertyFilter = true\n")
    single = mqbox("start", "--daemon", "--home", str(home), "--config", str(conf))
    assert single.returncode != 0
    (line,) = single.stderr.strip().splitlines()
    assert "enablePropertyFilter=true" in line
    assert str(conf) in line
    assert not (home / "run" / "mqbox.pid").exists()

    layout = tmp_path / "layout"
    layout.mkdir()
    _conf(layout / "a.conf", "brokerName = a\nlistenPort = 0\n")
    _conf(layout / "b.conf", "brokerName = b\nlistenPort = 0\ntransientStorePoolEnable = true\n")
    _conf(layout / "mqbox.conf", "brokers = a.conf;b.conf\n")
    refused = mqbox("start", "--daemon", "--home", str(home), "--layout", str(layout))
    assert refused.returncode != 0
    (line,) = refused.stderr.strip().splitlines()
    assert "transientStorePoolEnable=true" in line
    assert str(layout / "b.conf") in line
    assert not (home / "run" / "layout.json").exists()


def test_harmless_unknown_keys_are_one_warning_line_and_config_shows_them(tmp_path: Path) -> None:
    conf = _conf(
        tmp_path / "broker.conf",
        "brokerName = broker-a\nsendMessageThreadPoolNums = 16\nwarmMapedFileEnable = true\n",
    )
    shown = mqbox("config", "--config", str(conf), "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["ignored"]["broker"] == [
        "sendMessageThreadPoolNums",
        "warmMapedFileEnable",
    ]
    # `start` says so in one line before it starts (here it then fails on an unwritable home).
    blocker = _conf(tmp_path / "a-file", "not a directory")
    started = mqbox("start", "--daemon", "--home", str(blocker / "home"), "--config", str(conf))
    assert started.returncode != 0
    warning, error = started.stderr.strip().splitlines()
    assert warning.startswith("mqbox: warning: ")
    assert "sendMessageThreadPoolNums, warmMapedFileEnable" in warning
    assert "not a writable directory" in error
