"""The dispatcher (RocketMQ's ReputMessageService): commit-log records -> consume queues + index.

Owns: the dispatched position (`dispatched_log_offset_bytes`: every record below it has its
consume-queue entry and index keys), the dispatcher's topic and queue tables (`DispatchTables`:
a few 2-D numpy arrays, one row per topic or queue, plus open-addressing hash slots the kernel
probes), the per-queue max offsets
(`max_offsets_by_slot`, the next queue index of each queue), and the loop that runs
dispatch_kernels.dispatch_scan segment by segment and applies what it reports: one
`ConsumeQueue.append` per queue per scan, one `IndexService.put_batch` per scan.

Written only by the dispatcher role (recovery runs it at open, in the same process, before any
reader starts). It reads the commit log through a `SegmentSource` (the writer's CommitLog in
one process, a read-only map in another) up to an end the writer published.

Never: writes the commit log, decides where to start after a crash (the store's recover() calls
`start_at`), or publishes anything itself: the positions and max offsets are plain integers and
arrays the appliance copies into shared memory after each `dispatch()`.

Invariants:
- dispatched_log_offset_bytes only grows, always sits on a record boundary (or at the start
  of a segment after a blank), and moves only after the consume queues and index hold every
  record below it.
- For each known queue, max_offsets_by_slot[slot] == that ConsumeQueue's entry_count between
  dispatch() calls; the kernel checks each record's QUEUEOFFSET against it (paired with the
  writer's assignment) and ConsumeQueue.append checks it again (queue_index_first).
- A record below redispatch_end_log_offset_bytes whose consume-queue entry already exists
  (QUEUEOFFSET below the queue's count) is skipped, and index keys at or below
  index_skip_through_log_offset_bytes are not put again: re-dispatch after a clean restart
  writes nothing twice.
"""

from __future__ import annotations

import dataclasses
from typing import Final, Protocol

import numpy as np
from numpy.typing import NDArray

from mqbox.errors import StoreError
from mqbox.message import MessageToStore, encode_record, java_string_hash, java_utf8_decode
from mqbox.message_kernels import (
    STOP_BLANK,
    STOP_END,
    STOP_FULL,
    STOP_INVALID,
    STOP_OFFSET_MISMATCH,
    STOP_TRUNCATED,
)
from mqbox.store.consume_queue import ConsumeQueue, ConsumeQueueTable
from mqbox.store.dispatch_kernels import (
    DISPATCH_STOP_QUEUE_INDEX_MISMATCH,
    DISPATCH_STOP_UNKNOWN_QUEUE,
    DISPATCH_STOP_UNKNOWN_TOPIC,
    GROUP_COLUMN_COUNT,
    INFO_DETAIL_A,
    INFO_DETAIL_B,
    INFO_GROUP_COUNT,
    INFO_KEY_COUNT,
    INFO_RECORD_COUNT,
    INFO_SIZE,
    INFO_STOP_POSITION,
    INFO_STOP_REASON,
    KEY_COUNT_PER_RECORD_MAX,
    KEY_HASH,
    KEY_LOG_OFFSET,
    KEY_ROW_COUNT,
    KEY_STORE_TIMESTAMP,
    QUEUE_COLUMN_COUNT,
    QUEUE_GROUP_COUNT,
    QUEUE_ID,
    QUEUE_NEXT_INDEX,
    QUEUE_TOPIC_ID,
    RECORD_COLUMN_COUNT,
    RECORD_STORE_TIMESTAMP,
    SLOT_EMPTY,
    TOPIC_BYTES_WIDTH,
    TOPIC_COLUMN_COUNT,
    TOPIC_FINGERPRINT,
    TOPIC_IS_SCHEDULE,
    TOPIC_KEY_STATE,
    TOPIC_SIZE,
    dispatch_scan,
    insert_slot,
    queue_fingerprint,
    topic_fingerprint,
)
from mqbox.store.index import IndexService
from mqbox.store.layout import CQ_ENTRY_DTYPE, CQ_ENTRY_SIZE_BYTES, is_safe_topic_dir_name

