"""The broker's process graph: which roles run, which rings link them, what each role is given.

Owns: `RoleSpec`, `RingSpec` and `broker_topology()`, the one function that turns a BrokerConfig
into the list of processes and the rings between them. Never: starting anything (supervisor.py
does), what a role is given (runtime.RoleContext), or what travels on a ring (server/parcels.py
does). Imports nothing of mqbox.server.

The graph, drawn here only (R reactors, C codecs, W workers, S send, P pull and A admin
processors; each arrow names the parcels it carries, laid out in parcels.py and admin_parcels.py):

    reactor.i --FRAME, CONNECTION_OPENED/CLOSED--> codec.(conn % C)
    codec.c --COMMAND, CONNECTION_OPENED/CLOSED, COMPLETED--> worker.(conn % W)
    worker.k --COMMAND--> send.s / pull.p / admin.a          (the pool by routing.py)
    worker.k --CONNECTION_OPENED/CLOSED--> admin.0            (the client tables)
    worker.k --CONNECTION_CLOSED--> pull.(conn % P)           (its held pulls)
    worker.k --CLOSE_CONNECTION, REQUEST_FAILED--> admin.a    (idle closes; dead processors)
    send.s / pull.p / admin.a --REPLY, CLOSE_CONNECTION--> codec.(conn % C)
    codec.c --RESPONSE, CLOSE_CONNECTION, NO_ANSWER--> reactor.(conn's top byte)
    send.s --APPEND--> store_writer --APPEND_ACK--> send.s
    schedule.0 --APPEND--> store_writer --APPEND_ACK--> schedule.0   (due delayed messages)
    store_writer --WRITTEN--> dispatcher
    dispatcher --QUEUES_GREW--> pull.p          (plus queue-counters in shared memory)
    dispatcher --QUEUES_GREW--> schedule.0      (only when a SCHEDULE_TOPIC_XXXX queue grew)
    pull.p --COMMIT_OFFSET--> admin.0           (commitOffset piggybacked on pulls)
    store_writer --WRITTEN--> ha_service.0 --REPLICATED--> store_writer      (a master)
    store_writer --WRITTEN--> ha_client.0 --REPLICA--> store_writer          (a slave)

Replication (docs/replication.md): a master (ASYNC_MASTER, SYNC_MASTER) runs ha_service.0, which
serves its slaves on haListenPort from read-only maps of the commit log; a SLAVE runs
ha_client.0, which connects to haMasterAddress and hands the master's bytes to the store writer.

Every arrow is one single-producer single-consumer ring (mqbox/ipc/ring.py); a role that hears
from several producers drains one ring per producer. A connection id carries the reactor index in
its top byte, so the codec knows where a response goes, and a connection's frames always go to the
same codec and worker (`conn % C`, `conn % W`), which keeps its requests in order through the
pipeline.

Processes are forked from a warmed-up parent (the broker zygote in supervisor.py): numba and every
kernel are compiled once, `gc.freeze()` is called, and children share those pages copy-on-write.
That is what keeps the appliance within its memory budget (numba costs ~140 MB per process that
compiles on its own). Because children are forked, a role's context (runtime.RoleContext)
may hold live objects (the listening socket, configs); nothing in it is pickled.
"""

from __future__ import annotations

import dataclasses
import enum

from mqbox.config import BrokerConfig, BrokerRole
from mqbox.ipc import names


class RoleKind(enum.Enum):
    REACTOR = "reactor"
    CODEC = "codec"
    WORKER = "worker"
    SEND = "send"
    PULL = "pull"
    ADMIN = "admin"
    STORE_WRITER = "store_writer"
    DISPATCHER = "dispatcher"
    SERVICES = "services"
    SCHEDULE = "schedule"
    HA_SERVICE = "ha_service"
    HA_CLIENT = "ha_client"


# Roles whose death stops the broker (recovery runs at the next start) instead of a restart:
# the store writer owns the CommitLog's write position, the dispatcher the consume queues'.
CRITICAL_KINDS = frozenset({RoleKind.STORE_WRITER, RoleKind.DISPATCHER})

