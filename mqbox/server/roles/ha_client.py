"""The HA client role of a slave: receives its master's commit log (RocketMQ's HAClient;
docs/replication.md).

Owns: the connection to the master (haMasterAddress, or without it the HA address the services
role learned from the name server's registration answers: learned_master.py), the offset
reports (at connect, whenever the store writer's position grew, and every
haSendHeartbeatInterval), the cutting of the master's byte stream into whole records for the
store writer (REPLICA parcels), the check that what this slave already has is what the
master has, the replication line of store-positions (its only writer), and run/replication.json
(its lag: the records it handed that no report covered yet). Never: writes the
commit log (the store writer appends the REPLICA bytes, checks them and moves the position), or
sends anything but reports to the master.

Divergence. A slave must not serve a log that is not its master's. At each connect it asks
from up to VERIFY_SIZE_BYTES before its end (within its last segment) and compares the bytes
the master sends for that stretch with its own; and a master whose log ends below the slave's
answers with a heartbeat frame at its end (roles/ha_service.py). Either way, or when the store
writer refuses the bytes (StorePositions.replica_stopped), the client logs why, publishes the
DIVERGED state (store-positions, run/replication.json, `mqbox status`) and stops replicating
until the broker is restarted; the store is left as it is for an operator to judge.

Invariants:
- REPLICA parcels are whole records (and a segment's end blank, never its padding), in log
  order, gapless from the position the store writer had when the connection started.
- The client hands nothing while the store writer has not applied what it handed before a
  reconnect (so the comparison reads bytes that are in the log).
- What waits in memory is bounded: one transfer frame (haTransferBatchSize) plus one record
  (maxMessageSize), and reading stops while the ring to the store writer is backed up.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import os
import select
import socket
import struct
import time
from typing import Final, NoReturn

import numpy as np

from mqbox.clock import wall_clock_ms
from mqbox.errors import StoreError
from mqbox.message import BLANK_SIZE_BYTES
from mqbox.message_kernels import (
    CUT_BLANK,
    CUT_CHUNK,
    CUT_CROSSES,
    CUT_MORE,
    cut_records,
)
from mqbox.protocol.errors import RemoteProtocolError
from mqbox.protocol.ha import TransferReader, encode_report
from mqbox.run_files import write_json_atomically
from mqbox.server import parcels, runtime
from mqbox.server.home import HomeLayout
from mqbox.server.learned_master import learned_master
from mqbox.server.queue_counters import (
    HA_SLAVE_CONNECTED,
    HA_SLAVE_CONNECTING,
    HA_SLAVE_DIVERGED,
    HA_STATE_NAMES,
)
from mqbox.server.roles.ha_link import HaLink
from mqbox.server.runtime import RoleContext
from mqbox.server.topology import RoleKind

log = logging.getLogger("mqbox.ha_client")

IDLE_WAIT_MS: Final = 100
READ_SIZE_BYTES: Final = 256 * 1024
VERIFY_SIZE_BYTES: Final = 64 * 1024  # how much of its end a slave checks at each connect
REPLICA_SIZE_BYTES_MAX: Final = 256 * 1024  # one REPLICA parcel (a longer record goes whole)
# A stored record is at most maxMessageSize of body plus its fixed part, topic and properties.
RECORD_SIZE_SLACK_BYTES: Final = 4096
STAGED_SIZE_BYTES_HIGH: Final = 8 * 1024 * 1024  # stop reading while this much waits for the ring
CONNECT_TIMEOUT_S: Final = 1.0
STATUS_INTERVAL_NS: Final = 1_000_000_000  # run/replication.json at most this often in between
LEARN_INTERVAL_NS: Final = 500_000_000  # how often run/master.json is read (no haMasterAddress)
_SIZE_AND_MAGIC: Final = struct.Struct(">iI")


class _DivergedError(Exception):
    """This slave's log disagrees with its master's (the module docstring)."""


class HaClient:
    """The role's state; `run_forever()` is the role."""

    def __init__(self, ctx: RoleContext, *, wakeup_fd: int | None = None) -> None:
        assert ctx.role.kind is RoleKind.HA_CLIENT
        broker = ctx.broker
        self.role_id = ctx.role.role_id
        self.layout = HomeLayout(ctx.home)
        self.configured_master_address = broker.ha_master_address
        self.master_address = broker.ha_master_address
        self._learned_ns = 0
        self.batch_size_bytes = broker.ha_transfer_batch_size_bytes
        self.record_size_bytes_max = broker.max_message_size_bytes
        self.heartbeat_interval_ns = broker.ha_send_heartbeat_interval_ms * 1_000_000
        self.housekeeping_interval_ns = broker.ha_housekeeping_interval_ms * 1_000_000
        self.reconnect_interval_ns = broker.ha_reconnect_interval_ms * 1_000_000
        self.link = HaLink(ctx, wakeup_fd)
        self.positions = self.link.positions
        self.commit_log = self.link.commit_log
        self.segment_size_bytes = self.link.segment_size_bytes
        self.epoll = self.link.epoll
        self.state = HA_SLAVE_CONNECTING
        self.reason = ""
        self.sock: socket.socket | None = None
        self.reader = TransferReader(self.batch_size_bytes)
        self.handed_end_bytes = 0  # end of the last REPLICA handed (this process)
        # (end, records) of each REPLICA handed with records in it, until a report covers it:
        # the slave's lag in messages (whole records received and not yet acknowledged).
        self._handed: collections.deque[tuple[int, int]] = collections.deque()
        self.master_log_offset_bytes = 0  # the master's offset in the newest frame
        self.reported_bytes = -1
        # The greatest offset reported while this process runs: what it publishes. A reconnect
        # reports up to VERIFY_SIZE_BYTES less (the stretch to compare), but the bytes below
        # the earlier reports are still this slave's and were acknowledged (a master killed
        # while its listening socket outlived its HA role took such a reconnect).
        self.reported_max_bytes = 0
        self._expected_bytes = 0  # where the next frame must start
        self._verify_end_bytes = 0  # bytes below this are compared, not handed
        self._tail = bytearray()  # stream bytes from _tail_start_bytes not handed yet
        self._tail_start_bytes = 0
        self._skip_to_bytes = 0  # padding after a blank: dropped up to here
        self._first_frame = True
        self._last_report_ns = 0
        self._last_read_ns = 0
        self._next_connect_ns = 0
        self._warned_no_master = False
        self._closed = False
        self._published_ns = 0
        self._publish()

    # -- the loop ---------------------------------------------------------------------------------

    def run_forever(self) -> NoReturn:
        runtime.run_until_stopped(self.run_once, self.close)

    def run_once(self, timeout_ms: int) -> int:
        work = self.link.drain_written()
        self.link.follow_retention_nowait()
        now_ns = time.monotonic_ns()
        self._follow_learned_master(now_ns)
        try:
            if self.state != HA_SLAVE_DIVERGED and self.positions.replica_stopped:
                raise _DivergedError("the store writer refused the master's bytes (see its log)")
            if self.sock is None and self.state != HA_SLAVE_DIVERGED:
                self._connect(now_ns)
            if self.sock is not None:
                work += self._report_if_due(now_ns)
        except _DivergedError as error:
            self._diverge(str(error))
        self.link.flush_nowait()
        wait_ms = IDLE_WAIT_MS if timeout_ms < 0 else min(IDLE_WAIT_MS, timeout_ms)
        for fd, _mask in self.link.sleeper.wait(0 if work else wait_ms):
            if fd == self.link.wakeup_fd:
                runtime.clear_wakeup_nowait()
            elif self.sock is not None and fd == self.sock.fileno():
                work += self._read_guarded()
        return work

    # -- the connection ---------------------------------------------------------------------------

    def _follow_learned_master(self, now_ns: int) -> None:
        """Without haMasterAddress, take the master's HA address the name server last gave
        (run/master.json); when it changes (the master restarted elsewhere), drop the old
        connection and connect to the new address at once."""
        if self.configured_master_address or now_ns - self._learned_ns < LEARN_INTERVAL_NS:
            return
        self._learned_ns = now_ns
        address = learned_master(self.layout.home)
        if not address or address == self.master_address:
            return
        log.info("HA: the name server names the master's HA address %s", address)
        self._disconnect(f"the master's HA address is now {address}")
        self.master_address = address
        self._next_connect_ns = 0
        self._publish()

    def _connect(self, now_ns: int) -> None:
        if now_ns < self._next_connect_ns:
            return
        self._next_connect_ns = now_ns + self.reconnect_interval_ns
        if not self.master_address:
            if not self._warned_no_master:
                self._warned_no_master = True
                log.info("HA: no haMasterAddress: waiting for the name server to name the master")
            return
        write_bytes = self.positions.write_log_offset_bytes
        if write_bytes < self.handed_end_bytes:
            return  # the writer still applies what the last connection handed
        host, _, port = self.master_address.rpartition(":")
        try:
            sock = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S)
        except OSError as error:
            log.debug("HA: cannot connect to %s: %s", self.master_address, error)
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.epoll.register(sock.fileno(), select.EPOLLIN)
        self.reader = TransferReader(self.batch_size_bytes)
        self.commit_log.load()
        segment_start_bytes = write_bytes - write_bytes % self.segment_size_bytes
        ask_bytes = max(write_bytes - VERIFY_SIZE_BYTES, segment_start_bytes)
        if self.commit_log.segment_view(segment_start_bytes) is None:
            ask_bytes = write_bytes  # nothing of that segment written yet: nothing to compare
        self._expected_bytes = ask_bytes
        self._verify_end_bytes = write_bytes
        self._tail = bytearray()
        self._tail_start_bytes = write_bytes
        self._skip_to_bytes = 0
        self._first_frame = True
        self.handed_end_bytes = write_bytes
        self._handed.clear()
        self._last_read_ns = now_ns
        self.state = HA_SLAVE_CONNECTED
        log.info(
            "HA: connected to master %s; asking from %d (our log ends at %d)",
            self.master_address,
            ask_bytes,
            write_bytes,
        )
        self._send_report(ask_bytes, now_ns)
        self._publish()

    def _disconnect(self, reason: str) -> None:
        sock = self.sock
        if sock is None:
            return
        with contextlib.suppress(OSError, ValueError):
            self.epoll.unregister(sock.fileno())
        sock.close()
        self.sock = None
        if self.state == HA_SLAVE_CONNECTED:
            self.state = HA_SLAVE_CONNECTING
        log.info("HA: connection to %s closed: %s", self.master_address, reason)
        self._publish()

    def _diverge(self, reason: str) -> None:
        log.error("HA: this slave's log diverged from its master's; replication stops: %s", reason)
        self.reason = reason
        self._disconnect("diverged")
        self.state = HA_SLAVE_DIVERGED
        self._publish()

    def _send_report(self, offset_bytes: int, now_ns: int) -> None:
        assert self.sock is not None
        try:
            # Eight bytes into an empty socket buffer: a partial send would need a full one.
            sent = self.sock.send(encode_report(offset_bytes))
        except (BlockingIOError, InterruptedError):
            return  # the next turn reports again
        except OSError as error:
            self._disconnect(f"report failed: {error}")
            return
        assert sent == 8
        self.reported_bytes = offset_bytes
        self.reported_max_bytes = max(self.reported_max_bytes, offset_bytes)
        self._last_report_ns = now_ns
        while self._handed and self._handed[0][0] <= offset_bytes:
            self._handed.popleft()

    def _report_if_due(self, now_ns: int) -> int:
        """Report the writer's position when it grew (reportSlaveMaxOffsetPlus) or when the
        heartbeat interval passed; close a master silent for haHousekeepingInterval."""
        if now_ns - self._last_read_ns > self.housekeeping_interval_ns:
            self._disconnect("no data from the master for haHousekeepingInterval")
            return 0
        if self._first_frame:
            # The master takes the latest report it has read as where to start: one more report
            # before its first frame could move the start past the stretch we asked to compare.
            return 0
        write_bytes = self.positions.write_log_offset_bytes
        if write_bytes > self.reported_bytes or (
            now_ns - self._last_report_ns > self.heartbeat_interval_ns
        ):
            self._send_report(max(write_bytes, self.reported_bytes), now_ns)
            self._publish_positions()
            if now_ns - self._published_ns > STATUS_INTERVAL_NS:
                self._publish()
            return 1
        return 0

    # -- receiving --------------------------------------------------------------------------------

    def _read_guarded(self) -> int:
        try:
            return self._read()
        except RemoteProtocolError as error:
            self._disconnect(f"protocol error: {error}")
        except _DivergedError as error:
            self._diverge(str(error))
        return 0

    def _read(self) -> int:
        assert self.sock is not None
        if self.link.backed_up_bytes > STAGED_SIZE_BYTES_HIGH:
            return 0  # the store writer is behind: let TCP hold the master back
        try:
            data = self.sock.recv(READ_SIZE_BYTES)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as error:
            if error.errno != errno.EAGAIN:
                self._disconnect(f"read failed: {error}")
            return 0
        if not data:
            self._disconnect("closed by the master")
            return 0
        self._last_read_ns = time.monotonic_ns()
        self.reader.receive_data(data)
        frames = 0
        while (frame := self.reader.next_frame()) is not None:
            frames += 1
            self._on_frame(frame.log_offset_bytes, frame.body)
        self._hand_records()
        return frames

    def _on_frame(self, log_offset_bytes: int, body: bytes) -> None:
        """Check where the frame starts; compare what we have, keep the rest for the writer."""
        self.master_log_offset_bytes = log_offset_bytes + len(body)
        if log_offset_bytes != self._expected_bytes:
            empty_slave = self._verify_end_bytes == 0 and self._first_frame
            if empty_slave and log_offset_bytes % self.segment_size_bytes == 0:
                # An empty slave takes the master's log from wherever it starts.
                self._tail_start_bytes = log_offset_bytes
                self._verify_end_bytes = log_offset_bytes
                self.handed_end_bytes = log_offset_bytes
            elif log_offset_bytes < self._verify_end_bytes:
                raise _DivergedError(
                    f"the master's log ends at {log_offset_bytes}, ours at "
                    f"{self._verify_end_bytes}: we have bytes it does not"
                )
            else:
                raise RemoteProtocolError(
                    f"frame at {log_offset_bytes}, expected {self._expected_bytes}"
                )
        self._first_frame = False
        end_bytes = log_offset_bytes + len(body)
        self._expected_bytes = end_bytes
        if not body:
            if log_offset_bytes < self._verify_end_bytes:
                # A heartbeat: the master has nothing past log_offset_bytes, we have more.
                raise _DivergedError(
                    f"the master's log ends at {log_offset_bytes}, ours at "
                    f"{self._verify_end_bytes}: we have bytes it does not"
                )
            return
        verify_end_bytes = min(end_bytes, self._verify_end_bytes)
        if log_offset_bytes < verify_end_bytes:
            self._compare(log_offset_bytes, body[: verify_end_bytes - log_offset_bytes])
        if end_bytes > self._verify_end_bytes:
            cut = max(0, self._verify_end_bytes - log_offset_bytes)
            self._tail += body[cut:]

    def _compare(self, log_offset_bytes: int, data: bytes) -> None:
        segment_start_bytes = log_offset_bytes - log_offset_bytes % self.segment_size_bytes
        try:
            buffer = self.commit_log.segment_view(segment_start_bytes)
        except StoreError:
            buffer = None
        at = log_offset_bytes - segment_start_bytes
        if buffer is None or buffer[at : at + len(data)].tobytes() != data:
            raise _DivergedError(
                f"the master's bytes at [{log_offset_bytes}, {log_offset_bytes + len(data)}) "
                "differ from ours"
            )

    def _hand_records(self) -> None:
        """Cut whole records (and a blank) off the tail and hand them to the writer. The walk
        over the records is one kernel call per REPLICA parcel (cut_records); a blank, whose
        padding is dropped, comes back here."""
        tail = self._tail
        position = 0
        emit_start = 0
        records = 0  # whole records in tail[emit_start:position]
        tail_start_bytes = self._tail_start_bytes
        size = len(tail)
        record_size_bytes_max = self.record_size_bytes_max + RECORD_SIZE_SLACK_BYTES
        while True:
            at_bytes = tail_start_bytes + position
            if at_bytes < self._skip_to_bytes:
                skip = min(self._skip_to_bytes - at_bytes, size - position)
                position += skip
                emit_start = position
                if tail_start_bytes + position < self._skip_to_bytes:
                    break
                continue
            segment_end_bytes = at_bytes - at_bytes % self.segment_size_bytes
            segment_end_bytes += self.segment_size_bytes
            view = np.frombuffer(tail, dtype=np.uint8)
            try:
                position, reason, walked = cut_records(
                    view,
                    position,
                    size,
                    emit_start + REPLICA_SIZE_BYTES_MAX,
                    segment_end_bytes - tail_start_bytes,
                    record_size_bytes_max,
                )
            finally:
                del view  # the bytearray cannot change size while numpy holds a view of it
            at_bytes = tail_start_bytes + position
            records += walked
            if reason == CUT_MORE:
                break
            if reason == CUT_CHUNK:
                self._emit(tail, emit_start, position, records=records)
                emit_start = position
                records = 0
                continue
            record_size, _magic = _SIZE_AND_MAGIC.unpack_from(tail, position)
            if reason == CUT_BLANK:
                if record_size != segment_end_bytes - at_bytes:
                    raise RemoteProtocolError(f"a blank at {at_bytes} of size {record_size}")
                position += BLANK_SIZE_BYTES
                self._emit(tail, emit_start, position, segment_end_bytes, records)
                emit_start = position
                records = 0
                self._skip_to_bytes = segment_end_bytes
                continue
            if reason == CUT_CROSSES:
                raise RemoteProtocolError(f"the record at {at_bytes} crosses its segment's end")
            raise RemoteProtocolError(f"no record at {at_bytes} (size {record_size})")
        if position > emit_start:
            self._emit(tail, emit_start, position, records=records)
        del tail[:position]
        self._tail_start_bytes = tail_start_bytes + position

    def _emit(
        self, tail: bytearray, start: int, end: int, rolled_to_bytes: int = 0, records: int = 0
    ) -> None:
        """Hand tail[start:end] to the writer; `rolled_to_bytes`: it ends with a blank, and the
        writer's position will be that next segment's start."""
        if end <= start:
            return
        log_offset_bytes = self._tail_start_bytes + start
        assert log_offset_bytes == self.handed_end_bytes, (log_offset_bytes, self.handed_end_bytes)
        head = parcels.REPLICA_HEAD_STRUCT.pack(log_offset_bytes)
        with memoryview(tail)[start:end] as part:  # the outbox copies it: no slice of our own
            self.link.send(parcels.REPLICA, head, part)
        self.handed_end_bytes = rolled_to_bytes or log_offset_bytes + (end - start)
        if records:
            self._handed.append((self.handed_end_bytes, records))

    # -- what others see --------------------------------------------------------------------------

    def _publish_positions(self) -> None:
        self.positions.publish_replication(
            self.state,
            0,
            self.reported_max_bytes,
            self.master_log_offset_bytes,
            wall_clock_ms(),
        )

    def _publish(self) -> None:
        self._published_ns = time.monotonic_ns()
        self._publish_positions()
        document = {
            "role": "slave",
            "state": HA_STATE_NAMES[self.state],
            "master": self.master_address,
            "reported_log_offset": self.reported_max_bytes,
            "master_log_offset": self.master_log_offset_bytes,
            "slave_lag_messages": sum(records for _end, records in self._handed),
            "reason": self.reason,
        }
        with contextlib.suppress(OSError):
            write_json_atomically(self.layout.replication_path, document)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._disconnect("the slave stops")
        self.link.close()


def warm_up() -> None:
    """Compile cut_records in the supervisor's zygote, so the HA client inherits it."""
    cut_records(np.zeros(BLANK_SIZE_BYTES, dtype=np.uint8), 0, 0, 0, 0, 0)


def main(ctx: RoleContext) -> NoReturn:
    """The HA client role: follow the master until SIGTERM."""
    client = HaClient(ctx, wakeup_fd=runtime.wakeup_fileno())
    ctx.report_ready({"role": ctx.role.role_id, "pid": os.getpid()})
    client.run_forever()
