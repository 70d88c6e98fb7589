"""The master a slave learned from the name server: `run/master.json` in the broker's home.

Owns: that file's name, its one writer (the services role, after each registration whose answer
carries the master's haServerAddr, as RocketMQ's BrokerController.registerBrokerAll hands it to
HAClient.updateMasterAddress) and its reader (the HA client, when haMasterAddress is empty).
Never: the configured haMasterAddress, which wins whenever it is set (docs/replication.md).

A file left by an earlier run of the broker may name a master that has moved, and its old port
may by now be another broker's HA port. So the file records the supervisor's pid (both roles are
forked by it: `os.getppid()`), and the reader ignores a file written under another supervisor.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Final

from mqbox.clock import wall_clock_ms
from mqbox.config import is_host_port
from mqbox.run_files import read_json, write_json_atomically
from mqbox.server.home import HomeLayout

MASTER_FILE_NAME: Final = "master.json"


def master_path(home: Path) -> Path:
    return HomeLayout(home).run_dir / MASTER_FILE_NAME


def record_master(home: Path, ha_server_addr: str | None, master_addr: str | None) -> bool:
    """Write what a registration answer said, if it names a master and differs from the file;
    True when the file changed. An answer without a master (none registered now) keeps the file,
    as RocketMQ keeps the last address: the slave goes on trying it until a new one comes."""
    if not ha_server_addr or not is_host_port(ha_server_addr):
        return False
    supervisor_pid = os.getppid()
    path = master_path(home)
    known = read_json(path) or {}
    if known.get("ha_server_addr") == ha_server_addr and known.get("supervisor_pid") == (
        supervisor_pid
    ):
        return False
    document = {
        "ha_server_addr": ha_server_addr,
        "master_addr": master_addr or "",
        "supervisor_pid": supervisor_pid,
        "learned_at_ms": wall_clock_ms(),
    }
    with contextlib.suppress(OSError):
        write_json_atomically(path, document)
        return True
    return False


def learned_master(home: Path) -> str:
    """The master's HA address this run learned; "" when none yet (or the file is stale)."""
    document = read_json(master_path(home)) or {}
    if document.get("supervisor_pid") != os.getppid():
        return ""
    address = document.get("ha_server_addr")
    return address if isinstance(address, str) and is_host_port(address) else ""
