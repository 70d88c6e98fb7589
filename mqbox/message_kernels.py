"""Kernels over message bytes: the data plane's byte layer, the record check, and the message
rules in numba.

Owns: the big-endian readers and writers and the vectorising copy that every kernel over stored
records, consume-queue entries and index files uses (one copy of each, here); the body CRC32;
`check_record`, the one check of a stored record (RocketMQ's checkMessageAndReturnSize) that
every walk over records runs, with the one set of STOP_* reasons they report (the store's scan,
the dispatch scan, recovery's unfinished-record search, the client's PULL decoder; client and
store both import this leaf); `cut_records`, the slave's HA client's framing walk over the
master's stream (size and magic only); and the numba data-plane versions of three message.py rules:
split a batch body, hash a tag, find a property. message_kernels_ref.py restates each contract
in plain Python; a unit test feeds both the same hypothesis-built bytes and asserts they agree
exactly (docs/style.md section 4), and the walkers' own twins build on the twin of the check.

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

from typing import Final

import numpy as np
from numpy.typing import NDArray

from mqbox._jit import inline_kernel, kernel
from mqbox.message import (
    BATCH_BODY_LENGTH_POSITION_BYTES,
    BATCH_BODY_POSITION_BYTES,
    BATCH_ELEMENT_SIZE_BYTES_MIN,
    BATCH_TOTALSIZE_POSITION_BYTES,
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
    PROPERTY_NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    RECORD_SIZE_BYTES_MIN,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_HOSTS_V6,
    SYSFLAG_POSITION_BYTES,
    SYSFLAG_STOREHOST_V6,
    TOPIC_LENGTH_SIZE_BYTES,
    TOPIC_SIZE_BYTES_MAX,
    TOTALSIZE_POSITION_BYTES,
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


# --- The record check (RocketMQ's CommitLog.checkMessageAndReturnSize) ----------------------------

# Why a walk over stored records stopped: the one set of stop reasons of every such walk
# (store/kernels.scan_records, store/dispatch_kernels.dispatch_scan, recovery's
# find_unfinished_record, client/pull_kernels.decode_pull_records). END and FULL are the walk's
# own; check_record answers the others. A walk with reasons of its own numbers them from
# STOP_REASON_COUNT on. The stop position is where the record that was not reported begins
# (end_bytes for STOP_END).
STOP_END: Final = 0  # reached end_bytes exactly, after a whole record
STOP_FULL: Final = 1  # the out arrays are full; walk again from the stop position
STOP_BLANK: Final = 2  # an end-of-segment blank starts there: the next record is in the next one
STOP_TRUNCATED: Final = 3  # fewer than 8 bytes left, or TOTALSIZE past end_bytes: a torn tail
STOP_INVALID: Final = 4  # bad magic, sizes or inner lengths, or an IPv6 host where none may be
STOP_CRC_MISMATCH: Final = 5  # BODYCRC does not match the body (checked only when asked)
STOP_OFFSET_MISMATCH: Final = 6  # PHYSICALOFFSET is not the record's log offset (when known)
STOP_REASON_COUNT: Final = 7
# check_record's verdict on a record that passed every check: no stop, the walk goes on.
RECORD_WHOLE: Final = -1
# check_record's base_log_offset_bytes when the walker does not know where its bytes lie in the
# commit log (a PULL body): PHYSICALOFFSET is then not checked.
LOG_OFFSET_UNKNOWN: Final = -1
# An IPv6 host holds 16 address bytes instead of 4: every field after it moves by 12.
HOST_V6_EXTRA_SIZE_BYTES: Final = 12
_BODY_LENGTH_SIZE_BYTES: Final = BODY_POSITION_BYTES - BODY_LENGTH_POSITION_BYTES
assert STOP_REASON_COUNT == STOP_OFFSET_MISMATCH + 1
assert RECORD_WHOLE < 0


@inline_kernel
def check_record(
    buf: NDArray[np.uint8],
    position_bytes: int,
    end_bytes: int,
    base_log_offset_bytes: int,
    check_crc: bool,
    hosts_v6_allowed: bool,
) -> tuple[int, int, int, int, int]:
    """Check the stored record that starts at buf[position_bytes], reading only below end_bytes.

    Returns (verdict, size_bytes, body_position_bytes, topic_position_bytes,
    properties_position_bytes): verdict RECORD_WHOLE and where the record's variable fields
    start in `buf` (the body's length is topic_position_bytes - 1 - body_position_bytes, the
    topic's properties_position_bytes - 2 - topic_position_bytes, the properties'
    position_bytes + size_bytes - properties_position_bytes); or the STOP_* reason of the
    first check that fails, with four zeros.

    Checks, in this order: 8 bytes left (else TRUNCATED); magic is the blank's (BLANK) or a
    message's (else INVALID); TOTALSIZE >= 91 (INVALID; this also guarantees a walk's
    progress); TOTALSIZE within end_bytes (TRUNCATED); from here every read lies inside the
    record. No IPv6 host bit unless hosts_v6_allowed, and then TOTALSIZE >= 91 + 12 per IPv6
    host; 0 <= body length <= TOTALSIZE - fixed part; topic length <= 127 and fixed part + body
    + topic <= TOTALSIZE; fixed part + body + topic + properties == TOTALSIZE (each INVALID).
    PHYSICALOFFSET == base_log_offset_bytes + position_bytes unless the base is
    LOG_OFFSET_UNKNOWN (OFFSET_MISMATCH); with check_crc, BODYCRC (CRC_MISMATCH). A record
    that passes is one message.decode_record() accepts (for IPv4 hosts).
    """
    assert 0 <= position_bytes <= end_bytes <= buf.size
    available_bytes = end_bytes - position_bytes
    if available_bytes < BLANK_SIZE_BYTES:
        return STOP_TRUNCATED, 0, 0, 0, 0
    magic = read_u32_be(buf, position_bytes + MAGICCODE_POSITION_BYTES)
    if magic == BLANK_MAGIC:
        return STOP_BLANK, 0, 0, 0, 0
    if magic != MESSAGE_MAGIC:
        return STOP_INVALID, 0, 0, 0, 0
    size_bytes = read_s32_be(buf, position_bytes + TOTALSIZE_POSITION_BYTES)
    if size_bytes < RECORD_SIZE_BYTES_MIN:
        return STOP_INVALID, 0, 0, 0, 0
    if size_bytes > available_bytes:
        return STOP_TRUNCATED, 0, 0, 0, 0
    sysflag = read_s32_be(buf, position_bytes + SYSFLAG_POSITION_BYTES)
    hosts_extra_bytes = 0
    if sysflag & SYSFLAG_HOSTS_V6:
        if not hosts_v6_allowed:
            return STOP_INVALID, 0, 0, 0, 0
        if sysflag & SYSFLAG_BORNHOST_V6:
            hosts_extra_bytes += HOST_V6_EXTRA_SIZE_BYTES
        if sysflag & SYSFLAG_STOREHOST_V6:
            hosts_extra_bytes += HOST_V6_EXTRA_SIZE_BYTES
    fixed_size_bytes = RECORD_SIZE_BYTES_MIN + hosts_extra_bytes
    if size_bytes < fixed_size_bytes:
        return STOP_INVALID, 0, 0, 0, 0
    body_length_at = position_bytes + BODY_LENGTH_POSITION_BYTES + hosts_extra_bytes
    body_size_bytes = read_s32_be(buf, body_length_at)
    if body_size_bytes < 0 or body_size_bytes > size_bytes - fixed_size_bytes:
        return STOP_INVALID, 0, 0, 0, 0
    body_at = body_length_at + _BODY_LENGTH_SIZE_BYTES
    topic_length_at = body_at + body_size_bytes
    topic_size_bytes = read_u8(buf, topic_length_at)
    if topic_size_bytes > TOPIC_SIZE_BYTES_MAX:
        return STOP_INVALID, 0, 0, 0, 0
    if fixed_size_bytes + body_size_bytes + topic_size_bytes > size_bytes:
        return STOP_INVALID, 0, 0, 0, 0
    topic_at = topic_length_at + TOPIC_LENGTH_SIZE_BYTES
    properties_length_at = topic_at + topic_size_bytes
    properties_size_bytes = read_s16_be(buf, properties_length_at)
    if fixed_size_bytes + body_size_bytes + topic_size_bytes + properties_size_bytes != size_bytes:
        return STOP_INVALID, 0, 0, 0, 0
    if base_log_offset_bytes != LOG_OFFSET_UNKNOWN:
        log_offset_bytes = read_s64_be(buf, position_bytes + PHYSICALOFFSET_POSITION_BYTES)
        if log_offset_bytes != base_log_offset_bytes + position_bytes:
            return STOP_OFFSET_MISMATCH, 0, 0, 0, 0
    if check_crc:
        body_crc = crc32(buf, body_at, topic_length_at) & BODYCRC_MASK
        if body_crc != read_u32_be(buf, position_bytes + BODYCRC_POSITION_BYTES):
            return STOP_CRC_MISMATCH, 0, 0, 0, 0
    properties_at = properties_length_at + PROPERTIES_LENGTH_SIZE_BYTES
    return RECORD_WHOLE, size_bytes, body_at, topic_at, properties_at


# --- cut_records: where a stream of records may be cut (the slave's HA client) -------------------

# Why cut_records stopped. MORE: the next record is not all there yet (or the walk reached
# end_bytes); CHUNK: chunk_end_bytes reached before a record; BLANK: an end-of-segment blank
# starts there; INVALID: no record starts there (magic, or TOTALSIZE out of bounds); CROSSES:
# the record would leave no room for a blank before segment_end_bytes.
CUT_MORE: Final = 0
CUT_CHUNK: Final = 1
CUT_BLANK: Final = 2
CUT_INVALID: Final = 3
CUT_CROSSES: Final = 4


@kernel
def cut_records(
    buf: NDArray[np.uint8],
    start_bytes: int,
    end_bytes: int,
    chunk_end_bytes: int,
    segment_end_bytes: int,
    record_size_bytes_max: int,
) -> tuple[int, int, int]:
    """Walk records back to back from buf[start_bytes] by TOTALSIZE and MAGICCODE alone, reading
    below end_bytes; return (stop_position_bytes, CUT_* reason, records walked: the whole records
    in buf[start_bytes:stop]). Every record before the stop is
    whole in `buf`, so buf[start_bytes:stop] may be handed on as whole records.

    Per record, in this order: the stop is at or past chunk_end_bytes (CHUNK: a record started
    before it may end after it, so a record larger than the chunk goes whole); 8 bytes left
    (else MORE); the magic is the blank's (BLANK) or a message's, with RECORD_SIZE_BYTES_MIN <=
    TOTALSIZE <= record_size_bytes_max (else INVALID); the record and a blank after it fit below
    segment_end_bytes (else CROSSES); the record is all below end_bytes (else MORE). Sizes are
    checked before waiting for more bytes, so a bad one is found at once rather than buffered.
    This is framing only: the store writer checks each record whole (scan_records).
    """
    assert 0 <= start_bytes <= end_bytes <= buf.size
    position_bytes = start_bytes
    records = 0
    while True:
        if position_bytes >= chunk_end_bytes:
            return position_bytes, CUT_CHUNK, records
        if end_bytes - position_bytes < BLANK_SIZE_BYTES:
            return position_bytes, CUT_MORE, records
        magic = read_u32_be(buf, position_bytes + MAGICCODE_POSITION_BYTES)
        if magic == BLANK_MAGIC:
            return position_bytes, CUT_BLANK, records
        size_bytes = read_s32_be(buf, position_bytes + TOTALSIZE_POSITION_BYTES)
        if (
            magic != MESSAGE_MAGIC
            or size_bytes < RECORD_SIZE_BYTES_MIN
            or size_bytes > record_size_bytes_max
        ):
            return position_bytes, CUT_INVALID, records
        if position_bytes + size_bytes + BLANK_SIZE_BYTES > segment_end_bytes:
            return position_bytes, CUT_CROSSES, records
        if end_bytes - position_bytes < size_bytes:
            return position_bytes, CUT_MORE, records
        position_bytes += size_bytes
        records += 1


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


@inline_kernel
def java_hash_utf8(buf: NDArray[np.uint8], start: int, end: int) -> int:
    """Java's String.hashCode of `new String(buf[start:end], UTF_8)`: a signed 32-bit int."""
    hash_value = java_hash_utf8_from(buf, start, end, 0)
    return hash_value - ((hash_value & 0x80000000) << 1)


