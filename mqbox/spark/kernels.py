"""The connector's data plane: numba loops between pulled records, Arrow buffers and batch bodies.

Owns, for the source (arrow_decode.py is the parent):
- gather_spans: copy byte spans of a buffer back to back, with Arrow's int32 offsets;
- split_properties: each record's properties string as (name, value) spans, Java's parsing rules,
  and where its KEYS and UNIQ_KEY values are.
For the sink (arrow_encode.py is the parent):
- hash_spans: fold one column's bytes into each row's 128-bit content hash;
- count_occurrences, grow_occurrences: the how-many-th time a row's content hash is seen in a
  partition, in a table that grows;
- java_hashes: Java's String.hashCode of each sharding key (the queue selector's input);
- encode_map_properties: a map column's entries as `name 0x01 value 0x02` strings, per row;
- encode_elements: rows as elements of a SEND_BATCH_MESSAGE body (message.py draws the layout).

kernels_ref.py restates every contract in plain Python; tests/unit/spark/test_kernels.py feeds
both the same input drawn by hypothesis and requires the same output (docs/style.md section 4).

Never: imports anything but mqbox._jit, mqbox.message and mqbox.message_kernels, allocates, raises
for bad bytes, or reads outside the spans the parent gives: every span the parent passes lies
inside its buffer (the parent built it from Arrow offsets or the pull decoder's table).

Spans: a field of row i is `data[starts[i]:starts[i] + sizes[i]]`; starts[i] < 0 means null.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from mqbox._jit import kernel
from mqbox.message import (
    BATCH_BODY_LENGTH_POSITION_BYTES,
    BATCH_BODY_POSITION_BYTES,
    BATCH_ELEMENT_SIZE_BYTES_MIN,
    PROPERTY_NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
)
from mqbox.message_kernels import java_hash_utf8, write_i32_be

# --- Source: spans to Arrow ---------------------------------------------------------------------


@kernel
def gather_spans(
    data: NDArray[np.uint8],
    starts: NDArray[np.int64],
    sizes: NDArray[np.int64],
    out_data: NDArray[np.uint8],
    out_offsets: NDArray[np.int32],
) -> int:
    """Copy span i (null: nothing) to out_data after span i - 1; out_offsets[i] is where it
    starts, out_offsets[n] the end (Arrow's binary layout). Returns the bytes written; out_data
    holds the sum of the non-null sizes."""
    count = starts.size
    at = 0
    out_offsets[0] = 0
    for row in range(count):
        start = starts[row]
        if start >= 0:
            size = sizes[row]
            target = out_data[at : at + size]
            source = data[start : start + size]
            for index in range(size):
                target[index] = source[index]
            at += size
        out_offsets[row + 1] = at
    return at


@kernel
def _same_bytes(data: NDArray[np.uint8], a: int, b: int, size: int) -> bool:
    for index in range(size):  # noqa: SIM110 (numba compiles loops, not all() over generators)
        if data[a + index] != data[b + index]:
            return False
    return True


@kernel
def _is_name(data: NDArray[np.uint8], start: int, end: int, name: NDArray[np.uint8]) -> bool:
    if end - start != name.size:
        return False
    for index in range(name.size):  # noqa: SIM110 (as in _same_bytes)
        if data[start + index] != name[index]:
            return False
    return True


@kernel
def split_properties(
    data: NDArray[np.uint8],
    starts: NDArray[np.int64],
    sizes: NDArray[np.int64],
    keys_name: NDArray[np.uint8],
    uniq_key_name: NDArray[np.uint8],
    out_name_starts: NDArray[np.int64],
    out_name_sizes: NDArray[np.int64],
    out_value_starts: NDArray[np.int64],
    out_value_sizes: NDArray[np.int64],
    out_record_ends: NDArray[np.int64],
    out_keys_starts: NDArray[np.int64],
    out_keys_sizes: NDArray[np.int64],
    out_uniq_starts: NDArray[np.int64],
    out_uniq_sizes: NDArray[np.int64],
) -> int:
    """Split each record's properties (message.decode_properties's rules: entries end at 0x02 or
    at the end, the name at the entry's first 0x01, entries without 0x01 or with an empty name or
    value are skipped, a later entry of the same name replaces the earlier one's value in its
    place) into entries; return how many. Record i's entries are out_*[out_record_ends[i - 1]:
    out_record_ends[i]]. out_keys_* and out_uniq_* give the KEYS and UNIQ_KEY values (start -1,
    size 0 when absent). The out entry arrays hold at least sum(sizes) // 3 + 1 entries."""
    entry_count = 0
    for record in range(starts.size):
        record_first = entry_count
        out_keys_starts[record] = -1
        out_keys_sizes[record] = 0
        out_uniq_starts[record] = -1
        out_uniq_sizes[record] = 0
        at = starts[record]
        end = at + sizes[record]
        while at < end:
            separator_at = -1
            entry_end = at
            while entry_end < end and data[entry_end] != PROPERTY_SEPARATOR:
                if separator_at < 0 and data[entry_end] == PROPERTY_NAME_VALUE_SEPARATOR:
                    separator_at = entry_end
                entry_end += 1
            if separator_at > at and entry_end > separator_at + 1:
                name_size = separator_at - at
                value_start = separator_at + 1
                value_size = entry_end - value_start
                slot = entry_count
                for earlier in range(record_first, entry_count):
                    if out_name_sizes[earlier] == name_size and _same_bytes(
                        data, out_name_starts[earlier], at, name_size
                    ):
                        slot = earlier
                        break
                if slot == entry_count:
                    out_name_starts[slot] = at
                    out_name_sizes[slot] = name_size
                    entry_count += 1
                out_value_starts[slot] = value_start
                out_value_sizes[slot] = value_size
                if _is_name(data, at, separator_at, keys_name):
                    out_keys_starts[record] = value_start
                    out_keys_sizes[record] = value_size
                elif _is_name(data, at, separator_at, uniq_key_name):
                    out_uniq_starts[record] = value_start
                    out_uniq_sizes[record] = value_size
            at = entry_end + 1
        out_record_ends[record] = entry_count
    return entry_count


