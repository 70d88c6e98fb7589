"""Kernels over message bytes: the data plane's byte layer, and the message rules in numba.

Owns: the big-endian readers and writers and the vectorising copy that every kernel over stored
records, consume-queue entries and index files uses (one copy of each, here); and the numba
data-plane versions of three message.py rules: split a batch body, hash a tag, find a property.
message_kernels_ref.py restates each rule in plain Python; a unit test feeds both the same
hypothesis-built bytes and asserts they agree exactly (STYLE.md section 4).

Never: imports anything but mqbox._jit and mqbox.message, allocates inside a kernel, raises for
bad input (a kernel returns a code; the Python parent decides), or reads outside [start, end):
every read is guarded by a length check first, because kernels run with boundscheck off.

Integers: every value read from a buffer is widened to int64 at once (np.int64), because numba
keeps uint8 arithmetic in uint8, and mixing uint64 with int64 gives float64. int() around the
result is the identity in numba and tells mypy the kernel returns a Python int. A writer stores
the low 16, 32 or 64 bits of its value, so signed and unsigned values of that width are written
alike (two's complement), as Java's ByteBuffer.putInt and putLong do.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from mqbox._jit import inline_kernel, kernel
from mqbox.message import (
    BATCH_BODY_LENGTH_POSITION_BYTES,
    BATCH_BODY_POSITION_BYTES,
    BATCH_ELEMENT_SIZE_BYTES_MIN,
    BATCH_TOTALSIZE_POSITION_BYTES,
    PROPERTIES_LENGTH_SIZE_BYTES,
    PROPERTY_NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
)

# --- Big-endian readers and writers, and the copy (helpers inlined into the kernels) --------------


@kernel
def read_u8(buf: NDArray[np.uint8], at: int) -> int:
    """buf[at] as an int64."""
    return int(np.int64(buf[at]))


@kernel
def read_s16_be(buf: NDArray[np.uint8], at: int) -> int:
    """The signed big-endian int16 at buf[at:at + 2]."""
    value = read_u8(buf, at) << 8 | read_u8(buf, at + 1)
    return value - ((value & 0x8000) << 1)


@kernel
def read_u32_be(buf: NDArray[np.uint8], at: int) -> int:
    """The unsigned big-endian int32 at buf[at:at + 4], as a non-negative int64."""
    return (
        read_u8(buf, at) << 24
        | read_u8(buf, at + 1) << 16
        | read_u8(buf, at + 2) << 8
        | read_u8(buf, at + 3)
    )


@kernel
def read_s32_be(buf: NDArray[np.uint8], at: int) -> int:
    """The signed big-endian int32 at buf[at:at + 4]."""
    value = read_u32_be(buf, at)
    return value - ((value & 0x80000000) << 1)


@inline_kernel
def read_s64_be(buf: NDArray[np.uint8], at: int) -> int:
    """The signed big-endian int64 at buf[at:at + 8].

    The high half is signed, so shifting it left by 32 stays inside int64 and the result is exact.
    """
    return read_s32_be(buf, at) << 32 | read_u32_be(buf, at + 4)


@inline_kernel
def write_i16_be(buf: NDArray[np.uint8], at: int, value: int) -> None:
    """Store the low 16 bits of `value` big-endian at buf[at:at + 2]."""
    buf[at] = (value >> 8) & 0xFF
    buf[at + 1] = value & 0xFF


@inline_kernel
def write_i32_be(buf: NDArray[np.uint8], at: int, value: int) -> None:
    """Store the low 32 bits of `value` big-endian at buf[at:at + 4]."""
    buf[at] = (value >> 24) & 0xFF
    buf[at + 1] = (value >> 16) & 0xFF
    buf[at + 2] = (value >> 8) & 0xFF
    buf[at + 3] = value & 0xFF


@inline_kernel
def write_i64_be(buf: NDArray[np.uint8], at: int, value: int) -> None:
    """Store `value` big-endian at buf[at:at + 8]."""
    buf[at] = (value >> 56) & 0xFF
    buf[at + 1] = (value >> 48) & 0xFF
    buf[at + 2] = (value >> 40) & 0xFF
    buf[at + 3] = (value >> 32) & 0xFF
    buf[at + 4] = (value >> 24) & 0xFF
    buf[at + 5] = (value >> 16) & 0xFF
    buf[at + 6] = (value >> 8) & 0xFF
    buf[at + 7] = value & 0xFF


@kernel
def copy_bytes(
    target: NDArray[np.uint8],
    target_at: int,
    source: NDArray[np.uint8],
    source_at: int,
    size_bytes: int,
) -> None:
    """target[target_at:target_at + size_bytes] = source[source_at:source_at + size_bytes].

    Written as a loop over two local slices indexed from 0, because LLVM then vectorises it
    (measured 10 GB/s); a slice assignment, or a loop indexing both whole arrays at offsets,
    copies about a byte per cycle (2.5 GB/s), LLVM being unsure that they do not overlap.
    """
    target_slice = target[target_at : target_at + size_bytes]
    source_slice = source[source_at : source_at + size_bytes]
    for index in range(size_bytes):
        target_slice[index] = source_slice[index]


# --- split_batch --------------------------------------------------------------------------------

# Negative results of split_batch; the parent turns each into MessageIllegalError (or
# MessageTooLargeError for SPLIT_BATCH_BODY_TOO_LARGE), as message.decode_batch does.
SPLIT_BATCH_TRUNCATED = -1  # fewer bytes left than the element needs
SPLIT_BATCH_SIZE_MISMATCH = -2  # TOTALSIZE disagrees with the body and properties lengths
SPLIT_BATCH_BODY_TOO_LARGE = -3  # an element body over body_size_bytes_max
SPLIT_BATCH_TOO_MANY = -4  # more elements than the out arrays hold


@kernel
def split_batch(
    body: NDArray[np.uint8],
    body_size_bytes_max: int,
    out_offset_bytes: NDArray[np.int64],
    out_size_bytes: NDArray[np.int32],
) -> int:
    """Split a plain batch body into its elements; return their count or a SPLIT_BATCH_* code.

    out_offset_bytes[i] is where element i starts inside `body` and out_size_bytes[i] its
    TOTALSIZE; entries past the count are left as they were, and after a negative result the
    arrays may hold a partial split. An empty body gives 0 (the parent refuses an empty batch).

    Checks per element, in this order: room in the out arrays; at least 22 bytes left; TOTALSIZE
    >= 22; TOTALSIZE within the bytes left; 0 <= body length <= TOTALSIZE - 22; body length <=
    body_size_bytes_max; 22 + body + properties length == TOTALSIZE.
    """
    assert body_size_bytes_max >= 0
    capacity = out_offset_bytes.size
    assert out_size_bytes.size == capacity
    end_bytes = body.size
    position_bytes = 0
    count = 0
    while position_bytes < end_bytes:
        if count == capacity:
            return SPLIT_BATCH_TOO_MANY
        available_bytes = end_bytes - position_bytes
        if available_bytes < BATCH_ELEMENT_SIZE_BYTES_MIN:
            return SPLIT_BATCH_TRUNCATED
        size_bytes = read_s32_be(body, position_bytes + BATCH_TOTALSIZE_POSITION_BYTES)
        if size_bytes < BATCH_ELEMENT_SIZE_BYTES_MIN:
            return SPLIT_BATCH_SIZE_MISMATCH
        if size_bytes > available_bytes:
            return SPLIT_BATCH_TRUNCATED
        element_body_size_bytes = read_s32_be(
            body, position_bytes + BATCH_BODY_LENGTH_POSITION_BYTES
        )
        if element_body_size_bytes < 0:
            return SPLIT_BATCH_SIZE_MISMATCH
        if element_body_size_bytes > size_bytes - BATCH_ELEMENT_SIZE_BYTES_MIN:
            return SPLIT_BATCH_SIZE_MISMATCH
        if element_body_size_bytes > body_size_bytes_max:
            return SPLIT_BATCH_BODY_TOO_LARGE
        properties_size_bytes = read_s16_be(
            body, position_bytes + BATCH_BODY_POSITION_BYTES + element_body_size_bytes
        )
        expected_size_bytes = (
            BATCH_BODY_POSITION_BYTES
            + element_body_size_bytes
            + PROPERTIES_LENGTH_SIZE_BYTES
            + properties_size_bytes
        )
        if expected_size_bytes != size_bytes:
            return SPLIT_BATCH_SIZE_MISMATCH
        out_offset_bytes[count] = position_bytes
        out_size_bytes[count] = size_bytes
        count += 1
        position_bytes += size_bytes
    return count


# --- java_hash_utf8 -----------------------------------------------------------------------------

_REPLACEMENT_UNIT = 0xFFFD
_HASH_MASK = 0xFFFFFFFF


@kernel
def _is_continuation(byte: int) -> bool:
    return (byte & 0xC0) == 0x80


@kernel
def _is_bad_second_of_four(lead: int, second: int) -> bool:
    """True when `second` cannot follow `lead` (F0..F4) in a 4-byte sequence."""
    if lead == 0xF0 and (second < 0x90 or second > 0xBF):
        return True
    if lead == 0xF4 and (second & 0xF0) != 0x80:
        return True
    return not _is_continuation(second)


@kernel
def java_hash_utf8(buf: NDArray[np.uint8], start: int, end: int) -> int:
    """Java's String.hashCode of `new String(buf[start:end], UTF_8)`: a signed 32-bit int.

    The bytes are decoded as Java decodes them and hashed over UTF-16 code units in one pass:
    a 4-byte sequence counts as its surrogate pair. Each malformed sequence counts as one U+FFFD,
    sized as JDK 8 to 21 size it (sun.nio.cs.UTF_8): a bad lead byte, C0/C1, or an overlong E0/F0
    start is 1 byte; a valid prefix cut short by a bad byte is that prefix; a complete 3-byte
    surrogate (ED A0..BF xx) or a complete 4-byte sequence past U+10FFFF is one U+FFFD for its
    first 1 to 3 bytes as Java counts them; an incomplete sequence at `end` is one U+FFFD.
    message.java_utf8_decode() states the same rules as a decoder.
    """
    assert 0 <= start <= end <= buf.size
    hash_value = 0
    at = start
    while at < end:
        lead = read_u8(buf, at)
        unit = _REPLACEMENT_UNIT
        if lead < 0x80:
            unit = lead
            at += 1
        elif lead >= 0xC2 and lead <= 0xDF:
            if at + 1 < end and _is_continuation(read_u8(buf, at + 1)):
                unit = (lead & 0x1F) << 6 | (read_u8(buf, at + 1) & 0x3F)
                at += 2
            else:
                at += 1
        elif lead >= 0xE0 and lead <= 0xEF:
            if at + 1 < end:
                second = read_u8(buf, at + 1)
                bad_second = (lead == 0xE0 and (second & 0xE0) == 0x80) or not _is_continuation(
                    second
                )
                if bad_second:
                    at += 1
                elif at + 2 >= end:
                    at = end
                elif not _is_continuation(read_u8(buf, at + 2)):
                    at += 2
                else:
                    code_point = (lead & 0x0F) << 12 | (second & 0x3F) << 6
                    code_point |= read_u8(buf, at + 2) & 0x3F
                    if code_point < 0xD800 or code_point > 0xDFFF:
                        unit = code_point
                    at += 3
            else:
                at = end
        elif lead >= 0xF0 and lead <= 0xF7:
            if at + 3 < end:
                second = read_u8(buf, at + 1)
                third = read_u8(buf, at + 2)
                fourth = read_u8(buf, at + 3)
                code_point = (lead & 0x07) << 18 | (second & 0x3F) << 12
                code_point |= (third & 0x3F) << 6 | (fourth & 0x3F)
                well_formed = (
                    _is_continuation(second)
                    and _is_continuation(third)
                    and _is_continuation(fourth)
                    and code_point >= 0x10000
                    and code_point <= 0x10FFFF
                )
                if well_formed:
                    supplementary = code_point - 0x10000
                    high_unit = 0xD800 + (supplementary >> 10)
                    hash_value = (hash_value * 31 + high_unit) & _HASH_MASK
                    unit = 0xDC00 + (supplementary & 0x3FF)
                    at += 4
                elif lead > 0xF4 or _is_bad_second_of_four(lead, second):
                    at += 1
                elif not _is_continuation(third):
                    at += 2
                else:
                    at += 3
            elif lead > 0xF4 or (
                at + 1 < end and _is_bad_second_of_four(lead, read_u8(buf, at + 1))
            ):
                at += 1
            elif at + 2 < end and not _is_continuation(read_u8(buf, at + 2)):
                at += 2
            else:
                at = end
        else:
            at += 1
        hash_value = (hash_value * 31 + unit) & _HASH_MASK
    return hash_value - ((hash_value & 0x80000000) << 1)


# --- find_property ------------------------------------------------------------------------------

# The name whose value the consume queue hashes, as the array find_property takes.
TAGS_NAME = np.frombuffer(PROPERTY_TAGS.encode("ascii"), dtype=np.uint8).copy()
TAGS_NAME.flags.writeable = False
assert PROPERTY_NAME_VALUE_SEPARATOR not in TAGS_NAME
assert PROPERTY_SEPARATOR not in TAGS_NAME


@kernel
def find_property(
    buf: NDArray[np.uint8], start: int, end: int, name: NDArray[np.uint8]
) -> tuple[int, int]:
    """(value_start, value_end) in `buf` of property `name` in the properties at buf[start:end].

    Follows message.decode_properties(): entries end at 0x02 (or at `end`), the name ends at the
    entry's first 0x01, an entry with no 0x01 or an empty value is skipped, and the last entry
    with the name wins. (-1, -1) when there is none. `name` must be non-empty and hold neither
    0x01 nor 0x02 (the caller's duty: checking it here would cost every record).

    Because `name` holds no separator, an entry carries it exactly when the entry starts with
    `name` followed by 0x01. So each entry costs one prefix test, then one tight loop to its 0x02;
    this is about a quarter faster than finding every entry's 0x01 first.
    """
    assert 0 <= start <= end <= buf.size
    name_size_bytes = name.size
    assert name_size_bytes > 0
    value_start = -1
    value_end = -1
    at = start  # the first byte of an entry
    while at < end:
        separator_at = at + name_size_bytes
        matches = separator_at < end and read_u8(buf, separator_at) == PROPERTY_NAME_VALUE_SEPARATOR
        if matches:
            for index in range(name_size_bytes):
                if read_u8(buf, at + index) != read_u8(name, index):
                    matches = False
                    break
        entry_end = separator_at + 1 if matches else at
        while entry_end < end and read_u8(buf, entry_end) != PROPERTY_SEPARATOR:
            entry_end += 1
        if matches and entry_end > separator_at + 1:
            value_start = separator_at + 1
            value_end = entry_end
        at = entry_end + 1
    return value_start, value_end
