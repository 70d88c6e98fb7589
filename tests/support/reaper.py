"""The session's reaper: no process a test started outlives the pytest process that ran the test,
whether the session ends, or that process is SIGKILLed, SIGTERMed or timed out mid-test.

Owns: the session mark, an environment variable `MQBOX_TEST_SESSION=<worker>-<pid>-<random>`
set in this process's environment for the whole session, so every process a test starts through
a new program inherits it (subprocess passes os.environ on: supervisors, whose forked roles keep
it, name servers, `mqbox start --daemon` and everything it detaches, nats-server, redis-server,
C++ client children); the watchdog, a small process in a session of its own that waits on a
pidfd of the pytest process and, when that ends, SIGKILLs by PID every process whose
/proc/PID/environ carries the mark; and the same kill at the session's end, plus the pytest
process's own remaining descendants (children it forked without a new program carry no mark
in /proc). Both sweep the shared memory of the mqbox instances the killed processes had mapped.
Never: a process of another session (another mark) or of another user, nor the caller itself;
signals to a process group or by name.

Why a mark and not PR_SET_PDEATHSIG in each starter: `mqbox start --daemon` and layouts detach
their supervisors and name servers on purpose (the starting CLI exits), so no parent is left
whose death could signal them; the mark finds them wherever they were reparented, and needs no
change in any starter. The roles of a supervisor already die with it (runtime.py sets their
parent-death signal, as the supervisor does for its name server); what a SIGKILLed pytest left
behind was the supervisor itself, in a session of its own. A program that overwrites its
environment area cannot be found by the mark (redis-server writes its process title there), so
its starter gives it a parent-death signal instead (bench/_peers.py `die_with_this_process`).

`python -m tests.support.reaper --pid P --start-ticks T --mark M` is the watchdog.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

import psutil

from mqbox.errors import ConfigError
from mqbox.ipc import names
from mqbox.resources import process_stat_fields

MARK_ENV: Final = "MQBOX_TEST_SESSION"
REPO_ROOT: Final = Path(__file__).resolve().parents[2]
KILL_TIMEOUT_S: Final = 30.0
KILL_ROUND_COUNT_MAX: Final = 10  # a supervisor may fork a role between a look and the kill
WATCHDOG_STOP_TIMEOUT_S: Final = 10.0


def marked(mark: str) -> list[psutil.Process]:
    """Every live process but this one whose environment (as its program started) holds `mark`.
    A zombie shows no environment, so it is not listed."""
    wanted = f"{MARK_ENV}={mark}".encode()
    own_pid = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == own_pid:
            continue
        try:
            process = psutil.Process(int(entry.name))  # first: kill() refuses a later PID reuse
            environ = (entry / "environ").read_bytes()
        except (OSError, psutil.Error):
            continue  # gone, or another user's
        if wanted in environ.split(b"\0"):
            found.append(process)
    return found


def mapped_instances(pid: int) -> set[str]:
    """The mqbox instances whose shared-memory segments process `pid` maps."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    instances = set()
    prefix = f"{names.SHM_DIRECTORY}/"
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not fields[5].startswith(prefix):
            continue
        file_name = fields[5].removeprefix(prefix).removesuffix(" (deleted)")
        with contextlib.suppress(ConfigError):
            instances.add(names.parse_shm_name(f"/{file_name}").instance)
    return instances


def kill_all(processes: Sequence[psutil.Process], timeout_s: float) -> list[int]:
    """SIGKILL each of `processes` still alive, wait until they are gone, then sweep the shared
    memory of the mqbox instances they mapped (read before the kill); the PIDs signalled."""
    killed: list[psutil.Process] = []
    instances: set[str] = set()
    for process in processes:
        instances |= mapped_instances(process.pid)
        with contextlib.suppress(psutil.Error):
            process.kill()
            killed.append(process)
    psutil.wait_procs(killed, timeout=timeout_s)
    for instance in sorted(instances):
        names.unlink_instance(instance)
    return [process.pid for process in killed]


def kill_marked(mark: str, timeout_s: float = KILL_TIMEOUT_S) -> list[int]:
    """kill_all of every process carrying `mark`, until a look finds none; the PIDs killed."""
    deadline = time.monotonic() + timeout_s
    killed: list[int] = []
    for _ in range(KILL_ROUND_COUNT_MAX):
        found = marked(mark)
        if not found:
            break
        killed += kill_all(found, max(0.1, deadline - time.monotonic()))
    return killed


def start_ticks(pid: int) -> int:
    """When process `pid` started, in clock ticks since boot (/proc/PID/stat field 22): with
    the PID, it names one process for good. ProcessLookupError if there is none."""
    fields = process_stat_fields(pid)
    if fields is None:
        raise ProcessLookupError(pid)
    return int(fields[19])


def watch(pid: int, ticks: int, mark: str) -> list[int]:
    """The watchdog: wait until process `pid` (started at `ticks`, so not a later process with
    its PID) has ended, then kill_marked(mark)."""
    for quiet in (signal.SIGINT, signal.SIGHUP):
        signal.signal(quiet, signal.SIG_IGN)  # a Ctrl-C for the tests must not end the watch
    with contextlib.suppress(ProcessLookupError):
        pidfd = os.pidfd_open(pid)
        try:
            # The pidfd names the process that had `pid` when it was opened: if that is the one
            # started at `ticks`, the pidfd becomes readable when it ends.
            if start_ticks(pid) == ticks:
                select.select([pidfd], [], [])
        finally:
            os.close(pidfd)
    return kill_marked(mark)


@contextlib.contextmanager
def session_reaper() -> Iterator[str]:
    """Mark this process's environment for the block (yielding the mark) and start the
    watchdog; at the end kill every marked process and this process's remaining descendants,
    then stop the watchdog. `tests/conftest.py` wraps the whole session in it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    mark = f"{worker}-{os.getpid()}-{secrets.token_hex(4)}"
    me = psutil.Process()
    path = os.environ.get("PYTHONPATH", "")
    command = ["--pid", str(me.pid), "--start-ticks", str(start_ticks(me.pid)), "--mark", mark]
    watchdog = subprocess.Popen(
        [sys.executable, "-m", "tests.support.reaper", *command],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), path]))},
        start_new_session=True,  # a signal to the tests' process group does not reach it
    )
    previous = os.environ.get(MARK_ENV)
    os.environ[MARK_ENV] = mark
    try:
        yield mark
    finally:
        if previous is None:
            del os.environ[MARK_ENV]
        else:
            os.environ[MARK_ENV] = previous
        kill_marked(mark)
        descendants = [child for child in me.children(recursive=True) if child.pid != watchdog.pid]
        kill_all(descendants, KILL_TIMEOUT_S)
        watchdog.terminate()
        watchdog.wait(WATCHDOG_STOP_TIMEOUT_S)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.reaper")
    parser.add_argument("--pid", type=int, required=True, help="the pytest process to watch")
    parser.add_argument("--start-ticks", type=int, required=True, help="its start (start_ticks)")
    parser.add_argument("--mark", required=True, help=f"the value of {MARK_ENV} to kill")
    arguments = parser.parse_args(list(argv))
    watch(arguments.pid, arguments.start_ticks, arguments.mark)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
