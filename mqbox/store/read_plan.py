"""Read plans: what a PULL sends, as (segment, file offset, size) runs for the reactor's sendfile.

Owns: RocketMQ's GetMessageStatus, the bounds rules of DefaultMessageStore.getMessage (which
status and which nextBeginOffset each situation gets: docs/protocol.md section 4.3), the
mapping from a status to the PULL response code (PullMessageProcessor's), the `ReadPlan`
record, and `plan_read`, the kernel that walks a window of consume-queue entries straight from
the segment's map, filters them by tag hash and merges adjacent records into runs.
read_plan_ref.py restates the kernel in plain Python; a hypothesis test holds them together.

Used by the read side (MessageStoreReader, run by the pull processors); it holds no state and
writes nothing but a caller's out array.

Never: reads or copies message bytes (the consume queue holds sizes and tag hashes; the reactor
copies the bytes, with sendfile, from its own descriptors), opens files, or knows of sockets.

Rules of one scan (RocketMQ 4.x getMessage, page-cache limits):
- The window is at most max(16000, 20 * count_max) bytes of consume queue, i.e.
  max(800, count_max) entries, and never crosses the end of the consume-queue segment holding
  the first entry, nor the queue's max offset.
- For each entry in order: once at least one message is taken, the batch is full when it holds
  count_max messages or the next one would pass size_bytes_max (so the first message is always
  taken, whatever its size); then an entry whose tag hash is not in the filter (an empty filter
  takes everything) is skipped; then one whose record lies below the commit log's minimum
  offset (deleted by retention) is skipped and counted as removed.
- nextBeginOffset = asked index + entries scanned (the entry that found the batch full is not
  scanned). FOUND if any message was taken; else MESSAGE_WAS_REMOVING if a deleted record was
  met; else NO_MATCHED_MESSAGE.
- Runs: records adjacent in the commit log and in the same segment share one run.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from typing import Final

import numpy as np
from numpy.typing import NDArray

from mqbox._jit import kernel
from mqbox.message import java_string_hash
from mqbox.message_kernels import read_s32_be, read_s64_be
from mqbox.store.layout import (
    CQ_ENTRY_LOG_OFFSET_POSITION_BYTES,
    CQ_ENTRY_SIZE_BYTES,
    CQ_ENTRY_SIZE_POSITION_BYTES,
    CQ_ENTRY_TAG_HASH_POSITION_BYTES,
)

# PULL response codes (docs/protocol.md section 3.2); the store does not import protocol/.
PULL_SUCCESS: Final = 0
PULL_NOT_FOUND: Final = 19
PULL_RETRY_IMMEDIATELY: Final = 20
PULL_OFFSET_MOVED: Final = 21

# Java's page-cache limits (maxTransferCountOnMessageInMemory, maxTransferBytesOnMessageInMemory).
PULL_MESSAGE_COUNT_MAX: Final = 32
PULL_SIZE_BYTES_MAX: Final = 256 * 1024
SCAN_WINDOW_SIZE_BYTES_MIN: Final = 16000  # maxFilterMessageCount
SCAN_WINDOW_ENTRY_COUNT_MIN: Final = SCAN_WINDOW_SIZE_BYTES_MIN // CQ_ENTRY_SIZE_BYTES
assert SCAN_WINDOW_ENTRY_COUNT_MIN == 800

NO_TAG_FILTER: Final = np.empty(0, dtype=np.int64)
NO_TAG_FILTER.flags.writeable = False


class GetMessageStatus(enum.Enum):
    """RocketMQ's GetMessageStatus: what a read of (topic, queue, index) found."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"  # entries scanned, none passed the tag filter
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"  # the records were deleted by retention
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"  # the consume-queue segment is gone
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"  # index > max offset
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"  # index == max offset: nothing new yet
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"  # index < min offset
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"  # no such queue
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"  # the queue's max offset is 0


