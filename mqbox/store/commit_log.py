"""The commit log: one writer appends stored records to 1 GiB segments and assigns their offsets.

Owns: the files under commitlog/ (record format drawn in message.py, names in layout.py), the
write position (`write_log_offset_bytes`), the flushed position (`flushed_log_offset_bytes`), the
next queue index of every (topic, queue_id) the writer has seen (`QueueIndexTable`), the append
kernel that copies a batch into the mapped segment and patches its store-side fields, and the
msync and page-population calls (flush.py schedules the flushes and warms the pages). Written
only by the store writer (one thread of one process); the flush thread and the segment warmer
(flush.py) run in other threads of the same process. Readers in other processes map the segments
read-only and never learn positions from this object.

Never: decode properties, build consume-queue or index entries (dispatch.py does), decide where
recovery starts (recovery owns `set_write_position`), or touch a socket.

Invariants:
- Records sit back to back from the first segment's start; a record of L bytes goes into a
  segment only if L + 8 <= the bytes left in it (RocketMQ's rule), so every segment that is
  left ends with an 8-byte blank [bytes left][BLANK_MAGIC] and a record never ends exactly at a
  segment end. A batch is all-or-nothing in one segment: it is checked whole (sizes, magic,
  queue id, topic, room) by the kernel before the kernel writes its first byte.
- QUEUEOFFSET is dense per (topic, queue_id): the writer hands out next_queue_index[slot] and
  counts it up, for records of transaction type NOT or COMMIT only (PREPARED and ROLLBACK
  records get 0 and no consume-queue entry, as in RocketMQ's CommitLog.doAppend). The dispatcher
  checks each record's QUEUEOFFSET against its own count again (the paired assertion).
- PHYSICALOFFSET equals the record's log offset; STORETIMESTAMP and STOREHOST are the store's.
- write_log_offset_bytes only moves after the bytes below it are complete, so a flusher or a
  dispatcher that reads it sees whole records below it. flushed_log_offset_bytes <=
  write_log_offset_bytes, and every byte below it (and every segment file and directory entry
  that holds one) is durable.

Threads: the append path takes no lock; it works on the current segment's numpy view and
publishes the new write position last. `_lock` guards the segment list (a roll, a flush's
directory sync, map lookups off the hot path); `_flush_lock` lets one flush run at a time.
msync and madvise go through ctypes, which releases the GIL; CPython 3.11's mmap.flush() holds
it, which would stall the writer for the whole fsync of a group commit.
"""

from __future__ import annotations

import ctypes
import dataclasses
import mmap
import struct
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Final, NamedTuple, TypeVar

import numpy as np
from numpy.typing import NDArray

from mqbox._jit import compiler_fence, kernel
from mqbox.clock import wall_clock_ms
from mqbox.errors import MessageIllegalError, MessageTooLargeError, StoreError
from mqbox.message import (
    BLANK_MAGIC,
    BLANK_SIZE_BYTES,
    BODY_LENGTH_POSITION_BYTES,
    BODY_POSITION_BYTES,
    BODY_SIZE_BYTES_MAX_DEFAULT,
    HOST_SIZE_BYTES,
    MAGICCODE_POSITION_BYTES,
    MESSAGE_MAGIC,
    PHYSICALOFFSET_POSITION_BYTES,
    QUEUEID_POSITION_BYTES,
    QUEUEOFFSET_POSITION_BYTES,
    RECORD_SIZE_BYTES_MIN,
    STOREHOST_POSITION_BYTES,
    STORETIMESTAMP_POSITION_BYTES,
    SYSFLAG_POSITION_BYTES,
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_PREPARED_TYPE,
    SYSFLAG_TRANSACTION_ROLLBACK_TYPE,
    TOPIC_LENGTH_SIZE_BYTES,
    TOPIC_SIZE_BYTES_MAX,
    TOTALSIZE_POSITION_BYTES,
    MessageToStore,
    encode_record,
    encode_topic,
)
from mqbox.message_kernels import (
    STOP_BLANK,
    STOP_END,
    STOP_FULL,
    copy_bytes,
    read_s32_be,
    read_u8,
    read_u32_be,
    write_i32_be,
    write_i64_be,
)
from mqbox.store.kernels import scan_records
from mqbox.store.layout import StoreGeometry, commit_log_dir, is_safe_topic_dir_name
from mqbox.store.mapped_file import PAGE_SIZE_BYTES, MappedFileQueue, store_error

_Scalar = TypeVar("_Scalar", bound=np.generic)

# --- Append kernel ------------------------------------------------------------------------------

# Negative results of append_batch_kernel; anything >= 0 is the file offset after the batch.
APPEND_NO_ROOM: Final = -1  # the batch plus a blank does not fit the rest of the segment
APPEND_TOO_LARGE: Final = -2  # a record is over record_size_bytes_max
APPEND_BAD_RECORD: Final = -3  # a record is not what the caller said (a programmer error)
# The word a record is published by: TOTALSIZE then MAGICCODE, stored after every other byte.
RECORD_PUBLISH_WORD_SIZE_BYTES: Final = 8
PUBLISH_ALL: Final = 1 << 62
assert TOTALSIZE_POSITION_BYTES == 0
assert MAGICCODE_POSITION_BYTES == 4

TOPIC_TABLE_WIDTH_BYTES: Final = TOPIC_SIZE_BYTES_MAX + 1  # one row of a topic-bytes table
assert TOPIC_TABLE_WIDTH_BYTES == 128


