"""Plain-Python twin of store/kernels.py: the same contract, restated for tests.

Owns: a second statement of scan_records in struct.unpack_from and plain loops. It shares no
helper with the kernel: each record is checked by message_kernels_ref.check_record (the twin of
the record check), the TAGS value comes from a bytes split, and its hash from
message.java_utf8_decode plus message.java_string_hash. A unit test feeds both the same bytes
(valid records, torn tails, noise) and asserts the same answers.

Never: used on the data plane, or changed without its kernel.
"""

from __future__ import annotations

import struct

import numpy as np
from numpy.typing import NDArray

from mqbox.message import java_string_hash, java_utf8_decode
from mqbox.message_kernels_ref import RECORD_WHOLE, STOP_END, STOP_FULL, check_record

# Fields read by the scan, with their positions restated from message.py's record diagram.
_QUEUEID = struct.Struct(">i")  # at 12
_QUEUEOFFSET = struct.Struct(">q")  # at 20
_STORETIMESTAMP = struct.Struct(">q")  # at 56


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
            return count, position, STOP_END
        if count == capacity:
            return count, position, STOP_FULL
        verdict, size, _body_at, _topic_at, properties_at = check_record(
            segment, position, end_bytes, base_log_offset_bytes, check_crc, False
        )
        if verdict != RECORD_WHOLE:
            return count, position, verdict
        tags = _tags_value(data[properties_at : position + size])
        out_log_offset_bytes[count] = base_log_offset_bytes + position
        out_size_bytes[count] = size
        out_queue_id[count] = _QUEUEID.unpack_from(data, position + 12)[0]
        out_queue_index[count] = _QUEUEOFFSET.unpack_from(data, position + 20)[0]
        out_tag_hash[count] = 0 if tags is None else java_string_hash(java_utf8_decode(tags))
        out_store_timestamp_ms[count] = _STORETIMESTAMP.unpack_from(data, position + 56)[0]
        count += 1
        position += size
