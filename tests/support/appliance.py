"""The real appliance for a test: `python -m mqbox.server.supervisor` with the broker's real
topology and the real name server, both on 127.0.0.1 port 0, in a home of the test's own.

Owns: starting it (a broker.conf with small store files, a ready pipe), reading its ready line,
the orderly stop (SIGTERM, then SIGKILL), and on the way out SIGKILL by PID of the supervisor and
everything it started (waiting until they are gone), then the sweep of its shared memory. Never:
fixed ports or names, unless a test asks for its earlier ports back. A second start on the same
home recovers that home's store (the output file is appended to).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import psutil

from mqbox.ipc import names
from tests.support.front_client import FrontClient
from tests.support.namesrv_process import set_file_limit

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S: Final = 300.0  # the first start on a machine compiles every kernel
STOP_TIMEOUT_S: Final = 30.0
BROKER_CONF: Final = (
    "brokerIP1=127.0.0.1\n"
    "mapedFileSizeCommitLog=16777216\n"
    "mapedFileSizeConsumeQueue=60000\n"
    "mqboxSendProcessorCount=1\n"
    "mqboxPullProcessorCount=1\n"
)
# Retention at once (tests of deleted segments): 64 KiB commit-log segments, 64-entry consume-queue
# segments, and RocketMQ's keys set to delete a segment as soon as the writer rolled past it.
RETENTION_SEGMENT_SIZE_BYTES: Final = 64 * 1024
RETENTION_CQ_SEGMENT_ENTRY_COUNT: Final = 64
_EVERY_HOUR: Final = ";".join(f"{hour:02d}" for hour in range(24))
RETENTION_BROKER_CONF: Final = (
    "brokerIP1=127.0.0.1\n"
    f"mapedFileSizeCommitLog={RETENTION_SEGMENT_SIZE_BYTES}\n"
    f"mapedFileSizeConsumeQueue={RETENTION_CQ_SEGMENT_ENTRY_COUNT * 20}\n"
    "maxMessageSize=16384\n"
    "fileReservedTime=0\n"
    f"deleteWhen={_EVERY_HOUR}\n"
    "cleanResourceInterval=300\n"
    "flushIntervalConsumeQueue=200\n"
    "mqboxSendProcessorCount=1\n"
    "mqboxPullProcessorCount=1\n"
)


@dataclasses.dataclass
class Appliance:
    """One running supervisor (with its name server) started by `running_appliance`."""

    process: subprocess.Popen[bytes]
    home: Path
    broker_address: str
    namesrv_address: str
    instance: str
    output_path: Path
    role_pids: list[int]
    roles: dict[str, int] = dataclasses.field(default_factory=dict)  # role id -> pid

    @property
    def broker_port(self) -> int:
        return int(self.broker_address.rsplit(":", 1)[1])

    def client(self) -> FrontClient:
        """A raw protocol client of the broker."""
        return FrontClient("127.0.0.1", self.broker_port)

    def stop(self) -> int | None:
        """The orderly stop: SIGTERM, then wait; the exit status (None if it had to be killed)."""
        return stop_process(self.process)

    def kill(self) -> None:
        """SIGKILL by PID to the supervisor and every role it reported (a broker crash)."""
        for pid in (self.process.pid, *self.role_pids):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(STOP_TIMEOUT_S)

    def output(self) -> str:
        return self.output_path.read_text(encoding="utf-8", errors="replace")


@contextlib.contextmanager
def running_supervisor(
    home: Path,
    arguments: list[str],
    reap_pids: list[int],
    *,
    file_limit: tuple[int, int] | None = None,
    environment: Mapping[str, str] | None = None,
) -> Iterator[tuple[subprocess.Popen[bytes], dict[str, Any], Path]]:
    """Run `python -m mqbox.server.supervisor --home HOME ARGUMENTS --ready-fd N` and yield
    (process, its ready line, its output file) once every role is ready. On the way out: the
    orderly stop (SIGTERM, then SIGKILL after STOP_TIMEOUT_S), SIGKILL by PID of everything it
    started, and the sweep of its shared memory. Every PID is appended to `reap_pids` too.
    `file_limit` (soft, hard) is the supervisor's RLIMIT_NOFILE, set before exec; `environment`
    adds variables to the supervisor's (test hooks, runtime.py)."""
    home.mkdir(parents=True, exist_ok=True)
    read_fd, write_fd = os.pipe()
    output_path = home / "supervisor.out"
    command = [
        sys.executable,
        "-m",
        "mqbox.server.supervisor",
        *("--home", str(home), *arguments, "--ready-fd", str(write_fd)),
    ]
    # One BLAS thread: the supervisor warns about native threads in its zygote otherwise.
    environment = {
        **os.environ,
        **(environment or {}),
        "PYTHONPATH": str(REPO_ROOT),
        "OPENBLAS_NUM_THREADS": "1",
    }
    try:
        with output_path.open("ab") as output:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                cwd=REPO_ROOT,
                env=environment,
                pass_fds=(write_fd,),
                start_new_session=True,
                preexec_fn=None
                if file_limit is None
                else functools.partial(set_file_limit, file_limit),
            )
    finally:
        os.close(write_fd)
    reap_pids.append(process.pid)
    instance = ""
    family: set[int] = set()
    try:
        ready = read_ready_line(read_fd, process, output_path)
        assert ready.get("ok"), f"the supervisor did not start: {ready}"
        instance = str(ready["instance"])
        family |= {int(pid) for pid in ready["roles"].values()}
        with contextlib.suppress(psutil.NoSuchProcess):
            family |= {child.pid for child in psutil.Process(process.pid).children(True)}
        reap_pids.extend(family)
        yield process, ready, output_path
    finally:
        os.close(read_fd)
        stop_process(process)
        survivors: list[psutil.Process] = []
        for pid in family:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                survivor = psutil.Process(pid)
                survivor.kill()
                survivors.append(survivor)
        # Gone before returning: a restart on the same ports must find them free.
        psutil.wait_procs(survivors, timeout=STOP_TIMEOUT_S)
        if instance:
            names.unlink_instance(instance)