@kernel
def append_batch_kernel(
    source: NDArray[np.uint8],
    sizes_bytes: NDArray[np.int32],
    queue_slots: NDArray[np.int32],
    queue_slot_all: int,
    next_queue_indexes: NDArray[np.int64],
    slot_queue_ids: NDArray[np.int32],
    slot_topics: NDArray[np.uint8],
    slot_topic_sizes: NDArray[np.int32],
    segment: NDArray[np.uint8],
    file_offset_bytes: int,
    base_log_offset_bytes: int,
    store_timestamp_ms: int,
    store_host: NDArray[np.uint8],
    record_size_bytes_max: int,
    out_queue_indexes: NDArray[np.int64],
    publish_count_max: int,
) -> int:
    """Copy the records of `source` into `segment` at `file_offset_bytes` and patch them.

    Record i has sizes_bytes[i] bytes and follows record i-1 in `source`. Its queue slot is
    `queue_slot_all` when that is >= 0, else queue_slots[i]. Pass one checks every record before
    anything is written: size in [91, record_size_bytes_max] (else APPEND_TOO_LARGE), inside
    `source`, TOTALSIZE equal to its size, message magic, inner lengths inside the record,
    QUEUEID and topic bytes equal to its slot's (else APPEND_BAD_RECORD); then that the batch
    plus a blank fits the segment (else APPEND_NO_ROOM). Pass two copies each record and writes
    QUEUEOFFSET (next_queue_indexes[slot], counted up, for transaction types NOT and COMMIT; 0
    for PREPARED and ROLLBACK), PHYSICALOFFSET (base_log_offset_bytes + its file offset),
    STORETIMESTAMP and STOREHOST, leaving each record's first 8 bytes zero. Pass three
    publishes the records by storing those 8 bytes, TOTALSIZE and then MAGICCODE, last (see the
    comment there). out_queue_indexes[i] gets the queue index when the array is not empty.
    `publish_count_max` is a test hook: only the first that many records are published, as if
    the writer died there (CommitLog passes PUBLISH_ALL). Returns the file offset after the
    last record.
    """
    record_count = sizes_bytes.size
    # Pass one: check everything, write nothing.
    position_bytes = 0
    for record in range(record_count):
        size_bytes = int(sizes_bytes[record])
        if size_bytes > record_size_bytes_max:
            return APPEND_TOO_LARGE
        if size_bytes < RECORD_SIZE_BYTES_MIN:
            return APPEND_BAD_RECORD
        if position_bytes + size_bytes > source.size:
            return APPEND_BAD_RECORD
        if read_s32_be(source, position_bytes + TOTALSIZE_POSITION_BYTES) != size_bytes:
            return APPEND_BAD_RECORD
        if read_u32_be(source, position_bytes + MAGICCODE_POSITION_BYTES) != MESSAGE_MAGIC:
            return APPEND_BAD_RECORD
        slot = queue_slot_all if queue_slot_all >= 0 else int(queue_slots[record])
        if slot < 0 or slot >= next_queue_indexes.size:
            return APPEND_BAD_RECORD
        queue_id = read_s32_be(source, position_bytes + QUEUEID_POSITION_BYTES)
        if queue_id != slot_queue_ids[slot]:
            return APPEND_BAD_RECORD
        body_size_bytes = read_s32_be(source, position_bytes + BODY_LENGTH_POSITION_BYTES)
        if body_size_bytes < 0 or body_size_bytes > size_bytes - RECORD_SIZE_BYTES_MIN:
            return APPEND_BAD_RECORD
        topic_length_at = position_bytes + BODY_POSITION_BYTES + body_size_bytes
        topic_size_bytes = read_u8(source, topic_length_at)
        if topic_size_bytes != slot_topic_sizes[slot]:
            return APPEND_BAD_RECORD
        if RECORD_SIZE_BYTES_MIN + body_size_bytes + topic_size_bytes > size_bytes:
            return APPEND_BAD_RECORD
        topic_at = topic_length_at + TOPIC_LENGTH_SIZE_BYTES
        for index in range(topic_size_bytes):
            if source[topic_at + index] != slot_topics[slot, index]:
                return APPEND_BAD_RECORD
        position_bytes += size_bytes
    batch_size_bytes = position_bytes
    if file_offset_bytes + batch_size_bytes + BLANK_SIZE_BYTES > segment.size:
        return APPEND_NO_ROOM
    # Pass two: copy and patch everything but each record's first word [TOTALSIZE][MAGICCODE],
    # which stays zero, so nothing of the batch is a record yet.
    want_queue_indexes = out_queue_indexes.size > 0
    published_count = min(record_count, publish_count_max)
    source_at = 0
    target_at = file_offset_bytes
    for record in range(record_count):
        size_bytes = int(sizes_bytes[record])
        write_i32_be(segment, target_at + TOTALSIZE_POSITION_BYTES, 0)
        write_i32_be(segment, target_at + MAGICCODE_POSITION_BYTES, 0)
        copy_bytes(
            segment,
            target_at + RECORD_PUBLISH_WORD_SIZE_BYTES,
            source,
            source_at + RECORD_PUBLISH_WORD_SIZE_BYTES,
            size_bytes - RECORD_PUBLISH_WORD_SIZE_BYTES,
        )
        slot = queue_slot_all if queue_slot_all >= 0 else int(queue_slots[record])
        transaction_type = (
            read_s32_be(segment, target_at + SYSFLAG_POSITION_BYTES) & SYSFLAG_TRANSACTION_MASK
        )
        queue_index = 0
        if (
            transaction_type != SYSFLAG_TRANSACTION_PREPARED_TYPE
            and transaction_type != SYSFLAG_TRANSACTION_ROLLBACK_TYPE
        ):
            queue_index = int(next_queue_indexes[slot])
            next_queue_indexes[slot] = queue_index + 1
        write_i64_be(segment, target_at + QUEUEOFFSET_POSITION_BYTES, queue_index)
        write_i64_be(
            segment, target_at + PHYSICALOFFSET_POSITION_BYTES, base_log_offset_bytes + target_at
        )
        write_i64_be(segment, target_at + STORETIMESTAMP_POSITION_BYTES, store_timestamp_ms)
        for index in range(HOST_SIZE_BYTES):
            segment[target_at + STOREHOST_POSITION_BYTES + index] = store_host[index]
        if want_queue_indexes:
            out_queue_indexes[record] = queue_index
        source_at += size_bytes
        target_at += size_bytes
    # Pass three: publish, in order: every size, then every magic. A record exists for a scan
    # only once its magic is whole, and by then all of its other bytes are stored (the fences
    # keep the compiler from moving stores across; x86-64 keeps program order for the rest), so
    # a writer killed anywhere in this kernel leaves whole records or none past the last whole.
    compiler_fence()
    target_at = file_offset_bytes
    for record in range(published_count):
        size_bytes = int(sizes_bytes[record])
        write_i32_be(segment, target_at + TOTALSIZE_POSITION_BYTES, size_bytes)
        target_at += size_bytes
    compiler_fence()
    target_at = file_offset_bytes
    for record in range(published_count):
        write_i32_be(segment, target_at + MAGICCODE_POSITION_BYTES, MESSAGE_MAGIC)
        target_at += int(sizes_bytes[record])
    compiler_fence()
    return file_offset_bytes + batch_size_bytes


# --- ctypes: msync and madvise without the GIL --------------------------------------------------

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.msync.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_LIBC.msync.restype = ctypes.c_int
_LIBC.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_LIBC.madvise.restype = ctypes.c_int
_MS_SYNC: Final = 4  # <sys/mman.h> on Linux
# Linux 5.14: fault in writable page-table entries, as a write to each page would.
_MADV_POPULATE_WRITE: Final = 23
assert sys.platform.startswith("linux")
assert mmap.PAGESIZE == PAGE_SIZE_BYTES