# --- Sink: content hashes and occurrences ------------------------------------------------------

_FNV_PRIME = np.uint64(0x100000001B3)
_SECOND_PRIME = np.uint64(0x9E3779B97F4A7C15)
_NULL_MARK = np.uint64(0xFF)
_PRESENT_MARK = np.uint64(0xFE)


@kernel
def hash_spans(
    data: NDArray[np.uint8],
    starts: NDArray[np.int64],
    sizes: NDArray[np.int64],
    hashes_high: NDArray[np.uint64],
    hashes_low: NDArray[np.uint64],
) -> None:
    """Fold field i of every row into its two 64-bit hashes: a mark saying null or present, the
    size's 8 bytes, then the bytes (FNV-1a for `high`, a multiply-xorshift for `low`). Folding
    the size keeps ("ab", "c") apart from ("a", "bc")."""
    for row in range(starts.size):
        high = hashes_high[row]
        low = hashes_low[row]
        start = starts[row]
        if start < 0:
            high = (high ^ _NULL_MARK) * _FNV_PRIME
            low = (low ^ _NULL_MARK) * _SECOND_PRIME
            low ^= low >> np.uint64(29)
        else:
            size = np.uint64(sizes[row])
            high = (high ^ _PRESENT_MARK) * _FNV_PRIME
            low = (low ^ _PRESENT_MARK) * _SECOND_PRIME
            low ^= low >> np.uint64(29)
            for shift in range(8):
                byte = (size >> np.uint64(8 * shift)) & np.uint64(0xFF)
                high = (high ^ byte) * _FNV_PRIME
                low = (low ^ byte) * _SECOND_PRIME
                low ^= low >> np.uint64(29)
            for at in range(start, start + sizes[row]):
                byte = np.uint64(data[at])
                high = (high ^ byte) * _FNV_PRIME
                low = (low ^ byte) * _SECOND_PRIME
                low ^= low >> np.uint64(29)
        hashes_high[row] = high
        hashes_low[row] = low


