"""The dispatcher role: commit-log records -> consume queues and index, then wake held pulls.

Owns, once the store writer's recovery is done: the consume queues and the index files (the only
writer of both), the dispatched position, the QueueCounters segment (queue_counters.py: each
queue's entry count and the dispatched position, for the pull processors), the QUEUES_GREW
records that wake held pulls, the consume-queue / index flush schedule, whose covered positions
and store times it publishes in QueueCounters for the checkpoint (the store writer alone writes
that file), and the retention of consume queues and index: after each flush, when the commit
log's minimum that the store writer published moved, the segments and files wholly below it are
deleted (cleanup.DerivedRetention). RocketMQ's ReputMessageService, FlushConsumeQueueService and
CleanConsumeQueueService in one process.

The flush schedule: the consume queues every flushIntervalConsumeQueue ms; the index only at
the first of those flushes at least mqboxFlushIntervalIndexMs after its last one (60 s by
default), when a file fills (IndexService rolls it: the full file is flushed whole) and at the
stop. The index's slot table is probed at random, so each flush writes back and write-protects
every page touched since the last one (about 5,000 of its 20 MB at any rate), and each page is
faulted writable again by the next key that lands in it: flushed every second that was 15 % of
the dispatcher's CPU and 13.5 % in faults (docs/BENCHMARKS.md, issue 15). The checkpoint's index
position and time move only at an index flush, so after a crash recovery cuts the index there
and indexes the records after it again from the commit log (recovery.py, point 3), as RocketMQ
rebuilds from the checkpoint's index time.

Never: writes the commit log (it maps it read-only), decides where dispatch starts (the store
writer's recovery published it), answers a client, or touches a socket.

How it follows the writer: each WRITTEN parcel (and, as a fallback, the write position in
StorePositions) says how far the commit log holds whole records; each loop turn dispatches up to
the largest such position with store.dispatch.Dispatcher (the numba scan), then publishes, in
this order: the new entry counts of the queues that grew (looked at one by one when the
dispatch appended to or met at most FEW_GROWN_COUNT_MAX queues, a lone send's case; else every
queue's count compared at once with numpy), the dispatched position (which bumps
the change sequence), and one QUEUES_GREW parcel naming the queues that grew, or
QUEUES_GREW_FLAG_MANY when more than `grew_key_count_max` did, to each pull processor whose
holding word in the control block says it holds pulls (the counts, a fence, then the word;
pull.py, "Long polling", has the other half). A pull that reads a count therefore finds every
entry below it written, and a send that no consumer waits for wakes no pull processor. The
schedule role gets a QUEUES_GREW (of the schedule queues alone) only when a SCHEDULE_TOPIC_XXXX
queue grew, at most one staged at a time.

How it waits: in one epoll on the WRITTEN rings' doorbells and the stop descriptor, up to the
consume-queue flush's due time while something dispatched is not flushed yet, and otherwise up
to cleanResourceInterval, when it looks whether the store writer's retention moved the commit
log's minimum (RocketMQ's CleanConsumeQueueService runs as often): an idle dispatcher has no
flush to make, so it does not wake once a second for one (issue 15).

Invariants: the published count of a queue equals its ConsumeQueue's entry_count between turns
(both only grow); the dispatched position never passes the published write position.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import select
import time
from typing import Final, NoReturn, TypeVar

import numpy as np
from numpy.typing import NDArray

from mqbox.ipc.doorbell import memory_fence
from mqbox.ipc.ring import Ring
from mqbox.server import parcels, runtime, transport
from mqbox.server.queue_counters import (
    QUEUE_CAPACITY_DEFAULT,
    QueueCounters,
    StorePositions,
    queue_counters_name,
    queue_key,
    store_positions_name,
)
from mqbox.server.roles.store_writer import store_config_of
from mqbox.server.runtime import RoleContext
from mqbox.server.topology import RoleKind
from mqbox.server.transport import Inbox, Outbox, Sleeper, SpillWriter
from mqbox.store.cleanup import DerivedRetention
from mqbox.store.commit_log import CommitLog
from mqbox.store.consume_queue import ConsumeQueueTable
from mqbox.store.dispatch import SCHEDULE_TOPIC, Dispatcher
from mqbox.store.index import IndexService

log = logging.getLogger("mqbox.dispatcher")
_Scalar = TypeVar("_Scalar", bound=np.generic)

GREW_KEY_COUNT_MAX_DEFAULT: Final = 64
# A turn that appended to or met at most this many queues publishes their counts one by one;
# more, and it compares every queue's count with numpy.
FEW_GROWN_COUNT_MAX: Final = 8
BACKED_UP_RETRY_MS: Final = 1


@dataclasses.dataclass(frozen=True, slots=True)
class DispatcherRoleStatistics:
    dispatched_log_offset_bytes: int
    dispatch_rounds: int
    record_total: int
    wakeups_sent: int
    many_wakeups_sent: int
    queue_count: int
    counter_overflow_count: int
    flush_rounds: int
    index_flush_rounds: int
    sleep_count: int
    turn_count: int


class DispatcherRole:
    """One dispatcher process's state. `run_forever()` is the role; tests drive `run_once()`."""

    def __init__(
        self,
        ctx: RoleContext,
        *,
        spin_ns_max: int = transport.SPIN_NS_MAX_DEFAULT,
        wakeup_fd: int | None = None,
        queue_capacity: int = QUEUE_CAPACITY_DEFAULT,
        grew_key_count_max: int = GREW_KEY_COUNT_MAX_DEFAULT,
    ) -> None:
        assert ctx.role.kind is RoleKind.DISPATCHER
        assert grew_key_count_max >= 0
        self.role_id = ctx.role.role_id
        self.store_root = ctx.store_root
        self.grew_key_count_max = grew_key_count_max
        self.flush_interval_ns = ctx.broker.flush_interval_consume_queue_ms * 1_000_000
        self.index_flush_interval_ns = ctx.broker.flush_interval_index_ms * 1_000_000
        self.retention_check_interval_ms = ctx.broker.clean_resource_interval_ms
        config = store_config_of(ctx)
        geometry = config.geometry
        self.positions = StorePositions.attach(store_positions_name(ctx.instance))
        assert self.positions.ready, "the store writer reports ready only after recovery"
        self.commit_log = CommitLog.open(
            ctx.store_root,
            geometry,
            writable=False,
            record_size_bytes_max=config.max_message_size_bytes,
            store_host=config.store_host,
        )
        self.consume_queues = ConsumeQueueTable(
            ctx.store_root, geometry, writable=True, map_count_max=config.cq_map_count_max
        )
        self.index = IndexService(ctx.store_root, geometry, writable=True)
        self.index.load()
        self.dispatcher = Dispatcher(
            self.commit_log,
            self.consume_queues,
            self.index,
            delay_levels_ms=config.delay_levels_ms,
            record_count_max=config.dispatch_record_count_max,
        )
        start_bytes = self.positions.dispatch_start_log_offset_bytes
        self.dispatcher.start_at(start_bytes, redispatch_end_log_offset_bytes=start_bytes)
        # Recovery made the queues' minimums follow the commit log's at open; a minimum that
        # moved in an earlier run whose files were not all deleted is followed at the first flush.
        self.retention = DerivedRetention(self.consume_queues, self.index, min_log_offset_bytes=0)
        self.counters = QueueCounters.create(queue_counters_name(ctx.instance), queue_capacity)
        self.counters.publish_dispatched(start_bytes)
        # Per dispatcher queue slot: its counters slot (-1: no room), its key, its last count.
        self._counter_slots = np.full(64, -1, dtype=np.int64)
        self._queue_keys = np.zeros(64, dtype=np.uint64)
        self._published_counts = np.zeros(64, dtype=np.int64)
        self._known_queue_count = 0
        topology = ctx.topology
        self.spill_writer = SpillWriter(ctx.instance, self.role_id)
        self.inboxes = [
            Inbox(Ring.attach(spec.name), spec.producer) for spec in topology.rings_to(self.role_id)
        ]
        self.pull_outboxes: list[Outbox] = []
        # The pull processors' holding words (control_block.py), outbox by outbox; None: no
        # control block (unit tests), so every pull processor hears of every growth.
        self.control = getattr(ctx, "control", None)
        self._pull_role_ids: list[str] = []
        # The schedule role hears only of SCHEDULE_TOPIC_XXXX queues (schedule.py).
        self.schedule_outboxes: list[Outbox] = []
        for spec in topology.rings_from(self.role_id):
            outbox = Outbox(Ring.attach(spec.name), self.spill_writer)
            if spec.consumer.startswith(RoleKind.SCHEDULE.value + "."):
                self.schedule_outboxes.append(outbox)
            else:
                self.pull_outboxes.append(outbox)
                self._pull_role_ids.append(spec.consumer)
        self._is_schedule_slot = np.zeros(64, dtype=np.bool_)
        self.epoll = select.epoll()
        self.sleeper = Sleeper(self.epoll, self.inboxes, spin_ns_max)
        self.wakeup_fd = wakeup_fd
        if wakeup_fd is not None:
            self.epoll.register(wakeup_fd, select.EPOLLIN)
        self._target_log_offset_bytes = start_bytes
        self._flush_due_ns = time.monotonic_ns() + self.flush_interval_ns
        self._index_flush_due_ns = time.monotonic_ns() + self.index_flush_interval_ns
        self._dispatch_rounds = 0
        self._wakeups_sent = 0
        self._many_wakeups_sent = 0
        self._flush_rounds = 0
        self._index_flush_rounds = 0
        self._turn_count = 0
        self._closed = False
        # Whatever the writer appended between its ready and ours (nothing, unless a sender
        # started early) is dispatched before the pull processors start.
        self.dispatch_nowait()

    # -- the loop ---------------------------------------------------------------------------------

    def run_forever(self) -> NoReturn:
        runtime.run_until_stopped(self.run_once, self.close)

    def run_once(self, timeout_ms: int) -> int:
        """One turn: read WRITTEN parcels, dispatch, publish, flush when due. Returns the records
        dispatched plus the WRITTEN parcels read; sleeps up to timeout_ms only when idle."""
        self._turn_count += 1
        work = 0
        for inbox in self.inboxes:
            if inbox.ring.readable():
                work += self._drain(inbox)
        work += self.dispatch_nowait()
        now_ns = time.monotonic_ns()
        if now_ns >= self._flush_due_ns:
            self._flush_due_ns = now_ns + self.flush_interval_ns
            self.flush(index=now_ns >= self._index_flush_due_ns)
        all_written = self._flush_outboxes()
        if work:
            return work
        due_ns = self._flush_wanted_ns()
        if due_ns is not None:
            due_ms = -(-(due_ns - now_ns) // 1_000_000)
            wait_ms = max(0, min(self.retention_check_interval_ms, due_ms))
        else:
            wait_ms = self.retention_check_interval_ms  # the flush when it wakes follows it
        if timeout_ms >= 0:
            wait_ms = min(wait_ms, timeout_ms)
        if not all_written:
            wait_ms = min(wait_ms, BACKED_UP_RETRY_MS)
        for fd, _mask in self.sleeper.wait(wait_ms):
            if fd == self.wakeup_fd:
                runtime.clear_wakeup_nowait()
        return 0

    def _flush_wanted_ns(self) -> int | None:
        """When the next flush that has something to cover is due (monotonic ns), or None when
        the last flushes covered every dispatched record: the consume queues' tick while they
        lag, else the index's own (once a minute) while only it lags, so a quiet dispatcher does
        not wake each second for a minute after the last send."""
        counters = self.counters
        dispatched_bytes = self.dispatcher.dispatched_log_offset_bytes
        if dispatched_bytes > counters.logics_flushed_log_offset_bytes:
            return self._flush_due_ns
        if dispatched_bytes > counters.index_flushed_log_offset_bytes:
            return max(self._flush_due_ns, self._index_flush_due_ns)
        return None

    def _drain(self, inbox: Inbox) -> int:
        batch = inbox.drain_nowait(transport.BATCH_COUNT_MAX)
        handled = 0
        try:
            for parcel_type, buffer, offset, _size in inbox.parcels(batch):
                handled += 1
                if parcel_type != parcels.WRITTEN:
                    raise AssertionError(f"dispatcher got parcel type {parcel_type}")
                position_bytes, _appended_total = parcels.unpack_written(buffer, offset)
                self._target_log_offset_bytes = max(self._target_log_offset_bytes, position_bytes)
        finally:
            inbox.release(batch)
        return handled

    def dispatch_nowait(self) -> int:
        """Dispatch up to the newest write position known, publish, wake pulls; the records."""
        target_bytes = max(self._target_log_offset_bytes, self.positions.write_log_offset_bytes)
        self._target_log_offset_bytes = target_bytes
        if target_bytes <= self.dispatcher.dispatched_log_offset_bytes:
            return 0
        record_count = self.dispatcher.dispatch(target_bytes)
        self._dispatch_rounds += 1
        self._publish()
        return record_count

    def _publish(self) -> None:
        queue_count = self.dispatcher.tables.queue_count
        registered_first = self._known_queue_count
        if queue_count > registered_first:
            self._register_queues(queue_count)
        appended_slots = self.dispatcher.appended_slots
        if len(appended_slots) + queue_count - registered_first <= FEW_GROWN_COUNT_MAX:
            # A lone send: look at the queues the dispatch appended to and the ones it met
            # (registered with the count their files hold), one by one (issue 15).
            grown = self._publish_few([*appended_slots, *range(registered_first, queue_count)])
        else:
            grown = self._publish_many(queue_count)
        dispatched_bytes = self.dispatcher.dispatched_log_offset_bytes
        self.counters.publish_dispatched(dispatched_bytes)
        if grown and self.schedule_outboxes:
            self._wake_schedule(dispatched_bytes, grown)
        if not grown or not self.pull_outboxes:
            return
        holding = self._pull_outboxes_holding()
        if not holding:
            return
        if len(grown) > self.grew_key_count_max:
            payload = parcels.pack_queues_grew(dispatched_bytes, b"", parcels.QUEUES_GREW_FLAG_MANY)
            self._many_wakeups_sent += 1
        else:
            payload = parcels.pack_queues_grew(dispatched_bytes, self._key_bytes(grown))
        for outbox in holding:
            outbox.append(parcels.QUEUES_GREW, payload)
        self._wakeups_sent += 1

    def _publish_few(self, slots: list[int]) -> list[int]:
        """Publish the counts of those of `slots` that grew; return those, in slot order."""
        counts = self.dispatcher.max_offsets_by_slot()
        published = self._published_counts
        grown: list[int] = []
        for slot in sorted(set(slots)):
            count = int(counts[slot])
            if count == published[slot]:
                continue
            published[slot] = count
            counter_slot = int(self._counter_slots[slot])
            if counter_slot >= 0:
                self.counters.publish_count(counter_slot, count)
            grown.append(slot)
        return grown

    def _publish_many(self, queue_count: int) -> list[int]:
        """Publish the counts of every queue that grew since the last turn; return those."""
        counts = self.dispatcher.max_offsets_by_slot()
        assert counts.size == queue_count
        published = self._published_counts[:queue_count]
        grown = np.flatnonzero(counts != published)
        if grown.size:
            new_counts = counts[grown]
            counter_slots = self._counter_slots[grown]
            has_room = counter_slots >= 0
            self.counters.publish_counts(counter_slots[has_room], new_counts[has_room])
            published[grown] = new_counts
        grown_slots: list[int] = grown.tolist()
        return grown_slots

    def _key_bytes(self, slots: list[int]) -> bytes:
        """The queue keys of `slots`, little-endian u64 each, for a QUEUES_GREW parcel."""
        keys = self._queue_keys
        return b"".join(int(keys[slot]).to_bytes(8, "little") for slot in slots)

    def _pull_outboxes_holding(self) -> list[Outbox]:
        """The outboxes of the pull processors that hold pulls now. The counts were published
        before: the fence orders those stores before these loads (check-after-set)."""
        control = self.control
        if control is None:
            return self.pull_outboxes
        memory_fence()
        return [
            outbox
            for outbox, role_id in zip(self.pull_outboxes, self._pull_role_ids, strict=True)
            if control.holding(role_id)
        ]

    def _wake_schedule(self, dispatched_bytes: int, grown: list[int]) -> None:
        """QUEUES_GREW to the schedule role when a schedule queue grew; one staged at a time is
        enough, since it reads the counts afresh (so a dead schedule role costs no memory)."""
        is_schedule_slot = self._is_schedule_slot
        scheduled = [slot for slot in grown if is_schedule_slot[slot]]
        if not scheduled:
            return
        payload = parcels.pack_queues_grew(dispatched_bytes, self._key_bytes(scheduled))
        for outbox in self.schedule_outboxes:
            if outbox.pending_count == 0:
                outbox.append(parcels.QUEUES_GREW, payload)

    def _register_queues(self, queue_count: int) -> None:
        """Give the queues the dispatcher met since the last turn their counters slots."""
        capacity = self._counter_slots.size
        if queue_count > capacity:
            while capacity < queue_count:
                capacity *= 2
            self._counter_slots = _grown(self._counter_slots, capacity, -1)
            self._queue_keys = _grown(self._queue_keys, capacity, 0)
            self._published_counts = _grown(self._published_counts, capacity, 0)
            self._is_schedule_slot = _grown(self._is_schedule_slot, capacity, 0)
        queue_keys = self.dispatcher.tables.queue_keys
        for slot in range(self._known_queue_count, queue_count):
            topic, queue_id = queue_keys[slot]
            topic_bytes = topic.encode("utf-8", "surrogateescape")
            counter_slot = self.counters.insert(topic_bytes, queue_id, 0)
            if counter_slot < 0:
                log.error(
                    "queue counters are full (%d queues): %s/%d is not published; raise the "
                    "capacity",
                    self.counters.queue_capacity,
                    topic,
                    queue_id,
                )
            self._counter_slots[slot] = counter_slot
            self._queue_keys[slot] = queue_key(topic_bytes, queue_id)
            self._is_schedule_slot[slot] = topic == SCHEDULE_TOPIC
        self._known_queue_count = queue_count

    def _flush_outboxes(self) -> bool:
        all_written = True
        for outbox in (*self.pull_outboxes, *self.schedule_outboxes):
            if outbox.pending_count:
                all_written = outbox.flush_nowait() and all_written
        return all_written

    def flush(self, *, index: bool = True) -> None:
        """Flush the consume queues written since the last flush and, if `index`, the index
        files too; publish the dispatched position (taken before the flushes, so they cover it)
        and the store times they made durable, each for what was flushed, for the store
        writer's checkpoint; then follow retention. Without `index` the published index
        position stays where the last index flush left it (module docstring)."""
        dispatched_bytes = self.dispatcher.dispatched_log_offset_bytes
        logics_ms = self.dispatcher.last_store_timestamp_ms
        self.consume_queues.flush()
        self.counters.publish_logics_flushed(dispatched_bytes, max(logics_ms, 0))
        self._flush_rounds += 1
        if index:
            self._index_flush_due_ns = time.monotonic_ns() + self.index_flush_interval_ns
            index_ms = self.index.flush()
            self.counters.publish_index_flushed(dispatched_bytes, max(index_ms, 0))
            self._index_flush_rounds += 1
        self.follow_retention_nowait()

    def follow_retention_nowait(self) -> int:
        """Delete the consume-queue segments and index files below the commit log's minimum the
        store writer published, if it moved; return how many files went."""
        min_log_offset_bytes = self.positions.min_log_offset_bytes
        if min_log_offset_bytes <= self.retention.min_log_offset_bytes:
            return 0
        self.commit_log.follow_retention(min_log_offset_bytes)  # unmap the deleted segments
        cq_deleted_count, index_deleted_count = self.retention.delete_below(min_log_offset_bytes)
        self.counters.publish_derived_min_log_offset(min_log_offset_bytes)
        log.info(
            "retention: consume queues and index follow the commit log's minimum %d "
            "(%d consume-queue segment(s), %d index file(s) deleted)",
            min_log_offset_bytes,
            cq_deleted_count,
            index_deleted_count,
        )
        return cq_deleted_count + index_deleted_count

    # -- the orderly stop -------------------------------------------------------------------------

    def close(self) -> None:
        """Dispatch what the writer has published, flush the consume queues and the index
        (the store writer, which stops after this role, writes the checkpoint), release."""
        if self._closed:
            return
        self._closed = True
        for inbox in self.inboxes:
            if inbox.ring.readable():
                self._drain(inbox)
        self.dispatch_nowait()
        self.flush()
        self._flush_outboxes()
        statistics = self.statistics()
        self.consume_queues.close()
        self.index.close()
        self.commit_log.close()
        self.epoll.close()
        for inbox in self.inboxes:
            inbox.ring.close()
        for outbox in (*self.pull_outboxes, *self.schedule_outboxes):
            outbox.ring.close()
        self.positions.close()
        self.counters.close()
        log.info("stopped cleanly: %s", statistics)

    def statistics(self) -> DispatcherRoleStatistics:
        counters = self.counters.statistics()
        return DispatcherRoleStatistics(
            dispatched_log_offset_bytes=self.dispatcher.dispatched_log_offset_bytes,
            dispatch_rounds=self._dispatch_rounds,
            record_total=self.dispatcher.statistics().record_total,
            wakeups_sent=self._wakeups_sent,
            many_wakeups_sent=self._many_wakeups_sent,
            queue_count=counters.queue_count,
            counter_overflow_count=counters.overflow_count,
            flush_rounds=self._flush_rounds,
            index_flush_rounds=self._index_flush_rounds,
            sleep_count=self.sleeper.sleep_count,
            turn_count=self._turn_count,
        )


def _grown(array: NDArray[_Scalar], capacity: int, fill: int) -> NDArray[_Scalar]:
    grown = np.full(capacity, fill, dtype=array.dtype)
    grown[: array.size] = array
    return grown


def main(ctx: RoleContext) -> NoReturn:
    """The dispatcher role: follow the writer, build the consume queues, wake pulls."""
    role = DispatcherRole(ctx, wakeup_fd=runtime.wakeup_fileno())
    ctx.report_ready(
        {
            "role": ctx.role.role_id,
            "pid": os.getpid(),
            "dispatched_log_offset_bytes": role.dispatcher.dispatched_log_offset_bytes,
        }
    )
    role.run_forever()
