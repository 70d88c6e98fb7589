"""Kernels over numpy views of the commit log: the store's data plane.

Owns: scan_records, the loop that walks stored records back to back and reports what a consume
queue entry needs for each (log offset, size, queue, queue index, tag hash, store time), and the
table-driven CRC32 it checks bodies with. kernels_ref.py restates both contracts in plain Python,
and a unit test asserts that the two agree exactly on valid records, torn tails and noise.

Never: imports anything but mqbox._jit, mqbox.message and mqbox.message_kernels (no sockets, no
protocol, no files), allocates inside a kernel, or decides what to do with what it finds. A scan
stops and says why (a SCAN_STOP_* reason); recovery.py, the parent, decides whether that is a torn
tail to truncate, a blank that sends it to the next segment, or corruption to report.

Invariants: every read of a scan lies inside [start_bytes, end_bytes), which lies inside the
segment; a record is reported only if every fact below holds, so a reported record is one that
message.decode_record() would accept (with check_crc, a CRC it would accept too).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from mqbox._jit import kernel
from mqbox.message import (
    BLANK_MAGIC,
    BLANK_SIZE_BYTES,
    BODY_LENGTH_POSITION_BYTES,
    BODY_POSITION_BYTES,
    BODYCRC_MASK,
    BODYCRC_POSITION_BYTES,
    MAGICCODE_POSITION_BYTES,
    MESSAGE_MAGIC,
    PHYSICALOFFSET_POSITION_BYTES,
    PROPERTIES_LENGTH_SIZE_BYTES,
    QUEUEID_POSITION_BYTES,
    QUEUEOFFSET_POSITION_BYTES,
    RECORD_SIZE_BYTES_MIN,
    STORETIMESTAMP_POSITION_BYTES,
    SYSFLAG_HOSTS_V6,
    SYSFLAG_POSITION_BYTES,
    TOPIC_LENGTH_SIZE_BYTES,
    TOPIC_SIZE_BYTES_MAX,
    TOTALSIZE_POSITION_BYTES,
)
from mqbox.message_kernels import (
    TAGS_NAME,
    find_property,
    java_hash_utf8,
    read_s16_be,
    read_s32_be,
    read_s64_be,
    read_u8,
    read_u32_be,
)

# --- CRC32 --------------------------------------------------------------------------------------

_CRC32_POLYNOMIAL_REFLECTED = 0xEDB88320  # zlib's and java.util.zip.CRC32's polynomial
_CRC32_SLICE_COUNT = 8


def _crc32_tables() -> NDArray[np.uint32]:
    """Tables of the slicing-by-8 reflected CRC32, built once at import.

    Row 0 is the classic byte-at-a-time table. Row k maps a byte to the CRC contribution it makes
    when k zero bytes follow it, so crc32() folds 8 bytes per step with 8 independent lookups
    instead of a chain of 8 dependent ones (about four times faster on long bodies).
    """
    tables = np.zeros((_CRC32_SLICE_COUNT, 256), dtype=np.uint32)
    for index in range(256):
        value = index
        for _ in range(8):
            value = (value >> 1) ^ _CRC32_POLYNOMIAL_REFLECTED if value & 1 else value >> 1
        tables[0, index] = value
    for row in range(1, _CRC32_SLICE_COUNT):
        for index in range(256):
            previous = int(tables[row - 1, index])
            tables[row, index] = (previous >> 8) ^ int(tables[0, previous & 0xFF])
    tables.flags.writeable = False
    return tables


# numba freezes a global array into the compiled code as a constant.
CRC32_TABLES = _crc32_tables()
assert int(CRC32_TABLES[0, 1]) == 0x77073096
assert int(CRC32_TABLES[0, 255]) == 0x2D02EF8D


@kernel
def _crc32_lookup(row: int, index: int) -> int:
    return int(np.int64(CRC32_TABLES[row, index]))


@kernel
def crc32(buf: NDArray[np.uint8], start: int, end: int) -> int:
    """zlib.crc32(buf[start:end]), as a non-negative int below 2**32."""
    assert 0 <= start <= end <= buf.size
    crc = 0xFFFFFFFF
    at = start
    while at + _CRC32_SLICE_COUNT <= end:
        low = crc ^ (
            read_u8(buf, at)
            | read_u8(buf, at + 1) << 8
            | read_u8(buf, at + 2) << 16
            | read_u8(buf, at + 3) << 24
        )
        crc = (
            _crc32_lookup(7, low & 0xFF)
            ^ _crc32_lookup(6, (low >> 8) & 0xFF)
            ^ _crc32_lookup(5, (low >> 16) & 0xFF)
            ^ _crc32_lookup(4, low >> 24)
            ^ _crc32_lookup(3, read_u8(buf, at + 4))
            ^ _crc32_lookup(2, read_u8(buf, at + 5))
            ^ _crc32_lookup(1, read_u8(buf, at + 6))
            ^ _crc32_lookup(0, read_u8(buf, at + 7))
        )
        at += _CRC32_SLICE_COUNT
    while at < end:
        crc = _crc32_lookup(0, (crc ^ read_u8(buf, at)) & 0xFF) ^ (crc >> 8)
        at += 1
    return crc ^ 0xFFFFFFFF


# --- scan_records -------------------------------------------------------------------------------

# Why a scan stopped, the third value scan_records returns. stop_position_bytes is where the
# record that was not reported begins (end_bytes for SCAN_STOP_END).
SCAN_STOP_END = 0  # reached end_bytes exactly, after a whole record
SCAN_STOP_FULL = 1  # the out arrays are full; scan again from stop_position_bytes
SCAN_STOP_BLANK = 2  # an end-of-segment blank starts there: the next record is in the next segment
SCAN_STOP_TRUNCATED = 3  # fewer than 8 bytes left, or TOTALSIZE runs past end_bytes: a torn tail
SCAN_STOP_INVALID = 4  # bad magic, TOTALSIZE < 91, IPv6 sysflag, or inner lengths != TOTALSIZE
SCAN_STOP_CRC_MISMATCH = 5  # check_crc and BODYCRC does not match the body
SCAN_STOP_OFFSET_MISMATCH = 6  # PHYSICALOFFSET is not base_log_offset_bytes + position


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
    they were. The caller learns why the scan stopped from stop_reason (SCAN_STOP_*); in
    particular SCAN_STOP_BLANK means an end-of-segment blank starts at stop_position_bytes.

    Checks per record, in this order: 8 bytes left (else TRUNCATED); magic is the blank's
    (BLANK) or a message's (else INVALID); TOTALSIZE >= 91 (INVALID); TOTALSIZE within end_bytes
    (TRUNCATED); no IPv6 sysflag bit; 0 <= body length <= TOTALSIZE - 91; topic length <= 127 and
    within TOTALSIZE; 91 + body + topic + properties == TOTALSIZE (each INVALID); PHYSICALOFFSET
    equal to its log offset (OFFSET_MISMATCH); with check_crc, BODYCRC (CRC_MISMATCH).
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
    stop_reason = SCAN_STOP_END
    while True:
        if position_bytes == end_bytes:
            stop_reason = SCAN_STOP_END
            break
        if record_count == capacity:
            stop_reason = SCAN_STOP_FULL
            break
        available_bytes = end_bytes - position_bytes
        if available_bytes < BLANK_SIZE_BYTES:
            stop_reason = SCAN_STOP_TRUNCATED
            break
        magic = read_u32_be(segment, position_bytes + MAGICCODE_POSITION_BYTES)
        if magic == BLANK_MAGIC:
            stop_reason = SCAN_STOP_BLANK
            break
        if magic != MESSAGE_MAGIC:
            stop_reason = SCAN_STOP_INVALID
            break
        size_bytes = read_s32_be(segment, position_bytes + TOTALSIZE_POSITION_BYTES)
        if size_bytes < RECORD_SIZE_BYTES_MIN:  # also guarantees progress
            stop_reason = SCAN_STOP_INVALID
            break
        if size_bytes > available_bytes:
            stop_reason = SCAN_STOP_TRUNCATED
            break
        # From here on the whole record lies inside [position_bytes, end_bytes).
        if read_s32_be(segment, position_bytes + SYSFLAG_POSITION_BYTES) & SYSFLAG_HOSTS_V6:
            stop_reason = SCAN_STOP_INVALID
            break
        body_size_bytes = read_s32_be(segment, position_bytes + BODY_LENGTH_POSITION_BYTES)
        if body_size_bytes < 0 or body_size_bytes > size_bytes - RECORD_SIZE_BYTES_MIN:
            stop_reason = SCAN_STOP_INVALID
            break
        body_position_bytes = position_bytes + BODY_POSITION_BYTES
        topic_length_position_bytes = body_position_bytes + body_size_bytes
        topic_size_bytes = read_u8(segment, topic_length_position_bytes)
        if topic_size_bytes > TOPIC_SIZE_BYTES_MAX:
            stop_reason = SCAN_STOP_INVALID
            break
        if RECORD_SIZE_BYTES_MIN + body_size_bytes + topic_size_bytes > size_bytes:
            stop_reason = SCAN_STOP_INVALID
            break
        properties_length_position_bytes = (
            topic_length_position_bytes + TOPIC_LENGTH_SIZE_BYTES + topic_size_bytes
        )
        properties_size_bytes = read_s16_be(segment, properties_length_position_bytes)
        expected_size_bytes = (
            RECORD_SIZE_BYTES_MIN + body_size_bytes + topic_size_bytes + properties_size_bytes
        )
        if expected_size_bytes != size_bytes:
            stop_reason = SCAN_STOP_INVALID
            break
        log_offset_bytes = base_log_offset_bytes + position_bytes
        if read_s64_be(segment, position_bytes + PHYSICALOFFSET_POSITION_BYTES) != log_offset_bytes:
            stop_reason = SCAN_STOP_OFFSET_MISMATCH
            break
        if check_crc:
            crc = crc32(segment, body_position_bytes, topic_length_position_bytes) & BODYCRC_MASK
            if crc != read_u32_be(segment, position_bytes + BODYCRC_POSITION_BYTES):
                stop_reason = SCAN_STOP_CRC_MISMATCH
                break
        properties_position_bytes = properties_length_position_bytes + PROPERTIES_LENGTH_SIZE_BYTES
        properties_end_bytes = properties_position_bytes + properties_size_bytes
        value_start, value_end = find_property(
            segment, properties_position_bytes, properties_end_bytes, TAGS_NAME
        )
        tag_hash = 0
        if value_start >= 0:
            tag_hash = java_hash_utf8(segment, value_start, value_end)
        out_log_offset_bytes[record_count] = log_offset_bytes
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
