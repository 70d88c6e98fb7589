"""The worker role: connection bookkeeping and routing of commands to the processor pools.

Owns: the connection table (conn id -> peer, opened time, last activity, request count), the idle
check (a connection without a request for `connection_idle_ms` is closed, as RocketMQ's
NettyServerConfig.serverChannelMaxIdleTimeSeconds does after 120 s; broker.conf's key of that
name sets it), forwarding each command to the processor pool that routing.py names for its
code, and the in-flight table of requests that a processor holds, so that when a processor
process dies the clients get SYSTEM_ERROR instead of a timeout.
Never: decodes a header or a body (the codec decoded enough for routing), answers a client
itself (it has no ring to the codecs: it asks an admin processor with REQUEST_FAILED), or
touches a socket.

Routing (routing.ROUTES, data: a new code is a row there, not a change here):
- `ROUTES` maps a request code to a processor kind and says whether only member 0 of that pool
  may serve it; any other code goes to `DEFAULT_ROUTE` (admin), whose processors answer
  REQUEST_CODE_NOT_SUPPORTED for codes nobody serves.
- A kind whose pool is empty in the topology (no send processors configured, say) falls back to
  the default kind, so a front-only broker answers every request.
- Within a pool the processor is chosen by `conn_id % pool size`, which keeps one connection's
  requests of one kind in order. The exception is state with one owner: member-0 codes
  (offsets, heartbeats, consumer lists, locks, calls to clients) always go to admin.0, which
  alone holds those tables, so any admin pool size serves them. SEND is meant to go by a hash
  of (topic, queue) once the send processors own queues; that is a change of `_route` alone.
- A client's response to a broker request (flag bit RESPONSE) goes to admin.0, which sent the
  request; it is never tracked as in flight, and neither is a oneway request.
- Connection events: CONNECTION_OPENED and CONNECTION_CLOSED go to admin.0 (the client tables);
  CONNECTION_CLOSED also goes to pull.(conn % P), which holds the connection's long-polled pulls.
  Each travels on the same ring as the connection's requests to that processor, after them.

In-flight tracking and restarts. Each routed request is recorded as (conn, opaque) -> (pool slot,
generation, serialize type); the codec's COMPLETED notices remove it, and CONNECTION_CLOSED
removes a connection's entries. The supervisor's control block (runtime.py) tells the worker
when a processor's generation changes: a request sent while generation g was current is served
by process g (odd) or, if the role was down, by the next process g + 1; once the generation
moves past that, the process that held the request is gone, and the worker asks an admin
processor to answer it with SYSTEM_ERROR. Parcels still in the ring are delivered again to the
restarted process (ring.py); the worker stamps each tracked COMMAND with its serving generation
(parcels.py), and a processor drops a COMMAND stamped older than its own generation, since that
request has its answer already (a failed send served again would be stored twice). Spilled
parcels go on unstamped and are served again; clients match responses by opaque and drop a
second one. The codec and the worker themselves never forward a request twice: each releases a
drained batch before it flushes what it staged from it, so one that dies in between loses those
requests (their clients time out and retry) rather than delivering them again.
COMPLETED notices are lazy (codec.py), so an entry may outlive its answer by up to 500 ms; an
error sent for such an entry reaches a client that no longer waits for it and is dropped there.
Without a control block (unit tests), `on_processor_restarted(role_id)` does the same by hand.

No command stops the worker: one whose routing raises (a bug a client reached; processors/
__init__.py says why it is answered rather than fatal) is counted, logged with its traceback
(resources.FailureLog, a few a minute) and answered SYSTEM_ERROR through an admin processor.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import select
import time
from collections.abc import Callable, Mapping
from typing import Final, NoReturn

from mqbox import resources
from mqbox.ipc.ring import Ring
from mqbox.protocol.codes import FLAG_ONEWAY, FLAG_RESPONSE, ResponseCode
from mqbox.server import control_block, parcels, runtime, transport
from mqbox.server.parcels import Buffer
from mqbox.server.routing import CLIENT_RESPONSE_ROUTE, DEFAULT_ROUTE, ROUTES
from mqbox.server.runtime import RoleContext
from mqbox.server.topology import RoleKind
from mqbox.server.transport import Inbox, Outbox, Sleeper, SpillWriter

PROCESSOR_KINDS: Final = (RoleKind.SEND, RoleKind.PULL, RoleKind.ADMIN)

CONNECTION_IDLE_MS_DEFAULT: Final = 120_000  # RocketMQ's serverChannelMaxIdleTimeSeconds
HOUSEKEEPING_INTERVAL_NS: Final = 1_000_000_000
STAGED_SIZE_BYTES_HIGH: Final = 8 * 1024 * 1024
BACKED_UP_RETRY_MS: Final = 1
_FLAG_UNTRACKED: Final = FLAG_RESPONSE | FLAG_ONEWAY
# A large COMMAND is forwarded as its SPILLED parcel: the processor reads the file, not the worker.
_FORWARDED_UNREAD: Final = frozenset({parcels.COMMAND})
_COMMAND_TYPES: Final = frozenset({parcels.COMMAND, parcels.COMMAND | parcels.SPILLED_FLAG})

log = logging.getLogger(__name__)


@dataclasses.dataclass(slots=True)
class ConnectionInfo:
    """One row of the worker's connection table."""

    conn_id: int
    peer_host: str
    peer_port: int
    opened_ms: int  # wall clock, from the reactor
    last_activity_ns: int  # monotonic, this process
    request_count: int = 0
    idle_close_sent: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerStatistics:
    commands_routed: int
    commands_by_kind: Mapping[str, int]
    connections_open: int
    connections_opened: int
    connections_closed: int
    idle_closes: int
    in_flight: int
    requests_failed: int  # answered SYSTEM_ERROR after a processor restart
    unexpected_errors: int  # commands answered SYSTEM_ERROR for a bug they reached (logged)
    processor_restarts: int
    spill_count: int
    sleep_count: int
    turn_count: int


