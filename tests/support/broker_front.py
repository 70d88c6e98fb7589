"""The broker's front alone (reactor, codec, worker, admin) under the real supervisor, for tests.

Owns: topology factories (`module:function` values for the supervisor's `--topology`) that keep
`broker_topology`'s reactors, codecs, workers and admin processors and their rings, and leave out
the send and pull pools and the store roles: the worker then routes SEND and PULL to the admin
processors (worker.py: an empty pool falls back to the default route), which answer 3. Also
`running_front`, which runs `python -m mqbox.server.supervisor --no-namesrv` on port 0 (through
appliance.running_supervisor) with such a topology and a broker.conf of the chosen pool
sizes. Never: fixed ports or names (the supervisor derives the shared-memory instance from the
test's own home directory), or broker behaviour of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from mqbox.config import BrokerConfig
from mqbox.server.topology import RoleKind, Topology, broker_topology
from tests.support.appliance import running_supervisor

FRONT_KINDS: Final = frozenset({RoleKind.REACTOR, RoleKind.CODEC, RoleKind.WORKER, RoleKind.ADMIN})
SMALL_RING_CAPACITY_BYTES: Final = 64 * 1024
_MODULE: Final = "tests.support.broker_front"


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
    arguments = ["--config", str(conf), "--no-namesrv", "--broker-port", "0"]
    arguments += ["--topology", f"{_MODULE}:{factory}"]
    with running_supervisor(home, arguments, reap_pids) as (process, ready, output_path):
        host, port = str(ready["broker"]).rsplit(":", 1)
        roles = {str(role_id): int(pid) for role_id, pid in ready["roles"].items()}
        yield FrontBroker(
            process, home, host, int(port), str(ready["instance"]), roles, output_path
        )
