"""A real layout for a test: `mqbox start --daemon --layout DIR` through the console script, every
port 0, in a home of the test's own.

Owns: starting a layout through tests/support/cli.py and parsing what the start
printed (`RunningLayout`), every PID the layout's run files name (its name server and, per
broker, the supervisor and its roles), the way out: `mqbox stop`, then SIGKILL by PID of
whatever is still alive (appliance.sigkill_pids); and, for the 2m-2s example, waiting for its
slaves to connect and creating a topic on its masters with `mqbox topic create`. Never: fixed
ports.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from mqbox.server.home import (
    BROKERS_DIR_NAME,
    HomeLayout,
    read_layout_state,
    read_replication,
    read_state,
    recorded_processes,
)
from tests.support.appliance import sigkill_pids
from tests.support.cli import REPO_ROOT, run_mqbox
from tests.support.waiting import wait_until

EXAMPLE_2M_2S: Final = REPO_ROOT / "etc" / "examples" / "2m-2s"
START_TIMEOUT_S: Final = 600.0  # four supervisors warm up at once on a small machine
COMMAND_TIMEOUT_S: Final = 120.0
SLAVES_2M_2S: Final = ("broker-a-s", "broker-b-s")


def mqbox(
    *arguments: str, timeout_s: float = COMMAND_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """The `mqbox` console script with `arguments`, its output captured."""
    return run_mqbox(*arguments, timeout_s=timeout_s)


@dataclasses.dataclass(frozen=True)
class RunningLayout:
    home: Path
    namesrv: str  # ip:port
    brokers: dict[str, str]  # member name (broker-a, broker-a-s, ...) -> ip:port

    def broker_home(self, name: str) -> Path:
        return HomeLayout(self.home).broker_home(name)


def layout_pids(home: Path) -> list[int]:
    """Every PID the run files of a layout home name: the name server, each broker's processes."""
    state = read_layout_state(home) or {}
    pids = [int((state.get("namesrv") or {}).get("pid") or 0)]
    for broker in state.get("brokers") or []:
        broker_state = read_state(HomeLayout(home).broker_home(str(broker["name"]))) or {}
        pids.extend(pid for _, pid, _ in recorded_processes(broker_state))
    return [pid for pid in pids if pid]


def parse_started(home: Path, stdout: str) -> RunningLayout:
    """What `mqbox start --layout` printed: the name server and one line per broker."""
    namesrv = re.search(r"^namesrv (\S+:\d+) ", stdout, re.MULTILINE)
    assert namesrv is not None, stdout
    brokers = dict(re.findall(r"^broker  (\S+) (\S+:\d+) ", stdout, re.MULTILINE))
    return RunningLayout(home, namesrv[1], brokers)


@contextlib.contextmanager
def running_layout(home: Path, layout: Path = EXAMPLE_2M_2S) -> Iterator[RunningLayout]:
    """Start `layout` in `home` (every port 0) and yield it; on the way out `mqbox stop`, then
    SIGKILL of every PID its run files named at any point."""
    seen: set[int] = set()
    try:
        started = mqbox(
            "start",
            "--daemon",
            "--home",
            str(home),
            "--layout",
            str(layout),
            "--namesrv-port",
            "0",
            "--broker-port",
            "0",
            timeout_s=START_TIMEOUT_S,
        )
        seen.update(layout_pids(home))
        assert started.returncode == 0, started.stderr
        yield parse_started(home, started.stdout)
    finally:
        seen.update(layout_pids(home))
        if read_layout_state(home) is not None:
            mqbox("stop", "--home", str(home), "--timeout-s", "30")
        sigkill_pids(sorted(seen))
        remove_stores(home)


def remove_stores(home: Path) -> None:
    """Delete every broker's store under a stopped layout's home. The example's brokers map
    1 GiB CommitLog segments and 400 MiB index files, about 6 GiB a run; pytest keeps the last
    three runs' temporary directories, and every test's disk-full refusal (90 % of the disk)
    reads the one disk they all share."""
    for store in sorted((home / BROKERS_DIR_NAME).glob("*/store")):
        shutil.rmtree(store, ignore_errors=True)


def wait_slaves_connected(layout: RunningLayout, timeout_s: float) -> None:
    """Wait until each slave of the 2m-2s example learned its master (from a registration
    answer) and connected: a SYNC_MASTER acknowledges sends only then."""
    for slave in SLAVES_2M_2S:
        wait_until(
            functools.partial(_connected, layout.broker_home(slave)),
            f"{slave} to learn its master and connect",
            timeout_s,
        )


def _connected(home: Path) -> bool:
    return (read_replication(home) or {}).get("state") == "connected"


def create_topic_by_cli(layout: RunningLayout, topic: str, queue_count: int) -> str:
    """`mqbox topic create` with `queue_count` read and write queues on every master the
    layout's name server knows; what it printed (--json)."""
    created = mqbox(
        "topic",
        "create",
        topic,
        "--read-queues",
        str(queue_count),
        "--write-queues",
        str(queue_count),
        "--namesrv",
        layout.namesrv,
        "--json",
    )
    assert created.returncode == 0, created.stderr
    return created.stdout
