"""Kernels over numpy views of the commit log: the store's data plane.

Owns: scan_records, the loop that walks stored records back to back and reports what a consume
queue entry needs for each (log offset, size, queue, queue index, tag hash, store time).
kernels_ref.py restates the contract in plain Python, and a unit test asserts that the two
agree exactly on valid records, torn tails and noise.

Never: imports anything but mqbox._jit, mqbox.message and mqbox.message_kernels (no sockets, no
protocol, no files), allocates inside a kernel, or decides what to do with what it finds. A scan
stops and says why (one of message_kernels' STOP_* reasons); recovery.py, the parent, decides
whether that is a torn tail to truncate, a blank that sends it to the next segment, or
corruption to report.

Invariants: every read of a scan lies inside [start_bytes, end_bytes), which lies inside the
segment; a record is reported only if message_kernels.check_record finds it whole, so a
reported record is one that message.decode_record() would accept (with check_crc, a CRC it
would accept too).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from mqbox._jit import kernel
from mqbox.message import (
    QUEUEID_POSITION_BYTES,
    QUEUEOFFSET_POSITION_BYTES,
    STORETIMESTAMP_POSITION_BYTES,
)
from mqbox.message_kernels import (
    RECORD_WHOLE,
    STOP_END,
    STOP_FULL,
    TAGS_NAME,
    check_record,
    find_property,
    java_hash_utf8,
    read_s32_be,
    read_s64_be,
)

# --- scan_records -------------------------------------------------------------------------------


@kernel
def scan_records(
    segment: NDArray[np.uint8],
    start_bytes: int,
    end_bytes: int,
    base_log_offset_bytes: int,
    check_crc: bool,
    out_log_offset_bytes: NDArray[np.int64],
    out_size_bytes: NDArray[np.int32],
    out_queue_id: NDArray[np.int32],
    out_queue_index: NDArray[np.int64],
    out_tag_hash: NDArray[np.int64],
    out_store_timestamp_ms: NDArray[np.int64],
) -> tuple[int, int, int]:
    """Walk the records stored back to back in segment[start_bytes:end_bytes].

    Returns (record_count, stop_position_bytes, stop_reason): entry i < record_count of each out
    array describes the i-th record (log offset = base_log_offset_bytes + its position in
    `segment`; tag hash = Java hash of its TAGS property, 0 when absent). The out arrays all have
    the same length, the most records one call reports; entries past record_count are left as
    they were. stop_reason is one of message_kernels' STOP_*: END, FULL, or the verdict of
    check_record (PHYSICALOFFSET checked, IPv6 hosts refused, BODYCRC when check_crc) on the
    record at stop_position_bytes; in particular STOP_BLANK means an end-of-segment blank
    starts there.
    """
    assert 0 <= start_bytes <= end_bytes <= segment.size
    assert base_log_offset_bytes >= 0
    capacity = out_log_offset_bytes.size
    assert out_size_bytes.size == capacity
    assert out_queue_id.size == capacity
    assert out_queue_index.size == capacity
    assert out_tag_hash.size == capacity
    assert out_store_timestamp_ms.size == capacity
    position_bytes = start_bytes
    record_count = 0
    stop_reason = STOP_END
    while True:
        if position_bytes == end_bytes:
            stop_reason = STOP_END
            break
        if record_count == capacity:
            stop_reason = STOP_FULL
            break
        verdict, size_bytes, _body_at, _topic_at, properties_at = check_record(
            segment, position_bytes, end_bytes, base_log_offset_bytes, check_crc, False
        )
        if verdict != RECORD_WHOLE:
            stop_reason = verdict
            break
        value_start, value_end = find_property(
            segment, properties_at, position_bytes + size_bytes, TAGS_NAME
        )
        tag_hash = 0
        if value_start >= 0:
            tag_hash = java_hash_utf8(segment, value_start, value_end)
        out_log_offset_bytes[record_count] = base_log_offset_bytes + position_bytes
        out_size_bytes[record_count] = size_bytes
        out_queue_id[record_count] = read_s32_be(segment, position_bytes + QUEUEID_POSITION_BYTES)
        out_queue_index[record_count] = read_s64_be(
            segment, position_bytes + QUEUEOFFSET_POSITION_BYTES
        )
        out_tag_hash[record_count] = tag_hash
        out_store_timestamp_ms[record_count] = read_s64_be(
            segment, position_bytes + STORETIMESTAMP_POSITION_BYTES
        )
        record_count += 1
        position_bytes += size_bytes
    return record_count, position_bytes, stop_reason
