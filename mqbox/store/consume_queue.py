"""Consume queues: per (topic, queue_id), fixed 20-byte entries pointing into the commit log.

Owns: the files under consumequeue/<topic>/<queue_id>/ (entry layout drawn in layout.py), the
queue's bounds (`min_queue_index`, `entry_count`), appending entries in batches, reading
windows of them, truncating them by log offset (recovery), deleting old segments (retention),
and recovering a queue's length when it is opened. `ConsumeQueueTable` owns the many queues of
one store and the budget of maps they share.

Written only by the dispatcher (the single writer of consume queues; recovery runs in the same
role before it starts). Readers in other processes open queues read-only and learn how far to
read from the counts the dispatcher publishes (`observe_entry_count`).

Never: read the commit log, decide where recovery starts, compute tag hashes, or share a map
with another process.

Invariants:
- Entries of a queue are sorted by log offset and do not overlap: entry i's record ends at or
  before entry i+1's starts. `append` asserts it per batch and recovery checks it again.
- Every written entry has size_bytes > 0, so an all-zero entry is an unwritten one. The written
  entries of a queue are a prefix of its byte space: recovery stops at the first unwritten
  entry and, in a writable queue, zeroes anything after it (a torn tail from pages that reached
  the disk out of order). Consume queues are derived data; recovery rebuilds what is cut.
- min_queue_index <= entry_count; min_queue_index only grows; the last segment is never
  deleted by retention, so `entry_count` survives on disk even when every message expired.

Map and descriptor budget (10,000 queues): a queue holds no descriptor and no map while idle.
Segments are mapped on first use and registered in one `MapLru` per table; past
`map_count_max` the least recently used map is closed (each open map costs one descriptor,
because Python's mmap keeps a duplicate, and one of vm.max_map_count's 65530 mappings). The
default is a quarter of RLIMIT_NOFILE, at most 4096, leaving descriptors for sockets and the
commit log. No queue runs a thread; a flush walks the queues marked dirty since the last one,
or, when many are dirty, syncs the file system once (`mapped_file.sync_filesystem`).
RocketMQ keeps every segment mapped, which is why its deployment guide raises both limits.
"""

from __future__ import annotations

import dataclasses
import resource
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from mqbox.errors import StoreError
from mqbox.store.layout import (
    CQ_ENTRY_DTYPE,
    CQ_ENTRY_SIZE_BYTES,
    INT32_MAX,
    StoreGeometry,
    consume_queue_dir,
    consume_queue_root_dir,
    is_safe_topic_dir_name,
)
from mqbox.store.mapped_file import (
    MapLru,
    MappedFile,
    MappedFileQueue,
    data_end_bytes,
    fsync_directory,
    store_error,
    sync_filesystem,
)

# With at least this many dirty queues, one syncfs is cheaper than a flush per queue.
SYNC_FILESYSTEM_DIRTY_QUEUE_COUNT_MIN = 32

# Recovery checks the last few segments of a queue entry by entry and trusts the ones before
# them to be full; RocketMQ starts its consume-queue recovery three files from the end too.
RECOVERY_SEGMENT_COUNT = 3

# append checks a batch up to this size entry by entry in Python, a larger one with numpy.
_SMALL_BATCH_ENTRY_COUNT_MAX = 8
_ZERO_ENTRIES = bytes(_SMALL_BATCH_ENTRY_COUNT_MAX * CQ_ENTRY_SIZE_BYTES)

CqEntries = NDArray[np.void]
"""A 1-d numpy array of CQ_ENTRY_DTYPE (big-endian log_offset_bytes, size_bytes, tag_hash)."""


class CqEntry(NamedTuple):
    """One consume-queue entry as Python integers."""

    log_offset_bytes: int
    size_bytes: int
    tag_hash: int


