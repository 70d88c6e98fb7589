"""The appliance's home directory: where its files are, its lock, and its run files.

Owns: the layout under --home (`run/`, `logs/`, `store/`), the shared-memory instance name of a
broker in a home, the home's lock (flock on `run/lock`: one appliance or store repair at a
time), and reading and writing the run files the supervisor keeps for `mqbox status` and
`mqbox stop` (`run/state.json`, `run/last-stop.json`, the pid file; `run/http.json` is the
services role's), plus recognising the processes a state file lists. Never: starts or stops
anything (supervisor.py, admin/ops.py), or touches the store's files (store_root_of only names
the directory).

A layout home (`mqbox start --layout`, admin/layout_ops.py) is a home whose `run/` holds the
name server's files and `run/layout.json` (what runs: the layout file, the name server, the
brokers), and whose `brokers/<NAME>/` are ordinary single-broker homes, one per broker of the
layout (NAME is config.member_name: broker-a, broker-a-s, ...). The name server process holds the
layout home's lock (it inherits the descriptor), so nothing else starts in that home while it
runs; each broker's supervisor holds its own sub-home's lock.

`run/replication.json` of a broker's home is where replication reports itself: the HA roles
write it, `mqbox status` and the MQBOX_BROKER_STATUS answer (`mqbox cluster list`) read it
(HaState); with no such file both say "n/a".

mqbox/admin imports this module without the supervisor, so `mqbox status` loads neither numpy
nor numba.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import psutil

from mqbox.config import BrokerConfig
from mqbox.errors import ConfigError, MqboxError
from mqbox.run_files import read_json
from mqbox.store.layout import DIRECTORY_MODE, FILE_MODE

RUN_DIR_NAME: Final = "run"
LOGS_DIR_NAME: Final = "logs"
STORE_DIR_NAME: Final = "store"
LOCK_FILE_NAME: Final = "lock"
PID_FILE_NAME: Final = "mqbox.pid"
STATE_FILE_NAME: Final = "state.json"
LAST_STOP_FILE_NAME: Final = "last-stop.json"  # why the last run stopped after a failure
REPLICATION_FILE_NAME: Final = "replication.json"
NAMESRV_READY_FILE_NAME: Final = "namesrv.ready"
NAMESRV_OUTPUT_FILE_NAME: Final = "namesrv.out"
SUPERVISOR_LOG_FILE_NAME: Final = "supervisor.log"
RUN_CONFIG_FILE_NAME: Final = "config.json"  # the configuration the running appliance uses
HTTP_FILE_NAME: Final = "http.json"  # the services role's bound HTTP endpoint (server/web/)
STATE_VERSION: Final = 1
LAYOUT_STATE_FILE_NAME: Final = "layout.json"  # a layout home's: what `--layout` started
BROKERS_DIR_NAME: Final = "brokers"  # a layout home's: one single-broker home per broker


@dataclasses.dataclass(frozen=True, slots=True)
class HomeLayout:
    """Where the appliance keeps its files under --home."""

    home: Path

    @property
    def run_dir(self) -> Path:
        return self.home / RUN_DIR_NAME

    @property
    def logs_dir(self) -> Path:
        return self.home / LOGS_DIR_NAME

    @property
    def store_dir(self) -> Path:
        return self.home / STORE_DIR_NAME

    @property
    def lock_path(self) -> Path:
        return self.run_dir / LOCK_FILE_NAME

    @property
    def pid_path(self) -> Path:
        return self.run_dir / PID_FILE_NAME

    @property
    def state_path(self) -> Path:
        return self.run_dir / STATE_FILE_NAME

    @property
    def last_stop_path(self) -> Path:
        return self.run_dir / LAST_STOP_FILE_NAME

    @property
    def run_config_path(self) -> Path:
        return self.run_dir / RUN_CONFIG_FILE_NAME

    @property
    def http_path(self) -> Path:
        return self.run_dir / HTTP_FILE_NAME

    @property
    def layout_state_path(self) -> Path:
        return self.run_dir / LAYOUT_STATE_FILE_NAME

    def broker_home(self, member_name: str) -> Path:
        """The home of one broker of a layout started in this home."""
        return self.home / BROKERS_DIR_NAME / member_name

    @property
    def replication_path(self) -> Path:
        """The HA role's state (roles/ha_service.py, roles/ha_client.py; `mqbox status`)."""
        return self.run_dir / REPLICATION_FILE_NAME