SCHEDULE_TOPIC: Final = "SCHEDULE_TOPIC_XXXX"
# messageDelayLevel's default, "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h".
DELAY_LEVELS_MS_DEFAULT: Final = tuple(
    seconds * 1000
    for seconds in (
        *(1, 5, 10, 30),
        *(60 * minutes for minutes in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 20, 30)),
        *(3600 * hours for hours in (1, 2)),
    )
)
DISPATCH_RECORD_COUNT_MAX_DEFAULT: Final = 65536  # per scan; out arrays ~13 MB
assert len(DELAY_LEVELS_MS_DEFAULT) == 18

_STOP_NAMES: Final = {
    STOP_TRUNCATED: "a record runs past the end",
    STOP_INVALID: "bytes that are not a record",
    STOP_OFFSET_MISMATCH: "PHYSICALOFFSET does not match the record's position",
    DISPATCH_STOP_QUEUE_INDEX_MISMATCH: "QUEUEOFFSET is not the queue's next index",
}


class SegmentSource(Protocol):
    """Where the dispatcher reads commit-log bytes (CommitLog satisfies it)."""

    @property
    def segment_size_bytes(self) -> int: ...

    def segment_view(self, segment_start_bytes: int) -> NDArray[np.uint8] | None: ...


class DispatchTables:
    """The dispatcher's topics and queues as the 2-D arrays the kernel probes
    (dispatch_kernels' module docstring draws the columns).

    Topic ids and queue slots are row numbers, handed out in order of first sight and never
    reused while the dispatcher lives. Hash slot arrays have power-of-two sizes and stay at most
    half full, so every probe ends at an empty slot.
    """

    def __init__(self, topic_capacity: int = 16, queue_capacity: int = 64):
        assert topic_capacity > 0
        assert queue_capacity > 0
        self.topic_names: list[str] = []
        self.topic_id_of: dict[bytes, int] = {}
        self.topic_slots = np.full(_slot_count_for(topic_capacity), SLOT_EMPTY, dtype=np.int32)
        self.topics = _table_rows(topic_capacity, TOPIC_COLUMN_COUNT, TOPIC_SIZE)
        self.topic_bytes = np.zeros((topic_capacity, TOPIC_BYTES_WIDTH), dtype=np.uint8)
        self.queue_keys: list[tuple[str, int]] = []
        self.queue_slot_of: dict[tuple[str, int], int] = {}
        self.queue_slots = np.full(_slot_count_for(queue_capacity), SLOT_EMPTY, dtype=np.int32)
        self.queues = _table_rows(queue_capacity, QUEUE_COLUMN_COUNT, QUEUE_TOPIC_ID)

    @property
    def topic_count(self) -> int:
        """How many topics are registered."""
        return len(self.topic_names)

    @property
    def queue_count(self) -> int:
        """How many queues are registered."""
        return len(self.queue_keys)

    @property
    def next_queue_indexes(self) -> NDArray[np.int64]:
        """Every queue row's next queue index, by slot (a view of the QUEUE_NEXT_INDEX column)."""
        return self.queues[:, QUEUE_NEXT_INDEX]

    def add_topic(self, topic_bytes: bytes) -> int:
        """Register a topic by its stored bytes; return its id. StoreError if the bytes cannot
        name a consume-queue directory (the writer refuses such topics, so this is damage)."""
        assert topic_bytes not in self.topic_id_of
        assert 0 < len(topic_bytes) <= TOPIC_BYTES_WIDTH - 1
        topic = topic_bytes.decode("utf-8", "surrogateescape")
        if not is_safe_topic_dir_name(topic):
            raise StoreError(f"commit log holds a topic that names no directory: {topic!r}")
        topic_id = len(self.topic_names)
        if topic_id == self.topics.shape[0]:
            self._grow_topics()
        raw = np.frombuffer(topic_bytes, dtype=np.uint8)
        fingerprint = topic_fingerprint(raw, 0, raw.size)
        row = self.topics[topic_id]
        row[TOPIC_FINGERPRINT] = fingerprint
        row[TOPIC_SIZE] = raw.size
        row[TOPIC_KEY_STATE] = java_string_hash(java_utf8_decode(topic_bytes) + "#") & 0xFFFFFFFF
        row[TOPIC_IS_SCHEDULE] = int(topic == SCHEDULE_TOPIC)
        self.topic_bytes[topic_id, : raw.size] = raw
        self.topic_names.append(topic)
        self.topic_id_of[topic_bytes] = topic_id
        if (topic_id + 1) * 2 > self.topic_slots.size:
            self._rebuild_topic_slots(self.topic_slots.size * 2)
        else:
            insert_slot(self.topic_slots, fingerprint, topic_id)
        return topic_id

    def add_queue(self, topic_id: int, queue_id: int, next_queue_index: int) -> int:
        """Register (topic id, queue id) with the queue's current entry count; return its slot."""
        assert 0 <= topic_id < self.topic_count
        assert queue_id >= 0
        assert next_queue_index >= 0
        key = (self.topic_names[topic_id], queue_id)
        assert key not in self.queue_slot_of
        slot = len(self.queue_keys)
        if slot == self.queues.shape[0]:
            self._grow_queues()
        row = self.queues[slot]
        row[QUEUE_TOPIC_ID] = topic_id
        row[QUEUE_ID] = queue_id
        row[QUEUE_NEXT_INDEX] = next_queue_index
        self.queue_keys.append(key)
        self.queue_slot_of[key] = slot
        if (slot + 1) * 2 > self.queue_slots.size:
            self._rebuild_queue_slots(self.queue_slots.size * 2)
        else:
            insert_slot(self.queue_slots, queue_fingerprint(topic_id, queue_id), slot)
        return slot

    def _grow_topics(self) -> None:
        count = self.topics.shape[0]
        topics = _table_rows(count * 2, TOPIC_COLUMN_COUNT, TOPIC_SIZE)
        topics[:count] = self.topics
        self.topics = topics
        topic_bytes = np.zeros((count * 2, TOPIC_BYTES_WIDTH), dtype=np.uint8)
        topic_bytes[:count] = self.topic_bytes
        self.topic_bytes = topic_bytes

    def _grow_queues(self) -> None:
        count = self.queues.shape[0]
        assert not self.queues[:, QUEUE_GROUP_COUNT].any()
        queues = _table_rows(count * 2, QUEUE_COLUMN_COUNT, QUEUE_TOPIC_ID)
        queues[:count] = self.queues
        self.queues = queues

    def _rebuild_topic_slots(self, slot_count: int) -> None:
        slots = np.full(slot_count, SLOT_EMPTY, dtype=np.int32)
        for topic_id in range(self.topic_count):
            insert_slot(slots, int(self.topics[topic_id, TOPIC_FINGERPRINT]), topic_id)
        self.topic_slots = slots

    def _rebuild_queue_slots(self, slot_count: int) -> None:
        slots = np.full(slot_count, SLOT_EMPTY, dtype=np.int32)
        for slot in range(self.queue_count):
            topic_id, queue_id = self.queues[slot, [QUEUE_TOPIC_ID, QUEUE_ID]].tolist()
            insert_slot(slots, queue_fingerprint(topic_id, queue_id), slot)
        self.queue_slots = slots


