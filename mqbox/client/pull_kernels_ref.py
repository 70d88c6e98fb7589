"""Plain-Python twin of pull_kernels.py: the same contract, restated for tests.

Owns: a second statement of decode_pull_records, written with struct.unpack_from over a bytes copy
and a bytes split for the TAGS value; each record is checked by message_kernels_ref.check_record
(the twin of the record check). It shares no helper with the kernel, so a unit test that feeds
both the same bytes and gets the same table checks two independent readings of the record
layout (message.py's diagram, with Java's IPv6 host sizes).

Never: used on the data plane (it is slow), or changed without its kernel.
"""

from __future__ import annotations

import struct

import numpy as np
from numpy.typing import NDArray

from mqbox.message_kernels_ref import (
    LOG_OFFSET_UNKNOWN,
    RECORD_WHOLE,
    STOP_BLANK,
    STOP_END,
    STOP_FULL,
    STOP_INVALID,
    STOP_TRUNCATED,
    check_record,
)

DECODE_STOP_END = STOP_END
DECODE_STOP_FULL = STOP_FULL
DECODE_STOP_TRUNCATED = STOP_TRUNCATED
DECODE_STOP_INVALID = STOP_INVALID
COLUMN_COUNT = 19

# BODYCRC, QUEUEID, FLAG, QUEUEOFFSET, PHYSICALOFFSET, SYSFLAG, BORNTIMESTAMP: bytes 8..48
_FIXED_HEAD = struct.Struct(">iiiqqiq")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")


def _host_size(sysflag: int, v6_bit: int) -> int:
    """Address + port bytes of one host: 16 + 4 when its sysflag bit is set, else 4 + 4."""
    return 20 if sysflag & v6_bit else 8


def _tags_value_span(properties: bytes, properties_at: int) -> tuple[int, int]:
    """(start, size) of the last non-empty TAGS value, (-1, 0) when there is none."""
    found = (-1, 0)
    entry_at = properties_at
    for entry in properties.split(b"\x02"):
        name, separator, value = entry.partition(b"\x01")
        if separator and name == b"TAGS" and value:
            found = (entry_at + len(name) + 1, len(value))
        entry_at += len(entry) + 1
    return found


def decode_pull_records(
    body: NDArray[np.uint8], start_bytes: int, end_bytes: int, out: NDArray[np.int64]
) -> tuple[int, int, int]:
    """Same contract as pull_kernels.decode_pull_records."""
    assert 0 <= start_bytes <= end_bytes <= body.size
    assert out.shape[0] == COLUMN_COUNT
    data = body[:end_bytes].tobytes()
    rows: list[list[int]] = []
    position = start_bytes
    stop = DECODE_STOP_END
    while position != end_bytes:
        if len(rows) == out.shape[1]:
            stop = DECODE_STOP_FULL
            break
        verdict, size, body_at, topic_at, properties_at = check_record(
            body, position, end_bytes, LOG_OFFSET_UNKNOWN, False, True
        )
        if verdict != RECORD_WHOLE:
            stop = DECODE_STOP_INVALID if verdict == STOP_BLANK else verdict
            break
        record = data[position : position + size]
        _crc, queue_id, flag, queue_index, log_offset, sysflag, born_ms = _FIXED_HEAD.unpack_from(
            record, 8
        )
        born_host_size = _host_size(sysflag, 0x10)
        store_host_size = _host_size(sysflag, 0x20)
        store_ms_at = 48 + born_host_size
        store_host_at = store_ms_at + 8
        reconsume_at = store_host_at + store_host_size
        tags_at, tags_size = _tags_value_span(data[properties_at : position + size], properties_at)
        rows.append(
            [
                position,
                size,
                queue_id,
                flag,
                queue_index,
                log_offset,
                sysflag,
                born_ms,
                _INT64.unpack_from(record, store_ms_at)[0],
                position + store_host_at,
                _INT32.unpack_from(record, reconsume_at)[0],
                body_at,
                topic_at - 1 - body_at,
                topic_at,
                properties_at - 2 - topic_at,
                properties_at,
                position + size - properties_at,
                tags_at,
                tags_size,
            ]
        )
        position += size
    for index, row in enumerate(rows):
        out[:, index] = row
    return len(rows), position, stop