def stop_process(process: subprocess.Popen[bytes]) -> int | None:
    """SIGTERM, then wait; SIGKILL after STOP_TIMEOUT_S. The exit status (None if killed)."""
    if process.poll() is not None:
        return process.returncode
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(STOP_TIMEOUT_S)
        return None


@contextlib.contextmanager
def running_appliance(
    home: Path,
    reap_pids: list[int],
    broker_conf: str = BROKER_CONF,
    *,
    file_limit: tuple[int, int] | None = None,
    environment: Mapping[str, str] | None = None,
    namesrv_address: str | None = None,
    broker_port: int = 0,
    namesrv_port: int = 0,
) -> Iterator[Appliance]:
    """Start the appliance on `home` and yield it once every role is ready; every PID it starts
    is appended to `reap_pids` as well. `file_limit` and `environment`: running_supervisor's.

    `namesrv_address`: run no name server of its own and register the broker with that one
    instead (namesrvAddr, `--no-namesrv`), so several appliances (with brokerName set apart in
    `broker_conf`) make one cluster. The ports are 0 (any) unless given, so a restart on the same
    home can keep its clients' addresses."""
    home.mkdir(parents=True, exist_ok=True)
    conf = home / "broker.conf"
    arguments = ["--config", str(conf), "--broker-port", str(broker_port)]
    if namesrv_address is None:
        arguments += ["--namesrv-port", str(namesrv_port)]
    else:
        broker_conf += f"namesrvAddr={namesrv_address}\n"
        arguments.append("--no-namesrv")
    conf.write_text(broker_conf, encoding="utf-8")
    with running_supervisor(
        home, arguments, reap_pids, file_limit=file_limit, environment=environment
    ) as (
        process,
        ready,
        output_path,
    ):
        yield Appliance(
            process,
            home,
            str(ready["broker"]),
            str(ready["namesrv"]) or str(namesrv_address),
            str(ready["instance"]),
            output_path,
            [int(pid) for pid in ready["roles"].values()],
            {str(role_id): int(pid) for role_id, pid in ready["roles"].items()},
        )


def read_ready_line(
    read_fd: int, process: subprocess.Popen[bytes], output_path: Path
) -> dict[str, Any]:
    """The supervisor's one JSON line on the ready pipe; AssertionError with its output if it
    exits, closes the pipe or takes longer than READY_TIMEOUT_S."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    received = b""
    os.set_blocking(read_fd, False)
    while b"\n" not in received:
        try:
            chunk: bytes | None = os.read(read_fd, 4096)
        except BlockingIOError:
            chunk = None
        if chunk:
            received += chunk
            continue
        if chunk == b"" or process.poll() is not None or time.monotonic() > deadline:
            text = output_path.read_text(encoding="utf-8", errors="replace")
            raise AssertionError(f"the appliance is not ready (status {process.poll()}):\n{text}")
        time.sleep(0.02)
    document: dict[str, Any] = json.loads(received.split(b"\n", 1)[0])
    return document