@kernel
def count_occurrences(
    table_high: NDArray[np.uint64],
    table_low: NDArray[np.uint64],
    table_counts: NDArray[np.int64],
    hashes_high: NDArray[np.uint64],
    hashes_low: NDArray[np.uint64],
    out_occurrences: NDArray[np.int64],
) -> int:
    """For each row in order, how many rows with the same (high, low) hash the table counted
    before it; then count it. Linear probing over 2^k slots, counts 0 = empty. Returns how many
    new hashes took a slot; the caller keeps the table at most half full."""
    mask = table_high.size - 1
    added = 0
    for row in range(hashes_high.size):
        high = hashes_high[row]
        low = hashes_low[row]
        slot = np.int64(high & np.uint64(mask))
        while table_counts[slot] != 0 and (table_high[slot] != high or table_low[slot] != low):
            slot = (slot + 1) & mask
        if table_counts[slot] == 0:
            table_high[slot] = high
            table_low[slot] = low
            added += 1
        out_occurrences[row] = table_counts[slot]
        table_counts[slot] += 1
    return added


# --- Sink: batch bodies -------------------------------------------------------------------------


@kernel
def encode_map_properties(
    entry_offsets: NDArray[np.int64],
    entry_keep: NDArray[np.bool_],
    names: NDArray[np.uint8],
    name_starts: NDArray[np.int64],
    name_sizes: NDArray[np.int64],
    values: NDArray[np.uint8],
    value_starts: NDArray[np.int64],
    value_sizes: NDArray[np.int64],
    out_data: NDArray[np.uint8],
    out_starts: NDArray[np.int64],
    out_sizes: NDArray[np.int64],
) -> int:
    """Row i's kept map entries entry_offsets[i]..entry_offsets[i + 1] as `name 0x01 value
    0x02` back to back in out_data; its span in out_starts/out_sizes. Returns the bytes written;
    out_data holds the kept entries' names and values plus 2 bytes each."""
    at = 0
    for row in range(entry_offsets.size - 1):
        out_starts[row] = at
        for entry in range(entry_offsets[row], entry_offsets[row + 1]):
            if not entry_keep[entry]:
                continue
            for index in range(name_sizes[entry]):
                out_data[at + index] = names[name_starts[entry] + index]
            at += name_sizes[entry]
            out_data[at] = PROPERTY_NAME_VALUE_SEPARATOR
            at += 1
            for index in range(value_sizes[entry]):
                out_data[at + index] = values[value_starts[entry] + index]
            at += value_sizes[entry]
            out_data[at] = PROPERTY_SEPARATOR
            at += 1
        out_sizes[row] = at - out_starts[row]
    return at


@kernel
def _copy_span(
    out: NDArray[np.uint8], at: int, data: NDArray[np.uint8], start: int, size: int
) -> int:
    target = out[at : at + size]
    source = data[start : start + size]
    for index in range(size):
        target[index] = source[index]
    return at + size


@kernel
def _put_property(
    out: NDArray[np.uint8],
    at: int,
    name: NDArray[np.uint8],
    data: NDArray[np.uint8],
    start: int,
    size: int,
) -> int:
    at = _copy_span(out, at, name, 0, name.size)
    out[at] = PROPERTY_NAME_VALUE_SEPARATOR
    at = _copy_span(out, at + 1, data, start, size)
    out[at] = PROPERTY_SEPARATOR
    return at + 1