def map_count_max_default() -> int:
    """Default map budget of a table: a quarter of the descriptor limit, between 64 and 4096."""
    soft_limit, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft_limit == resource.RLIM_INFINITY:
        return 4096
    return max(64, min(4096, soft_limit // 4))


def empty_entries() -> CqEntries:
    """An empty array of consume-queue entries."""
    return np.empty(0, dtype=CQ_ENTRY_DTYPE)


def make_entries(
    log_offsets_bytes: NDArray[np.integer[Any]] | list[int],
    sizes_bytes: NDArray[np.integer[Any]] | list[int],
    tag_hashes: NDArray[np.integer[Any]] | list[int],
) -> CqEntries:
    """A structured array of entries from three equally long integer sequences."""
    entry_count = len(log_offsets_bytes)
    assert len(sizes_bytes) == entry_count
    assert len(tag_hashes) == entry_count
    entries = np.empty(entry_count, dtype=CQ_ENTRY_DTYPE)
    entries["log_offset_bytes"] = log_offsets_bytes
    entries["size_bytes"] = sizes_bytes
    entries["tag_hash"] = tag_hashes
    return entries


class ConsumeQueue:
    """One consume queue: RocketMQ's ConsumeQueue for (topic, queue_id).

    Queue indexes are absolute: entry `queue_index` lives at byte `queue_index * 20` of the
    queue's byte space. Readable entries are [min_queue_index, entry_count).
    """

    def __init__(
        self,
        store_root: Path,
        topic: str,
        queue_id: int,
        geometry: StoreGeometry,
        *,
        writable: bool,
        map_lru: MapLru | None = None,
        on_dirty: Callable[[ConsumeQueue], None] | None = None,
    ):
        """Prepare the queue without touching the disk; `open()` is the usual constructor."""
        assert is_safe_topic_dir_name(topic)
        assert queue_id >= 0
        self.topic = topic
        self.queue_id = queue_id
        self.geometry = geometry
        self.writable = writable
        self.directory = consume_queue_dir(store_root, topic, queue_id)
        self._segment_entry_count = geometry.cq_segment_entry_count
        # Random access: an append's paired check reads the (sparse) slots it writes, and on
        # this kind of VM a read-around fault on a hole costs milliseconds (bench/store_backlog).
        self._segments = MappedFileQueue(
            self.directory,
            geometry.cq_segment_size_bytes,
            writable=writable,
            map_lru=map_lru,
            random_access=True,
        )
        self._on_dirty = on_dirty
        self._min_queue_index = 0
        self._entry_count = 0
        self._flushed_entry_count = 0
        self._log_end_offset_bytes = 0
        self.torn_entry_count_recovered = 0

    @classmethod
    def open(
        cls,
        store_root: Path,
        topic: str,
        queue_id: int,
        geometry: StoreGeometry,
        *,
        writable: bool,
        map_lru: MapLru | None = None,
        on_dirty: Callable[[ConsumeQueue], None] | None = None,
    ) -> ConsumeQueue:
        """Open the queue and recover its length; a queue without files is empty at 0."""
        queue = cls(
            store_root,
            topic,
            queue_id,
            geometry,
            writable=writable,
            map_lru=map_lru,
            on_dirty=on_dirty,
        )
        queue.recover()
        return queue

    # -- bounds --------------------------------------------------------------------------------

    @property
    def min_queue_index(self) -> int:
        """Index of the oldest readable entry."""
        return self._min_queue_index

    @property
    def entry_count(self) -> int:
        """Index of the next entry to write: RocketMQ's max offset of the queue."""
        return self._entry_count

    @property
    def flushed_entry_count(self) -> int:
        """Entries below this index are durable."""
        return self._flushed_entry_count

    @property
    def log_end_offset_bytes(self) -> int:
        """Where the newest entry's record ends in the commit log; 0 when the queue is empty.

        The dispatcher skips records that end at or before this when it dispatches again after
        a restart, which makes re-dispatch idempotent (RocketMQ's maxPhysicOffset).
        """
        return self._log_end_offset_bytes

    @property
    def segment_count(self) -> int:
        """How many segment files the queue has."""
        return self._segments.segment_count

    # -- recovery ------------------------------------------------------------------------------

    def recover(self) -> None:
        """Find the queue's bounds from its files; in a writable queue, zero a torn tail."""
        self._segments.load()
        starts_bytes = self._segments.segment_starts_bytes
        self.torn_entry_count_recovered = 0
        if not starts_bytes:
            self._min_queue_index = 0
            self._entry_count = 0
            self._flushed_entry_count = 0
            self._log_end_offset_bytes = 0
            return
        first_checked = max(0, len(starts_bytes) - RECOVERY_SEGMENT_COUNT)
        checked_starts_bytes = starts_bytes[first_checked:]
        data_ends_bytes = {
            start_offset_bytes: data_end_bytes(self._segments.segment_path(start_offset_bytes))
            for start_offset_bytes in checked_starts_bytes
        }
        entry_count = checked_starts_bytes[0] // CQ_ENTRY_SIZE_BYTES
        for start_offset_bytes in checked_starts_bytes:
            valid_entry_count = self._recover_valid_prefix(
                start_offset_bytes, data_ends_bytes[start_offset_bytes]
            )
            entry_count = start_offset_bytes // CQ_ENTRY_SIZE_BYTES + valid_entry_count
            if valid_entry_count < self._segment_entry_count:
                break
        torn_entry_count = self._recover_count_written_beyond(entry_count, data_ends_bytes)
        if torn_entry_count > 0 and self.writable:
            self._segments.truncate(entry_count * CQ_ENTRY_SIZE_BYTES)
        self.torn_entry_count_recovered = torn_entry_count
        self._min_queue_index = starts_bytes[0] // CQ_ENTRY_SIZE_BYTES
        self._entry_count = entry_count
        # What the last process left in the page cache may not be on disk yet; the first
        # flush covers the checked segments again (msync of clean pages costs little).
        self._flushed_entry_count = starts_bytes[first_checked] // CQ_ENTRY_SIZE_BYTES
        self._log_end_offset_bytes = self._recover_log_end_offset()
        assert self._min_queue_index <= self._entry_count

    def _recover_valid_prefix(self, start_offset_bytes: int, scan_end_bytes: int) -> int:
        """How many entries at the start of one segment are written and in order; the bytes
        from `scan_end_bytes` on are a hole (zeros)."""
        segment = self._segments.segment(start_offset_bytes)
        scan_entry_count = min(-(-scan_end_bytes // CQ_ENTRY_SIZE_BYTES), self._segment_entry_count)
        entries = _entries_view(segment)[:scan_entry_count]
        valid = (entries["size_bytes"] > 0) & (entries["log_offset_bytes"] >= 0)
        invalid_positions = np.flatnonzero(~valid)
        valid_entry_count = (
            int(invalid_positions[0]) if invalid_positions.size > 0 else scan_entry_count
        )
        # Pages that reached the disk carry entries written in order; anything else is damage
        # a crash cannot cause, so it is reported rather than repaired.
        log_offsets_bytes = entries["log_offset_bytes"][:valid_entry_count].astype(np.int64)
        log_ends_bytes = log_offsets_bytes + entries["size_bytes"][:valid_entry_count]
        disordered = np.flatnonzero(log_offsets_bytes[1:] < log_ends_bytes[:-1])
        if disordered.size > 0:
            queue_index = start_offset_bytes // CQ_ENTRY_SIZE_BYTES + int(disordered[0]) + 1
            raise StoreError(f"{segment.path}: entries out of log order at index {queue_index}")
        return valid_entry_count

    def _recover_count_written_beyond(
        self, entry_count: int, data_ends_bytes: dict[int, int]
    ) -> int:
        """How many entry slots at or after `entry_count` hold any non-zero byte.

        `data_ends_bytes` bounds the data of each segment that can hold such a slot.
        """
        torn_entry_count = 0
        cut_bytes = entry_count * CQ_ENTRY_SIZE_BYTES
        for start_offset_bytes, scan_end_bytes in data_ends_bytes.items():
            end_offset_bytes = start_offset_bytes + self._segments.segment_size_bytes
            if end_offset_bytes <= cut_bytes:
                continue
            first_entry = max(cut_bytes - start_offset_bytes, 0) // CQ_ENTRY_SIZE_BYTES
            scan_entry_count = -(-scan_end_bytes // CQ_ENTRY_SIZE_BYTES)
            if scan_entry_count <= first_entry:
                continue
            segment = self._segments.segment(start_offset_bytes)
            raw = segment.buffer[
                first_entry * CQ_ENTRY_SIZE_BYTES : scan_entry_count * CQ_ENTRY_SIZE_BYTES
            ].reshape(-1, CQ_ENTRY_SIZE_BYTES)
            torn_entry_count += int(np.count_nonzero(raw.any(axis=1)))
        return torn_entry_count

    def _recover_log_end_offset(self) -> int:
        last = self.last_entry()
        if last is None:
            return 0
        return last.log_offset_bytes + last.size_bytes

    # -- writing -------------------------------------------------------------------------------

    def append(self, entries: CqEntries, *, queue_index_first: int | None = None) -> int:
        """Append `entries` (CQ_ENTRY_DTYPE) at the end; return the queue index of the first.

        `queue_index_first`, when given, is the index the store writer assigned to the first
        record, and must be where the queue ends (a paired check of the writer's count).
        Segments roll as they fill; nothing is durable until `flush()`.
        """
        assert self.writable
        assert entries.dtype == CQ_ENTRY_DTYPE
        assert entries.ndim == 1
        batch_entry_count = len(entries)
        queue_index_start = self._entry_count
        if queue_index_first is not None:
            assert queue_index_first == queue_index_start
        if batch_entry_count == 0:
            return queue_index_start
        if batch_entry_count <= _SMALL_BATCH_ENTRY_COUNT_MAX:
            log_end_offset_bytes = self._check_small_batch(entries)
        else:
            log_offsets_bytes = entries["log_offset_bytes"].astype(np.int64)
            sizes_bytes = entries["size_bytes"].astype(np.int64)
            assert bool(np.all(sizes_bytes > 0))
            assert bool(np.all(log_offsets_bytes >= 0))
            assert int(log_offsets_bytes[0]) >= self._log_end_offset_bytes
            assert bool(np.all(log_offsets_bytes[1:] >= log_offsets_bytes[:-1] + sizes_bytes[:-1]))
            log_end_offset_bytes = int(log_offsets_bytes[-1] + sizes_bytes[-1])
        written_count = 0
        while written_count < batch_entry_count:
            queue_index = queue_index_start + written_count
            segment = self._segments.segment_for_write(queue_index * CQ_ENTRY_SIZE_BYTES)
            first_in_segment = queue_index % self._segment_entry_count
            chunk_count = min(
                batch_entry_count - written_count, self._segment_entry_count - first_in_segment
            )
            start_bytes = first_in_segment * CQ_ENTRY_SIZE_BYTES
            end_bytes = start_bytes + chunk_count * CQ_ENTRY_SIZE_BYTES
            chunk = entries[written_count : written_count + chunk_count]
            # Never overwrite: every slot past entry_count is zero (recovery and truncation
            # zero what they cut), so a second writer or a lost count shows up here.
            if chunk_count <= _SMALL_BATCH_ENTRY_COUNT_MAX:  # bytes, without numpy's calls
                target_bytes = segment.buffer.data[start_bytes:end_bytes]
                assert target_bytes == _ZERO_ENTRIES[: end_bytes - start_bytes]
                target_bytes[:] = chunk.tobytes()
            else:
                assert not segment.buffer[start_bytes:end_bytes].any()
                target = _entries_view(segment)
                target[first_in_segment : first_in_segment + chunk_count] = chunk
            written_count += chunk_count
        assert written_count == batch_entry_count
        self._entry_count = queue_index_start + batch_entry_count
        self._log_end_offset_bytes = log_end_offset_bytes
        if self._on_dirty is not None:
            self._on_dirty(self)
        return queue_index_start

    def _check_small_batch(self, entries: CqEntries) -> int:
        """append's checks of a few entries, on Python ints (numpy's per-call cost is what a
        lone send pays otherwise: issue 15); returns where the last entry's record ends."""
        log_end_offset_bytes = self._log_end_offset_bytes
        for log_offset_bytes, size_bytes, _tag_hash in entries.tolist():
            assert size_bytes > 0
            assert log_offset_bytes >= 0
            assert log_offset_bytes >= log_end_offset_bytes
            log_end_offset_bytes = log_offset_bytes + size_bytes
        return int(log_end_offset_bytes)

    def append_entry(self, log_offset_bytes: int, size_bytes: int, tag_hash: int) -> int:
        """Append one entry; return its queue index."""
        assert 0 < size_bytes <= INT32_MAX
        return self.append(make_entries([log_offset_bytes], [size_bytes], [tag_hash]))

    def note_synced(self) -> None:
        """The caller made the whole file system durable (sync_filesystem) after the last
        append: every entry counts as flushed."""
        assert self.writable
        self._segments.note_synced()
        self._flushed_entry_count = self._entry_count

    def flush(self) -> bool:
        """Make every appended entry durable; True if anything was written."""
        assert self.writable
        if self._flushed_entry_count >= self._entry_count:
            self._segments.sync_directories()
            return False
        self._segments.flush(
            self._flushed_entry_count * CQ_ENTRY_SIZE_BYTES,
            self._entry_count * CQ_ENTRY_SIZE_BYTES,
        )
        self._flushed_entry_count = self._entry_count
        return True

    # -- reading -------------------------------------------------------------------------------

    def read(self, queue_index: int, entry_count_max: int) -> CqEntries:
        """A copy of up to `entry_count_max` entries from `queue_index` on, across segments.

        Empty when `queue_index` is outside [min_queue_index, entry_count); the caller (the pull
        processor) compares against those bounds first to answer OFFSET_TOO_SMALL or
        OFFSET_OVERFLOW. A copy costs 20 bytes per entry and stays valid however the maps move.
        """
        assert queue_index >= 0
        assert entry_count_max >= 0
        if queue_index < self._min_queue_index or queue_index >= self._entry_count:
            return empty_entries()
        end_queue_index = min(self._entry_count, queue_index + entry_count_max)
        result = np.empty(end_queue_index - queue_index, dtype=CQ_ENTRY_DTYPE)
        read_count = 0
        while queue_index + read_count < end_queue_index:
            position = queue_index + read_count
            segment = self._segments.find_segment(position * CQ_ENTRY_SIZE_BYTES)
            if segment is None:  # a reader raced retention; the rest is gone too
                self._reader_follow_retention()
                return empty_entries() if read_count == 0 else result[:read_count]
            first_in_segment = position % self._segment_entry_count
            chunk_count = min(
                end_queue_index - position, self._segment_entry_count - first_in_segment
            )
            source = _entries_view(segment)
            result[read_count : read_count + chunk_count] = source[
                first_in_segment : first_in_segment + chunk_count
            ]
            read_count += chunk_count
        # The paired check of append's: what comes back was written.
        assert bool(np.all(result["size_bytes"] > 0))
        return result

    def entry(self, queue_index: int) -> CqEntry | None:
        """The entry at `queue_index`, or None outside [min_queue_index, entry_count)."""
        entries = self.read(queue_index, 1)
        if len(entries) == 0:
            return None
        return _entry_tuple(entries[0])

    def last_entry(self) -> CqEntry | None:
        """The newest entry, or None when the queue holds none."""
        if self._entry_count <= self._min_queue_index:
            return None
        return self.entry(self._entry_count - 1)

    def segment_for_read(self, queue_index: int) -> MappedFile | None:
        """The mapped segment holding entry `queue_index`, or None if no segment holds it.

        For read plans (read_plan.plan_read scans the segment's bytes in place): the caller
        keeps the MappedFile between reads and asks again once it is `closed` (an LRU eviction)
        or the index moves to another segment. Entries at or past `entry_count` may be unwritten.
        """
        assert queue_index >= 0
        segment = self._segments.find_segment(queue_index * CQ_ENTRY_SIZE_BYTES)
        if segment is None and not self.writable:
            self._reader_follow_retention()
        return segment

    def observe_entry_count(self, entry_count: int) -> None:
        """Read-only queues: adopt the entry count the writer published."""
        assert not self.writable
        assert entry_count >= self._entry_count
        self._entry_count = entry_count

    def _reader_follow_retention(self) -> None:
        min_offset_bytes = self._segments.min_offset_bytes
        if min_offset_bytes is not None:
            self._min_queue_index = max(
                self._min_queue_index, min_offset_bytes // CQ_ENTRY_SIZE_BYTES
            )

    def follow_min_log_offset(self, min_log_offset_bytes: int) -> None:
        """Read-only queues: the commit log's minimum moved (retention, in other processes).
        Re-list the segments (the dispatcher deletes the ones wholly below the minimum, maybe
        while this runs) and move `min_queue_index` to the first entry whose record is still
        in the log: the writer's correct_min_queue_index, computed from this view.

        Entries are sorted by log offset, so a binary search finds it. An entry in a segment
        that vanished under the search lies below the minimum (the dispatcher deletes only
        such segments, oldest first); one past the last segment listed (a new one, not yet
        whole on disk) lies above it."""
        assert not self.writable
        self._segments.load()
        first_offset_bytes = self._segments.min_offset_bytes
        end_offset_bytes = self._segments.end_offset_bytes
        if first_offset_bytes is None or end_offset_bytes is None:
            return  # no file at all (the topic was deleted): nothing to move to
        low = max(self._min_queue_index, first_offset_bytes // CQ_ENTRY_SIZE_BYTES)
        if low > self._entry_count:
            self._entry_count = low  # a stale count: every entry below the segments is gone
        high = self._entry_count
        if low < high:
            # The usual case needs one look: the first entry still in the log is the first
            # one on disk (nothing deleted yet, or the dispatcher already caught up).
            segment = self._segments.find_segment(low * CQ_ENTRY_SIZE_BYTES)
            if segment is not None:
                entries = _entries_view(segment)
                first = entries[low % self._segment_entry_count]
                if int(first["log_offset_bytes"]) >= min_log_offset_bytes:
                    high = low
        while low < high:
            middle = (low + high) // 2
            position_bytes = middle * CQ_ENTRY_SIZE_BYTES
            if position_bytes >= end_offset_bytes:
                high = middle
                continue
            segment = self._segments.find_segment(position_bytes)
            if segment is None:
                low = middle + 1
                continue
            entries = _entries_view(segment)
            log_offset_bytes = int(entries[middle % self._segment_entry_count]["log_offset_bytes"])
            if log_offset_bytes >= min_log_offset_bytes:
                high = middle
            else:
                low = middle + 1
        assert low >= self._min_queue_index
        assert low <= self._entry_count
        self._min_queue_index = low

    # -- truncation and retention --------------------------------------------------------------

    def truncate_log_offset(self, log_offset_bytes: int) -> int:
        """Remove every entry whose record does not end at or before `log_offset_bytes`.

        Recovery calls this after cutting the commit log at `log_offset_bytes`. Returns how
        many entries were removed; the removal is durable when this returns.
        """
        assert self.writable
        assert log_offset_bytes >= 0
        # Entries are sorted by start and do not overlap, so their ends are sorted too.
        low = self._min_queue_index
        high = self._entry_count
        while low < high:
            middle = (low + high) // 2
            entry = self._entry_unchecked(middle)
            if entry.log_offset_bytes + entry.size_bytes > log_offset_bytes:
                high = middle
            else:
                low = middle + 1
        removed_count = self._entry_count - low
        if removed_count == 0:
            return 0
        self._segments.truncate(low * CQ_ENTRY_SIZE_BYTES)
        self._entry_count = low
        self._flushed_entry_count = min(self._flushed_entry_count, low)
        self._log_end_offset_bytes = self._recover_log_end_offset()
        assert self._log_end_offset_bytes <= log_offset_bytes
        return removed_count

    def delete_below_log_offset(self, min_log_offset_bytes: int) -> int:
        """Retention: delete segments whose every record starts below `min_log_offset_bytes`.

        `min_log_offset_bytes` is the commit log's new minimum. The last segment stays. Then
        `min_queue_index` moves to the first entry whose record is still in the commit log.
        Returns how many segments were deleted.
        """
        assert self.writable
        starts_bytes = self._segments.segment_starts_bytes
        keep_from_bytes = starts_bytes[0] if starts_bytes else 0
        for start_offset_bytes in starts_bytes[:-1]:
            segment_end_bytes = start_offset_bytes + self._segments.segment_size_bytes
            last_in_segment = self._entry_unchecked(segment_end_bytes // CQ_ENTRY_SIZE_BYTES - 1)
            if last_in_segment.log_offset_bytes >= min_log_offset_bytes:
                break
            keep_from_bytes = segment_end_bytes
        deleted_count = self._segments.delete_segments_below(keep_from_bytes)
        self.correct_min_queue_index(min_log_offset_bytes)
        return deleted_count

    def correct_min_queue_index(self, min_log_offset_bytes: int) -> None:
        """Move `min_queue_index` to the first entry whose record starts at or after the minimum.

        Recovery calls this after opening, with the commit log's minimum offset (RocketMQ's
        correctMinOffset); the result is not stored, it is derived again at each start. When
        every record is gone, `min_queue_index` becomes `entry_count` (nothing to consume).
        """
        first_offset_bytes = self._segments.min_offset_bytes
        if first_offset_bytes is None:
            return
        # Entries are sorted by log offset across segments: a binary search touches
        # log2(entry_count) entries, whichever segments they are in.
        low = max(self._min_queue_index, first_offset_bytes // CQ_ENTRY_SIZE_BYTES)
        high = self._entry_count
        while low < high:
            middle = (low + high) // 2
            if self._entry_unchecked(middle).log_offset_bytes >= min_log_offset_bytes:
                high = middle
            else:
                low = middle + 1
        assert low >= self._min_queue_index
        assert low <= self._entry_count
        self._min_queue_index = low

    def _entry_unchecked(self, queue_index: int) -> CqEntry:
        """The entry at `queue_index`, which must lie in an existing segment."""
        segment = self._segments.segment(
            self._segments.segment_start_bytes(queue_index * CQ_ENTRY_SIZE_BYTES)
        )
        return _entry_tuple(_entries_view(segment)[queue_index % self._segment_entry_count])

    # -- lifetime ------------------------------------------------------------------------------

    def close(self) -> None:
        """Release the maps (the queue stays usable; maps reopen on demand)."""
        self._segments.close()

    def destroy(self) -> None:
        """Delete every file of the queue and its directory (topic deletion)."""
        assert self.writable
        self._segments.destroy()
        self._min_queue_index = self._entry_count
        self._flushed_entry_count = self._entry_count


def _entries_view(segment: MappedFile) -> CqEntries:
    entries: CqEntries = segment.buffer.view(CQ_ENTRY_DTYPE)
    return entries


def _entry_tuple(entry: np.void) -> CqEntry:
    return CqEntry(
        log_offset_bytes=int(entry["log_offset_bytes"]),
        size_bytes=int(entry["size_bytes"]),
        tag_hash=int(entry["tag_hash"]),
    )


# ---------------------------------------------------------------------------------------------
# The queues of one store
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ConsumeQueueTableStatistics:
    """Counters of a ConsumeQueueTable."""

    queue_open_count: int
    queue_dirty_count: int
    map_open_count: int
    map_open_count_max: int
    map_opened_total: int
    map_evicted_total: int
    flushed_queue_total: int


class ConsumeQueueTable:
    """Every consume queue of one store, opened lazily: RocketMQ's consumeQueueTable.

    `queue()` opens (and recovers) a queue on first use and creates no file until the first
    append. All queues share one MapLru, so the number of open maps and descriptors stays
    under `map_count_max` however many queues exist.
    """

    def __init__(
        self,
        store_root: Path,
        geometry: StoreGeometry,
        *,
        writable: bool,
        map_count_max: int | None = None,
        sync_filesystem_dirty_queue_count_min: int = SYNC_FILESYSTEM_DIRTY_QUEUE_COUNT_MIN,
    ):
        assert sync_filesystem_dirty_queue_count_min >= 1
        self.store_root = store_root
        self.sync_filesystem_dirty_queue_count_min = sync_filesystem_dirty_queue_count_min
        self.geometry = geometry
        self.writable = writable
        self._map_lru = MapLru(map_count_max or map_count_max_default())
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._dirty: dict[tuple[str, int], ConsumeQueue] = {}
        self._flushed_queue_total = 0

    def queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The queue (topic, queue_id), opened on first use; empty if it has no files yet."""
        key = (topic, queue_id)
        queue = self._queues.get(key)
        if queue is None:
            queue = ConsumeQueue.open(
                self.store_root,
                topic,
                queue_id,
                self.geometry,
                writable=self.writable,
                map_lru=self._map_lru,
                on_dirty=self._mark_dirty,
            )
            self._queues[key] = queue
        return queue

    def find_queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """The queue if it is open or has a directory on disk, else None."""
        key = (topic, queue_id)
        queue = self._queues.get(key)
        if queue is not None:
            return queue
        if not is_safe_topic_dir_name(topic) or queue_id < 0:
            return None
        if not consume_queue_dir(self.store_root, topic, queue_id).is_dir():
            return None
        return self.queue(topic, queue_id)

    def queue_keys_on_disk(self) -> list[tuple[str, int]]:
        """(topic, queue_id) of every queue directory under consumequeue/, sorted."""
        root = consume_queue_root_dir(self.store_root)
        keys: list[tuple[str, int]] = []
        if not root.is_dir():
            return keys
        for topic_dir in root.iterdir():
            if not topic_dir.is_dir() or not is_safe_topic_dir_name(topic_dir.name):
                continue
            keys.extend(
                (topic_dir.name, int(queue_dir.name))
                for queue_dir in topic_dir.iterdir()
                if queue_dir.is_dir() and queue_dir.name.isdigit()
            )
        keys.sort()
        return keys

    def open_all(self) -> int:
        """Open (and so recover) every queue on disk; return how many the table holds."""
        for topic, queue_id in self.queue_keys_on_disk():
            self.queue(topic, queue_id)
        return len(self._queues)

    def queues(self) -> list[ConsumeQueue]:
        """The open queues, in the order they were opened."""
        return list(self._queues.values())

    def flush(self) -> int:
        """Flush every queue appended to since the last flush; return how many were flushed.

        Few dirty queues are flushed one by one (msync of their new entries). Many are made
        durable by one sync of the file system, which costs one journal commit however many
        queues there are; RocketMQ's per-queue loop costs one each.
        """
        assert self.writable
        dirty = list(self._dirty.values())
        self._dirty.clear()
        flushed_count = 0
        if len(dirty) >= self.sync_filesystem_dirty_queue_count_min:
            sync_filesystem(consume_queue_root_dir(self.store_root))
            for queue in dirty:
                queue.note_synced()
            flushed_count = len(dirty)
        else:
            for queue in dirty:
                if queue.flush():
                    flushed_count += 1
        self._flushed_queue_total += flushed_count
        return flushed_count

    def truncate_log_offset(self, log_offset_bytes: int) -> int:
        """Recovery: in every queue on disk, remove entries whose record does not end at or
        before `log_offset_bytes`; return how many entries were removed in all."""
        assert self.writable
        self.open_all()
        return sum(queue.truncate_log_offset(log_offset_bytes) for queue in self.queues())

    def delete_below_log_offset(self, min_log_offset_bytes: int) -> int:
        """Retention across every queue on disk; return how many segments were deleted."""
        assert self.writable
        self.open_all()
        return sum(queue.delete_below_log_offset(min_log_offset_bytes) for queue in self.queues())

    def delete_topic(self, topic: str) -> int:
        """Delete every queue of `topic` and its directory; return how many queues went."""
        assert self.writable
        assert is_safe_topic_dir_name(topic)
        keys = [key for key in self.queue_keys_on_disk() if key[0] == topic]
        keys.extend(key for key in self._queues if key[0] == topic and key not in keys)
        for key in keys:
            self.queue(*key).destroy()
            self._queues.pop(key, None)
            self._dirty.pop(key, None)
        root = consume_queue_root_dir(self.store_root)
        topic_dir = root / topic
        if topic_dir.is_dir():
            try:
                topic_dir.rmdir()
            except OSError as error:
                raise store_error(error, "remove directory", topic_dir) from error
            fsync_directory(root)
        return len(keys)

    def close(self) -> None:
        """Release every map; queues stay known and reopen their maps on demand."""
        for queue in self._queues.values():
            queue.close()

    def statistics(self) -> ConsumeQueueTableStatistics:
        """Counters since the table was made."""
        lru = self._map_lru.statistics()
        return ConsumeQueueTableStatistics(
            queue_open_count=len(self._queues),
            queue_dirty_count=len(self._dirty),
            map_open_count=lru.open_count,
            map_open_count_max=lru.open_count_max,
            map_opened_total=lru.opened_total,
            map_evicted_total=lru.evicted_total,
            flushed_queue_total=self._flushed_queue_total,
        )

    def _mark_dirty(self, queue: ConsumeQueue) -> None:
        self._dirty[(queue.topic, queue.queue_id)] = queue
