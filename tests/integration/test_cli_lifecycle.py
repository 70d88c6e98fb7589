"""Goal: `mqbox start`, `status` and `stop` run the appliance as a user sees it: start in the
background or the foreground, print the addresses, list every process with its memory, stop on
`mqbox stop` or Ctrl-C with nothing left behind, and refuse a second start on one home, a busy
port and an unwritable home with one clear line and nothing running.

Method: the real `mqbox` console script in subprocesses (cwd = the checkout), a fresh home under
tmp_path, port 0 for both servers, the real name server. The broker's roles are the trivial ones
of tests/support/roles.py (ROLE_ARGS below) until the real role modules exist; then the
coordinator sets ROLE_ARGS to () and these tests run the real broker unchanged. Every process is
found by pid (the run files, the ready report) and killed in the end (reap_pids).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from mqbox.ipc import names
from mqbox.server.home import HomeLayout, read_state, recorded_processes
from tests.support.cli import foreground_mqbox, run_mqbox

pytestmark = pytest.mark.integration

# Empty: these tests start the real broker (every role of topology.broker_topology).
ROLE_ARGS: tuple[str, ...] = ()
# The first start on a machine compiles every kernel; later ones load numba's cache.
START_TIMEOUT_S = 300.0
MEMORY_BUDGET_BYTES = 500 << 20
STARTING = "mqbox: starting mqbox in "


def mqbox(*arguments: str, timeout_s: float = START_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return run_mqbox(*arguments, timeout_s=timeout_s)


def appliance_pids(home: Path) -> list[int]:
    """Every pid the run files of `home` name."""
    state = read_state(home) or {}
    return [pid for _, pid, _ in recorded_processes(state)]


def processes_mentioning(home: Path) -> list[psutil.Process]:
    """Processes whose command line names `home` (the supervisor and the name server do)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        with_home = any(str(home) in part for part in process.info["cmdline"] or ())
        if with_home and process.pid != os.getpid():
            found.append(process)
    return found


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


def one_line(text: str) -> str:
    # A start on a cold numba cache first says it compiles (cli._starting_notice): not an error.
    lines = [line for line in text.strip().splitlines() if not line.startswith(STARTING)]
    assert len(lines) == 1, text
    return lines[0]


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def cleanup(home: Path, reap_pids: list[int]) -> Iterator[None]:
    """Whatever a test leaves running in `home`: stopped, then killed by pid."""
    yield
    reap_pids.extend(appliance_pids(home))
    reap_pids.extend(process.pid for process in processes_mentioning(home))
    if HomeLayout(home).pid_path.exists():
        mqbox("stop", "--home", str(home), "--timeout-s", "20")


