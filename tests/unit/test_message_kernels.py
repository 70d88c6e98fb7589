"""Goal: each kernel of mqbox.message_kernels keeps its contract, and agrees exactly with its
plain-Python twin in message_kernels_ref and with the control-plane rule in mqbox.message.

Method: hypothesis builds valid inputs (batch bodies from message.encode_batch, properties from
message.encode_properties), then tears, truncates and sprinkles noise over them, and also throws
pure noise; every input goes to the kernel and to its twin, and the answers (and the out arrays up
to the count) must be equal. Fixed vectors pin the Java hash and the error codes.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from mqbox import message as m
from mqbox import message_kernels as fast
from mqbox import message_kernels_ref as ref
from mqbox.errors import MessageIllegalError, MessageTooLargeError
from tests.support.stored_records import messages

INT32 = st.integers(-(2**31), 2**31 - 1)


def as_array(data: bytes) -> NDArray[np.uint8]:
    """A writable uint8 array of `data`, like a view of a mapped segment."""
    return np.frombuffer(bytearray(data), dtype=np.uint8)


def test_error_codes_are_the_same_in_both_twins() -> None:
    assert fast.SPLIT_BATCH_TRUNCATED == ref.SPLIT_BATCH_TRUNCATED < 0
    assert fast.SPLIT_BATCH_SIZE_MISMATCH == ref.SPLIT_BATCH_SIZE_MISMATCH < 0
    assert fast.SPLIT_BATCH_BODY_TOO_LARGE == ref.SPLIT_BATCH_BODY_TOO_LARGE < 0
    assert fast.SPLIT_BATCH_TOO_MANY == ref.SPLIT_BATCH_TOO_MANY < 0
    codes = {
        fast.SPLIT_BATCH_TRUNCATED,
        fast.SPLIT_BATCH_SIZE_MISMATCH,
        fast.SPLIT_BATCH_BODY_TOO_LARGE,
        fast.SPLIT_BATCH_TOO_MANY,
    }
    assert len(codes) == 4


# --- Readers ------------------------------------------------------------------------------------


@settings(deadline=None)
@given(data=st.binary(min_size=8, max_size=8))
def test_readers_match_struct(data: bytes) -> None:
    buf = as_array(b"\x00" + data)
    assert fast.read_u8(buf, 1) == data[0]
    assert fast.read_s16_be(buf, 1) == struct.unpack(">h", data[:2])[0]
    assert fast.read_u32_be(buf, 1) == struct.unpack(">I", data[:4])[0]
    assert fast.read_s32_be(buf, 1) == struct.unpack(">i", data[:4])[0]
    assert fast.read_s64_be(buf, 1) == struct.unpack(">q", data)[0]


@settings(deadline=None)
@given(
    value=st.integers(-(2**63), 2**63 - 1),
    width_and_format=st.sampled_from([(2, ">H"), (4, ">I"), (8, ">Q")]),
    at=st.integers(0, 3),
)
def test_writers_store_the_low_bits_big_endian(
    value: int, width_and_format: tuple[int, str], at: int
) -> None:
    width, fmt = width_and_format
    writer = {2: fast.write_i16_be, 4: fast.write_i32_be, 8: fast.write_i64_be}[width]
    buf = as_array(bytes(range(1, 13)))
    writer(buf, at, value)
    expected = bytearray(range(1, 13))
    struct.pack_into(fmt, expected, at, value & ((1 << (8 * width)) - 1))
    assert buf.tobytes() == bytes(expected)


@settings(deadline=None)
@given(
    source=st.binary(max_size=80),
    cuts=st.tuples(st.integers(0), st.integers(0), st.integers(0)),
)
def test_copy_bytes_copies_exactly_the_range(source: bytes, cuts: tuple[int, int, int]) -> None:
    source_at = cuts[0] % (len(source) + 1)
    size_bytes = cuts[1] % (len(source) - source_at + 1)
    target_at = cuts[2] % 9
    target = as_array(bytes(size_bytes + 16))
    fast.copy_bytes(target, target_at, as_array(source), source_at, size_bytes)
    expected = bytearray(size_bytes + 16)
    expected[target_at : target_at + size_bytes] = source[source_at : source_at + size_bytes]
    assert target.tobytes() == bytes(expected)


# --- crc32 --------------------------------------------------------------------------------------


@settings(deadline=None)
@given(data=st.binary(max_size=100), cuts=st.tuples(st.integers(0), st.integers(0)))
def test_crc32_equals_zlib(data: bytes, cuts: tuple[int, int]) -> None:
    start = cuts[0] % (len(data) + 1)
    end = start + cuts[1] % (len(data) - start + 1)
    array = as_array(data)
    assert fast.crc32(array, start, end) == zlib.crc32(data[start:end])
    assert ref.crc32(array, start, end) == zlib.crc32(data[start:end])


def test_crc32_vector_from_the_document() -> None:
    assert fast.crc32(as_array(b"hello-1"), 0, 7) & 0x7FFFFFFF == 1648445226


# --- check_record -------------------------------------------------------------------------------

FIELD_FORMATS = {
    m.TOTALSIZE_POSITION_BYTES: ">i",
    m.MAGICCODE_POSITION_BYTES: ">I",
    m.BODYCRC_POSITION_BYTES: ">I",
    m.PHYSICALOFFSET_POSITION_BYTES: ">q",
    m.SYSFLAG_POSITION_BYTES: ">i",
    m.BODY_LENGTH_POSITION_BYTES: ">i",
}


@st.composite
def checked_records(draw: st.DrawFn) -> tuple[bytes, int, int]:
    """(bytes, position, log offset of byte 0): one record after a prefix, maybe damaged."""
    prefix = draw(st.binary(max_size=3))
    base_log_offset_bytes = draw(st.integers(0, 2**40))
    record = bytearray(
        m.encode_record(
            draw(messages),
            queue_index=draw(st.integers(0, 2**40)),
            log_offset_bytes=base_log_offset_bytes + len(prefix),
            store_timestamp_ms=draw(st.integers(0, 2**41)),
        )
    )
    damage = draw(st.sampled_from(["none", "field", "byte", "cut", "v6", "blank", "noise"]))
    if damage == "field":
        at = draw(st.sampled_from(sorted(FIELD_FORMATS)))
        fmt = FIELD_FORMATS[at]
        (value,) = struct.unpack_from(fmt, record, at)
        width = struct.calcsize(fmt)
        nudged = (value + draw(st.integers(-3, 3))) % (1 << (8 * width))
        record[at : at + width] = nudged.to_bytes(width, "big")
    elif damage == "byte":
        record[draw(st.integers(0, len(record) - 1))] = draw(st.integers(0, 255))
    elif damage == "cut":
        del record[draw(st.integers(0, len(record))) :]
    elif damage == "v6":
        # IPv6 host bits on IPv4 bytes: every later field moves, so most such records fail.
        (sysflag,) = struct.unpack_from(">i", record, m.SYSFLAG_POSITION_BYTES)
        bits = draw(st.sampled_from([m.SYSFLAG_BORNHOST_V6, m.SYSFLAG_STOREHOST_V6]))
        struct.pack_into(">i", record, m.SYSFLAG_POSITION_BYTES, sysflag | bits)
        record += bytes(draw(st.sampled_from([0, 12, 24])))
    elif damage == "blank":
        record = bytearray(m.encode_blank(8 + draw(st.integers(0, 8))))
    elif damage == "noise":
        record = bytearray(draw(st.binary(max_size=120)))
    data = prefix + bytes(record) + draw(st.binary(max_size=4))
    return data, len(prefix), base_log_offset_bytes


@settings(deadline=None, max_examples=400)
@given(
    record=checked_records(),
    end_cut_bytes=st.integers(0, 6),
    base_known=st.booleans(),
    check_crc=st.booleans(),
    hosts_v6_allowed=st.booleans(),
)
def test_check_record_agrees_with_twin(
    record: tuple[bytes, int, int],
    end_cut_bytes: int,
    base_known: bool,
    check_crc: bool,
    hosts_v6_allowed: bool,
) -> None:
    data, position_bytes, base_log_offset_bytes = record
    end_bytes = max(position_bytes, len(data) - end_cut_bytes)
    base = base_log_offset_bytes if base_known else fast.LOG_OFFSET_UNKNOWN
    arguments = (as_array(data), position_bytes, end_bytes, base, check_crc, hosts_v6_allowed)
    verdict = fast.check_record(*arguments)
    assert verdict == ref.check_record(*arguments)
    if verdict[0] == fast.RECORD_WHOLE:
        stored = m.decode_record(data[:end_bytes], position_bytes, check_crc=check_crc)
        size_bytes, body_at, topic_at, properties_at = verdict[1:]
        assert size_bytes == stored.size_bytes
        assert data[body_at : topic_at - 1] == stored.body
        assert data[properties_at : position_bytes + size_bytes] == stored.properties
    else:
        assert verdict[1:] == (0, 0, 0, 0)


def test_check_record_stops_in_its_documented_order() -> None:
    record = bytearray(
        m.encode_record(
            m.MessageToStore("T", 1, b"body"), log_offset_bytes=100, store_timestamp_ms=1
        )
    )

    def verdict(
        data: bytes | bytearray, base: int = 100, crc: bool = True, v6: bool = False
    ) -> int:
        return int(fast.check_record(as_array(bytes(data)), 0, len(data), base, crc, v6)[0])

    assert verdict(record) == fast.RECORD_WHOLE
    assert verdict(record[:7]) == fast.STOP_TRUNCATED
    assert verdict(record[:-1]) == fast.STOP_TRUNCATED
    assert verdict(m.encode_blank(8)) == fast.STOP_BLANK
    assert verdict(record, base=0) == fast.STOP_OFFSET_MISMATCH
    assert verdict(record, base=fast.LOG_OFFSET_UNKNOWN) == fast.RECORD_WHOLE
    body_damaged = bytearray(record)
    body_damaged[m.BODY_POSITION_BYTES] ^= 1
    assert verdict(body_damaged) == fast.STOP_CRC_MISMATCH
    assert verdict(body_damaged, crc=False) == fast.RECORD_WHOLE
    # The offset is checked before the CRC.
    assert verdict(body_damaged, base=0) == fast.STOP_OFFSET_MISMATCH
    v6 = bytearray(record)
    struct.pack_into(">i", v6, m.SYSFLAG_POSITION_BYTES, m.SYSFLAG_STOREHOST_V6)
    assert verdict(v6) == fast.STOP_INVALID
    assert verdict(v6, v6=True) == fast.STOP_INVALID  # 12 bytes short for a 20-byte host


# --- java_hash_utf8 -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("TagA", 2598919),
        ("TagB", 2598920),
        ("XXX", 87384),
        ("test", 3556498),
        ("hello world", 1794106052),
        ("中文", 646394),
        ("😀", 1772899),
        ("", 0),
    ],
)
def test_java_hash_utf8_vectors(text: str, expected: int) -> None:
    encoded = text.encode("utf-8")
    buf = as_array(b"xx" + encoded + b"yy")
    assert fast.java_hash_utf8(buf, 2, 2 + len(encoded)) == expected
    assert ref.java_hash_utf8(buf, 2, 2 + len(encoded)) == expected


# Bytes that exercise every branch of the decoder: ASCII, continuations, every lead class.
utf8_noise = st.lists(
    st.one_of(
        st.integers(0, 0x7F),
        st.integers(0x80, 0xBF),
        st.sampled_from([0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xED, 0xEF, 0xF0, 0xF4, 0xF5, 0xF8, 0xFF]),
        st.integers(0xC0, 0xFF),
    ),
    max_size=24,
).map(bytes)


@settings(deadline=None, max_examples=300)
@given(
    data=st.one_of(utf8_noise, st.binary(max_size=24)),
    cuts=st.tuples(st.integers(0), st.integers(0)),
)
def test_java_hash_utf8_kernel_agrees_with_twin(data: bytes, cuts: tuple[int, int]) -> None:
    buf = as_array(data)
    start = cuts[0] % (len(data) + 1)
    end = start + cuts[1] % (len(data) - start + 1)
    assert fast.java_hash_utf8(buf, start, end) == ref.java_hash_utf8(buf, start, end)


@settings(deadline=None, max_examples=300)
@given(
    prefix=st.text(alphabet="aZ#9_%", max_size=8),
    data=st.one_of(utf8_noise, st.binary(max_size=24)),
)
def test_java_hash_utf8_from_continues_the_hash_of_an_ascii_prefix(
    prefix: str, data: bytes
) -> None:
    """The index key hash's case: topic + "#" hashed once, each key continuing it."""
    state = m.java_string_hash(prefix) & 0xFFFFFFFF
    buf = as_array(data)
    continued = fast.java_hash_utf8_from(buf, 0, len(data), state)
    assert continued == ref.java_hash_utf8_from(buf, 0, len(data), state)
    whole = m.java_string_hash(prefix + m.java_utf8_decode(data))
    assert continued == whole & 0xFFFFFFFF


