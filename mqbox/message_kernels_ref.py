"""Plain-Python twins of message_kernels.py: the same contracts, restated for tests.

Owns: a second statement of split_batch, java_hash_utf8 and find_property, written with
struct.unpack_from, bytes methods and plain loops. It shares no helper with the kernels, so a unit
test that feeds both the same bytes and gets the same answers checks two independent readings of
each rule (aiokafka and stumpy keep twins the same way). java_hash_utf8 here goes the long way
round on purpose: decode to a str as Java would (message.java_utf8_decode), then hash its UTF-16
code units (message.java_string_hash); the kernel does both in one streaming pass.

Never: used on the data plane (it is slow), or changed without its kernel.
"""

from __future__ import annotations

import struct

import numpy as np
from numpy.typing import NDArray

from mqbox.message import java_string_hash, java_utf8_decode

SPLIT_BATCH_TRUNCATED = -1
SPLIT_BATCH_SIZE_MISMATCH = -2
SPLIT_BATCH_BODY_TOO_LARGE = -3
SPLIT_BATCH_TOO_MANY = -4

_ELEMENT_HEAD = struct.Struct(">iIiii")  # TOTALSIZE, MAGIC, BODYCRC, FLAG, BODYLEN
_PROPERTIES_LENGTH = struct.Struct(">h")


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