class _Pool:
    """The processors of one kind, as (role id, outbox, slot) in index order."""

    def __init__(self, kind: RoleKind, role_ids: list[str], outboxes: list[Outbox], first: int):
        self.kind = kind
        self.role_ids = role_ids
        self.outboxes = outboxes
        self.first_slot = first  # slots number every processor the worker writes to


class Worker:
    """One worker process's state. `run_forever()` is the role; tests drive `run_once()`."""

    def __init__(
        self,
        ctx: RoleContext,
        *,
        connection_idle_ms: int = CONNECTION_IDLE_MS_DEFAULT,
        spin_ns_max: int = transport.REQUEST_SPIN_NS_MAX,
        wakeup_fd: int | None = None,
    ) -> None:
        assert ctx.role.kind is RoleKind.WORKER
        assert connection_idle_ms > 0
        self.role_id = ctx.role.role_id
        self.connection_idle_ns = connection_idle_ms * 1_000_000
        topology = ctx.topology
        self.spill_writer = SpillWriter(ctx.instance, self.role_id)
        self.slot_role_ids: list[str] = []
        self.slot_outboxes: list[Outbox] = []
        pools: dict[RoleKind, _Pool] = {}
        for kind in PROCESSOR_KINDS:
            role_ids = [role.role_id for role in topology.roles_of(kind)]
            outboxes = [
                Outbox(Ring.attach(topology.ring(self.role_id, role_id).name), self.spill_writer)
                for role_id in role_ids
            ]
            pools[kind] = _Pool(kind, role_ids, outboxes, len(self.slot_role_ids))
            self.slot_role_ids += role_ids
            self.slot_outboxes += outboxes
        self.admin_pool = pools[RoleKind.ADMIN]
        assert self.admin_pool.role_ids, "a broker has at least one admin processor"
        # admin.0 alone: the owner of the client, offset and lock tables (module docstring).
        self.admin_zero_pool = _Pool(
            RoleKind.ADMIN,
            self.admin_pool.role_ids[:1],
            self.admin_pool.outboxes[:1],
            self.admin_pool.first_slot,
        )
        self.pull_pool = pools[RoleKind.PULL]

        def pool_of(kind: RoleKind, member_zero_only: bool) -> _Pool:
            """The pool a route names, resolved against this topology (empty ones replaced)."""
            if not pools[kind].role_ids:
                kind, member_zero_only = DEFAULT_ROUTE
            if kind is RoleKind.ADMIN and member_zero_only:
                return self.admin_zero_pool
            return pools[kind]

        default_pool = pool_of(*DEFAULT_ROUTE)
        self.pool_by_code: dict[int, _Pool] = {
            code: pool_of(*route) for code, route in ROUTES.items()
        }
        self.client_response_pool = pool_of(*CLIENT_RESPONSE_ROUTE)
        self.default_pool = default_pool
        self.inboxes = [
            Inbox(Ring.attach(spec.name), spec.producer) for spec in topology.rings_to(self.role_id)
        ]
        for inbox in self.inboxes:
            inbox.on_quarantined = self._on_quarantined
        self.epoll = select.epoll()
        self.sleeper = Sleeper(self.epoll, self.inboxes, spin_ns_max)
        self.wakeup_fd = wakeup_fd
        if wakeup_fd is not None:
            self.epoll.register(wakeup_fd, select.EPOLLIN)
        self.control = ctx.control
        self.watcher = (
            control_block.ControlWatcher(ctx.control) if ctx.control is not None else None
        )
        self._backed_up = False  # set by _flush: an outbox holds over STAGED_SIZE_BYTES_HIGH
        self.connections: dict[int, ConnectionInfo] = {}
        # conn id -> opaque -> (slot, serving generation, serialize type)
        self.in_flight: dict[int, dict[int, tuple[int, int, int]]] = {}
        self._housekeeping_due_ns = time.monotonic_ns() + HOUSEKEEPING_INTERVAL_NS
        self._commands_routed = 0
        self._commands_by_slot = [0] * len(self.slot_role_ids)
        self._connections_opened = 0
        self._connections_closed = 0
        self._idle_closes = 0
        self._requests_failed = 0
        self._unexpected_errors = 0
        self.failures = resources.FailureLog(log)
        self._processor_restarts = 0
        self._turn_count = 0

    # -- the loop ---------------------------------------------------------------------------------

    def run_forever(self) -> NoReturn:
        runtime.run_until_stopped(self.run_once, self._flush)

    def run_once(self, timeout_ms: int) -> int:
        """One turn: control changes, every in-ring once, housekeeping when due, then a wait of
        up to timeout_ms (negative: no limit) for more, which returns at once while a ring is
        readable (codec.py's run_once says why in the same turn). Returns the parcels handled."""
        self._turn_count += 1
        if self.watcher is not None:
            for role_id in self.watcher.changed_nowait():
                self._on_generation_changed(role_id)
        work = 0
        if not self._backed_up:
            for inbox in self.inboxes:
                if inbox.ring.readable():
                    work += self._drain(inbox)
        now_ns = time.monotonic_ns()
        if now_ns >= self._housekeeping_due_ns:
            self._housekeeping_due_ns = now_ns + HOUSEKEEPING_INTERVAL_NS
            self.close_idle_connections(now_ns)
        all_written = self._flush()
        wait_ms = min(
            HOUSEKEEPING_INTERVAL_NS // 1_000_000, timeout_ms if timeout_ms >= 0 else 1000
        )
        if not all_written:
            wait_ms = min(wait_ms, BACKED_UP_RETRY_MS)
        for fd, _mask in self.sleeper.wait(wait_ms):
            if fd == self.wakeup_fd:
                runtime.clear_wakeup_nowait()
        return work

    def _flush(self) -> bool:
        """Write what the rings take; True if nothing is left staged. Notes whether an outbox is
        backed up past STAGED_SIZE_BYTES_HIGH, which stops the next turn's drains."""
        all_written = True
        backed_up = False
        for outbox in self.slot_outboxes:
            if outbox.pending_count and not outbox.flush_nowait():
                all_written = False
                backed_up = backed_up or outbox.pending_size_bytes > STAGED_SIZE_BYTES_HIGH
        self._backed_up = backed_up
        return all_written

    def _drain(self, inbox: Inbox) -> int:
        batch = inbox.drain_nowait(transport.BATCH_COUNT_MAX)
        handled = 0
        now_ns = time.monotonic_ns()
        for parcel_type, buffer, offset, size in inbox.parcels(batch, _FORWARDED_UNREAD):
            handled += 1
            if parcel_type in _COMMAND_TYPES:
                head_offset = parcels.command_head_offset(parcel_type, buffer, offset)
                try:
                    self._route(parcel_type, buffer, head_offset, offset, size, now_ns)
                except Exception as error:  # the boundary of the module docstring
                    self._on_route_failed(buffer, head_offset, error)
            elif parcel_type == parcels.COMPLETED:
                in_flight = self.in_flight
                for conn_id, opaque in parcels.unpack_completed(buffer, offset, size):
                    requests = in_flight.get(conn_id)
                    if requests is not None:
                        requests.pop(opaque, None)
            elif parcel_type == parcels.CONNECTION_OPENED:
                self._on_opened(buffer, offset, size, now_ns)
            elif parcel_type == parcels.CONNECTION_CLOSED:
                self._on_closed(buffer, offset, size)
            else:
                raise AssertionError(f"worker got parcel type {parcel_type} from {inbox.producer}")
        inbox.release(batch)
        return handled

    # -- routing ----------------------------------------------------------------------------------

    def _on_quarantined(self, parcel_type: int, buffer: Buffer, offset: int, size: int) -> None:
        """A parcel that stopped this role twice (transport.Inbox): answer it if a request."""
        failed = transport.quarantined_request_failed(parcel_type, buffer, offset, self.role_id)
        if failed is not None:
            self._send_request_failed(
                failed.conn_id, failed.opaque, failed.serialize_type, failed.remark
            )

    def _on_route_failed(self, buffer: Buffer, head_offset: int, error: Exception) -> None:
        """Routing the command at `head_offset` raised `error`: count, log, answer it."""
        self._unexpected_errors += 1
        self.failures.record("routing a command", error)
        conn_id, opaque, _code, flag, serialize_type = parcels.unpack_command_route(
            buffer, head_offset
        )
        if not flag & _FLAG_UNTRACKED:
            remark = f"mqbox: {self.role_id} failed on this request ({type(error).__name__})"
            self._send_request_failed(conn_id, opaque, serialize_type, remark)

    def _route(
        self,
        parcel_type: int,
        buffer: Buffer,
        head_offset: int,
        offset: int,
        size: int,
        now_ns: int,
    ) -> None:
        """Forward the COMMAND parcel at `offset` (its fixed head at `head_offset`: inside the
        spill payload for a SPILLED one, which goes on unread with its file)."""
        conn_id, opaque, code, flag, serialize_type = parcels.unpack_command_route(
            buffer, head_offset
        )
        if flag & FLAG_RESPONSE:
            pool = self.client_response_pool
        else:
            pool = self.pool_by_code.get(code, self.default_pool)
        index = conn_id % len(pool.outboxes)
        slot = pool.first_slot + index
        payload = memoryview(buffer)[offset : offset + size]
        tracked = not flag & _FLAG_UNTRACKED
        serving_generation = self._serving_generation(slot) if tracked else 0
        if parcel_type == parcels.COMMAND:
            if serving_generation:
                head_end = parcels.COMMAND_HEAD_SIZE_BYTES
                stamped = parcels.stamped_command_head(payload[:head_end], serving_generation)
                pool.outboxes[index].append(parcels.COMMAND, stamped, payload[head_end:])
            else:
                pool.outboxes[index].append(parcels.COMMAND, payload)
        else:
            pool.outboxes[index].append_spilled(parcel_type, payload)
        self._commands_routed += 1
        self._commands_by_slot[slot] += 1
        connection = self.connections.get(conn_id)
        if connection is not None:
            connection.last_activity_ns = now_ns
            connection.request_count += 1
            connection.idle_close_sent = False
        if not tracked:
            return
        requests = self.in_flight.get(conn_id)
        if requests is None:
            requests = self.in_flight[conn_id] = {}
        requests[opaque] = (slot, serving_generation, serialize_type)

    def _serving_generation(self, slot: int) -> int:
        """The generation of the process that will take a request sent to `slot` now."""
        if self.watcher is None:
            return 0
        generation = self.watcher.generation_seen(self.slot_role_ids[slot])
        return generation if generation % 2 == 1 else generation + 1

    # -- connections ------------------------------------------------------------------------------

    def _on_opened(self, buffer: Buffer, offset: int, size: int, now_ns: int) -> None:
        event = parcels.unpack_connection_event(buffer, offset)
        self.connections[event.conn_id] = ConnectionInfo(
            event.conn_id, event.peer_host, event.peer_port, event.time_ms, now_ns
        )
        self._connections_opened += 1
        self.admin_zero_pool.outboxes[0].append(
            parcels.CONNECTION_OPENED, memoryview(buffer)[offset : offset + size]
        )

    def _on_closed(self, buffer: Buffer, offset: int, size: int) -> None:
        conn_id = parcels.unpack_conn_id(buffer, offset)
        if self.connections.pop(conn_id, None) is not None:
            self._connections_closed += 1
        self.in_flight.pop(conn_id, None)
        payload = memoryview(buffer)[offset : offset + size]
        self.admin_zero_pool.outboxes[0].append(parcels.CONNECTION_CLOSED, payload)
        pull_outboxes = self.pull_pool.outboxes
        if pull_outboxes:
            # The pull processor that got this connection's pulls drops the ones it holds.
            pull_outboxes[conn_id % len(pull_outboxes)].append(parcels.CONNECTION_CLOSED, payload)

    def close_idle_connections(self, now_ns: int) -> int:
        """Ask (through an admin processor, codec and reactor) to close every connection idle for
        longer than connection_idle_ms; returns how many. Each is asked once per idle period."""
        deadline_ns = now_ns - self.connection_idle_ns
        closing = 0
        for connection in self.connections.values():
            if connection.last_activity_ns > deadline_ns or connection.idle_close_sent:
                continue
            connection.idle_close_sent = True
            connection.last_activity_ns = now_ns  # ask again after another idle period
            outbox = self.admin_pool.outboxes[connection.conn_id % len(self.admin_pool.outboxes)]
            outbox.append(
                parcels.CLOSE_CONNECTION,
                parcels.pack_close_connection(connection.conn_id, parcels.CLOSE_REASON_IDLE),
            )
            closing += 1
        self._idle_closes += closing
        return closing

    # -- processor restarts -----------------------------------------------------------------------

    def _on_generation_changed(self, role_id: str) -> None:
        if role_id not in self.slot_role_ids:
            return
        assert self.watcher is not None
        slot = self.slot_role_ids.index(role_id)
        generation = self.watcher.generation_seen(role_id)
        if generation % 2 == 0:
            self._processor_restarts += 1
        self._fail_in_flight(slot, lambda serving: serving < generation)

    def on_processor_restarted(self, role_id: str) -> int:
        """Answer SYSTEM_ERROR for every request in flight at `role_id`: its process died.
        Returns how many. The control block calls this path by itself; tests call it by hand."""
        slot = self.slot_role_ids.index(role_id)
        self._processor_restarts += 1
        return self._fail_in_flight(slot, lambda serving: True)

    def _fail_in_flight(self, slot: int, lost: Callable[[int], bool]) -> int:
        role_id = self.slot_role_ids[slot]
        remark = f"mqbox: processor {role_id} stopped while it held this request; try again"
        failed = 0
        for conn_id, requests in self.in_flight.items():
            doomed = [
                (opaque, serialize_type)
                for opaque, (request_slot, serving, serialize_type) in requests.items()
                if request_slot == slot and lost(serving)
            ]
            for opaque, serialize_type in doomed:
                del requests[opaque]
                self._send_request_failed(conn_id, opaque, serialize_type, remark)
                failed += 1
        self._requests_failed += failed
        return failed

    def _send_request_failed(
        self, conn_id: int, opaque: int, serialize_type: int, remark: str
    ) -> None:
        """Ask an admin processor to answer (conn_id, opaque) SYSTEM_ERROR with `remark`."""
        outbox = self.admin_pool.outboxes[conn_id % len(self.admin_pool.outboxes)]
        failed = parcels.RequestFailed(
            conn_id, opaque, ResponseCode.SYSTEM_ERROR, serialize_type, remark
        )
        outbox.append(parcels.REQUEST_FAILED, parcels.pack_request_failed(failed))

    def statistics(self) -> WorkerStatistics:
        by_kind: dict[str, int] = {}
        for slot, role_id in enumerate(self.slot_role_ids):
            kind = role_id.split(".", 1)[0]
            by_kind[kind] = by_kind.get(kind, 0) + self._commands_by_slot[slot]
        return WorkerStatistics(
            commands_routed=self._commands_routed,
            commands_by_kind=by_kind,
            connections_open=len(self.connections),
            connections_opened=self._connections_opened,
            connections_closed=self._connections_closed,
            idle_closes=self._idle_closes,
            in_flight=sum(len(requests) for requests in self.in_flight.values()),
            requests_failed=self._requests_failed,
            unexpected_errors=self._unexpected_errors,
            processor_restarts=self._processor_restarts,
            spill_count=self.spill_writer.spill_count,
            sleep_count=self.sleeper.sleep_count,
            turn_count=self._turn_count,
        )


def main(ctx: RoleContext) -> NoReturn:
    """The worker role: serve until SIGTERM, then finish the batch and exit (runtime.py)."""
    idle_ms = ctx.broker.limits.connection_idle_time_s * 1000
    worker = Worker(ctx, connection_idle_ms=idle_ms, wakeup_fd=runtime.wakeup_fileno())
    ctx.report_ready({"role": ctx.role.role_id, "pid": os.getpid()})
    worker.run_forever()