def start_daemon(home: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return mqbox(
        "start",
        "--daemon",
        "--home",
        str(home),
        "--namesrv-port",
        "0",
        "--broker-port",
        "0",
        *ROLE_ARGS,
        *extra,
    )


def address_of(label: str, stdout: str) -> tuple[str, int]:
    match = re.search(rf"^{label}\s+(?:\S+\s+)?(\d+\.\d+\.\d+\.\d+):(\d+)$", stdout, re.MULTILINE)
    assert match is not None, stdout
    return match[1], int(match[2])


@pytest.mark.usefixtures("cleanup")
def test_daemon_start_status_stop(home: Path) -> None:
    started = start_daemon(home)
    assert started.returncode == 0, started.stderr
    namesrv_host, namesrv_port = address_of("namesrv", started.stdout)
    broker_host, broker_port = address_of("broker", started.stdout)
    for host, port in ((namesrv_host, namesrv_port), (broker_host, broker_port)):
        with socket.create_connection((host, port), timeout=5):
            pass
    pids = appliance_pids(home)

    status = mqbox("status", "--home", str(home), "--json", timeout_s=60)
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["running"]
    assert report["broker"] == f"{broker_host}:{broker_port}"
    assert report["namesrv"] == f"{namesrv_host}:{namesrv_port}"
    by_name = {process["name"]: process for process in report["processes"]}
    assert {"supervisor", "namesrv"} <= set(by_name)
    assert len(by_name) == len(pids)
    for process in by_name.values():
        assert process["pid"] in pids
        assert process["pss_anon_bytes"] > 0
        assert process["rss_bytes"] >= process["pss_anon_bytes"]
        assert process["uptime_s"] >= 0
    assert by_name["namesrv"]["port"] == namesrv_port
    assert report["store_root"].startswith(str(home))
    assert report["store_size_bytes"] >= 0
    assert report["pss_bytes"] <= MEMORY_BUDGET_BYTES

    table = mqbox("status", "--home", str(home), timeout_s=60)
    assert table.returncode == 0, table.stderr
    for name in by_name:
        assert name in table.stdout

    stopped = mqbox("stop", "--home", str(home), timeout_s=120)
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped" in stopped.stdout
    wait_until(lambda: gone(pids), 10, "every process to be gone")
    assert names.instance_paths(report["instance"]) == []
    assert not HomeLayout(home).pid_path.exists()
    after = mqbox("status", "--home", str(home), timeout_s=60)
    assert after.returncode != 0
    assert "not running" in one_line(after.stderr)


@pytest.mark.usefixtures("cleanup")
def test_foreground_start_stops_everything_on_ctrl_c(home: Path, reap_pids: list[int]) -> None:
    command = ["start", "--home", str(home)]
    command += ["--namesrv-port", "0", "--broker-port", "0", *ROLE_ARGS]
    popen = foreground_mqbox(*command)
    reap_pids.append(popen.pid)
    try:
        assert popen.stdout is not None
        lines = [popen.stdout.readline() for _ in range(3)]
        assert lines[0].startswith("mqbox running in"), lines
        address_of("broker", "".join(lines))
        pids = appliance_pids(home)
        assert popen.pid in pids
        instance = (read_state(home) or {})["instance"]
        os.killpg(popen.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground group
        assert popen.wait(timeout=120) == 0, popen.stderr.read() if popen.stderr else ""
    finally:
        if popen.poll() is None:
            popen.kill()
            popen.wait()
        for stream in (popen.stdout, popen.stderr):
            if stream is not None:
                stream.close()
    wait_until(lambda: gone(pids), 10, "every process to be gone")
    assert names.instance_paths(instance) == []
    assert processes_mentioning(home) == []


@pytest.mark.usefixtures("cleanup")
def test_second_start_on_one_home_fails_with_one_line(home: Path) -> None:
    first = start_daemon(home)
    assert first.returncode == 0, first.stderr
    pids = appliance_pids(home)
    second = start_daemon(home)
    assert second.returncode != 0
    assert "already running" in one_line(second.stderr)
    assert not gone(pids)
    assert mqbox("status", "--home", str(home), timeout_s=60).returncode == 0


@pytest.mark.usefixtures("cleanup")
def test_busy_broker_port_fails_with_one_line_and_nothing_running(home: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = mqbox(
            "start",
            "--daemon",
            "--home",
            str(home),
            "--namesrv-port",
            "0",
            "--broker-port",
            str(port),
            *ROLE_ARGS,
        )
    assert result.returncode != 0
    assert f"127.0.0.1:{port}" in one_line(result.stderr)
    assert processes_mentioning(home) == []
    assert not HomeLayout(home).pid_path.exists()
    assert mqbox("status", "--home", str(home), timeout_s=60).returncode != 0


def test_unwritable_home_fails_with_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    home = blocker / "home"
    result = mqbox("start", "--daemon", "--home", str(home), *ROLE_ARGS, timeout_s=60)
    assert result.returncode != 0
    assert "not a writable directory" in one_line(result.stderr)
    assert processes_mentioning(home) == []


def test_stop_and_status_without_an_appliance_fail_with_one_line(home: Path) -> None:
    for command in ("stop", "status"):
        result = mqbox(command, "--home", str(home), timeout_s=60)
        assert result.returncode != 0
        assert "not running" in one_line(result.stderr)


@pytest.mark.crash
@pytest.mark.usefixtures("cleanup")
def test_sigkilled_supervisor_takes_its_roles_along_and_stop_cleans_up(home: Path) -> None:
    started = start_daemon(home)
    assert started.returncode == 0, started.stderr
    pids = appliance_pids(home)
    instance = (read_state(home) or {})["instance"]
    os.kill(int(HomeLayout(home).pid_path.read_text()), signal.SIGKILL)
    # Every role and the name server get SIGTERM from Linux when their parent dies.
    wait_until(lambda: gone(pids), 30, "the orphans to stop")
    assert names.instance_paths(instance) != []
    result = mqbox("stop", "--home", str(home), timeout_s=60)
    assert result.returncode != 0
    assert "removed" in one_line(result.stderr)
    assert names.instance_paths(instance) == []
    again = start_daemon(home)
    assert again.returncode == 0, again.stderr
