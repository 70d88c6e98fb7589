"""The HA service role of a master: serves its slaves the commit log (RocketMQ's HAService and
HAConnection; docs/replication.md).

Owns: the HA listening socket (bound by the supervisor on haListenPort, kept only here), one
connection per slave, the transfer of commit-log bytes from read-only maps of the segments, the
slaves' acknowledged positions, the replication line of store-positions (its only writer), and
run/replication.json with the slave's lag in bytes and in records (counted over its own log).
Tells the store writer (REPLICATED) when the greatest acknowledged position moves or the number
of slaves changes: SYNC_MASTER acks wait on it (an ASYNC_MASTER's store writer waits on no
report, so it is told the number of slaves alone, which saves it a wake-up per report).

Never: writes the commit log, decides an ack (the store writer does), or sends bytes past the
published write position (every byte below it is whole records or blanks).

Invariants:
- A frame carries bytes of one segment only, at most haTransferBatchSize of them, from the
  slave's next offset: the stream of one connection is the log, gapless, from where the slave
  first asked. Frames of a finished segment carry its blank and padding up to the segment's end,
  as RocketMQ's do.
- A slave whose report is past the master's write position is told the master's position (a
  heartbeat frame) and closed: it has bytes the master does not (it diverged; the slave side
  sees the heartbeat below its own position and stops).
- The acknowledged position published only grows, and never passes the write position.

Threads: one. The loop waits in one epoll on the listener, the slaves' sockets, the WRITTEN
ring's doorbell (new bytes to send) and the stop descriptor: up to IDLE_WAIT_MS while a slave is
connected (heartbeats, the silent-slave check, run/replication.json), and with none up to
HaLink's retention check (once a second: the store writer sends no WRITTEN then, a slave's
connection wakes the epoll), so a master without slaves costs one wake-up a second, not ten.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import select
import socket
import time
from typing import Final, NoReturn

from mqbox.clock import wall_clock_ms
from mqbox.config import BrokerRole
from mqbox.errors import StoreError
from mqbox.protocol.errors import RemoteProtocolError
from mqbox.protocol.ha import ReportReader, encode_transfer_header
from mqbox.run_files import write_json_atomically
from mqbox.server import parcels, runtime
from mqbox.server.home import HomeLayout
from mqbox.server.queue_counters import HA_MASTER
from mqbox.server.roles.ha_link import HaLink
from mqbox.server.runtime import RoleContext
from mqbox.server.topology import RoleKind
from mqbox.store.commit_log import CommitLog

log = logging.getLogger("mqbox.ha_service")

IDLE_WAIT_MS: Final = 100  # RocketMQ's transfer thread sleeps up to 100 ms with nothing to send
READ_SIZE_BYTES: Final = 64 * 1024
SLAVE_COUNT_MAX: Final = 16  # more connections are closed at accept
# Frames gathered into one sendmsg: fewer system calls per byte; the kernel copies straight
# from the commit log's map.
SEND_SIZE_BYTES_MAX: Final = 256 * 1024
SEND_FRAME_COUNT_MAX: Final = 64  # and at most this many frames (IOV_MAX is 1024 buffers)
# run/replication.json at most this often while the acknowledged position moves (a file write
# and rename per slave report cost the role more than the transfer); store-positions, which
# programs read, moves with every report.
STATUS_INTERVAL_NS: Final = 1_000_000_000
# An ASYNC_MASTER sends a caught-up slave new bytes at most this often: under single sends each
# transfer sets off a chain of wake-ups on both sides (this role, the slave's HA client, store
# writer and dispatcher, the report back), so one transfer per interval instead of one per
# append divides that chain among the messages of the interval. The first bytes after a quiet
# spell go at once; the slave's lag grows by at most this much. (RocketMQ's transfer thread
# waits up to 100 ms when caught up, woken early only under SYNC_MASTER.) A SYNC_MASTER sends at
# once: its acks wait on the slave.
ASYNC_TRANSFER_INTERVAL_NS: Final = 2_000_000


@dataclasses.dataclass(slots=True)
class _Slave:
    """One slave connection (HAConnection: its read and its write side)."""

    sock: socket.socket
    address: str
    reader: ReportReader
    last_read_ns: int
    last_write_ns: int
    next_log_offset_bytes: int = -1  # -1 until the first report
    acked_log_offset_bytes: int = 0
    # What is being written: frame headers and views of the commit log's map, the first one
    # possibly partly sent already.
    output: list[bytes | memoryview] = dataclasses.field(default_factory=list)
    close_after_output: bool = False
    want_write: bool = False  # EPOLLOUT registered
    gathered_ns: int = 0  # when frames were last gathered up to the write position
    sent_bytes: int = 0


class _RecordSpan:
    """The number of records in [start, end) of the commit log, kept as both ends move
    forward: each measure walks (CommitLog.count_records) the records that entered and left the
    span, or the whole span when that is less to walk. None when it cannot be counted (a
    segment of it is gone)."""

    def __init__(self, commit_log: CommitLog) -> None:
        self.commit_log = commit_log
        self.start_bytes = 0
        self.end_bytes = 0
        self.count: int | None = None

    def measure(self, start_bytes: int, end_bytes: int) -> int | None:
        assert start_bytes <= end_bytes
        if self.count is not None and (start_bytes, end_bytes) == (
            self.start_bytes,
            self.end_bytes,
        ):
            return self.count
        count = None
        moved_bytes = (end_bytes - self.end_bytes) + (start_bytes - self.start_bytes)
        if (
            self.count is not None
            and self.start_bytes <= start_bytes <= self.end_bytes <= end_bytes
            and moved_bytes < end_bytes - start_bytes
        ):
            entered = self.commit_log.count_records(self.end_bytes, end_bytes)
            left = self.commit_log.count_records(self.start_bytes, start_bytes)
            if entered is not None and left is not None:
                count = self.count + entered - left
        if count is None:
            count = self.commit_log.count_records(start_bytes, end_bytes)
        self.start_bytes, self.end_bytes, self.count = start_bytes, end_bytes, count
        return count


class HaService:
    """The role's state; `run_forever()` is the role, tests may drive `run_once()`."""

    def __init__(self, ctx: RoleContext, *, wakeup_fd: int | None = None) -> None:
        assert ctx.role.kind is RoleKind.HA_SERVICE
        broker = ctx.broker
        self.role_id = ctx.role.role_id
        self.layout = HomeLayout(ctx.home)
        self.batch_size_bytes = broker.ha_transfer_batch_size_bytes
        self.heartbeat_interval_ns = broker.ha_send_heartbeat_interval_ms * 1_000_000
        self.housekeeping_interval_ns = broker.ha_housekeeping_interval_ms * 1_000_000
        self.link = HaLink(ctx, wakeup_fd)
        self.positions = self.link.positions
        self.commit_log = self.link.commit_log
        self.segment_size_bytes = self.link.segment_size_bytes
        self.epoll = self.link.epoll
        self.listener: socket.socket = ctx.ha_socket
        assert self.listener is not None, "the supervisor binds a master's HA socket"
        self.listener.setblocking(False)
        self.epoll.register(self.listener.fileno(), select.EPOLLIN)
        self.slaves: dict[int, _Slave] = {}
        self.acked_log_offset_bytes = 0
        self.slave_reported = False  # until a slave reports, acked_log_offset_bytes means nothing
        self._lag = _RecordSpan(self.commit_log)
        self._told = (-1, -1)  # (acked, slave count) last sent to the store writer
        self._closed = False
        self._filed = (-1, -1)  # (acked, write position) of the last run/replication.json
        self._filed_ns = 0
        # ASYNC_MASTER: the store writer waits on no report, so it is told only of the slaves'
        # count, and new bytes go out at most every coalesce_ns.
        self.acks_wait = broker.broker_role is BrokerRole.SYNC_MASTER
        self.coalesce_ns = 0 if self.acks_wait else ASYNC_TRANSFER_INTERVAL_NS
        self._publish()

    # -- the loop ---------------------------------------------------------------------------------

    def run_forever(self) -> NoReturn:
        runtime.run_until_stopped(self.run_once, self.close)

    def run_once(self, timeout_ms: int) -> int:
        """One turn: take WRITTEN notices, serve every slave, tell the writer; sleep when idle."""
        work = self.link.drain_written()
        self.link.follow_retention_nowait()
        now_ns = time.monotonic_ns()
        write_bytes = self.positions.write_log_offset_bytes
        held_ns = 0  # how long until a slave whose new bytes are held back is due
        for slave in list(self.slaves.values()):
            due_ns = slave.gathered_ns + self.coalesce_ns
            if due_ns > now_ns and slave.next_log_offset_bytes < write_bytes:
                held_ns = min(held_ns or due_ns - now_ns, due_ns - now_ns)
                work += self._transfer(slave, slave.next_log_offset_bytes, now_ns)
            else:
                work += self._transfer(slave, write_bytes, now_ns)
            self._housekeep(slave, write_bytes, now_ns)
        self._tell_writer()
        self._file_if_due(write_bytes, now_ns)
        self.link.flush_nowait()
        # Reports are read every turn, busy or not: SYNC_MASTER acks wait on them.
        wait_ms = IDLE_WAIT_MS if self.slaves else self.link.retention_check_in_ms(now_ns)
        if timeout_ms >= 0:
            wait_ms = min(wait_ms, timeout_ms)
        if held_ns:
            # New bytes wait for their slave's interval: sleep on the sockets alone (the WRITTEN
            # ring is readable, which would end the Sleeper's wait at once).
            events = self.epoll.poll(held_ns / 1e9)
        else:
            events = self.link.sleeper.wait(0 if work else wait_ms)
        for fd, mask in events:
            if fd == self.link.wakeup_fd:
                runtime.clear_wakeup_nowait()
            elif fd == self.listener.fileno():
                self._accept()
            elif fd in self.slaves:
                slave = self.slaves[fd]
                if mask & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR):
                    self._read(slave, write_bytes)
        return work

    # -- connections ------------------------------------------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                sock, peer = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                log.warning("HA accept failed: %s", error)
                return
            address = f"{peer[0]}:{peer[1]}"
            if len(self.slaves) >= SLAVE_COUNT_MAX:
                log.warning("HA: refusing slave %s, %d are connected", address, SLAVE_COUNT_MAX)
                sock.close()
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            now_ns = time.monotonic_ns()
            slave = _Slave(sock, address, ReportReader(), now_ns, now_ns)
            self.slaves[sock.fileno()] = slave
            self.epoll.register(sock.fileno(), select.EPOLLIN)
            log.info("HA: slave %s connected", address)
            self._publish()

    def _close(self, slave: _Slave, reason: str) -> None:
        fd = slave.sock.fileno()
        with contextlib.suppress(OSError, ValueError):
            self.epoll.unregister(fd)
        slave.sock.close()
        self.slaves.pop(fd, None)
        log.info("HA: slave %s closed: %s", slave.address, reason)
        self._publish()

    def _read(self, slave: _Slave, write_bytes: int) -> None:
        """Take the slave's reports: the first says where to start, each is an ack."""
        try:
            data = slave.sock.recv(READ_SIZE_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as error:
            self._close(slave, f"read failed: {error}")
            return
        if not data:
            self._close(slave, "closed by the slave")
            return
        slave.last_read_ns = time.monotonic_ns()
        try:
            reported_bytes = slave.reader.receive_data(data)
        except RemoteProtocolError as error:
            self._close(slave, str(error))
            return
        if reported_bytes is None:
            return
        if reported_bytes > write_bytes:
            # The slave has bytes this master does not: tell it where our log ends, then close
            # (RocketMQ 4.9.3 closes; the heartbeat lets an mqbox slave say why it stops).
            log.error(
                "HA: slave %s reports %d, past this master's log end %d: it diverged",
                slave.address,
                reported_bytes,
                write_bytes,
            )
            slave.output = [encode_transfer_header(write_bytes, 0)]
            slave.close_after_output = True
            return
        if slave.next_log_offset_bytes < 0:
            self._start(slave, reported_bytes, write_bytes)
        else:
            slave.acked_log_offset_bytes = max(slave.acked_log_offset_bytes, reported_bytes)
            if reported_bytes > self.acked_log_offset_bytes:
                self.acked_log_offset_bytes = reported_bytes
                self._publish(file_now=False)

    def _start(self, slave: _Slave, reported_bytes: int, write_bytes: int) -> None:
        """The first report: where the transfer starts. A slave with nothing (0) gets the whole
        log this master still has (RocketMQ starts it at the last segment instead)."""
        start_bytes = reported_bytes
        if start_bytes == 0:
            self.commit_log.load()
            start_bytes = max(self.commit_log.min_log_offset_bytes, 0)
            start_bytes = min(start_bytes, write_bytes - write_bytes % self.segment_size_bytes)
        slave.next_log_offset_bytes = start_bytes
        slave.acked_log_offset_bytes = reported_bytes
        if not self.slave_reported:
            # The slave has every byte below where it asks from: the lag counts from there
            # until its next report.
            self.slave_reported = True
            self.acked_log_offset_bytes = max(self.acked_log_offset_bytes, reported_bytes)
            self._publish()
        log.info(
            "HA: slave %s starts at %d (master at %d)", slave.address, start_bytes, write_bytes
        )
        if start_bytes == write_bytes:
            # Caught up at once: say so now, so a slave learns where this log ends.
            slave.output = [encode_transfer_header(start_bytes, 0)]

    # -- transfer ---------------------------------------------------------------------------------

    def _transfer(self, slave: _Slave, write_bytes: int, now_ns: int) -> int:
        """Write what the slave's socket takes: the rest of the output, then new frames,
        gathered up to SEND_SIZE_BYTES_MAX per sendmsg. Returns the frames started (work
        done)."""
        frames = 0
        while True:
            if slave.output:
                try:
                    sent = slave.sock.sendmsg(slave.output)
                except (BlockingIOError, InterruptedError):
                    sent = 0
                except OSError as error:
                    self._close(slave, f"write failed: {error}")
                    return frames
                slave.sent_bytes += sent
                if sent:
                    slave.last_write_ns = now_ns
                    _consume(slave.output, sent)
                if slave.output:
                    self._want_write(slave, True)
                    return frames
                if slave.close_after_output:
                    self._close(slave, "diverged")
                    return frames
            self._want_write(slave, False)
            gathered_bytes = 0
            while (
                gathered_bytes < SEND_SIZE_BYTES_MAX
                and len(slave.output) < 2 * SEND_FRAME_COUNT_MAX
            ):
                next_bytes = slave.next_log_offset_bytes
                if next_bytes < 0 or next_bytes >= write_bytes:
                    break
                body = self._frame(slave, next_bytes, write_bytes)
                if body is None:
                    return frames
                slave.output += (encode_transfer_header(next_bytes, len(body)), body)
                gathered_bytes += len(body)
                frames += 1
                if slave.next_log_offset_bytes >= write_bytes:
                    slave.gathered_ns = now_ns
            if not slave.output:
                return frames

    def _frame(self, slave: _Slave, next_bytes: int, write_bytes: int) -> memoryview | None:
        """The body of the next frame from `next_bytes`, a view of the map: one segment's
        readable part, at most a batch."""
        segment_start_bytes = next_bytes - next_bytes % self.segment_size_bytes
        segment_end_bytes = segment_start_bytes + self.segment_size_bytes
        end_bytes = min(write_bytes, segment_end_bytes, next_bytes + self.batch_size_bytes)
        try:
            buffer = self.commit_log.segment_view(segment_start_bytes)
        except StoreError as error:
            buffer = None
            log.warning("HA: segment %d unreadable: %s", segment_start_bytes, error)
        if buffer is None:
            self._close(slave, f"the master no longer has offset {next_bytes} (retention)")
            return None
        at = next_bytes - segment_start_bytes
        slave.next_log_offset_bytes = end_bytes
        # The view keeps the map alive even if retention drops the segment meanwhile.
        return buffer[at : at + (end_bytes - next_bytes)].data

    def _want_write(self, slave: _Slave, want: bool) -> None:
        if slave.want_write == want:
            return
        slave.want_write = want
        mask = select.EPOLLIN | (select.EPOLLOUT if want else 0)
        with contextlib.suppress(OSError, ValueError):
            self.epoll.modify(slave.sock.fileno(), mask)

    def _housekeep(self, slave: _Slave, write_bytes: int, now_ns: int) -> None:
        """Close a silent slave; send a heartbeat (next offset, no body) to an idle one."""
        if slave.sock.fileno() not in self.slaves:
            return
        if now_ns - slave.last_read_ns > self.housekeeping_interval_ns:
            self._close(slave, "no report for haHousekeepingInterval")
            return
        if (
            not slave.output
            and slave.next_log_offset_bytes >= 0
            and now_ns - slave.last_write_ns > self.heartbeat_interval_ns
        ):
            slave.output = [encode_transfer_header(slave.next_log_offset_bytes, 0)]
            self._transfer(slave, write_bytes, now_ns)

    # -- what others see --------------------------------------------------------------------------

    def _tell_writer(self) -> None:
        told = (self.acked_log_offset_bytes if self.acks_wait else 0, len(self.slaves))
        if told == self._told:
            return
        self._told = told
        self.link.send(parcels.REPLICATED, parcels.pack_replicated(*told))

    def _publish(self, *, file_now: bool = True) -> None:
        """The replication line of store-positions now; run/replication.json now or, with
        `file_now` false, at the next `_file_if_due`."""
        self.positions.publish_replication(
            HA_MASTER, len(self.slaves), self.acked_log_offset_bytes, 0, wall_clock_ms()
        )
        if file_now:
            self._file(self.positions.write_log_offset_bytes, time.monotonic_ns())

    def _file_if_due(self, write_bytes: int, now_ns: int) -> None:
        """run/replication.json at most every STATUS_INTERVAL_NS while the acknowledged or the
        write position moves, so the slave's lag it shows is at most that old. Before any slave
        reported in this run nothing read from the file moves with the write position (the lag
        is n/a, home.HaState), so it is filed only when the slaves change (`_publish`): an idle
        master without slaves does not rewrite it every second of a trickle of sends."""
        if not self.slave_reported:
            return
        if now_ns - self._filed_ns < STATUS_INTERVAL_NS:
            return
        if (self.acked_log_offset_bytes, write_bytes) != self._filed:
            self._file(write_bytes, now_ns)

    def _file(self, write_bytes: int, now_ns: int) -> None:
        """run/replication.json: the slaves, the acknowledged offset, the write position and
        the slave's lag in records between them (docs/replication.md, "What shows it")."""
        self._filed = (self.acked_log_offset_bytes, write_bytes)
        self._filed_ns = now_ns
        lag_messages = None
        if self.slave_reported:
            lag_messages = self._lag.measure(self.acked_log_offset_bytes, write_bytes)
        document = {
            "role": "master",
            "slaves": [
                {"address": slave.address, "acked_log_offset": slave.acked_log_offset_bytes}
                for slave in self.slaves.values()
            ],
            "slave_reported": self.slave_reported,
            "acked_log_offset": self.acked_log_offset_bytes,
            "write_log_offset": write_bytes,
            "slave_lag_messages": lag_messages,
        }
        with contextlib.suppress(OSError):
            write_json_atomically(self.layout.replication_path, document)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for slave in list(self.slaves.values()):
            self._close(slave, "the master stops")
        self.listener.close()
        self.link.close()


def _consume(output: list[bytes | memoryview], sent_bytes: int) -> None:
    """Drop the first `sent_bytes` of `output` (what one sendmsg wrote)."""
    while sent_bytes:
        first = output[0]
        if len(first) > sent_bytes:
            output[0] = memoryview(first)[sent_bytes:]
            return
        sent_bytes -= len(first)
        del output[0]


def main(ctx: RoleContext) -> NoReturn:
    """The HA service role: serve slaves until SIGTERM."""
    service = HaService(ctx, wakeup_fd=runtime.wakeup_fileno())
    ctx.report_ready({"role": ctx.role.role_id, "pid": os.getpid()})
    service.run_forever()