# Start order: store first (recovery, then the writer takes appends), then business processors,
# then the front (workers, codecs), and reactors last, so nothing is accepted before it can be
# served. Stop order is the reverse.
START_ORDER = (
    RoleKind.STORE_WRITER,
    RoleKind.DISPATCHER,
    RoleKind.SERVICES,
    RoleKind.SCHEDULE,
    RoleKind.HA_SERVICE,
    RoleKind.HA_CLIENT,
    RoleKind.SEND,
    RoleKind.PULL,
    RoleKind.ADMIN,
    RoleKind.WORKER,
    RoleKind.CODEC,
    RoleKind.REACTOR,
)


@dataclasses.dataclass(frozen=True, slots=True)
class RingSpec:
    """One SPSC ring: its shared-memory name, who writes it, who reads it, how big it is."""

    name: str  # posix_ipc name, /mqbox.<instance>.<producer role>.<n>
    producer: str  # role id, e.g. "reactor.0"
    consumer: str  # role id, e.g. "codec.0"
    capacity_bytes: int  # a power of two


@dataclasses.dataclass(frozen=True, slots=True)
class RoleSpec:
    """One process of the broker."""

    role_id: str  # "<kind>.<index>", e.g. "send.1"
    kind: RoleKind
    index: int
    main: str  # "module:function" taking a runtime.RoleContext, never returning

    @property
    def critical(self) -> bool:
        return self.kind in CRITICAL_KINDS


@dataclasses.dataclass(frozen=True, slots=True)
class Topology:
    roles: tuple[RoleSpec, ...]
    rings: tuple[RingSpec, ...]

    def rings_from(self, role_id: str) -> tuple[RingSpec, ...]:
        """Rings this role writes, in a stable order."""
        return tuple(ring for ring in self.rings if ring.producer == role_id)

    def rings_to(self, role_id: str) -> tuple[RingSpec, ...]:
        """Rings this role drains, in a stable order."""
        return tuple(ring for ring in self.rings if ring.consumer == role_id)

    def rings_to_split(
        self, role_id: str, producer_kind: RoleKind
    ) -> tuple[tuple[RingSpec, ...], tuple[RingSpec, ...]]:
        """Rings this role drains: (those from roles of `producer_kind`, all the others)."""
        producers = {role.role_id for role in self.roles_of(producer_kind)}
        specs = self.rings_to(role_id)
        return (
            tuple(spec for spec in specs if spec.producer in producers),
            tuple(spec for spec in specs if spec.producer not in producers),
        )

    def ring(self, producer: str, consumer: str) -> RingSpec:
        """The one ring from `producer` to `consumer`; KeyError if they are not linked."""
        for ring in self.rings:
            if ring.producer == producer and ring.consumer == consumer:
                return ring
        raise KeyError(f"no ring from {producer} to {consumer}")

    def roles_of(self, kind: RoleKind) -> tuple[RoleSpec, ...]:
        return tuple(role for role in self.roles if role.kind is kind)


# 4 MiB per ring keeps the shared memory of a default broker (12 rings) under 50 MiB even when
# every page has been touched. Payloads above the ring's inline maximum (a frame with a large body)
# travel as spill files in /dev/shm named like the rings, so the supervisor's sweep removes them.
RING_CAPACITY_BYTES_DEFAULT = 4 << 20
ROLE_MAIN = {
    RoleKind.REACTOR: "mqbox.server.roles.reactor:main",
    RoleKind.CODEC: "mqbox.server.roles.codec:main",
    RoleKind.WORKER: "mqbox.server.roles.worker:main",
    RoleKind.SEND: "mqbox.server.roles.processors.send:main",
    RoleKind.PULL: "mqbox.server.roles.processors.pull:main",
    RoleKind.ADMIN: "mqbox.server.roles.processors.admin:main",
    RoleKind.STORE_WRITER: "mqbox.server.roles.store_writer:main",
    RoleKind.DISPATCHER: "mqbox.server.roles.dispatcher:main",
    RoleKind.SERVICES: "mqbox.server.roles.services:main",
    RoleKind.SCHEDULE: "mqbox.server.roles.schedule:main",
    RoleKind.HA_SERVICE: "mqbox.server.roles.ha_service:main",
    RoleKind.HA_CLIENT: "mqbox.server.roles.ha_client:main",
}