@kernel
def java_hash_utf8_from(buf: NDArray[np.uint8], start: int, end: int, state: int) -> int:
    """Java's String.hashCode polynomial continued from `state` over the UTF-16 code units of
    `new String(buf[start:end], UTF_8)`: the unsigned 32-bit state (java_hash_utf8 is it from
    0, made signed). With `state` the hash state of a string s, this is the hash of s + the
    decoded bytes, as long as s does not end inside a malformed sequence (an ASCII end never
    does): Java's decoder never folds an ASCII byte into a malformed sequence.

    The bytes are decoded as Java decodes them and hashed over UTF-16 code units in one pass:
    a 4-byte sequence counts as its surrogate pair. Each malformed sequence counts as one U+FFFD,
    sized as JDK 8 to 21 size it (sun.nio.cs.UTF_8): a bad lead byte, C0/C1, or an overlong E0/F0
    start is 1 byte; a valid prefix cut short by a bad byte is that prefix; a complete 3-byte
    surrogate (ED A0..BF xx) or a complete 4-byte sequence past U+10FFFF is one U+FFFD for its
    first 1 to 3 bytes as Java counts them; an incomplete sequence at `end` is one U+FFFD.
    message.java_utf8_decode() states the same rules as a decoder.
    """
    assert 0 <= start <= end <= buf.size
    assert 0 <= state <= _HASH_MASK
    hash_value = state
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
    return hash_value


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