def _table_rows(row_count: int, column_count: int, unused_column: int) -> NDArray[np.int64]:
    """Rows of a topic or queue table not used yet: zeros, and -1 in `unused_column`
    (TOPIC_SIZE, QUEUE_TOPIC_ID), so no lookup ever matches one."""
    rows = np.zeros((row_count, column_count), dtype=np.int64)
    rows[:, unused_column] = -1
    return rows


def _slot_count_for(capacity: int) -> int:
    slot_count = 8
    while slot_count < capacity * 2:
        slot_count *= 2
    return slot_count


@dataclasses.dataclass(frozen=True)
class DispatcherStatistics:
    """Counters of a Dispatcher since it was made."""

    dispatched_log_offset_bytes: int
    record_total: int
    cq_entry_total: int
    key_total: int
    scan_total: int
    topic_count: int
    queue_count: int


class Dispatcher:
    """Reads committed records and builds the consume queues and the index from them.

    Call `start_at()` once (recovery decides where), then `dispatch(end)` whenever the writer's
    position moved; each call returns after everything below `end` is dispatched.
    """

    def __init__(
        self,
        source: SegmentSource,
        consume_queues: ConsumeQueueTable,
        index: IndexService | None,
        *,
        delay_levels_ms: tuple[int, ...] = DELAY_LEVELS_MS_DEFAULT,
        record_count_max: int = DISPATCH_RECORD_COUNT_MAX_DEFAULT,
    ):
        assert record_count_max > 0
        assert all(delay_ms >= 0 for delay_ms in delay_levels_ms)
        self._source = source
        self._consume_queues = consume_queues
        self._index = index
        self.tables = DispatchTables()
        self._slot_queues: list[ConsumeQueue] = []
        self._delay_levels_ms = np.array(delay_levels_ms, dtype=np.int64)
        key_count_max = max(KEY_COUNT_PER_RECORD_MAX, 4 * record_count_max)
        self._out_records = np.zeros((record_count_max, RECORD_COLUMN_COUNT), dtype=np.int64)
        self._out_cq = np.zeros(record_count_max * CQ_ENTRY_SIZE_BYTES, dtype=np.uint8)
        self._cq_entries = self._out_cq.view(CQ_ENTRY_DTYPE)
        self._out_groups = np.zeros((record_count_max + 1, GROUP_COLUMN_COUNT), dtype=np.int64)
        self._out_keys = np.zeros((KEY_ROW_COUNT, key_count_max), dtype=np.int64)
        self._out_info = np.zeros(INFO_SIZE, dtype=np.int64)
        self._dispatched_log_offset_bytes = 0
        self._redispatch_end_log_offset_bytes = 0
        self._index_skip_through_log_offset_bytes = -1
        self._last_store_timestamp_ms = 0
        self._appended_slots: list[int] = []
        self._started = False
        self._record_total = 0
        self._cq_entry_total = 0
        self._key_total = 0
        self._scan_total = 0

    # -- positions -----------------------------------------------------------------------------

    def start_at(
        self,
        log_offset_bytes: int,
        *,
        redispatch_end_log_offset_bytes: int = 0,
        index_skip_through_log_offset_bytes: int = -1,
    ) -> None:
        """Recovery's hook: dispatch from `log_offset_bytes` (a record boundary).

        Records below `redispatch_end_log_offset_bytes` may already have their consume-queue
        entries (they are skipped when so); index keys of records at or below
        `index_skip_through_log_offset_bytes` are not put again (-1: put every key).
        """
        assert log_offset_bytes >= 0
        self._dispatched_log_offset_bytes = log_offset_bytes
        self._redispatch_end_log_offset_bytes = redispatch_end_log_offset_bytes
        self._index_skip_through_log_offset_bytes = index_skip_through_log_offset_bytes
        self._started = True

    @property
    def dispatched_log_offset_bytes(self) -> int:
        """Every record below this is in the consume queues and the index."""
        return self._dispatched_log_offset_bytes

    @property
    def last_store_timestamp_ms(self) -> int:
        """STORETIMESTAMP of the newest dispatched record (the checkpoint's logics time)."""
        return self._last_store_timestamp_ms

    def queue_slot(self, topic: str, queue_id: int) -> int | None:
        """The dispatcher's slot of (topic, queue_id), or None before its first record."""
        return self.tables.queue_slot_of.get((topic, queue_id))

    def max_offsets_by_slot(self) -> NDArray[np.int64]:
        """Next queue index of every registered queue, by slot (valid between dispatch calls;
        a view: copy it to publish it)."""
        return self.tables.queues[: self.tables.queue_count, QUEUE_NEXT_INDEX]

    @property
    def appended_slots(self) -> list[int]:
        """The queue slots the last dispatch() appended entries to, a slot once per scan that
        grew it (so a few for a lone send: the role publishes those without scanning every
        queue's count). Valid until the next dispatch()."""
        return self._appended_slots

    def max_offset(self, topic: str, queue_id: int) -> int | None:
        """Next queue index of (topic, queue_id), or None if the dispatcher has not seen it."""
        slot = self.queue_slot(topic, queue_id)
        if slot is None:
            return None
        return int(self.tables.queues[slot, QUEUE_NEXT_INDEX])

    # -- the loop ------------------------------------------------------------------------------

    def dispatch(self, end_log_offset_bytes: int) -> int:
        """Dispatch every record in [dispatched, end); return how many records were reported.

        `end_log_offset_bytes` is a write position the writer published: every byte below it
        is a whole record or a blank. Raises StoreError if the bytes say otherwise.
        """
        assert self._started
        assert end_log_offset_bytes >= self._dispatched_log_offset_bytes
        segment_size_bytes = self._source.segment_size_bytes
        record_count_total = 0
        tables = self.tables
        self._appended_slots = []
        while self._dispatched_log_offset_bytes < end_log_offset_bytes:
            position_bytes = self._dispatched_log_offset_bytes
            segment_start_bytes = position_bytes - position_bytes % segment_size_bytes
            buffer = self._source.segment_view(segment_start_bytes)
            if buffer is None:
                raise StoreError(
                    f"commit log segment at {segment_start_bytes} is missing below the "
                    f"write position {end_log_offset_bytes}"
                )
            scan_end_bytes = min(end_log_offset_bytes - segment_start_bytes, segment_size_bytes)
            reason = dispatch_scan(
                buffer,
                position_bytes - segment_start_bytes,
                scan_end_bytes,
                segment_start_bytes,
                tables.topic_slots,
                tables.topics,
                tables.topic_bytes,
                tables.queue_slots,
                tables.queues,
                self._delay_levels_ms,
                self._redispatch_end_log_offset_bytes,
                self._index_skip_through_log_offset_bytes,
                self._out_records,
                self._out_cq,
                self._out_groups,
                self._out_keys,
                self._out_info,
            )
            self._scan_total += 1
            info = self._out_info.tolist()
            assert info[INFO_STOP_REASON] == reason
            record_count = info[INFO_RECORD_COUNT]
            stop_log_offset_bytes = segment_start_bytes + info[INFO_STOP_POSITION]
            if record_count > 0:
                self._apply(info, stop_log_offset_bytes)
                record_count_total += record_count
            assert stop_log_offset_bytes >= position_bytes
            self._dispatched_log_offset_bytes = stop_log_offset_bytes
            if reason in (STOP_END, STOP_FULL):
                continue
            if reason == STOP_BLANK:
                self._dispatched_log_offset_bytes = segment_start_bytes + segment_size_bytes
            elif reason == DISPATCH_STOP_UNKNOWN_TOPIC:
                topic_at = info[INFO_DETAIL_A]
                topic_bytes = buffer[topic_at : topic_at + info[INFO_DETAIL_B]].tobytes()
                self.tables.add_topic(topic_bytes)
            elif reason == DISPATCH_STOP_UNKNOWN_QUEUE:
                self._register_queue(info[INFO_DETAIL_A], info[INFO_DETAIL_B])
            else:
                raise StoreError(
                    f"dispatch stopped at log offset {stop_log_offset_bytes}: "
                    f"{_STOP_NAMES.get(reason, reason)} "
                    f"(detail {info[INFO_DETAIL_A]}, {info[INFO_DETAIL_B]})"
                )
        assert self._dispatched_log_offset_bytes >= end_log_offset_bytes
        return record_count_total

    def _register_queue(self, topic_id: int, queue_id: int) -> None:
        if queue_id < 0:
            raise StoreError(f"commit log holds a record with queue id {queue_id}")
        topic = self.tables.topic_names[topic_id]
        queue = self._consume_queues.queue(topic, queue_id)
        slot = self.tables.add_queue(topic_id, queue_id, queue.entry_count)
        assert slot == len(self._slot_queues)
        self._slot_queues.append(queue)

    def _apply(self, info: list[int], stop_log_offset_bytes: int) -> None:
        """Append the scan's consume-queue entries, queue by queue, then put its index keys."""
        group_count = info[INFO_GROUP_COUNT]
        key_count = info[INFO_KEY_COUNT]
        record_count = info[INFO_RECORD_COUNT]
        groups = self._out_groups[: group_count + 1].tolist()
        try:
            entries = self._cq_entries
            queues = self._slot_queues
            appended_slots = self._appended_slots
            for group in range(group_count):
                slot, start, queue_index_first = groups[group]
                end = groups[group + 1][1]
                appended_slots.append(slot)
                queues[slot].append(entries[start:end], queue_index_first=queue_index_first)
            if key_count > 0 and self._index is not None:
                keys = self._out_keys
                self._index.put_batch(
                    keys[KEY_HASH, :key_count],
                    keys[KEY_LOG_OFFSET, :key_count],
                    keys[KEY_STORE_TIMESTAMP, :key_count],
                )
        except BaseException:
            # The kernel counted every queue of the scan up, but not every append happened.
            # Count again from the queues and let the next dispatch skip what did.
            for slot, _start, _first in groups[:group_count]:
                self.tables.queues[slot, QUEUE_NEXT_INDEX] = self._slot_queues[slot].entry_count
            self._redispatch_end_log_offset_bytes = max(
                self._redispatch_end_log_offset_bytes, stop_log_offset_bytes
            )
            raise
        self._last_store_timestamp_ms = int(
            self._out_records[record_count - 1, RECORD_STORE_TIMESTAMP]
        )
        self._record_total += record_count
        self._cq_entry_total += groups[group_count][1]
        self._key_total += key_count

    def statistics(self) -> DispatcherStatistics:
        """Counters since creation."""
        return DispatcherStatistics(
            dispatched_log_offset_bytes=self._dispatched_log_offset_bytes,
            record_total=self._record_total,
            cq_entry_total=self._cq_entry_total,
            key_total=self._key_total,
            scan_total=self._scan_total,
            topic_count=self.tables.topic_count,
            queue_count=self.tables.queue_count,
        )


def warm_up_dispatch_kernel() -> None:
    """Dispatch one tiny record through a throwaway table (no files)."""
    record = np.frombuffer(encode_record(MessageToStore("T", 0, b"x")), dtype=np.uint8).copy()
    for writable in (True, False):
        tables = DispatchTables()
        tables.add_queue(tables.add_topic(b"T"), 0, 0)
        segment = record.copy()
        segment.flags.writeable = writable
        info = np.zeros(INFO_SIZE, dtype=np.int64)
        dispatch_scan(
            segment,
            0,
            segment.size,
            0,
            tables.topic_slots,
            tables.topics,
            tables.topic_bytes,
            tables.queue_slots,
            tables.queues,
            np.array(DELAY_LEVELS_MS_DEFAULT, dtype=np.int64),
            0,
            -1,
            np.zeros((1, RECORD_COLUMN_COUNT), dtype=np.int64),
            np.zeros(CQ_ENTRY_SIZE_BYTES, dtype=np.uint8),
            np.zeros((2, GROUP_COLUMN_COUNT), dtype=np.int64),
            np.zeros((KEY_ROW_COUNT, KEY_COUNT_PER_RECORD_MAX), dtype=np.int64),
            info,
        )
        assert info[INFO_RECORD_COUNT] == 1
