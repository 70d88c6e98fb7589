"""Goal: replication keeps what it promised when the master dies. (1) SYNC_MASTER: under load
from several producers, the master SIGKILLed at a random moment and its store deleted, every
message that was acknowledged SEND_OK is on the slave (by unique key), over at least 20 kills;
(2) ASYNC_MASTER: after the master's kill, the slave's commit log is the master's, byte for
byte, up to the offset the slave last reported.

Method: per kill, a fresh master appliance (haListenPort on any free port) and a fresh slave
appliance (tests/support/replication.py), both real process trees; three producer threads
(mqbox.client.Producer) send messages whose key and body carry a unique token; a random delay,
then SIGKILL by PID of the master's supervisor and roles; the keys are read from the slave's
commit-log files with one regular expression. Marked `slow` and `crash`.
"""

from __future__ import annotations

import random
import re
import shutil
import threading
import time
from pathlib import Path

import pytest

from mqbox.client import Producer, SendStatus
from mqbox.server.queue_counters import StorePositions, store_positions_name
from tests.conftest import unique_name
from tests.support.appliance import Appliance, running_appliance
from tests.support.read_back import create_topic
from tests.support.replication import (
    commit_log_bytes,
    master_conf,
    running_slave,
    wait_state,
    write_offset,
)

pytestmark = [pytest.mark.crash, pytest.mark.slow]

SYNC_KILL_COUNT = 20
ASYNC_KILL_COUNT = 3
PRODUCER_COUNT = 3
KEY_PATTERN = re.compile(rb"c\d\dp\dn\d{7}z")


def _produce(
    master: Appliance, topic: str, cycle: int, number: int, stop: threading.Event, acked: set[str]
) -> None:
    """Send until `stop`; add the key of every SEND_OK answer to `acked`."""
    group = unique_name("PG").replace("-", "_")
    try:
        producer = Producer(group, master.namesrv_address, send_timeout_ms=1000, retry_times=0)
        producer.start()
    except Exception:
        return
    try:
        count = 0
        while not stop.is_set():
            key = f"c{cycle:02d}p{number}n{count:07d}z"
            count += 1
            try:
                result = producer.send(topic, key.encode() * 3, keys=key)
            except Exception:
                continue
            if result.status is SendStatus.SEND_OK:
                acked.add(key)
    finally:
        producer.shutdown()


def _slave_keys(slave: Appliance) -> set[bytes]:
    end_bytes = write_offset(slave)
    return set(KEY_PATTERN.findall(commit_log_bytes(slave.home, end_bytes)))


def _kill_during_load(master: Appliance, cycle: int, rng: random.Random) -> set[str]:
    topic = unique_name("hakill")
    create_topic(master, topic, 4)
    stop = threading.Event()
    acked: set[str] = set()
    threads = [
        threading.Thread(target=_produce, args=(master, topic, cycle, number, stop, acked))
        for number in range(PRODUCER_COUNT)
    ]
    for thread in threads:
        thread.start()
    time.sleep(rng.uniform(0.3, 2.5))
    master.kill()
    stop.set()
    for thread in threads:
        thread.join(30)
    return acked


def test_sync_master_kills_lose_no_acknowledged_message(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    rng = random.Random(14)
    total_acked = 0
    for cycle in range(SYNC_KILL_COUNT):
        home = tmp_path / f"cycle{cycle}"
        with (
            running_appliance(home / "master", reap_pids, master_conf()) as master,
            running_slave(home / "slave", reap_pids, master) as slave,
        ):
            wait_state(slave, "state", "connected")
            acked = _kill_during_load(master, cycle, rng)
            shutil.rmtree(master.home / "store")  # only the slave has the data now
            on_slave = _slave_keys(slave)
            missing = sorted(key for key in acked if key.encode() not in on_slave)
            assert not missing, f"kill {cycle}: {len(missing)} acked keys lost: {missing[:5]}"
            total_acked += len(acked)
    assert total_acked > SYNC_KILL_COUNT  # the load really ran


def test_async_master_kill_leaves_the_slave_identical_up_to_its_report(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    rng = random.Random(41)
    for cycle in range(ASYNC_KILL_COUNT):
        home = tmp_path / f"cycle{cycle}"
        conf = master_conf("ASYNC_MASTER")
        with (
            running_appliance(home / "master", reap_pids, conf) as master,
            running_slave(home / "slave", reap_pids, master) as slave,
        ):
            wait_state(slave, "state", "connected")
            _kill_during_load(master, cycle, rng)
            positions = StorePositions.attach(store_positions_name(slave.instance))
            reported = positions.replication().acked_log_offset_bytes
            positions.close()
            assert reported > 0
            # SIGKILL leaves the master's page cache: its files hold what it had written.
            ours = commit_log_bytes(slave.home, reported)
            assert ours == commit_log_bytes(master.home, reported)
