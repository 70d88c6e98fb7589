"""The schedule role: delayed delivery, RocketMQ's ScheduleMessageService, in one process.

Owns: `config/delayOffset.json` (the only writer; RocketMQ's `{"offsetTable":{"<level>":N}}`,
N the next SCHEDULE_TOPIC_XXXX queue index of that level to deliver), and the delivery of due
entries: for each level of messageDelayLevel, queue level - 1 of SCHEDULE_TOPIC_XXXX is read in
order from its offset; an entry whose delivery time (the tag field, which the dispatcher sets to
store time + the level's delay) has come is read back from the commit log, rewritten for its
REAL_TOPIC / REAL_QID (delivery.route_from_schedule) and appended through the store writer
like a send (APPEND, then APPEND_ACK on the ring back). The first entry that is not due stops
its level until its time.

Never: writes the commit log or a consume queue (it maps both read-only), answers a client, or
moves a level's persisted offset past an entry whose delivery is not both acknowledged by the
store writer and covered by the flushed position (queue_counters.StorePositions).

Delivery is at least once. The offsets file trails the deliveries: an entry counts as done once
its APPEND_ACK came back (or it was skipped, below) and every entry before it is done; it is
saved once the flushed position also covers its delivered record, every PERSIST_INTERVAL_MS
and at an orderly stop (after waiting up to STOP_WAIT_MS for acks and the flush). A process that
dies (SIGKILL, a crash; the supervisor re-forks it) starts again from the saved offsets and
delivers again what was delivered after them: those messages arrive twice. An orderly stop
delivers nothing twice unless the store writer was too slow to flush within STOP_WAIT_MS.
Nothing due is lost: an APPEND the dead process left in its ring is still appended by the store
writer (its ack then finds no owner and is dropped), and everything past the saved offset is
read again.

How it waits (no polling of its own): it sleeps in epoll on its two in-rings (the store
writer's acks and the dispatcher's QUEUES_GREW, which the dispatcher sends only when a schedule
queue grew) and the control wake-up pipe, until the next due time of any level, the next save,
or at most IDLE_WAIT_MS. Each turn reads each level's entry count from the dispatcher's
QueueCounters, or, for a queue the dispatcher has not touched since it started, from the queue
files as they were when this process opened them.

On a slave (brokerRole=SLAVE) the role delivers nothing and never writes delayOffset.json, as
Java shuts its ScheduleMessageService down on a slave: the master's deliveries reach the slave
through replication, and admin.0's slave sync writes the master's offsets into the file
(processors/admin/slave_sync.py). It still drains its rings, so the dispatcher never waits on it.

Other rules, as Java's: a delivery time more than the level's delay in the future (the clock
went back) counts as now; an offset below the queue's first entry (retention) moves up to it; an
entry whose record is gone or cannot be delivered (no REAL_TOPIC, a topic that takes no
deliveries, refused by the store as illegal) is skipped with an error in the log; an append the
store refuses for any other reason (disk full, a store error) stops its level for
RETRY_DELAY_MS and is tried again. At most IN_FLIGHT_COUNT_MAX appends per level are unanswered
at a time.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import os
import select
import struct
import time
from collections.abc import Callable
from typing import Final, NoReturn

from mqbox.clock import wall_clock_ms
from mqbox.config import BrokerRole, delay_level_durations_ms
from mqbox.errors import MessageIllegalError, MqboxError
from mqbox.ipc.ring import Ring
from mqbox.message import decode_record, encode_record, encode_topic
from mqbox.protocol.codes import ResponseCode
from mqbox.server import parcels, runtime, transport
from mqbox.server.queue_counters import (
    QueueCounters,
    StorePositions,
    queue_counters_name,
    queue_key,
    store_positions_name,
)
from mqbox.server.roles.processors import delivery
from mqbox.server.roles.processors.topics import SCHEDULE_TOPIC
from mqbox.server.roles.store_writer import store_config_of
from mqbox.server.runtime import RoleContext
from mqbox.server.topology import RoleKind
from mqbox.server.transport import Inbox, Outbox, Sleeper, SpillWriter
from mqbox.store import config_files
from mqbox.store.commit_log import CommitLog
from mqbox.store.consume_queue import ConsumeQueue, ConsumeQueueTable
from mqbox.store.layout import config_dir

log = logging.getLogger("mqbox.schedule")

IDLE_WAIT_MS: Final = 1000
PERSIST_INTERVAL_MS_DEFAULT: Final = 1000  # Java saves every 10 s (flushDelayOffsetInterval)
IN_FLIGHT_COUNT_MAX: Final = 256  # per level
READ_ENTRY_COUNT_MAX: Final = 64  # consume-queue entries per read
RETRY_DELAY_MS: Final = 10_000  # Java's DELAY_FOR_A_PERIOD after a refused append
STOP_WAIT_MS: Final = 3000
STOP_POLL_MS: Final = 10
BACKED_UP_RETRY_MS: Final = 1
CQ_MAP_COUNT_MAX: Final = 64
SCHEDULE_TOPIC_BYTES: Final = SCHEDULE_TOPIC.encode()
_SIZE: Final = struct.Struct("<i4x")  # one record size, padded to 8 bytes (parcels.APPEND)
_OK_CODES: Final = frozenset(  # stored, whether or not yet durable or replicated
    {
        int(ResponseCode.SUCCESS),
        int(ResponseCode.FLUSH_DISK_TIMEOUT),
        int(ResponseCode.SLAVE_NOT_AVAILABLE),
        int(ResponseCode.FLUSH_SLAVE_TIMEOUT),
    }
)
_MESSAGE_ILLEGAL: Final = int(ResponseCode.MESSAGE_ILLEGAL)

# A delivery's state.
SENT: Final = 0  # its APPEND is on the way, or waits for its ack
DONE: Final = 1  # acknowledged, or skipped
FAILED: Final = 2  # the store refused it; sent again after RETRY_DELAY_MS


@dataclasses.dataclass(slots=True)
class _Delivery:
    """One entry of a level taken for delivery."""

    queue_index: int
    log_offset_bytes: int  # of the schedule record
    size_bytes: int
    state: int = SENT
    delivered_size_bytes: int = 0  # of the record appended for it; 0 when skipped
    end_log_offset_bytes: int = 0  # where that record ends once acknowledged; 0 when skipped


@dataclasses.dataclass(slots=True)
class _Level:
    """One delay level: queue level - 1 of SCHEDULE_TOPIC_XXXX and its offsets."""

    level: int
    delay_ms: int
    next_index: int  # the next entry to take
    done_index: int  # every entry below is delivered or skipped
    saved_index: int  # what delayOffset.json may hold: done, and delivered records flushed
    in_flight: collections.deque[_Delivery] = dataclasses.field(default_factory=collections.deque)
    # (index after a done entry, end of its delivered record), waiting for the flush
    unflushed: collections.deque[tuple[int, int]] = dataclasses.field(
        default_factory=collections.deque
    )
    due_ms: int | None = None  # the time of the entry at next_index, when it is not due
    retry_due_ms: int = 0  # after a refusal: nothing before this
    failed_count: int = 0
    counter_key: int = 0  # queue_counters.queue_key of the level's queue
    counter_slot: int = -1
    queue: ConsumeQueue | None = None

    @property
    def queue_id(self) -> int:
        return self.level - 1


@dataclasses.dataclass(frozen=True, slots=True)
class ScheduleStatistics:
    delivered: int  # appends acknowledged
    skipped: int  # entries that could not be delivered (logged)
    refused: int  # appends the store refused (tried again later)
    in_flight: int
    wakeups: int  # QUEUES_GREW parcels from the dispatcher
    saves: int  # writes of delayOffset.json
    offsets: dict[int, int]  # level -> saved offset
    sleep_count: int
    turn_count: int


class ScheduleRole:
    """One schedule process's state. `run_forever()` is the role; tests drive `run_once()`,
    `persist_now()` and `close()`."""

    def __init__(
        self,
        ctx: RoleContext,
        *,
        spin_ns_max: int = 0,
        wakeup_fd: int | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
        persist_interval_ms: int = PERSIST_INTERVAL_MS_DEFAULT,
        in_flight_count_max: int = IN_FLIGHT_COUNT_MAX,
        stop_wait_ms: int = STOP_WAIT_MS,
    ) -> None:
        assert ctx.role.kind is RoleKind.SCHEDULE
        assert persist_interval_ms > 0
        assert in_flight_count_max > 0
        assert stop_wait_ms >= 0
        self.role_id = ctx.role.role_id
        # A slave's deliveries come from its master (module docstring).
        self.delivers = ctx.broker.broker_role is not BrokerRole.SLAVE
        self.stop_wait_ns = stop_wait_ms * 1_000_000
        self.clock_ms = clock_ms
        self.persist_interval_ns = persist_interval_ms * 1_000_000
        self.in_flight_count_max = in_flight_count_max
        self.config_dir = config_dir(ctx.store_root)
        config = store_config_of(ctx)
        self.max_message_size_bytes = config.max_message_size_bytes
        self.positions = StorePositions.attach(store_positions_name(ctx.instance))
        self.counters = QueueCounters.attach(queue_counters_name(ctx.instance))
        self.commit_log = CommitLog.open(
            ctx.store_root,
            config.geometry,
            writable=False,
            record_size_bytes_max=config.max_message_size_bytes,
            store_host=config.store_host,
        )
        self.consume_queues = ConsumeQueueTable(
            ctx.store_root, config.geometry, writable=False, map_count_max=CQ_MAP_COUNT_MAX
        )
        saved = config_files.load_delay_offsets(self.config_dir, use_backup_if_corrupt=True)
        durations_ms = delay_level_durations_ms(ctx.broker.message_delay_level)
        self.levels: list[_Level] = []
        for number, delay_ms in enumerate(durations_ms, start=1):
            offset = max(0, saved.get(number, 0))
            level = _Level(number, delay_ms, offset, offset, offset)
            level.counter_key = queue_key(SCHEDULE_TOPIC_BYTES, level.queue_id)
            self.levels.append(level)
        # Levels the file holds beyond messageDelayLevel are kept as they are (Java keeps them).
        self._other_offsets = {
            level: index for level, index in saved.items() if not 1 <= level <= len(self.levels)
        }
        self._saved_offsets = dict(saved)
        for level in self.levels:
            self._open_queue(level)
        topology = ctx.topology
        self.spill_writer = SpillWriter(ctx.instance, self.role_id)
        self.inboxes = [
            Inbox(Ring.attach(spec.name), spec.producer) for spec in topology.rings_to(self.role_id)
        ]
        writer_ids = [role.role_id for role in topology.roles_of(RoleKind.STORE_WRITER)]
        assert len(writer_ids) == 1, "a broker has one store writer"
        self.writer_outbox = Outbox(
            Ring.attach(topology.ring(self.role_id, writer_ids[0]).name), self.spill_writer
        )
        self.epoll = select.epoll()
        self.sleeper = Sleeper(self.epoll, self.inboxes, spin_ns_max)
        self.wakeup_fd = wakeup_fd
        if wakeup_fd is not None:
            self.epoll.register(wakeup_fd, select.EPOLLIN)
        # Request ids carry the pid, so acks meant for a dead predecessor match nothing here.
        self._request_ids = itertools.count(((os.getpid() & 0xFFFFFFFF) << 32) + 1)
        self._requests: dict[int, tuple[_Level, _Delivery]] = {}
        self._persist_due_ns = time.monotonic_ns() + self.persist_interval_ns
        self._delivered = 0
        self._skipped = 0
        self._refused = 0
        self._wakeups = 0
        self._saves = 0
        self._turn_count = 0
        self._closed = False

    # -- the loop ---------------------------------------------------------------------------------

    def run_forever(self) -> NoReturn:
        runtime.run_until_stopped(self.run_once, self.close)

    def run_once(self, timeout_ms: int) -> int:
        """One turn: acks and wake-ups in, due entries out, offsets saved when due. Returns the
        parcels handled plus the appends made; sleeps up to timeout_ms (negative: until the next
        due time, at most IDLE_WAIT_MS) only when idle."""
        self._turn_count += 1
        work = 0
        for inbox in self.inboxes:
            if inbox.ring.readable():
                work += self._drain(inbox)
        if self.delivers:
            work += self.deliver_due(self.clock_ms())
        now_ns = time.monotonic_ns()
        if now_ns >= self._persist_due_ns:
            self._persist_due_ns = now_ns + self.persist_interval_ns
            self.persist_now()
            # Drop maps of segments retention deleted, so their blocks are freed.
            self.commit_log.follow_retention(self.positions.min_log_offset_bytes)
        all_written = self.writer_outbox.flush_nowait()
        if work:
            return work
        wait_ms = min(IDLE_WAIT_MS, -(-(self._persist_due_ns - time.monotonic_ns()) // 1_000_000))
        due_ms = self.next_due_ms() if self.delivers else None
        if due_ms is not None:
            wait_ms = min(wait_ms, due_ms - self.clock_ms())
        wait_ms = max(0, wait_ms)
        if timeout_ms >= 0:
            wait_ms = min(wait_ms, timeout_ms)
        if not all_written:
            wait_ms = min(wait_ms, BACKED_UP_RETRY_MS)
        for fd, _mask in self.sleeper.wait(wait_ms):
            if fd == self.wakeup_fd:
                runtime.clear_wakeup_nowait()
        return 0

    def next_due_ms(self) -> int | None:
        """The earliest time a level has something to do (wall clock ms), if any is waiting."""
        due: list[int] = []
        for level in self.levels:
            if level.failed_count:
                due.append(level.retry_due_ms)
            elif level.due_ms is not None:
                due.append(max(level.due_ms, level.retry_due_ms))
        return min(due, default=None)

    def _drain(self, inbox: Inbox) -> int:
        batch = inbox.drain_nowait(transport.BATCH_COUNT_MAX)
        handled = 0
        try:
            for parcel_type, buffer, offset, size in inbox.parcels(batch):
                handled += 1
                if parcel_type == parcels.APPEND_ACK:
                    self._on_ack(parcels.unpack_append_ack(buffer, offset, size))
                elif parcel_type == parcels.QUEUES_GREW:
                    self._wakeups += 1  # the counts are read afresh in deliver_due
                else:
                    raise AssertionError(f"{self.role_id} got parcel type {parcel_type}")
        finally:
            inbox.release(batch)
        return handled

    # -- delivering -------------------------------------------------------------------------------

    def deliver_due(self, now_ms: int) -> int:
        """Append every entry whose time has come (within the in-flight bound); the appends."""
        appended = 0
        for level in self.levels:
            if level.retry_due_ms > now_ms:
                continue
            if level.failed_count:
                appended += self._send_failed_again(level)
            appended += self._deliver_level(level, now_ms)
        return appended

    def _deliver_level(self, level: _Level, now_ms: int) -> int:
        queue = level.queue
        if queue is None:
            # A queue made after this process opened the others: the dispatcher publishes it.
            level.counter_slot = self._find_slot(level)
            if level.counter_slot < 0:
                return 0
            queue = self._open_queue(level)
            if queue is None:
                return 0
        entry_count = self._entry_count(level, queue)
        if level.next_index < queue.min_queue_index:
            log.error(
                "level %d: offset %d is below the queue's first entry %d (retention); moving up",
                level.level,
                level.next_index,
                queue.min_queue_index,
            )
            level.next_index = queue.min_queue_index
            if not level.in_flight:
                level.done_index = level.saved_index = level.next_index
                level.unflushed.clear()
        appended = 0
        level.due_ms = None
        while level.next_index < entry_count:
            room = self.in_flight_count_max - len(level.in_flight)
            if room <= 0:
                return appended
            count = min(READ_ENTRY_COUNT_MAX, entry_count - level.next_index, room)
            entries = queue.read(level.next_index, count)
            if len(entries) == 0:
                return appended  # retention raced this read; the next turn moves up
            for log_offset_bytes, size_bytes, tag in zip(
                entries["log_offset_bytes"].tolist(),
                entries["size_bytes"].tolist(),
                entries["tag_hash"].tolist(),
                strict=True,
            ):
                # Java's correctDeliverTimestamp: a time further away than the level's delay
                # was stamped by a clock that has gone back since; it is due now.
                due_ms = tag if tag <= now_ms + level.delay_ms else now_ms
                if due_ms > now_ms:
                    level.due_ms = due_ms
                    return appended
                entry = _Delivery(level.next_index, log_offset_bytes, size_bytes)
                level.next_index += 1
                level.in_flight.append(entry)
                appended += self._send(level, entry)
            self._advance(level)
        return appended

    def _send(self, level: _Level, entry: _Delivery) -> int:
        """Append the delivery of `entry` (1), or mark it skipped when it cannot be (0)."""
        record = self.commit_log.read_record(
            entry.log_offset_bytes, self.positions.write_log_offset_bytes
        )
        try:
            if record is None or len(record) != entry.size_bytes:
                raise MessageIllegalError("no record of that size there (deleted by retention?)")
            message = delivery.route_from_schedule(decode_record(record))
            delivered = encode_record(message, body_size_bytes_max=self.max_message_size_bytes)
        except MessageIllegalError as error:
            log.error(
                "level %d entry %d (log offset %d) is skipped: %s",
                level.level,
                entry.queue_index,
                entry.log_offset_bytes,
                error,
            )
            self._skipped += 1
            entry.state = DONE
            return 0
        request_id = next(self._request_ids)
        topic = encode_topic(message.topic)
        head = parcels.pack_append_head(request_id, 1, message.queue_id, 0, topic, len(delivered))
        self.writer_outbox.append(parcels.APPEND, head, _SIZE.pack(len(delivered)), delivered)
        entry.state = SENT
        entry.delivered_size_bytes = len(delivered)
        self._requests[request_id] = (level, entry)
        return 1

    def _send_failed_again(self, level: _Level) -> int:
        appended = 0
        for entry in level.in_flight:
            if entry.state == FAILED:
                appended += self._send(level, entry)
        level.failed_count = 0
        self._advance(level)
        return appended

    def _on_ack(self, ack: parcels.AppendAck) -> None:
        found = self._requests.pop(ack.request_id, None)
        if found is None:
            return  # meant for this role's previous process
        level, entry = found
        if ack.response_code in _OK_CODES:
            assert ack.record_count == 1
            self._delivered += 1
            entry.state = DONE
            entry.end_log_offset_bytes = ack.log_offset_bytes + entry.delivered_size_bytes
        elif ack.response_code == _MESSAGE_ILLEGAL:
            log.error(
                "level %d entry %d is skipped: the store refused it (%s)",
                level.level,
                entry.queue_index,
                ack.remark,
            )
            self._skipped += 1
            entry.state = DONE
        else:
            log.warning(
                "level %d entry %d: the store refused the delivery (%d %s); again in %d ms",
                level.level,
                entry.queue_index,
                ack.response_code,
                ack.remark,
                RETRY_DELAY_MS,
            )
            self._refused += 1
            entry.state = FAILED
            level.failed_count += 1
            level.retry_due_ms = self.clock_ms() + RETRY_DELAY_MS
        self._advance(level)

    @staticmethod
    def _advance(level: _Level) -> None:
        """Move done_index over the done entries at the head of the level's in-flight list."""
        in_flight = level.in_flight
        while in_flight and in_flight[0].state == DONE:
            entry = in_flight.popleft()
            level.done_index = entry.queue_index + 1
            level.unflushed.append((level.done_index, entry.end_log_offset_bytes))

    # -- the level's queue ------------------------------------------------------------------------

    def _open_queue(self, level: _Level) -> ConsumeQueue | None:
        queue = self.consume_queues.find_queue(SCHEDULE_TOPIC, level.queue_id)
        if queue is None:
            return None
        level.queue = queue
        if level.next_index > queue.entry_count and not level.in_flight:
            # A saved offset past the queue's end: a store replaced under its config files.
            log.warning(
                "level %d: saved offset %d is past the queue's end %d; starting there",
                level.level,
                level.next_index,
                queue.entry_count,
            )
            level.next_index = level.done_index = level.saved_index = queue.entry_count
        return queue

    def _find_slot(self, level: _Level) -> int:
        return self.counters.find_slot(SCHEDULE_TOPIC_BYTES, level.queue_id, level.counter_key)

    def _entry_count(self, level: _Level, queue: ConsumeQueue) -> int:
        """The level's readable entry count: the dispatcher's published one once it has one."""
        if level.counter_slot < 0:
            level.counter_slot = self._find_slot(level)
        if level.counter_slot >= 0:
            published = self.counters.entry_count_at(level.counter_slot)
            if published > queue.entry_count:
                queue.observe_entry_count(published)
        return queue.entry_count

    # -- offsets ----------------------------------------------------------------------------------

    def offsets(self) -> dict[int, int]:
        """What delayOffset.json gets now: each level's offset below which every entry is
        delivered and flushed (levels outside messageDelayLevel as read)."""
        flushed_bytes = self.positions.flushed_log_offset_bytes
        table = dict(self._other_offsets)
        for level in self.levels:
            unflushed = level.unflushed
            while unflushed and unflushed[0][1] <= flushed_bytes:
                level.saved_index = unflushed.popleft()[0]
            table[level.level] = level.saved_index
        return table

    def persist_now(self) -> bool:
        """Save delayOffset.json if its table changed; False if the disk refused (logged). A
        slave's role saves nothing: the slave sync owns the file there."""
        if not self.delivers:
            return True
        table = self.offsets()
        if table == self._saved_offsets:
            return True
        try:
            config_files.save_delay_offsets(self.config_dir, table)
        except (OSError, MqboxError) as error:
            log.error("saving %s failed: %s", self.config_dir / "delayOffset.json", error)
            return False
        self._saved_offsets = table
        self._saves += 1
        return True

    # -- the orderly stop -------------------------------------------------------------------------

    def close(self) -> None:
        """Wait up to `stop_wait_ms` (STOP_WAIT_MS) for the acks of what was sent and for the
        flush to cover the deliveries (the store writer stops after this role), save the
        offsets, release."""
        if self._closed:
            return
        self._closed = True
        deadline_ns = time.monotonic_ns() + self.stop_wait_ns
        while time.monotonic_ns() < deadline_ns and (
            self._requests or self.writer_outbox.pending_count
        ):
            self.writer_outbox.flush_nowait()
            for inbox in self.inboxes:
                if inbox.ring.readable():
                    self._drain(inbox)
            if self._requests:
                time.sleep(STOP_POLL_MS / 1000)
        flushed_bytes = self.positions.flushed_log_offset_bytes
        while time.monotonic_ns() < deadline_ns and any(
            level.unflushed and level.unflushed[-1][1] > flushed_bytes for level in self.levels
        ):
            time.sleep(STOP_POLL_MS / 1000)
            flushed_bytes = self.positions.flushed_log_offset_bytes
        self.persist_now()
        statistics = self.statistics()
        self.epoll.close()
        for inbox in self.inboxes:
            inbox.ring.close()
        self.writer_outbox.ring.close()
        self.consume_queues.close()
        self.commit_log.close()
        self.positions.close()
        self.counters.close()
        log.info("stopped cleanly: %s", statistics)

    def statistics(self) -> ScheduleStatistics:
        return ScheduleStatistics(
            delivered=self._delivered,
            skipped=self._skipped,
            refused=self._refused,
            in_flight=len(self._requests),
            wakeups=self._wakeups,
            saves=self._saves,
            offsets=dict(self._saved_offsets),
            sleep_count=self.sleeper.sleep_count,
            turn_count=self._turn_count,
        )


def main(ctx: RoleContext) -> NoReturn:
    """The schedule role: deliver due delayed messages until SIGTERM (runtime.py)."""
    role = ScheduleRole(ctx, wakeup_fd=runtime.wakeup_fileno())
    ctx.report_ready(
        {
            "role": ctx.role.role_id,
            "pid": os.getpid(),
            "levels": len(role.levels),
            "offsets": role.statistics().offsets,
        }
    )
    role.run_forever()
