"""Replication between two real appliances over RocketMQ's HA protocol (docs/replication.md).

Goal: (1) after a load on a SYNC_MASTER, the slave's commit log is byte-identical to the master's up
to the slave's reported offset, and every acknowledged send is on the slave; (2) a SYNC_MASTER with
no slave answers SLAVE_NOT_AVAILABLE (the message stored); (3) a slave that was down during a load
catches up and is byte-identical, and meanwhile the master's slave lag in messages
(run/replication.json, MQBOX_BROKER_STATUS as `cluster list` reads it, `mqbox status`) is exactly
the messages sent, 0 on both sides once it caught up; (4) a slave whose log has bytes its master
does not have refuses to continue and says so; (5) a connected slave that stops reporting makes a
SYNC_MASTER send answer FLUSH_SLAVE_TIMEOUT after syncFlushTimeout, and replication resumes; (6) a
slave and then a master killed with SIGKILL restart on their homes, recover, and the slave catches
up byte-identical; (7) a slave whose store writer is stopped counts the records it received and has
not stored, and so does its master; 0 after it resumes.
Method: a master appliance (haListenPort any free port) and a slave appliance in homes of their
own, sharing the master's name server; the load comes from mqbox's Producer; the commit logs
are read from their files (tests/support/replication.py).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from mqbox.client import Producer, SendStatus
from mqbox.client.admin_api import broker_status
from mqbox.client.remoting import RemotingClient
from mqbox.server.home import HaState, read_ha_state
from tests.conftest import unique_name
from tests.support.appliance import Appliance, running_appliance
from tests.support.cli import run_mqbox
from tests.support.read_back import create_topic
from tests.support.replication import (
    WAIT_S,
    commit_log_bytes,
    master_conf,
    replication_state,
    running_slave,
    wait_slave_reported,
    wait_state,
    write_offset,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


def _send_load(master: Appliance, topic: str, count: int) -> list[str]:
    """Send `count` messages one by one; the keys of those answered SEND_OK."""
    acked: list[str] = []
    with Producer(unique_name("PG").replace("-", "_"), master.namesrv_address) as producer:
        for number in range(count):
            key = f"k{number}"
            result = producer.send(topic, f"body-{number}".encode() * 4, keys=key)
            if result.status is SendStatus.SEND_OK:
                acked.append(key)
    return acked


def _assert_identical(master: Appliance, slave: Appliance, end_bytes: int) -> None:
    ours = commit_log_bytes(slave.home, end_bytes)
    theirs = commit_log_bytes(master.home, end_bytes)
    assert len(ours) == end_bytes
    assert ours == theirs


def test_sync_master_replicates_byte_identical(tmp_path: Path, reap_pids: list[int]) -> None:
    with (
        running_appliance(tmp_path / "master", reap_pids, master_conf()) as master,
        running_slave(tmp_path / "slave", reap_pids, master) as slave,
    ):
        wait_state(slave, "state", "connected")
        topic = unique_name("ha")
        create_topic(master, topic, 4)
        acked = _send_load(master, topic, 200)
        assert len(acked) == 200  # a connected, caught-up slave acknowledges every send
        end_bytes = write_offset(master)
        reported = wait_slave_reported(slave, end_bytes)
        assert reported == end_bytes
        _assert_identical(master, slave, end_bytes)
        assert write_offset(slave) == end_bytes


def test_sync_master_without_slave_answers_slave_not_available(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    with running_appliance(tmp_path / "master", reap_pids, master_conf()) as master:
        topic = unique_name("ha")
        create_topic(master, topic, 2)
        with Producer(unique_name("PG").replace("-", "_"), master.namesrv_address) as producer:
            result = producer.send(topic, b"alone", keys="alone")
        assert result.status is SendStatus.SLAVE_NOT_AVAILABLE
        assert write_offset(master) > 0  # stored all the same


def test_slave_down_during_load_catches_up(tmp_path: Path, reap_pids: list[int]) -> None:
    """The slave is stopped during a load and started again: it catches up byte-identical;
    meanwhile the master's slave lag is the bytes and exactly the messages it missed."""
    conf = master_conf("ASYNC_MASTER")
    with running_appliance(tmp_path / "master", reap_pids, conf) as master:
        topic = unique_name("ha")
        create_topic(master, topic, 4)
        with running_slave(tmp_path / "slave", reap_pids, master) as slave:
            _send_load(master, topic, 50)
            caught_up_bytes = write_offset(master)
            wait_slave_reported(slave, caught_up_bytes)
            _wait_ha_state(master, HaState("serving", 0, 0))
            _wait_ha_state(slave, HaState("connected", 0, 0))
        # The slave is down: the master keeps its last acknowledged offset and counts the
        # records past it.
        _wait_ha_state(master, HaState("no-slave", 0, 0))
        assert len(_send_load(master, topic, 300)) == 300
        lag_bytes = write_offset(master) - caught_up_bytes
        _wait_ha_state(master, HaState("no-slave", lag_bytes, 300))
        with RemotingClient(master.broker_address) as broker:
            status = broker_status(broker)  # what `mqbox cluster list` shows
        assert (status.ha_state, status.slave_lag_bytes, status.slave_lag_messages) == (
            "no-slave",
            lag_bytes,
            300,
        )
        shown = run_mqbox("status", "--home", str(master.home), timeout_s=60.0)
        assert shown.returncode == 0, shown.stderr
        assert f"slave lag {lag_bytes} bytes, 300 messages" in shown.stdout, shown.stdout

        with running_slave(tmp_path / "slave", reap_pids, master) as slave:
            end_bytes = write_offset(master)
            wait_slave_reported(slave, end_bytes)
            _assert_identical(master, slave, end_bytes)
            _wait_ha_state(master, HaState("serving", 0, 0))
            _wait_ha_state(slave, HaState("connected", 0, 0))


