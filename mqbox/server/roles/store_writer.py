"""The store writer role: the one process that appends to the commit log.

Owns: opening the store for writing (the abort marker, recovery, the re-dispatch of what the
derived files lack) before anything else of the broker runs; the system topics of a new store
(topics.py); the APPEND parcels from every send processor, appended batch by batch
(CommitLog.append_batch assigns queue indexes and log offsets, and patches the store fields);
the APPEND_ACK back to each sender; the flush schedule (ASYNC_FLUSH: a thread flushes every
flushIntervalCommitLog ms while bytes are unflushed, woken by `note_written` after an idle
spell, and acks go out after the page-cache write; SYNC_FLUSH: acks wait
until a group-commit flush covers them, and only a flush that truly took longer than
syncFlushTimeout answers FLUSH_DISK_TIMEOUT); the published write and flushed positions
(queue_counters.StorePositions) and the WRITTEN parcels that wake the dispatcher; the disk
guard (cleanup.DiskSpaceGuard: appends are refused with SERVICE_NOT_AVAILABLE on a nearly full
disk); commit-log retention and the checkpoint file, its only writer while the broker runs
(store_housekeeper.py, a thread); the idempotent produce window (store/idempotence.py: rebuilt at
open, consulted and filled by each APPEND flagged APPEND_FLAG_IDEMPOTENT, and the only writer of
mqboxIdempotentTopics.json); and the clean close (flush, checkpoint, abort marker removed).

Never: builds or parses a message (the send processor encodes records, the kernel checks them
whole), writes a consume queue or the index after recovery (the dispatcher role owns them from
then on), touches a socket, or blocks on a flush in its main loop.

Invariants:
- Records reach the commit log in the order their APPENDs left each send processor; a request's
  records are consecutive in the log and in their queue (one append_batch per APPEND).
- An APPEND_ACK with code 0 is sent only for records below the published write position, and,
  under SYNC_FLUSH with the WAIT flag, below the flushed position.
- Positions published in shared memory only grow; WRITTEN goes out after the position it names
  was published.
- An idempotent APPEND stores none of its records whose (topic, UNIQ_KEY) the window holds and
  the commit log still has: one thread looks up and appends, so two sends of one key, from any
  send processors, store it once. The window's lookups and inserts happen nowhere else.

Threads: the main thread appends, publishes the write position and keeps the SYNC_FLUSH acks,
and sleeps with no timer unless an ack waits with a deadline; the store's flush thread
(store/flush.FlushService, the one flush path, shared with MessageStore) calls CommitLog.flush
(msync via ctypes, without the GIL) and publishes the flushed position; under SYNC_FLUSH it
wakes the main thread through a pipe in its epoll, which releases the acks the least of
flush.SYNC_ACK_POSITIONS covers. The housekeeping thread deletes expired segments and writes
the checkpoint. The supervisor forks this role with one thread, so starting threads here is safe.

Recovery: `open_store_for_writing` is MessageStore.open, which runs recovery.recover() through the
store's own dispatcher before this role reports ready.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import select
import time
from pathlib import Path
from typing import Final, NoReturn

import numpy as np
from numpy.typing import NDArray

from mqbox.clock import wall_clock_ms
from mqbox.config import BrokerRole, FlushDiskType
from mqbox.errors import (
    DiskFullError,
    MessageIllegalError,
    MessageTooLargeError,
    StoreError,
)
from mqbox.ipc.ring import Ring
from mqbox.message import pack_host
from mqbox.protocol.codes import ResponseCode
from mqbox.server import parcels, runtime, transport
from mqbox.server.parcels import AppendAck, Buffer
from mqbox.server.queue_counters import (
    StorePositions,
    queue_counters_name,
    store_positions_name,
)
from mqbox.server.roles.processors.topics import TopicConfigStore
from mqbox.server.roles.store_housekeeper import StoreHousekeeper
from mqbox.server.runtime import RoleContext
from mqbox.server.statistics import HISTOGRAM_FLUSH
from mqbox.server.topology import RoleKind
from mqbox.server.transport import Inbox, Outbox, Sleeper, SpillWriter
from mqbox.store import recovery
from mqbox.store.commit_log import AppendResult, record_log_offsets
from mqbox.store.flush import FLUSHED, SYNC_ACK_POSITIONS
from mqbox.store.idempotence import (
    IdempotenceWindow,
    RecordIdentity,
    RecordKeys,
    load_idempotent_topics,
    rebuild_window,
    record_identity,
    record_keys,
    save_idempotent_topics,
)
from mqbox.store.message_store import MessageStore, StoreConfig

log = logging.getLogger("mqbox.store_writer")

STAGED_SIZE_BYTES_HIGH: Final = 8 * 1024 * 1024
BACKED_UP_RETRY_MS: Final = 1
STOP_DRAIN_ROUND_MAX: Final = 64  # at the stop, drain what the senders left, this many rounds
_OK: Final = int(ResponseCode.SUCCESS)
_FLUSH_DISK_TIMEOUT: Final = int(ResponseCode.FLUSH_DISK_TIMEOUT)
_MESSAGE_ILLEGAL: Final = int(ResponseCode.MESSAGE_ILLEGAL)
_SERVICE_NOT_AVAILABLE: Final = int(ResponseCode.SERVICE_NOT_AVAILABLE)
_SYSTEM_ERROR: Final = int(ResponseCode.SYSTEM_ERROR)
_SLAVE_NOT_AVAILABLE: Final = int(ResponseCode.SLAVE_NOT_AVAILABLE)
_FLUSH_SLAVE_TIMEOUT: Final = int(ResponseCode.FLUSH_SLAVE_TIMEOUT)
# Roles told of each new write position (WRITTEN): the dispatcher, and the HA role of either side.
_WRITTEN_KINDS: Final = frozenset(
    {RoleKind.DISPATCHER.value, RoleKind.HA_SERVICE.value, RoleKind.HA_CLIENT.value}
)
# What an acknowledgement waits to cover its records (store/flush.py's seam): the flush, the
# slave's report (REPLICATED, SYNC_MASTER), or both.
REPLICATED: Final = "replicated"


def store_config_of(ctx: RoleContext) -> StoreConfig:
    """The store settings of this broker; the store host is brokerIP1 and the bound port."""
    broker = ctx.broker
    store_host = pack_host(broker.broker_ip1 or "127.0.0.1", broker.listen_port)
    return StoreConfig.from_broker_config(broker, store_host)


def open_store_for_writing(
    store_root: Path, config: StoreConfig
) -> tuple[MessageStore, recovery.RecoveryReport]:
    """Open the store for appends: MessageStore.open marks it running (abort file), recovers it
    and re-dispatches what the consume queues and the index lack."""
    store = MessageStore.open(store_root, config)
    assert store.recovery_report is not None
    return store, store.recovery_report


@dataclasses.dataclass(frozen=True, slots=True)
class StoreWriterStatistics:
    append_requests: int
    append_records: int
    append_bytes: int
    refused_requests: int
    sync_waits: int
    sync_timeouts: int
    flush_count: int
    flush_errors: int
    write_log_offset_bytes: int
    flushed_log_offset_bytes: int
    sleep_count: int
    turn_count: int
    idempotent_requests: int  # APPENDs flagged APPEND_FLAG_IDEMPOTENT
    idempotent_duplicates: int  # records of those not stored again
    idempotent_rebuilt_keys: int  # keys the window got back from the commit log at open


@dataclasses.dataclass(slots=True)
class _SyncWait:
    end_log_offset_bytes: int
    deadline_ns: int
    sender: str
    ack: AppendAck
    # the ack's code once covered: SUCCESS, or SLAVE_NOT_AVAILABLE for a SYNC_MASTER append
    # that found no slave fit to wait for (it still waits for its flush under SYNC_FLUSH)
    code_when_covered: int = _OK


class StoreWriter:
    """One store writer process's state. `run_forever()` is the role; tests drive `run_once()`
    and `close()`."""

    def __init__(
        self,
        ctx: RoleContext,
        *,
        spin_ns_max: int = transport.SPIN_NS_MAX_DEFAULT,
        wakeup_fd: int | None = None,
        start_housekeeper: bool = True,
    ) -> None:
        """`start_housekeeper=False` leaves the housekeeping thread unstarted (tests run
        `housekeeper.run_once()` themselves)."""
        assert ctx.role.kind is RoleKind.STORE_WRITER
        self.role_id = ctx.role.role_id
        self.store_root = ctx.store_root
        broker = ctx.broker
        self.flush_disk_type = broker.flush_disk_type
        self.broker_role = broker.broker_role
        self.slave_fallbehind_max_bytes = broker.ha_slave_fallbehind_max_bytes
        self.sync_flush_timeout_ns = broker.sync_flush_timeout_ms * 1_000_000
        config = store_config_of(ctx)
        self.store, self.recovery_report = open_store_for_writing(ctx.store_root, config)
        log.info("store open: %s", self.recovery_report)
        self.commit_log = self.store.commit_log
        # Recovery's re-dispatch is made durable here; from now on the dispatcher role alone
        # writes consume queues and the index. The queue objects stay known (their entry counts
        # start the writer's queue indexes), their maps are released.
        self.store.flush_index()
        self.store.flush_consume_queues()
        self.store.consume_queues.close()
        self.store.index.close()
        self.topics = TopicConfigStore(ctx.store_root, broker)
        added = self.topics.ensure_system_topics()
        if added:
            log.info("created system topics: %s", ", ".join(added))
        self.positions = StorePositions.create(store_positions_name(ctx.instance))
        # The flush thread's words of the statistics block (it writes no others).
        self.stats = runtime.statistics_writer(ctx)
        self._flushed_seen_bytes = self.commit_log.flushed_log_offset_bytes
        self.positions.publish_write(self.commit_log.write_log_offset_bytes, 0)
        self.positions.publish_flushed(
            self.commit_log.flushed_log_offset_bytes, self.commit_log.flushed_store_timestamp_ms
        )
        self.positions.publish_ready(self.store.dispatcher.dispatched_log_offset_bytes)
        topology = ctx.topology
        self.spill_writer = SpillWriter(ctx.instance, self.role_id)
        self.inboxes = [
            Inbox(Ring.attach(spec.name), spec.producer) for spec in topology.rings_to(self.role_id)
        ]
        self.ack_outboxes: dict[str, Outbox] = {}
        self.written_outboxes: list[Outbox] = []
        # A master's ha_service.0 is woken by WRITTEN only while a slave is connected (it reads
        # the positions from shared memory; waking it for nothing costs a wake-up and its spin
        # on every append).
        self.ha_service_outbox: Outbox | None = None
        for spec in topology.rings_from(self.role_id):
            outbox = Outbox(Ring.attach(spec.name), self.spill_writer)
            if spec.consumer.split(".", 1)[0] == RoleKind.HA_SERVICE.value:
                self.ha_service_outbox = outbox
            elif spec.consumer.split(".", 1)[0] in _WRITTEN_KINDS:
                self.written_outboxes.append(outbox)
            else:
                self.ack_outboxes[spec.consumer] = outbox
        self.epoll = select.epoll()
        self.sleeper = Sleeper(self.epoll, self.inboxes, spin_ns_max)
        self.wakeup_fd = wakeup_fd
        if wakeup_fd is not None:
            self.epoll.register(wakeup_fd, select.EPOLLIN)
        self._flush_read_fd, self._flush_write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.epoll.register(self._flush_read_fd, select.EPOLLIN)
        # The store's one flush service (store/flush.py), its thread running in both modes:
        # ASYNC_FLUSH its timer, SYNC_FLUSH its group commit.
        self.flusher = self.store.flush_service
        self.flusher.on_flushed = self._on_flushed
        self.flusher.start()
        self.housekeeper = StoreHousekeeper(
            ctx.store_root,
            self.commit_log,
            self.store.checkpoint,
            self.positions,
            queue_counters_name(ctx.instance),
            config.retention,
            broker.flush_interval_consume_queue_ms,
        )
        if start_housekeeper:
            self.housekeeper.start()
        self.idempotent_topics = load_idempotent_topics(ctx.store_root)
        self.idempotence = IdempotenceWindow(
            broker.idempotent_window_ms, broker.limits.idempotent_key_count_max
        )
        self._idempotent_rebuilt_keys = 0
        if self.idempotent_topics:
            started_ns = time.monotonic_ns()
            self._idempotent_rebuilt_keys = rebuild_window(
                self.idempotence,
                self.commit_log,
                self.commit_log.write_log_offset_bytes,
                self.idempotent_topics,
                wall_clock_ms(),
            )
            log.info(
                "idempotent window rebuilt: %d keys of %d topics in %.3f s",
                self._idempotent_rebuilt_keys,
                len(self.idempotent_topics),
                (time.monotonic_ns() - started_ns) / 1e9,
            )
        self._idempotent_requests = 0
        self._idempotent_duplicates = 0
        # One queue of waits per set of positions they need, each in log order, so one
        # position's progress releases a prefix of its queue (batched waiting).
        self._sync_waits: dict[tuple[str, ...], collections.deque[_SyncWait]] = {}
        self._replicated_log_offset_bytes = 0  # the slaves' greatest report (REPLICATED)
        self._slave_count = 0
        self._replica_records = 0
        self._replica_refused = 0
        self._replica_overlap_bytes = 0
        self._replica_stopped = False
        self._slave_not_available = 0
        self._topic_names: dict[bytes, str] = {}
        self._published_log_offset_bytes = self.commit_log.write_log_offset_bytes
        self._append_requests = 0
        self._append_records = 0
        self._append_bytes = 0
        self._refused_requests = 0
        self._sync_wait_count = 0
        self._sync_timeouts = 0
        self._turn_count = 0
        self._closed = False

    # -- the loop ---------------------------------------------------------------------------------

    def run_forever(self) -> NoReturn:
        runtime.run_until_stopped(self.run_once, self.close)

    def run_once(self, timeout_ms: int) -> int:
        """One turn: drain every sender's ring once, publish, release flushed acks. Returns the
        parcels handled; sleeps up to timeout_ms (negative: until work) only when idle."""
        self._turn_count += 1
        work = 0
        backed_up = any(
            outbox.pending_size_bytes > STAGED_SIZE_BYTES_HIGH
            for outbox in self.ack_outboxes.values()
        )
        if not backed_up:
            for inbox in self.inboxes:
                if inbox.ring.readable():
                    work += self._drain(inbox)
        self._publish_written()
        self._release_sync_waits(time.monotonic_ns())
        all_written = self._flush_outboxes()
        if work:
            return work
        # Nothing is due but the first ack's timeout: a parcel, the flush thread's pipe or a
        # signal ends any other wait, so an idle writer sleeps without a timer.
        wait_ms = -1
        first_deadline_ns = min(
            (waits[0].deadline_ns for waits in self._sync_waits.values() if waits), default=None
        )
        if first_deadline_ns is not None:
            due_ns = first_deadline_ns - time.monotonic_ns()
            wait_ms = max(0, -(-due_ns // 1_000_000))
        if timeout_ms >= 0:
            wait_ms = timeout_ms if wait_ms < 0 else min(wait_ms, timeout_ms)
        if not all_written:
            wait_ms = BACKED_UP_RETRY_MS if wait_ms < 0 else min(wait_ms, BACKED_UP_RETRY_MS)
        for fd, _mask in self.sleeper.wait(wait_ms):
            if fd == self.wakeup_fd:
                runtime.clear_wakeup_nowait()
            elif fd == self._flush_read_fd:
                self._clear_flush_pipe()
        return 0

    def _on_flushed(self, flushed_log_offset_bytes: int, store_timestamp_ms: int) -> None:
        """Run by the flush thread after each flush (and by close's last one): publish the
        flushed position and store time (the checkpoint's source), and under SYNC_FLUSH wake
        the main loop, which releases the acks the flush covered."""
        if flushed_log_offset_bytes > self._flushed_seen_bytes:  # a flush that wrote something
            self._flushed_seen_bytes = flushed_log_offset_bytes
            self.stats.observe_ns(HISTOGRAM_FLUSH, self.flusher.last_flush_duration_ns)
        self.positions.publish_flushed(flushed_log_offset_bytes, store_timestamp_ms)
        if self.flush_disk_type is FlushDiskType.SYNC_FLUSH:
            with contextlib.suppress(BlockingIOError):
                os.write(self._flush_write_fd, b"\0")

    def _clear_flush_pipe(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._flush_read_fd, 4096):
                pass

    def _drain(self, inbox: Inbox) -> int:
        batch = inbox.drain_nowait(transport.BATCH_COUNT_MAX)
        handled = 0
        try:
            for parcel_type, buffer, offset, size in inbox.parcels(batch):
                handled += 1
                if parcel_type == parcels.APPEND:
                    self._append(inbox.producer, buffer, offset, size)
                elif parcel_type == parcels.REPLICA:
                    self._append_replica(buffer, offset, size)
                elif parcel_type == parcels.REPLICATED:
                    acked_bytes, self._slave_count = parcels.unpack_replicated(buffer, offset)
                    if acked_bytes > self._replicated_log_offset_bytes:
                        self._replicated_log_offset_bytes = acked_bytes
                else:
                    raise AssertionError(f"store writer got parcel type {parcel_type}")
        finally:
            inbox.release(batch)
        return handled

    def _append(self, sender: str, buffer: Buffer, offset: int, size: int) -> None:
        view = parcels.unpack_append(buffer, offset, size)
        topic = self._topic_names.get(view.topic)
        if topic is None:
            topic = view.topic.decode("utf-8", "surrogateescape")
            self._topic_names[view.topic] = topic
        sizes_bytes = np.frombuffer(
            buffer, dtype=np.int32, count=view.record_count, offset=view.sizes_offset
        )
        source = np.frombuffer(
            buffer, dtype=np.uint8, count=view.records_size, offset=view.records_offset
        )
        self._append_requests += 1
        if self.broker_role is BrokerRole.SLAVE:
            # A slave's log is its master's, byte for byte: nothing else may be appended
            # (RocketMQ's checkStoreStatus answers SERVICE_NOT_AVAILABLE on a slave).
            self._refuse(
                sender,
                view.request_id,
                _SERVICE_NOT_AVAILABLE,
                "mqbox: this broker is a slave; messages are put to its master",
            )
            return
        if view.flags & parcels.APPEND_FLAG_IDEMPOTENT:
            self._append_idempotent(sender, view, topic, source, sizes_bytes)
            return
        result = self._append_checked(sender, view.request_id, source, sizes_bytes, topic, view)
        if result is None:
            return
        ack = AppendAck(
            view.request_id,
            result.log_offset_bytes,
            result.queue_index,
            result.store_timestamp_ms,
            result.record_count,
            _OK,
            "",
        )
        self._ack_when_durable(sender, view, result.end_log_offset_bytes, ack)

    def _append_checked(
        self,
        sender: str,
        request_id: int,
        source: NDArray[np.uint8],
        sizes_bytes: NDArray[np.int32],
        topic: str,
        view: parcels.AppendView,
    ) -> AppendResult | None:
        """Append the records, or refuse the request with the store's reason (None)."""
        try:
            self.store.disk_guard.check_writable()
            result = self.commit_log.append_batch(source, sizes_bytes, topic, view.queue_id)
        except DiskFullError as error:
            # RocketMQ's answer while its disk is marked full (PutMessageStatus
            # SERVICE_NOT_AVAILABLE); producers try another broker.
            self._refuse(sender, request_id, _SERVICE_NOT_AVAILABLE, f"mqbox: {error}")
            return None
        except MessageTooLargeError as error:
            self._refuse(sender, request_id, _MESSAGE_ILLEGAL, str(error))
            return None
        except MessageIllegalError as error:
            self._refuse(sender, request_id, _MESSAGE_ILLEGAL, str(error))
            return None
        except StoreError as error:
            log.error("append refused by the store: %s", error)
            self._refuse(sender, request_id, _SYSTEM_ERROR, f"mqbox: store error: {error}")
            return None
        self._append_records += result.record_count
        self._append_bytes += int(sizes_bytes.sum())
        return result

    def _ack_when_durable(
        self, sender: str, view: parcels.AppendView, end_log_offset_bytes: int, ack: AppendAck
    ) -> None:
        """Send the ack now, or, for an append with the WAIT flag, once what it needs covers
        `end_log_offset_bytes`: a flush under SYNC_FLUSH, the slave's report under SYNC_MASTER
        (RocketMQ's submitFlushRequest and submitReplicaRequest, combined)."""
        if not view.flags & parcels.APPEND_FLAG_WAIT_FLUSH:
            self._send_ack(sender, ack)
            return
        names: tuple[str, ...] = ()
        code = _OK
        if self.flush_disk_type is FlushDiskType.SYNC_FLUSH:
            names = SYNC_ACK_POSITIONS
        if self.broker_role is BrokerRole.SYNC_MASTER:
            if self._slave_fit(end_log_offset_bytes):
                names = (*names, REPLICATED)
            else:
                # Stored, not replicated: RocketMQ answers at once (after the flush it needs).
                self._slave_not_available += 1
                code = _SLAVE_NOT_AVAILABLE
        if not names or end_log_offset_bytes <= self._covered_log_offset_bytes(names):
            self._send_ack(sender, self._ack_with_code(ack, code))
            return
        self._sync_wait_count += 1
        deadline_ns = time.monotonic_ns() + self.sync_flush_timeout_ns
        wait = _SyncWait(end_log_offset_bytes, deadline_ns, sender, ack, code)
        self._sync_waits.setdefault(names, collections.deque()).append(wait)
        if FLUSHED in names:
            self.flusher.request(end_log_offset_bytes)

    def _slave_fit(self, end_log_offset_bytes: int) -> bool:
        """RocketMQ's isSlaveOK: a slave is connected and lags at most haSlaveFallbehindMax."""
        lag_bytes = end_log_offset_bytes - self._replicated_log_offset_bytes
        return self._slave_count > 0 and lag_bytes <= self.slave_fallbehind_max_bytes

    @staticmethod
    def _ack_with_code(ack: AppendAck, code: int) -> AppendAck:
        if code == _OK:
            return ack
        remark = "slave not available: stored on the master only"
        return ack._replace(response_code=code, remark=remark)

    # -- replication (a slave's appends) --------------------------------------------------------

    def _append_replica(self, buffer: Buffer, offset: int, size: int) -> None:
        """Append the master's bytes (a REPLICA parcel) at exactly their offset. Bytes this log
        already has are compared and skipped (the HA client may resend after a restart); a gap
        or a disagreeing overlap is refused: the HA client sees the position stay and stops."""
        log_offset_bytes, data = parcels.unpack_replica(buffer, offset, size)
        commit_log = self.commit_log
        if self.broker_role is not BrokerRole.SLAVE or self._replica_stopped:
            self._replica_refused += 1
            return
        position_bytes = commit_log.write_log_offset_bytes
        if (
            position_bytes == 0
            and not commit_log.segment_starts_bytes
            and log_offset_bytes % commit_log.segment_size_bytes == 0
        ):
            # An empty slave starts where its master's log starts (RocketMQ: any start).
            commit_log.set_write_position(log_offset_bytes)
            position_bytes = log_offset_bytes
        if log_offset_bytes < position_bytes:
            overlap_bytes = min(len(data), position_bytes - log_offset_bytes)
            if not commit_log.replica_bytes_equal(log_offset_bytes, data[:overlap_bytes]):
                self._stop_replica(f"the master's bytes at {log_offset_bytes} differ from ours")
                return
            self._replica_overlap_bytes += overlap_bytes
            data = data[overlap_bytes:]
            log_offset_bytes += overlap_bytes
            if not data:
                return
        if log_offset_bytes != position_bytes:
            self._stop_replica(
                f"the master's bytes start at {log_offset_bytes}, our log ends at {position_bytes}"
            )
            return
        try:
            self.store.disk_guard.check_writable()
            result = commit_log.append_replica(np.frombuffer(data, dtype=np.uint8))
        except DiskFullError as error:
            # Not stored: the position stays, the HA client resends from it later.
            self._replica_refused += 1
            log.warning("replica not appended: %s", error)
            return
        except StoreError as error:
            self._stop_replica(f"the master's bytes are not whole records: {error}")
            return
        self._replica_records += result.record_count
        self._append_records += result.record_count
        self._append_bytes += len(data)

    def _stop_replica(self, reason: str) -> None:
        """Refuse every later replica: the HA client notices (docs/replication.md, divergence)."""
        self._replica_refused += 1
        if not self._replica_stopped:
            self._replica_stopped = True
            self.positions.publish_replica_stopped(self.commit_log.write_log_offset_bytes)
            log.error("replication stopped, this slave diverged from its master: %s", reason)

    # -- the idempotent window --------------------------------------------------------------------

    def _append_idempotent(
        self,
        sender: str,
        view: parcels.AppendView,
        topic: str,
        source: NDArray[np.uint8],
        sizes_bytes: NDArray[np.int32],
    ) -> None:
        """Store the records of an idempotent APPEND that the window does not hold, and answer
        for all of them (parcels.py, APPEND_ACK: a duplicate's offset is the first record's)."""
        self._idempotent_requests += 1
        if topic not in self.idempotent_topics:
            # Named before the first record is stored, so a rebuild after any crash finds it.
            try:
                save_idempotent_topics(self.store_root, self.idempotent_topics | {topic})
            except StoreError as error:
                log.error("the idempotent topics file was not written: %s", error)
                self._refuse(sender, view.request_id, _SYSTEM_ERROR, f"mqbox: {error}")
                return
            self.idempotent_topics.add(topic)
        count = view.record_count
        keys = record_keys(source, count)
        originals = self._originals(source, keys)
        if not originals:
            stored = self._append_checked(sender, view.request_id, source, sizes_bytes, topic, view)
            if stored is None:
                return
            self._remember(keys, record_log_offsets(stored, sizes_bytes), stored)
            ack = AppendAck(
                view.request_id,
                stored.log_offset_bytes,
                stored.queue_index,
                stored.store_timestamp_ms,
                count,
                _OK,
                "",
            )
            self._ack_when_durable(sender, view, stored.end_log_offset_bytes, ack)
            return
        self._idempotent_duplicates += len(originals)
        offsets = np.empty(count, dtype=np.int64)
        for index, (log_offset, _identity) in originals.items():
            offsets[index] = log_offset
        fresh = np.array([i for i in range(count) if i not in originals], dtype=np.int64)
        result: AppendResult | None = None
        if fresh.size:
            starts = keys.position_bytes[fresh]
            fresh_sizes = sizes_bytes[fresh].copy()
            fresh_records = np.concatenate(
                [
                    source[start : start + size]
                    for start, size in zip(starts, fresh_sizes, strict=True)
                ]
            )
            result = self._append_checked(
                sender, view.request_id, fresh_records, fresh_sizes, topic, view
            )
            if result is None:
                return
            fresh_offsets = record_log_offsets(result, fresh_sizes)
            offsets[fresh] = fresh_offsets
            fresh_keys = RecordKeys(
                keys.position_bytes[fresh],
                keys.key_hashes[fresh],
                keys.topic_hashes[fresh],
                keys.store_timestamps_ms[fresh],
                keys.has_key[fresh],
            )
            self._remember(fresh_keys, fresh_offsets, result)
        first = originals.get(0)
        if first is not None:
            first_queue_id, first_queue_index = first[1].queue_id, first[1].queue_index
        else:
            assert result is not None
            first_queue_id, first_queue_index = view.queue_id, result.queue_index
        ack = AppendAck(
            view.request_id,
            int(offsets[0]),
            first_queue_index,
            result.store_timestamp_ms if result is not None else 0,
            count,
            _OK,
            "",
            len(originals),
            first_queue_id,
            tuple(offsets.tolist()),
        )
        # The records stored before may not be flushed yet: wait for all that was written.
        self._ack_when_durable(sender, view, self.commit_log.write_log_offset_bytes, ack)

    def _originals(
        self, source: NDArray[np.uint8], keys: RecordKeys
    ) -> dict[int, tuple[int, RecordIdentity]]:
        """Record index -> (log offset, identity) of the stored record with the same topic and
        UNIQ_KEY, for every record of the batch the window holds. A hash alone proves nothing:
        each candidate is read back and compared byte for byte."""
        candidates = self.idempotence.first_candidates(keys.key_hashes, keys.has_key)
        if not candidates.any():
            return {}
        found: dict[int, tuple[int, RecordIdentity]] = {}
        write_end = self.commit_log.write_log_offset_bytes
        for index in np.flatnonzero(candidates).tolist():
            mine = record_identity(source, int(keys.position_bytes[index]))
            for log_offset in self.idempotence.candidates(int(keys.key_hashes[index])):
                stored = self.commit_log.read_record(log_offset, write_end)
                if stored is None:
                    continue  # deleted by retention: the key is as good as new
                identity = record_identity(stored)
                if identity.topic == mine.topic and identity.uniq_key == mine.uniq_key:
                    found[index] = (log_offset, identity)
                    break
        return found

    def _remember(
        self, keys: RecordKeys, log_offsets: NDArray[np.int64], result: AppendResult
    ) -> None:
        times = np.full(log_offsets.size, result.store_timestamp_ms, dtype=np.int64)
        self.idempotence.insert(keys.key_hashes, log_offsets, keys.has_key, times)

    def _refuse(self, sender: str, request_id: int, code: int, remark: str) -> None:
        self._refused_requests += 1
        self._send_ack(sender, AppendAck(request_id, -1, -1, 0, 0, code, remark))

    def _send_ack(self, sender: str, ack: AppendAck) -> None:
        outbox = self.ack_outboxes.get(sender)
        assert outbox is not None, f"no ack ring to {sender}"
        outbox.append(parcels.APPEND_ACK, parcels.pack_append_ack(ack))

    def _outboxes(self) -> list[Outbox]:
        """Every ring this role writes."""
        outboxes = [*self.ack_outboxes.values(), *self.written_outboxes]
        if self.ha_service_outbox is not None:
            outboxes.append(self.ha_service_outbox)
        return outboxes

    def _publish_written(self) -> None:
        position_bytes = self.commit_log.write_log_offset_bytes
        if position_bytes == self._published_log_offset_bytes:
            return
        assert position_bytes > self._published_log_offset_bytes
        self.positions.publish_write(position_bytes, self._append_records)
        self._published_log_offset_bytes = position_bytes
        self.flusher.note_written()  # ASYNC_FLUSH: a flush thread with nothing to flush sleeps
        written = parcels.pack_written(position_bytes, self._append_records)
        for outbox in self.written_outboxes:
            outbox.append(parcels.WRITTEN, written)
        if self._slave_count > 0 and self.ha_service_outbox is not None:
            self.ha_service_outbox.append(parcels.WRITTEN, written)

    def _covered_log_offset_bytes(self, names: tuple[str, ...]) -> int:
        """The least of the named positions (store/flush.py's seam): FLUSHED from the flush
        service, REPLICATED from the slaves' reports."""
        flushed_bytes = self.flusher.positions.covered_log_offset_bytes(SYNC_ACK_POSITIONS)
        covered_bytes = 1 << 62
        for name in names:
            position_bytes = (
                self._replicated_log_offset_bytes if name == REPLICATED else flushed_bytes
            )
            covered_bytes = min(covered_bytes, position_bytes)
        return covered_bytes

    def _release_sync_waits(self, now_ns: int) -> None:
        """Ack the waits their positions covered (in log order: one flush or one slave report
        releases every wait below it), and those whose time ran out."""
        for names, waits in self._sync_waits.items():
            if not waits:
                continue
            covered_bytes = self._covered_log_offset_bytes(names)
            while waits and waits[0].end_log_offset_bytes <= covered_bytes:
                wait = waits.popleft()
                self._send_ack(wait.sender, self._ack_with_code(wait.ack, wait.code_when_covered))
            while waits and waits[0].deadline_ns <= now_ns:
                wait = waits.popleft()
                self._sync_timeouts += 1
                self._send_ack(wait.sender, self._timed_out(wait))

    def _timed_out(self, wait: _SyncWait) -> AppendAck:
        """The ack of a wait past syncFlushTimeout: the slave's failure overrides the flush's
        (RocketMQ's thenCombine); the records are stored either way."""
        if self._replicated_log_offset_bytes < wait.end_log_offset_bytes and (
            self.broker_role is BrokerRole.SYNC_MASTER
        ):
            return wait.ack._replace(
                response_code=_FLUSH_SLAVE_TIMEOUT,
                remark="flush slave timeout: stored, but the slave has not confirmed it",
            )
        if wait.code_when_covered != _OK:
            return self._ack_with_code(wait.ack, wait.code_when_covered)
        return wait.ack._replace(
            response_code=_FLUSH_DISK_TIMEOUT,
            remark="flush disk timeout: stored, but not yet durable",
        )

    def _flush_outboxes(self) -> bool:
        all_written = True
        for outbox in self._outboxes():
            if outbox.pending_count:
                all_written = outbox.flush_nowait() and all_written
        return all_written

    # -- the orderly stop -------------------------------------------------------------------------

    def close(self) -> None:
        """Append what the senders left in the rings, flush, write the checkpoint, close the
        store and remove the abort marker (the next start takes the clean path)."""
        if self._closed:
            return
        self._closed = True
        for _round in range(STOP_DRAIN_ROUND_MAX):
            work = 0
            for inbox in self.inboxes:
                if inbox.ring.readable():
                    work += self._drain(inbox)
            if not work:
                break
        self.flusher.stop()
        self.flusher.flush_now()
        self._publish_written()
        # Waits for a slave that will not report again end as timeouts now: the stop must
        # not wait for them.
        self._release_sync_waits(1 << 62)
        assert not any(self._sync_waits.values())
        self._flush_outboxes()
        # The dispatcher stopped before this role (reverse START_ORDER) and published the store
        # times of its last flush: the final checkpoint covers everyone's final flush.
        self.housekeeper.stop()
        self.housekeeper.write_checkpoint()
        self.housekeeper.close()
        statistics = self.statistics()
        self.store.reader.close()
        self.commit_log.close()
        self.store.consume_queues.close()
        self.store.index.close()
        recovery.remove_abort_file(self.store_root)
        self.epoll.close()
        for fd in (self._flush_read_fd, self._flush_write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        for inbox in self.inboxes:
            inbox.ring.close()
        for outbox in self._outboxes():
            outbox.ring.close()
        self.positions.close()
        log.info("stopped cleanly: %s", statistics)

    def statistics(self) -> StoreWriterStatistics:
        flush = self.flusher.statistics()
        return StoreWriterStatistics(
            append_requests=self._append_requests,
            append_records=self._append_records,
            append_bytes=self._append_bytes,
            refused_requests=self._refused_requests,
            sync_waits=self._sync_wait_count,
            sync_timeouts=self._sync_timeouts,
            flush_count=flush.flush_total,
            flush_errors=flush.error_total,
            write_log_offset_bytes=self.commit_log.write_log_offset_bytes,
            flushed_log_offset_bytes=self.commit_log.flushed_log_offset_bytes,
            sleep_count=self.sleeper.sleep_count,
            turn_count=self._turn_count,
            idempotent_requests=self._idempotent_requests,
            idempotent_duplicates=self._idempotent_duplicates,
            idempotent_rebuilt_keys=self._idempotent_rebuilt_keys,
        )


def warm_up() -> None:
    """Compile recovery's kernels in the supervisor's zygote, so the writer inherits them."""
    recovery.warm_up_recovery_kernels()


def main(ctx: RoleContext) -> NoReturn:
    """The store writer role: open (recover) the store, serve appends until SIGTERM."""
    writer = StoreWriter(ctx, wakeup_fd=runtime.wakeup_fileno())
    ctx.report_ready(
        {
            "role": ctx.role.role_id,
            "pid": os.getpid(),
            "write_log_offset_bytes": writer.commit_log.write_log_offset_bytes,
            "recovered_clean": writer.recovery_report.was_clean,
        }
    )
    writer.run_forever()
