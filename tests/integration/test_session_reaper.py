"""Goal: a pytest process killed in the middle of a test (SIGKILL, as a timeout or a crashed xdist
worker ends it, with no fixture teardown) leaves nothing running: the servers its tests started
(a supervisor with its roles and name server, a detached `mqbox start --daemon`, the benches'
nats-server and redis-server) are killed by the session's reaper (tests/support/reaper.py), and
the shared memory of the mqbox instances among them is swept.

Method: tests/support/reaped_child.py stands in for the pytest process: it enters
`session_reaper()` as conftest.py does, starts the servers the way the tests and benches do,
prints their PIDs and waits. The test SIGKILLs it, then polls until every one of those processes
(each remembered with its start time, so a reused PID does not count) and the reaper's watchdog
are gone and no segment of the instances is left in /dev/shm, within a generous bound. Whatever
is left is killed by PID at the end (`reap_pids`).
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final

import psutil
import pytest

from mqbox.ipc import names
from tests.support.cli import REPO_ROOT, environment

pytestmark = [pytest.mark.integration, pytest.mark.crash]

START_TIMEOUT_S: Final = 600.0  # a first start on a machine compiles every kernel
GONE_TIMEOUT_S: Final = 60.0


def read_report(child: subprocess.Popen[bytes], timeout_s: float) -> dict[str, Any]:
    """The child's one JSON line; AssertionError if it exits or stays silent past `timeout_s`."""
    assert child.stdout is not None
    deadline = time.monotonic() + timeout_s
    while True:
        readable, _, _ = select.select([child.stdout], [], [], 1.0)
        if readable:
            line = child.stdout.readline()
            assert line, f"the child exited with {child.wait()} before it reported"
            report: dict[str, Any] = json.loads(line)
            return report
        assert child.poll() is None, f"the child exited with {child.returncode}"
        assert time.monotonic() < deadline, "the child did not report in time"


def alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Those of `processes` still running (a zombie has ended)."""
    running = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                running.append(process)
        except psutil.NoSuchProcess:
            continue
    return running


@pytest.mark.parametrize("kind", ["appliance", "daemon", "peers"])
def test_what_a_killed_pytest_process_started_dies_with_it(
    kind: str, tmp_path: Path, reap_pids: list[int]
) -> None:
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.support.reaped_child", kind, str(tmp_path / "home")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        cwd=REPO_ROOT,
        env=environment(),
    )
    reap_pids.append(child.pid)
    instances: list[str] = []
    try:
        report = read_report(child, START_TIMEOUT_S)
        instances = list(report["instances"])
        reap_pids.extend(report["pids"])
        started = [psutil.Process(pid) for pid in report["pids"]]
        watchdogs = [
            process
            for process in psutil.Process(child.pid).children()
            if "tests.support.reaper" in process.cmdline()
        ]
        assert len(watchdogs) == 1, watchdogs
        reap_pids.append(watchdogs[0].pid)
        assert len(started) >= 2, report
        assert alive(started) == started, report
        for instance in instances:
            assert names.instance_paths(instance), instance

        child.kill()
        child.wait()

        deadline = time.monotonic() + GONE_TIMEOUT_S
        while alive([*started, *watchdogs]) or any(map(names.instance_paths, instances)):
            left = [process.pid for process in alive([*started, *watchdogs])]
            assert time.monotonic() < deadline, f"still running: {left}; instances {instances}"
            time.sleep(0.2)
    finally:
        if child.stdout is not None:
            child.stdout.close()
        for instance in instances:
            names.unlink_instance(instance)
