"""Plain-Python twins of the index kernels in index.py, for tests (docs/style.md section 4).

Owns: a restatement of `put_index_batch` and `query_index` with `struct` and plain loops,
sharing no helper with the kernels (only the layout constants). Never: used by the broker at
run time. Invariant: for the same bytes and arguments, each twin leaves the same bytes and
returns the same result as its kernel; tests/unit/store/test_index.py checks it with
hypothesis.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from mqbox.store.layout import (
    INDEX_COUNT_INITIAL,
    INDEX_ENTRY_SIZE_BYTES,
    INDEX_HEADER_BEGIN_LOG_OFFSET_POSITION_BYTES,
    INDEX_HEADER_BEGIN_TIMESTAMP_POSITION_BYTES,
    INDEX_HEADER_END_LOG_OFFSET_POSITION_BYTES,
    INDEX_HEADER_END_TIMESTAMP_POSITION_BYTES,
    INDEX_HEADER_INDEX_COUNT_POSITION_BYTES,
    INDEX_HEADER_SIZE_BYTES,
    INDEX_HEADER_SLOTS_USED_POSITION_BYTES,
    INDEX_SLOT_SIZE_BYTES,
    INT32_MAX,
)

# One entry: key_hash int32, log_offset_bytes int64, time_diff_s int32, prev_index int32.
_ENTRY = struct.Struct(">iqii")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
assert _ENTRY.size == INDEX_ENTRY_SIZE_BYTES


def put_index_batch_ref(
    file_bytes: bytearray,
    slot_count: int,
    entry_count_max: int,
    key_hashes: Sequence[int],
    log_offsets_bytes: Sequence[int],
    store_timestamps_ms: Sequence[int],
) -> int:
    """The contract of index.put_index_batch, one key at a time, header fields as we go."""

    def header_i32(position_bytes: int) -> int:
        value: int = _INT32.unpack_from(file_bytes, position_bytes)[0]
        return value

    def header_i64(position_bytes: int) -> int:
        value: int = _INT64.unpack_from(file_bytes, position_bytes)[0]
        return value

    for position, (key_hash, log_offset_bytes, store_timestamp_ms) in enumerate(
        zip(key_hashes, log_offsets_bytes, store_timestamps_ms, strict=True)
    ):
        if not 0 <= key_hash <= INT32_MAX or log_offset_bytes < 0 or store_timestamp_ms < 0:
            return -1 - position
    put_count = 0
    for key_hash, log_offset_bytes, store_timestamp_ms in zip(
        key_hashes, log_offsets_bytes, store_timestamps_ms, strict=True
    ):
        index_count = max(header_i32(INDEX_HEADER_INDEX_COUNT_POSITION_BYTES), INDEX_COUNT_INITIAL)
        if index_count >= entry_count_max:
            break
        slot_position_bytes = INDEX_HEADER_SIZE_BYTES + (key_hash % slot_count) * (
            INDEX_SLOT_SIZE_BYTES
        )
        slot_value = header_i32(slot_position_bytes)
        chain_to = slot_value if 0 < slot_value < index_count else 0
        begin_timestamp_ms = header_i64(INDEX_HEADER_BEGIN_TIMESTAMP_POSITION_BYTES)
        if begin_timestamp_ms <= 0:
            time_diff_s = 0
        else:
            time_diff_s = min(max((store_timestamp_ms - begin_timestamp_ms) // 1000, 0), INT32_MAX)
        entry_position_bytes = (
            INDEX_HEADER_SIZE_BYTES
            + slot_count * INDEX_SLOT_SIZE_BYTES
            + index_count * INDEX_ENTRY_SIZE_BYTES
        )
        _ENTRY.pack_into(
            file_bytes, entry_position_bytes, key_hash, log_offset_bytes, time_diff_s, chain_to
        )
        _INT32.pack_into(file_bytes, slot_position_bytes, index_count)
        if index_count == INDEX_COUNT_INITIAL:
            _INT64.pack_into(
                file_bytes, INDEX_HEADER_BEGIN_TIMESTAMP_POSITION_BYTES, store_timestamp_ms
            )
            _INT64.pack_into(
                file_bytes, INDEX_HEADER_BEGIN_LOG_OFFSET_POSITION_BYTES, log_offset_bytes
            )
        if chain_to == 0:
            _INT32.pack_into(
                file_bytes,
                INDEX_HEADER_SLOTS_USED_POSITION_BYTES,
                header_i32(INDEX_HEADER_SLOTS_USED_POSITION_BYTES) + 1,
            )
        _INT32.pack_into(file_bytes, INDEX_HEADER_INDEX_COUNT_POSITION_BYTES, index_count + 1)
        _INT64.pack_into(file_bytes, INDEX_HEADER_END_TIMESTAMP_POSITION_BYTES, store_timestamp_ms)
        _INT64.pack_into(file_bytes, INDEX_HEADER_END_LOG_OFFSET_POSITION_BYTES, log_offset_bytes)
        put_count += 1
    return put_count


def query_index_ref(
    file_bytes: bytes | bytearray,
    slot_count: int,
    key_hash: int,
    begin_ms: int,
    end_ms: int,
    count_max: int,
) -> list[int]:
    """The contract of index.query_index, returning a list instead of filling an array."""
    (index_count,) = _INT32.unpack_from(file_bytes, INDEX_HEADER_INDEX_COUNT_POSITION_BYTES)
    (begin_timestamp_ms,) = _INT64.unpack_from(
        file_bytes, INDEX_HEADER_BEGIN_TIMESTAMP_POSITION_BYTES
    )
    slot_position_bytes = INDEX_HEADER_SIZE_BYTES + (key_hash % slot_count) * INDEX_SLOT_SIZE_BYTES
    (entry_number,) = _INT32.unpack_from(file_bytes, slot_position_bytes)
    found: list[int] = []
    if not 0 < entry_number < index_count:
        return found
    while len(found) < count_max:
        entry_position_bytes = (
            INDEX_HEADER_SIZE_BYTES
            + slot_count * INDEX_SLOT_SIZE_BYTES
            + entry_number * INDEX_ENTRY_SIZE_BYTES
        )
        entry_key_hash, log_offset_bytes, time_diff_s, prev_index = _ENTRY.unpack_from(
            file_bytes, entry_position_bytes
        )
        if time_diff_s < 0:
            break
        second_start_ms = begin_timestamp_ms + time_diff_s * 1000
        second_end_ms = second_start_ms + 999
        overlaps = second_start_ms <= end_ms and begin_ms <= second_end_ms
        if entry_key_hash == key_hash and overlaps:
            found.append(log_offset_bytes)
        if second_end_ms < begin_ms or not 0 < prev_index < entry_number:
            break
        entry_number = prev_index
    return found
