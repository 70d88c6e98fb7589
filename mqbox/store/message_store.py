"""The message store facade: one object per broker store root (RocketMQ's DefaultMessageStore).

Owns: the wiring of commit log, dispatcher, consume queues, index and checkpoint under one store
root; the store's lifecycle (open: list files, mark `abort`, recover, re-dispatch; close: flush
everything, write the checkpoint, remove `abort`); the flush schedule's entry points; and the
read side (`MessageStoreReader`): read plans for PULL, one record by log offset, records by key,
queue index by time, queue bounds. `MessageStoreReader.open` gives another process the same
reads over read-only maps.

Written by the store writer role (appends), the dispatcher role (dispatch) and the flush
service (flush.py); here all three run in one process, so one MessageStore holds them. The
appliance splits them by giving each role its own part (CommitLog with its FlushService,
Dispatcher, MessageStoreReader) and mirroring the published integers (write position, dispatched
position, max offsets) through shared memory.

Never: touches a socket, parses a request, decides a response code beyond the store's own
GetMessageStatus, or runs a thread the owner did not start (`start_background_threads`).

Invariants:
- Reads see only dispatched entries: a read plan's runs lie below the dispatched position,
  hence below the write position, and in segments that exist at the time of the read.
- After `close()`, reopening yields the same write position, the same queue bounds and the
  same next queue index for every queue (the clean-restart path of `recover()`).
- Checkpoint timestamps only describe data a flush covered: each is taken before its flush
  starts and stored after it returns.

Recovery (recovery.py) runs inside `open`; retention (cleanup.py) is `retention.run_once` in this
one-process form; the appliance runs its commit-log half in the store writer and its other half
in the dispatcher, and read-only readers follow it themselves (MessageStoreReader).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from mqbox.clock import wall_clock_ms
from mqbox.config import BrokerConfig, FlushDiskType, delay_level_durations_ms
from mqbox.errors import ConfigError, MessageIllegalError, StoreError
from mqbox.message import (
    BODY_SIZE_BYTES_MAX_DEFAULT,
    HOST_SIZE_BYTES,
    HOST_ZERO,
    PROPERTY_KEYS,
    PROPERTY_UNIQ_KEY,
    RECORD_SIZE_BYTES_MIN,
    StoredMessage,
    decode_properties_str,
    decode_record,
    index_key_hash,
)
from mqbox.store.checkpoint import Checkpoint
from mqbox.store.cleanup import DiskSpaceGuard, RetentionConfig, RetentionService
from mqbox.store.commit_log import AppendResult, CommitLog, warm_up_append_kernel
from mqbox.store.consume_queue import ConsumeQueue, ConsumeQueueTable
from mqbox.store.dispatch import (
    DELAY_LEVELS_MS_DEFAULT,
    DISPATCH_RECORD_COUNT_MAX_DEFAULT,
    Dispatcher,
    warm_up_dispatch_kernel,
)
from mqbox.store.flush import FLUSH_INTERVAL_MS_DEFAULT, FLUSHED, FlushService, SegmentWarmer
from mqbox.store.index import IndexService
from mqbox.store.index import warm_up_kernels as warm_up_index_kernels
from mqbox.store.layout import (
    StoreGeometry,
    checkpoint_path,
    index_dir,
)
from mqbox.store.mapped_file import MappedFile, ensure_directory, fsync_directory
from mqbox.store.read_plan import (
    NO_TAG_FILTER,
    PULL_MESSAGE_COUNT_MAX,
    PULL_SIZE_BYTES_MAX,
    SCAN_WINDOW_ENTRY_COUNT_MIN,
    GetMessageStatus,
    ReadPlan,
    no_queue_plan,
    plan_for_bounds,
    plan_read,
    warm_up_plan_kernel,
)
from mqbox.store.recovery import (
    RecoveryReport,
    create_abort_file,
    recover,
    remove_abort_file,
    warm_up_recovery_kernels,
)

# The most messages one read plan may hold (count_max above it is an error of the caller).
READ_PLAN_MESSAGE_COUNT_MAX: Final = 1024
# A read-only reader checks at most this often whether retention deleted segments under it (one
# stat of the oldest segment it knows); a file found gone triggers the check at once.
RETENTION_CHECK_INTERVAL_NS_DEFAULT: Final = 100_000_000
_FOUND: Final = GetMessageStatus.FOUND
_NO_MATCHED_MESSAGE: Final = GetMessageStatus.NO_MATCHED_MESSAGE
_MESSAGE_WAS_REMOVING: Final = GetMessageStatus.MESSAGE_WAS_REMOVING
_OFFSET_FOUND_NULL: Final = GetMessageStatus.OFFSET_FOUND_NULL
# A key query confirms candidates against their records; it asks the index for this many times
# the wanted count, because hash collisions and re-dispatched duplicates drop out.
QUERY_CANDIDATE_FACTOR: Final = 4


@dataclasses.dataclass(frozen=True)
class StoreConfig:
    """What one store runs with; the broker builds it from BrokerConfig (from_broker_config)."""

    geometry: StoreGeometry = dataclasses.field(default_factory=StoreGeometry)
    max_message_size_bytes: int = BODY_SIZE_BYTES_MAX_DEFAULT  # maxMessageSize: whole record
    flush_disk_type: FlushDiskType = FlushDiskType.ASYNC_FLUSH  # flushDiskType
    flush_interval_ms: int = FLUSH_INTERVAL_MS_DEFAULT  # flushIntervalCommitLog (ASYNC_FLUSH)
    store_host: bytes = HOST_ZERO  # message.pack_host(brokerIP1, listenPort)
    delay_levels_ms: tuple[int, ...] = DELAY_LEVELS_MS_DEFAULT  # messageDelayLevel
    cq_map_count_max: int | None = None  # None: consume_queue.map_count_max_default()
    dispatch_record_count_max: int = DISPATCH_RECORD_COUNT_MAX_DEFAULT
    warm_segments: bool = False  # pre-fault commit-log pages in a thread (SegmentWarmer)
    # fileReservedTime, deleteWhen, diskMaxUsedSpaceRatio (cleanup.py)
    retention: RetentionConfig = dataclasses.field(default_factory=RetentionConfig)
    # Recovery cuts damage inside flushed data only when asked (recovery.py explains why).
    truncate_flushed_damage: bool = False

    def __post_init__(self) -> None:
        if len(self.store_host) != HOST_SIZE_BYTES:
            raise ConfigError(f"store_host must be {HOST_SIZE_BYTES} bytes (message.pack_host)")
        if not RECORD_SIZE_BYTES_MIN <= self.max_message_size_bytes < 2**31:
            raise ConfigError(f"maxMessageSize out of range: {self.max_message_size_bytes}")
        if self.max_message_size_bytes + 8 > self.geometry.commit_log_segment_size_bytes:
            raise ConfigError("maxMessageSize does not fit one commit log segment")
        if self.flush_interval_ms <= 0:
            raise ConfigError("flushIntervalCommitLog must be positive")
        if not self.delay_levels_ms or min(self.delay_levels_ms) < 0:
            raise ConfigError("delay levels must be a non-empty tuple of non-negative ms")
        if self.dispatch_record_count_max <= 0:
            raise ConfigError("dispatch_record_count_max must be > 0")

    @classmethod
    def from_broker_config(cls, broker: BrokerConfig, store_host: bytes) -> StoreConfig:
        """The store settings of a broker (RocketMQ keys: mapedFileSizeCommitLog,
        mapedFileSizeConsumeQueue, maxMessageSize, flushDiskType, flushIntervalCommitLog,
        messageDelayLevel)."""
        geometry = StoreGeometry(
            commit_log_segment_size_bytes=broker.commit_log_segment_size_bytes,
            cq_segment_entry_count=broker.consume_queue_entry_count,
        )
        return cls(
            geometry=geometry,
            max_message_size_bytes=broker.max_message_size_bytes,
            flush_disk_type=broker.flush_disk_type,
            flush_interval_ms=broker.flush_interval_commit_log_ms,
            store_host=store_host,
            delay_levels_ms=delay_level_durations_ms(broker.message_delay_level),
            retention=RetentionConfig.from_broker_config(broker),
        )


class _QueueReadState:
    """What the read fast path keeps per queue: the queue, its last used segment, and the
    commit-log minimum its min_queue_index was last made to follow."""

    __slots__ = ("mapped_file", "min_log_offset_bytes", "queue", "segment_index")

    def __init__(self, queue: ConsumeQueue):
        self.queue = queue
        self.segment_index = -1
        self.mapped_file: MappedFile | None = None
        self.min_log_offset_bytes = -1


class MessageStoreReader:
    """The reads of one store, over the writer's own objects or over read-only maps.

    Bounds come from the ConsumeQueue objects: in the writer's process they are the
    dispatcher's queues; in another process `observe_max_offset` feeds them the counts the
    dispatcher published. Not thread-safe: one reader per thread.

    Retention. In the writer's process, retention calls `refresh_commit_log_bounds`. A
    read-only reader follows it by itself: at most every `retention_check_interval_ns`, and at
    once when a consume-queue segment it looks for is gone, it checks that the oldest
    commit-log segment it knows still exists (CommitLog.follow_retention); when the minimum
    moved, each queue's min_queue_index follows it the next time the queue is read
    (ConsumeQueue.follow_min_log_offset), so a read below it answers OFFSET_TOO_SMALL with
    nextBeginOffset = the new minimum, and GET_MIN_OFFSET moves. `observe_commit_log_min`
    takes the minimum the store writer publishes, which leads the unlink: a process that feeds
    it never plans a read in a segment about to go.
    """

    def __init__(
        self,
        config: StoreConfig,
        commit_log: CommitLog,
        consume_queues: ConsumeQueueTable,
        index: IndexService,
        readable_end_log_offset_bytes: Callable[[], int] | None,
        *,
        retention_check_interval_ns: int = RETENTION_CHECK_INTERVAL_NS_DEFAULT,
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ):
        """`readable_end_log_offset_bytes` gives the writer's position in its own process;
        None means the position comes through observe_commit_log_end (another process)."""
        assert retention_check_interval_ns >= 0
        self.config = config
        self._commit_log = commit_log
        self._consume_queues = consume_queues
        self._index = index
        self._readable_end_log_offset_bytes = readable_end_log_offset_bytes
        self._observed_end_log_offset_bytes = 0
        self._read_states: dict[tuple[str, int], _QueueReadState] = {}
        self._cq_segment_entry_count = config.geometry.cq_segment_entry_count
        self._commit_log_segment_size_bytes = config.geometry.commit_log_segment_size_bytes
        self._commit_log_min_offset_bytes = commit_log.min_log_offset_bytes
        self._out_runs = np.zeros((READ_PLAN_MESSAGE_COUNT_MAX, 3), dtype=np.int64)
        # Only a read-only view follows retention on its own; the writer's is told.
        self._follows_retention = not commit_log.writable
        self._retention_check_interval_ns = retention_check_interval_ns
        self._retention_check_due_ns = 0
        self._clock_ns = clock_ns

    @classmethod
    def open(
        cls,
        store_root: Path,
        config: StoreConfig,
        *,
        retention_check_interval_ns: int = RETENTION_CHECK_INTERVAL_NS_DEFAULT,
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> MessageStoreReader:
        """A reader over read-only maps, for a process that is not the writer.

        It sees queue entries up to what `observe_max_offset` says (or what was on disk at
        first use) and records up to `observe_commit_log_end`.
        """
        commit_log = CommitLog.open(
            store_root,
            config.geometry,
            writable=False,
            record_size_bytes_max=config.max_message_size_bytes,
            store_host=config.store_host,
        )
        consume_queues = ConsumeQueueTable(
            store_root, config.geometry, writable=False, map_count_max=config.cq_map_count_max
        )
        index = IndexService(store_root, config.geometry, writable=False)
        index.load()
        return cls(
            config,
            commit_log,
            consume_queues,
            index,
            None,
            retention_check_interval_ns=retention_check_interval_ns,
            clock_ns=clock_ns,
        )

    # -- what other processes publish ----------------------------------------------------------

    def observe_max_offset(self, topic: str, queue_id: int, entry_count: int) -> None:
        """Read-only readers: the dispatcher published that (topic, queue_id) holds entries
        below `entry_count`."""
        queue = self._consume_queues.find_queue(topic, queue_id)
        if queue is not None and entry_count > queue.entry_count:
            queue.observe_entry_count(entry_count)

    def observe_commit_log_end(self, end_log_offset_bytes: int) -> None:
        """Read-only readers: the writer published its write position."""
        self._observed_end_log_offset_bytes = max(
            self._observed_end_log_offset_bytes, end_log_offset_bytes
        )

    def refresh_commit_log_bounds(self) -> None:
        """Take the commit log's minimum offset again. Retention calls it after deleting
        segments, before any reader may meet a run in them."""
        self._commit_log_min_offset_bytes = self._commit_log.min_log_offset_bytes

    def observe_commit_log_min(self, min_log_offset_bytes: int) -> None:
        """Read-only readers: the store writer published the commit log's minimum (it moves
        just before a segment is unlinked). Reads below it answer "offset moved" from now on."""
        assert self._follows_retention
        if min_log_offset_bytes > self._commit_log_min_offset_bytes:
            self._commit_log.follow_retention(min_log_offset_bytes)
            self._commit_log_min_offset_bytes = max(
                min_log_offset_bytes, self._commit_log.min_log_offset_bytes
            )

    def check_retention_nowait(self) -> bool:
        """Read-only readers: look now whether retention deleted segments (the check the reads
        make every retention_check_interval_ns); True if the minimum moved."""
        assert self._follows_retention
        self._retention_check_due_ns = self._clock_ns() + self._retention_check_interval_ns
        if not self._commit_log.follow_retention(self._commit_log_min_offset_bytes):
            return False
        min_bytes = self._commit_log.min_log_offset_bytes
        if min_bytes <= self._commit_log_min_offset_bytes:
            return False
        self._commit_log_min_offset_bytes = min_bytes
        return True

    @property
    def min_log_offset_bytes(self) -> int:
        """The commit log's minimum as this reader knows it; records below it are gone."""
        return self._commit_log_min_offset_bytes

    def _follow_min(self, state: _QueueReadState) -> None:
        """Move the queue's min_queue_index after the commit log's minimum (the writer's own
        queues are moved by retention itself). A read-only queue is re-listed here, and its
        files may show a deletion the last look at the log predates: look again first (one
        stat; this runs on a queue's first read and after the minimum moved)."""
        if not state.queue.writable:
            self.check_retention_nowait()
            min_bytes = self._commit_log_min_offset_bytes
            state.queue.follow_min_log_offset(min_bytes)
            state.mapped_file = None  # the re-listing closed this view's maps
            state.segment_index = -1
        state.min_log_offset_bytes = self._commit_log_min_offset_bytes

    # -- PULL ----------------------------------------------------------------------------------

    def get_messages(
        self,
        topic: str,
        queue_id: int,
        queue_index: int,
        count_max: int = PULL_MESSAGE_COUNT_MAX,
        size_bytes_max: int = PULL_SIZE_BYTES_MAX,
        tag_hashes: NDArray[np.int64] = NO_TAG_FILTER,
    ) -> ReadPlan:
        """The read plan for a PULL of (topic, queue_id) from `queue_index` (read_plan.py has
        the rules). `tag_hashes` is read_plan.tag_filter()'s array; empty takes every tag."""
        if self._follows_retention and self._clock_ns() >= self._retention_check_due_ns:
            self.check_retention_nowait()
        state = self._read_states.get((topic, queue_id))
        if state is None:
            state = self._read_state(topic, queue_id)
            if state is None:
                return no_queue_plan(queue_index)
        if state.min_log_offset_bytes != self._commit_log_min_offset_bytes:
            self._follow_min(state)
        # The fast path below runs for every PULL (a few microseconds in all): plain
        # comparisons instead of min()/max() calls, module-level enum members, one kernel call.
        queue = state.queue
        min_queue_index = queue.min_queue_index
        max_queue_index = queue.entry_count
        if queue_index < min_queue_index or queue_index >= max_queue_index:
            bounds_plan = plan_for_bounds(queue_index, min_queue_index, max_queue_index)
            assert bounds_plan is not None
            return bounds_plan
        segment_entry_count = self._cq_segment_entry_count
        segment_index = queue_index // segment_entry_count
        mapped_file = state.mapped_file
        if segment_index != state.segment_index or mapped_file is None or mapped_file.closed:
            mapped_file = queue.segment_for_read(queue_index)
            if mapped_file is None and self._follows_retention:
                # The dispatcher deleted the segment: the commit log's minimum moved.
                self._follow_min(state)
                if queue_index < queue.min_queue_index:
                    bounds_plan = plan_for_bounds(
                        queue_index, queue.min_queue_index, queue.entry_count
                    )
                    assert bounds_plan is not None
                    return bounds_plan
                mapped_file = queue.segment_for_read(queue_index)
            if mapped_file is None:
                next_queue_index = (segment_index + 1) * segment_entry_count
                return ReadPlan(
                    _OFFSET_FOUND_NULL,
                    queue_index,
                    next_queue_index,
                    min_queue_index,
                    max_queue_index,
                    0,
                    0,
                    (),
                )
            state.segment_index = segment_index
            state.mapped_file = mapped_file
        assert 0 < count_max <= READ_PLAN_MESSAGE_COUNT_MAX
        first_entry = queue_index - segment_index * segment_entry_count
        entry_count = max_queue_index - queue_index  # the window: what is written, ...
        if segment_entry_count - first_entry < entry_count:  # ... in this segment, ...
            entry_count = segment_entry_count - first_entry
        window_entry_count = (  # ... and at most max(16000 bytes, 20 * count_max)
            count_max if count_max > SCAN_WINDOW_ENTRY_COUNT_MIN else SCAN_WINDOW_ENTRY_COUNT_MIN
        )
        if window_entry_count < entry_count:
            entry_count = window_entry_count
        (
            run_count,
            scanned_count,
            message_count,
            size_bytes,
            removed_count,
            segment_start_bytes,
            file_offset_bytes,
            run_size_bytes,
        ) = plan_read(
            mapped_file.buffer,
            first_entry,
            entry_count,
            tag_hashes,
            count_max,
            size_bytes_max,
            self._commit_log_segment_size_bytes,
            self._commit_log_min_offset_bytes,
            self._out_runs,
        )
        if message_count > 0:
            if run_count == 1:
                runs: tuple[tuple[int, int, int], ...] = (
                    (segment_start_bytes, file_offset_bytes, run_size_bytes),
                )
            else:
                runs = tuple((a, b, c) for a, b, c in self._out_runs[:run_count].tolist())
            status = _FOUND
        else:
            assert run_count == 0, f"unwritten consume-queue entry in {topic}/{queue_id}"
            runs = ()
            status = _MESSAGE_WAS_REMOVING if removed_count > 0 else _NO_MATCHED_MESSAGE
        return ReadPlan(
            status,
            queue_index,
            queue_index + scanned_count,
            min_queue_index,
            max_queue_index,
            message_count,
            size_bytes,
            runs,
        )

    def _read_state(self, topic: str, queue_id: int) -> _QueueReadState | None:
        queue = self._consume_queues.find_queue(topic, queue_id)
        if queue is None:
            return None
        state = _QueueReadState(queue)
        self._read_states[(topic, queue_id)] = state
        return state

    def read_plan_bytes(self, plan: ReadPlan) -> bytes:
        """The bytes a plan's runs hold, copied (tests and the admin path; the reactor uses
        sendfile instead)."""
        parts: list[bytes] = []
        for segment_start_bytes, file_offset_bytes, size_bytes in plan.runs:
            buffer = self._commit_log.segment_view(segment_start_bytes)
            if buffer is None:
                raise StoreError(f"segment {segment_start_bytes} vanished under a read plan")
            parts.append(buffer[file_offset_bytes : file_offset_bytes + size_bytes].tobytes())
        return b"".join(parts)

    # -- one record, keys, time ----------------------------------------------------------------

    def read_message(self, log_offset_bytes: int) -> bytes | None:
        """The stored record at `log_offset_bytes` (VIEW_MESSAGE_BY_ID, send-back), or None if
        no whole record starts there."""
        source = self._readable_end_log_offset_bytes
        end_bytes = self._observed_end_log_offset_bytes if source is None else source()
        return self._commit_log.read_record(log_offset_bytes, end_bytes)

    def query_by_key(
        self, topic: str, key: str, begin_ms: int, end_ms: int, count_max: int
    ) -> list[StoredMessage]:
        """Records of `topic` carrying `key` (as UNIQ_KEY or one of KEYS) stored within
        [begin_ms, end_ms], newest first, at most `count_max` (QUERY_MESSAGE), decoded."""
        return [
            message
            for _offset, _raw, message in self._query(topic, key, begin_ms, end_ms, count_max)
        ]

    def query_records_by_key(
        self, topic: str, key: str, begin_ms: int, end_ms: int, count_max: int
    ) -> list[tuple[int, bytes]]:
        """(log offset, stored record bytes) of the same records: a QUERY_MESSAGE body is the
        records concatenated as stored."""
        return [
            (offset, raw)
            for offset, raw, _message in self._query(topic, key, begin_ms, end_ms, count_max)
        ]

    def _query(
        self, topic: str, key: str, begin_ms: int, end_ms: int, count_max: int
    ) -> list[tuple[int, bytes, StoredMessage]]:
        """Index candidates confirmed against their records: same topic, the key among the
        record's keys, store time in range; duplicates (re-dispatched keys) once."""
        assert count_max >= 0
        if count_max == 0 or not key:
            return []
        if not self._index.writable:
            self._index.load()  # the writer may have rolled to a new index file
        candidates = self._index.query(
            index_key_hash(topic, key), begin_ms, end_ms, count_max * QUERY_CANDIDATE_FACTOR
        )
        found: list[tuple[int, bytes, StoredMessage]] = []
        seen: set[int] = set()
        for log_offset_bytes in candidates:
            if log_offset_bytes in seen:
                continue
            seen.add(log_offset_bytes)
            record = self.read_message(log_offset_bytes)
            if record is None:
                continue
            try:
                message = decode_record(record, check_crc=False)
            except MessageIllegalError:
                continue
            if message.topic != topic or not begin_ms <= message.store_timestamp_ms <= end_ms:
                continue
            properties = decode_properties_str(message.properties)
            keys = properties.get(PROPERTY_KEYS, "").split(" ")
            if key != properties.get(PROPERTY_UNIQ_KEY) and key not in keys:
                continue
            found.append((log_offset_bytes, record, message))
            if len(found) == count_max:
                break
        return found

    def _queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """The queue with its bounds after retention (the slow reads' door)."""
        if self._follows_retention and self._clock_ns() >= self._retention_check_due_ns:
            self.check_retention_nowait()
        state = self._read_states.get((topic, queue_id))
        if state is None:
            state = self._read_state(topic, queue_id)
            if state is None:
                return None
        if state.min_log_offset_bytes != self._commit_log_min_offset_bytes:
            self._follow_min(state)
        return state.queue

    def entry_log_offset_bytes(self, topic: str, queue_id: int, queue_index: int) -> int | None:
        """The commit-log offset entry `queue_index` of the queue points at (Java's offsetPy of
        a consume-queue entry), or None outside the queue: the pull's fall-behind figure."""
        queue = self._queue(topic, queue_id)
        if queue is None:
            return None
        entry = queue.entry(queue_index)
        return None if entry is None else entry.log_offset_bytes

    def _store_timestamp_of_entry(self, queue: ConsumeQueue, queue_index: int) -> int | None:
        """Store time of the record entry `queue_index` points at; None if it is gone."""
        entry = queue.entry(queue_index)
        if entry is None or entry.log_offset_bytes < max(
            self._commit_log.min_log_offset_bytes, self._commit_log_min_offset_bytes
        ):
            return None
        return self._commit_log.store_timestamp_at(entry.log_offset_bytes)

    def search_offset_by_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """SEARCH_OFFSET_BY_TIMESTAMP: the queue index whose record's store time is nearest
        `timestamp_ms`. An exact match wins (the first of equals); otherwise the nearer
        neighbour (the earlier one on a tie); every entry later -> the first; every entry
        earlier -> the last entry (not the max offset); no data -> 0. Records already deleted
        count as earlier than any time."""
        queue = self._queue(topic, queue_id)
        if queue is None:
            return 0
        low = queue.min_queue_index
        high = queue.entry_count
        if low >= high:
            return 0
        first, end = low, high
        while low < high:  # lower bound: the first entry stored at or after timestamp_ms
            middle = (low + high) // 2
            middle_ms = self._store_timestamp_of_entry(queue, middle)
            if middle_ms is not None and middle_ms >= timestamp_ms:
                high = middle
            else:
                low = middle + 1
        right_ms = self._store_timestamp_of_entry(queue, low) if low < end else None
        if right_ms == timestamp_ms:
            return low
        left_ms = self._store_timestamp_of_entry(queue, low - 1) if low - 1 >= first else None
        if left_ms is None and right_ms is None:
            return 0
        if left_ms is None:
            return low
        if right_ms is None:
            return low - 1
        return low if timestamp_ms - left_ms > right_ms - timestamp_ms else low - 1

    def min_offset(self, topic: str, queue_id: int) -> int:
        """GET_MIN_OFFSET: the first readable queue index (0 for an unknown queue)."""
        queue = self._queue(topic, queue_id)
        return 0 if queue is None else queue.min_queue_index

    def max_offset(self, topic: str, queue_id: int) -> int:
        """GET_MAX_OFFSET: the next queue index to be written (0 for an unknown queue)."""
        queue = self._queue(topic, queue_id)
        return 0 if queue is None else queue.entry_count

    def earliest_message_store_timestamp_ms(self, topic: str, queue_id: int) -> int:
        """GET_EARLIEST_MSG_STORETIME: store time of the record at the min offset; -1 if none."""
        queue = self._queue(topic, queue_id)
        if queue is None or queue.min_queue_index >= queue.entry_count:
            return -1
        timestamp_ms = self._store_timestamp_of_entry(queue, queue.min_queue_index)
        return -1 if timestamp_ms is None else timestamp_ms

    def close(self) -> None:
        """Drop the cached segments (maps close as their last view goes)."""
        self._read_states.clear()


