"""The broker's front (reactor, codec, worker, admin) as objects in the test's own process.

Owns: the rings of one front topology (created here, unlinked by `close()`), one RoleContext per
role (no control block, no supervisor), the listening socket on 127.0.0.1 port 0, and `pump()`,
which turns every role's loop once without sleeping. Never: processes; tests that need real
processes use broker_front.running_front. Deterministic: nothing runs between two pumps, so a
test can stop the pipeline at any hop, read the rings, or inject parcels into them.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from mqbox.config import BrokerConfig, PoolConfig
from mqbox.ipc import names
from mqbox.ipc.ring import Ring
from mqbox.server.roles.codec import Codec
from mqbox.server.roles.processors.admin import AdminProcessor
from mqbox.server.roles.reactor import Reactor
from mqbox.server.roles.worker import Worker
from mqbox.server.runtime import RoleContext
from mqbox.server.topology import RoleKind, Topology
from tests.support.broker_front import front_topology, front_topology_small_rings

PUMP_DEADLINE_S: Final = 10.0


def _no_report(info: Any) -> None:
    """report_ready of a role that is not a process."""


class FrontInProcess:
    """Rings, contexts and role objects of one front; `close()` releases everything."""

    def __init__(
        self,
        instance: str,
        store_root: Path,
        *,
        codec_count: int = 2,
        worker_count: int = 1,
        admin_processor_count: int = 1,
        small_rings: bool = False,
        reactor_options: dict[str, Any] | None = None,
        worker_options: dict[str, Any] | None = None,
    ) -> None:
        pools = PoolConfig(
            reactor_count=1,
            codec_count=codec_count,
            worker_count=worker_count,
            send_processor_count=0,
            pull_processor_count=0,
            admin_processor_count=admin_processor_count,
        )
        config = BrokerConfig(pools=pools, listen_port=0)
        factory = front_topology_small_rings if small_rings else front_topology
        self.instance = instance
        self.topology: Topology = factory(instance, config)
        self.rings = [Ring.create(spec.name, spec.capacity_bytes) for spec in self.topology.rings]
        self.listen_socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listen_socket.bind(("127.0.0.1", 0))
        self.listen_socket.listen(64)
        self.port: int = self.listen_socket.getsockname()[1]
        store_root.mkdir(parents=True, exist_ok=True)

        def context(kind: RoleKind, index: int) -> RoleContext:
            role = next(r for r in self.topology.roles_of(kind) if r.index == index)
            return RoleContext(
                instance=instance,
                home=store_root.parent,
                store_root=store_root,
                broker=config,
                topology=self.topology,
                role=role,
                listen_socket=self.listen_socket,
                broker_address=f"127.0.0.1:{self.port}",
                report_ready=_no_report,
            )

        self.reactor = Reactor(context(RoleKind.REACTOR, 0), **(reactor_options or {}))
        self.codecs = [Codec(context(RoleKind.CODEC, i)) for i in range(codec_count)]
        self.workers = [
            Worker(context(RoleKind.WORKER, i), **(worker_options or {}))
            for i in range(worker_count)
        ]
        self.admins = [
            AdminProcessor(context(RoleKind.ADMIN, i)) for i in range(admin_processor_count)
        ]

    def pump(self, rounds: int = 1) -> int:
        """Turn every role's loop `rounds` times without sleeping; the parcels handled."""
        handled = 0
        for _ in range(rounds):
            handled += self.reactor.run_once(0)
            for codec in self.codecs:
                handled += codec.run_once(0)
            for worker in self.workers:
                handled += worker.run_once(0)
            for admin in self.admins:
                handled += admin.run_once(0)
            for codec in self.codecs:
                handled += codec.run_once(0)
            handled += self.reactor.run_once(0)
        return handled

    def pump_until(
        self, condition: Callable[[], bool], deadline_s: float = PUMP_DEADLINE_S
    ) -> None:
        """Pump until `condition()` holds; AssertionError after `deadline_s`."""
        deadline = time.monotonic() + deadline_s
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError("the front did not get there in time")
            self.pump()

    def close(self) -> None:
        """Close the roles' sockets and epolls, the listener, and unlink every ring."""
        self.reactor.close()
        for codec in self.codecs:
            codec.sleeper.epoll.close()
        for worker in self.workers:
            worker.epoll.close()
        for admin in self.admins:
            admin.epoll.close()
        self.listen_socket.close()
        for ring in self.rings:
            ring.unlink()
            ring.close()
        names.unlink_instance(self.instance)