@settings(deadline=None)
@given(data=utf8_noise)
def test_java_hash_utf8_equals_python_decoding_away_from_ed(data: bytes) -> None:
    data = data.replace(b"\xed", b"\xee")
    expected = m.java_string_hash(data.decode("utf-8", "replace"))
    assert fast.java_hash_utf8(as_array(data), 0, len(data)) == expected


@settings(deadline=None)
@given(
    text=st.text(max_size=20).filter(lambda text: not any(0xD800 <= ord(c) < 0xE000 for c in text))
)
def test_java_hash_utf8_equals_string_hash_of_valid_text(text: str) -> None:
    encoded = text.encode("utf-8")
    assert fast.java_hash_utf8(as_array(encoded), 0, len(encoded)) == m.java_string_hash(text)


# --- find_property ------------------------------------------------------------------------------

property_names = st.sampled_from([b"TAGS", b"TAG", b"TAGSX", b"KEYS", b"UNIQ_KEY", b"tags", b"T"])
property_values = st.binary(max_size=10).filter(lambda value: b"\x02" not in value)


@st.composite
def properties_regions(draw: st.DrawFn) -> bytes:
    """Property strings as writers make them, with duplicates, empties and stray separators."""
    parts = draw(
        st.lists(
            st.one_of(
                st.tuples(property_names, property_values).map(lambda nv: nv[0] + b"\x01" + nv[1]),
                st.sampled_from([b"", b"TAGS", b"\x01x", b"TAGS\x01", b"TAGS\x01\x01"]),
                st.binary(max_size=6),
            ),
            max_size=6,
        )
    )
    region = b"\x02".join(parts)
    if draw(st.booleans()):
        region += b"\x02"
    return region


