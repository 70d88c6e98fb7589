"""Plain-Python twins of message_kernels.py: the same contracts, restated for tests.

Owns: a second statement of crc32, check_record, cut_records, split_batch, java_hash_utf8,
java_hash_utf8_from and find_property, written with zlib, struct.unpack_from, bytes methods and
plain loops. It shares no helper with the kernels, so a unit test that feeds both the same bytes
and gets the same answers checks two independent readings of each rule (aiokafka and stumpy
keep twins the same way). The walkers' twins (store/kernels_ref.py,
store/dispatch_kernels_ref.py, client/pull_kernels_ref.py) check each record with this
check_record, as their kernels do with the kernel. java_hash_utf8 here goes the long way round
on purpose: decode to a str as Java would (message.java_utf8_decode), then hash its UTF-16 code
units (message.java_string_hash); the kernel does both in one streaming pass.

Never: used on the data plane (it is slow), or changed without its kernel.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np
from numpy.typing import NDArray

from mqbox.message import java_string_hash, java_utf8_decode

STOP_END = 0
STOP_FULL = 1
STOP_BLANK = 2
STOP_TRUNCATED = 3
STOP_INVALID = 4
STOP_CRC_MISMATCH = 5
STOP_OFFSET_MISMATCH = 6
RECORD_WHOLE = -1
LOG_OFFSET_UNKNOWN = -1

SPLIT_BATCH_TRUNCATED = -1
SPLIT_BATCH_SIZE_MISMATCH = -2
SPLIT_BATCH_BODY_TOO_LARGE = -3
SPLIT_BATCH_TOO_MANY = -4

# Restated from message.py's record diagram: the fixed part of a record with IPv4 hosts.
_SIZE_AND_MAGIC = struct.Struct(">iI")  # TOTALSIZE at 0, MAGICCODE at 4
_BODYCRC = struct.Struct(">I")  # at 8
_PHYSICALOFFSET = struct.Struct(">q")  # at 28
_SYSFLAG = struct.Struct(">i")  # at 36; 0x10: born host IPv6, 0x20: store host IPv6
_INT32 = struct.Struct(">i")
_MESSAGE_MAGIC = 0xDAA320A7
_BLANK_MAGIC = 0xCBD43194
_FIXED_SIZE_BYTES = 91  # everything but body, topic and properties, IPv4 hosts
_BODY_LENGTH_AT = 84  # IPv4 hosts; each IPv6 host moves it by 12
_TOPIC_SIZE_BYTES_MAX = 127
_ELEMENT_HEAD = struct.Struct(">iIiii")  # TOTALSIZE, MAGIC, BODYCRC, FLAG, BODYLEN
_PROPERTIES_LENGTH = struct.Struct(">h")


def crc32(buf: NDArray[np.uint8], start: int, end: int) -> int:
    """Same contract as message_kernels.crc32."""
    assert 0 <= start <= end <= buf.size
    return zlib.crc32(buf[start:end].tobytes())


def check_record(
    buf: NDArray[np.uint8],
    position_bytes: int,
    end_bytes: int,
    base_log_offset_bytes: int,
    check_crc: bool,
    hosts_v6_allowed: bool,
) -> tuple[int, int, int, int, int]:
    """Same contract as message_kernels.check_record."""
    assert 0 <= position_bytes <= end_bytes <= buf.size
    refused = (0, 0, 0, 0)
    data = buf[position_bytes:end_bytes].tobytes()
    if len(data) < _SIZE_AND_MAGIC.size:
        return (STOP_TRUNCATED, *refused)
    size, magic = _SIZE_AND_MAGIC.unpack_from(data, 0)
    if magic == _BLANK_MAGIC:
        return (STOP_BLANK, *refused)
    if magic != _MESSAGE_MAGIC or size < _FIXED_SIZE_BYTES:
        return (STOP_INVALID, *refused)
    if size > len(data):
        return (STOP_TRUNCATED, *refused)
    record = data[:size]
    (sysflag,) = _SYSFLAG.unpack_from(record, 36)
    v6_host_count = (sysflag & 0x10 != 0) + (sysflag & 0x20 != 0)
    if v6_host_count and not hosts_v6_allowed:
        return (STOP_INVALID, *refused)
    fixed = _FIXED_SIZE_BYTES + 12 * v6_host_count
    body_length_at = _BODY_LENGTH_AT + 12 * v6_host_count
    if size < fixed:
        return (STOP_INVALID, *refused)
    (body_size,) = _INT32.unpack_from(record, body_length_at)
    if not 0 <= body_size <= size - fixed:
        return (STOP_INVALID, *refused)
    body_at = body_length_at + 4
    topic_size = record[body_at + body_size]
    if topic_size > _TOPIC_SIZE_BYTES_MAX or fixed + body_size + topic_size > size:
        return (STOP_INVALID, *refused)
    topic_at = body_at + body_size + 1
    (properties_size,) = _PROPERTIES_LENGTH.unpack_from(record, topic_at + topic_size)
    if fixed + body_size + topic_size + properties_size != size:
        return (STOP_INVALID, *refused)
    if base_log_offset_bytes != LOG_OFFSET_UNKNOWN:
        (log_offset,) = _PHYSICALOFFSET.unpack_from(record, 28)
        if log_offset != base_log_offset_bytes + position_bytes:
            return (STOP_OFFSET_MISMATCH, *refused)
    if check_crc:
        body = record[body_at : body_at + body_size]
        if zlib.crc32(body) & 0x7FFFFFFF != _BODYCRC.unpack_from(record, 8)[0]:
            return (STOP_CRC_MISMATCH, *refused)
    return (
        RECORD_WHOLE,
        size,
        position_bytes + body_at,
        position_bytes + topic_at,
        position_bytes + topic_at + topic_size + 2,
    )


CUT_MORE = 0
CUT_CHUNK = 1
CUT_BLANK = 2
CUT_INVALID = 3
CUT_CROSSES = 4


def cut_records(
    buf: NDArray[np.uint8],
    start_bytes: int,
    end_bytes: int,
    chunk_end_bytes: int,
    segment_end_bytes: int,
    record_size_bytes_max: int,
) -> tuple[int, int, int]:
    """Same contract as message_kernels.cut_records."""
    assert 0 <= start_bytes <= end_bytes <= buf.size
    data = buf[:end_bytes].tobytes()
    position = start_bytes
    records = 0
    while position < chunk_end_bytes:
        if len(data) - position < _SIZE_AND_MAGIC.size:
            return position, CUT_MORE, records
        size, magic = _SIZE_AND_MAGIC.unpack_from(data, position)
        if magic == _BLANK_MAGIC:
            return position, CUT_BLANK, records
        if magic != _MESSAGE_MAGIC or not _FIXED_SIZE_BYTES <= size <= record_size_bytes_max:
            return position, CUT_INVALID, records
        if position + size + _SIZE_AND_MAGIC.size > segment_end_bytes:
            return position, CUT_CROSSES, records
        if position + size > len(data):
            return position, CUT_MORE, records
        position += size
        records += 1
    return position, CUT_CHUNK, records


def split_batch(
    body: NDArray[np.uint8],
    body_size_bytes_max: int,
    out_offset_bytes: NDArray[np.int64],
    out_size_bytes: NDArray[np.int32],
) -> int:
    """Same contract as message_kernels.split_batch."""
    assert body_size_bytes_max >= 0
    assert out_size_bytes.size == out_offset_bytes.size
    data = body.tobytes()
    offsets: list[int] = []
    sizes: list[int] = []
    position_bytes = 0
    while position_bytes < len(data):
        if len(offsets) == out_offset_bytes.size:
            return SPLIT_BATCH_TOO_MANY
        left_bytes = len(data) - position_bytes
        if left_bytes < _ELEMENT_HEAD.size + _PROPERTIES_LENGTH.size:
            return SPLIT_BATCH_TRUNCATED
        size_bytes, _, _, _, body_size_bytes = _ELEMENT_HEAD.unpack_from(data, position_bytes)
        if size_bytes < _ELEMENT_HEAD.size + _PROPERTIES_LENGTH.size:
            return SPLIT_BATCH_SIZE_MISMATCH
        if size_bytes > left_bytes:
            return SPLIT_BATCH_TRUNCATED
        if not 0 <= body_size_bytes <= size_bytes - _ELEMENT_HEAD.size - _PROPERTIES_LENGTH.size:
            return SPLIT_BATCH_SIZE_MISMATCH
        if body_size_bytes > body_size_bytes_max:
            return SPLIT_BATCH_BODY_TOO_LARGE
        properties_length_at_bytes = position_bytes + _ELEMENT_HEAD.size + body_size_bytes
        (properties_size_bytes,) = _PROPERTIES_LENGTH.unpack_from(data, properties_length_at_bytes)
        after_bytes = properties_length_at_bytes + _PROPERTIES_LENGTH.size + properties_size_bytes
        if after_bytes != position_bytes + size_bytes:
            return SPLIT_BATCH_SIZE_MISMATCH
        offsets.append(position_bytes)
        sizes.append(size_bytes)
        position_bytes = after_bytes
    for index, (offset_bytes, size_bytes) in enumerate(zip(offsets, sizes, strict=True)):
        out_offset_bytes[index] = offset_bytes
        out_size_bytes[index] = size_bytes
    return len(offsets)


def java_hash_utf8(buf: NDArray[np.uint8], start: int, end: int) -> int:
    """Same contract as message_kernels.java_hash_utf8."""
    assert 0 <= start <= end <= buf.size
    return java_string_hash(java_utf8_decode(buf[start:end].tobytes()))


def java_hash_utf8_from(buf: NDArray[np.uint8], start: int, end: int, state: int) -> int:
    """Same contract as message_kernels.java_hash_utf8_from: the decoded text's UTF-16 units
    folded into `state` one by one."""
    assert 0 <= start <= end <= buf.size
    assert 0 <= state <= 0xFFFFFFFF
    units = java_utf8_decode(buf[start:end].tobytes()).encode("utf-16-be", "surrogatepass")
    for at in range(0, len(units), 2):
        state = (state * 31 + int.from_bytes(units[at : at + 2], "big")) & 0xFFFFFFFF
    return state


def find_property(
    buf: NDArray[np.uint8], start: int, end: int, name: NDArray[np.uint8]
) -> tuple[int, int]:
    """Same contract as message_kernels.find_property."""
    assert 0 <= start <= end <= buf.size
    wanted = name.tobytes()
    assert wanted
    assert b"\x01" not in wanted
    assert b"\x02" not in wanted
    found = (-1, -1)
    entry_at = start
    for entry in buf[start:end].tobytes().split(b"\x02"):
        entry_name, separator, value = entry.partition(b"\x01")
        if separator and value and entry_name == wanted:
            value_start = entry_at + len(entry_name) + 1
            found = (value_start, value_start + len(value))
        entry_at += len(entry) + 1
    return found
