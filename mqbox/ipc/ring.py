"""A single-producer single-consumer ring of variable-length parcels in shared memory.

Owns: one ring segment (layout.py draws it) mapped into this process, the producer's and the
consumer's side of the parcel protocol, the numba kernels that copy and scan parcels in batches,
and the waiting-flag half of the doorbell handshake (doorbell.py holds the FIFO and the fence).
Never: what a parcel means (ipc knows no messages), pickling, blocking on the producer side, or a
system call on the hot path (a producer makes one only to wake a consumer that said it sleeps).

One process writes a ring and one process reads it; fan-in uses one ring per producer. Either side
may be restarted: a producer continues after the last published parcel, a consumer at the oldest
parcel it had not released (parcels drained but not released are delivered again).

Invariants, asserted once per batch (docs/style.md section 3):
- `tail_bytes <= head_bytes <= tail_bytes + capacity_bytes - END_RESERVE_BYTES`, both multiples
  of 8, and both only grow. (The head stored in the segment may lag the producer's own after a
  producer crash; a restarted producer finds the true one by following the chain.)
- A published parcel's header word holds `8 <= length <= 8 + payload_size_bytes_max` and a type
  that is either a caller's (>= 0) or the padding type; a padding parcel ends exactly at the end of
  the data area; no parcel straddles the end. The producer checks sizes before it writes and the
  consumer's scan checks every header it reads (paired assertions).
- The word after the last published parcel is 0, so the consumer's chain ends there.

Memory ordering (x86-64, TSO: stores become visible in program order, loads are not reordered
with loads). A batch is written by two kernels called one after the other. `stage_parcels` zeroes
the header word of every parcel it will write and the word after the last, then copies payloads;
`publish_headers` then stores each header word, which holds the length, whole. A kernel call is
opaque to the compiler on both sides, so every store of the first kernel is issued before any of
the second, and TSO makes them visible in that order: the consumer never sees a length before the
payload it covers. Inside `publish_headers` the headers may become visible in any order; the
consumer stops at the first zero header, so it never skips one. The head counter is stored in
Python after publication, so a producer restarted after a crash can trust everything before head
and scans forward from it for parcels published without a head update. On the consumer side the
payload is read after the header that covers it: by the same kernel behind a data dependency, or
by the caller after the scan kernel returned. The waiting flag needs a full fence (doorbell.py).

Two paths, one format. Batches go through the kernels above; one parcel written
(try_write_nowait, which the broker's Outbox uses for each parcel of a flush of at most
SMALL_BATCH_COUNT_MAX) and a drain that finds at most SMALL_BATCH_COUNT_MAX parcels before the
end of the chain go through plain Python on memoryviews of the segment, because a kernel call
costs 5-7 us in numba's dispatch (it unboxes every array argument) against about 2 us for the
whole Python write or drain of one parcel. With one request in flight every hop of the broker
moves one or two parcels, so these paths carry them all. The Python write makes the stores of
stage_parcels and publish_headers for a batch of one in the same order, so both paths leave
byte-identical segments (a hypothesis test checks it, counters and staging included): zero the
parcel's last word (its header word at head is the chain's zero already), copy the payload (one
memmove), zero the word after the parcel; then store the padding header (if any), the parcel's
header word, head and the counters. Each store is a separate call into C, so the compiler cannot
move one past another, and TSO keeps them in that order for the consumer; the Python drain reads
each header word before the caller reads the payload behind it, as the scan kernel's caller
does. A header word is stored and loaded through a memoryview of format 'q': CPython packs and
unpacks such an item with a memcpy of sizeof(long long), which compiles to one 8-byte move, and
every header word is 8-byte aligned, so, like the numpy element stores above, a word is
published whole and read whole (struct's '<q' moves it byte by byte: a reader could see half).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import posix_ipc
from numpy.typing import NDArray

from mqbox._jit import kernel
from mqbox.errors import ConfigError, MessageTooLargeError
from mqbox.ipc import layout, names
from mqbox.ipc.doorbell import Doorbell, memory_fence
from mqbox.ipc.layout import (
    END_RESERVE_BYTES,
    PADDING_PARCEL_TYPE,
    PARCEL_ALIGNMENT_BYTES,
    PARCEL_HEADER_SIZE_BYTES,
    PARCEL_LENGTH_MASK,
    PARCEL_TYPE_SHIFT,
)

_W = layout.WORD_SIZE_BYTES
_MAGIC: Final = layout.MAGIC_OFFSET_BYTES // _W
_VERSION: Final = layout.VERSION_OFFSET_BYTES // _W
_CAPACITY: Final = layout.CAPACITY_OFFSET_BYTES // _W
_PAYLOAD_SIZE_MAX: Final = layout.PAYLOAD_SIZE_MAX_OFFSET_BYTES // _W
_HEAD: Final = layout.HEAD_OFFSET_BYTES // _W
_PRODUCER_PID: Final = layout.PRODUCER_PID_OFFSET_BYTES // _W
_PARCEL_COUNT_WRITTEN: Final = layout.PARCEL_COUNT_WRITTEN_OFFSET_BYTES // _W
_PAYLOAD_SIZE_WRITTEN: Final = layout.PAYLOAD_SIZE_WRITTEN_OFFSET_BYTES // _W
_BATCH_COUNT_WRITTEN: Final = layout.BATCH_COUNT_WRITTEN_OFFSET_BYTES // _W
_PADDING_COUNT_WRITTEN: Final = layout.PADDING_COUNT_WRITTEN_OFFSET_BYTES // _W
_FULL_COUNT: Final = layout.FULL_COUNT_OFFSET_BYTES // _W
_DOORBELL_COUNT_RUNG: Final = layout.DOORBELL_COUNT_RUNG_OFFSET_BYTES // _W
_TAIL: Final = layout.TAIL_OFFSET_BYTES // _W
_CONSUMER_PID: Final = layout.CONSUMER_PID_OFFSET_BYTES // _W
_PARCEL_COUNT_READ: Final = layout.PARCEL_COUNT_READ_OFFSET_BYTES // _W
_PAYLOAD_SIZE_READ: Final = layout.PAYLOAD_SIZE_READ_OFFSET_BYTES // _W
_BATCH_COUNT_READ: Final = layout.BATCH_COUNT_READ_OFFSET_BYTES // _W
_DOORBELL_COUNT_WAITED: Final = layout.DOORBELL_COUNT_WAITED_OFFSET_BYTES // _W
_WAITING_SEQUENCE: Final = layout.WAITING_SEQUENCE_OFFSET_BYTES // _W

# Result slots of the kernels' small output arrays. The slots from *_DELTAS_FIRST on are added
# as they are to the counters of the same names, which lie in consecutive words of the segment.
_STAGED_HEADER_COUNT: Final = 0
_STAGED_END_BYTES: Final = 1
_STAGED_PAYLOAD_SIZE_BYTES_MAX: Final = 2  # the largest payload in the batch, checked first
_STAGED_BAD_PARCEL_COUNT: Final = 3  # parcels with a negative size, offset or type, or past the end
_STAGED_DELTAS_FIRST: Final = 4
_STAGED_PARCEL_COUNT: Final = 4
_STAGED_PAYLOAD_SIZE_BYTES: Final = 5
_STAGED_BATCH_COUNT: Final = 6
_STAGED_PADDING_COUNT: Final = 7
_STAGED_SIZE: Final = 8
_SCANNED_END_BYTES: Final = 0
_SCANNED_BAD_HEADER: Final = 1
_SCANNED_DELTAS_FIRST: Final = 2
_SCANNED_PARCEL_COUNT: Final = 2
_SCANNED_PAYLOAD_SIZE_BYTES: Final = 3
_SCANNED_BATCH_COUNT: Final = 4
_SCANNED_SIZE: Final = 5
for _delta_slot, _counter_word in (
    (_STAGED_PARCEL_COUNT, _PARCEL_COUNT_WRITTEN),
    (_STAGED_PAYLOAD_SIZE_BYTES, _PAYLOAD_SIZE_WRITTEN),
    (_STAGED_BATCH_COUNT, _BATCH_COUNT_WRITTEN),
    (_STAGED_PADDING_COUNT, _PADDING_COUNT_WRITTEN),
):
    assert _delta_slot - _STAGED_DELTAS_FIRST == _counter_word - _PARCEL_COUNT_WRITTEN
for _delta_slot, _counter_word in (
    (_SCANNED_PARCEL_COUNT, _PARCEL_COUNT_READ),
    (_SCANNED_PAYLOAD_SIZE_BYTES, _PAYLOAD_SIZE_READ),
    (_SCANNED_BATCH_COUNT, _BATCH_COUNT_READ),
):
    assert _delta_slot - _SCANNED_DELTAS_FIRST == _counter_word - _PARCEL_COUNT_READ
assert _STAGED_SIZE == _STAGED_PADDING_COUNT + 1
assert _SCANNED_SIZE == _SCANNED_BATCH_COUNT + 1

# The ordering argument in the module docstring holds on x86-64 (TSO) only: on a weakly ordered
# CPU such as arm64 a consumer could see a header before its payload. Refuse to run there rather
# than deliver torn parcels.
assert platform.machine() == "x86_64", f"mqbox.ipc.ring assumes x86-64, not {platform.machine()}"

_SHM_MODE: Final = 0o600
# Every page of a ring is faulted in when it is mapped (create and attach). A ring's pages are all
# touched within its first lap anyway; populating them at start makes the appliance's memory at
# idle the memory it runs with (the issue-4 budget compares the two), and no hop pays a
# first-touch fault later.
_MAP_FLAGS: Final = mmap.MAP_SHARED | mmap.MAP_POPULATE
# A drain that finds at most this many parcels before the end of the chain takes them in Python
# (module docstring); more go to scan_parcels. At 4 the Python walk costs what one kernel call
# does. Writers flush batches of the same size one parcel at a time (transport.Outbox).
SMALL_BATCH_COUNT_MAX: Final = 4
# What try_write_nowait copies from: anything np.frombuffer reads as contiguous bytes.
BytesLike = bytes | bytearray | memoryview
_UNLIMITED_BYTES: Final = 2**62

# Kernels. numba's cache is keyed on this file alone, so the layout constants they use are baked
# into cached machine code; warm_up() checks the compiled kernels against layout.py at start-up.


@kernel
def stage_parcels(
    data: NDArray[np.uint8],
    words: NDArray[np.int64],
    head_bytes: int,
    limit_bytes: int,
    payload_size_bytes_max: int,
    types: NDArray[np.int32],
    payloads: NDArray[np.uint8],
    payload_offsets: NDArray[np.int64],
    payload_sizes: NDArray[np.int64],
    first_index: int,
    end_index: int,
    header_positions: NDArray[np.int64],
    header_words: NDArray[np.int64],
    result: NDArray[np.int64],
) -> int:
    """Copy parcels first_index.. end_index - 1 into the ring from head_bytes on, as many as fit
    below limit_bytes (tail_bytes + capacity_bytes), with their header words still zero.

    Returns how many parcels were staged. Checks every parcel first and stages none if one is
    malformed or larger than payload_size_bytes_max (result says which; the caller raises).
    Fills header_positions/header_words (parcels and at most one padding parcel, in ring order)
    for publish_headers, and result (the _STAGED_* slots). Publishes nothing.
    """
    size_bytes_max = 0
    bad_parcel_count = 0
    for index in range(first_index, end_index):
        size_bytes = payload_sizes[index]
        offset = payload_offsets[index]
        if size_bytes < 0 or offset < 0 or offset + size_bytes > payloads.size or types[index] < 0:
            bad_parcel_count += 1
        size_bytes_max = max(size_bytes_max, size_bytes)
    result[:] = 0
    result[_STAGED_END_BYTES] = head_bytes
    result[_STAGED_PAYLOAD_SIZE_BYTES_MAX] = size_bytes_max
    result[_STAGED_BAD_PARCEL_COUNT] = bad_parcel_count
    if bad_parcel_count > 0 or size_bytes_max > payload_size_bytes_max:
        return 0
    capacity_bytes = data.size
    mask = capacity_bytes - 1
    position = head_bytes
    header_count = 0
    padding_count = 0
    payload_size_bytes = 0
    index = first_index
    while index < end_index:
        size_bytes = payload_sizes[index]
        length = PARCEL_HEADER_SIZE_BYTES + size_bytes
        parcel_size_bytes = (length + PARCEL_ALIGNMENT_BYTES - 1) & -PARCEL_ALIGNMENT_BYTES
        start = position & mask
        to_end_bytes = capacity_bytes - start
        if parcel_size_bytes > to_end_bytes:
            # The parcel would straddle the end: a padding parcel takes the rest of the lap.
            if position + to_end_bytes + END_RESERVE_BYTES > limit_bytes:
                break
            words[start >> 3] = 0
            header_positions[header_count] = position
            header_words[header_count] = (PADDING_PARCEL_TYPE << PARCEL_TYPE_SHIFT) | to_end_bytes
            header_count += 1
            padding_count += 1
            position += to_end_bytes
            start = 0
        if position + parcel_size_bytes + END_RESERVE_BYTES > limit_bytes:
            break
        words[start >> 3] = 0
        words[(start + parcel_size_bytes - PARCEL_ALIGNMENT_BYTES) >> 3] = 0  # the zero fill
        # Copying between two slices with a 0-based index lets LLVM vectorise the loop (about 20x
        # faster than indexing both arrays with offsets; slice assignment is slower still).
        source = payloads[payload_offsets[index] : payload_offsets[index] + size_bytes]
        target = data[start + PARCEL_HEADER_SIZE_BYTES : start + length]
        for byte_index in range(size_bytes):
            target[byte_index] = source[byte_index]
        header_positions[header_count] = position
        header_words[header_count] = (np.int64(types[index]) << PARCEL_TYPE_SHIFT) | length
        header_count += 1
        payload_size_bytes += size_bytes
        position += parcel_size_bytes
        index += 1
    words[(position & mask) >> 3] = 0  # the end of the chain, inside END_RESERVE_BYTES
    result[_STAGED_HEADER_COUNT] = header_count
    result[_STAGED_END_BYTES] = position
    result[_STAGED_PARCEL_COUNT] = index - first_index
    result[_STAGED_PAYLOAD_SIZE_BYTES] = payload_size_bytes
    result[_STAGED_BATCH_COUNT] = 1 if header_count > 0 else 0
    result[_STAGED_PADDING_COUNT] = padding_count
    return index - first_index


@kernel
def publish_headers(
    words: NDArray[np.int64],
    header_positions: NDArray[np.int64],
    header_words: NDArray[np.int64],
    header_count: int,
) -> int:
    """Store the staged header words: each store publishes one parcel. Returns header_count."""
    mask = words.size * PARCEL_ALIGNMENT_BYTES - 1
    for header_index in range(header_count):
        words[(header_positions[header_index] & mask) >> 3] = header_words[header_index]
    return header_count


@kernel
def scan_parcels(
    words: NDArray[np.int64],
    tail_bytes: int,
    batch_count_max: int,
    payload_budget_bytes: int,
    payload_size_bytes_max: int,
    types: NDArray[np.int32],
    payload_offsets: NDArray[np.int64],
    payload_sizes: NDArray[np.int64],
    result: NDArray[np.int64],
) -> int:
    """Follow the published chain from tail_bytes: at most batch_count_max parcels whose payloads
    total at most payload_budget_bytes, skipping padding parcels, never past one whole lap.

    Returns the parcel count; fills types, payload offsets (into the data area) and sizes, and
    result (the _SCANNED_* slots), whose bad header is the first header word that breaks the
    format (0 if none; the scan stops before it and the caller asserts).
    """
    capacity_bytes = words.size * PARCEL_ALIGNMENT_BYTES
    mask = capacity_bytes - 1
    position = tail_bytes
    limit_bytes = tail_bytes + capacity_bytes
    count = 0
    payload_size_bytes = 0
    bad_header = 0
    while count < batch_count_max and position < limit_bytes:
        start = position & mask
        header = words[start >> 3]
        if header == 0:
            break
        length = header & PARCEL_LENGTH_MASK
        parcel_type = header >> PARCEL_TYPE_SHIFT
        if parcel_type == PADDING_PARCEL_TYPE:
            if length != capacity_bytes - start:
                bad_header = header
                break
            position += length
            continue
        parcel_size_bytes = (length + PARCEL_ALIGNMENT_BYTES - 1) & -PARCEL_ALIGNMENT_BYTES
        if (
            parcel_type < 0
            or length < PARCEL_HEADER_SIZE_BYTES
            or length - PARCEL_HEADER_SIZE_BYTES > payload_size_bytes_max
            or parcel_size_bytes > capacity_bytes - start
        ):
            bad_header = header
            break
        size_bytes = length - PARCEL_HEADER_SIZE_BYTES
        if payload_size_bytes + size_bytes > payload_budget_bytes:
            break
        types[count] = parcel_type
        payload_offsets[count] = start + PARCEL_HEADER_SIZE_BYTES
        payload_sizes[count] = size_bytes
        count += 1
        payload_size_bytes += size_bytes
        position += parcel_size_bytes
    result[_SCANNED_END_BYTES] = position
    result[_SCANNED_BAD_HEADER] = bad_header
    result[_SCANNED_PARCEL_COUNT] = count
    result[_SCANNED_PAYLOAD_SIZE_BYTES] = payload_size_bytes
    result[_SCANNED_BATCH_COUNT] = 1 if count > 0 else 0
    return count


@kernel
def find_chain_end(words: NDArray[np.int64], start_bytes: int, limit_bytes: int) -> int:
    """Position of the first zero header word on the chain from start_bytes, before limit_bytes.
    A restarted producer continues there: parcels published after the last head update."""
    capacity_bytes = words.size * PARCEL_ALIGNMENT_BYTES
    mask = capacity_bytes - 1
    position = start_bytes
    while position < limit_bytes:
        header = words[(position & mask) >> 3]
        if header == 0:
            break
        length = header & PARCEL_LENGTH_MASK
        if length < PARCEL_HEADER_SIZE_BYTES:
            break  # corrupt: the caller's assert on the position reports it
        position += (length + PARCEL_ALIGNMENT_BYTES - 1) & -PARCEL_ALIGNMENT_BYTES
    return position


@kernel
def copy_payloads(
    data: NDArray[np.uint8],
    payload_offsets: NDArray[np.int64],
    payload_sizes: NDArray[np.int64],
    count: int,
    target: NDArray[np.uint8],
    target_offsets: NDArray[np.int64],
) -> int:
    """Copy `count` payloads out of the ring back to back into target; their offsets there go to
    target_offsets. Returns the bytes copied. The caller made sure they fit."""
    position = 0
    for parcel_index in range(count):
        size_bytes = payload_sizes[parcel_index]
        source = data[payload_offsets[parcel_index] : payload_offsets[parcel_index] + size_bytes]
        copy = target[position : position + size_bytes]
        for byte_index in range(size_bytes):
            copy[byte_index] = source[byte_index]
        target_offsets[parcel_index] = position
        position += size_bytes
    return position


# The Python side.


@dataclass(frozen=True, slots=True)
class RingStatistics:
    """Counters of one ring as stored in its segment, so any attached process sees both sides."""

    capacity_bytes: int
    payload_size_bytes_max: int
    head_bytes: int
    tail_bytes: int
    producer_pid: int
    consumer_pid: int
    parcel_count_written: int
    payload_size_bytes_written: int
    batch_count_written: int
    padding_count_written: int
    full_count: int  # writes that found no room for even one parcel
    doorbell_count_rung: int
    parcel_count_read: int
    payload_size_bytes_read: int
    batch_count_read: int
    doorbell_count_waited: int  # times the consumer went to sleep on the doorbell

    @property
    def used_bytes(self) -> int:
        """Bytes between tail and head: parcels not yet released, padding included."""
        return self.head_bytes - self.tail_bytes


@dataclass(slots=True, eq=False)
class ParcelBatch:
    """Parcels drained in one call, as arrays: parcel i is `types[i]` and the payload
    `data[offsets[i] : offsets[i] + sizes[i]]`.

    The arrays are views of the ring's scratch buffers, valid until the next drain. For a batch
    from drain_nowait, `data` is the ring's data area and the payloads stay valid until release();
    for drain_into_nowait it is the caller's buffer and the batch is already released.

    Read-only by contract, though not frozen: a frozen dataclass sets each field through
    object.__setattr__, which made building one cost 1.8 us of a 6 us write-drain-release
    round; the ring makes one per drain. Identity, not equality, is what a batch compares by.
    """

    count: int
    types: NDArray[np.int32]
    offsets: NDArray[np.int64]
    sizes: NDArray[np.int64]
    data: NDArray[np.uint8]
    payload_size_bytes: int
    start_bytes: int
    end_bytes: int

    def __len__(self) -> int:
        return self.count

    def payload(self, index: int) -> NDArray[np.uint8]:
        """A view of parcel `index`'s payload (no copy)."""
        assert 0 <= index < self.count
        offset = int(self.offsets[index])
        return self.data[offset : offset + int(self.sizes[index])]