def pull_response_code(status: GetMessageStatus, queue_index: int) -> int:
    """The PULL response code RocketMQ's PullMessageProcessor answers for `status` when the
    consumer asked for `queue_index`: 0 found, 19 nothing new (held when SUSPEND is set),
    20 retry at once, 21 offset moved (the client jumps to nextBeginOffset). Clients report
    them as PullStatus FOUND, NO_NEW_MSG, NO_MATCHED_MSG and OFFSET_ILLEGAL."""
    if status is GetMessageStatus.FOUND:
        return PULL_SUCCESS
    if status in (GetMessageStatus.NO_MATCHED_MESSAGE, GetMessageStatus.MESSAGE_WAS_REMOVING):
        return PULL_RETRY_IMMEDIATELY
    if status in (GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, GetMessageStatus.NO_MESSAGE_IN_QUEUE):
        return PULL_OFFSET_MOVED if queue_index != 0 else PULL_NOT_FOUND
    if status in (GetMessageStatus.OFFSET_FOUND_NULL, GetMessageStatus.OFFSET_OVERFLOW_ONE):
        return PULL_NOT_FOUND
    assert status in (GetMessageStatus.OFFSET_OVERFLOW_BADLY, GetMessageStatus.OFFSET_TOO_SMALL)
    return PULL_OFFSET_MOVED


Run = tuple[int, int, int]
"""(segment_start_bytes, file_offset_bytes, size_bytes): one sendfile from segment
`<20-digit segment_start_bytes>` at file_offset_bytes; log offset = the sum of the first two."""


# A plain slots dataclass, not a frozen one: building a frozen dataclass costs ~1.9 us here
# (object.__setattr__ per field), a fifth of a PULL's whole budget; this one costs ~0.4 us.
# Treat it as immutable all the same.
@dataclasses.dataclass(slots=True)
class ReadPlan:
    """The answer to one read of (topic, queue_id) from `queue_index`.

    `runs` are what the reactor sends after the response header, in order; their sizes add up
    to `size_bytes`, and they hold `message_count` whole records. Empty unless FOUND.
    """

    status: GetMessageStatus
    queue_index: int  # what was asked
    next_queue_index: int  # nextBeginOffset
    min_queue_index: int  # minOffset
    max_queue_index: int  # maxOffset
    message_count: int
    size_bytes: int
    runs: tuple[Run, ...]

    @property
    def pull_response_code(self) -> int:
        """The PULL response code for this plan (see pull_response_code())."""
        return pull_response_code(self.status, self.queue_index)

    def log_offsets_bytes(self) -> list[int]:
        """Start of every run in the commit log."""
        return [segment_start + file_offset for segment_start, file_offset, _size in self.runs]


def plan_for_bounds(
    queue_index: int, min_queue_index: int, max_queue_index: int
) -> ReadPlan | None:
    """The plan when the asked index alone decides it (no scan), else None.

    Section 4.3's table: queue empty (max 0) -> NO_MESSAGE_IN_QUEUE, next 0; index < min ->
    OFFSET_TOO_SMALL, next min; index == max -> OFFSET_OVERFLOW_ONE, next index; index > max ->
    OFFSET_OVERFLOW_BADLY, next 0 if min is 0 else max.
    """
    if max_queue_index == 0:
        status = GetMessageStatus.NO_MESSAGE_IN_QUEUE
        next_queue_index = 0
    elif queue_index < min_queue_index:
        status = GetMessageStatus.OFFSET_TOO_SMALL
        next_queue_index = min_queue_index
    elif queue_index == max_queue_index:
        status = GetMessageStatus.OFFSET_OVERFLOW_ONE
        next_queue_index = queue_index
    elif queue_index > max_queue_index:
        status = GetMessageStatus.OFFSET_OVERFLOW_BADLY
        next_queue_index = 0 if min_queue_index == 0 else max_queue_index
    else:
        return None
    return ReadPlan(
        status, queue_index, next_queue_index, min_queue_index, max_queue_index, 0, 0, ()
    )


def no_queue_plan(queue_index: int) -> ReadPlan:
    """NO_MATCHED_LOGIC_QUEUE: the queue does not exist; next 0, bounds 0."""
    return ReadPlan(GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, queue_index, 0, 0, 0, 0, 0, ())


def scan_entry_count_max(count_max: int) -> int:
    """Entries one read may scan: max(16000, 20 * count_max) bytes of consume queue."""
    assert count_max > 0
    return max(SCAN_WINDOW_ENTRY_COUNT_MIN, count_max)


def tag_filter(tags: Iterable[str]) -> NDArray[np.int64]:
    """The tag-hash filter of a subscription's tags (Java hashCode each); none means all."""
    hashes = sorted({java_string_hash(tag) for tag in tags})
    if not hashes:
        return NO_TAG_FILTER
    array = np.array(hashes, dtype=np.int64)
    array.flags.writeable = False
    return array


