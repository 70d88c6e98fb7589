"""The reactor role: owns every client socket of its share of the broker's connections.

Owns: accepting on the shared listening socket (several reactors accept on it; EPOLLEXCLUSIVE
wakes one of them per connection), the connection ids (parcels.py draws them), reading with a
bounded buffer per connection, cutting the byte stream into frames by their length prefix,
forwarding each complete frame to codec.(conn % C), writing responses from the codecs (queued per
connection, with a bound), and os.sendfile of PULL bodies from its own read-only descriptors of
the commit-log segments. Never: decodes a header (the codec does), decides anything about a
request, writes to the store, or blocks anywhere but in its one epoll.

Invariants:
- Frames of one connection reach the codec in the order they arrived, after its
  CONNECTION_OPENED and before its CONNECTION_CLOSED (one ring per codec, written in order).
- A connection's buffered input never exceeds one maximal frame plus one read: the length
  prefix is checked (protocol.frame.check_frame_length) before the rest of a frame is awaited.
  A bad length closes that connection only, after the frames before it were forwarded.
- All connections' buffered input together stays within this reactor's share of
  mqboxPartialFrameBytesMax plus one read (READ_SIZE_BYTES) per connection: a frame longer
  than one read is buffered only under a reservation of its whole length, granted while the
  reservations fit the share (or when none is held, so any one frame can complete); without it
  the connection is not read (BLOCK_PARTIAL) until reservations are released, and waiting
  connections are granted in the order they began to wait. A reservation is released when its
  frame is forwarded or its connection closes. Before, each connection could hold 16 MiB: 16
  connections that sent most of a 12 MB frame and stopped grew the reactor by 193 MiB. Such a
  connection sends no request, so the worker's idle close ends it.
- A connection has at most mqboxConnectionInFlightCountMax requests in flight: frames
  forwarded minus answers (RESPONSE parcels not flagged REPLY_FLAG_REQUEST) minus the frames the
  codec reported nobody answers (NO_ANSWER). At the limit the next frame stays in `pending` and
  the socket is not read (BLOCK_IN_FLIGHT); forwarding resumes once half of them are answered.
  So a client that pipelines without waiting has at most that many requests in the rings and
  processors, and others' requests wait behind that many of its own, not behind all it sent (a
  thousand pipelined heartbeats kept another client's request waiting 2.1 s). A request lost
  without an answer (its spill file gone in a crash) keeps the count one higher; a connection
  stuck at the limit that way sends no request, and the worker's idle close ends it.
- Output: once a connection's queued output (inline bytes and sendfile runs) passes
  mqboxConnectionOutputBytesMax its socket is not read (BLOCK_OUTPUT) until the output is back
  under it, so a client that does not read its answers stops getting new requests served; with
  the in-flight limit, what it can still be owed is bounded. The inline bytes of all its
  connections (the memory; runs are only descriptors of the commit log) stay within this
  reactor's share of mqboxResponseBufferBytesMax: past it, the connections holding the most are
  closed (CLOSE_REASON_SLOW_READER, a warning every 10 s at most). Before, each connection could
  hold 64 MiB: six that never read grew the reactor by 231 MiB. An idle close
  (CLOSE_REASON_IDLE) of a connection with output still queued closes it at once: a client
  that read nothing for serverChannelMaxIdleTimeSeconds will not read it.
- Every closed connection produces exactly one CONNECTION_CLOSED, which the codec forwards to
  the worker; a CLOSE_CONNECTION for an id this reactor does not know produces one too, so the
  tables of a reactor's predecessor drain away.
- It holds at most its share of mqboxConnectionCountMax (the key divided by the reactor count,
  rounded up): a connection past it is accepted and closed at once, never registered, and the
  log says so at most every 10 s. Out of descriptors (accept fails with EMFILE, ENFILE, ENOBUFS
  or ENOMEM) the listening socket leaves the epoll for ACCEPT_BACKOFF_NS (mqbox/resources.py):
  with a full backlog it stays readable, and polling it again at once is a loop at 100 % of a
  core that serves nobody. The supervisor raised the soft descriptor limit to the hard one.

Theory of operation: one loop; each turn drains the response rings (at most BATCH_COUNT_MAX
parcels each), writes what it can, handles the epoll events of the sockets, then writes the
staged FRAME parcels to the codec rings in one batch per ring. Sockets and ring doorbells share
the one epoll (transport.Sleeper), so a response wakes the reactor the same way a request does.
Descriptor numbers of segments mean nothing in another process (docs/style.md section 9), so each
reactor opens the segments itself, caches one descriptor per segment, and closes a descriptor
whose file was deleted (retention), so the disk space is freed.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import select
import socket
import time
from typing import Final, NoReturn

from mqbox.clock import wall_clock_ms
from mqbox.ipc.ring import Ring
from mqbox.protocol.errors import RemoteProtocolError
from mqbox.protocol.frame import (
    FRAME_LENGTH,
    FRAME_LENGTH_MIN,
    FRAME_LENGTH_SIZE_BYTES,
    FRAME_SIZE_BYTES_MAX_DEFAULT,
    check_frame_length,
)
from mqbox.resources import AcceptBackoff, RateLimitedLog, accept_out_of_resources
from mqbox.server import parcels, runtime, transport
from mqbox.server.parcels import Buffer
from mqbox.server.runtime import RoleContext
from mqbox.server.topology import RoleKind
from mqbox.server.transport import Inbox, Outbox, Sleeper, SpillBudget, SpillWriter
from mqbox.store import layout as store_layout

log = logging.getLogger("mqbox.reactor")

READ_SIZE_BYTES: Final = 256 * 1024  # one recv per readable socket per turn
ACCEPT_COUNT_MAX: Final = 64  # accepts per turn, so a connection storm cannot starve responses
# Above this many staged bytes toward the codecs the reactor stops reading sockets until the
# rings take them: TCP flow control then pushes back on the clients.
STAGED_SIZE_BYTES_HIGH: Final = 8 * 1024 * 1024
BACKED_UP_RETRY_MS: Final = 1
SPILL_RETRY_INTERVAL_NS: Final = 2_000_000  # a frame waiting for spill room looks this often
# Why a connection's socket is not read now (_Connection.read_blocks, bits); 0 means read it.
BLOCK_SPILL: Final = 1  # a whole frame waits in `pending` for room in the spill budget
BLOCK_PARTIAL: Final = 2  # a frame longer than one read waits for a reservation of its length
BLOCK_IN_FLIGHT: Final = 4  # mqboxConnectionInFlightCountMax requests are in flight
BLOCK_OUTPUT: Final = 8  # more than mqboxConnectionOutputBytesMax is queued for sending
HOUSEKEEPING_INTERVAL_NS: Final = 1_000_000_000
IOV_COUNT_MAX: Final = 512  # well below IOV_MAX (1024 on Linux)
_EPOLL_READ: Final = select.EPOLLIN | select.EPOLLRDHUP
_EPOLL_BROKEN: Final = select.EPOLLERR | select.EPOLLHUP
# EPOLLEXCLUSIVE: when several reactors wait on the one listening socket, a new connection wakes
# one of them, not all (Linux 4.5; the others' accept would only fail).
_EPOLL_LISTEN: Final = select.EPOLLIN | select.EPOLLEXCLUSIVE


@dataclasses.dataclass(slots=True)
class _FileRun:
    """A queued os.sendfile: `size` bytes from `file_offset` of the segment at segment_start."""

    segment_start: int
    file_offset: int
    size: int


class _Connection:
    __slots__ = (
        "close_reason",
        "conn_id",
        "conn_id_bytes",
        "events",
        "fd",
        "in_flight_count",
        "outbox",
        "output",
        "output_inline_size_bytes",
        "output_size_bytes",
        "peer_host",
        "peer_port",
        "pending",
        "read_blocks",
        "reserved_size_bytes",
        "sock",
        "wants_write",
    )

    def __init__(
        self, sock: socket.socket, conn_id: int, peer_host: str, peer_port: int, outbox: Outbox
    ) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.conn_id = conn_id
        self.conn_id_bytes = parcels.pack_conn_id(conn_id)
        self.peer_host = peer_host
        self.peer_port = peer_port
        self.outbox = outbox  # toward codec.(conn % C)
        self.pending = bytearray()  # the start of a frame whose end has not arrived
        self.output: collections.deque[Buffer | _FileRun] = collections.deque()
        self.output_size_bytes = 0  # queued: inline bytes and sendfile runs
        self.output_inline_size_bytes = 0  # queued bytes held in memory
        self.events = _EPOLL_READ  # as registered in the epoll: _Reactor._update_events
        self.read_blocks = 0  # BLOCK_* bits: why the socket is not read now
        self.reserved_size_bytes = 0  # of the partial-frame budget, for the frame `pending` begins
        self.in_flight_count = 0  # frames forwarded that await an answer (module docstring)
        self.wants_write = False  # the socket took less than offered: wait for EPOLLOUT
        self.close_reason: int | None = None  # set: close once the output is written


@dataclasses.dataclass(frozen=True, slots=True)
class ReactorStatistics:
    connections_accepted: int
    connections_refused: int  # past the connection cap: closed at accept
    accept_backoffs: int  # rests of the listening socket after EMFILE and friends
    connections_open: int
    connections_closed: int
    protocol_closes: int
    slow_reader_closes: int
    spill_waits: int  # frames that waited for room in the spill budget
    partial_frame_waits: int  # frames that waited for a reservation of the partial-frame budget
    partial_frame_reserved_bytes: int  # reserved now
    in_flight_waits: int  # times a connection reached its in-flight limit
    frames_received: int
    bytes_received: int
    responses_written: int
    bytes_written: int
    sendfile_bytes: int
    responses_dropped: int  # for connections already closed
    spill_count: int
    sleep_count: int
    turn_count: int


class Reactor:
    """One reactor process's state. `run_forever()` is the role; tests drive `run_once()`."""

    def __init__(
        self,
        ctx: RoleContext,
        *,
        connection_output_size_bytes_max: int | None = None,
        response_buffer_size_bytes_max: int | None = None,
        frame_size_bytes_max: int = FRAME_SIZE_BYTES_MAX_DEFAULT,
        spin_ns_max: int = transport.REQUEST_SPIN_NS_MAX,
        wakeup_fd: int | None = None,
    ) -> None:
        assert ctx.role.kind is RoleKind.REACTOR
        assert ctx.role.index < parcels.REACTOR_COUNT_MAX
        self.role_id = ctx.role.role_id
        self.index = ctx.role.index
        self.frame_size_bytes_max = frame_size_bytes_max
        self.commit_log_dir = store_layout.commit_log_dir(ctx.store_root)
        self.generation = os.getpid()
        self._conn_counter = 0
        topology = ctx.topology
        # The broker's limits (config.LimitConfig); per-reactor ones are this reactor's share.
        limits = ctx.broker.limits
        reactor_count = len(topology.roles_of(RoleKind.REACTOR))
        self.connection_count_max = -(-limits.connection_count_max // reactor_count)
        self.connection_output_size_bytes_max = (
            connection_output_size_bytes_max or limits.connection_output_size_bytes_max
        )
        self.response_buffer_size_bytes_max = response_buffer_size_bytes_max or -(
            -limits.response_buffer_size_bytes_max // reactor_count
        )
        self._output_inline_size_bytes = 0  # of every connection
        self._slow_reader_log = RateLimitedLog(log)
        spill_writer = SpillWriter(ctx.instance, self.role_id)
        self.spill_writer = spill_writer
        self.spill_budget = SpillBudget(ctx.instance, limits.spill_size_bytes_max)
        # Connections whose next frame waits for spill room, in the order they began to wait.
        self._spill_waiters: dict[int, _Connection] = {}
        self._spill_retry_due_ns = 0
        self._spill_waits = 0
        self.partial_frame_size_bytes_max = -(-limits.partial_frame_size_bytes_max // reactor_count)
        self._reserved_size_bytes = 0
        # Connections waiting for a reservation, in the order they began to wait.
        self._reservation_waiters: dict[int, _Connection] = {}
        self._partial_frame_waits = 0
        self.in_flight_count_max = limits.connection_in_flight_count_max
        # Connections blocked at the in-flight limit that may forward again (half answered).
        self._in_flight_ready: dict[int, _Connection] = {}
        self._in_flight_waits = 0
        codec_ids = [role.role_id for role in topology.roles_of(RoleKind.CODEC)]
        assert codec_ids, "a broker has at least one codec"
        self.outboxes = [
            Outbox(Ring.attach(topology.ring(self.role_id, codec_id).name), spill_writer)
            for codec_id in codec_ids
        ]
        self.inboxes = [
            Inbox(Ring.attach(spec.name), spec.producer) for spec in topology.rings_to(self.role_id)
        ]
        self.listen_socket: socket.socket = ctx.listen_socket
        self.listen_socket.setblocking(False)
        self.listen_fd = self.listen_socket.fileno()
        self.epoll = select.epoll()
        self.epoll.register(self.listen_fd, _EPOLL_LISTEN)
        self._accept_backoff = AcceptBackoff(log)
        self._refused_log = RateLimitedLog(log)
        self.sleeper = Sleeper(
            self.epoll, self.inboxes, spin_ns_max, poll_sockets_while_spinning=True
        )
        self.wakeup_fd = wakeup_fd  # runtime.wakeup_fileno(): readable after SIGTERM, SIGUSR1
        if wakeup_fd is not None:
            self.epoll.register(wakeup_fd, select.EPOLLIN)
        self.connections: dict[int, _Connection] = {}
        self._by_fd: dict[int, _Connection] = {}
        self._segment_fds: dict[int, int] = {}
        self._scratch = bytearray(READ_SIZE_BYTES)
        self._scratch_view = memoryview(self._scratch)
        self._touched: dict[int, _Connection] = {}
        self._housekeeping_due_ns = time.monotonic_ns() + HOUSEKEEPING_INTERVAL_NS
        self._connections_accepted = 0
        self._connections_refused = 0
        self._connections_closed = 0
        self._protocol_closes = 0
        self._slow_reader_closes = 0
        self._frames_received = 0
        self._frames_received_at_wait = 0
        # Requests in flight over all connections (the sum of their in_flight_count): while
        # any is, the Sleeper spins on its budget for answers (transport.py, "Spinning").
        self._in_flight_total = 0
        self._bytes_received = 0
        self._responses_written = 0
        self._bytes_written = 0
        self._sendfile_bytes = 0
        self._responses_dropped = 0
        self._turn_count = 0

    # -- the loop ---------------------------------------------------------------------------------

    def run_forever(self) -> NoReturn:
        runtime.run_until_stopped(self.run_once, self._flush_all)

    def run_once(self, timeout_ms: int) -> int:
        """One turn: responses out, socket events in, frames to the codecs. Returns how many
        parcels and events it handled; waits up to timeout_ms (negative: no limit) only when
        there was nothing to do."""
        self._turn_count += 1
        work = self._drain_responses()
        backed_up = self._flush_outboxes()
        if work or backed_up:
            wait_ms = 0 if work else BACKED_UP_RETRY_MS
            if timeout_ms >= 0:
                wait_ms = min(wait_ms, timeout_ms)
        else:
            wait_ms = timeout_ms
        now_ns = time.monotonic_ns()
        if now_ns >= self._housekeeping_due_ns:
            self._housekeeping_due_ns = now_ns + HOUSEKEEPING_INTERVAL_NS
            self._close_deleted_segments()
        if wait_ms < 0 or wait_ms > 1000:
            wait_ms = 1000  # wake at least once a second for housekeeping
        if self._spill_waiters and not backed_up:
            if now_ns >= self._spill_retry_due_ns:
                self._spill_retry_due_ns = now_ns + SPILL_RETRY_INTERVAL_NS
                self._retry_spill_waiters()
            wait_ms = min(wait_ms, -(-SPILL_RETRY_INTERVAL_NS // 1_000_000))
        if self._accept_backoff.resume_due(now_ns):
            self.epoll.register(self.listen_fd, _EPOLL_LISTEN)
        resume_in_ms = self._accept_backoff.resume_in_ms(now_ns)
        if resume_in_ms is not None:
            wait_ms = min(wait_ms, resume_in_ms)
        # Frames read from sockets are work the Sleeper's rings do not count: many of them mean
        # batch mode, where spinning before a sleep only takes a core from the codecs.
        frame_count = self._frames_received - self._frames_received_at_wait
        self._frames_received_at_wait = self._frames_received
        assert self._in_flight_total >= 0
        events = self.sleeper.wait(wait_ms, frame_count, awaiting=self._in_flight_total > 0)
        for fd, mask in events:
            if fd == self.listen_fd:
                self._accept()
                continue
            connection = self._by_fd.get(fd)
            if connection is None:
                if fd == self.wakeup_fd:
                    runtime.clear_wakeup_nowait()
                continue  # a doorbell (drained next turn) or a connection closed this turn
            work += 1
            if mask & select.EPOLLOUT:
                self._write(connection)
                if connection.fd < 0:
                    continue
            if connection.read_blocks:
                if mask & _EPOLL_BROKEN:
                    # Hung up or failed while not being read: nothing more can be done for it,
                    # and a level-triggered hang-up would wake every turn.
                    self._close(connection, parcels.CLOSE_REASON_PEER)
                continue
            if mask & (_EPOLL_READ | _EPOLL_BROKEN) and not backed_up:
                self._read(connection)
        self._flush_outboxes()
        return work

    # -- accepting --------------------------------------------------------------------------------

    def _accept(self) -> None:
        for _ in range(ACCEPT_COUNT_MAX):
            try:
                sock, address = self.listen_socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                if accept_out_of_resources(error):
                    self._accept_backoff.rest(error, len(self.connections))
                    self.epoll.unregister(self.listen_fd)  # module docstring
                # ECONNABORTED and friends: the peer left before we accepted. Both are
                # operating conditions.
                return
            if len(self.connections) >= self.connection_count_max:
                self._connections_refused += 1
                self._refused_log.warning(
                    "refusing %s: %d connections open, this reactor's share of "
                    "mqboxConnectionCountMax is %d",
                    address,
                    len(self.connections),
                    self.connection_count_max,
                )
                sock.close()
                continue
            sock.setblocking(False)
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer_host, peer_port = (
                (address[0], address[1]) if isinstance(address, tuple) else ("", 0)
            )
            self._conn_counter = self._conn_counter % parcels.CONN_ID_COUNTER_MASK + 1
            conn_id = parcels.make_conn_id(self.index, self.generation, self._conn_counter)
            outbox = self.outboxes[conn_id % len(self.outboxes)]
            connection = _Connection(sock, conn_id, peer_host, peer_port, outbox)
            self.connections[conn_id] = connection
            self._by_fd[connection.fd] = connection
            self.epoll.register(connection.fd, _EPOLL_READ)
            self._connections_accepted += 1
            event = parcels.ConnectionEvent(conn_id, wall_clock_ms(), peer_host, peer_port)
            outbox.append(parcels.CONNECTION_OPENED, parcels.pack_connection_event(event))

    # -- reading ----------------------------------------------------------------------------------

    def _read(self, connection: _Connection) -> None:
        try:
            size_bytes = connection.sock.recv_into(self._scratch_view)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(connection, parcels.CLOSE_REASON_PEER)
            return
        if size_bytes == 0:
            self._close(connection, parcels.CLOSE_REASON_PEER)
            return
        self._bytes_received += size_bytes
        pending = connection.pending
        if pending:
            pending += self._scratch_view[:size_bytes]
            with memoryview(pending) as view:
                end = self._forward_frames(connection, view)
            if end >= 0:
                del pending[:end]
        else:
            view = self._scratch_view[:size_bytes]
            end = self._forward_frames(connection, view)
            if 0 <= end < size_bytes:
                pending += view[end:]
        if end < 0:
            self._protocol_closes += 1
            self._close(connection, parcels.CLOSE_REASON_PROTOCOL)
            return
        self._reserve(connection)
        if connection.read_blocks:
            self._update_events(connection)

    def _reserve(self, connection: _Connection) -> None:
        """Hold the partial-frame budget for the frame `pending` begins, or block reading the
        connection until it can be held (module docstring); release what is no longer needed."""
        pending = connection.pending
        needed_bytes = 0
        if len(pending) >= FRAME_LENGTH_SIZE_BYTES:
            (frame_length,) = FRAME_LENGTH.unpack_from(pending, 0)
            frame_size_bytes = FRAME_LENGTH_SIZE_BYTES + frame_length
            if frame_size_bytes > READ_SIZE_BYTES:
                needed_bytes = frame_size_bytes
        held_bytes = connection.reserved_size_bytes
        if needed_bytes <= held_bytes:
            if needed_bytes < held_bytes:
                connection.reserved_size_bytes = needed_bytes
                self._reserved_size_bytes -= held_bytes - needed_bytes
                self._grant_reservations()
            return
        others_bytes = self._reserved_size_bytes - held_bytes
        if others_bytes and others_bytes + needed_bytes > self.partial_frame_size_bytes_max:
            if connection.conn_id not in self._reservation_waiters:
                self._reservation_waiters[connection.conn_id] = connection
                self._partial_frame_waits += 1
            connection.read_blocks |= BLOCK_PARTIAL
            return
        connection.reserved_size_bytes = needed_bytes
        self._reserved_size_bytes = others_bytes + needed_bytes

    def _grant_reservations(self) -> None:
        """Give released budget to the waiting connections, oldest first; the first that does
        not fit waits on, and so do those after it (a big frame is not overtaken forever)."""
        for conn_id, connection in list(self._reservation_waiters.items()):
            connection.read_blocks &= ~BLOCK_PARTIAL
            self._reserve(connection)  # sets the bit again if it still does not fit
            if connection.read_blocks & BLOCK_PARTIAL:
                return
            del self._reservation_waiters[conn_id]
            self._update_events(connection)

    def _retry_spill_waiters(self) -> None:
        """Forward the frames that waited for spill room, oldest waiter first, until one must
        wait again (the budget is full); those forwarded read their sockets again."""
        for conn_id, connection in list(self._spill_waiters.items()):
            del self._spill_waiters[conn_id]
            self._resume_forwarding(connection, BLOCK_SPILL)
            if connection.read_blocks & BLOCK_SPILL:
                return

    def _resume_forwarding(self, connection: _Connection, block: int) -> None:
        """Clear `block` and forward the whole frames `pending` holds; the socket is read again
        if nothing else blocks it."""
        connection.read_blocks &= ~block
        pending = connection.pending
        with memoryview(pending) as view:
            end = self._forward_frames(connection, view)
        if end < 0:  # a bad length after the frame that waited
            self._protocol_closes += 1
            self._close(connection, parcels.CLOSE_REASON_PROTOCOL)
            return
        del pending[:end]
        self._reserve(connection)
        self._update_events(connection)

    def _answered(self, connection: _Connection, count: int) -> None:
        """`count` of the connection's requests in flight were answered (or need no answer)."""
        in_flight_count = max(0, connection.in_flight_count - count)
        self._in_flight_total -= connection.in_flight_count - in_flight_count
        connection.in_flight_count = in_flight_count
        if (
            connection.read_blocks & BLOCK_IN_FLIGHT
            and in_flight_count <= self.in_flight_count_max // 2
        ):
            self._in_flight_ready[connection.conn_id] = connection

    def _forward_frames(self, connection: _Connection, view: memoryview) -> int:
        """Stage a FRAME parcel for each complete frame at the start of `view`; returns the
        bytes consumed, or -1 if a length prefix is bad (the frames before it are staged). A
        frame that would spill waits for room in the spill budget: it is not consumed, and the
        connection is blocked (BLOCK_SPILL) until `_retry_spill_waiters` forwards it. Likewise
        a frame past the in-flight limit (BLOCK_IN_FLIGHT), until half of them are answered."""
        position = 0
        available = len(view)
        outbox = connection.outbox
        conn_id_bytes = connection.conn_id_bytes
        frame_size_bytes_max = self.frame_size_bytes_max
        frame_count = 0
        frame_count_max = self.in_flight_count_max - connection.in_flight_count
        while available - position >= FRAME_LENGTH_SIZE_BYTES:
            (frame_length,) = FRAME_LENGTH.unpack_from(view, position)
            end = position + FRAME_LENGTH_SIZE_BYTES + frame_length
            # frame.check_frame_length's rules, inline; it is called only to confirm a refusal.
            if frame_length < FRAME_LENGTH_MIN or end - position > frame_size_bytes_max:
                try:
                    check_frame_length(frame_length, frame_size_bytes_max)
                except RemoteProtocolError:
                    self._frames_received += frame_count
                    connection.in_flight_count += frame_count
                    self._in_flight_total += frame_count
                    return -1
                raise AssertionError("check_frame_length accepted a refused length")
            if end > available:
                break
            if frame_count >= frame_count_max:
                connection.read_blocks |= BLOCK_IN_FLIGHT
                self._in_flight_waits += 1
                break
            parcel_size_bytes = parcels.CONN_ID_SIZE_BYTES + end - position
            if parcel_size_bytes > outbox.payload_size_bytes_max and not (
                self.spill_budget.has_room_nowait(parcel_size_bytes)
            ):
                connection.read_blocks |= BLOCK_SPILL
                self._spill_waiters[connection.conn_id] = connection
                self._spill_waits += 1
                break
            outbox.append(parcels.FRAME, conn_id_bytes, view[position:end])
            frame_count += 1
            position = end
        self._frames_received += frame_count
        connection.in_flight_count += frame_count
        self._in_flight_total += frame_count
        return position

    # -- writing ----------------------------------------------------------------------------------

    def _drain_responses(self) -> int:
        """Queue every RESPONSE drained this turn on its connection, write them, then copy what
        the sockets did not take out of the rings before releasing the batches."""
        handled = 0
        touched = self._touched
        for inbox in self.inboxes:
            if not inbox.ring.readable():
                continue
            batch = inbox.drain_nowait(transport.BATCH_COUNT_MAX)
            for parcel_type, buffer, offset, size in inbox.parcels(batch):
                handled += 1
                if parcel_type == parcels.RESPONSE:
                    self._queue_response(buffer, offset, size, touched)
                elif parcel_type == parcels.NO_ANSWER:
                    conn_id, count = parcels.unpack_no_answer(buffer, offset)
                    connection = self.connections.get(conn_id)
                    if connection is not None:
                        self._answered(connection, count)
                elif parcel_type == parcels.CLOSE_CONNECTION:
                    conn_id, reason = parcels.unpack_close_connection(buffer, offset)
                    self._close_requested(conn_id, reason, touched)
                else:
                    raise AssertionError(f"reactor got parcel type {parcel_type} from a codec")
            for connection in touched.values():
                if connection.fd >= 0:
                    self._write(connection)
                if (
                    connection.output_size_bytes > self.connection_output_size_bytes_max
                    and connection.fd >= 0
                    and not connection.read_blocks & BLOCK_OUTPUT
                ):
                    connection.read_blocks |= BLOCK_OUTPUT
                    self._update_events(connection)
                if connection.output:
                    connection.output = collections.deque(
                        bytes(item) if isinstance(item, memoryview) else item
                        for item in connection.output
                    )
            touched.clear()
            inbox.release(batch)
        if self._in_flight_ready:
            for connection in self._in_flight_ready.values():
                if connection.fd >= 0:
                    self._resume_forwarding(connection, BLOCK_IN_FLIGHT)
            self._in_flight_ready.clear()
        if self._output_inline_size_bytes > self.response_buffer_size_bytes_max:
            self._close_greediest()
        return handled

    def _close_greediest(self) -> None:
        """Past this reactor's response budget: close the connections that hold the most
        unsent answers until the rest fit (module docstring)."""
        greediest_first = sorted(
            self.connections.values(),
            key=lambda connection: connection.output_inline_size_bytes,
            reverse=True,
        )
        for connection in greediest_first:
            if self._output_inline_size_bytes <= self.response_buffer_size_bytes_max:
                return
            self._slow_reader_log.warning(
                "closing %s:%d: %d bytes of answers unread, %d for all connections, more than "
                "this reactor's share of mqboxResponseBufferBytesMax (%d)",
                connection.peer_host,
                connection.peer_port,
                connection.output_inline_size_bytes,
                self._output_inline_size_bytes,
                self.response_buffer_size_bytes_max,
            )
            self._slow_reader_closes += 1
            self._close(connection, parcels.CLOSE_REASON_SLOW_READER)

    def _queue_response(
        self, buffer: Buffer, offset: int, size: int, touched: dict[int, _Connection]
    ) -> None:
        conn_id, run_count, flags = parcels.unpack_response_head(buffer, offset)
        connection = self.connections.get(conn_id)
        if connection is None or connection.close_reason is not None:
            self._responses_dropped += 1
            return
        if not flags & parcels.REPLY_FLAG_REQUEST:
            # _answered(connection, 1), inline: once per response.
            in_flight_count = connection.in_flight_count - 1
            if in_flight_count >= 0:
                self._in_flight_total -= 1
            connection.in_flight_count = in_flight_count if in_flight_count > 0 else 0
            if connection.read_blocks & BLOCK_IN_FLIGHT:
                self._answered(connection, 0)
        runs_offset = offset + parcels.RESPONSE_HEAD_SIZE_BYTES
        bytes_offset = runs_offset + run_count * parcels.RUN_SIZE_BYTES
        end = offset + size
        assert bytes_offset < end, "a response has at least a frame prefix"
        view = memoryview(buffer)[bytes_offset:end]
        connection.output.append(view)
        connection.output_size_bytes += len(view)
        connection.output_inline_size_bytes += len(view)
        self._output_inline_size_bytes += len(view)
        if run_count:
            for run in parcels.unpack_runs(buffer, runs_offset, run_count):
                connection.output.append(_FileRun(run.segment_start, run.file_offset, run.size))
                connection.output_size_bytes += run.size
        self._responses_written += 1
        if flags & parcels.REPLY_FLAG_CLOSE_AFTER:
            connection.close_reason = parcels.CLOSE_REASON_REQUESTED
        touched[conn_id] = connection

    def _close_requested(self, conn_id: int, reason: int, touched: dict[int, _Connection]) -> None:
        connection = self.connections.get(conn_id)
        if connection is None:
            # Not ours (any more): answer with a CLOSED anyway, so the tables upstream let go.
            event = parcels.ConnectionEvent(
                conn_id, wall_clock_ms(), "", 0, parcels.CLOSE_REASON_UNKNOWN
            )
            outbox = self.outboxes[conn_id % len(self.outboxes)]
            outbox.append(parcels.CONNECTION_CLOSED, parcels.pack_connection_event(event))
            return
        if reason == parcels.CLOSE_REASON_IDLE and connection.output:
            self._close(connection, reason)  # idle that long, it will not read (module docstring)
            return
        if connection.close_reason is None:
            connection.close_reason = reason
        touched[conn_id] = connection

    def _write(self, connection: _Connection) -> None:
        """Write the connection's queued output until the socket stops taking it."""
        output = connection.output
        sock = connection.sock
        while output:
            item = output[0]
            if isinstance(item, _FileRun):
                if not self._sendfile(connection, item):
                    return
                output.popleft()
                continue
            buffers: list[Buffer] = []
            for queued in output:
                if isinstance(queued, _FileRun) or len(buffers) == IOV_COUNT_MAX:
                    break
                buffers.append(queued)
            try:
                sent = sock.sendmsg(buffers) if len(buffers) > 1 else sock.send(buffers[0])
            except (BlockingIOError, InterruptedError):
                self._want_write(connection)
                return
            except OSError:
                self._close(connection, parcels.CLOSE_REASON_PEER)
                return
            self._bytes_written += sent
            connection.output_size_bytes -= sent
            connection.output_inline_size_bytes -= sent
            self._output_inline_size_bytes -= sent
            while sent:
                head = output[0]
                assert not isinstance(head, _FileRun)
                if sent >= len(head):
                    sent -= len(head)
                    output.popleft()
                else:
                    output[0] = memoryview(head)[sent:]
                    sent = 0
            if output and not isinstance(output[0], _FileRun):
                self._want_write(connection)  # the socket took less than offered
                return
        # Everything is written.
        assert connection.output_size_bytes == 0
        assert connection.output_inline_size_bytes == 0
        if connection.close_reason is not None:
            self._close(connection, connection.close_reason)
            return
        if connection.wants_write or connection.read_blocks & BLOCK_OUTPUT:
            connection.wants_write = False
            connection.read_blocks &= ~BLOCK_OUTPUT
            self._update_events(connection)

    def _want_write(self, connection: _Connection) -> None:
        """The socket took less than offered: wait until it is writable, and read requests
        again if the output fell back under mqboxConnectionOutputBytesMax."""
        events_changed = not connection.wants_write
        connection.wants_write = True
        if (
            connection.read_blocks & BLOCK_OUTPUT
            and connection.output_size_bytes <= self.connection_output_size_bytes_max
        ):
            connection.read_blocks &= ~BLOCK_OUTPUT
            events_changed = True
        if events_changed:
            self._update_events(connection)

    def _update_events(self, connection: _Connection) -> None:
        """Register what the connection waits for: readable unless a BLOCK_* bit is set,
        writable while output waits. Hang-ups and errors are reported either way."""
        events = 0 if connection.read_blocks else _EPOLL_READ
        if connection.wants_write:
            events |= select.EPOLLOUT
        if events != connection.events:
            connection.events = events
            self.epoll.modify(connection.fd, events)

    def _sendfile(self, connection: _Connection, run: _FileRun) -> bool:
        """Send what the socket takes of `run`; True when it is all sent."""
        segment_fd = self._segment_fd(run.segment_start)
        if segment_fd < 0:
            self._close(connection, parcels.CLOSE_REASON_READ_PLAN_GONE)
            return False
        while run.size:
            try:
                sent = os.sendfile(connection.fd, segment_fd, run.file_offset, run.size)
            except (BlockingIOError, InterruptedError):
                self._want_write(connection)
                return False
            except OSError:
                self._close(connection, parcels.CLOSE_REASON_PEER)
                return False
            if sent == 0:
                # The segment is shorter than the plan said: the frame cannot be completed.
                self._close(connection, parcels.CLOSE_REASON_READ_PLAN_GONE)
                return False
            run.file_offset += sent
            run.size -= sent
            connection.output_size_bytes -= sent
            self._bytes_written += sent
            self._sendfile_bytes += sent
        return True

    def _segment_fd(self, segment_start: int) -> int:
        """This reactor's read-only descriptor of a commit-log segment, or -1 if it is gone."""
        fd = self._segment_fds.get(segment_start)
        if fd is not None:
            if os.fstat(fd).st_nlink > 0:
                return fd
            os.close(fd)  # deleted: reopen by name, so a deleted file is not kept alive
            del self._segment_fds[segment_start]
        path = self.commit_log_dir / store_layout.segment_name(segment_start)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return -1
        self._segment_fds[segment_start] = fd
        return fd

    def _close_deleted_segments(self) -> None:
        for segment_start, fd in list(self._segment_fds.items()):
            if os.fstat(fd).st_nlink == 0:
                os.close(fd)
                del self._segment_fds[segment_start]

    # -- closing ----------------------------------------------------------------------------------

    def _close(self, connection: _Connection, reason: int) -> None:
        if connection.fd < 0:
            return
        self.epoll.unregister(connection.fd)
        del self._by_fd[connection.fd]
        del self.connections[connection.conn_id]
        self._in_flight_total -= connection.in_flight_count
        connection.in_flight_count = 0
        self._spill_waiters.pop(connection.conn_id, None)
        self._reservation_waiters.pop(connection.conn_id, None)
        connection.sock.close()
        connection.fd = -1
        connection.output.clear()
        connection.output_size_bytes = 0
        self._output_inline_size_bytes -= connection.output_inline_size_bytes
        connection.output_inline_size_bytes = 0
        connection.pending = bytearray()
        if connection.reserved_size_bytes:
            self._reserved_size_bytes -= connection.reserved_size_bytes
            connection.reserved_size_bytes = 0
            self._grant_reservations()
        self._connections_closed += 1
        event = parcels.ConnectionEvent(
            connection.conn_id,
            wall_clock_ms(),
            connection.peer_host,
            connection.peer_port,
            reason,
        )
        connection.outbox.append(parcels.CONNECTION_CLOSED, parcels.pack_connection_event(event))

    # -- rings ------------------------------------------------------------------------------------

    def _flush_all(self) -> None:
        """At an orderly stop: what is staged goes out once; the sockets close with the process."""
        self._flush_outboxes()

    def _flush_outboxes(self) -> bool:
        """Write the staged parcels; True if some ring is backed up past the high-water mark."""
        backed_up = False
        for outbox in self.outboxes:
            if outbox.pending_count and not outbox.flush_nowait():
                backed_up = backed_up or outbox.pending_size_bytes > STAGED_SIZE_BYTES_HIGH
        return backed_up

    def close(self) -> None:
        """Close every socket and descriptor this object opened (tests; a role just exits)."""
        for connection in list(self.connections.values()):
            self._close(connection, parcels.CLOSE_REASON_REQUESTED)
        for fd in self._segment_fds.values():
            os.close(fd)
        self._segment_fds.clear()
        self.epoll.close()

    def statistics(self) -> ReactorStatistics:
        return ReactorStatistics(
            connections_accepted=self._connections_accepted,
            connections_refused=self._connections_refused,
            accept_backoffs=self._accept_backoff.rest_count,
            connections_open=len(self.connections),
            connections_closed=self._connections_closed,
            protocol_closes=self._protocol_closes,
            slow_reader_closes=self._slow_reader_closes,
            spill_waits=self._spill_waits,
            partial_frame_waits=self._partial_frame_waits,
            partial_frame_reserved_bytes=self._reserved_size_bytes,
            in_flight_waits=self._in_flight_waits,
            frames_received=self._frames_received,
            bytes_received=self._bytes_received,
            responses_written=self._responses_written,
            bytes_written=self._bytes_written,
            sendfile_bytes=self._sendfile_bytes,
            responses_dropped=self._responses_dropped,
            spill_count=self.spill_writer.spill_count,
            sleep_count=self.sleeper.sleep_count,
            turn_count=self._turn_count,
        )


def main(ctx: RoleContext) -> NoReturn:
    """The reactor role: serve until SIGTERM, then finish the turn and exit (runtime.py)."""
    reactor = Reactor(ctx, wakeup_fd=runtime.wakeup_fileno())
    ctx.report_ready({"role": ctx.role.role_id, "pid": os.getpid()})
    reactor.run_forever()