@settings(deadline=None, max_examples=300)
@given(
    region=properties_regions(),
    name=st.sampled_from([b"TAGS", b"KEYS", b"T", b"UNIQ_KEY"]),
    padding=st.tuples(st.binary(max_size=3), st.binary(max_size=3)),
)
def test_find_property_agrees_with_twin_and_with_decode_properties(
    region: bytes, name: bytes, padding: tuple[bytes, bytes]
) -> None:
    buf = as_array(padding[0] + region + padding[1])
    start = len(padding[0])
    end = start + len(region)
    name_array = as_array(name)
    found = fast.find_property(buf, start, end, name_array)
    assert found == ref.find_property(buf, start, end, name_array)
    expected = m.decode_properties(region).get(name)
    if expected is None:
        assert found == (-1, -1)
    else:
        assert start <= found[0] < found[1] <= end
        assert buf[found[0] : found[1]].tobytes() == expected


def test_find_property_examples() -> None:
    region = b"KEYS\x01k1\x02TAGS\x01TagA\x02UNIQ_KEY\x01ABC\x02WAIT\x01true"
    buf = as_array(region)
    value_start, value_end = fast.find_property(buf, 0, len(region), fast.TAGS_NAME)
    assert region[value_start:value_end] == b"TagA"
    assert fast.find_property(buf, 0, 10, fast.TAGS_NAME) == (-1, -1)
    assert fast.find_property(as_array(b"TAGS\x01"), 0, 5, fast.TAGS_NAME) == (-1, -1)
    assert fast.find_property(as_array(b"XTAGS\x01A"), 0, 7, fast.TAGS_NAME) == (-1, -1)
    assert fast.find_property(as_array(b"TAGS\x01A\x01B"), 0, 8, fast.TAGS_NAME) == (5, 8)


