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
import os
import signal
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import psutil

from mqbox.server import launch
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
    "mqboxHttpPort=0\n"
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
    "mqboxHttpPort=0\n"
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
    http_url: str = ""  # the HTTP endpoint (mqboxHttpPort=0 in BROKER_CONF), "" if none
    ha_address: str = ""  # a master's HA listening address (haListenPort), "" on a slave

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
    """Run `python -m mqbox.server.supervisor --home HOME ARGUMENTS` (mqbox.server.launch, the
    starter the CLI and the benches use too) and yield (process, its ready line, its output file)
    once every role is ready. On the way out: the orderly stop (SIGTERM, then SIGKILL after
    STOP_TIMEOUT_S), SIGKILL by PID of everything it started, and the sweep of its shared memory.
    Every PID is appended to `reap_pids` too. `file_limit` (soft, hard) is the supervisor's
    RLIMIT_NOFILE, set before exec; `environment` adds variables to the supervisor's (test hooks,
    runtime.py)."""
    home.mkdir(parents=True, exist_ok=True)
    output_path = home / "supervisor.out"
    limit = None if file_limit is None else functools.partial(set_file_limit, file_limit)
    with output_path.open("ab") as output:
        try:
            with launch.supervised(
                ["--home", str(home), *arguments],
                output=output,
                ready_timeout_s=READY_TIMEOUT_S,
                stop_timeout_s=STOP_TIMEOUT_S,
                environment={**(environment or {}), "PYTHONPATH": str(REPO_ROOT)},
                cwd=REPO_ROOT,
                preexec_fn=limit,
                on_family=reap_pids.extend,
            ) as (process, ready):
                yield process, ready, output_path
        except launch.SupervisorNotReadyError as error:
            text = output_path.read_text(encoding="utf-8", errors="replace")
            raise AssertionError(f"the appliance is not ready ({error}):\n{text}") from None


def stop_process(process: subprocess.Popen[bytes]) -> int | None:
    """SIGTERM, then wait; SIGKILL after STOP_TIMEOUT_S. The exit status (None if killed)."""
    return launch.stop(process, STOP_TIMEOUT_S)


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
            str(ready.get("http") or ""),
            str(ready.get("ha") or ""),
        )


def sigkill_pids(pids: list[int]) -> None:
    """SIGKILL by PID every process of `pids` that still runs, then wait until they are gone
    (the end of a module-scoped fixture, whose processes the function-scoped `reap_pids` cannot
    reach, and of a layout)."""
    alive = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(pid)
            process.kill()
            alive.append(process)
    psutil.wait_procs(alive, timeout=10)


@contextlib.contextmanager
def module_appliance(home: Path, broker_conf: str = BROKER_CONF) -> Iterator[Appliance]:
    """`running_appliance` for a module-scoped fixture: every process it started is SIGKILLed
    by PID at the end, whatever the tests left running."""
    pids: list[int] = []
    try:
        with running_appliance(home, pids, broker_conf) as running:
            yield running
    finally:
        sigkill_pids(pids)