# --- plan_read ----------------------------------------------------------------------------------

PLAN_BAD_ENTRY: Final = -1  # run_count when an entry in the window is not written (a bug)


@kernel
def plan_read(
    cq_segment: NDArray[np.uint8],
    first_entry: int,
    entry_count: int,
    tag_hashes: NDArray[np.int64],
    count_max: int,
    size_bytes_max: int,
    commit_log_segment_size_bytes: int,
    commit_log_min_offset_bytes: int,
    out_runs: NDArray[np.int64],
) -> tuple[int, int, int, int, int, int, int, int]:
    """Scan entries [first_entry, first_entry + entry_count) of one consume-queue segment.

    Returns (run_count, scanned_count, message_count, size_bytes, removed_count, and the first
    run's segment start, file offset and size, or zeros), following the module docstring's
    rules. out_runs[r] = (segment start, file offset, size) for r < run_count; it must have at
    least count_max rows. run_count is PLAN_BAD_ENTRY if an entry has size <= 0 or a negative
    log offset: the caller bounded the window by entries written, so that is a bug.
    """
    assert first_entry >= 0
    assert (first_entry + entry_count) * CQ_ENTRY_SIZE_BYTES <= cq_segment.size
    assert out_runs.shape[0] >= count_max
    assert count_max > 0
    tag_count = tag_hashes.size
    run_count = 0
    scanned_count = 0
    message_count = 0
    size_bytes_total = 0
    removed_count = 0
    run_start_bytes = -1
    run_end_bytes = -1
    for entry in range(first_entry, first_entry + entry_count):
        at = entry * CQ_ENTRY_SIZE_BYTES
        log_offset_bytes = read_s64_be(cq_segment, at + CQ_ENTRY_LOG_OFFSET_POSITION_BYTES)
        size_bytes = read_s32_be(cq_segment, at + CQ_ENTRY_SIZE_POSITION_BYTES)
        if size_bytes <= 0 or log_offset_bytes < 0:
            return PLAN_BAD_ENTRY, scanned_count, 0, 0, 0, 0, 0, 0
        if message_count > 0 and (
            message_count >= count_max or size_bytes_total + size_bytes > size_bytes_max
        ):
            break
        scanned_count += 1
        if tag_count > 0:
            tag_hash = read_s64_be(cq_segment, at + CQ_ENTRY_TAG_HASH_POSITION_BYTES)
            matched = False
            for index in range(tag_count):
                if tag_hashes[index] == tag_hash:
                    matched = True
                    break
            if not matched:
                continue
        if log_offset_bytes < commit_log_min_offset_bytes:
            removed_count += 1
            continue
        segment_start_bytes = log_offset_bytes - log_offset_bytes % commit_log_segment_size_bytes
        if (
            run_count > 0
            and log_offset_bytes == run_end_bytes
            and run_start_bytes - run_start_bytes % commit_log_segment_size_bytes
            == segment_start_bytes
        ):
            out_runs[run_count - 1, 2] += size_bytes
        else:
            out_runs[run_count, 0] = segment_start_bytes
            out_runs[run_count, 1] = log_offset_bytes - segment_start_bytes
            out_runs[run_count, 2] = size_bytes
            run_start_bytes = log_offset_bytes
            run_count += 1
        run_end_bytes = log_offset_bytes + size_bytes
        message_count += 1
        size_bytes_total += size_bytes
    if run_count == 0:
        return 0, scanned_count, 0, 0, removed_count, 0, 0, 0
    return (
        run_count,
        scanned_count,
        message_count,
        size_bytes_total,
        removed_count,
        int(out_runs[0, 0]),
        int(out_runs[0, 1]),
        int(out_runs[0, 2]),
    )


def warm_up_plan_kernel() -> None:
    """Compile (or load) plan_read for read-write and read-only segment views."""
    segment = np.zeros(CQ_ENTRY_SIZE_BYTES, dtype=np.uint8)
    segment[CQ_ENTRY_SIZE_POSITION_BYTES + 3] = 100
    out_runs = np.zeros((1, 3), dtype=np.int64)
    for writable in (True, False):
        segment.flags.writeable = writable
        for tags in (NO_TAG_FILTER, np.zeros(1, dtype=np.int64)):
            result = plan_read(segment, 0, 1, tags, 1, 1 << 20, 1 << 30, 0, out_runs)
            assert result[0] == 1