def _page_range(buffer: NDArray[np.uint8], start_bytes: int, end_bytes: int) -> tuple[int, int]:
    """(address, length) of the whole pages of `buffer` covering [start_bytes, end_bytes)."""
    assert 0 <= start_bytes < end_bytes <= buffer.size
    start_page_bytes = start_bytes - start_bytes % PAGE_SIZE_BYTES
    end_page_bytes = min(-(-end_bytes // PAGE_SIZE_BYTES) * PAGE_SIZE_BYTES, buffer.size)
    address = int(buffer.ctypes.data)
    assert address % PAGE_SIZE_BYTES == 0  # a segment view starts at its map's first byte
    return address + start_page_bytes, end_page_bytes - start_page_bytes


def msync_range(buffer: NDArray[np.uint8], start_bytes: int, end_bytes: int, path: Path) -> None:
    """msync(MS_SYNC) the pages of the mapped `buffer` covering [start_bytes, end_bytes).

    Linux implements it as a ranged fdatasync of the file. ctypes drops the GIL for the call.
    """
    if start_bytes >= end_bytes:
        return
    address, length_bytes = _page_range(buffer, start_bytes, end_bytes)
    if _LIBC.msync(address, length_bytes, _MS_SYNC) != 0:
        code = ctypes.get_errno()
        raise store_error(OSError(code, "msync failed"), "flush", path)


def populate_write(buffer: NDArray[np.uint8], start_bytes: int, end_bytes: int) -> bool:
    """Fault in the pages covering [start_bytes, end_bytes) writable; False if the kernel
    refused (too old for MADV_POPULATE_WRITE, or out of memory). Never changes the data."""
    if start_bytes >= end_bytes:
        return True
    address, length_bytes = _page_range(buffer, start_bytes, end_bytes)
    return bool(_LIBC.madvise(address, length_bytes, _MADV_POPULATE_WRITE) == 0)


# --- The writer's queue table -------------------------------------------------------------------


class QueueIndexTable:
    """Next queue index of every (topic, queue_id) the writer has appended to.

    A queue gets a slot on first use; its starting index comes from `initial_queue_index`
    (the consume queue's entry count: after dispatch has caught up at open, that is exact, which
    is how queue offsets survive a restart). Slots index plain numpy arrays that the append
    kernel reads and counts up, so the table is cheap to copy into shared memory.
    """

    def __init__(
        self, initial_queue_index: Callable[[str, int], int], slot_count_initial: int = 64
    ):
        assert slot_count_initial > 0
        self._initial_queue_index = initial_queue_index
        self.slot_of: dict[tuple[str, int], int] = {}
        self.slot_keys: list[tuple[str, int]] = []
        self.next_queue_indexes = np.zeros(slot_count_initial, dtype=np.int64)
        self.queue_ids = np.full(slot_count_initial, -1, dtype=np.int32)
        self.topics = np.zeros((slot_count_initial, TOPIC_TABLE_WIDTH_BYTES), dtype=np.uint8)
        self.topic_sizes = np.full(slot_count_initial, -1, dtype=np.int32)

    @property
    def slot_count(self) -> int:
        """How many queues hold a slot."""
        return len(self.slot_keys)

    def slot(self, topic: str, queue_id: int) -> int:
        """The slot of (topic, queue_id), made on first use.

        Raises MessageIllegalError for a topic that cannot name a consume-queue directory or is
        over 127 bytes, and for a negative queue id.
        """
        key = (topic, queue_id)
        slot = self.slot_of.get(key)
        if slot is not None:
            return slot
        topic_bytes = encode_topic(topic)
        if not is_safe_topic_dir_name(topic):
            raise MessageIllegalError(f"topic {topic!r} cannot name a consume queue")
        if not 0 <= queue_id < 2**31:
            raise MessageIllegalError(f"queue id {queue_id} is out of range")
        queue_index = self._initial_queue_index(topic, queue_id)
        assert queue_index >= 0
        slot = len(self.slot_keys)
        if slot == self.next_queue_indexes.size:
            self._grow()
        self.next_queue_indexes[slot] = queue_index
        self.queue_ids[slot] = queue_id
        self.topics[slot, : len(topic_bytes)] = np.frombuffer(topic_bytes, dtype=np.uint8)
        self.topic_sizes[slot] = len(topic_bytes)
        self.slot_keys.append(key)
        self.slot_of[key] = slot
        return slot

    def next_queue_index(self, topic: str, queue_id: int) -> int:
        """The queue index the next record of (topic, queue_id) gets: RocketMQ's topicQueueTable."""
        return int(self.next_queue_indexes[self.slot(topic, queue_id)])

    def _grow(self) -> None:
        capacity = self.next_queue_indexes.size * 2
        self.next_queue_indexes = _grown(self.next_queue_indexes, capacity, 0)
        self.queue_ids = _grown(self.queue_ids, capacity, -1)
        self.topic_sizes = _grown(self.topic_sizes, capacity, -1)
        topics = np.zeros((capacity, TOPIC_TABLE_WIDTH_BYTES), dtype=np.uint8)
        topics[: self.topics.shape[0]] = self.topics
        self.topics = topics


def _grown(array: NDArray[_Scalar], capacity: int, fill: int) -> NDArray[_Scalar]:
    grown = np.full(capacity, fill, dtype=array.dtype)
    grown[: array.size] = array
    return grown


# --- The commit log -----------------------------------------------------------------------------


class AppendResult(NamedTuple):
    """Where a batch went. Records are back to back: record i starts at log_offset_bytes plus
    the sizes of records 0..i-1 (record_log_offsets() computes them all)."""

    log_offset_bytes: int  # the first record's; its offset msgId is store host + this
    queue_index: int  # the first record's QUEUEOFFSET; -1 when the batch spans several queues
    record_count: int
    end_log_offset_bytes: int  # SYNC_FLUSH: the batch is durable once flushed reaches this
    store_timestamp_ms: int


def record_log_offsets(result: AppendResult, sizes_bytes: NDArray[np.int32]) -> NDArray[np.int64]:
    """Log offset of every record of an appended batch (the send response's msgIds)."""
    assert sizes_bytes.size == result.record_count
    offsets = np.empty(result.record_count, dtype=np.int64)
    offsets[0] = result.log_offset_bytes
    np.cumsum(sizes_bytes[:-1], out=offsets[1:])
    offsets[1:] += result.log_offset_bytes
    assert int(offsets[-1]) + int(sizes_bytes[-1]) == result.end_log_offset_bytes
    return offsets


class ReplicaAppendResult(NamedTuple):
    log_offset_bytes: int  # where the bytes went (the write position before)
    end_log_offset_bytes: int  # the write position after (the next segment's start after a blank)
    record_count: int


@dataclasses.dataclass(frozen=True)
class CommitLogStatistics:
    """Counters of a CommitLog since it was opened."""

    append_batch_total: int
    record_total: int
    roll_total: int
    flush_total: int
    write_log_offset_bytes: int
    flushed_log_offset_bytes: int


_NO_SLOTS = np.empty(0, dtype=np.int32)
_NO_QUEUE_INDEXES = np.empty(0, dtype=np.int64)
_EMPTY_SEGMENT = np.empty(0, dtype=np.uint8)
_BLANK = struct.Struct(">iI")
_SIZE_AND_MAGIC = struct.Struct(">iI")
_INT64_BE = struct.Struct(">q")
# A clean stop leaves zeros right after the last record; this much of them is checked.
_CLEAN_END_ZERO_CHECK_BYTES = 64 * 1024


def _scan_outputs(
    capacity: int,
) -> tuple[
    NDArray[np.int64],
    NDArray[np.int32],
    NDArray[np.int32],
    NDArray[np.int64],
    NDArray[np.int64],
    NDArray[np.int64],
]:
    """The out arrays of kernels.scan_records, `capacity` records each: log offsets, sizes,
    queue ids, queue indexes, tag hashes, store times."""
    wide = [np.empty(capacity, dtype=np.int64) for _ in range(4)]
    return (
        wide[0],
        np.empty(capacity, dtype=np.int32),
        np.empty(capacity, dtype=np.int32),
        wide[1],
        wide[2],
        wide[3],
    )


# Records one scan_records call of count_records reports (40 KB of outputs per call).
COUNT_SCAN_CAPACITY: Final = 1024


class WriterStoppedForTestError(Exception):
    """Raised by an append that the `publish_count_max_for_test` hook cut short: the store is
    then in the state a writer killed inside the append kernel leaves (tests only)."""


class CommitLog:
    """The segments of commitlog/ and the one writer that appends to them.

    Open with `open()`; then the owner (the store's recovery) sets the write position with
    `set_write_position()` before the first append. Read-only instances (other processes) only
    read records below a position they learn elsewhere.
    """

    def __init__(
        self,
        store_root: Path,
        geometry: StoreGeometry,
        *,
        writable: bool,
        record_size_bytes_max: int = BODY_SIZE_BYTES_MAX_DEFAULT,
        store_host: bytes = bytes(HOST_SIZE_BYTES),
        initial_queue_index: Callable[[str, int], int] | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ):
        assert len(store_host) == HOST_SIZE_BYTES
        assert RECORD_SIZE_BYTES_MIN <= record_size_bytes_max < 2**31
        # Test hook: an append publishes only this many records of its batch, then raises
        # WriterStoppedForTestError, as if the writer died inside the append kernel.
        self.publish_count_max_for_test = PUBLISH_ALL
        self.directory = commit_log_dir(store_root)
        self.segment_size_bytes = geometry.commit_log_segment_size_bytes
        if record_size_bytes_max + BLANK_SIZE_BYTES > self.segment_size_bytes:
            raise StoreError(
                f"maxMessageSize {record_size_bytes_max} does not fit a "
                f"{self.segment_size_bytes}-byte commit log segment"
            )
        self.writable = writable
        self.record_size_bytes_max = record_size_bytes_max
        self.store_host = bytes(store_host)
        self._store_host_array = np.frombuffer(self.store_host, dtype=np.uint8).copy()
        self._clock_ms = clock_ms
        # Every segment stays mapped while the log is open, as in RocketMQ: there are few of
        # them (one per GiB), and no eviction can then race a flush thread.
        self._segments = MappedFileQueue(
            self.directory, self.segment_size_bytes, writable=writable, reserve_disk=writable
        )
        self._views: dict[int, NDArray[np.uint8]] = {}
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self.queue_indexes = QueueIndexTable(initial_queue_index or (lambda _topic, _queue: 0))
        self._write_log_offset_bytes = 0
        self._flushed_log_offset_bytes = 0
        self._last_store_timestamp_ms = 0
        self._flushed_store_timestamp_ms = 0
        self._position_set = False
        # The segment the writer appends to: its view and start. An empty view makes the first
        # append take the slow path, which maps or creates the right segment.
        self._segment_buffer = _EMPTY_SEGMENT
        self._segment_start_bytes = 0
        self._append_batch_total = 0
        self._record_total = 0
        self._roll_total = 0
        self._flush_total = 0

    @classmethod
    def open(
        cls,
        store_root: Path,
        geometry: StoreGeometry,
        *,
        writable: bool,
        record_size_bytes_max: int = BODY_SIZE_BYTES_MAX_DEFAULT,
        store_host: bytes = bytes(HOST_SIZE_BYTES),
        initial_queue_index: Callable[[str, int], int] | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> CommitLog:
        """List the segments on disk; positions stay unset until `set_write_position()`."""
        commit_log = cls(
            store_root,
            geometry,
            writable=writable,
            record_size_bytes_max=record_size_bytes_max,
            store_host=store_host,
            initial_queue_index=initial_queue_index,
            clock_ms=clock_ms,
        )
        commit_log.load()
        return commit_log

    def load(self) -> None:
        """List the segments on disk (names, sizes, contiguity); maps nothing."""
        with self._lock:
            self._views.clear()
            self._segments.load()

    # -- positions -----------------------------------------------------------------------------

    @property
    def min_log_offset_bytes(self) -> int:
        """Start of the oldest segment (RocketMQ's min physical offset); 0 for an empty log."""
        first = self._segments.min_offset_bytes
        return 0 if first is None else first

    @property
    def write_log_offset_bytes(self) -> int:
        """Where the next record goes; every byte below it is a whole record or a blank."""
        return self._write_log_offset_bytes

    @property
    def flushed_log_offset_bytes(self) -> int:
        """Every byte below this is durable (flush.FlushService publishes it to its waiters)."""
        return self._flushed_log_offset_bytes

    @property
    def last_store_timestamp_ms(self) -> int:
        """STORETIMESTAMP of the newest appended record (0 before the first append)."""
        return self._last_store_timestamp_ms

    @property
    def flushed_store_timestamp_ms(self) -> int:
        """STORETIMESTAMP of the newest record a flush covered: the checkpoint's physic time."""
        return self._flushed_store_timestamp_ms

    @property
    def segment_starts_bytes(self) -> tuple[int, ...]:
        """Start offsets of the segments, oldest first."""
        return self._segments.segment_starts_bytes

    def set_write_position(self, log_offset_bytes: int, *, flushed: bool = True) -> None:
        """Recovery's hook: appends continue at `log_offset_bytes`.

        The position must be a record boundary: the end of the last valid record, or the start
        of the segment after a blank. With `flushed`, what lies below counts as durable (true
        after a clean stop, and after recovery has flushed what it kept).
        """
        assert self.writable
        assert log_offset_bytes >= 0
        first = self._segments.min_offset_bytes
        last_end = self._segments.end_offset_bytes
        if first is None:
            assert log_offset_bytes % self.segment_size_bytes == 0
        else:
            assert last_end is not None
            assert first <= log_offset_bytes <= last_end
        self._write_log_offset_bytes = log_offset_bytes
        self._flushed_log_offset_bytes = (
            log_offset_bytes if flushed else min(self._flushed_log_offset_bytes, log_offset_bytes)
        )
        self._segment_buffer = _EMPTY_SEGMENT
        self._position_set = True

    def note_store_timestamp(self, store_timestamp_ms: int) -> None:
        """Recovery's hook: the newest kept record's store time (for the checkpoint)."""
        assert store_timestamp_ms >= 0
        self._last_store_timestamp_ms = store_timestamp_ms
        self._flushed_store_timestamp_ms = store_timestamp_ms

    def find_clean_write_end(self, start_log_offset_bytes: int) -> int:
        """The write position a clean stop left: scan whole records from a record boundary.

        Scans segment after segment (a blank moves to the next one) until the records end.
        Raises StoreError unless they end the way a clean stop leaves them: in the last
        segment, followed by zeros. Anything else (a torn or corrupt record, data after the
        end) is recovery's to judge; this method never truncates.
        """
        starts_bytes = self._segments.segment_starts_bytes
        if not starts_bytes:
            return 0
        position_bytes = max(start_log_offset_bytes, starts_bytes[0])
        outs = _scan_outputs(4096)
        last_start_bytes = starts_bytes[-1]
        while True:
            segment_start_bytes = position_bytes - position_bytes % self.segment_size_bytes
            if segment_start_bytes > last_start_bytes:
                return position_bytes  # a blank ended the last segment; the next is not made
            buffer = self.segment_view(segment_start_bytes)
            assert buffer is not None
            count, stop_bytes, reason = scan_records(
                buffer,
                position_bytes - segment_start_bytes,
                self.segment_size_bytes,
                segment_start_bytes,
                True,
                *outs,
            )
            if count > 0:
                self._last_store_timestamp_ms = int(outs[5][count - 1])
            position_bytes = segment_start_bytes + stop_bytes
            if reason == STOP_FULL:
                continue
            if reason == STOP_BLANK:
                position_bytes = segment_start_bytes + self.segment_size_bytes
                continue
            assert reason != STOP_END  # a record never ends exactly at a segment end
            tail = buffer[stop_bytes : stop_bytes + _CLEAN_END_ZERO_CHECK_BYTES]
            if segment_start_bytes != last_start_bytes or tail.any():
                raise StoreError(
                    f"commit log is not cleanly ended at {position_bytes} (scan stop {reason}); "
                    "it needs recovery"
                )
            self._flushed_store_timestamp_ms = self._last_store_timestamp_ms
            return position_bytes

    # -- appending -----------------------------------------------------------------------------

    def queue_slot(self, topic: str, queue_id: int) -> int:
        """The writer's slot of (topic, queue_id), for `append_records`."""
        return self.queue_indexes.slot(topic, queue_id)

    def append_batch(
        self,
        records: NDArray[np.uint8],
        sizes_bytes: NDArray[np.int32],
        topic: str,
        queue_id: int,
        store_timestamp_ms: int | None = None,
    ) -> AppendResult:
        """Append a batch whose records all go to (topic, queue_id); the send path's call.

        `records` holds the encoded records back to back (encode_record with store-side fields
        zero; QUEUEID and topic must be `queue_id` and `topic`), record i being sizes_bytes[i]
        bytes. Queue indexes are consecutive from AppendResult.queue_index (transaction
        PREPARED/ROLLBACK records excepted). Raises MessageTooLargeError, before anything is
        written, if a record is over record_size_bytes_max or the batch cannot fit a segment.
        """
        table = self.queue_indexes
        slot = table.slot_of.get((topic, queue_id))
        if slot is None:
            slot = table.slot(topic, queue_id)
        queue_index = int(table.next_queue_indexes[slot])
        return self._append(
            records,
            sizes_bytes,
            _NO_SLOTS,
            slot,
            store_timestamp_ms,
            _NO_QUEUE_INDEXES,
            queue_index,
        )

    def append_records(
        self,
        records: NDArray[np.uint8],
        sizes_bytes: NDArray[np.int32],
        queue_slots: NDArray[np.int32],
        out_queue_indexes: NDArray[np.int64],
        store_timestamp_ms: int | None = None,
    ) -> AppendResult:
        """Append records bound for different queues: record i goes to slot queue_slots[i]
        (from `queue_slot()`), and its queue index is written to out_queue_indexes[i]."""
        assert queue_slots.dtype == np.int32
        assert out_queue_indexes.dtype == np.int64
        assert queue_slots.size == sizes_bytes.size
        assert out_queue_indexes.size == sizes_bytes.size
        return self._append(
            records, sizes_bytes, queue_slots, -1, store_timestamp_ms, out_queue_indexes, -1
        )

    def _append(
        self,
        records: NDArray[np.uint8],
        sizes_bytes: NDArray[np.int32],
        queue_slots: NDArray[np.int32],
        queue_slot_all: int,
        store_timestamp_ms: int | None,
        out_queue_indexes: NDArray[np.int64],
        queue_index: int,
    ) -> AppendResult:
        assert self._position_set
        assert sizes_bytes.dtype == np.int32
        record_count = sizes_bytes.size
        assert record_count > 0
        if store_timestamp_ms is None:
            store_timestamp_ms = self._clock_ms()
        table = self.queue_indexes
        segment_start_bytes = self._segment_start_bytes
        log_offset_bytes = self._write_log_offset_bytes
        end_bytes = append_batch_kernel(
            records,
            sizes_bytes,
            queue_slots,
            queue_slot_all,
            table.next_queue_indexes,
            table.queue_ids,
            table.topics,
            table.topic_sizes,
            self._segment_buffer,
            log_offset_bytes - segment_start_bytes,
            segment_start_bytes,
            store_timestamp_ms,
            self._store_host_array,
            self.record_size_bytes_max,
            out_queue_indexes,
            self.publish_count_max_for_test,
        )
        if end_bytes < 0:
            end_bytes = self._append_slow(
                end_bytes,
                records,
                sizes_bytes,
                queue_slots,
                queue_slot_all,
                store_timestamp_ms,
                out_queue_indexes,
            )
            segment_start_bytes = self._segment_start_bytes
            log_offset_bytes = self._write_log_offset_bytes
        end_log_offset_bytes = segment_start_bytes + end_bytes
        assert end_log_offset_bytes > log_offset_bytes
        if self.publish_count_max_for_test < record_count:
            raise WriterStoppedForTestError(f"published {self.publish_count_max_for_test} records")
        # Publish the position first, then the time: a flusher reads them in the other order,
        # so the time it sees never belongs to a record beyond the position it flushes.
        self._write_log_offset_bytes = end_log_offset_bytes
        self._last_store_timestamp_ms = store_timestamp_ms
        self._append_batch_total += 1
        self._record_total += record_count
        return AppendResult(
            log_offset_bytes, queue_index, record_count, end_log_offset_bytes, store_timestamp_ms
        )

    def _append_slow(
        self,
        code: int,
        records: NDArray[np.uint8],
        sizes_bytes: NDArray[np.int32],
        queue_slots: NDArray[np.int32],
        queue_slot_all: int,
        store_timestamp_ms: int,
        out_queue_indexes: NDArray[np.int64],
    ) -> int:
        """The first append into a segment, a roll, or an error; returns the end file offset."""
        if code == APPEND_TOO_LARGE:
            largest_bytes = int(sizes_bytes.max())
            raise MessageTooLargeError(
                f"record is {largest_bytes} bytes, over maxMessageSize {self.record_size_bytes_max}"
            )
        assert code == APPEND_NO_ROOM, f"append kernel refused the batch: code {code}"
        batch_size_bytes = int(sizes_bytes.sum(dtype=np.int64))
        if batch_size_bytes + BLANK_SIZE_BYTES > self.segment_size_bytes:
            raise MessageTooLargeError(
                f"batch is {batch_size_bytes} bytes, more than a commit log segment holds"
            )
        for _attempt in range(2):
            self._prepare_segment_for(batch_size_bytes)
            end_bytes = append_batch_kernel(
                records,
                sizes_bytes,
                queue_slots,
                queue_slot_all,
                self.queue_indexes.next_queue_indexes,
                self.queue_indexes.queue_ids,
                self.queue_indexes.topics,
                self.queue_indexes.topic_sizes,
                self._segment_buffer,
                self._write_log_offset_bytes - self._segment_start_bytes,
                self._segment_start_bytes,
                store_timestamp_ms,
                self._store_host_array,
                self.record_size_bytes_max,
                out_queue_indexes,
                self.publish_count_max_for_test,
            )
            if end_bytes >= 0:
                return int(end_bytes)
            assert end_bytes == APPEND_NO_ROOM
        raise AssertionError("a fresh segment refused a batch that fits a segment")

    def _prepare_segment_for(self, batch_size_bytes: int) -> None:
        """Map (or create) the segment holding the write position; roll with a blank if the
        batch does not fit the rest of it."""
        position_bytes = self._write_log_offset_bytes
        segment_start_bytes = position_bytes - position_bytes % self.segment_size_bytes
        file_offset_bytes = position_bytes - segment_start_bytes
        with self._lock:
            mapped_file = self._segments.segment_for_write(position_bytes)
            buffer = mapped_file.buffer
            self._views[segment_start_bytes] = buffer
        if file_offset_bytes + batch_size_bytes + BLANK_SIZE_BYTES > self.segment_size_bytes:
            left_bytes = self.segment_size_bytes - file_offset_bytes
            assert left_bytes >= BLANK_SIZE_BYTES  # every record leaves room for a blank
            blank = np.frombuffer(_BLANK.pack(left_bytes, BLANK_MAGIC), dtype=np.uint8)
            buffer[file_offset_bytes : file_offset_bytes + BLANK_SIZE_BYTES] = blank
            segment_start_bytes += self.segment_size_bytes
            # The blank is whole before the position moves past it (readers jump on it).
            self._write_log_offset_bytes = segment_start_bytes
            with self._lock:
                buffer = self._segments.segment_for_write(segment_start_bytes).buffer
                self._views[segment_start_bytes] = buffer
            self._roll_total += 1
        self._segment_buffer = buffer
        self._segment_start_bytes = segment_start_bytes

    # -- replication (a slave's appends) ---------------------------------------------------------

    def append_replica(self, data: NDArray[np.uint8]) -> ReplicaAppendResult:
        """Append a master's commit-log bytes at the write position, byte for byte: whole
        records, the last of them possibly the segment's end blank (then the position moves to
        the next segment's start). The records keep the master's QUEUEOFFSET, PHYSICALOFFSET and
        store fields; the queue-index table is not touched (a slave takes no local appends).

        Raises StoreError, leaving the position where it was and the bytes past it zeroed, if
        the data is not that: a torn or invalid record, a PHYSICALOFFSET that is not its offset,
        a record that leaves no room for a blank, or bytes past a blank.
        """
        assert self._position_set
        assert data.dtype == np.uint8
        size_bytes = int(data.size)
        assert size_bytes > 0
        position_bytes = self._write_log_offset_bytes
        segment_start_bytes = position_bytes - position_bytes % self.segment_size_bytes
        file_offset_bytes = position_bytes - segment_start_bytes
        end_file_offset_bytes = file_offset_bytes + size_bytes
        if end_file_offset_bytes > self.segment_size_bytes:
            raise StoreError(
                f"replica of {size_bytes} bytes at {position_bytes} crosses the segment end"
            )
        if self._segment_start_bytes != segment_start_bytes or not self._segment_buffer.size:
            with self._lock:
                buffer = self._segments.segment_for_write(position_bytes).buffer
                self._views[segment_start_bytes] = buffer
            self._segment_buffer = buffer
            self._segment_start_bytes = segment_start_bytes
        buffer = self._segment_buffer
        buffer[file_offset_bytes:end_file_offset_bytes] = data
        try:
            record_count, last_time_ms, rolled = self._check_replica(
                buffer, file_offset_bytes, end_file_offset_bytes, segment_start_bytes
            )
        except StoreError:
            buffer[file_offset_bytes:end_file_offset_bytes] = 0
            raise
        end_bytes = (
            segment_start_bytes + self.segment_size_bytes
            if rolled
            else segment_start_bytes + end_file_offset_bytes
        )
        # The position moves after the bytes are whole (the invariant of _append).
        self._write_log_offset_bytes = end_bytes
        if record_count:
            self._last_store_timestamp_ms = last_time_ms
        self._record_total += record_count
        self._roll_total += int(rolled)
        return ReplicaAppendResult(position_bytes, end_bytes, record_count)

    def _check_replica(
        self,
        buffer: NDArray[np.uint8],
        start_bytes: int,
        end_bytes: int,
        segment_start_bytes: int,
    ) -> tuple[int, int, bool]:
        """(records, the last one's store time, whether a blank ended the segment) of the
        replica bytes in buffer[start_bytes:end_bytes]; StoreError if they are not whole
        records of this log (append_replica)."""
        outs = _scan_outputs(1024)
        position_bytes = start_bytes
        record_total = 0
        last_time_ms = 0
        while True:
            count, stop_bytes, reason = scan_records(
                buffer, position_bytes, end_bytes, segment_start_bytes, False, *outs
            )
            if count:
                record_total += count
                last_time_ms = int(outs[5][count - 1])
                last_end_bytes = int(outs[0][count - 1]) + int(outs[1][count - 1])
                if (
                    segment_start_bytes + self.segment_size_bytes - last_end_bytes
                    < BLANK_SIZE_BYTES
                ):
                    raise StoreError(f"replica record ending at {last_end_bytes} leaves no blank")
            position_bytes = int(stop_bytes)
            if reason == STOP_FULL:
                continue
            if reason == STOP_END:
                return record_total, last_time_ms, False
            if reason == STOP_BLANK and end_bytes - position_bytes == BLANK_SIZE_BYTES:
                left_bytes, _magic = _BLANK.unpack_from(buffer.data, position_bytes)
                if left_bytes == self.segment_size_bytes - position_bytes:
                    return record_total, last_time_ms, True
            raise StoreError(
                f"replica bytes are not whole records at {segment_start_bytes + position_bytes} "
                f"(scan stop {reason})"
            )

    def replica_bytes_equal(self, log_offset_bytes: int, data: bytes | memoryview) -> bool:
        """Whether this log holds `data` at `log_offset_bytes` (below the write position, in one
        segment): how a slave checks bytes it already has against its master's."""
        size_bytes = len(data)
        end_bytes = log_offset_bytes + size_bytes
        assert self.min_log_offset_bytes <= log_offset_bytes
        assert end_bytes <= self._write_log_offset_bytes
        segment_start_bytes = log_offset_bytes - log_offset_bytes % self.segment_size_bytes
        assert end_bytes <= segment_start_bytes + self.segment_size_bytes
        buffer = self.segment_view(segment_start_bytes)
        if buffer is None:
            return False
        at = log_offset_bytes - segment_start_bytes
        return bool(buffer[at : at + size_bytes].tobytes() == bytes(data))

    # -- reading -------------------------------------------------------------------------------

    def segment_view(self, segment_start_bytes: int) -> NDArray[np.uint8] | None:
        """The whole segment starting at `segment_start_bytes` as a uint8 view, or None if
        there is no such segment (never made, or deleted by retention)."""
        buffer = self._views.get(segment_start_bytes)
        if buffer is not None:
            return buffer
        with self._lock:
            mapped_file = self._segments.find_segment(segment_start_bytes)
            if mapped_file is None:
                return None
            buffer = mapped_file.buffer
            self._views[segment_start_bytes] = buffer
        return buffer

    def segment_view_if_mapped(self, segment_start_bytes: int) -> NDArray[np.uint8] | None:
        """The segment's view if this object already mapped it; never maps (any thread)."""
        return self._views.get(segment_start_bytes)

    def read_record(self, log_offset_bytes: int, end_log_offset_bytes: int) -> bytes | None:
        """A copy of the record at `log_offset_bytes`, or None if no whole record of this log
        starts there below `end_log_offset_bytes` (the readable end the caller knows).

        The offset may come from outside (a msgId), so every fact is checked: inside the log,
        message magic, size within the segment and below the end, PHYSICALOFFSET equal.
        """
        if log_offset_bytes < self.min_log_offset_bytes or log_offset_bytes < 0:
            return None
        if log_offset_bytes + RECORD_SIZE_BYTES_MIN > end_log_offset_bytes:
            return None
        segment_start_bytes = log_offset_bytes - log_offset_bytes % self.segment_size_bytes
        buffer = self.segment_view(segment_start_bytes)
        if buffer is None:
            return None
        at = log_offset_bytes - segment_start_bytes
        if at + RECORD_SIZE_BYTES_MIN > buffer.size:
            return None
        size_bytes, magic = _SIZE_AND_MAGIC.unpack_from(buffer.data, at)
        if magic != MESSAGE_MAGIC or size_bytes < RECORD_SIZE_BYTES_MIN:
            return None
        if at + size_bytes > buffer.size or log_offset_bytes + size_bytes > end_log_offset_bytes:
            return None
        (physical_offset_bytes,) = _INT64_BE.unpack_from(
            buffer.data, at + PHYSICALOFFSET_POSITION_BYTES
        )
        if physical_offset_bytes != log_offset_bytes:
            return None
        return buffer[at : at + size_bytes].tobytes()

    def count_records(self, start_log_offset_bytes: int, end_log_offset_bytes: int) -> int | None:
        """How many records lie in [start, end): scan_records' walk (no CRC check), segment
        after segment, a blank moving it to the next. Both ends must be record boundaries below
        the readable end the caller knows (a segment's start after a blank is one). None if a
        segment of the span is gone (retention) or the walk does not end exactly at `end`."""
        assert 0 <= start_log_offset_bytes <= end_log_offset_bytes
        outs = _scan_outputs(COUNT_SCAN_CAPACITY)
        position_bytes = start_log_offset_bytes
        record_total = 0
        while position_bytes < end_log_offset_bytes:
            segment_start_bytes = position_bytes - position_bytes % self.segment_size_bytes
            buffer = self.segment_view(segment_start_bytes)
            if buffer is None:
                return None
            count, stop_bytes, reason = scan_records(
                buffer,
                position_bytes - segment_start_bytes,
                min(end_log_offset_bytes - segment_start_bytes, self.segment_size_bytes),
                segment_start_bytes,
                False,
                *outs,
            )
            record_total += count
            position_bytes = segment_start_bytes + stop_bytes
            if reason == STOP_BLANK:
                position_bytes = segment_start_bytes + self.segment_size_bytes
            elif reason not in (STOP_FULL, STOP_END):
                return None
        return record_total if position_bytes == end_log_offset_bytes else None

    def store_timestamp_at(self, log_offset_bytes: int) -> int | None:
        """STORETIMESTAMP of the record a consume-queue entry points at; None if it is gone."""
        segment_start_bytes = log_offset_bytes - log_offset_bytes % self.segment_size_bytes
        buffer = self.segment_view(segment_start_bytes)
        if buffer is None:
            return None
        at = log_offset_bytes - segment_start_bytes + STORETIMESTAMP_POSITION_BYTES
        value: int = _INT64_BE.unpack_from(buffer.data, at)[0]
        return value

    # -- durability ----------------------------------------------------------------------------

    def flush(self) -> int:
        """Make [flushed, written) durable (msync, then new directory entries); return the new
        flushed position. Safe to call from a flush thread while the writer appends."""
        assert self.writable
        with self._flush_lock:  # one flush at a time (a timer and a group commit may race)
            return self._flush_locked()

    def _flush_locked(self) -> int:
        with self._lock:
            # Time first, position second: see _append.
            store_timestamp_ms = self._last_store_timestamp_ms
            end_bytes = self._write_log_offset_bytes
            start_bytes = self._flushed_log_offset_bytes
            if end_bytes > start_bytes:
                views = [
                    (segment_start_bytes, self._views.get(segment_start_bytes))
                    for segment_start_bytes in range(
                        start_bytes - start_bytes % self.segment_size_bytes,
                        end_bytes,
                        self.segment_size_bytes,
                    )
                ]
        if end_bytes <= start_bytes:
            return start_bytes
        for segment_start_bytes, buffer in views:
            if buffer is None:
                # A segment the writer rolled past before this process mapped it (recovery
                # left positions inside it); map it now.
                buffer = self.segment_view(segment_start_bytes)
                assert buffer is not None
            msync_range(
                buffer,
                max(start_bytes - segment_start_bytes, 0),
                min(end_bytes - segment_start_bytes, self.segment_size_bytes),
                self.directory,
            )
        with self._lock:
            self._segments.sync_directories()
            assert end_bytes >= self._flushed_log_offset_bytes
            self._flushed_log_offset_bytes = end_bytes
            self._flushed_store_timestamp_ms = max(
                self._flushed_store_timestamp_ms, store_timestamp_ms
            )
            self._flush_total += 1
        return end_bytes

    @property
    def deletable_end_log_offset_bytes(self) -> int:
        """Retention may delete the segments that end at or before this: the start of the
        segment holding the flushed position (so never unflushed bytes, never the segment
        being written)."""
        flushed_bytes = self._flushed_log_offset_bytes
        return flushed_bytes - flushed_bytes % self.segment_size_bytes

    def delete_segments_below(self, log_offset_bytes: int) -> int:
        """Retention's hook: delete every segment that ends at or before `log_offset_bytes`,
        but never one holding unflushed bytes (so never the one being written); return how
        many went. Readers in this process must refresh their minimum offset
        (MessageStoreReader.refresh_commit_log_bounds) before reading again; readers elsewhere
        notice it themselves (MessageStoreReader, follow_retention).

        Safe to call from a thread other than the appender's: the segments leave the list and
        the views under the lock, and are unlinked after it, so a roll or a flush never waits
        for a large unlink."""
        assert self.writable
        limit_bytes = min(log_offset_bytes, self.deletable_end_log_offset_bytes)
        with self._lock:
            paths = self._segments.detach_segments_below(limit_bytes)
            first = self._segments.min_offset_bytes
            for segment_start_bytes in list(self._views):
                if first is None or segment_start_bytes < first:
                    del self._views[segment_start_bytes]
        self._segments.unlink_detached(paths)
        return len(paths)

    def follow_retention(self, min_log_offset_bytes: int = 0) -> bool:
        """Read-only logs (another process's view): notice the segments retention deleted and
        drop this view's maps of them, so their blocks are freed. Cheap when nothing moved: one
        stat of the oldest known segment. `min_log_offset_bytes` is a minimum the owner
        published (it may lead the files on disk by the segment about to go). True if this
        view's minimum moved."""
        assert not self.writable
        first_bytes = self._segments.min_offset_bytes
        if (
            first_bytes is not None
            and min_log_offset_bytes <= first_bytes
            and self._segments.segment_path(first_bytes).exists()
        ):
            return False
        with self._lock:
            self._segments.load()
            first_after_bytes = max(self._segments.min_offset_bytes or 0, min_log_offset_bytes)
            for segment_start_bytes in list(self._views):
                if segment_start_bytes + self.segment_size_bytes <= first_after_bytes:
                    del self._views[segment_start_bytes]
        return first_after_bytes > (first_bytes or 0)

    def statistics(self) -> CommitLogStatistics:
        """Counters since the log was opened."""
        return CommitLogStatistics(
            append_batch_total=self._append_batch_total,
            record_total=self._record_total,
            roll_total=self._roll_total,
            flush_total=self._flush_total,
            write_log_offset_bytes=self._write_log_offset_bytes,
            flushed_log_offset_bytes=self._flushed_log_offset_bytes,
        )

    def close(self) -> None:
        """Release the maps (views handed out keep theirs alive until dropped)."""
        with self._lock:
            self._views.clear()
            self._segment_buffer = _EMPTY_SEGMENT
            self._segments.close()

    def warm_up_kernels(self) -> None:
        """Compile (or load) the append kernel on a scratch buffer, before a role reports ready."""
        warm_up_append_kernel()


def warm_up_append_kernel() -> None:
    """Run append_batch_kernel once on tiny private arrays (both slot forms)."""
    record = np.frombuffer(encode_record(MessageToStore("T", 0, b"x")), dtype=np.uint8).copy()
    sizes_bytes = np.array([record.size], dtype=np.int32)
    segment = np.zeros(record.size * 4, dtype=np.uint8)
    next_queue_indexes = np.zeros(1, dtype=np.int64)
    queue_ids = np.zeros(1, dtype=np.int32)
    topics = np.zeros((1, TOPIC_TABLE_WIDTH_BYTES), dtype=np.uint8)
    topics[0, 0] = ord("T")
    topic_sizes = np.ones(1, dtype=np.int32)
    host = np.zeros(HOST_SIZE_BYTES, dtype=np.uint8)
    for slots, slot_all, out in (
        (_NO_SLOTS, 0, _NO_QUEUE_INDEXES),
        (np.zeros(1, dtype=np.int32), -1, np.zeros(1, dtype=np.int64)),
    ):
        end_bytes = append_batch_kernel(
            record,
            sizes_bytes,
            slots,
            slot_all,
            next_queue_indexes,
            queue_ids,
            topics,
            topic_sizes,
            segment,
            0,
            0,
            1,
            host,
            record.size,
            out,
            PUBLISH_ALL,
        )
        assert end_bytes == record.size
