"""Starting the supervisor as a child process: the one starter of `mqbox start --daemon`, the
tests' appliances and the benches' appliances.

Owns: the command line of `python -m mqbox.server.supervisor` with a ready pipe, the environment
its zygote wants (one BLAS/OpenMP thread: it warns about native threads otherwise), reading its
one ready line within a deadline, the orderly stop (SIGTERM, SIGKILL after a timeout), and the
clean-up a caller that owns the appliance wants on the way out (`supervised`): SIGKILL by PID of
every process it started, waiting until they are gone, and the sweep of its shared memory.
Never: what the supervisor does (supervisor.py), where homes live (home.py), or policy about
what a failed start means to the caller (the CLI raises MqboxError, a test fails, a bench exits).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final

import psutil

from mqbox.ipc import names

# The appliance forks from one warm parent; a native thread pool there would only waste memory.
SINGLE_THREAD_ENVIRONMENT: Final = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
READY_LINE_SIZE_BYTES_MAX: Final = 1 << 20


class SupervisorNotReadyError(Exception):
    """The supervisor wrote no ready line: it exited (`status`), or the deadline passed (None)."""

    def __init__(self, status: int | None) -> None:
        what = "did not become ready in time" if status is None else f"exited with {status}"
        super().__init__(f"the supervisor {what}")
        self.status = status


@dataclass(slots=True)
class Started:
    """A supervisor child and the read end of its ready pipe (closed by `read_ready`)."""

    process: subprocess.Popen[bytes]
    ready_fd: int


def spawn(
    arguments: Sequence[str],
    *,
    output: IO[Any] | int | None,
    environment: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> Started:
    """Run `python -m mqbox.server.supervisor ARGUMENTS --ready-fd N` in a session of its own,
    stdout and stderr to `output`. `environment` is added to this process's, after
    SINGLE_THREAD_ENVIRONMENT."""
    read_fd, write_fd = os.pipe()
    command = [
        sys.executable,
        "-m",
        "mqbox.server.supervisor",
        *arguments,
        "--ready-fd",
        str(write_fd),
    ]
    try:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=output,
            cwd=cwd,
            env={**os.environ, **SINGLE_THREAD_ENVIRONMENT, **(environment or {})},
            pass_fds=(write_fd,),
            start_new_session=True,
            preexec_fn=preexec_fn,
        )
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    return Started(process, read_fd)


def read_ready(started: Started, timeout_s: float) -> dict[str, Any]:
    """The supervisor's ready report (its one JSON line; "ok" says whether it started). Closes the
    pipe. SupervisorNotReadyError when the pipe closes without a line or `timeout_s` passes; the
    process is left as it is (the caller stops it)."""
    deadline = time.monotonic() + timeout_s
    received = b""
    try:
        while b"\n" not in received:
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                raise SupervisorNotReadyError(None)
            readable, _, _ = select.select([started.ready_fd], [], [], min(remaining_s, 0.5))
            if not readable:
                continue
            chunk = os.read(started.ready_fd, 65536)
            if not chunk:
                raise SupervisorNotReadyError(started.process.poll())
            received += chunk
            if len(received) > READY_LINE_SIZE_BYTES_MAX:
                raise SupervisorNotReadyError(None)
    finally:
        os.close(started.ready_fd)
    report: dict[str, Any] = json.loads(received.split(b"\n", 1)[0])
    return report


def stop(process: subprocess.Popen[bytes], timeout_s: float) -> int | None:
    """The orderly stop: SIGTERM, then wait; SIGKILL after `timeout_s`. The exit status (None if
    it had to be killed)."""
    if process.poll() is not None:
        return process.returncode
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout_s)
        return None


def family_of(process: subprocess.Popen[bytes], report: Mapping[str, Any]) -> list[psutil.Process]:
    """The processes the supervisor started: its roles (the report names them) and the name
    server, each remembering its start time, so a PID reused later is never killed."""
    pids = {int(pid) for pid in report.get("roles", {}).values()}
    with contextlib.suppress(psutil.NoSuchProcess):
        pids |= {child.pid for child in psutil.Process(process.pid).children(recursive=True)}
    family = []
    for pid in sorted(pids):
        with contextlib.suppress(psutil.NoSuchProcess):
            family.append(psutil.Process(pid))
    return family


def reap(family: Sequence[psutil.Process], instance: str, timeout_s: float) -> list[int]:
    """SIGKILL every process of `family` still alive and wait until they are gone (a restart on
    the same ports must find them free); then sweep `instance`'s shared memory. The PIDs that
    had to be killed."""
    killed: list[psutil.Process] = []
    for member in family:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            if member.status() != psutil.STATUS_ZOMBIE:
                member.kill()  # psutil refuses if the PID was reused meanwhile
                killed.append(member)
    psutil.wait_procs(killed, timeout=timeout_s)
    if instance:
        names.unlink_instance(instance)
    return [member.pid for member in killed]


@contextlib.contextmanager
def supervised(
    arguments: Sequence[str],
    *,
    output: IO[Any] | int | None,
    ready_timeout_s: float,
    stop_timeout_s: float,
    environment: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    preexec_fn: Callable[[], None] | None = None,
    on_family: Callable[[Sequence[int]], None] | None = None,
) -> Iterator[tuple[subprocess.Popen[bytes], dict[str, Any]]]:
    """Start the supervisor (`spawn`), yield (process, ready report) once it is ready; on the way
    out, whatever happened: `stop`, `reap` of its family and the sweep of its shared memory.
    `on_family` gets every PID as soon as it is known (tests reap them again if all else fails).
    SupervisorNotReadyError, or AssertionError with the report when it says it did not start."""
    started = spawn(
        arguments, output=output, environment=environment, cwd=cwd, preexec_fn=preexec_fn
    )
    process = started.process
    if on_family is not None:
        on_family([process.pid])
    family: list[psutil.Process] = []
    instance = ""
    try:
        report = read_ready(started, ready_timeout_s)
        if not report.get("ok"):
            raise AssertionError(f"the supervisor did not start: {report.get('error')}")
        instance = str(report.get("instance", ""))
        family = family_of(process, report)
        if on_family is not None:
            on_family([member.pid for member in family])
        yield process, report
    finally:
        stop(process, stop_timeout_s)
        reap(family, instance, stop_timeout_s)