class Ring:
    """One process's handle on a ring segment. The first write makes it the producer's handle,
    the first drain the consumer's; one handle may be both (tests, a role talking to itself).

    Not thread-safe. Names come from names.shm_name(); Ring.create makes the segment and its
    doorbell, Ring.attach maps an existing one, unlink() removes both names.
    """

    def __init__(self, name: str, memory: mmap.mmap, doorbell: Doorbell) -> None:
        self.name = name
        self._memory: mmap.mmap | None = memory
        self._doorbell = doorbell
        segment = np.frombuffer(memory, dtype=np.uint8)
        self._header = segment[: layout.DATA_OFFSET_BYTES].view(np.int64)
        assert self._header[_MAGIC] == layout.RING_MAGIC
        self.capacity_bytes = int(self._header[_CAPACITY])
        self.payload_size_bytes_max = int(self._header[_PAYLOAD_SIZE_MAX])
        assert segment.size == layout.segment_size_bytes(self.capacity_bytes)
        self._data = segment[layout.DATA_OFFSET_BYTES :]
        self._words = self._data.view(np.int64)
        self._mask = self.capacity_bytes - 1
        assert self._data.ctypes.data % layout.CACHE_LINE_SIZE_BYTES == 0
        # The same memory as memoryviews, for the Python paths (module docstring): item access
        # costs a fraction of a numpy element's, and 'q' items move whole words.
        segment_view = memoryview(memory)
        self._header_view = segment_view[: layout.DATA_OFFSET_BYTES].cast("q")
        self._data_view = segment_view[layout.DATA_OFFSET_BYTES :]
        self._word_view = self._data_view.cast("q")
        segment_view.release()
        counters_written = slice(_PARCEL_COUNT_WRITTEN, _PADDING_COUNT_WRITTEN + 1)
        self._producer_counters = self._header[counters_written]
        counters_read = slice(_PARCEL_COUNT_READ, _BATCH_COUNT_READ + 1)
        self._consumer_counters = self._header[counters_read]
        # Producer side: None until the first write claims it.
        self._head_bytes: int | None = None
        self._tail_bytes_seen = 0  # the consumer's tail as last read; only ever behind the truth
        self._sequence_rung = 0
        self._header_positions = np.zeros(0, dtype=np.int64)
        self._header_words = np.zeros(0, dtype=np.int64)
        self._staged = np.zeros(_STAGED_SIZE, dtype=np.int64)
        self._staged_deltas = self._staged[_STAGED_DELTAS_FIRST:]
        # A test replaces this to stop a producer between staging and publishing (crash tests).
        self._test_hook_before_publish: Callable[[], None] | None = None
        # Consumer side: None until the first drain claims it.
        self._tail_bytes: int | None = None
        self._pending_end_bytes: int | None = None
        self._scanned_types = np.zeros(0, dtype=np.int32)
        self._scanned_offsets = np.zeros(0, dtype=np.int64)
        self._scanned_sizes = np.zeros(0, dtype=np.int64)
        self._target_offsets = np.zeros(0, dtype=np.int64)
        self._scanned = np.zeros(_SCANNED_SIZE, dtype=np.int64)
        self._scanned_deltas = self._scanned[_SCANNED_DELTAS_FIRST:]
        # The pending batch came from the small-batch path: (parcel count, payload bytes).
        self._pending_small_counts: tuple[int, int] | None = None
        self._small_types = np.zeros(SMALL_BATCH_COUNT_MAX, dtype=np.int32)
        self._small_offsets = np.zeros(SMALL_BATCH_COUNT_MAX, dtype=np.int64)
        self._small_sizes = np.zeros(SMALL_BATCH_COUNT_MAX, dtype=np.int64)
        self._small_views = [
            (self._small_types[:count], self._small_offsets[:count], self._small_sizes[:count])
            for count in range(SMALL_BATCH_COUNT_MAX + 1)
        ]
        self._empty_batch: ParcelBatch | None = None

    # Lifetime.

    @classmethod
    def create(
        cls, name: str, capacity_bytes: int, payload_size_bytes_max: int | None = None
    ) -> Ring:
        """Make the segment `name` (from names.shm_name) with a data area of `capacity_bytes`, a
        power of two, and its doorbell. Parcels with larger payloads than payload_size_bytes_max
        (default: half the ring) are refused. FileExistsError if the name is taken."""
        doorbell_path = names.doorbell_path(name)
        if capacity_bytes & (capacity_bytes - 1) or not (
            layout.CAPACITY_BYTES_MIN <= capacity_bytes <= layout.CAPACITY_BYTES_MAX
        ):
            raise ConfigError(
                f"ring capacity_bytes {capacity_bytes} must be a power of two from "
                f"{layout.CAPACITY_BYTES_MIN} to {layout.CAPACITY_BYTES_MAX}"
            )
        payload_size_bytes_max_default = layout.payload_size_bytes_max_default(capacity_bytes)
        if payload_size_bytes_max is None:
            payload_size_bytes_max = payload_size_bytes_max_default
        if not 0 <= payload_size_bytes_max <= payload_size_bytes_max_default:
            raise ConfigError(
                f"ring payload_size_bytes_max {payload_size_bytes_max} must be 0 to "
                f"{payload_size_bytes_max_default} for capacity_bytes {capacity_bytes}"
            )
        try:
            memory_object = posix_ipc.SharedMemory(
                name,
                flags=posix_ipc.O_CREX,
                mode=_SHM_MODE,
                size=layout.segment_size_bytes(capacity_bytes),
            )
        except posix_ipc.ExistentialError as error:
            raise FileExistsError(f"shared memory {name} already exists") from error
        try:
            memory = mmap.mmap(memory_object.fd, memory_object.size, flags=_MAP_FLAGS)
        finally:
            memory_object.close_fd()
        header = np.frombuffer(memory, dtype=np.int64, count=layout.DATA_OFFSET_BYTES // _W)
        header[_VERSION] = layout.RING_VERSION
        header[_CAPACITY] = capacity_bytes
        header[_PAYLOAD_SIZE_MAX] = payload_size_bytes_max
        header[_MAGIC] = layout.RING_MAGIC  # last: attach trusts the other fields once it is set
        del header
        try:
            doorbell = Doorbell.create(doorbell_path)
        except BaseException:
            memory.close()
            posix_ipc.unlink_shared_memory(name)
            raise
        return cls(name, memory, doorbell)

    @classmethod
    def attach(cls, name: str) -> Ring:
        """Map the existing ring `name` and open its doorbell. FileNotFoundError if it does not
        exist; ConfigError if the name holds something that is not a ring of this version."""
        doorbell_path = names.doorbell_path(name)
        try:
            memory_object = posix_ipc.SharedMemory(name)
        except posix_ipc.ExistentialError as error:
            raise FileNotFoundError(f"shared memory {name} does not exist") from error
        try:
            segment_size_bytes = int(memory_object.size)
            if segment_size_bytes < layout.DATA_OFFSET_BYTES:
                raise ConfigError(f"shared memory {name} is too small to be a ring")
            memory = mmap.mmap(memory_object.fd, segment_size_bytes, flags=_MAP_FLAGS)
        finally:
            memory_object.close_fd()
        header = np.frombuffer(memory, dtype=np.int64, count=layout.DATA_OFFSET_BYTES // _W)
        magic, version = int(header[_MAGIC]), int(header[_VERSION])
        capacity_bytes = int(header[_CAPACITY])
        del header
        problem = None
        if magic != layout.RING_MAGIC:
            problem = f"has magic {magic:#x}, not a ring (or create has not finished)"
        elif version != layout.RING_VERSION:
            problem = f"is ring version {version}, this is {layout.RING_VERSION}"
        elif segment_size_bytes != layout.segment_size_bytes(capacity_bytes):
            problem = f"is {segment_size_bytes} bytes, not a ring of {capacity_bytes}"
        if problem is not None:
            memory.close()
            raise ConfigError(f"shared memory {name} {problem}")
        try:
            doorbell = Doorbell.open(doorbell_path)
        except BaseException:
            memory.close()
            raise
        return cls(name, memory, doorbell)

    def close(self) -> None:
        """Unmap the segment and close the doorbell in this process; the names stay. The mapping
        outlives close() while payload views the caller kept are alive. Idempotent."""
        self._doorbell.close()
        if self._memory is None:
            return
        memory, self._memory = self._memory, None
        for view in (self._word_view, self._data_view, self._header_view):
            view.release()
        for attribute in (
            "_header",
            "_data",
            "_words",
            "_producer_counters",
            "_consumer_counters",
            "_header_view",
            "_data_view",
            "_word_view",
        ):
            delattr(self, attribute)
        self._empty_batch = None
        # A view still held elsewhere pins the buffer; the mapping then goes with the last view.
        with contextlib.suppress(BufferError):
            memory.close()

    def unlink(self) -> None:
        """Remove the segment's and the doorbell's names; mapped handles keep working. Missing
        names are fine (names.unlink_instance may have swept them)."""
        with contextlib.suppress(posix_ipc.ExistentialError):
            posix_ipc.unlink_shared_memory(self.name)
        self._doorbell.unlink()

    def __enter__(self) -> Ring:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def statistics(self) -> RingStatistics:
        """Both sides' counters, read from the segment now (each field on its own; a snapshot
        taken while the other side runs may be a batch apart between fields)."""
        header = self._header
        return RingStatistics(
            capacity_bytes=self.capacity_bytes,
            payload_size_bytes_max=self.payload_size_bytes_max,
            head_bytes=int(header[_HEAD]),
            tail_bytes=int(header[_TAIL]),
            producer_pid=int(header[_PRODUCER_PID]),
            consumer_pid=int(header[_CONSUMER_PID]),
            parcel_count_written=int(header[_PARCEL_COUNT_WRITTEN]),
            payload_size_bytes_written=int(header[_PAYLOAD_SIZE_WRITTEN]),
            batch_count_written=int(header[_BATCH_COUNT_WRITTEN]),
            padding_count_written=int(header[_PADDING_COUNT_WRITTEN]),
            full_count=int(header[_FULL_COUNT]),
            doorbell_count_rung=int(header[_DOORBELL_COUNT_RUNG]),
            parcel_count_read=int(header[_PARCEL_COUNT_READ]),
            payload_size_bytes_read=int(header[_PAYLOAD_SIZE_READ]),
            batch_count_read=int(header[_BATCH_COUNT_READ]),
            doorbell_count_waited=int(header[_DOORBELL_COUNT_WAITED]),
        )

    # Producer side.

    def try_write_nowait(self, parcel_type: int, payload: BytesLike) -> bool:
        """Append one parcel of `parcel_type` (0 to 2**31 - 1) with a copy of `payload`; False if
        the ring has no room now. MessageTooLargeError if the payload can never fit.

        The Python path (module docstring), no kernel call. It keeps every rule of
        try_write_batch_nowait for a batch of one, down to the counters.
        """
        if type(payload) is memoryview and (payload.format != "B" or payload.ndim != 1):
            payload = payload.cast("B")  # bytes, as np.frombuffer would read them
        return self._try_write_parts(parcel_type, (payload,), len(payload))

    def try_write_parts_nowait(self, parcel_type: int, parts: Sequence[BytesLike]) -> bool:
        """try_write_nowait of one parcel whose payload is `parts` back to back: each part is
        copied once, straight into the ring, so a producer saves the copy that joining them
        into one buffer first would cost (transport.Outbox, for large payloads)."""
        parts = tuple(
            part.cast("B")  # bytes, as np.frombuffer would read them
            if type(part) is memoryview and (part.format != "B" or part.ndim != 1)
            else part
            for part in parts
        )
        return self._try_write_parts(parcel_type, parts, sum(len(part) for part in parts))

    def _try_write_parts(
        self, parcel_type: int, parts: tuple[BytesLike, ...], size_bytes: int
    ) -> bool:
        assert 0 <= parcel_type <= layout.PARCEL_TYPE_MAX
        head_bytes = self._head_bytes
        if head_bytes is None:
            head_bytes = self._claim_producer()
        if size_bytes > self.payload_size_bytes_max:
            raise MessageTooLargeError(
                f"a parcel payload of {size_bytes} bytes is larger than the "
                f"payload_size_bytes_max {self.payload_size_bytes_max} of ring {self.name}"
            )
        written = self._write_single_round(parcel_type, parts, size_bytes)
        if not written:
            # Out of room as far as the last tail we read says; read the consumer's line again.
            tail_bytes = self._read_tail_bytes()
            if tail_bytes != self._tail_bytes_seen:
                self._tail_bytes_seen = tail_bytes
                written = self._write_single_round(parcel_type, parts, size_bytes)
        if self._head_bytes == head_bytes:
            self._header_view[_FULL_COUNT] += 1
            return False
        self._ring_doorbell_if_waiting()
        return written

    def _copy_parts(self, at: int, parts: tuple[BytesLike, ...]) -> None:
        """Copy `parts` back to back into the data area from `at` (one memmove each)."""
        data_view = self._data_view
        for part in parts:
            part_size_bytes = len(part)
            data_view[at : at + part_size_bytes] = part
            at += part_size_bytes

    def _write_single_round(
        self, parcel_type: int, parts: tuple[BytesLike, ...], size_bytes: int
    ) -> bool:
        """stage_parcels + publish_headers + the end of _write_round for a batch of one, in
        Python: the same stores in the same order (module docstring). True if the parcel was
        written."""
        head_bytes = self._head_bytes
        assert head_bytes is not None
        length = PARCEL_HEADER_SIZE_BYTES + size_bytes
        parcel_size_bytes = (length + PARCEL_ALIGNMENT_BYTES - 1) & -PARCEL_ALIGNMENT_BYTES
        start = head_bytes & self._mask
        if parcel_size_bytes > self.capacity_bytes - start:
            return self._write_single_round_padded(parcel_type, parts, size_bytes)
        end_bytes = head_bytes + parcel_size_bytes
        if end_bytes + END_RESERVE_BYTES > self._tail_bytes_seen + self.capacity_bytes:
            return False
        words = self._word_view
        # The header word at head is the zero that ends the chain already (the producer keeps
        # it so), so only the parcel's last word needs zeroing before the payload goes in.
        words[(start + parcel_size_bytes - PARCEL_ALIGNMENT_BYTES) >> 3] = 0  # the zero fill
        if size_bytes:
            self._copy_parts(start + PARCEL_HEADER_SIZE_BYTES, parts)
        words[(end_bytes & self._mask) >> 3] = 0  # the new end of the chain
        if self._test_hook_before_publish is not None:
            self._test_hook_before_publish()
        words[start >> 3] = (parcel_type << PARCEL_TYPE_SHIFT) | length  # publishes the parcel
        header_view = self._header_view
        header_view[_HEAD] = end_bytes  # after the header: a restarted producer trusts head
        header_view[_PARCEL_COUNT_WRITTEN] += 1
        header_view[_PAYLOAD_SIZE_WRITTEN] += size_bytes
        header_view[_BATCH_COUNT_WRITTEN] += 1
        self._head_bytes = end_bytes
        return True

    def _write_single_round_padded(
        self, parcel_type: int, parts: tuple[BytesLike, ...], size_bytes: int
    ) -> bool:
        """_write_single_round when the parcel would straddle the end of the data area: a padding
        parcel takes the rest of the lap and the parcel goes to the start, or, if only the
        padding fits, the padding is written alone (so the parcel fits once the consumer has
        passed it), as stage_parcels does."""
        head_bytes = self._head_bytes
        assert head_bytes is not None
        capacity_bytes = self.capacity_bytes
        limit_bytes = self._tail_bytes_seen + capacity_bytes
        length = PARCEL_HEADER_SIZE_BYTES + size_bytes
        parcel_size_bytes = (length + PARCEL_ALIGNMENT_BYTES - 1) & -PARCEL_ALIGNMENT_BYTES
        padding_start = head_bytes & self._mask
        padding_size_bytes = capacity_bytes - padding_start
        assert parcel_size_bytes > padding_size_bytes
        position = head_bytes + padding_size_bytes  # the start of the next lap
        if position + END_RESERVE_BYTES > limit_bytes:
            return False  # not even the padding fits; nothing staged
        words = self._word_view
        words[padding_start >> 3] = 0
        written = position + parcel_size_bytes + END_RESERVE_BYTES <= limit_bytes
        end_bytes = position
        if written:
            words[0] = 0
            words[(parcel_size_bytes - PARCEL_ALIGNMENT_BYTES) >> 3] = 0  # the zero fill
            if size_bytes:
                self._copy_parts(PARCEL_HEADER_SIZE_BYTES, parts)
            end_bytes = position + parcel_size_bytes
        words[(end_bytes & self._mask) >> 3] = 0  # the new end of the chain
        assert head_bytes < end_bytes <= limit_bytes - END_RESERVE_BYTES
        if self._test_hook_before_publish is not None:
            self._test_hook_before_publish()
        words[padding_start >> 3] = (PADDING_PARCEL_TYPE << PARCEL_TYPE_SHIFT) | padding_size_bytes
        if written:
            words[0] = (parcel_type << PARCEL_TYPE_SHIFT) | length
        header_view = self._header_view
        header_view[_HEAD] = end_bytes
        if written:
            header_view[_PARCEL_COUNT_WRITTEN] += 1
            header_view[_PAYLOAD_SIZE_WRITTEN] += size_bytes
        header_view[_BATCH_COUNT_WRITTEN] += 1
        header_view[_PADDING_COUNT_WRITTEN] += 1
        self._head_bytes = end_bytes
        return written

    def try_write_batch_nowait(
        self,
        types: NDArray[np.int32],
        payloads: NDArray[np.uint8],
        payload_offsets: NDArray[np.int64],
        payload_sizes: NDArray[np.int64],
    ) -> int:
        """Append parcels i = 0.. with type types[i] (>= 0) and payload
        payloads[payload_offsets[i] : payload_offsets[i] + payload_sizes[i]], in order, as many as
        fit now; returns how many (the caller retries the rest later).

        All-or-refuse on size: MessageTooLargeError, and nothing written, if any payload is larger
        than payload_size_bytes_max. The kernel checks the batch before it copies anything, so the
        check costs no extra pass in Python.
        """
        parcel_count = types.size
        assert payload_offsets.size == parcel_count
        assert payload_sizes.size == parcel_count
        # Other dtypes would work, but each would compile the kernel again, on the hot path.
        assert types.dtype == np.int32
        assert payloads.dtype == np.uint8
        assert payload_offsets.dtype == np.int64
        assert payload_sizes.dtype == np.int64
        if parcel_count == 0:
            return 0
        head_bytes = self._claim_producer()
        if self._header_words.size <= parcel_count:
            self._header_positions = np.zeros(parcel_count + 1, dtype=np.int64)
            self._header_words = np.zeros(parcel_count + 1, dtype=np.int64)
        written = self._write_round(types, payloads, payload_offsets, payload_sizes, 0)
        if written < parcel_count:
            # Out of room as far as the last tail we read says; read the consumer's line again.
            tail_bytes = self._read_tail_bytes()
            if tail_bytes != self._tail_bytes_seen:
                self._tail_bytes_seen = tail_bytes
                written += self._write_round(
                    types, payloads, payload_offsets, payload_sizes, written
                )
        if self._head_bytes == head_bytes:
            self._header[_FULL_COUNT] += 1
            return written
        self._ring_doorbell_if_waiting()
        return written

    def _write_round(
        self,
        types: NDArray[np.int32],
        payloads: NDArray[np.uint8],
        payload_offsets: NDArray[np.int64],
        payload_sizes: NDArray[np.int64],
        first_index: int,
    ) -> int:
        """Stage and publish what fits below the last tail seen; returns parcels written."""
        head_bytes = self._head_bytes
        assert head_bytes is not None
        limit_bytes = self._tail_bytes_seen + self.capacity_bytes
        staged = self._staged
        staged_count = stage_parcels(
            self._data,
            self._words,
            head_bytes,
            limit_bytes,
            self.payload_size_bytes_max,
            types,
            payloads,
            payload_offsets,
            payload_sizes,
            first_index,
            types.size,
            self._header_positions,
            self._header_words,
            staged,
        )
        header_count = int(staged[_STAGED_HEADER_COUNT])
        if header_count == 0:
            assert staged[_STAGED_BAD_PARCEL_COUNT] == 0, (
                "a negative size, offset or type, or a payload past the end of `payloads`"
            )
            size_bytes_max = int(staged[_STAGED_PAYLOAD_SIZE_BYTES_MAX])
            if size_bytes_max > self.payload_size_bytes_max:
                raise MessageTooLargeError(
                    f"a parcel payload of {size_bytes_max} bytes is larger than the "
                    f"payload_size_bytes_max {self.payload_size_bytes_max} of ring {self.name}"
                )
            return 0
        end_bytes = int(staged[_STAGED_END_BYTES])
        assert 0 <= staged_count <= types.size - first_index
        assert head_bytes < end_bytes <= limit_bytes - END_RESERVE_BYTES
        assert end_bytes % PARCEL_ALIGNMENT_BYTES == 0
        if self._test_hook_before_publish is not None:
            self._test_hook_before_publish()
        publish_headers(self._words, self._header_positions, self._header_words, header_count)
        self._header[_HEAD] = end_bytes  # after the headers: a restarted producer trusts head
        counters = self._producer_counters
        np.add(counters, self._staged_deltas, out=counters)
        self._head_bytes = end_bytes
        return int(staged_count)

    def _ring_doorbell_if_waiting(self) -> None:
        """The producer's half of check-after-set: publication, fence, then read the flag."""
        memory_fence()
        header_view = self._header_view
        sequence = header_view[_WAITING_SEQUENCE]
        if sequence & 1 and sequence != self._sequence_rung:
            self._doorbell.ring_nowait()
            self._sequence_rung = sequence
            header_view[_DOORBELL_COUNT_RUNG] += 1

    def _read_tail_bytes(self) -> int:
        tail_bytes: int = self._header_view[_TAIL]
        head_bytes = self._head_bytes
        assert head_bytes is not None
        assert self._tail_bytes_seen <= tail_bytes <= head_bytes
        assert tail_bytes % PARCEL_ALIGNMENT_BYTES == 0
        return tail_bytes

    def _claim_producer(self) -> int:
        """This handle's head; on first use, continue after the last published parcel."""
        if self._head_bytes is not None:
            return self._head_bytes
        header = self._header
        stored_head_bytes = int(header[_HEAD])
        tail_bytes = int(header[_TAIL])
        assert tail_bytes >= 0
        assert stored_head_bytes - tail_bytes <= self.capacity_bytes - END_RESERVE_BYTES
        # Both are on the chain. The tail passes the stored head when the consumer has read
        # parcels that a dead producer published without storing head afterwards.
        chain_bytes = max(stored_head_bytes, tail_bytes)
        assert chain_bytes - stored_head_bytes <= self.capacity_bytes
        head_bytes = find_chain_end(
            self._words, chain_bytes, tail_bytes + self.capacity_bytes - END_RESERVE_BYTES
        )
        assert chain_bytes <= head_bytes
        assert head_bytes % PARCEL_ALIGNMENT_BYTES == 0
        assert self._words[(head_bytes & self._mask) >> 3] == 0
        header[_HEAD] = head_bytes
        header[_PRODUCER_PID] = os.getpid()
        self._head_bytes = head_bytes
        self._tail_bytes_seen = tail_bytes
        return head_bytes

    # Consumer side.

    def drain_nowait(self, batch_count_max: int) -> ParcelBatch:
        """Up to batch_count_max published parcels, without copying them; may be empty.

        Payloads are views into the ring: process them, then call release(batch) before the next
        drain. Until then the producer cannot reuse their bytes.
        """
        return self._drain(batch_count_max, _UNLIMITED_BYTES)

    def release(self, batch: ParcelBatch) -> None:
        """Give the bytes of a drained batch back to the producer (advance the tail)."""
        tail_bytes = self._tail_bytes
        assert tail_bytes is not None
        if batch.count == 0:
            return  # empty batches are released by the drain itself
        assert self._pending_end_bytes == batch.end_bytes, "release the latest batch, once"
        assert batch.start_bytes == tail_bytes
        if self._pending_small_counts is None:
            # A kernel scan's batch: its counts are still in the result array.
            assert self._scanned[_SCANNED_END_BYTES] == batch.end_bytes
        self._release_to(batch.end_bytes)

    def drain_into_nowait(self, target: NDArray[np.uint8], batch_count_max: int) -> ParcelBatch:
        """Copy up to batch_count_max parcels' payloads back to back into `target` and release
        them; the batch's offsets index `target`. `target` must hold payload_size_bytes_max."""
        assert target.size >= self.payload_size_bytes_max
        batch = self._drain(batch_count_max, target.size)
        if batch.count == 0:
            return batch
        if self._target_offsets.size < batch.count:  # a small batch may come before any scan
            self._target_offsets = np.zeros(max(batch_count_max, batch.count), dtype=np.int64)
        target_offsets = self._target_offsets[: batch.count]
        assert target_offsets.size == batch.count  # the kernel writes one offset per parcel
        copied_bytes = copy_payloads(
            self._data, batch.offsets, batch.sizes, batch.count, target, target_offsets
        )
        assert copied_bytes == batch.payload_size_bytes
        self.release(batch)
        return ParcelBatch(
            count=batch.count,
            types=batch.types,
            offsets=target_offsets,
            sizes=batch.sizes,
            data=target,
            payload_size_bytes=batch.payload_size_bytes,
            start_bytes=batch.start_bytes,
            end_bytes=batch.end_bytes,
        )

    def read_nowait(self) -> tuple[int, bytes] | None:
        """The next parcel as (type, payload copy), released; None if the ring is empty. For the
        control plane and tests."""
        batch = self._drain(1, _UNLIMITED_BYTES)
        if batch.count == 0:
            return None
        parcel = (int(batch.types[0]), batch.payload(0).tobytes())
        self.release(batch)
        return parcel

    def _drain(self, batch_count_max: int, payload_budget_bytes: int) -> ParcelBatch:
        assert batch_count_max > 0
        assert self._pending_end_bytes is None, "release the previous batch first"
        tail_bytes = self._tail_bytes
        if tail_bytes is None:
            tail_bytes = self._claim_consumer()
        words = self._word_view
        start = tail_bytes & self._mask
        header: int = words[start >> 3]
        if header == 0:
            return self._drained_nothing(tail_bytes)
        # The small-batch path (module docstring): up to SMALL_BATCH_COUNT_MAX ordinary parcels
        # and then the end of the chain (or batch_count_max). Anything else, more parcels,
        # padding, a payload over the budget or a corrupt header, goes to the kernel from the
        # tail again, which scans any batch and reports bad headers.
        mask = self._mask
        capacity_bytes = self.capacity_bytes
        payload_size_bytes_max = self.payload_size_bytes_max
        types = self._small_types
        offsets = self._small_offsets
        sizes = self._small_sizes
        count = 0
        payload_size_bytes = 0
        end_bytes = tail_bytes
        while True:
            length = header & PARCEL_LENGTH_MASK
            size_bytes = length - PARCEL_HEADER_SIZE_BYTES
            parcel_size_bytes = (length + PARCEL_ALIGNMENT_BYTES - 1) & -PARCEL_ALIGNMENT_BYTES
            if not (
                header > 0  # a type >= 0: not padding
                and 0 <= size_bytes <= payload_size_bytes_max
                and payload_size_bytes + size_bytes <= payload_budget_bytes
                and parcel_size_bytes <= capacity_bytes - start
            ):
                return self._drain_scan(tail_bytes, batch_count_max, payload_budget_bytes)
            types[count] = header >> PARCEL_TYPE_SHIFT
            offsets[count] = start + PARCEL_HEADER_SIZE_BYTES
            sizes[count] = size_bytes
            count += 1
            payload_size_bytes += size_bytes
            end_bytes += parcel_size_bytes
            if count == batch_count_max:
                break
            start = end_bytes & mask
            header = words[start >> 3]
            if header == 0:
                break
            if count == SMALL_BATCH_COUNT_MAX:
                return self._drain_scan(tail_bytes, batch_count_max, payload_budget_bytes)
        self._pending_end_bytes = end_bytes
        self._pending_small_counts = (count, payload_size_bytes)
        types_view, offsets_view, sizes_view = self._small_views[count]
        # Positional: keyword arguments cost this call twice as much (fields in order).
        return ParcelBatch(
            count,
            types_view,
            offsets_view,
            sizes_view,
            self._data,
            payload_size_bytes,
            tail_bytes,
            end_bytes,
        )

    def _drained_nothing(self, tail_bytes: int) -> ParcelBatch:
        """The empty batch at tail_bytes; made once per tail position (callers never change a
        batch)."""
        batch = self._empty_batch
        if batch is None or batch.start_bytes != tail_bytes:
            batch = self._empty_batch = ParcelBatch(
                count=0,
                types=self._small_types[:0],
                offsets=self._small_offsets[:0],
                sizes=self._small_sizes[:0],
                data=self._data,
                payload_size_bytes=0,
                start_bytes=tail_bytes,
                end_bytes=tail_bytes,
            )
        return batch

    def _drain_scan(
        self, tail_bytes: int, batch_count_max: int, payload_budget_bytes: int
    ) -> ParcelBatch:
        """The kernel path of _drain: scan_parcels over the chain from tail_bytes."""
        if self._scanned_types.size < batch_count_max:
            self._scanned_types = np.zeros(batch_count_max, dtype=np.int32)
            self._scanned_offsets = np.zeros(batch_count_max, dtype=np.int64)
            self._scanned_sizes = np.zeros(batch_count_max, dtype=np.int64)
            self._target_offsets = np.zeros(batch_count_max, dtype=np.int64)
        result = self._scanned
        count = scan_parcels(
            self._words,
            tail_bytes,
            batch_count_max,
            payload_budget_bytes,
            self.payload_size_bytes_max,
            self._scanned_types,
            self._scanned_offsets,
            self._scanned_sizes,
            result,
        )
        end_bytes = int(result[_SCANNED_END_BYTES])
        bad_header = int(result[_SCANNED_BAD_HEADER])
        assert bad_header == 0, (
            f"ring {self.name}: corrupt header word {bad_header:#018x} at byte {end_bytes}"
        )
        assert 0 <= count <= batch_count_max
        assert tail_bytes <= end_bytes <= tail_bytes + self.capacity_bytes
        assert end_bytes % PARCEL_ALIGNMENT_BYTES == 0
        batch = ParcelBatch(
            count=count,
            types=self._scanned_types[:count],
            offsets=self._scanned_offsets[:count],
            sizes=self._scanned_sizes[:count],
            data=self._data,
            payload_size_bytes=int(result[_SCANNED_PAYLOAD_SIZE_BYTES]),
            start_bytes=tail_bytes,
            end_bytes=end_bytes,
        )
        self._pending_small_counts = None
        if count == 0:
            if end_bytes != tail_bytes:
                self._release_to(end_bytes)  # only padding: give it back at once
        else:
            self._pending_end_bytes = end_bytes
        return batch

    def _release_to(self, end_bytes: int) -> None:
        """Store the tail, then add the drained batch's counts to the consumer's counters."""
        header_view = self._header_view
        header_view[_TAIL] = end_bytes
        small_counts = self._pending_small_counts
        if small_counts is not None:
            header_view[_PARCEL_COUNT_READ] += small_counts[0]
            header_view[_PAYLOAD_SIZE_READ] += small_counts[1]
            header_view[_BATCH_COUNT_READ] += 1
        else:
            counters = self._consumer_counters
            np.add(counters, self._scanned_deltas, out=counters)
        self._tail_bytes = end_bytes
        self._pending_end_bytes = None

    def _claim_consumer(self) -> int:
        """This handle's tail; on first use, start at the oldest unreleased parcel."""
        if self._tail_bytes is not None:
            return self._tail_bytes
        header = self._header
        tail_bytes = int(header[_TAIL])
        assert tail_bytes % PARCEL_ALIGNMENT_BYTES == 0
        sequence = int(header[_WAITING_SEQUENCE])
        if sequence % 2 == 1:
            header[_WAITING_SEQUENCE] = sequence + 1  # a consumer died asleep; nobody waits now
        header[_CONSUMER_PID] = os.getpid()
        self._tail_bytes = tail_bytes
        return tail_bytes

    def parcel_count_read(self) -> int:
        """Parcels this ring's consumers have released so far (the consumer line's counter)."""
        count: int = self._header_view[_PARCEL_COUNT_READ]
        return count

    def readable(self) -> bool:
        """True if a drain would find something now (a parcel, or padding to skip)."""
        tail_bytes = self._tail_bytes
        if tail_bytes is None:
            tail_bytes = self._claim_consumer()
        return self._word_view[(tail_bytes & self._mask) >> 3] != 0

    def doorbell_fileno(self) -> int:
        """The doorbell's descriptor, for a reactor's epoll: arm_doorbell_nowait() before the
        epoll wait, disarm_doorbell() after it, whether or not it fired."""
        return self._doorbell.fileno()

    def arm_doorbell_nowait(self) -> bool:
        """Tell the producer this consumer is going to sleep. Returns False, and stays disarmed,
        if a parcel is readable already (do not sleep); True if armed: sleep on the doorbell."""
        return Ring.arm_doorbells_nowait((self,))

    @staticmethod
    def arm_doorbells_nowait(rings: Sequence[Ring]) -> bool:
        """arm_doorbell_nowait for every ring a consumer sleeps on, with one fence for all: set
        every waiting flag, fence, then look at every ring. Returns False, and leaves all of them
        disarmed, if any is readable already; True if all are armed: sleep, then disarm each.

        One fence is enough: it orders each flag's store before each ring's load, which is what
        each ring's check-after-set needs (doorbell.py), and it costs one call instead of one per
        ring."""
        for ring in rings:
            ring._set_waiting()
        memory_fence()  # the consumer's half of check-after-set: set, fence, then check
        for ring in rings:
            if ring.readable():
                for armed in rings:
                    armed._clear_waiting()
                return False
        for ring in rings:
            ring._header_view[_DOORBELL_COUNT_WAITED] += 1
        return True

    def _set_waiting(self) -> None:
        if self._tail_bytes is None:
            self._claim_consumer()  # first: claiming clears a flag a dead consumer left set
        header_view = self._header_view
        sequence = header_view[_WAITING_SEQUENCE]
        assert sequence % 2 == 0, "the doorbell is armed already"
        header_view[_WAITING_SEQUENCE] = sequence + 1

    def _clear_waiting(self) -> None:
        header_view = self._header_view
        sequence = header_view[_WAITING_SEQUENCE]
        if sequence & 1:
            header_view[_WAITING_SEQUENCE] = sequence + 1

    def disarm_doorbell(self, *, rung: bool = True) -> None:
        """Back from sleep: clear the waiting flag, then take pending rings out of the FIFO.
        rung=False skips the FIFO's read when the caller's epoll said the doorbell did not fire:
        a ring that comes later stays pending and wakes the next sleep early, once, which then
        clears it (the common case costs no read(2) and no BlockingIOError)."""
        self._clear_waiting()
        if rung:
            self._doorbell.clear_nowait()

    def wait_readable(self, timeout_ms: int) -> bool:
        """Sleep until a parcel is readable or timeout_ms passes (negative: no limit); True if
        readable. Makes no system call when a parcel is readable already."""
        if self.readable():
            return True
        deadline_ns = None if timeout_ms < 0 else time.monotonic_ns() + timeout_ms * 1_000_000
        while True:
            if not self.arm_doorbell_nowait():
                return True
            try:
                remaining_ms = -1
                if deadline_ns is not None:
                    remaining_ms = max(0, -(-(deadline_ns - time.monotonic_ns()) // 1_000_000))
                self._doorbell.wait_rung(remaining_ms)
            finally:
                self.disarm_doorbell()
            if self.readable():
                return True
            if deadline_ns is not None and time.monotonic_ns() >= deadline_ns:
                return False
            # A stale ring from an earlier sleep woke us: sleep again.


def ring_occupancy(name: str) -> tuple[int, int]:
    """(used bytes, capacity bytes) of the ring `name`, read from its header page alone (an
    observer's view: no doorbell, no data mapping). FileNotFoundError if it does not exist,
    ConfigError if it is not a ring of this version."""
    try:
        memory_object = posix_ipc.SharedMemory(name)
    except posix_ipc.ExistentialError as error:
        raise FileNotFoundError(f"shared memory {name} does not exist") from error
    try:
        if int(memory_object.size) < layout.DATA_OFFSET_BYTES:
            raise ConfigError(f"shared memory {name} is too small to be a ring")
        memory = mmap.mmap(
            memory_object.fd, layout.DATA_OFFSET_BYTES, mmap.MAP_SHARED, mmap.PROT_READ
        )
    finally:
        memory_object.close_fd()
    with memory:
        header = np.frombuffer(memory, dtype=np.int64, count=layout.DATA_OFFSET_BYTES // _W)
        try:
            if int(header[_MAGIC]) != layout.RING_MAGIC:
                raise ConfigError(f"shared memory {name} is not a ring")
            used_bytes = int(header[_HEAD]) - int(header[_TAIL])
            capacity_bytes = int(header[_CAPACITY])
        finally:
            del header
    return used_bytes, capacity_bytes


def warm_up() -> None:
    """Compile (or load from cache) every kernel of this module on a tiny ring in private memory,
    and check them against layout.py: numba's cache would keep constants from an older layout."""
    capacity_bytes = layout.CAPACITY_BYTES_MIN
    data = np.zeros(capacity_bytes, dtype=np.uint8)
    words = data.view(np.int64)
    types = np.array([7, 8], dtype=np.int32)
    payload_sizes = np.array([3, capacity_bytes // 2 - PARCEL_HEADER_SIZE_BYTES], dtype=np.int64)
    payload_offsets = np.array([0, 3], dtype=np.int64)
    payloads = np.arange(int(payload_sizes.sum()), dtype=np.int64).astype(np.uint8)
    header_positions = np.zeros(3, dtype=np.int64)
    header_words = np.zeros(3, dtype=np.int64)
    staged = np.zeros(_STAGED_SIZE, dtype=np.int64)
    scanned = np.zeros(_SCANNED_SIZE, dtype=np.int64)
    # The first parcel ends 8 bytes before the end, so the second wraps behind a padding parcel.
    head_bytes = capacity_bytes - 24
    tail_bytes = head_bytes
    payload_size_bytes_max = int(payload_sizes.max())
    for source in (payloads, np.frombuffer(payloads.tobytes(), dtype=np.uint8)):
        data[:] = 0
        staged_count = stage_parcels(
            data,
            words,
            head_bytes,
            tail_bytes + capacity_bytes,
            payload_size_bytes_max,
            types,
            source,
            payload_offsets,
            payload_sizes,
            0,
            2,
            header_positions,
            header_words,
            staged,
        )
        assert staged_count == 2
        assert staged[_STAGED_HEADER_COUNT] == 3
        assert staged[_STAGED_PADDING_COUNT] == 1
        publish_headers(words, header_positions, header_words, 3)
    first_header = int(words[(head_bytes & (capacity_bytes - 1)) >> 3])
    assert first_header == (7 << PARCEL_TYPE_SHIFT) | (PARCEL_HEADER_SIZE_BYTES + 3)
    padding_header = int(words[((head_bytes + 16) & (capacity_bytes - 1)) >> 3])
    assert padding_header >> PARCEL_TYPE_SHIFT == PADDING_PARCEL_TYPE
    end_bytes = int(staged[_STAGED_END_BYTES])
    assert find_chain_end(words, tail_bytes, tail_bytes + capacity_bytes) == end_bytes
    scanned_types = np.zeros(2, dtype=np.int32)
    scanned_offsets = np.zeros(2, dtype=np.int64)
    scanned_sizes = np.zeros(2, dtype=np.int64)
    count = scan_parcels(
        words,
        tail_bytes,
        2,
        _UNLIMITED_BYTES,
        payload_size_bytes_max,
        scanned_types,
        scanned_offsets,
        scanned_sizes,
        scanned,
    )
    assert count == 2
    assert scanned[_SCANNED_END_BYTES] == end_bytes
    assert scanned[_SCANNED_BAD_HEADER] == 0
    assert scanned[_SCANNED_PARCEL_COUNT] == 2
    target = np.zeros(int(payload_sizes.sum()), dtype=np.uint8)
    target_offsets = np.zeros(2, dtype=np.int64)
    copied_bytes = copy_payloads(data, scanned_offsets, scanned_sizes, 2, target, target_offsets)
    assert copied_bytes == target.size
    assert bytes(target) == payloads.tobytes()
