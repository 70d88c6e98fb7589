"""Recovery at open: where the valid commit log ends, what is cut, and what is dispatched again.

Owns: the `abort` marker (created, fsync'd, at open; removed, fsync'd, at a clean close), the
CRC scan of the commit log tail (`recover_scan`, segments in parallel threads over the nogil
`kernels.scan_records`), the decision where the log ends and whether a damaged tail may be cut,
the cut itself (`truncate_commit_log`), the matching cuts of the derived files
(`cut_consume_queues`, `cut_index`), and the position from which the dispatcher rebuilds them.
`recover()` runs all of it once, in the process that owns the writable store, before any reader
starts and before the first append.

Never: appends records, assigns queue offsets (the writer takes them from the consume queues'
lengths afterwards), decides anything about a record from outside the store, or touches a
socket. It writes the store's files only through mapped_file's tools (truncate, fsync).

Theory of operation.

1. The abort file. `create_abort_file()` runs at open, before anything is changed, and says
   whether the marker was already there: if so the last run did not reach `remove_abort_file()`
   at the end of a clean close, and every file may hold a torn tail.

2. Clean stop (no marker). A clean close dispatched and flushed everything, so the consume queues
   and the index are complete. Recovery still checks instead of trusting: it CRC-scans the last
   `clean_scan_segment_count` segments (RocketMQ scans the last 3 after a normal shutdown), and
   checks each consume queue's newest entry and the index's newest key against the record they
   point at (the paired check of what the dispatcher wrote). Any surprise sends it down the
   unclean path, which costs time but never data.

3. Unclean stop. The checkpoint says how far each file type was known durable, by log offset
   (physic: every commit-log byte below it was flushed; logics: every record below it has its
   consume-queue entry flushed; index: its keys). Offsets, unlike store times, cannot be moved
   by a wall clock that steps back (NTP at boot, a VM snapshot restored), so recovery goes by
   them; a byte that no flush covered may be anything: torn, zero, or garbage. So:
   - The CRC scan starts at the segment holding the last flushed byte and runs to the end.
     Earlier segments were flushed whole; they are not read again (a full scan of a large log
     would cost a second per GiB at every start). The scan's start is a segment start, hence a
     record boundary, and every record from there is checked (magic, sizes, PHYSICALOFFSET,
     CRC), so the flushed records of that segment are checked again and a flushed end at a
     segment start is checked through the blank before it.
   - The log ends at the first record that fails a check. A valid blank sends the scan to the
     next segment's start. Past the flushed offset, recovery also asks whether the writer
     finished each record (`find_unfinished_record`), from facts the writer guarantees and no
     client chooses: STORETIMESTAMP > 0, no zero byte in the (validated) topic, properties
     empty or ending with 0x02 (the send path adds the final 0x02, so a record's last byte is
     never zero). A client's NUL bytes in a body or a property never decide what is cut. A
     process killed mid-append leaves no half record to find: the append kernel stores a
     record's size and magic after every other byte (commit_log.append_batch_kernel), and a
     kill keeps the page cache. A power loss may lose any unflushed page; a lost page at a
     record's end or over its body is caught, one strictly inside a property value of more
     than a page is not (RocketMQ 5's whole-record CRC32 property would be). Whatever follows
     the end (the rest of the segment, later segments) is zeroed or deleted
     (MappedFileQueue.truncate), and the kept tail is fsync'd before the write position is
     declared flushed.
   - Damage below the flushed offset is not a crash tear; it is lost or corrupted durable data
     (a disk or a file system that broke its promise, or bit rot). Cutting there would silently
     drop acknowledged messages, so `recover()` raises StoreError naming the segment file, the
     offset and the repair command, unless the caller passes `truncate_flushed_damage=True`
     (`mqbox store repair`; RocketMQ always cuts): then the bytes cut are first copied to
     `cut_copy_directory`.
   - Consume queues keep the entries of records below the logics offset, the index the keys of
     records below the index offset (both bounded by the end of the log). Each queue's cut is
     found by binary search over a predicate that is true on that durable prefix and false
     after it: the entry is well-formed, its record ends before the bound, and the record at
     its log offset has exactly its size, topic, queue id and QUEUEOFFSET == the entry's queue
     index. Torn entries (zeros, or a mix of old and new sectors) and entries of records past
     the bound all fail it. The index file holding the bound is cut the same way (the key hash
     must be one of the record's keys), newer index files are deleted, and the surviving newest
     file gets its hash slots rebuilt from its kept entries, because slot pages written after
     the flush may point at lost entries. Records from the lesser bound on are dispatched again,
     those below the logics bound for their keys alone: the consume queues and the index then
     agree with the commit log record for record. In the appliance the index bound is the lesser
     one, up to a minute of traffic behind (the dispatcher flushes the index every
     mqboxFlushIntervalIndexMs, the consume queues every second; roles/dispatcher.py).
   - A checkpoint written before the offsets existed (or by RocketMQ) has only the three store
     times; recovery then goes by them as RocketMQ does (`_plan_by_times`): the scan starts at
     the last segment whose first record was stored before `physic - margin`, damage is a
     checkpoint time newer than the last valid record, and the derived bounds come from the
     other two times. The next checkpoint written carries offsets.

4. Queue offsets. After recovery each queue's next index is its consume queue's entry count; the
   commit log writer starts its count there (QueueIndexTable's initial_queue_index). A record
   whose QUEUEOFFSET disagrees with the queue's next index during the re-dispatch is a writer bug
   or corruption of durable state, never a crash tear (tears are cut before dispatch): the
   dispatcher raises StoreError and recovery lets it through. Renumbering would make consumers,
   which commit offsets from QUEUEOFFSET, skip or repeat messages.

Invariants (asserted or checked on both sides): the returned write position is a record boundary
or a segment start after a blank; every record below it passed the scan's checks or lies in the
checkpoint-vouched prefix; no consume-queue entry or index key points at or past it; the
dispatcher resumes at `redispatch_from_log_offset_bytes` <= write position.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Final

import numpy as np
from numpy.typing import NDArray

from mqbox._jit import kernel
from mqbox.errors import MessageIllegalError, StoreError
from mqbox.message import (
    BODY_LENGTH_POSITION_BYTES,
    BODY_POSITION_BYTES,
    MAGICCODE_POSITION_BYTES,
    MESSAGE_MAGIC,
    PHYSICALOFFSET_POSITION_BYTES,
    PROPERTIES_LENGTH_SIZE_BYTES,
    PROPERTY_KEYS,
    PROPERTY_KEYS_SEPARATOR,
    PROPERTY_SEPARATOR,
    PROPERTY_UNIQ_KEY,
    QUEUEID_POSITION_BYTES,
    QUEUEOFFSET_POSITION_BYTES,
    RECORD_SIZE_BYTES_MIN,
    STORETIMESTAMP_POSITION_BYTES,
    TOPIC_LENGTH_SIZE_BYTES,
    TOTALSIZE_POSITION_BYTES,
    MessageToStore,
    decode_properties_str,
    decode_record,
    encode_record,
    index_key_hash,
)
from mqbox.message_kernels import (
    LOG_OFFSET_UNKNOWN,
    RECORD_WHOLE,
    STOP_BLANK,
    STOP_CRC_MISMATCH,
    STOP_END,
    STOP_FULL,
    STOP_INVALID,
    STOP_OFFSET_MISMATCH,
    STOP_REASON_COUNT,
    STOP_TRUNCATED,
    check_record,
    read_s32_be,
    read_s64_be,
)
from mqbox.store.checkpoint import Checkpoint, CheckpointState
from mqbox.store.commit_log import CommitLog
from mqbox.store.consume_queue import ConsumeQueueTable
from mqbox.store.dispatch import Dispatcher
from mqbox.store.index import IndexService
from mqbox.store.kernels import scan_records
from mqbox.store.layout import (
    CQ_ENTRY_SIZE_BYTES,
    DIRECTORY_MODE,
    FILE_MODE,
    INDEX_COUNT_INITIAL,
    INDEX_ENTRY_DTYPE,
    INDEX_ENTRY_SIZE_BYTES,
    INDEX_HEADER_DTYPE,
    INDEX_HEADER_SIZE_BYTES,
    abort_path,
    consume_queue_dir,
    index_entries_position_bytes,
    parse_index_file_name,
    segment_name,
)
from mqbox.store.mapped_file import (
    MappedFile,
    MappedFileQueue,
    data_end_bytes,
    fsync_directory,
    store_error,
)

# RocketMQ scans the last three commit-log files after a normal shutdown.
CLEAN_SCAN_SEGMENT_COUNT_DEFAULT: Final = 3
# Slack for wall-clock steps between store timestamps and the checkpoint (RocketMQ allows 3 s
# on the index timestamp). A larger margin only re-checks and re-dispatches a little more.
TIMESTAMP_MARGIN_MS_DEFAULT: Final = 3000
# Records one scan_records call reports before the parent collects them (3 MB of outputs).
SCAN_RECORD_COUNT_MAX: Final = 65536
# Zero checks read at most this much at a time.
CHUNK_SIZE_BYTES: Final = 16 * 1024 * 1024
# Recovery's own stop reason, beyond the record check's: a whole record the writer did not
# finish (see find_unfinished_record).
STOP_UNFINISHED_RECORD: Final = STOP_REASON_COUNT

STOP_REASON_NAMES: Final = {
    STOP_END: "end",
    STOP_FULL: "full",
    STOP_BLANK: "bad blank",
    STOP_TRUNCATED: "truncated record",
    STOP_INVALID: "invalid record",
    STOP_CRC_MISMATCH: "body CRC mismatch",
    STOP_OFFSET_MISMATCH: "PHYSICALOFFSET mismatch",
    STOP_UNFINISHED_RECORD: "unfinished record (store time 0, or a lost page at its end)",
}
assert STOP_UNFINISHED_RECORD >= STOP_REASON_COUNT

_INT32_BE = struct.Struct(">i")
_INT64_BE = struct.Struct(">q")
_CQ_ENTRY = struct.Struct(">qiq")
_SIZE_AND_MAGIC = struct.Struct(">iI")
assert _CQ_ENTRY.size == CQ_ENTRY_SIZE_BYTES
assert TOTALSIZE_POSITION_BYTES == 0
assert MAGICCODE_POSITION_BYTES == 4


# ---------------------------------------------------------------------------------------------
# The abort marker
# ---------------------------------------------------------------------------------------------


def abort_file_exists(store_root: Path) -> bool:
    """True when `store_root/abort` exists: the store is open, or its last run stopped uncleanly."""
    return abort_path(store_root).exists()


def create_abort_file(store_root: Path) -> bool:
    """Mark the store as running, durably; return True if the marker was already there.

    Call it at open, before anything in the store changes. True means the last run ended
    without `remove_abort_file()`: recover(was_clean=False).
    """
    path = abort_path(store_root)
    existed = path.exists()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as error:
        raise store_error(error, "create", path) from error
    fsync_directory(store_root)
    return existed


def remove_abort_file(store_root: Path) -> None:
    """Mark a clean stop, durably. Call it last in close(), after every flush and the checkpoint."""
    path = abort_path(store_root)
    try:
        path.unlink(missing_ok=True)
    except OSError as error:
        raise store_error(error, "delete", path) from error
    fsync_directory(store_root)


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RecoveryReport:
    """What one recovery found and did. Offsets are absolute commit-log bytes."""

    was_clean: bool  # no abort file at open
    clean_path_failed: bool  # the clean checks failed; the unclean path ran instead
    scan_start_log_offset_bytes: int  # the CRC scan began here (a segment start)
    scanned_bytes: int  # bytes the CRC scan walked over
    record_count: int  # valid records the scan found (records recovered)
    write_log_offset_bytes: int  # appends resume here
    truncated_at_log_offset_bytes: int | None  # where a damaged tail was cut; None if none
    truncated_reason: str | None  # why the first cut record failed (STOP_REASON_NAMES)
    flushed_damage: bool  # the cut reached data a flush covered (truncate_flushed_damage)
    cq_entry_dropped_count: int  # consume-queue entries removed (rebuilt by the re-dispatch)
    index_entry_dropped_count: int  # index keys removed (rebuilt by the re-dispatch)
    index_file_deleted_count: int
    redispatch_from_log_offset_bytes: int  # the dispatcher resumes here
    redispatched_record_count: int  # records the re-dispatch reported (0 without a dispatcher)
    duration_ns: int


# ---------------------------------------------------------------------------------------------
# The commit-log scan
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SegmentScan:
    """One segment scanned from `start_file_offset_bytes` until a stop other than FULL."""

    segment_start_bytes: int
    start_file_offset_bytes: int
    record_count: int
    stop_file_offset_bytes: int
    stop_reason: int  # STOP_*; STOP_BLANK only for a valid blank
    last_store_timestamp_ms: int  # -1 without records
    # Per threshold: log offset of the first record stored at or after it, -1 if none here.
    first_log_offsets_bytes: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class SegmentRange:
    """The valid records one segment held from where the scan entered it."""

    segment_start_bytes: int
    start_file_offset_bytes: int
    end_file_offset_bytes: int  # a valid blank's position, or where the records end
    record_count: int
    last_store_timestamp_ms: int  # -1 without records


@dataclasses.dataclass(frozen=True)
class ScanOutcome:
    """Where the valid records of the scanned range end, and what the scan saw on the way."""

    start_log_offset_bytes: int
    end_log_offset_bytes: int  # the first byte not covered by a valid record or blank
    stop_reason: int  # STOP_END when the log ended after a blank with no next segment
    damaged: bool  # some non-zero byte lies at or after the end (or a later segment has data)
    later_segment_count: int  # segments after the one holding the end
    record_count: int
    scanned_bytes: int
    last_store_timestamp_ms: int  # -1 if the range held no record
    # Per threshold: log offset of the first record stored at or after it; the end if none.
    first_log_offsets_bytes: tuple[int, ...]
    # What each scanned segment held, in order.
    segment_ranges: tuple[SegmentRange, ...] = ()


@dataclasses.dataclass(frozen=True)
class _ScanOutputs:
    """The out arrays of one scan_records caller; each scanning thread has its own."""

    log_offsets_bytes: NDArray[np.int64]
    sizes_bytes: NDArray[np.int32]
    queue_ids: NDArray[np.int32]
    queue_indexes: NDArray[np.int64]
    tag_hashes: NDArray[np.int64]
    store_timestamps_ms: NDArray[np.int64]

    @classmethod
    def allocate(cls, capacity: int) -> _ScanOutputs:
        return cls(
            np.empty(capacity, dtype=np.int64),
            np.empty(capacity, dtype=np.int32),
            np.empty(capacity, dtype=np.int32),
            np.empty(capacity, dtype=np.int64),
            np.empty(capacity, dtype=np.int64),
            np.empty(capacity, dtype=np.int64),
        )


def scan_segment(
    buffer: NDArray[np.uint8],
    segment_start_bytes: int,
    start_file_offset_bytes: int,
    check_crc: bool,
    thresholds_ms: Sequence[int],
) -> SegmentScan:
    """Scan one segment with scan_records until it stops for a reason other than FULL.

    A blank is accepted only if its size field says exactly how many bytes were left in the
    segment; a blank that does not is reported as STOP_INVALID at its position. Runs
    without the GIL for the long part (the kernel), so threads scan segments in parallel.
    """
    segment_size_bytes = buffer.size
    assert 0 <= start_file_offset_bytes <= segment_size_bytes
    outs = _ScanOutputs.allocate(SCAN_RECORD_COUNT_MAX)
    position_bytes = start_file_offset_bytes
    record_count = 0
    last_store_timestamp_ms = -1
    first_log_offsets = [-1] * len(thresholds_ms)
    while True:
        count, stop_bytes, reason = scan_records(
            buffer,
            position_bytes,
            segment_size_bytes,
            segment_start_bytes,
            check_crc,
            outs.log_offsets_bytes,
            outs.sizes_bytes,
            outs.queue_ids,
            outs.queue_indexes,
            outs.tag_hashes,
            outs.store_timestamps_ms,
        )
        assert stop_bytes >= position_bytes
        if count > 0:
            record_count += count
            timestamps = outs.store_timestamps_ms[:count]
            last_store_timestamp_ms = int(timestamps[-1])
            for position, threshold_ms in enumerate(thresholds_ms):
                if first_log_offsets[position] >= 0:
                    continue
                hits = np.flatnonzero(timestamps >= threshold_ms)
                if hits.size > 0:
                    first_log_offsets[position] = int(outs.log_offsets_bytes[hits[0]])
        position_bytes = stop_bytes
        if reason == STOP_FULL:
            continue
        if reason == STOP_BLANK:
            (left_bytes,) = _INT32_BE.unpack_from(buffer.data, position_bytes)
            if left_bytes != segment_size_bytes - position_bytes:
                reason = STOP_INVALID
        break
    return SegmentScan(
        segment_start_bytes=segment_start_bytes,
        start_file_offset_bytes=start_file_offset_bytes,
        record_count=record_count,
        stop_file_offset_bytes=position_bytes,
        stop_reason=reason,
        last_store_timestamp_ms=last_store_timestamp_ms,
        first_log_offsets_bytes=tuple(first_log_offsets),
    )


def _segment_path(commit_log: CommitLog, segment_start_bytes: int) -> Path:
    return commit_log.directory / segment_name(segment_start_bytes)


def _any_nonzero(buffer: NDArray[np.uint8], start_bytes: int, end_bytes: int) -> bool:
    """True if buffer[start_bytes:end_bytes] holds a non-zero byte (read in chunks)."""
    position_bytes = start_bytes
    while position_bytes < end_bytes:
        chunk_end_bytes = min(position_bytes + CHUNK_SIZE_BYTES, end_bytes)
        if buffer[position_bytes:chunk_end_bytes].any():
            return True
        position_bytes = chunk_end_bytes
    return False


def has_data_at_or_after(commit_log: CommitLog, log_offset_bytes: int) -> bool:
    """True if any non-zero byte of the commit log lies at or after `log_offset_bytes`.

    Reads only what SEEK_DATA/SEEK_HOLE report as data: reading the unwritten part of a
    preallocated 1 GiB segment through the map would fault in a GiB of zero pages (seconds).
    """
    return any(
        _any_nonzero(buffer, from_bytes, end_bytes)
        for _start_bytes, buffer, from_bytes, end_bytes in data_ranges_from(
            commit_log, log_offset_bytes
        )
    )


def data_ranges_from(
    commit_log: CommitLog, log_offset_bytes: int
) -> Iterator[tuple[int, NDArray[np.uint8], int, int]]:
    """(segment start, its view, first file offset, data end) of every segment holding bytes at
    or after `log_offset_bytes` before its data end (SEEK_DATA/SEEK_HOLE: what was written)."""
    segment_size_bytes = commit_log.segment_size_bytes
    for segment_start_bytes in commit_log.segment_starts_bytes:
        if segment_start_bytes + segment_size_bytes <= log_offset_bytes:
            continue
        from_bytes = max(log_offset_bytes - segment_start_bytes, 0)
        end_bytes = data_end_bytes(_segment_path(commit_log, segment_start_bytes))
        if end_bytes <= from_bytes:
            continue
        buffer = commit_log.segment_view(segment_start_bytes)
        assert buffer is not None
        yield segment_start_bytes, buffer, from_bytes, end_bytes


def recover_scan(
    commit_log: CommitLog,
    start_log_offset_bytes: int,
    *,
    check_crc: bool = True,
    thresholds_ms: Sequence[int] = (),
    thread_count: int | None = None,
) -> ScanOutcome:
    """Scan the commit log from `start_log_offset_bytes` (a record boundary) to where its valid
    records end; read-only.

    Every segment after the first starts with a record, so segments are scanned independently,
    `thread_count` at a time (default: the CPUs, at most 4), and their results are joined in
    order: the scan continues into segment k + 1 only if segment k ended with a valid blank.
    """
    segment_size_bytes = commit_log.segment_size_bytes
    starts_bytes = [
        start_bytes
        for start_bytes in commit_log.segment_starts_bytes
        if start_bytes + segment_size_bytes > start_log_offset_bytes
    ]
    threshold_count = len(thresholds_ms)
    if not starts_bytes:
        return ScanOutcome(
            start_log_offset_bytes=start_log_offset_bytes,
            end_log_offset_bytes=start_log_offset_bytes,
            stop_reason=STOP_END,
            damaged=False,
            later_segment_count=0,
            record_count=0,
            scanned_bytes=0,
            last_store_timestamp_ms=-1,
            first_log_offsets_bytes=(start_log_offset_bytes,) * threshold_count,
        )
    assert starts_bytes[0] <= start_log_offset_bytes
    if thread_count is None:
        thread_count = max(1, min(os.cpu_count() or 1, 4))
    assert thread_count >= 1

    def scan_one(segment_start_bytes: int) -> SegmentScan:
        buffer = commit_log.segment_view(segment_start_bytes)
        assert buffer is not None
        start_file_offset_bytes = max(start_log_offset_bytes - segment_start_bytes, 0)
        return scan_segment(
            buffer, segment_start_bytes, start_file_offset_bytes, check_crc, thresholds_ms
        )

    record_count = 0
    last_store_timestamp_ms = -1
    first_log_offsets = [-1] * threshold_count
    end_bytes = start_log_offset_bytes
    stop_reason = STOP_END
    ended = False
    segment_ranges: list[SegmentRange] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=thread_count) as executor:
        window_start = 0
        while not ended and window_start < len(starts_bytes):
            window = starts_bytes[window_start : window_start + thread_count]
            window_start += len(window)
            for result in executor.map(scan_one, window):
                if ended:
                    break
                record_count += result.record_count
                if result.last_store_timestamp_ms >= 0:
                    last_store_timestamp_ms = result.last_store_timestamp_ms
                for position, offset_bytes in enumerate(result.first_log_offsets_bytes):
                    if first_log_offsets[position] < 0 and offset_bytes >= 0:
                        first_log_offsets[position] = offset_bytes
                stop_file_offset_bytes = result.stop_file_offset_bytes
                segment_ranges.append(
                    SegmentRange(
                        result.segment_start_bytes,
                        result.start_file_offset_bytes,
                        stop_file_offset_bytes,
                        result.record_count,
                        result.last_store_timestamp_ms,
                    )
                )
                if result.stop_reason in (STOP_BLANK, STOP_END):
                    # A valid blank (or, never written by mqbox, a record ending exactly at the
                    # segment end): the next record starts the next segment.
                    end_bytes = result.segment_start_bytes + segment_size_bytes
                    stop_reason = STOP_END
                    continue
                end_bytes = result.segment_start_bytes + stop_file_offset_bytes
                stop_reason = result.stop_reason
                ended = True
    # The segment holding the end takes the next append (after a blank, the end is the next
    # segment's start); anything after it is beyond the log.
    holder_start_bytes = end_bytes - end_bytes % segment_size_bytes
    later_segment_count = sum(
        1 for start_bytes in commit_log.segment_starts_bytes if start_bytes > holder_start_bytes
    )
    damaged = has_data_at_or_after(commit_log, end_bytes)
    return ScanOutcome(
        start_log_offset_bytes=start_log_offset_bytes,
        end_log_offset_bytes=end_bytes,
        stop_reason=stop_reason,
        damaged=damaged,
        later_segment_count=later_segment_count,
        record_count=record_count,
        scanned_bytes=end_bytes - start_log_offset_bytes,
        last_store_timestamp_ms=last_store_timestamp_ms,
        first_log_offsets_bytes=tuple(
            offset_bytes if offset_bytes >= 0 else end_bytes for offset_bytes in first_log_offsets
        ),
        segment_ranges=tuple(segment_ranges),
    )


@kernel
def find_unfinished_record(
    segment: NDArray[np.uint8],
    start_bytes: int,
    check_from_bytes: int,
    end_bytes: int,
    check_properties_end: bool,
) -> tuple[int, int, int]:
    """Look for a record the writer did not finish among records scan_records already accepted.

    scan_records checks what a record says about itself (message_kernels.check_record: magic,
    sizes, PHYSICALOFFSET, body CRC). A page of a record that no flush covered may still be lost
    to a power failure while the page holding its header survived; the body CRC does not cover
    the topic and the properties, so this kernel walks the records with the same check (framing
    only: no CRC, no offset) and checks, on top of it, the facts the writer guarantees there,
    never anything a client chose: STORETIMESTAMP > 0 (the writer's own field); no zero byte in
    the topic (topics are validated, and NUL is not a topic character); and, when
    `check_properties_end`, properties that are empty or end with 0x02 (the send path adds the
    final 0x02 a client left off: message.terminate_properties), so a record's last byte is
    never zero. A client's NUL bytes in a body or a property value decide nothing. Records at or
    after `check_from_bytes` are checked. Precondition: segment[start_bytes:end_bytes) holds
    records back to back, every one reported by scan_records (a blank stops the walk), and
    `check_from_bytes` is one of their starts (or end_bytes).

    Returns (position of the first unfinished record, or end_bytes; how many records precede it
    from start_bytes; the store time of the last of those, -1 if none).
    """
    assert 0 <= start_bytes <= check_from_bytes <= end_bytes <= segment.size
    position_bytes = start_bytes
    good_count = 0
    last_good_timestamp_ms = -1
    while position_bytes < end_bytes:
        verdict, size_bytes, _body_at, topic_at, properties_at = check_record(
            segment, position_bytes, end_bytes, LOG_OFFSET_UNKNOWN, False, False
        )
        if verdict == STOP_BLANK:
            break
        assert verdict == RECORD_WHOLE  # the precondition: scan_records reported it
        store_timestamp_ms = read_s64_be(segment, position_bytes + STORETIMESTAMP_POSITION_BYTES)
        if position_bytes >= check_from_bytes:
            if store_timestamp_ms <= 0:
                return position_bytes, good_count, last_good_timestamp_ms
            topic_end = properties_at - PROPERTIES_LENGTH_SIZE_BYTES
            for at in range(topic_at, topic_end):
                if segment[at] == 0:
                    return position_bytes, good_count, last_good_timestamp_ms
            record_end_bytes = position_bytes + size_bytes
            if (
                check_properties_end
                and record_end_bytes > properties_at
                and segment[record_end_bytes - 1] != PROPERTY_SEPARATOR
            ):
                return position_bytes, good_count, last_good_timestamp_ms
        good_count += 1
        last_good_timestamp_ms = store_timestamp_ms
        position_bytes += size_bytes
    return end_bytes, good_count, last_good_timestamp_ms


def warm_up_recovery_kernels() -> None:
    """Compile (or load from numba's cache) the kernels recovery runs, on a tiny private
    buffer, for writable and read-only views; a role calls it before it recovers."""
    record = np.frombuffer(encode_record(MessageToStore("T", 0, b"x")), dtype=np.uint8).copy()
    for writable in (True, False):
        segment = record.copy()
        segment.flags.writeable = writable
        for check_properties_end in (True, False):
            unfinished_bytes, good_count, _last_ms = find_unfinished_record(
                segment, 0, 0, segment.size, check_properties_end
            )
            assert (unfinished_bytes, good_count) == (0, 0)  # store time 0: not a writer's
        scan = scan_segment(segment, 0, 0, True, (0,))
        assert scan.record_count == 1
    entries = np.zeros(3 * INDEX_ENTRY_SIZE_BYTES, dtype=np.uint8)
    entries[2 * INDEX_ENTRY_SIZE_BYTES + 3] = 5  # entry 2's key hash is 5
    heads = np.empty(4, dtype=np.int64)
    assert index_slot_heads(entries, 4, 3, heads) == 2
    assert heads.tolist() == [1, 2, 0, 0]


def cut_unfinished_tail(
    outcome: ScanOutcome,
    commit_log: CommitLog,
    from_log_offset_bytes: int,
    *,
    check_properties_end: bool,
) -> ScanOutcome:
    """The outcome with its end moved back to the first unfinished record at or after
    `from_log_offset_bytes` (find_unfinished_record), or unchanged if there is none.

    Recovery runs it over the records no flush vouches for; those below were whole when flushed.
    """
    record_count = 0
    last_timestamp_ms = -1
    for range_ in outcome.segment_ranges:
        segment_start_bytes = range_.segment_start_bytes
        check_from_bytes = from_log_offset_bytes - segment_start_bytes
        if check_from_bytes < range_.end_file_offset_bytes:
            buffer = commit_log.segment_view(segment_start_bytes)
            assert buffer is not None
            unfinished_bytes, good_count, segment_last_ms = find_unfinished_record(
                buffer,
                range_.start_file_offset_bytes,
                max(check_from_bytes, range_.start_file_offset_bytes),
                range_.end_file_offset_bytes,
                check_properties_end,
            )
            if unfinished_bytes < range_.end_file_offset_bytes:
                end_bytes = segment_start_bytes + unfinished_bytes
                later_segment_count = sum(
                    1
                    for start_bytes in commit_log.segment_starts_bytes
                    if start_bytes > segment_start_bytes
                )
                return dataclasses.replace(
                    outcome,
                    end_log_offset_bytes=end_bytes,
                    stop_reason=STOP_UNFINISHED_RECORD,
                    damaged=True,
                    later_segment_count=later_segment_count,
                    record_count=record_count + good_count,
                    scanned_bytes=end_bytes - outcome.start_log_offset_bytes,
                    last_store_timestamp_ms=(
                        segment_last_ms if segment_last_ms >= 0 else last_timestamp_ms
                    ),
                    first_log_offsets_bytes=tuple(
                        min(offset_bytes, end_bytes)
                        for offset_bytes in outcome.first_log_offsets_bytes
                    ),
                )
            assert good_count == range_.record_count
        record_count += range_.record_count
        if range_.last_store_timestamp_ms >= 0:
            last_timestamp_ms = range_.last_store_timestamp_ms
    return outcome


def first_record_store_timestamp_ms(commit_log: CommitLog, segment_start_bytes: int) -> int | None:
    """STORETIMESTAMP of the record that starts the segment, or None if none starts it."""
    buffer = commit_log.segment_view(segment_start_bytes)
    if buffer is None or buffer.size < RECORD_SIZE_BYTES_MIN:
        return None
    size_bytes, magic = _SIZE_AND_MAGIC.unpack_from(buffer.data, 0)
    if magic != MESSAGE_MAGIC or not RECORD_SIZE_BYTES_MIN <= size_bytes <= buffer.size:
        return None
    (physical_offset_bytes,) = _INT64_BE.unpack_from(buffer.data, PHYSICALOFFSET_POSITION_BYTES)
    if physical_offset_bytes != segment_start_bytes:
        return None
    (store_timestamp_ms,) = _INT64_BE.unpack_from(buffer.data, STORETIMESTAMP_POSITION_BYTES)
    return int(store_timestamp_ms)


def segment_start_before(commit_log: CommitLog, timestamp_ms: int) -> int:
    """Start of the last segment whose first record was stored (store time > 0) before
    `timestamp_ms`; recovery's fallback for a checkpoint without offsets.

    Every record stored at or after `timestamp_ms` lies at or after it (store times grow with
    the log offset). The first segment (0 for an empty log) when none qualifies.
    """
    starts_bytes = commit_log.segment_starts_bytes
    if not starts_bytes:
        return 0
    if timestamp_ms <= 0:
        return starts_bytes[0]
    for segment_start_bytes in reversed(starts_bytes):
        store_timestamp_ms = first_record_store_timestamp_ms(commit_log, segment_start_bytes)
        # A first record with no store time is one the writer had not finished: it says
        # nothing about when the segment began, so look further back.
        if store_timestamp_ms is not None and 0 < store_timestamp_ms < timestamp_ms:
            return segment_start_bytes
    return starts_bytes[0]


# ---------------------------------------------------------------------------------------------
# Cutting the commit log
# ---------------------------------------------------------------------------------------------


def truncate_commit_log(commit_log: CommitLog, log_offset_bytes: int) -> None:
    """Zero every commit-log byte at or after `log_offset_bytes`, durably, and re-list.

    MappedFileQueue.truncate deletes the segments after the one holding the cut and zeroes that
    one from the cut on (ftruncate down and up). The kept segment's blocks are then reserved
    again (posix_fallocate), as the writer's segments are, so a full disk still shows up as
    DiskFullError at a roll and not as SIGBUS on a write through the map. The CommitLog drops
    its maps and lists the directory again (`load()`); its write position must be set after.
    """
    assert commit_log.writable
    segments = MappedFileQueue(
        commit_log.directory, commit_log.segment_size_bytes, writable=True, reserve_disk=True
    )
    segments.load()
    commit_log.close()
    segments.truncate(log_offset_bytes)
    starts_bytes = segments.segment_starts_bytes
    if starts_bytes:
        path = segments.segment_path(starts_bytes[-1])
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            try:
                os.posix_fallocate(fd, 0, commit_log.segment_size_bytes)
            finally:
                os.close(fd)
        except OSError as error:
            raise store_error(error, "reserve", path) from error
    segments.close()
    commit_log.load()


def fsync_segments_from(commit_log: CommitLog, log_offset_bytes: int) -> None:
    """fdatasync every segment holding bytes at or after `log_offset_bytes` (what a crash may
    have left only in the page cache), so the kept tail can count as flushed."""
    segment_size_bytes = commit_log.segment_size_bytes
    for segment_start_bytes in commit_log.segment_starts_bytes:
        if segment_start_bytes + segment_size_bytes <= log_offset_bytes:
            continue
        path = _segment_path(commit_log, segment_start_bytes)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
        except OSError as error:
            raise store_error(error, "fsync", path) from error
    if commit_log.directory.is_dir():
        fsync_directory(commit_log.directory)


# ---------------------------------------------------------------------------------------------
# Paired checks: a derived entry against the record it points at
# ---------------------------------------------------------------------------------------------


def cq_entry_matches_record(
    commit_log: CommitLog,
    end_log_offset_bytes: int,
    topic_bytes: bytes,
    queue_id: int,
    queue_index: int,
    log_offset_bytes: int,
    size_bytes: int,
) -> bool:
    """True when the record at `log_offset_bytes` is whole below `end_log_offset_bytes` and has
    exactly this size, topic, queue id and QUEUEOFFSET == `queue_index`.

    A record already deleted by retention cannot be checked and counts as matching.
    """
    if size_bytes < RECORD_SIZE_BYTES_MIN or log_offset_bytes < 0:
        return False
    if log_offset_bytes + size_bytes > end_log_offset_bytes:
        return False
    if log_offset_bytes < commit_log.min_log_offset_bytes:
        return True
    record = commit_log.read_record(log_offset_bytes, end_log_offset_bytes)
    if record is None or len(record) != size_bytes:
        return False
    (record_queue_id,) = _INT32_BE.unpack_from(record, QUEUEID_POSITION_BYTES)
    (record_queue_index,) = _INT64_BE.unpack_from(record, QUEUEOFFSET_POSITION_BYTES)
    if record_queue_id != queue_id or record_queue_index != queue_index:
        return False
    (body_size_bytes,) = _INT32_BE.unpack_from(record, BODY_LENGTH_POSITION_BYTES)
    topic_length_at = BODY_POSITION_BYTES + body_size_bytes
    if body_size_bytes < 0 or topic_length_at >= size_bytes:
        return False
    topic_at = topic_length_at + TOPIC_LENGTH_SIZE_BYTES
    return record[topic_at : topic_at + record[topic_length_at]] == topic_bytes


def index_entry_matches_record(
    commit_log: CommitLog, end_log_offset_bytes: int, key_hash: int, log_offset_bytes: int
) -> bool:
    """True when the record at `log_offset_bytes` is whole below `end_log_offset_bytes` and one
    of its keys (UNIQ_KEY, each KEYS token) hashes to `key_hash` under its topic.

    A record already deleted by retention cannot be checked and counts as matching.
    """
    if key_hash < 0 or log_offset_bytes < 0 or log_offset_bytes >= end_log_offset_bytes:
        return False
    if log_offset_bytes < commit_log.min_log_offset_bytes:
        return True
    record = commit_log.read_record(log_offset_bytes, end_log_offset_bytes)
    if record is None:
        return False
    try:
        message = decode_record(record, check_crc=False)
        properties = decode_properties_str(message.properties)
    except (MessageIllegalError, UnicodeDecodeError):
        return False
    keys = [key for key in properties.get(PROPERTY_KEYS, "").split(PROPERTY_KEYS_SEPARATOR) if key]
    uniq_key = properties.get(PROPERTY_UNIQ_KEY)
    if uniq_key:
        keys.append(uniq_key)
    return any(index_key_hash(message.topic, key) == key_hash for key in keys)


def _first_false(low: int, high: int, predicate_true_at: Callable[[int], bool]) -> int:
    """The first index in [low, high) where the predicate is false (high if none), for a
    predicate that is true on a prefix and false after it."""
    while low < high:
        middle = (low + high) // 2
        if predicate_true_at(middle):
            low = middle + 1
        else:
            high = middle
    return low


# ---------------------------------------------------------------------------------------------
# Cutting the consume queues
# ---------------------------------------------------------------------------------------------


class _CqEntryIsDurable:
    """Entry i of a queue's files is well-formed, its record ends at or before `keep_end` and
    the record matches it (cq_entry_matches_record)."""

    def __init__(
        self,
        segments: MappedFileQueue,
        segment_entry_count: int,
        commit_log: CommitLog,
        keep_end_log_offset_bytes: int,
        topic: str,
        queue_id: int,
    ):
        self.segments = segments
        self.segment_entry_count = segment_entry_count
        self.commit_log = commit_log
        self.keep_end_log_offset_bytes = keep_end_log_offset_bytes
        self.topic_bytes = topic.encode("utf-8", "surrogateescape")
        self.queue_id = queue_id

    def __call__(self, queue_index: int) -> bool:
        byte_offset = queue_index * CQ_ENTRY_SIZE_BYTES
        segment = self.segments.segment(self.segments.segment_start_bytes(byte_offset))
        at = (queue_index % self.segment_entry_count) * CQ_ENTRY_SIZE_BYTES
        log_offset_bytes, size_bytes, _tag_hash = _CQ_ENTRY.unpack_from(segment.buffer.data, at)
        return cq_entry_matches_record(
            self.commit_log,
            self.keep_end_log_offset_bytes,
            self.topic_bytes,
            self.queue_id,
            queue_index,
            log_offset_bytes,
            size_bytes,
        )


def _entry_ceiling_bytes(data_end_bytes: int, segment_size_bytes: int) -> int:
    """The end of the entry slot holding byte data_end - 1 (a torn entry counts whole)."""
    return min(-(-data_end_bytes // CQ_ENTRY_SIZE_BYTES) * CQ_ENTRY_SIZE_BYTES, segment_size_bytes)


def _count_written_entries(segments: MappedFileQueue, from_bytes: int) -> int:
    """How many 20-byte entry slots at or after byte `from_bytes` hold a non-zero byte."""
    written_count = 0
    segment_size_bytes = segments.segment_size_bytes
    for segment_start_bytes in segments.segment_starts_bytes:
        if segment_start_bytes + segment_size_bytes <= from_bytes:
            continue
        first_bytes = max(from_bytes - segment_start_bytes, 0)
        end_bytes = _entry_ceiling_bytes(
            data_end_bytes(segments.segment_path(segment_start_bytes)), segment_size_bytes
        )
        if end_bytes <= first_bytes:
            continue
        buffer = segments.segment(segment_start_bytes).buffer
        raw = buffer[first_bytes:end_bytes].reshape(-1, CQ_ENTRY_SIZE_BYTES)
        written_count += int(np.count_nonzero(raw.any(axis=1)))
    return written_count


def cut_consume_queue_files(
    consume_queues: ConsumeQueueTable,
    commit_log: CommitLog,
    keep_end_log_offset_bytes: int,
    topic: str,
    queue_id: int,
) -> int:
    """Cut one queue's files after its last durable entry (see _CqEntryIsDurable); return how
    many written entries were dropped. Works on the files, not on an open ConsumeQueue."""
    geometry = consume_queues.geometry
    directory = consume_queue_dir(consume_queues.store_root, topic, queue_id)
    segments = MappedFileQueue(directory, geometry.cq_segment_size_bytes, writable=True)
    try:
        segments.load()
        starts_bytes = segments.segment_starts_bytes
        if not starts_bytes:
            return 0
        last_start_bytes = starts_bytes[-1]
        last_end_bytes = _entry_ceiling_bytes(
            data_end_bytes(segments.segment_path(last_start_bytes)),
            geometry.cq_segment_size_bytes,
        )
        # Entries lie in [low, high): the first segment's first slot to the last data written.
        low = starts_bytes[0] // CQ_ENTRY_SIZE_BYTES
        high = (last_start_bytes + last_end_bytes) // CQ_ENTRY_SIZE_BYTES
        predicate = _CqEntryIsDurable(
            segments,
            geometry.cq_segment_entry_count,
            commit_log,
            keep_end_log_offset_bytes,
            topic,
            queue_id,
        )
        cut_queue_index = _first_false(low, high, predicate)
        cut_bytes = cut_queue_index * CQ_ENTRY_SIZE_BYTES
        dropped_count = _count_written_entries(segments, cut_bytes)
        later_segment = any(
            start_bytes > segments.segment_start_bytes(cut_bytes) for start_bytes in starts_bytes
        )
        if dropped_count > 0 or later_segment:
            segments.truncate(cut_bytes)
        return dropped_count
    finally:
        segments.close()


def correct_min_queue_indexes(consume_queues: ConsumeQueueTable, min_log_offset_bytes: int) -> None:
    """Move every open queue's min_queue_index to its first entry still in the commit log
    (RocketMQ's correctMinOffset): retention may have deleted log segments whose consume-queue
    segments it had not deleted yet when the broker stopped."""
    for queue in consume_queues.queues():
        queue.correct_min_queue_index(min_log_offset_bytes)


def cut_consume_queues(
    consume_queues: ConsumeQueueTable, commit_log: CommitLog, keep_end_log_offset_bytes: int
) -> int:
    """In every queue on disk, keep the entries that are durable and point at records ending at
    or before `keep_end_log_offset_bytes`; zero the rest. Queues the table already opened are
    recovered again from their files. Returns how many written entries were dropped."""
    assert consume_queues.writable
    dropped_count = 0
    for topic, queue_id in consume_queues.queue_keys_on_disk():
        dropped_count += cut_consume_queue_files(
            consume_queues, commit_log, keep_end_log_offset_bytes, topic, queue_id
        )
    for queue in consume_queues.queues():
        queue.recover()
    return dropped_count


# ---------------------------------------------------------------------------------------------
# Cutting the index
# ---------------------------------------------------------------------------------------------


class _IndexEntryIsDurable:
    """Entry n of an index file is well-formed (key hash and time not negative, prev_index
    below n), its record starts before `keep_end` and has the key (index_entry_matches_record)."""

    def __init__(
        self,
        entries: NDArray[np.void],
        commit_log: CommitLog,
        keep_end_log_offset_bytes: int,
        end_log_offset_bytes: int,
    ):
        self.entries = entries
        self.commit_log = commit_log
        self.keep_end_log_offset_bytes = keep_end_log_offset_bytes
        self.end_log_offset_bytes = end_log_offset_bytes

    def __call__(self, number: int) -> bool:
        entry = self.entries[number]
        key_hash = int(entry["key_hash"])
        log_offset_bytes = int(entry["log_offset_bytes"])
        previous = int(entry["prev_index"])
        if int(entry["time_diff_s"]) < 0 or not 0 <= previous < number:
            return False
        if log_offset_bytes >= self.keep_end_log_offset_bytes:
            return False
        return index_entry_matches_record(
            self.commit_log, self.end_log_offset_bytes, key_hash, log_offset_bytes
        )


@dataclasses.dataclass(frozen=True)
class IndexCut:
    """What cut_index did."""

    entry_dropped_count: int
    file_deleted_count: int


@kernel
def index_slot_heads(
    entries: NDArray[np.uint8], slot_count: int, kept_count: int, out_heads: NDArray[np.int64]
) -> int:
    """Fill out_heads[s] with the newest entry number n in [1, kept_count) whose key hash falls
    in slot s (0 if none), reading the big-endian key hash of entry n at entries[20 * n:];
    return how many slots are used. One pass in entry order: later entries overwrite."""
    assert out_heads.size == slot_count
    assert entries.size >= kept_count * INDEX_ENTRY_SIZE_BYTES
    for slot in range(slot_count):
        out_heads[slot] = 0
    used_count = 0
    for number in range(INDEX_COUNT_INITIAL, kept_count):
        key_hash = read_s32_be(entries, number * INDEX_ENTRY_SIZE_BYTES)
        slot = key_hash % slot_count
        if out_heads[slot] == 0:
            used_count += 1
        out_heads[slot] = number
    return used_count


def _rebuild_index_file(
    mapped_file: MappedFile,
    slot_count: int,
    kept_count: int,
    end_timestamp_ms: int,
    end_log_offset_bytes: int,
) -> None:
    """Make entries [1, kept_count) the whole content of an index file: slots point at the
    newest kept entry of each slot, the header counts them. Entries themselves are unchanged."""
    buffer = mapped_file.buffer
    entries_position_bytes = index_entries_position_bytes(slot_count)
    slots = buffer[INDEX_HEADER_SIZE_BYTES:entries_position_bytes].view(">i4")
    assert slots.size == slot_count
    heads = np.empty(slot_count, dtype=np.int64)
    used_count = index_slot_heads(
        buffer[
            entries_position_bytes : entries_position_bytes + kept_count * INDEX_ENTRY_SIZE_BYTES
        ],
        slot_count,
        kept_count,
        heads,
    )
    slots[:] = heads
    header = buffer[:INDEX_HEADER_SIZE_BYTES].view(INDEX_HEADER_DTYPE)
    header["end_timestamp_ms"] = end_timestamp_ms
    header["end_log_offset_bytes"] = end_log_offset_bytes
    header["slots_used"] = used_count
    header["index_count"] = kept_count
    mapped_file.flush()


def cut_index(
    index: IndexService,
    commit_log: CommitLog,
    keep_end_log_offset_bytes: int,
    end_log_offset_bytes: int,
) -> IndexCut:
    """Keep the durable keys of records starting before `keep_end_log_offset_bytes`; drop the rest.

    Files are visited newest first. A file whose first entry is not durable is deleted; in the
    first file that keeps anything, the cut is found by binary search (_IndexEntryIsDurable) and
    its slots are rebuilt from the kept entries, even when nothing is cut: after an unclean stop
    its slot pages may be newer than its header. Older files were flushed whole when the index
    rolled past them and are left alone. The service is closed during the work and loaded again.
    """
    assert index.writable
    geometry = index.geometry
    index.close()
    paths: list[Path] = []
    if index.directory.is_dir():
        paths = sorted(
            path
            for path in index.directory.iterdir()
            if parse_index_file_name(path.name) is not None and path.is_file()
        )
    entry_dropped_count = 0
    file_deleted_count = 0
    entries_position_bytes = index_entries_position_bytes(geometry.index_slot_count)
    for path in reversed(paths):
        try:
            size_bytes = path.stat().st_size
        except OSError as error:
            raise store_error(error, "stat", path) from error
        if size_bytes != geometry.index_file_size_bytes:
            # Only a creation cut short by a crash leaves a short file; nothing was put in it.
            _delete_file(path)
            file_deleted_count += 1
            continue
        mapped_file = MappedFile.open(path, geometry.index_file_size_bytes, writable=True)
        try:
            buffer = mapped_file.buffer
            header = buffer[:INDEX_HEADER_SIZE_BYTES].view(INDEX_HEADER_DTYPE)[0]
            index_count = min(max(int(header["index_count"]), 0), geometry.index_entry_count_max)
            written_count = max(index_count - INDEX_COUNT_INITIAL, 0)
            entries = buffer[
                entries_position_bytes : entries_position_bytes
                + max(index_count, INDEX_COUNT_INITIAL) * INDEX_ENTRY_SIZE_BYTES
            ].view(INDEX_ENTRY_DTYPE)
            predicate = _IndexEntryIsDurable(
                entries, commit_log, keep_end_log_offset_bytes, end_log_offset_bytes
            )
            kept_count = _first_false(INDEX_COUNT_INITIAL, index_count, predicate)
            kept_count = max(kept_count, INDEX_COUNT_INITIAL)
            entry_dropped_count += max(index_count - kept_count, 0)
            if kept_count == INDEX_COUNT_INITIAL:
                mapped_file.close()
                _delete_file(path)
                file_deleted_count += 1
                continue
            last = entries[kept_count - 1]
            last_log_offset_bytes = int(last["log_offset_bytes"])
            end_timestamp_ms = _record_store_timestamp_ms(
                commit_log, last_log_offset_bytes, end_log_offset_bytes
            )
            if end_timestamp_ms is None:
                end_timestamp_ms = int(header["begin_timestamp_ms"]) + 1000 * int(
                    last["time_diff_s"]
                )
            _rebuild_index_file(
                mapped_file,
                geometry.index_slot_count,
                kept_count,
                end_timestamp_ms,
                last_log_offset_bytes,
            )
            assert written_count >= kept_count - INDEX_COUNT_INITIAL
        finally:
            mapped_file.close()
        break
    if file_deleted_count > 0:
        fsync_directory(index.directory)
    index.load()
    return IndexCut(entry_dropped_count=entry_dropped_count, file_deleted_count=file_deleted_count)


def _delete_file(path: Path) -> None:
    try:
        path.unlink()
    except OSError as error:
        raise store_error(error, "delete", path) from error


def _record_store_timestamp_ms(
    commit_log: CommitLog, log_offset_bytes: int, end_log_offset_bytes: int
) -> int | None:
    """STORETIMESTAMP of the whole record at `log_offset_bytes` below the end, or None."""
    if log_offset_bytes < commit_log.min_log_offset_bytes:
        return None
    record = commit_log.read_record(log_offset_bytes, end_log_offset_bytes)
    if record is None:
        return None
    (store_timestamp_ms,) = _INT64_BE.unpack_from(record, STORETIMESTAMP_POSITION_BYTES)
    return int(store_timestamp_ms)


# ---------------------------------------------------------------------------------------------
# recover()
# ---------------------------------------------------------------------------------------------


_NOTHING_FLUSHED: Final = CheckpointState(0, 0, 0, 0, 0, 0)


def _checkpoint_state(checkpoint: Checkpoint | CheckpointState | None) -> CheckpointState:
    """The state recovery goes by; no checkpoint file means nothing is known flushed (by
    offsets, so every record is checked, the final 0x02 of its properties included)."""
    if checkpoint is None:
        return _NOTHING_FLUSHED
    if isinstance(checkpoint, Checkpoint):
        return checkpoint.state_flushed if checkpoint.existed else _NOTHING_FLUSHED
    return checkpoint


def _clean_checks_pass(
    commit_log: CommitLog,
    consume_queues: ConsumeQueueTable,
    index: IndexService,
    end_log_offset_bytes: int,
) -> bool:
    """After a clean stop: every queue's newest entry and the index's newest key match their
    records below the end (the paired checks of what the dispatcher wrote)."""
    try:
        consume_queues.open_all()
    except StoreError:
        return False  # a queue's own open found entries out of order
    for queue in consume_queues.queues():
        last = queue.last_entry()
        if last is None:
            continue
        if not cq_entry_matches_record(
            commit_log,
            end_log_offset_bytes,
            queue.topic.encode("utf-8", "surrogateescape"),
            queue.queue_id,
            queue.entry_count - 1,
            last.log_offset_bytes,
            last.size_bytes,
        ):
            return False
    for index_file in reversed(index.files):
        if index_file.entry_count == 0:
            continue
        # Every key of the newest indexed record was put in one batch; the header's end offset
        # is that record.
        end_timestamp_ms = _record_store_timestamp_ms(
            commit_log, index_file.end_log_offset_bytes, end_log_offset_bytes
        )
        return end_timestamp_ms is not None
    return True


def _clean_redispatch_start(
    commit_log: CommitLog, consume_queues: ConsumeQueueTable, index: IndexService, end_bytes: int
) -> tuple[int, int]:
    """(dispatch start, index skip-through) after a clean stop: past the newest record that has a
    consume-queue entry or an index key; normally the end itself, so nothing is dispatched."""
    cq_end_bytes = max((queue.log_end_offset_bytes for queue in consume_queues.queues()), default=0)
    index_skip_through_bytes = -1
    index_next_bytes = 0
    if any(index_file.entry_count > 0 for index_file in index.files):
        index_skip_through_bytes = index.end_log_offset_bytes
        record = commit_log.read_record(index_skip_through_bytes, end_bytes)
        if record is not None:
            index_next_bytes = index_skip_through_bytes + len(record)
    start_bytes = max(cq_end_bytes, index_next_bytes, commit_log.min_log_offset_bytes)
    return min(start_bytes, end_bytes), index_skip_through_bytes


def recover(
    commit_log: CommitLog,
    consume_queues: ConsumeQueueTable,
    index: IndexService,
    checkpoint: Checkpoint | CheckpointState | None,
    *,
    was_clean: bool,
    dispatcher: Dispatcher | None = None,
    timestamp_margin_ms: int = TIMESTAMP_MARGIN_MS_DEFAULT,
    truncate_flushed_damage: bool = False,
    cut_copy_directory: Path | None = None,
    clean_scan_segment_count: int = CLEAN_SCAN_SEGMENT_COUNT_DEFAULT,
    scan_thread_count: int | None = None,
) -> RecoveryReport:
    """Make the store consistent after an open; the module docstring has the whole method.

    Preconditions: the objects are the writable ones of one store; `commit_log` and `index` are
    loaded (`load()`), nothing was appended yet, and `was_clean` is `not create_abort_file()`.
    On return the commit log's write position is set (flushed), the consume queues and the index
    hold exactly the entries of the records below it that were dispatched before the stop or
    again now (when `dispatcher` is given; otherwise the caller dispatches from
    `redispatch_from_log_offset_bytes`). Raises StoreError for damage a crash cannot explain
    (see `truncate_flushed_damage`) and when the re-dispatch finds a QUEUEOFFSET out of order.
    """
    started_ns = time.monotonic_ns()
    assert commit_log.writable
    assert consume_queues.writable
    assert index.writable
    assert timestamp_margin_ms >= 0
    assert clean_scan_segment_count >= 1
    assert commit_log.queue_indexes.slot_count == 0, "recover() runs before the first append"
    report: RecoveryReport | None = None
    if was_clean:
        report = _recover_clean(
            commit_log,
            consume_queues,
            index,
            dispatcher,
            clean_scan_segment_count,
            scan_thread_count,
            started_ns,
        )
    if report is None:
        report = _recover_unclean(
            commit_log,
            consume_queues,
            index,
            _checkpoint_state(checkpoint),
            dispatcher,
            timestamp_margin_ms,
            truncate_flushed_damage,
            cut_copy_directory,
            scan_thread_count,
            started_ns,
            was_clean=was_clean,
        )
    assert report.redispatch_from_log_offset_bytes <= report.write_log_offset_bytes
    assert commit_log.write_log_offset_bytes == report.write_log_offset_bytes
    return report


def _recover_clean(
    commit_log: CommitLog,
    consume_queues: ConsumeQueueTable,
    index: IndexService,
    dispatcher: Dispatcher | None,
    clean_scan_segment_count: int,
    scan_thread_count: int | None,
    started_ns: int,
) -> RecoveryReport | None:
    """The clean path; None when a check fails and the unclean path must run instead."""
    starts_bytes = commit_log.segment_starts_bytes
    scan_start_bytes = (
        starts_bytes[max(len(starts_bytes) - clean_scan_segment_count, 0)] if starts_bytes else 0
    )
    outcome = recover_scan(commit_log, scan_start_bytes, thread_count=scan_thread_count)
    end_bytes = outcome.end_log_offset_bytes
    if outcome.damaged or outcome.later_segment_count > 0:
        return None
    if not _clean_checks_pass(commit_log, consume_queues, index, end_bytes):
        return None
    cq_dropped_count = consume_queues.truncate_log_offset(end_bytes)
    assert cq_dropped_count == 0  # the checks above passed
    correct_min_queue_indexes(consume_queues, commit_log.min_log_offset_bytes)
    commit_log.set_write_position(end_bytes, flushed=True)
    if outcome.last_store_timestamp_ms >= 0:
        commit_log.note_store_timestamp(outcome.last_store_timestamp_ms)
    start_bytes, index_skip_through_bytes = _clean_redispatch_start(
        commit_log, consume_queues, index, end_bytes
    )
    redispatched_count = 0
    if dispatcher is not None:
        dispatcher.start_at(
            start_bytes,
            redispatch_end_log_offset_bytes=end_bytes,
            index_skip_through_log_offset_bytes=index_skip_through_bytes,
        )
        redispatched_count = dispatcher.dispatch(end_bytes)
    return RecoveryReport(
        was_clean=True,
        clean_path_failed=False,
        scan_start_log_offset_bytes=scan_start_bytes,
        scanned_bytes=outcome.scanned_bytes,
        record_count=outcome.record_count,
        write_log_offset_bytes=end_bytes,
        truncated_at_log_offset_bytes=None,
        truncated_reason=None,
        flushed_damage=False,
        cq_entry_dropped_count=0,
        index_entry_dropped_count=0,
        index_file_deleted_count=0,
        redispatch_from_log_offset_bytes=start_bytes,
        redispatched_record_count=redispatched_count,
        duration_ns=time.monotonic_ns() - started_ns,
    )


def _derived_start(
    commit_log: CommitLog,
    outcome: ScanOutcome,
    timestamp_ms: int,
    scanned_first_log_offset_bytes: int,
) -> int:
    """By times (a checkpoint without offsets): where re-dispatch must begin for a file type
    durable up to `timestamp_ms` (margin taken off already): the first scanned record stored at
    or after it, or the start of an earlier segment when such records may lie before the scan.
    Never past the end of the log."""
    segment_start_bytes = segment_start_before(commit_log, timestamp_ms)
    if segment_start_bytes < outcome.start_log_offset_bytes:
        return segment_start_bytes
    return min(scanned_first_log_offset_bytes, outcome.end_log_offset_bytes)


@dataclasses.dataclass(frozen=True)
class _UncleanPlan:
    """What an unclean recovery trusts, from the checkpoint: the commit log below
    `trusted_end_log_offset_bytes` was flushed; the scan starts at a segment start at or below
    it; consume-queue entries and index keys are kept below the two keep ends."""

    scan_start_log_offset_bytes: int
    trusted_end_log_offset_bytes: int
    cq_keep_end_log_offset_bytes: int
    index_keep_end_log_offset_bytes: int
    check_properties_end: bool
    # By times only: the checkpoint's physic time less the margin; a valid end whose newest
    # record is older than this lies inside flushed data.
    physic_less_margin_ms: int | None = None

    def flushed_damage(self, outcome: ScanOutcome) -> bool:
        """True when the outcome's end (after the unfinished-tail cut) lies inside flushed data."""
        if self.physic_less_margin_ms is not None:
            return self.physic_less_margin_ms > outcome.last_store_timestamp_ms
        return outcome.end_log_offset_bytes < self.trusted_end_log_offset_bytes


def _holder_segment_start(commit_log: CommitLog, log_offset_bytes: int) -> int:
    """Start of the last segment at or below `log_offset_bytes` (the first segment, or 0, when
    there is none)."""
    starts_bytes = commit_log.segment_starts_bytes
    below = [start_bytes for start_bytes in starts_bytes if start_bytes <= log_offset_bytes]
    if below:
        return below[-1]
    return starts_bytes[0] if starts_bytes else 0


def _plan_by_offsets(
    commit_log: CommitLog, state: CheckpointState, scan: Callable[[int], ScanOutcome]
) -> tuple[_UncleanPlan, ScanOutcome]:
    """The plan of a checkpoint with offsets, which no wall-clock step can move. The scan
    starts at the segment holding the last flushed byte, so that segment's flushed records are
    checked again (a damaged one there is refused, not cut) and a flushed end that is a segment
    start is checked through the blank before it."""
    assert state.physic_log_offset_bytes is not None
    assert state.logics_log_offset_bytes is not None
    assert state.index_log_offset_bytes is not None
    physic_bytes = state.physic_log_offset_bytes
    scan_start_bytes = _holder_segment_start(commit_log, max(physic_bytes - 1, 0))
    outcome = scan(scan_start_bytes)
    end_bytes = outcome.end_log_offset_bytes
    min_bytes = commit_log.min_log_offset_bytes
    plan = _UncleanPlan(
        scan_start_log_offset_bytes=scan_start_bytes,
        trusted_end_log_offset_bytes=physic_bytes,
        cq_keep_end_log_offset_bytes=min(max(state.logics_log_offset_bytes, min_bytes), end_bytes),
        index_keep_end_log_offset_bytes=min(
            max(state.index_log_offset_bytes, min_bytes), end_bytes
        ),
        check_properties_end=True,
    )
    return plan, outcome


def _plan_by_times(
    commit_log: CommitLog,
    state: CheckpointState,
    timestamp_margin_ms: int,
    scan: Callable[[int, Sequence[int]], ScanOutcome],
) -> tuple[_UncleanPlan, ScanOutcome]:
    """The plan of a checkpoint without offsets (written before they existed): RocketMQ's way,
    by store times less a margin, assuming they grow with the log offset. Records stored before
    this version may lack the final 0x02 of their properties, so that is not checked."""

    def less_margin(timestamp_ms: int) -> int:
        # 0 means "nothing known durable": scan and rebuild from the first record.
        return 0 if timestamp_ms == 0 else timestamp_ms - timestamp_margin_ms

    physic_ms = less_margin(state.physic_msg_timestamp_ms)
    logics_ms = less_margin(state.logics_msg_timestamp_ms)
    index_ms = less_margin(state.index_msg_timestamp_ms)
    scan_start_bytes = segment_start_before(commit_log, physic_ms)
    outcome = scan(scan_start_bytes, (logics_ms, index_ms, physic_ms))
    plan = _UncleanPlan(
        scan_start_log_offset_bytes=scan_start_bytes,
        trusted_end_log_offset_bytes=outcome.first_log_offsets_bytes[2],
        cq_keep_end_log_offset_bytes=_derived_start(
            commit_log, outcome, logics_ms, outcome.first_log_offsets_bytes[0]
        ),
        index_keep_end_log_offset_bytes=_derived_start(
            commit_log, outcome, index_ms, outcome.first_log_offsets_bytes[1]
        ),
        check_properties_end=False,
        physic_less_margin_ms=physic_ms if state.physic_msg_timestamp_ms > 0 else None,
    )
    return plan, outcome


def flushed_damage_message(
    commit_log: CommitLog, end_log_offset_bytes: int, reason: str, trusted_end_log_offset_bytes: int
) -> str:
    """The refusal of a store whose flushed bytes are damaged: which file, which offset, why,
    and what repairs it."""
    segment_size_bytes = commit_log.segment_size_bytes
    segment_start_bytes = end_log_offset_bytes - end_log_offset_bytes % segment_size_bytes
    path = _segment_path(commit_log, segment_start_bytes)
    store_root = commit_log.directory.parent
    return (
        f"commit log damaged inside flushed data: {path} at file offset "
        f"{end_log_offset_bytes - segment_start_bytes} (log offset {end_log_offset_bytes}): "
        f"{reason}; the checkpoint says every byte below log offset "
        f"{trusted_end_log_offset_bytes} was flushed, so cutting here would drop acknowledged "
        "messages. This is disk or file-system damage, not a crash tear. To cut the log there "
        "anyway, keeping a copy of every byte cut, stop the broker and run: "
        f"mqbox store repair --store-root {store_root}"
    )


def copy_cut_bytes(commit_log: CommitLog, from_log_offset_bytes: int, directory: Path) -> int:
    """Copy every commit-log byte at or after `from_log_offset_bytes` that holds data into
    `directory` (one file per segment, named by the log offset of its first byte) before a
    repair cuts them; return the bytes copied."""
    directory.mkdir(parents=True, exist_ok=True, mode=DIRECTORY_MODE)
    copied_bytes = 0
    for segment_start_bytes, buffer, first_bytes, end_bytes in data_ranges_from(
        commit_log, from_log_offset_bytes
    ):
        target = directory / segment_name(segment_start_bytes + first_bytes)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
        try:
            view = memoryview(buffer[first_bytes:end_bytes].data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        copied_bytes += end_bytes - first_bytes
    fsync_directory(directory)
    return copied_bytes


def _recover_unclean(
    commit_log: CommitLog,
    consume_queues: ConsumeQueueTable,
    index: IndexService,
    state: CheckpointState,
    dispatcher: Dispatcher | None,
    timestamp_margin_ms: int,
    truncate_flushed_damage: bool,
    cut_copy_directory: Path | None,
    scan_thread_count: int | None,
    started_ns: int,
    *,
    was_clean: bool,
) -> RecoveryReport:
    if state.has_offsets:
        plan, outcome = _plan_by_offsets(
            commit_log,
            state,
            lambda start_bytes: recover_scan(
                commit_log, start_bytes, thread_count=scan_thread_count
            ),
        )
    else:
        plan, outcome = _plan_by_times(
            commit_log,
            state,
            timestamp_margin_ms,
            lambda start_bytes, thresholds_ms: recover_scan(
                commit_log, start_bytes, thresholds_ms=thresholds_ms, thread_count=scan_thread_count
            ),
        )
    scan_start_bytes = plan.scan_start_log_offset_bytes
    # Records no flush vouches for: check what the CRC does not cover.
    outcome = cut_unfinished_tail(
        outcome,
        commit_log,
        max(plan.trusted_end_log_offset_bytes, scan_start_bytes),
        check_properties_end=plan.check_properties_end,
    )
    end_bytes = outcome.end_log_offset_bytes
    reason = STOP_REASON_NAMES.get(outcome.stop_reason, str(outcome.stop_reason))
    flushed_damage = plan.flushed_damage(outcome)
    if flushed_damage and not truncate_flushed_damage:
        raise StoreError(
            flushed_damage_message(
                commit_log, end_bytes, reason, max(plan.trusted_end_log_offset_bytes, end_bytes + 1)
            )
        )
    truncated_at_bytes: int | None = None
    truncated_reason: str | None = None
    if outcome.damaged:
        truncated_at_bytes = end_bytes
        truncated_reason = reason
    if flushed_damage and cut_copy_directory is not None:
        copy_cut_bytes(commit_log, end_bytes, cut_copy_directory)
    if outcome.damaged or outcome.later_segment_count > 0:
        truncate_commit_log(commit_log, end_bytes)
    fsync_segments_from(commit_log, scan_start_bytes)
    commit_log.set_write_position(end_bytes, flushed=True)
    if outcome.last_store_timestamp_ms >= 0:
        commit_log.note_store_timestamp(outcome.last_store_timestamp_ms)
    elif state.physic_msg_timestamp_ms > 0:
        commit_log.note_store_timestamp(state.physic_msg_timestamp_ms)

    cq_keep_end_bytes = min(plan.cq_keep_end_log_offset_bytes, end_bytes)
    index_keep_end_bytes = min(plan.index_keep_end_log_offset_bytes, end_bytes)
    cq_dropped_count = cut_consume_queues(consume_queues, commit_log, cq_keep_end_bytes)
    consume_queues.open_all()
    cq_dropped_count += consume_queues.truncate_log_offset(cq_keep_end_bytes)
    correct_min_queue_indexes(consume_queues, commit_log.min_log_offset_bytes)
    index_cut = cut_index(index, commit_log, index_keep_end_bytes, end_bytes)

    start_bytes = min(cq_keep_end_bytes, index_keep_end_bytes)
    redispatched_count = 0
    if dispatcher is not None:
        dispatcher.start_at(
            start_bytes,
            redispatch_end_log_offset_bytes=cq_keep_end_bytes,
            index_skip_through_log_offset_bytes=index_keep_end_bytes - 1,
        )
        redispatched_count = dispatcher.dispatch(end_bytes)
    return RecoveryReport(
        was_clean=was_clean,
        clean_path_failed=was_clean,
        scan_start_log_offset_bytes=scan_start_bytes,
        scanned_bytes=outcome.scanned_bytes,
        record_count=outcome.record_count,
        write_log_offset_bytes=end_bytes,
        truncated_at_log_offset_bytes=truncated_at_bytes,
        truncated_reason=truncated_reason,
        flushed_damage=flushed_damage,
        cq_entry_dropped_count=cq_dropped_count,
        index_entry_dropped_count=index_cut.entry_dropped_count,
        index_file_deleted_count=index_cut.file_deleted_count,
        redispatch_from_log_offset_bytes=start_bytes,
        redispatched_record_count=redispatched_count,
        duration_ns=time.monotonic_ns() - started_ns,
    )