# --- split_batch --------------------------------------------------------------------------------

batch_elements = st.builds(
    m.BatchElement,
    body=st.binary(max_size=40),
    flag=INT32,
    properties=st.binary(max_size=30),
)


@st.composite
def batch_bodies(draw: st.DrawFn) -> bytes:
    """Valid batch bodies, and the same torn, cut short, overwritten or followed by noise."""
    body = bytearray(m.encode_batch(draw(st.lists(batch_elements, max_size=6))))
    damage = draw(st.sampled_from(["none", "truncate", "overwrite", "field", "append", "noise"]))
    if damage == "truncate" and body:
        del body[draw(st.integers(0, len(body) - 1)) :]
    elif damage == "overwrite" and body:
        at = draw(st.integers(0, len(body) - 1))
        body[at : at + 4] = draw(st.binary(min_size=1, max_size=4))
    elif damage == "field" and body:
        # Hit a length field of the first element with a value near the true one.
        field_position_bytes = draw(st.sampled_from([0, 16]))
        (value,) = struct.unpack_from(">i", body, field_position_bytes)
        value += draw(st.integers(-3, 3))
        struct.pack_into(">i", body, field_position_bytes, value)
    elif damage == "append":
        body += draw(st.binary(max_size=30))
    elif damage == "noise":
        body = bytearray(draw(st.binary(max_size=80)))
    return bytes(body)


