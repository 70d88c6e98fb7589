"""A master and its slave as two real appliances, and what the replication tests compare.

Owns: the configurations of a master (haListenPort = its bound port + 1) and of its slave
(brokerRole=SLAVE, haMasterAddress = the master's HA address, the master's name server), the
reading of a store's commit-log bytes straight from its files, and the waits on the slave's
reported position (run/replication.json, written by its HA role). Never: mocks or timed
assertions; every wait ends in an assertion that names what it waited for.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from mqbox.server.home import read_replication
from mqbox.server.queue_counters import StorePositions, store_positions_name
from tests.support.appliance import BROKER_CONF, Appliance, running_appliance

WAIT_S: Final = 60.0
POLL_S: Final = 0.05


def master_conf(role: str = "SYNC_MASTER", extra: str = "") -> str:
    return BROKER_CONF + f"brokerRole={role}\n" + extra


def slave_conf(master: Appliance, extra: str = "") -> str:
    return (
        BROKER_CONF
        + "brokerRole=SLAVE\nbrokerId=1\n"
        + f"haMasterAddress={master.ha_address}\n"
        + "mqboxHaReconnectIntervalMs=100\n"
        + extra
    )


@contextlib.contextmanager
def running_slave(
    home: Path, reap_pids: list[int], master: Appliance, extra: str = ""
) -> Iterator[Appliance]:
    """A slave of `master`, registered with the master's name server."""
    with running_appliance(
        home, reap_pids, slave_conf(master, extra), namesrv_address=master.namesrv_address
    ) as slave:
        yield slave


def replication_state(appliance: Appliance) -> dict[str, Any]:
    return read_replication(appliance.home) or {}


def commit_log_bytes(home: Path, end_log_offset_bytes: int, broker_name: str = "broker-a") -> bytes:
    """The commit log of the store in `home` below `end_log_offset_bytes`, read from its files
    (segments are named by their start offset; missing bytes read as nothing)."""
    directory = home / "store" / broker_name / "commitlog"
    chunks: list[bytes] = []
    for path in sorted(directory.iterdir()):
        if not path.name.isdigit():
            continue
        start = int(path.name)
        if start >= end_log_offset_bytes:
            break
        with path.open("rb") as file:
            chunks.append(file.read(end_log_offset_bytes - start))
    return b"".join(chunks)


def wait_slave_reported(slave: Appliance, at_least_bytes: int, timeout_s: float = WAIT_S) -> int:
    """Wait until the slave reported at least `at_least_bytes`; its reported offset."""
    deadline = time.monotonic() + timeout_s
    positions = StorePositions.attach(store_positions_name(slave.instance))
    try:
        while time.monotonic() < deadline:
            reported = positions.replication().acked_log_offset_bytes
            if reported >= at_least_bytes:
                return reported
            time.sleep(POLL_S)
        view = positions.replication()
    finally:
        positions.close()
    raise AssertionError(f"slave did not report {at_least_bytes} within {timeout_s} s: {view}")


def wait_state(appliance: Appliance, key: str, value: object, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    state: dict[str, Any] = {}
    while time.monotonic() < deadline:
        state = replication_state(appliance)
        if state.get(key) == value:
            return
        time.sleep(POLL_S)
    raise AssertionError(f"replication state {key} != {value!r} after {timeout_s} s: {state}")


def write_offset(appliance: Appliance) -> int:
    """The store writer's published write position (store-positions in shared memory)."""
    positions = StorePositions.attach(store_positions_name(appliance.instance))
    try:
        return positions.write_log_offset_bytes
    finally:
        positions.close()
