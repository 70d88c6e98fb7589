"""Plain-Python twins of store/kernels.py: the same contracts, restated for tests.

Owns: a second statement of crc32 and scan_records in struct.unpack_from and plain loops. It shares
no helper with the kernels: the CRC comes from zlib, the TAGS value from a bytes split, and its
hash from message.java_utf8_decode plus message.java_string_hash. A unit test feeds both the same
bytes (valid records, torn tails, noise) and asserts the same answers.

Never: used on the data plane, or changed without its kernel.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np
from numpy.typing import NDArray

from mqbox.message import (
    BLANK_MAGIC,
    MESSAGE_MAGIC,
    java_string_hash,
    java_utf8_decode,
)

SCAN_STOP_END = 0
SCAN_STOP_FULL = 1
SCAN_STOP_BLANK = 2
SCAN_STOP_TRUNCATED = 3
SCAN_STOP_INVALID = 4
SCAN_STOP_CRC_MISMATCH = 5
SCAN_STOP_OFFSET_MISMATCH = 6

# Fields read by the scan, with their positions restated from docs section 5.1.
_SIZE_AND_MAGIC = struct.Struct(">iI")  # TOTALSIZE at 0, MAGICCODE at 4
_BODYCRC = struct.Struct(">I")  # at 8
_QUEUEID = struct.Struct(">i")  # at 12
_QUEUEOFFSET = struct.Struct(">q")  # at 20
_PHYSICALOFFSET = struct.Struct(">q")  # at 28
_SYSFLAG = struct.Struct(">i")  # at 36
_STORETIMESTAMP = struct.Struct(">q")  # at 56
_BODY_LENGTH = struct.Struct(">i")  # at 84; the body follows at 88
_PROPERTIES_LENGTH = struct.Struct(">h")
_FIXED_SIZE_BYTES = 91  # everything but body, topic and properties
_TOPIC_SIZE_BYTES_MAX = 127
_HOSTS_V6 = 0x10 | 0x20


def crc32(buf: NDArray[np.uint8], start: int, end: int) -> int:
    """Same contract as store.kernels.crc32."""
    assert 0 <= start <= end <= buf.size
    return zlib.crc32(buf[start:end].tobytes())


def _tags_value(properties: bytes) -> bytes | None:
    """The last non-empty TAGS value of a properties string, as message.decode_properties reads."""
    value: bytes | None = None
    for entry in properties.split(b"\x02"):
        name, separator, candidate = entry.partition(b"\x01")
        if separator and name == b"TAGS" and candidate:
            value = candidate
    return value


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
    """Same contract as store.kernels.scan_records."""
    assert 0 <= start_bytes <= end_bytes <= segment.size
    assert base_log_offset_bytes >= 0
    outs = (
        out_log_offset_bytes,
        out_size_bytes,
        out_queue_id,
        out_queue_index,
        out_tag_hash,
        out_store_timestamp_ms,
    )
    capacity = out_log_offset_bytes.size
    assert all(out.size == capacity for out in outs)
    data = segment[:end_bytes].tobytes()
    position = start_bytes
    count = 0
    while True:
        if position == end_bytes:
            return count, position, SCAN_STOP_END
        if count == capacity:
            return count, position, SCAN_STOP_FULL
        left = end_bytes - position
        if left < _SIZE_AND_MAGIC.size:
            return count, position, SCAN_STOP_TRUNCATED
        size, magic = _SIZE_AND_MAGIC.unpack_from(data, position)
        if magic == BLANK_MAGIC:
            return count, position, SCAN_STOP_BLANK
        if magic != MESSAGE_MAGIC or size < _FIXED_SIZE_BYTES:
            return count, position, SCAN_STOP_INVALID
        if size > left:
            return count, position, SCAN_STOP_TRUNCATED
        record = data[position : position + size]
        (sysflag,) = _SYSFLAG.unpack_from(record, 36)
        (body_size,) = _BODY_LENGTH.unpack_from(record, 84)
        if sysflag & _HOSTS_V6 or not 0 <= body_size <= size - _FIXED_SIZE_BYTES:
            return count, position, SCAN_STOP_INVALID
        body = record[88 : 88 + body_size]
        topic_size = record[88 + body_size]
        if topic_size > _TOPIC_SIZE_BYTES_MAX or _FIXED_SIZE_BYTES + body_size + topic_size > size:
            return count, position, SCAN_STOP_INVALID
        properties_length_at = 88 + body_size + 1 + topic_size
        (properties_size,) = _PROPERTIES_LENGTH.unpack_from(record, properties_length_at)
        if _FIXED_SIZE_BYTES + body_size + topic_size + properties_size != size:
            return count, position, SCAN_STOP_INVALID
        (physical_offset,) = _PHYSICALOFFSET.unpack_from(record, 28)
        if physical_offset != base_log_offset_bytes + position:
            return count, position, SCAN_STOP_OFFSET_MISMATCH
        if check_crc and zlib.crc32(body) & 0x7FFFFFFF != _BODYCRC.unpack_from(record, 8)[0]:
            return count, position, SCAN_STOP_CRC_MISMATCH
        tags = _tags_value(record[properties_length_at + 2 :])
        out_log_offset_bytes[count] = base_log_offset_bytes + position
        out_size_bytes[count] = size
        out_queue_id[count] = _QUEUEID.unpack_from(record, 12)[0]
        out_queue_index[count] = _QUEUEOFFSET.unpack_from(record, 20)[0]
        out_tag_hash[count] = 0 if tags is None else java_string_hash(java_utf8_decode(tags))
        out_store_timestamp_ms[count] = _STORETIMESTAMP.unpack_from(record, 56)[0]
        count += 1
        position += size