def _wait_ha_state(appliance: Appliance, expected: HaState) -> None:
    """run/replication.json (written at most once a second while positions move) shows it."""
    wait_until(
        lambda: read_ha_state(appliance.home) == expected,
        f"{appliance.home.name}'s replication to read {expected}",
        WAIT_S,
    )


def test_a_slave_s_lag_counts_the_records_it_received_and_has_not_stored(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    """The slave's store writer is stopped (SIGSTOP): the records its HA client received and
    handed stay unacknowledged, and both sides count exactly them; after SIGCONT, 0."""
    conf = master_conf("ASYNC_MASTER")
    with (
        running_appliance(tmp_path / "master", reap_pids, conf) as master,
        running_slave(tmp_path / "slave", reap_pids, master) as slave,
    ):
        topic = unique_name("ha")
        create_topic(master, topic, 2)
        _send_load(master, topic, 10)
        caught_up_bytes = write_offset(master)
        wait_slave_reported(slave, caught_up_bytes)
        writer_pid = slave.roles["store_writer.0"]
        os.kill(writer_pid, signal.SIGSTOP)
        try:
            assert len(_send_load(master, topic, 25)) == 25
            lag_bytes = write_offset(master) - caught_up_bytes
            # The slave reports (its unchanged end) every haSendHeartbeatInterval, 5 s.
            _wait_ha_state(slave, HaState("connected", lag_bytes, 25))
            _wait_ha_state(master, HaState("serving", lag_bytes, 25))
        finally:
            os.kill(writer_pid, signal.SIGCONT)
        wait_slave_reported(slave, write_offset(master))
        _wait_ha_state(slave, HaState("connected", 0, 0))
        _wait_ha_state(master, HaState("serving", 0, 0))


def test_diverged_slave_refuses(tmp_path: Path, reap_pids: list[int]) -> None:
    """A slave whose log runs past its master's (the master lost its store) stops."""
    conf = master_conf("ASYNC_MASTER")
    topic = unique_name("ha")
    with running_appliance(tmp_path / "master", reap_pids, conf) as master:
        create_topic(master, topic, 2)
        with running_slave(tmp_path / "slave", reap_pids, master) as slave:
            _send_load(master, topic, 30)
            end_bytes = write_offset(master)
            wait_slave_reported(slave, end_bytes)
    # A new master with an empty store on a fresh home: the slave has bytes it does not.
    with (
        running_appliance(tmp_path / "master2", reap_pids, conf) as master,
        running_slave(tmp_path / "slave", reap_pids, master) as slave,
    ):
        wait_state(slave, "state", "diverged")
        assert write_offset(slave) == end_bytes  # nothing appended, nothing lost
        reason = str(replication_state(slave).get("reason"))
        assert "we have bytes it does not" in reason
        log_text = (slave.home / "logs" / "ha_client.0.log").read_text(encoding="utf-8")
        assert "diverged" in log_text


def test_sync_master_answers_flush_slave_timeout_while_the_slave_is_silent(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    """A connected slave that stops reporting: the send waits syncFlushTimeout, then 12."""
    conf = master_conf("SYNC_MASTER", "syncFlushTimeout=1000\n")
    with (
        running_appliance(tmp_path / "master", reap_pids, conf) as master,
        running_slave(tmp_path / "slave", reap_pids, master) as slave,
        Producer(unique_name("PG").replace("-", "_"), master.namesrv_address) as producer,
    ):
        wait_state(slave, "state", "connected")
        topic = unique_name("ha")
        create_topic(master, topic, 2)
        assert producer.send(topic, b"first", keys="first").status is SendStatus.SEND_OK
        ha_client_pid = slave.roles["ha_client.0"]
        os.kill(ha_client_pid, signal.SIGSTOP)
        try:
            result = producer.send(topic, b"unconfirmed", keys="unconfirmed")
        finally:
            os.kill(ha_client_pid, signal.SIGCONT)
        assert result.status is SendStatus.FLUSH_SLAVE_TIMEOUT
        # Back: it catches up (the HA client reports what it missed after SIGCONT, a moment
        # later), and the next send is confirmed again within syncFlushTimeout.
        wait_slave_reported(slave, write_offset(master))
        assert producer.send(topic, b"again", keys="again").status is SendStatus.SEND_OK
        wait_slave_reported(slave, write_offset(master))


def test_crashes_on_either_side_recover_and_catch_up(tmp_path: Path, reap_pids: list[int]) -> None:
    """SIGKILL of the slave during a load, then of the master: each restarts on its home,
    recovers, and the slave ends byte-identical to the master."""
    conf = master_conf("ASYNC_MASTER")
    topic = unique_name("ha")
    with running_appliance(tmp_path / "master", reap_pids, conf) as master:
        create_topic(master, topic, 4)
        with running_slave(tmp_path / "slave", reap_pids, master) as slave:
            _send_load(master, topic, 100)
            slave.kill()
        _send_load(master, topic, 100)
        with running_slave(tmp_path / "slave", reap_pids, master) as slave:
            wait_slave_reported(slave, write_offset(master))
        master_port = master.broker_port
        master.kill()
    # The master restarts on its home and its old ports (the slave's haMasterAddress): its HA
    # port is listenPort + 1 again.
    ha_port = int(master.ha_address.rsplit(":", 1)[1])
    restart_conf = conf
    with (
        running_appliance(
            tmp_path / "master", reap_pids, restart_conf, broker_port=master_port
        ) as master,
        running_slave(tmp_path / "slave", reap_pids, master) as slave,
    ):
        assert master.ha_address.endswith(f":{ha_port}")
        _send_load(master, topic, 100)
        end_bytes = write_offset(master)
        wait_slave_reported(slave, end_bytes)
        _assert_identical(master, slave, end_bytes)
