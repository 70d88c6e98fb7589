"""The consumer's data plane: one numba pass over a PULL response body.

Owns: decode_pull_records, the kernel that walks the stored records a broker sends back to back
(message.py draws the layout) and fills one table with where each record's fields are, and the
table's column numbers. pull_kernels_ref.py restates the contract in plain Python; a unit test
feeds both the same valid, torn and damaged bodies and asserts they agree exactly.

Never: imports anything but mqbox._jit, mqbox.message and mqbox.message_kernels, allocates
inside the kernel, raises for bad input (it stops and says why; pull_decode.py, the parent,
decides), or reads outside [start_bytes, end_bytes): every read is guarded by a length check,
because kernels run with boundscheck off.

Each record goes through message_kernels.check_record, the store's own record check. Unlike the
store's scans, the client accepts IPv6 hosts (sysflag 0x10 and 0x20 make a host 20 bytes
instead of 8, moving every later field), as the Java client does: a Java broker stores them for
IPv6 peers, even though mqbox never does. It checks no CRC and no PHYSICALOFFSET, as neither
Java's nor C++'s client does.

Table: `out` is int64, shape (COLUMN_COUNT, capacity), one column per field so the parent can
take a whole field as one contiguous row (`out[COLUMN_QUEUE_INDEX, :count]`). Positions are
byte positions in the body; TAGS_POSITION is -1 when a record has no TAGS property.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from mqbox._jit import kernel
from mqbox.message import (
    BODY_LENGTH_POSITION_BYTES,
    BORNHOST_POSITION_BYTES,
    BORNTIMESTAMP_POSITION_BYTES,
    FLAG_POSITION_BYTES,
    HOST_SIZE_BYTES,
    PHYSICALOFFSET_POSITION_BYTES,
    PROPERTIES_LENGTH_SIZE_BYTES,
    QUEUEID_POSITION_BYTES,
    QUEUEOFFSET_POSITION_BYTES,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_POSITION_BYTES,
    SYSFLAG_STOREHOST_V6,
    TOPIC_LENGTH_SIZE_BYTES,
)
from mqbox.message_kernels import (
    HOST_V6_EXTRA_SIZE_BYTES,
    LOG_OFFSET_UNKNOWN,
    RECORD_WHOLE,
    STOP_BLANK,
    STOP_END,
    STOP_FULL,
    STOP_INVALID,
    STOP_TRUNCATED,
    TAGS_NAME,
    check_record,
    find_property,
    read_s32_be,
    read_s64_be,
)

# --- The table ----------------------------------------------------------------------------------

COLUMN_RECORD_POSITION_BYTES = 0  # where the record starts in the body
COLUMN_RECORD_SIZE_BYTES = 1  # TOTALSIZE
COLUMN_QUEUE_ID = 2
COLUMN_FLAG = 3
COLUMN_QUEUE_INDEX = 4  # QUEUEOFFSET
COLUMN_LOG_OFFSET_BYTES = 5  # PHYSICALOFFSET
COLUMN_SYSFLAG = 6
COLUMN_BORN_TIMESTAMP_MS = 7
COLUMN_STORE_TIMESTAMP_MS = 8
COLUMN_STORE_HOST_POSITION_BYTES = 9  # 4 or 16 address bytes, then the int32 port
COLUMN_RECONSUME_TIMES = 10
COLUMN_BODY_POSITION_BYTES = 11
COLUMN_BODY_SIZE_BYTES = 12  # as stored: compressed when sysflag says so
COLUMN_TOPIC_POSITION_BYTES = 13
COLUMN_TOPIC_SIZE_BYTES = 14
COLUMN_PROPERTIES_POSITION_BYTES = 15
COLUMN_PROPERTIES_SIZE_BYTES = 16
COLUMN_TAGS_POSITION_BYTES = 17  # the TAGS value, -1 when absent
COLUMN_TAGS_SIZE_BYTES = 18  # 0 when absent
COLUMN_COUNT = 19

# Why decode_pull_records stopped, its third result: message_kernels' STOP_* under the names
# pull_decode.py uses. stop_position_bytes is where the record that was not reported begins
# (end_bytes for DECODE_STOP_END). A PULL body holds no blanks: a blank's magic is INVALID here.
DECODE_STOP_END = STOP_END  # reached end_bytes exactly, after a whole record
DECODE_STOP_FULL = STOP_FULL  # the table is full; decode again from stop_position_bytes
DECODE_STOP_TRUNCATED = STOP_TRUNCATED  # fewer than 8 bytes left, or TOTALSIZE runs past the end
DECODE_STOP_INVALID = STOP_INVALID  # bad magic, or TOTALSIZE disagrees with the lengths inside

# Field positions after BORNHOST, for an IPv4 born host; an IPv6 one adds 12, an IPv6 store host
# adds 12 more to the fields after STOREHOST.
_STORETIMESTAMP_AFTER_BORNHOST_BYTES = BORNHOST_POSITION_BYTES + HOST_SIZE_BYTES
_STOREHOST_AFTER_BORNHOST_BYTES = _STORETIMESTAMP_AFTER_BORNHOST_BYTES + 8
_RECONSUME_AFTER_HOSTS_BYTES = _STOREHOST_AFTER_BORNHOST_BYTES + HOST_SIZE_BYTES

assert COLUMN_COUNT == COLUMN_TAGS_SIZE_BYTES + 1
assert _RECONSUME_AFTER_HOSTS_BYTES + 4 + 8 == BODY_LENGTH_POSITION_BYTES  # + PREPARED TX OFFSET


@kernel
def decode_pull_records(
    body: NDArray[np.uint8], start_bytes: int, end_bytes: int, out: NDArray[np.int64]
) -> tuple[int, int, int]:
    """Walk the records stored back to back in body[start_bytes:end_bytes] into `out`.

    Returns (record_count, stop_position_bytes, stop_reason): column c of record i is
    out[c, i] for i < record_count; entries past it are left as they were. Checks per record, in
    this order: the table has room (else FULL); then message_kernels.check_record with IPv6
    hosts allowed (as the Java client reads them), no CRC and no PHYSICALOFFSET check (neither
    Java's nor C++'s client checks them, and a PULL body's place in the log is not known here):
    its TRUNCATED, or INVALID (a blank too: a PULL body holds none).
    """
    assert 0 <= start_bytes <= end_bytes <= body.size
    assert out.shape[0] == COLUMN_COUNT
    capacity = out.shape[1]
    position_bytes = start_bytes
    record_count = 0
    stop_reason = DECODE_STOP_END
    while True:
        if position_bytes == end_bytes:
            stop_reason = DECODE_STOP_END
            break
        if record_count == capacity:
            stop_reason = DECODE_STOP_FULL
            break
        verdict, size_bytes, body_position_bytes, topic_at, properties_at = check_record(
            body, position_bytes, end_bytes, LOG_OFFSET_UNKNOWN, False, True
        )
        if verdict == STOP_BLANK:
            verdict = DECODE_STOP_INVALID
        if verdict != RECORD_WHOLE:
            stop_reason = verdict
            break
        sysflag = read_s32_be(body, position_bytes + SYSFLAG_POSITION_BYTES)
        born_extra_bytes = HOST_V6_EXTRA_SIZE_BYTES if sysflag & SYSFLAG_BORNHOST_V6 else 0
        store_extra_bytes = HOST_V6_EXTRA_SIZE_BYTES if sysflag & SYSFLAG_STOREHOST_V6 else 0
        hosts_extra_bytes = born_extra_bytes + store_extra_bytes
        record_end_bytes = position_bytes + size_bytes
        tags_start, tags_end = find_property(body, properties_at, record_end_bytes, TAGS_NAME)
        store_host_at = position_bytes + _STOREHOST_AFTER_BORNHOST_BYTES + born_extra_bytes
        reconsume_at = position_bytes + _RECONSUME_AFTER_HOSTS_BYTES + hosts_extra_bytes
        at = record_count
        out[COLUMN_RECORD_POSITION_BYTES, at] = position_bytes
        out[COLUMN_RECORD_SIZE_BYTES, at] = size_bytes
        out[COLUMN_QUEUE_ID, at] = read_s32_be(body, position_bytes + QUEUEID_POSITION_BYTES)
        out[COLUMN_FLAG, at] = read_s32_be(body, position_bytes + FLAG_POSITION_BYTES)
        out[COLUMN_QUEUE_INDEX, at] = read_s64_be(body, position_bytes + QUEUEOFFSET_POSITION_BYTES)
        out[COLUMN_LOG_OFFSET_BYTES, at] = read_s64_be(
            body, position_bytes + PHYSICALOFFSET_POSITION_BYTES
        )
        out[COLUMN_SYSFLAG, at] = sysflag
        out[COLUMN_BORN_TIMESTAMP_MS, at] = read_s64_be(
            body, position_bytes + BORNTIMESTAMP_POSITION_BYTES
        )
        out[COLUMN_STORE_TIMESTAMP_MS, at] = read_s64_be(
            body, position_bytes + _STORETIMESTAMP_AFTER_BORNHOST_BYTES + born_extra_bytes
        )
        out[COLUMN_STORE_HOST_POSITION_BYTES, at] = store_host_at
        out[COLUMN_RECONSUME_TIMES, at] = read_s32_be(body, reconsume_at)
        out[COLUMN_BODY_POSITION_BYTES, at] = body_position_bytes
        out[COLUMN_BODY_SIZE_BYTES, at] = topic_at - TOPIC_LENGTH_SIZE_BYTES - body_position_bytes
        out[COLUMN_TOPIC_POSITION_BYTES, at] = topic_at
        out[COLUMN_TOPIC_SIZE_BYTES, at] = properties_at - PROPERTIES_LENGTH_SIZE_BYTES - topic_at
        out[COLUMN_PROPERTIES_POSITION_BYTES, at] = properties_at
        out[COLUMN_PROPERTIES_SIZE_BYTES, at] = record_end_bytes - properties_at
        out[COLUMN_TAGS_POSITION_BYTES, at] = tags_start
        out[COLUMN_TAGS_SIZE_BYTES, at] = tags_end - tags_start
        record_count += 1
        position_bytes += size_bytes
    return record_count, position_bytes, stop_reason