def broker_topology(
    instance: str,
    config: BrokerConfig,
    ring_capacity_bytes: int = RING_CAPACITY_BYTES_DEFAULT,
) -> Topology:
    """The roles and rings of one broker with the pool sizes of `config`."""
    pools = config.pools
    counts = {
        RoleKind.REACTOR: pools.reactor_count,
        RoleKind.CODEC: pools.codec_count,
        RoleKind.WORKER: pools.worker_count,
        RoleKind.SEND: pools.send_processor_count,
        RoleKind.PULL: pools.pull_processor_count,
        RoleKind.ADMIN: pools.admin_processor_count,
        RoleKind.STORE_WRITER: 1,
        RoleKind.DISPATCHER: 1,
        RoleKind.SERVICES: 1,
        RoleKind.SCHEDULE: 1,
        RoleKind.HA_SERVICE: 0 if config.broker_role is BrokerRole.SLAVE else 1,
        RoleKind.HA_CLIENT: 1 if config.broker_role is BrokerRole.SLAVE else 0,
    }
    roles = tuple(
        RoleSpec(f"{kind.value}.{index}", kind, index, ROLE_MAIN[kind])
        for kind in START_ORDER
        for index in range(counts[kind])
    )
    by_kind = {kind: [role.role_id for role in roles if role.kind is kind] for kind in RoleKind}
    edges: list[tuple[str, str]] = []

    def link(producers: list[str], consumers: list[str]) -> None:
        edges.extend((producer, consumer) for producer in producers for consumer in consumers)

    processors = by_kind[RoleKind.SEND] + by_kind[RoleKind.PULL] + by_kind[RoleKind.ADMIN]
    link(by_kind[RoleKind.REACTOR], by_kind[RoleKind.CODEC])
    link(by_kind[RoleKind.CODEC], by_kind[RoleKind.WORKER])
    link(by_kind[RoleKind.WORKER], processors)
    link(processors, by_kind[RoleKind.CODEC])
    link(by_kind[RoleKind.CODEC], by_kind[RoleKind.REACTOR])
    link(by_kind[RoleKind.SEND], by_kind[RoleKind.STORE_WRITER])
    link(by_kind[RoleKind.STORE_WRITER], by_kind[RoleKind.SEND])
    link(by_kind[RoleKind.STORE_WRITER], by_kind[RoleKind.DISPATCHER])
    link(by_kind[RoleKind.DISPATCHER], by_kind[RoleKind.PULL])
    # Consumer offsets have one owner, admin.0, so a commit piggybacked on a pull goes there.
    link(by_kind[RoleKind.PULL], by_kind[RoleKind.ADMIN][:1])
    # Delayed delivery has one owner, schedule.0: it appends due messages like a sender, and
    # the dispatcher tells it when a SCHEDULE_TOPIC_XXXX queue grew.
    link(by_kind[RoleKind.SCHEDULE], by_kind[RoleKind.STORE_WRITER])
    link(by_kind[RoleKind.STORE_WRITER], by_kind[RoleKind.SCHEDULE])
    link(by_kind[RoleKind.DISPATCHER], by_kind[RoleKind.SCHEDULE])
    # Replication: the HA role hears of new bytes like the dispatcher, and answers the writer
    # (a master's slave acknowledgements, a slave's received bytes).
    ha_roles = by_kind[RoleKind.HA_SERVICE] + by_kind[RoleKind.HA_CLIENT]
    link(by_kind[RoleKind.STORE_WRITER], ha_roles)
    link(ha_roles, by_kind[RoleKind.STORE_WRITER])

    ring_counts: dict[str, int] = {}
    rings: list[RingSpec] = []
    for producer, consumer in edges:
        # The shm role part is the producer's role id without the dot; n counts its out-rings.
        role_part = producer.replace(".", "-")
        n = ring_counts.get(role_part, 0)
        ring_counts[role_part] = n + 1
        rings.append(
            RingSpec(
                names.shm_name(instance, role_part, n), producer, consumer, ring_capacity_bytes
            )
        )
    return Topology(roles, tuple(rings))