@dataclasses.dataclass(frozen=True)
class MessageStoreStatistics:
    """A snapshot of the store's positions and counters."""

    write_log_offset_bytes: int
    flushed_log_offset_bytes: int
    dispatched_log_offset_bytes: int
    record_total: int
    dispatched_record_total: int
    queue_count: int


class MessageStore:
    """One broker's store: append, dispatch, read, flush, close.

    Open with `MessageStore.open(store_root, config)`. Appends and dispatch belong to one
    thread; `flush_commit_log` and the group commit may run in another.
    """

    def __init__(
        self, store_root: Path, config: StoreConfig, clock_ms: Callable[[], int] = wall_clock_ms
    ):
        """Wire the parts without touching the disk; `open()` is the constructor to use."""
        self.store_root = store_root
        self.config = config
        geometry = config.geometry
        self.consume_queues = ConsumeQueueTable(
            store_root, geometry, writable=True, map_count_max=config.cq_map_count_max
        )
        self.commit_log = CommitLog(
            store_root,
            geometry,
            writable=True,
            record_size_bytes_max=config.max_message_size_bytes,
            store_host=config.store_host,
            initial_queue_index=self._initial_queue_index,
            clock_ms=clock_ms,
        )
        self.index = IndexService(store_root, geometry, writable=True, clock_ms=clock_ms)
        self.checkpoint = Checkpoint(checkpoint_path(store_root))
        self.dispatcher = Dispatcher(
            self.commit_log,
            self.consume_queues,
            self.index,
            delay_levels_ms=config.delay_levels_ms,
            record_count_max=config.dispatch_record_count_max,
        )
        self.reader = MessageStoreReader(
            config,
            self.commit_log,
            self.consume_queues,
            self.index,
            lambda: self.commit_log.write_log_offset_bytes,
        )
        # The commit log's one flush service (flush.py). Its thread runs only when started:
        # start_background_threads does under SYNC_FLUSH; the store writer role starts it in
        # both modes, ASYNC_FLUSH being its timer.
        self.flush_service = FlushService(
            self.commit_log,
            sync=config.flush_disk_type is FlushDiskType.SYNC_FLUSH,
            interval_ms=config.flush_interval_ms,
        )
        self.disk_guard = DiskSpaceGuard(store_root, config.retention.refuse_ratio_percent)
        self.retention = RetentionService(
            store_root,
            self.commit_log,
            self.consume_queues,
            self.index,
            config.retention,
            dispatched_log_offset_bytes=lambda: self.dispatcher.dispatched_log_offset_bytes,
            on_min_log_offset_moved=lambda _min: self.reader.refresh_commit_log_bounds(),
        )
        self._warmer: SegmentWarmer | None = None
        self.found_abort_at_open = False
        self.recovery_report: RecoveryReport | None = None
        self._closed = False

    @classmethod
    def open(
        cls,
        store_root: Path,
        config: StoreConfig | None = None,
        *,
        clock_ms: Callable[[], int] = wall_clock_ms,
        **recover_options: Any,
    ) -> MessageStore:
        """Open (or create) the store at `store_root`: mark it running (the abort file), recover
        it (recovery.recover: torn tails cut, consume queues and index made to agree, what they
        lack re-dispatched) and return it ready for appends; `recovery_report` says what
        happened. `recover_options` go to recovery.recover (tests tune the scan with them)."""
        store = cls(store_root, config or StoreConfig(), clock_ms)
        try:
            store._open(recover_options)
        except BaseException:
            store._release()  # a refused open leaves no map or descriptor behind
            raise
        return store

    def _open(self, recover_options: dict[str, Any]) -> None:
        for directory in ensure_directory(self.store_root):
            fsync_directory(directory)
        was_clean = not create_abort_file(self.store_root)
        self.found_abort_at_open = not was_clean
        self.commit_log.load()
        for directory in ensure_directory(index_dir(self.store_root)):
            fsync_directory(directory)
        self.index.load()
        recover_options.setdefault("truncate_flushed_damage", self.config.truncate_flushed_damage)
        self.recovery_report = recover(
            self.commit_log,
            self.consume_queues,
            self.index,
            self.checkpoint,
            was_clean=was_clean,
            dispatcher=self.dispatcher,
            **recover_options,
        )
        # Only a repair cuts below the flushed offset; the checkpoint must not claim what is gone.
        self.checkpoint.clamp_offsets(self.recovery_report.write_log_offset_bytes)
        self.flush_service.positions.advance(FLUSHED, self.commit_log.flushed_log_offset_bytes)
        self.reader.refresh_commit_log_bounds()

    def _initial_queue_index(self, topic: str, queue_id: int) -> int:
        """Where the writer's count of (topic, queue_id) starts: the consume queue's length,
        exact once recover() has dispatched everything on disk."""
        queue = self.consume_queues.find_queue(topic, queue_id)
        return 0 if queue is None else queue.entry_count

    # -- writing -------------------------------------------------------------------------------

    def append_batch(
        self,
        records: NDArray[np.uint8],
        sizes_bytes: NDArray[np.int32],
        topic: str,
        queue_id: int,
        *,
        store_timestamp_ms: int | None = None,
    ) -> AppendResult:
        """Append encoded records of one queue (CommitLog.append_batch has the contract).
        DiskFullError while the disk is nearly full (cleanup.DiskSpaceGuard)."""
        self.disk_guard.check_writable()
        return self.commit_log.append_batch(
            records, sizes_bytes, topic, queue_id, store_timestamp_ms
        )

    def append_record(self, record: bytes | bytearray, topic: str, queue_id: int) -> AppendResult:
        """Append one encoded record (the convenient form of append_batch)."""
        self.disk_guard.check_writable()
        return self.commit_log.append_batch(
            np.frombuffer(record, dtype=np.uint8),
            np.array([len(record)], dtype=np.int32),
            topic,
            queue_id,
        )

    def queue_slot(self, topic: str, queue_id: int) -> int:
        """The writer's slot of (topic, queue_id) for append_records."""
        return self.commit_log.queue_slot(topic, queue_id)

    def append_records(
        self,
        records: NDArray[np.uint8],
        sizes_bytes: NDArray[np.int32],
        queue_slots: NDArray[np.int32],
        out_queue_indexes: NDArray[np.int64],
    ) -> AppendResult:
        """Append records of several queues (CommitLog.append_records)."""
        self.disk_guard.check_writable()
        return self.commit_log.append_records(records, sizes_bytes, queue_slots, out_queue_indexes)

    def wait_flushed(self, end_log_offset_bytes: int, timeout_s: float) -> bool:
        """SYNC_FLUSH: wait until a flush covers `end_log_offset_bytes` (group commit); False on
        timeout. ASYNC_FLUSH acknowledges from the page cache, so it returns True at once."""
        if self.config.flush_disk_type is FlushDiskType.ASYNC_FLUSH:
            return True
        return self.flush_service.wait_flushed(end_log_offset_bytes, timeout_s)

    def dispatch(self) -> int:
        """Dispatch everything appended so far; return how many records were dispatched."""
        return self.dispatcher.dispatch(self.commit_log.write_log_offset_bytes)

    # -- reading (MessageStoreReader has the contracts) ----------------------------------------

    def get_messages(
        self,
        topic: str,
        queue_id: int,
        queue_index: int,
        count_max: int = PULL_MESSAGE_COUNT_MAX,
        size_bytes_max: int = PULL_SIZE_BYTES_MAX,
        tag_hashes: NDArray[np.int64] = NO_TAG_FILTER,
    ) -> ReadPlan:
        """The read plan of a PULL."""
        return self.reader.get_messages(
            topic, queue_id, queue_index, count_max, size_bytes_max, tag_hashes
        )

    def read_message(self, log_offset_bytes: int) -> bytes | None:
        """The record at a log offset, or None."""
        return self.reader.read_message(log_offset_bytes)

    def query_by_key(
        self, topic: str, key: str, begin_ms: int, end_ms: int, count_max: int
    ) -> list[StoredMessage]:
        """Records of `topic` with `key` stored in [begin_ms, end_ms], newest first."""
        return self.reader.query_by_key(topic, key, begin_ms, end_ms, count_max)

    def query_records_by_key(
        self, topic: str, key: str, begin_ms: int, end_ms: int, count_max: int
    ) -> list[tuple[int, bytes]]:
        """(log offset, record bytes) of the records query_by_key finds."""
        return self.reader.query_records_by_key(topic, key, begin_ms, end_ms, count_max)

    def search_offset_by_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The queue index nearest a store time."""
        return self.reader.search_offset_by_timestamp(topic, queue_id, timestamp_ms)

    def min_offset(self, topic: str, queue_id: int) -> int:
        """The first readable queue index."""
        return self.reader.min_offset(topic, queue_id)

    def max_offset(self, topic: str, queue_id: int) -> int:
        """The next queue index to be dispatched."""
        return self.reader.max_offset(topic, queue_id)

    def earliest_message_store_timestamp_ms(self, topic: str, queue_id: int) -> int:
        """Store time of the oldest readable record of the queue; -1 if none."""
        return self.reader.earliest_message_store_timestamp_ms(topic, queue_id)

    # -- flushing ------------------------------------------------------------------------------

    def flush_commit_log(self) -> int:
        """msync [flushed, written); return the flushed position (flushIntervalCommitLog).
        Through the flush service, so group-commit waiters it covers are released."""
        flushed_bytes = self.flush_service.flush_now()
        physic_ms = self.commit_log.flushed_store_timestamp_ms
        self.checkpoint.update(
            physic_msg_timestamp_ms=physic_ms if physic_ms > 0 else None,
            physic_log_offset_bytes=flushed_bytes,
        )
        return flushed_bytes

    def flush_consume_queues(self) -> int:
        """Flush the consume queues written since the last time, then persist the checkpoint
        (RocketMQ's FlushConsumeQueueService); return how many queues were flushed."""
        # Both taken before the flush: it makes durable at least what was dispatched by then.
        dispatched_bytes = self.dispatcher.dispatched_log_offset_bytes
        logics_ms = self.dispatcher.last_store_timestamp_ms
        flushed_count = self.consume_queues.flush()
        self.checkpoint.update(
            logics_msg_timestamp_ms=logics_ms if logics_ms > 0 else None,
            logics_log_offset_bytes=dispatched_bytes,
        )
        self.checkpoint.flush()
        return flushed_count

    def flush_index(self) -> int:
        """Flush the index files written to; return the newest indexed store time."""
        dispatched_bytes = self.dispatcher.dispatched_log_offset_bytes  # before the flush
        index_ms = self.index.flush()
        self.checkpoint.update(
            index_msg_timestamp_ms=index_ms if index_ms > 0 else None,
            index_log_offset_bytes=dispatched_bytes,
        )
        return index_ms

    def flush(self) -> int:
        """Flush the commit log, the consume queues and the index, and write the checkpoint;
        return the commit log's flushed position."""
        flushed_bytes = self.flush_commit_log()
        self.flush_index()
        self.flush_consume_queues()
        return flushed_bytes

    # -- lifetime ------------------------------------------------------------------------------

    def start_background_threads(self) -> None:
        """Start the group-commit flush thread (SYNC_FLUSH) and the segment warmer (if
        configured)."""
        if self.config.flush_disk_type is FlushDiskType.SYNC_FLUSH:
            self.flush_service.start()
        if self.config.warm_segments and self._warmer is None:
            self._warmer = SegmentWarmer(self.commit_log)
            self._warmer.start()

    def stop_background_threads(self) -> None:
        """Stop what start_background_threads started."""
        self.flush_service.stop()
        if self._warmer is not None:
            self._warmer.stop()
            self._warmer = None

    def close(self) -> None:
        """Clean shutdown: dispatch the rest, flush everything, write the checkpoint, remove
        the abort file, release the maps."""
        if self._closed:
            return
        self.stop_background_threads()
        self.dispatch()
        self.flush()
        self._release()
        remove_abort_file(self.store_root)  # last: only a complete close counts as clean
        self._closed = True

    def _release(self) -> None:
        """Unmap and close every file of the store (no flush: close() flushes first)."""
        self.reader.close()
        self.commit_log.close()
        self.consume_queues.close()
        self.index.close()

    def statistics(self) -> MessageStoreStatistics:
        """Positions and counters now."""
        commit_log = self.commit_log.statistics()
        dispatcher = self.dispatcher.statistics()
        return MessageStoreStatistics(
            write_log_offset_bytes=commit_log.write_log_offset_bytes,
            flushed_log_offset_bytes=commit_log.flushed_log_offset_bytes,
            dispatched_log_offset_bytes=dispatcher.dispatched_log_offset_bytes,
            record_total=commit_log.record_total,
            dispatched_record_total=dispatcher.record_total,
            queue_count=dispatcher.queue_count,
        )


def warm_up_kernels() -> None:
    """Compile (or load from numba's cache) every kernel the store runs, on tiny buffers; a
    role calls it before it reports ready."""
    warm_up_append_kernel()
    warm_up_plan_kernel()
    warm_up_index_kernels()
    warm_up_dispatch_kernel()
    warm_up_recovery_kernels()