def split_both(
    body: bytes, body_size_bytes_max: int, capacity: int
) -> tuple[int, NDArray[np.int64], NDArray[np.int32]]:
    """Run kernel and twin; assert they agree; return the kernel's answer and arrays."""
    array = as_array(body)
    results = []
    for split in (fast.split_batch, ref.split_batch):
        offsets = np.full(capacity, -7, dtype=np.int64)
        sizes = np.full(capacity, -7, dtype=np.int32)
        count = split(array, body_size_bytes_max, offsets, sizes)
        results.append((count, offsets, sizes))
    (count, offsets, sizes), (ref_count, ref_offsets, ref_sizes) = results
    assert count == ref_count
    if count >= 0:
        assert np.array_equal(offsets[:count], ref_offsets[:count])
        assert np.array_equal(sizes[:count], ref_sizes[:count])
        assert (offsets[count:] == -7).all()
        assert (sizes[count:] == -7).all()
    return count, offsets, sizes


@settings(deadline=None, max_examples=300)
@given(
    body=batch_bodies(),
    body_size_bytes_max=st.integers(0, 50),
    capacity=st.integers(1, 8),
)
def test_split_batch_agrees_with_twin_and_with_decode_batch(
    body: bytes, body_size_bytes_max: int, capacity: int
) -> None:
    count, offsets, sizes = split_both(body, body_size_bytes_max, capacity)
    try:
        elements = m.decode_batch(
            body, body_size_bytes_max=body_size_bytes_max, element_count_max=capacity
        )
    except MessageTooLargeError:
        assert count == fast.SPLIT_BATCH_BODY_TOO_LARGE
        return
    except MessageIllegalError:
        refusals = (
            fast.SPLIT_BATCH_TRUNCATED,
            fast.SPLIT_BATCH_SIZE_MISMATCH,
            fast.SPLIT_BATCH_TOO_MANY,
        )
        assert count in refusals or (count == 0 and not body)
        return
    assert count == len(elements)
    for index, element in enumerate(elements):
        start = int(offsets[index])
        end = start + int(sizes[index])
        encoded = m.encode_batch([element])
        # MAGIC and BODYCRC (bytes 4 to 12) are ignored, so noise there survives the split.
        assert body[start : start + 4] + body[start + 12 : end] == encoded[:4] + encoded[12:]


@settings(deadline=None)
@given(elements=st.lists(batch_elements, min_size=1, max_size=6))
def test_split_batch_finds_every_element(elements: list[m.BatchElement]) -> None:
    body = m.encode_batch(elements)
    count, offsets, sizes = split_both(body, 40, len(elements))
    assert count == len(elements)
    position_bytes = 0
    for index, element in enumerate(elements):
        assert offsets[index] == position_bytes
        assert sizes[index] == 22 + len(element.body) + len(element.properties)
        position_bytes += int(sizes[index])
    assert position_bytes == len(body)


