"""The broker's front alone (reactor, codec, worker, admin) under the real supervisor, for tests.

Owns: topology factories (`module:function` values for the supervisor's `--topology`) that keep
`broker_topology`'s reactors, codecs, workers and admin processors and their rings, and leave out
the send and pull pools and the store roles: the worker then routes SEND and PULL to the admin
processors (worker.py: an empty pool falls back to the default route), which answer 3. Also
`running_front`, which starts `python -m mqbox.server.supervisor --no-namesrv` on port 0 with
such a topology and a broker.conf of the chosen pool sizes, and waits for its ready line. Never:
fixed ports or names (the supervisor derives the shared-memory instance from the test's own
home directory), or broker behaviour of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import psutil

from mqbox.config import BrokerConfig
from mqbox.ipc import names
from mqbox.server.topology import RoleKind, Topology, broker_topology
from tests.support.appliance import read_ready_line

FRONT_KINDS: Final = frozenset({RoleKind.REACTOR, RoleKind.CODEC, RoleKind.WORKER, RoleKind.ADMIN})
SMALL_RING_CAPACITY_BYTES: Final = 64 * 1024
STOP_TIMEOUT_S: Final = 20.0
_MODULE: Final = "tests.support.broker_front"
ROOT: Final = Path(__file__).resolve().parents[2]


def _front(topology: Topology) -> Topology:
    roles = tuple(role for role in topology.roles if role.kind in FRONT_KINDS)
    role_ids = {role.role_id for role in roles}
    rings = tuple(
        ring for ring in topology.rings if ring.producer in role_ids and ring.consumer in role_ids
    )
    return Topology(roles, rings)


def _without_send_pull(config: BrokerConfig) -> BrokerConfig:
    pools = dataclasses.replace(config.pools, send_processor_count=0, pull_processor_count=0)
    return dataclasses.replace(config, pools=pools)


def front_topology(instance: str, config: BrokerConfig) -> Topology:
    """The front of `config`'s broker with 4 MiB rings (2 MiB inline maximum)."""
    return _front(broker_topology(instance, _without_send_pull(config)))


def front_topology_small_rings(instance: str, config: BrokerConfig) -> Topology:
    """The same with 64 KiB rings: a 40 KiB frame already spills, a burst fills a ring."""
    return _front(broker_topology(instance, _without_send_pull(config), SMALL_RING_CAPACITY_BYTES))


@dataclasses.dataclass
class FrontBroker:
    """A running supervisor with the front roles; `roles` maps role id to pid at start."""

    process: subprocess.Popen[bytes]
    home: Path
    host: str
    port: int
    instance: str
    roles: dict[str, int]
    output_path: Path

    def role_pid(self, role_id: str) -> int:
        """The current pid of `role_id` (it changes when the supervisor restarts the role)."""
        state = json.loads((self.home / "run" / "state.json").read_text(encoding="utf-8"))
        for role in state["roles"]:
            if role["role_id"] == role_id:
                return int(role["pid"] or 0)
        raise KeyError(role_id)

    def wait_role_restarted(self, role_id: str, old_pid: int, timeout_s: float = 30.0) -> int:
        """Wait until the supervisor has a new, ready process for `role_id`; its pid."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = json.loads((self.home / "run" / "state.json").read_text(encoding="utf-8"))
            for role in state["roles"]:
                if (
                    role["role_id"] == role_id
                    and role.get("pid")
                    and role["pid"] != old_pid
                    and role.get("state") == "ready"
                ):
                    return int(role["pid"])
            time.sleep(0.05)
        raise AssertionError(f"{role_id} was not restarted within {timeout_s} s")

    def output(self) -> str:
        return self.output_path.read_text(encoding="utf-8", errors="replace")


def write_broker_conf(path: Path, **pools: int) -> Path:
    """A broker.conf with the given pool sizes (reactor_count=..., codec_count=...)."""
    keys = {
        "reactor_count": "mqboxReactorCount",
        "codec_count": "mqboxCodecCount",
        "worker_count": "mqboxWorkerCount",
        "admin_processor_count": "mqboxAdminProcessorCount",
    }
    lines = ["brokerIP1=127.0.0.1"]
    lines += [f"{keys[name]}={count}" for name, count in pools.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@contextlib.contextmanager
def running_front(
    home: Path,
    reap_pids: list[int],
    *,
    small_rings: bool = False,
    reactor_count: int = 1,
    codec_count: int = 2,
    worker_count: int = 1,
    admin_processor_count: int = 1,
) -> Iterator[FrontBroker]:
    """A supervisor running the front roles on 127.0.0.1 port 0; stopped (SIGTERM, then SIGKILL
    by PID) and its shared memory swept on the way out."""
    home.mkdir(parents=True, exist_ok=True)
    conf = write_broker_conf(
        home / "broker.conf",
        reactor_count=reactor_count,
        codec_count=codec_count,
        worker_count=worker_count,
        admin_processor_count=admin_processor_count,
    )
    factory = "front_topology_small_rings" if small_rings else "front_topology"
    read_fd, write_fd = os.pipe()
    output_path = home / "supervisor.out"
    command = [
        sys.executable,
        "-m",
        "mqbox.server.supervisor",
        "--home",
        str(home),
        "--config",
        str(conf),
        "--no-namesrv",
        "--broker-port",
        "0",
        "--topology",
        f"{_MODULE}:{factory}",
        "--ready-fd",
        str(write_fd),
    ]
    # One BLAS thread: the supervisor warns about native threads in its zygote otherwise.
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1"}
    try:
        with output_path.open("wb") as output:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                env=environment,
                pass_fds=(write_fd,),
            )
    finally:
        os.close(write_fd)
    reap_pids.append(process.pid)
    instance = ""
    role_pids: list[int] = []
    try:
        ready = read_ready_line(read_fd, process, output_path)
        assert ready.get("ok"), f"supervisor did not start: {ready}"
        instance = str(ready["instance"])
        host, port = str(ready["broker"]).rsplit(":", 1)
        roles = {str(role_id): int(pid) for role_id, pid in ready["roles"].items()}
        role_pids = list(roles.values())
        yield FrontBroker(process, home, host, int(port), instance, roles, output_path)
    finally:
        os.close(read_fd)
        _stop(process, role_pids)
        if instance:
            names.unlink_instance(instance)


def _stop(process: subprocess.Popen[bytes], role_pids: list[int]) -> None:
    """SIGTERM the supervisor (it stops the roles in order); SIGKILL whatever is left, by PID."""
    family: list[psutil.Process] = []
    with contextlib.suppress(psutil.NoSuchProcess):
        family = psutil.Process(process.pid).children(recursive=True)
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_TIMEOUT_S)
    leftovers = {child.pid for child in family} | set(role_pids)
    for pid in leftovers:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
