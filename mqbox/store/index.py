"""The key index: RocketMQ's IndexFile (hash slots chaining entries) and the service over index/.

Owns: the files under index/ (layout drawn in layout.py), putting (key hash, log offset, store
time) entries in batches through a numba kernel, querying a key hash over a time range, rolling
to a new file when one is full, and deleting files by log offset (retention) or by time (recovery).
Written only by the dispatcher; the admin's QUERY_MESSAGE path reads.

Never: hash keys (the caller passes abs(String.hashCode(topic + "#" + key)), as RocketMQ does),
read the commit log, or confirm a match. A query returns candidates: two keys may share a hash,
and times are stored in whole seconds, so the caller checks each record's keys and store
timestamp before answering.

Invariants:
- index_count starts at 1 and only grows; entry 0 is never written; a slot holds 0 or the
  number of an entry below index_count; each entry's prev_index is below its own number, so
  every chain ends within index_count steps, even in a damaged file.
- A file's begin_* fields are its first entry's, end_* its newest entry's; files are named by
  creation time (UTC, strictly increasing) and their entries' log offsets increase with the
  names, so retention deletes a prefix of the files.
- `put_index_batch` (the kernel) and `index_ref.put_index_batch_ref` (the twin) leave the same
  bytes for the same input, and the two query functions return the same offsets; a hypothesis
  test holds them to it.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from mqbox._jit import kernel
from mqbox.clock import wall_clock_ms
from mqbox.errors import StoreError
from mqbox.message_kernels import read_s32_be, read_s64_be, write_i32_be, write_i64_be
from mqbox.store.layout import (
    INDEX_COUNT_INITIAL,
    INDEX_ENTRY_KEY_HASH_POSITION_BYTES,
    INDEX_ENTRY_LOG_OFFSET_POSITION_BYTES,
    INDEX_ENTRY_PREV_INDEX_POSITION_BYTES,
    INDEX_ENTRY_SIZE_BYTES,
    INDEX_ENTRY_TIME_DIFF_POSITION_BYTES,
    INDEX_HEADER_BEGIN_LOG_OFFSET_POSITION_BYTES,
    INDEX_HEADER_BEGIN_TIMESTAMP_POSITION_BYTES,
    INDEX_HEADER_END_LOG_OFFSET_POSITION_BYTES,
    INDEX_HEADER_END_TIMESTAMP_POSITION_BYTES,
    INDEX_HEADER_INDEX_COUNT_POSITION_BYTES,
    INDEX_HEADER_SIZE_BYTES,
    INDEX_HEADER_SLOTS_USED_POSITION_BYTES,
    INDEX_SLOT_EMPTY,
    INDEX_SLOT_SIZE_BYTES,
    INT32_MAX,
    StoreGeometry,
    index_dir,
    index_file_name,
    parse_index_file_name,
)
from mqbox.store.mapped_file import MappedFile, ensure_directory, fsync_directory

# Field positions, renamed short so the kernels read in one line each.
HEADER_BEGIN_TIMESTAMP_AT = INDEX_HEADER_BEGIN_TIMESTAMP_POSITION_BYTES
HEADER_END_TIMESTAMP_AT = INDEX_HEADER_END_TIMESTAMP_POSITION_BYTES
HEADER_BEGIN_LOG_OFFSET_AT = INDEX_HEADER_BEGIN_LOG_OFFSET_POSITION_BYTES
HEADER_END_LOG_OFFSET_AT = INDEX_HEADER_END_LOG_OFFSET_POSITION_BYTES
HEADER_SLOTS_USED_AT = INDEX_HEADER_SLOTS_USED_POSITION_BYTES
HEADER_INDEX_COUNT_AT = INDEX_HEADER_INDEX_COUNT_POSITION_BYTES
ENTRY_KEY_HASH_AT = INDEX_ENTRY_KEY_HASH_POSITION_BYTES
ENTRY_LOG_OFFSET_AT = INDEX_ENTRY_LOG_OFFSET_POSITION_BYTES
ENTRY_TIME_DIFF_AT = INDEX_ENTRY_TIME_DIFF_POSITION_BYTES
ENTRY_PREV_INDEX_AT = INDEX_ENTRY_PREV_INDEX_POSITION_BYTES

_INT32_BE = struct.Struct(">i")
_INT64_BE = struct.Struct(">q")

# ---------------------------------------------------------------------------------------------
# Kernels: big-endian fields in the file's uint8 view
# ---------------------------------------------------------------------------------------------


@kernel
def put_index_batch(
    file_bytes: NDArray[np.uint8],
    slot_count: int,
    entry_count_max: int,
    key_hashes: NDArray[np.int64],
    log_offsets_bytes: NDArray[np.int64],
    store_timestamps_ms: NDArray[np.int64],
) -> int:
    """Put keys 0, 1, ... of the arrays into the index file until it is full; return how many.

    `file_bytes` is the whole file. Each key gets entry number index_count: key_hash, log
    offset, whole seconds since the file's begin timestamp (clamped to [0, 2^31)), and the
    slot's previous entry (0 if the slot was empty or held a number not below index_count);
    the slot then points at it. The first entry of a file sets begin_*; the header's end_*,
    slots_used and index_count are written once, after the last key put. A key whose hash is
    outside [0, 2^31) or whose log offset or timestamp is negative writes nothing: the
    kernel returns -1 - its position (checked here, not with numpy in Python, so a single key
    costs one call: issue 15).
    """
    entries_position_bytes = INDEX_HEADER_SIZE_BYTES + slot_count * INDEX_SLOT_SIZE_BYTES
    index_count = read_s32_be(file_bytes, HEADER_INDEX_COUNT_AT)
    if index_count < INDEX_COUNT_INITIAL:
        index_count = INDEX_COUNT_INITIAL
    slots_used = read_s32_be(file_bytes, HEADER_SLOTS_USED_AT)
    begin_timestamp_ms = read_s64_be(file_bytes, HEADER_BEGIN_TIMESTAMP_AT)
    end_timestamp_ms = read_s64_be(file_bytes, HEADER_END_TIMESTAMP_AT)
    end_log_offset_bytes = read_s64_be(file_bytes, HEADER_END_LOG_OFFSET_AT)
    # The inputs' ranges first, so a bad key leaves the file as it was (a caller's bug).
    for position in range(key_hashes.shape[0]):
        if (
            key_hashes[position] < 0
            or key_hashes[position] > INT32_MAX
            or log_offsets_bytes[position] < 0
            or store_timestamps_ms[position] < 0
        ):
            return -1 - position
    put_count = 0
    for position in range(key_hashes.shape[0]):
        if index_count >= entry_count_max:
            break
        key_hash = key_hashes[position]
        log_offset_bytes = log_offsets_bytes[position]
        store_timestamp_ms = store_timestamps_ms[position]
        slot_position_bytes = INDEX_HEADER_SIZE_BYTES + (key_hash % slot_count) * (
            INDEX_SLOT_SIZE_BYTES
        )
        previous_index = read_s32_be(file_bytes, slot_position_bytes)
        if previous_index <= INDEX_SLOT_EMPTY or previous_index >= index_count:
            previous_index = INDEX_SLOT_EMPTY
        time_diff_s = 0
        if begin_timestamp_ms > 0:
            time_diff_s = (store_timestamp_ms - begin_timestamp_ms) // 1000
            if time_diff_s < 0:
                time_diff_s = 0
            elif time_diff_s > INT32_MAX:
                time_diff_s = INT32_MAX
        entry_position_bytes = entries_position_bytes + index_count * INDEX_ENTRY_SIZE_BYTES
        write_i32_be(file_bytes, entry_position_bytes + ENTRY_KEY_HASH_AT, key_hash)
        write_i64_be(file_bytes, entry_position_bytes + ENTRY_LOG_OFFSET_AT, log_offset_bytes)
        write_i32_be(file_bytes, entry_position_bytes + ENTRY_TIME_DIFF_AT, time_diff_s)
        write_i32_be(file_bytes, entry_position_bytes + ENTRY_PREV_INDEX_AT, previous_index)
        # The entry is written before the slot points at it, so a reader following the slot
        # finds a whole entry (on x86, where stores are seen in program order).
        write_i32_be(file_bytes, slot_position_bytes, index_count)
        if index_count == INDEX_COUNT_INITIAL:
            begin_timestamp_ms = store_timestamp_ms
            write_i64_be(file_bytes, HEADER_BEGIN_TIMESTAMP_AT, store_timestamp_ms)
            write_i64_be(file_bytes, HEADER_BEGIN_LOG_OFFSET_AT, log_offset_bytes)
        if previous_index == INDEX_SLOT_EMPTY:
            slots_used += 1
        index_count += 1
        end_timestamp_ms = store_timestamp_ms
        end_log_offset_bytes = log_offset_bytes
        put_count += 1
    if put_count > 0:
        write_i64_be(file_bytes, HEADER_END_TIMESTAMP_AT, end_timestamp_ms)
        write_i64_be(file_bytes, HEADER_END_LOG_OFFSET_AT, end_log_offset_bytes)
        write_i32_be(file_bytes, HEADER_SLOTS_USED_AT, slots_used)
        write_i32_be(file_bytes, HEADER_INDEX_COUNT_AT, index_count)
    return put_count


@kernel
def query_index(
    file_bytes: NDArray[np.uint8],
    slot_count: int,
    key_hash: int,
    begin_ms: int,
    end_ms: int,
    out_log_offsets_bytes: NDArray[np.int64],
) -> int:
    """Fill `out_log_offsets_bytes` with candidate offsets for `key_hash`, newest first.

    Follows the chain of the key's slot. An entry is a candidate when its key hash is equal
    and its second [t, t + 999] ms overlaps [begin_ms, end_ms]. Stops at the end of the
    chain, when the output is full, at an entry whose second ends before begin_ms (older
    entries are older still), or at a malformed link. Returns how many offsets were written.
    """
    index_count = read_s32_be(file_bytes, HEADER_INDEX_COUNT_AT)
    begin_timestamp_ms = read_s64_be(file_bytes, HEADER_BEGIN_TIMESTAMP_AT)
    entries_position_bytes = INDEX_HEADER_SIZE_BYTES + slot_count * INDEX_SLOT_SIZE_BYTES
    slot_position_bytes = INDEX_HEADER_SIZE_BYTES + (key_hash % slot_count) * INDEX_SLOT_SIZE_BYTES
    current_index = read_s32_be(file_bytes, slot_position_bytes)
    if current_index <= INDEX_SLOT_EMPTY or current_index >= index_count:
        return 0
    found_count = 0
    capacity = out_log_offsets_bytes.shape[0]
    while found_count < capacity:
        entry_position_bytes = entries_position_bytes + current_index * INDEX_ENTRY_SIZE_BYTES
        entry_key_hash = read_s32_be(file_bytes, entry_position_bytes + ENTRY_KEY_HASH_AT)
        log_offset_bytes = read_s64_be(file_bytes, entry_position_bytes + ENTRY_LOG_OFFSET_AT)
        time_diff_s = read_s32_be(file_bytes, entry_position_bytes + ENTRY_TIME_DIFF_AT)
        previous_index = read_s32_be(file_bytes, entry_position_bytes + ENTRY_PREV_INDEX_AT)
        if time_diff_s < 0:
            break
        entry_first_ms = begin_timestamp_ms + time_diff_s * 1000
        entry_last_ms = entry_first_ms + 999
        if entry_key_hash == key_hash and entry_first_ms <= end_ms and entry_last_ms >= begin_ms:
            out_log_offsets_bytes[found_count] = log_offset_bytes
            found_count += 1
        if entry_last_ms < begin_ms:
            break
        if previous_index <= INDEX_SLOT_EMPTY or previous_index >= current_index:
            break
        current_index = previous_index
    return found_count


def warm_up_kernels() -> None:
    """Compile the index kernels (or load them from numba's cache) on a tiny file.

    A role calls this before it reports ready, so the first real put or query does not pay for
    compilation. Both the read-write and the read-only buffer types are compiled.
    """
    slot_count = 2
    entry_count_max = 3
    file_bytes = np.zeros(
        INDEX_HEADER_SIZE_BYTES
        + slot_count * INDEX_SLOT_SIZE_BYTES
        + entry_count_max * INDEX_ENTRY_SIZE_BYTES,
        dtype=np.uint8,
    )
    one = np.ones(1, dtype=np.int64)
    assert put_index_batch(file_bytes, slot_count, entry_count_max, one, one, one) == 1
    out_log_offsets_bytes = np.zeros(1, dtype=np.int64)
    assert query_index(file_bytes, slot_count, 1, 0, 2, out_log_offsets_bytes) == 1
    file_bytes.flags.writeable = False
    assert query_index(file_bytes, slot_count, 1, 0, 2, out_log_offsets_bytes) == 1


# ---------------------------------------------------------------------------------------------
# One index file
# ---------------------------------------------------------------------------------------------


def _index_header_initial() -> bytes:
    """The header of an empty index file: all zero but index_count, which starts at 1."""
    header = bytearray(INDEX_HEADER_SIZE_BYTES)
    _INT32_BE.pack_into(header, INDEX_HEADER_INDEX_COUNT_POSITION_BYTES, INDEX_COUNT_INITIAL)
    return bytes(header)


def _check_put_batch(
    key_hashes: NDArray[np.int64],
    log_offsets_bytes: NDArray[np.int64],
    store_timestamps_ms: NDArray[np.int64],
) -> None:
    """The arrays' types and lengths; the values' ranges are the kernel's check."""
    assert key_hashes.dtype == np.int64
    assert log_offsets_bytes.dtype == np.int64
    assert store_timestamps_ms.dtype == np.int64
    assert len(log_offsets_bytes) == len(key_hashes)
    assert len(store_timestamps_ms) == len(key_hashes)


class IndexFile:
    """One index file, mapped; RocketMQ's IndexFile. Writable only while it is the newest."""

    def __init__(self, mapped_file: MappedFile, geometry: StoreGeometry):
        """Wrap a mapped index file; `create()` and `open()` are the usual constructors."""
        assert mapped_file.file_size_bytes == geometry.index_file_size_bytes
        self.geometry = geometry
        self.path = mapped_file.path
        created_ms = parse_index_file_name(mapped_file.path.name)
        assert created_ms is not None
        self.created_ms = created_ms
        self._mapped_file = mapped_file
        # Slots and entries are hit at random; read-ahead would only waste the page cache.
        mapped_file.madvise_random()

    @classmethod
    def create(cls, path: Path, geometry: StoreGeometry) -> IndexFile:
        """Create an empty index file at `path` (sparse; index_count 1)."""
        mapped_file = MappedFile.create(path, geometry.index_file_size_bytes)
        mapped_file.buffer[:INDEX_HEADER_SIZE_BYTES] = np.frombuffer(
            _index_header_initial(), dtype=np.uint8
        )
        return cls(mapped_file, geometry)

    @classmethod
    def open(cls, path: Path, geometry: StoreGeometry, *, writable: bool) -> IndexFile:
        """Map an existing index file; StoreError if its size or header does not fit."""
        try:
            mapped_file = MappedFile.open(path, geometry.index_file_size_bytes, writable=writable)
        except FileNotFoundError as error:
            raise StoreError(f"index file vanished: {path}") from error
        index_file = cls(mapped_file, geometry)
        if not 0 <= index_file.index_count <= geometry.index_entry_count_max:
            mapped_file.close()
            raise StoreError(f"{path}: index_count {index_file.index_count} out of range")
        return index_file

    @property
    def writable(self) -> bool:
        """True when the map is read-write."""
        return self._mapped_file.writable

    def _header_i64(self, position_bytes: int) -> int:
        value: int = _INT64_BE.unpack_from(self._mapped_file.buffer.data, position_bytes)[0]
        return value

    def _header_i32(self, position_bytes: int) -> int:
        value: int = _INT32_BE.unpack_from(self._mapped_file.buffer.data, position_bytes)[0]
        return value

    @property
    def begin_timestamp_ms(self) -> int:
        """Store timestamp of the first entry (0 while empty)."""
        return self._header_i64(INDEX_HEADER_BEGIN_TIMESTAMP_POSITION_BYTES)

    @property
    def end_timestamp_ms(self) -> int:
        """Store timestamp of the newest entry (0 while empty)."""
        return self._header_i64(INDEX_HEADER_END_TIMESTAMP_POSITION_BYTES)

    @property
    def begin_log_offset_bytes(self) -> int:
        """Log offset of the first entry (0 while empty)."""
        return self._header_i64(INDEX_HEADER_BEGIN_LOG_OFFSET_POSITION_BYTES)

    @property
    def end_log_offset_bytes(self) -> int:
        """Log offset of the newest entry (0 while empty)."""
        return self._header_i64(INDEX_HEADER_END_LOG_OFFSET_POSITION_BYTES)

    @property
    def slots_used(self) -> int:
        """How many slots are non-empty (RocketMQ's hashSlotCount)."""
        return self._header_i32(INDEX_HEADER_SLOTS_USED_POSITION_BYTES)

    @property
    def index_count(self) -> int:
        """Number of the next entry (1 when empty); a file written by RocketMQ may hold 0."""
        return self._header_i32(INDEX_HEADER_INDEX_COUNT_POSITION_BYTES)

    @property
    def entry_count(self) -> int:
        """How many entries the file holds."""
        return max(self.index_count - INDEX_COUNT_INITIAL, 0)

    @property
    def is_full(self) -> bool:
        """True when no further entry fits."""
        return self.index_count >= self.geometry.index_entry_count_max

    def is_time_matched(self, begin_ms: int, end_ms: int) -> bool:
        """True when the file's entries may fall in [begin_ms, end_ms]."""
        if self.entry_count == 0:
            return False
        return self.begin_timestamp_ms <= end_ms and self.end_timestamp_ms + 999 >= begin_ms

    def put_batch(
        self,
        key_hashes: NDArray[np.int64],
        log_offsets_bytes: NDArray[np.int64],
        store_timestamps_ms: NDArray[np.int64],
    ) -> int:
        """Put as many keys as fit, in order; return how many were put (the rest need a roll)."""
        assert self.writable
        _check_put_batch(key_hashes, log_offsets_bytes, store_timestamps_ms)
        index_count_before = max(self.index_count, INDEX_COUNT_INITIAL)
        put_count = put_index_batch(
            self._mapped_file.buffer,
            self.geometry.index_slot_count,
            self.geometry.index_entry_count_max,
            key_hashes,
            log_offsets_bytes,
            store_timestamps_ms,
        )
        assert put_count >= 0, f"index key {-1 - put_count} of the batch is out of range"
        assert put_count <= len(key_hashes)
        if put_count > 0:
            assert self.index_count == index_count_before + put_count
        assert put_count == len(key_hashes) or self.is_full
        return put_count

    def put(self, key_hash: int, log_offset_bytes: int, store_timestamp_ms: int) -> bool:
        """Put one key; False if the file is full."""
        put_count = self.put_batch(
            np.array([key_hash], dtype=np.int64),
            np.array([log_offset_bytes], dtype=np.int64),
            np.array([store_timestamp_ms], dtype=np.int64),
        )
        return put_count == 1

    def query(self, key_hash: int, begin_ms: int, end_ms: int, count_max: int) -> list[int]:
        """Candidate log offsets for `key_hash` in [begin_ms, end_ms], newest first."""
        assert 0 <= key_hash <= INT32_MAX
        assert count_max >= 0
        if count_max == 0 or self.entry_count == 0:
            return []
        out_log_offsets_bytes = np.empty(count_max, dtype=np.int64)
        found_count = query_index(
            self._mapped_file.buffer,
            self.geometry.index_slot_count,
            key_hash,
            begin_ms,
            end_ms,
            out_log_offsets_bytes,
        )
        assert 0 <= found_count <= count_max
        return [int(offset) for offset in out_log_offsets_bytes[:found_count]]

    def flush(self) -> None:
        """Make the whole file durable (slots are written at random, so all of it)."""
        self._mapped_file.flush()

    def close(self) -> None:
        """Release the map."""
        self._mapped_file.close()

    def unlink(self) -> None:
        """Close and delete the file (the caller fsyncs the directory)."""
        self._mapped_file.unlink()


# ---------------------------------------------------------------------------------------------
# The index directory
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class IndexServiceStatistics:
    """Counters of an IndexService."""

    file_count: int
    put_total: int
    roll_total: int
    query_total: int


class IndexService:
    """The index files of one store, oldest first; RocketMQ's IndexService.

    Every file stays mapped (there are few: one per 20,000,000 keys), older ones read-only.
    Only the newest file takes puts; a full one is flushed and a new one created (a roll).
    """

    def __init__(
        self,
        store_root: Path,
        geometry: StoreGeometry,
        *,
        writable: bool,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ):
        """Prepare the service; `load()` opens the files."""
        self.directory = index_dir(store_root)
        self.geometry = geometry
        self.writable = writable
        self._clock_ms = clock_ms
        self._files: list[IndexFile] = []
        self._dirty: dict[Path, IndexFile] = {}
        self._put_total = 0
        self._roll_total = 0
        self._query_total = 0

    def load(self) -> None:
        """Open every index file in index/, oldest first; the newest one writable."""
        self.close()
        names: list[str] = []
        if self.directory.is_dir():
            names = sorted(
                path.name
                for path in self.directory.iterdir()
                if parse_index_file_name(path.name) is not None and path.is_file()
            )
        for position, name in enumerate(names):
            is_newest = position == len(names) - 1
            path = self.directory / name
            try:
                index_file = IndexFile.open(
                    path, self.geometry, writable=self.writable and is_newest
                )
            except StoreError:
                if self.writable or path.exists():
                    raise
                continue  # a reader raced retention, which deletes the oldest files
            self._files.append(index_file)

    @property
    def files(self) -> list[IndexFile]:
        """The open index files, oldest first."""
        return list(self._files)

    @property
    def end_log_offset_bytes(self) -> int:
        """Log offset of the newest entry indexed (0 if none): re-dispatch skips up to here."""
        for index_file in reversed(self._files):
            if index_file.entry_count > 0:
                return index_file.end_log_offset_bytes
        return 0

    def put_batch(
        self,
        key_hashes: NDArray[np.int64],
        log_offsets_bytes: NDArray[np.int64],
        store_timestamps_ms: NDArray[np.int64],
    ) -> None:
        """Index every key of the batch, rolling to new files as they fill (each file's
        put_batch checks the keys)."""
        assert self.writable
        key_count = len(key_hashes)
        put_count = 0
        while put_count < key_count:
            index_file = self._newest_writable()
            put_count += index_file.put_batch(
                key_hashes[put_count:],
                log_offsets_bytes[put_count:],
                store_timestamps_ms[put_count:],
            )
            self._dirty[index_file.path] = index_file
        assert put_count == key_count
        self._put_total += key_count

    def put(self, key_hash: int, log_offset_bytes: int, store_timestamp_ms: int) -> None:
        """Index one key."""
        self.put_batch(
            np.array([key_hash], dtype=np.int64),
            np.array([log_offset_bytes], dtype=np.int64),
            np.array([store_timestamp_ms], dtype=np.int64),
        )

    def query(self, key_hash: int, begin_ms: int, end_ms: int, count_max: int) -> list[int]:
        """Candidate log offsets for `key_hash` in [begin_ms, end_ms], newest first, at most
        `count_max`, across files. The caller confirms each candidate against its record."""
        assert count_max >= 0
        self._query_total += 1
        log_offsets_bytes: list[int] = []
        for index_file in reversed(self._files):
            if len(log_offsets_bytes) >= count_max:
                break
            if index_file.is_time_matched(begin_ms, end_ms):
                log_offsets_bytes.extend(
                    index_file.query(key_hash, begin_ms, end_ms, count_max - len(log_offsets_bytes))
                )
            if index_file.entry_count > 0 and index_file.begin_timestamp_ms < begin_ms:
                break  # every older file ends before this one begins
        return log_offsets_bytes

    def flush(self) -> int:
        """Make every entry put so far durable; return the newest durable store timestamp.

        The flush service writes the result into the checkpoint's index timestamp.
        """
        assert self.writable
        for index_file in self._dirty.values():
            index_file.flush()
        self._dirty.clear()
        for index_file in reversed(self._files):
            if index_file.entry_count > 0:
                return index_file.end_timestamp_ms
        return 0

    def delete_below_log_offset(self, min_log_offset_bytes: int) -> int:
        """Retention: delete old files whose newest entry is below the commit log's minimum.

        The newest file always stays. Returns how many files were deleted.
        """
        assert self.writable
        deleted_count = 0
        while len(self._files) > 1:
            oldest = self._files[0]
            if oldest.entry_count > 0 and oldest.end_log_offset_bytes >= min_log_offset_bytes:
                break
            self._dirty.pop(oldest.path, None)
            oldest.unlink()
            self._files.pop(0)
            deleted_count += 1
        if deleted_count:
            fsync_directory(self.directory)
        return deleted_count

    def delete_newer_than(self, timestamp_ms: int) -> int:
        """Recovery: delete the files holding entries stored after `timestamp_ms`.

        After an unclean stop, files newer than the checkpoint's index timestamp may miss
        entries; recovery deletes them and indexes those records again. Returns how many.
        """
        assert self.writable
        deleted_count = 0
        while self._files and self._files[-1].end_timestamp_ms > timestamp_ms:
            newest = self._files.pop()
            self._dirty.pop(newest.path, None)
            newest.unlink()
            deleted_count += 1
        if deleted_count:
            fsync_directory(self.directory)
            if self._files:  # the newest remaining file takes puts again, if it has room
                survivor = self._files.pop()
                survivor.close()
                self._files.append(IndexFile.open(survivor.path, self.geometry, writable=True))
        return deleted_count

    def close(self) -> None:
        """Release every map."""
        for index_file in self._files:
            index_file.close()
        self._files.clear()
        self._dirty.clear()

    def statistics(self) -> IndexServiceStatistics:
        """Counters since the service was made."""
        return IndexServiceStatistics(
            file_count=len(self._files),
            put_total=self._put_total,
            roll_total=self._roll_total,
            query_total=self._query_total,
        )

    def _newest_writable(self) -> IndexFile:
        if self._files and not self._files[-1].is_full:
            assert self._files[-1].writable
            return self._files[-1]
        return self._roll()

    def _roll(self) -> IndexFile:
        """Flush the full newest file (if any), reopen it read-only, create the next one."""
        created_ms = self._clock_ms()
        changed_directories = ensure_directory(self.directory)
        if self._files:
            previous = self._files.pop()
            previous.flush()
            self._dirty.pop(previous.path, None)
            previous.close()
            self._files.append(IndexFile.open(previous.path, self.geometry, writable=False))
            # Names must sort in creation order even if the clock stepped back or two rolls
            # fall in one millisecond.
            created_ms = max(created_ms, previous.created_ms + 1)
        index_file = IndexFile.create(self.directory / index_file_name(created_ms), self.geometry)
        self._files.append(index_file)
        for directory in [*changed_directories, self.directory]:
            fsync_directory(directory)
        self._roll_total += 1
        assert index_file.index_count == INDEX_COUNT_INITIAL
        return index_file