def test_split_batch_error_codes() -> None:
    one = m.encode_batch([m.BatchElement(b"abc", 0, b"p")])
    assert split_both(b"", 10, 4)[0] == 0
    assert split_both(b"", 10, 0)[0] == 0
    assert split_both(one, 10, 0)[0] == fast.SPLIT_BATCH_TOO_MANY
    assert split_both(one * 3, 10, 2)[0] == fast.SPLIT_BATCH_TOO_MANY
    assert split_both(one * 2, 10, 2)[0] == 2
    assert split_both(one[:-1], 10, 4)[0] == fast.SPLIT_BATCH_TRUNCATED
    assert split_both(one + one[:21], 10, 4)[0] == fast.SPLIT_BATCH_TRUNCATED
    assert split_both(one, 2, 4)[0] == fast.SPLIT_BATCH_BODY_TOO_LARGE
    assert split_both(struct.pack(">i", 21) + one[4:], 10, 4)[0] == fast.SPLIT_BATCH_SIZE_MISMATCH
    wrong_properties = one[:23] + struct.pack(">h", 3) + one[25:] + b"\x00"
    wrong_properties = struct.pack(">i", len(wrong_properties)) + wrong_properties[4:]
    assert split_both(wrong_properties, 10, 4)[0] == fast.SPLIT_BATCH_SIZE_MISMATCH
    negative_body = one[:16] + struct.pack(">i", -1) + one[20:]
    assert split_both(negative_body, 10, 4)[0] == fast.SPLIT_BATCH_SIZE_MISMATCH


# --- cut_records ----------------------------------------------------------------------------------


def test_cut_reasons_are_the_same_in_both_twins() -> None:
    names = ("CUT_MORE", "CUT_CHUNK", "CUT_BLANK", "CUT_INVALID", "CUT_CROSSES")
    assert [getattr(fast, name) for name in names] == [getattr(ref, name) for name in names]
    assert len({getattr(fast, name) for name in names}) == len(names)


@st.composite
def record_streams(draw: st.DrawFn) -> tuple[bytes, list[int]]:
    """Records back to back, maybe a blank, then maybe noise; and where each record starts."""
    data = bytearray()
    starts: list[int] = []
    for message in draw(st.lists(messages, max_size=6)):
        starts.append(len(data))
        data += m.encode_record(message, log_offset_bytes=len(data))
    if draw(st.booleans()):
        data += m.encode_blank(draw(st.integers(8, 4096)))
    data += draw(st.binary(max_size=24))
    return bytes(data), starts


@settings(max_examples=300, deadline=None)
@given(
    stream=record_streams(),
    start_choice=st.integers(0, 7),
    end_cut=st.integers(0, 300),
    chunk=st.integers(0, 2000),
    segment_slack=st.integers(-200, 400),
    size_max=st.integers(91, 600),
    flips=st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 255)), max_size=3),
)
def test_cut_records_kernel_agrees_with_twin(
    stream: tuple[bytes, list[int]],
    start_choice: int,
    end_cut: int,
    chunk: int,
    segment_slack: int,
    size_max: int,
    flips: list[tuple[int, int]],
) -> None:
    data, starts = stream
    buffer = bytearray(data)
    for at, value in flips:
        if at < len(buffer):
            buffer[at] = value
    start = starts[start_choice % len(starts)] if starts else 0
    end = max(start, len(buffer) - end_cut)
    arguments = (start, end, start + chunk, len(data) + segment_slack, size_max)
    assert fast.cut_records(as_array(bytes(buffer)), *arguments) == ref.cut_records(
        as_array(bytes(buffer)), *arguments
    )


def test_cut_records_stops_before_a_torn_record_at_a_blank_and_at_the_chunk() -> None:
    records = [m.encode_record(m.MessageToStore("T", 0, b"x" * size)) for size in (10, 20, 30)]
    sizes = [len(record) for record in records]
    whole = b"".join(records) + m.encode_blank(64)
    array = as_array(whole)
    big = 1 << 20
    # torn: the last record's bytes are not all there
    assert fast.cut_records(array, 0, sum(sizes) - 1, big, big, 4096) == (
        sizes[0] + sizes[1],
        fast.CUT_MORE,
        2,
    )
    assert fast.cut_records(array, 0, sum(sizes) + 8, big, big, 4096) == (
        sum(sizes),
        fast.CUT_BLANK,
        3,
    )
    # the chunk ends inside the second record: that record goes whole, the walk stops after it
    assert fast.cut_records(array, 0, len(whole), sizes[0] + 1, big, 4096) == (
        sizes[0] + sizes[1],
        fast.CUT_CHUNK,
        2,
    )
    # a record larger than allowed, or one that leaves no room for a blank in its segment
    assert fast.cut_records(array, 0, len(whole), big, big, sizes[0] - 1) == (
        0,
        fast.CUT_INVALID,
        0,
    )
    assert fast.cut_records(array, 0, len(whole), big, sum(sizes) + 7, 4096) == (
        sizes[0] + sizes[1],
        fast.CUT_CROSSES,
        2,
    )