@kernel
def encode_elements(
    rows: NDArray[np.int64],
    bodies: NDArray[np.uint8],
    body_starts: NDArray[np.int64],
    body_sizes: NDArray[np.int64],
    flags: NDArray[np.int32],
    user_properties: NDArray[np.uint8],
    user_starts: NDArray[np.int64],
    user_sizes: NDArray[np.int64],
    tags: NDArray[np.uint8],
    tags_starts: NDArray[np.int64],
    tags_sizes: NDArray[np.int64],
    keys: NDArray[np.uint8],
    keys_starts: NDArray[np.int64],
    keys_sizes: NDArray[np.int64],
    uniq_keys: NDArray[np.uint8],
    tags_name: NDArray[np.uint8],
    keys_name: NDArray[np.uint8],
    uniq_key_name: NDArray[np.uint8],
    out: NDArray[np.uint8],
) -> int:
    """Write rows[0], rows[1], ... as batch elements back to back into `out`; return the bytes
    written. An element: TOTALSIZE, MAGIC 0, BODYCRC 0, FLAG, BODYLEN (big-endian int32s), the
    body, PROPSLEN (int16), then the row's user properties (already `name 0x01 value 0x02`),
    TAGS and KEYS when present and not empty, and UNIQ_KEY = uniq_keys[row] (a row of that 2-D
    array). The parent checked every size limit and sized `out`."""
    at = 0
    for index in range(rows.size):
        row = rows[index]
        body_size = body_sizes[row]
        properties_size = user_sizes[row] + uniq_key_name.size + 2 + uniq_keys.shape[1]
        if tags_starts[row] >= 0 and tags_sizes[row] > 0:
            properties_size += tags_name.size + 2 + tags_sizes[row]
        if keys_starts[row] >= 0 and keys_sizes[row] > 0:
            properties_size += keys_name.size + 2 + keys_sizes[row]
        element_size = BATCH_ELEMENT_SIZE_BYTES_MIN + body_size + properties_size
        write_i32_be(out, at, element_size)
        write_i32_be(out, at + 4, 0)
        write_i32_be(out, at + 8, 0)
        write_i32_be(out, at + 12, flags[row])
        write_i32_be(out, at + BATCH_BODY_LENGTH_POSITION_BYTES, body_size)
        position = _copy_span(
            out, at + BATCH_BODY_POSITION_BYTES, bodies, body_starts[row], body_size
        )
        out[position] = (properties_size >> 8) & 0xFF
        out[position + 1] = properties_size & 0xFF
        position += 2
        if user_starts[row] >= 0:
            position = _copy_span(out, position, user_properties, user_starts[row], user_sizes[row])
        if tags_starts[row] >= 0 and tags_sizes[row] > 0:
            position = _put_property(
                out, position, tags_name, tags, tags_starts[row], tags_sizes[row]
            )
        if keys_starts[row] >= 0 and keys_sizes[row] > 0:
            position = _put_property(
                out, position, keys_name, keys, keys_starts[row], keys_sizes[row]
            )
        position = _put_property(
            out, position, uniq_key_name, uniq_keys[row], 0, uniq_keys.shape[1]
        )
        at += element_size
    return at


@kernel
def grow_occurrences(
    table_high: NDArray[np.uint64],
    table_low: NDArray[np.uint64],
    table_counts: NDArray[np.int64],
    new_high: NDArray[np.uint64],
    new_low: NDArray[np.uint64],
    new_counts: NDArray[np.int64],
) -> int:
    """Move every counted hash of a count_occurrences table into a larger empty one (2^k slots);
    return how many moved."""
    mask = new_high.size - 1
    moved = 0
    for old in range(table_high.size):
        if table_counts[old] == 0:
            continue
        high = table_high[old]
        slot = np.int64(high & np.uint64(mask))
        while new_counts[slot] != 0:
            slot = (slot + 1) & mask
        new_high[slot] = high
        new_low[slot] = table_low[old]
        new_counts[slot] = table_counts[old]
        moved += 1
    return moved


@kernel
def java_hashes(
    data: NDArray[np.uint8],
    starts: NDArray[np.int64],
    sizes: NDArray[np.int64],
    out_hashes: NDArray[np.int64],
) -> None:
    """Java's String.hashCode of each span's text (message_kernels.java_hash_utf8); 0 for null:
    what selector.by_hash takes for a sharding key."""
    for row in range(starts.size):
        start = starts[row]
        out_hashes[row] = 0 if start < 0 else java_hash_utf8(data, start, start + sizes[row])