@dataclasses.dataclass(frozen=True, slots=True)
class HaState:
    """A broker's replication as `mqbox status` and `mqbox cluster list` show it, read from the
    HA role's `run/replication.json` (docs/replication.md, "What shows it").

    A master's state is "serving" (a slave is connected) or "no-slave"; its lag is how far the
    acknowledged offset (the greatest any slave reported this run, as RocketMQ's
    slaveFallBehindMuch) is behind its write position, in bytes and in the records between
    them, counted by its HA role; it stays shown while the slave is away, and is "n/a" (None)
    until a slave first reported. A slave's state is its connection's ("connecting",
    "connected", "diverged") and its lag the bytes between the master's offset it last received
    and what it reported, and the whole records among them."""

    state: str  # "n/a" with no file
    slave_lag_bytes: int | None
    slave_lag_messages: int | None

    @classmethod
    def of(cls, document: Mapping[str, Any] | None) -> HaState:
        """The state a replication.json holds; every field "n/a" (None) without one."""
        document = document or {}

        def count(key: str) -> int | None:
            value = document.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        role = document.get("role")
        if role == "master":
            acked, written = count("acked_log_offset"), count("write_log_offset")
            slaves = bool(document.get("slaves"))
            serving = "serving" if slaves else "no-slave"
            if not (slaves or document.get("slave_reported")):
                return cls(serving, None, None)
            lag = None if acked is None or written is None else max(0, written - acked)
            return cls(serving, lag, count("slave_lag_messages"))
        if role == "slave":
            state = document.get("state")
            reported, master = count("reported_log_offset"), count("master_log_offset")
            lag = None if reported is None or not master else max(0, master - reported)
            messages = count("slave_lag_messages") if lag is not None else None
            return cls(state if isinstance(state, str) and state else "n/a", lag, messages)
        return cls("n/a", None, None)


def read_ha_state(home: Path) -> HaState:
    """The replication state of the broker whose home is `home` ("n/a" without a report)."""
    return HaState.of(read_json(HomeLayout(home).replication_path))


def read_layout_state(home: Path) -> dict[str, Any] | None:
    """`run/layout.json` of a layout home, or None if no layout was started there."""
    return read_json(HomeLayout(home).layout_state_path)


def prepare_home(home: Path) -> HomeLayout:
    """Create home, logs/, run/ and store/ and check they are writable; ConfigError if not."""
    layout = HomeLayout(home)
    try:
        for directory in (layout.home, layout.run_dir, layout.logs_dir, layout.store_dir):
            directory.mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)
        probe = layout.run_dir / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        reason = error.strerror or str(error)
        raise ConfigError(f"home {home} is not a writable directory: {reason}") from None
    return layout


def instance_name(home: Path, broker_name: str) -> str:
    """The shared-memory instance of a broker in a home: a short hash of both, so it is stable
    across restarts (the sweep finds what a dead run left) and distinct between homes."""
    digest = hashlib.sha256(f"{home.resolve()}\0{broker_name}".encode()).hexdigest()
    return f"b{digest[:12]}"


def store_root_of(home: Path, broker: BrokerConfig) -> Path:
    """storePathRootDir, else <home>/store/<brokerName>."""
    if broker.store_path_root_dir:
        return Path(broker.store_path_root_dir).expanduser()
    return home / STORE_DIR_NAME / broker.broker_name


def lock_home(layout: HomeLayout) -> int:
    """Take the home's lock (flock, not blocking) and return its descriptor; closing it releases
    the lock. MqboxError if an appliance (or a store repair) holds it."""
    fd = os.open(layout.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        holder = ""
        with contextlib.suppress(OSError, ValueError):
            holder = f" (supervisor pid {int(layout.pid_path.read_text().strip())})"
        raise MqboxError(
            f"already running in {layout.home}{holder}; `mqbox stop --home {layout.home}` stops it"
        ) from None
    return fd


def read_state(home: Path) -> dict[str, Any] | None:
    """The last `run/state.json` of `home`, or None if there is none (or it is unreadable)."""
    return read_json(HomeLayout(home).state_path)


def read_replication(home: Path) -> dict[str, Any] | None:
    """The HA role's last published state, or None (no HA role has written one)."""
    return read_json(HomeLayout(home).replication_path)


def read_last_stop(home: Path) -> dict[str, Any] | None:
    """`run/last-stop.json` of `home`: why its last run stopped after a failure ("reason",
    "stopped_at_ms", "exit_status"); None if it stopped cleanly or runs."""
    return read_json(HomeLayout(home).last_stop_path)


def read_http(home: Path) -> dict[str, Any] | None:
    """`run/http.json` of `home`: the HTTP endpoint's "url", "host", "port" (or "error" when
    its port could not be bound); None when the broker runs without one."""
    return read_json(HomeLayout(home).http_path)


def process_alive(pid: int, create_time: float | None) -> bool:
    """True if `pid` runs and, when `create_time` is given, is the process recorded then (a pid
    may have been reused since)."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return create_time is None or abs(process.create_time() - create_time) < 0.5
    except psutil.Error:
        return False


def recorded_processes(state: Mapping[str, Any]) -> list[tuple[str, int, float | None]]:
    """(name, pid, create_time) of every process a state document lists, supervisor first."""
    found: list[tuple[str, int, float | None]] = []
    supervisor = state.get("supervisor") or {}
    if supervisor.get("pid"):
        found.append(("supervisor", int(supervisor["pid"]), supervisor.get("create_time")))
    found.extend(
        (str(role["role_id"]), int(role["pid"]), role.get("create_time"))
        for role in state.get("roles") or []
        if role.get("pid")
    )
    namesrv = state.get("namesrv") or {}
    if namesrv.get("pid"):
        found.append(("namesrv", int(namesrv["pid"]), namesrv.get("create_time")))
    return found
