"""Goal: scan_records reports exactly the records message.decode_record() accepts, stops where and
why its contract says (message_kernels' STOP_* reasons), and agrees exactly with its
plain-Python twin in store/kernels_ref.

Method: hypothesis builds segments from message.encode_record() (random fields, TAGS values that
are valid or broken UTF-8, raw property bytes), optionally ends them with a blank, then damages
them: cut at a random byte (torn tail), overwrite random bytes, nudge one header field, append
noise, or replace everything with noise. Kernel and twin scan the same bytes from the same start
with the same capacity; their three results and their out arrays up to the count must be equal,
and entries past the count must stay untouched. Targeted tests pin each stop reason.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from mqbox import message as m
from mqbox import message_kernels as leaf
from mqbox import message_kernels_ref as leaf_ref
from mqbox.store import kernels as fast
from mqbox.store import kernels_ref as ref
from tests.support.stored_records import INT64, messages

SENTINEL = -7
STOP_REASONS = (
    "STOP_END",
    "STOP_FULL",
    "STOP_BLANK",
    "STOP_TRUNCATED",
    "STOP_INVALID",
    "STOP_CRC_MISMATCH",
    "STOP_OFFSET_MISMATCH",
)


def as_array(data: bytes | bytearray) -> NDArray[np.uint8]:
    """A writable uint8 array of `data`, like a view of a mapped segment."""
    return np.frombuffer(bytearray(data), dtype=np.uint8)


@dataclass(frozen=True)
class Scan:
    """One scan's results: the three return values and the filled part of each out array."""

    record_count: int
    stop_position_bytes: int
    stop_reason: int
    log_offset_bytes: list[int]
    size_bytes: list[int]
    queue_id: list[int]
    queue_index: list[int]
    tag_hash: list[int]
    store_timestamp_ms: list[int]


def scan(
    implementation: ModuleType,
    segment: NDArray[np.uint8],
    start_bytes: int,
    end_bytes: int,
    base_log_offset_bytes: int,
    check_crc: bool,
    capacity: int,
) -> Scan:
    outs: list[NDArray[np.signedinteger[Any]]] = [
        np.full(capacity, SENTINEL, dtype=np.int64),
        np.full(capacity, SENTINEL, dtype=np.int32),
        np.full(capacity, SENTINEL, dtype=np.int32),
        np.full(capacity, SENTINEL, dtype=np.int64),
        np.full(capacity, SENTINEL, dtype=np.int64),
        np.full(capacity, SENTINEL, dtype=np.int64),
    ]
    count, stop_position_bytes, stop_reason = implementation.scan_records(
        segment, start_bytes, end_bytes, base_log_offset_bytes, check_crc, *outs
    )
    assert 0 <= count <= capacity
    for out in outs:
        assert (out[count:] == SENTINEL).all()
    return Scan(count, stop_position_bytes, stop_reason, *[out[:count].tolist() for out in outs])


def scan_both(
    segment: NDArray[np.uint8],
    start_bytes: int,
    end_bytes: int,
    base_log_offset_bytes: int = 0,
    check_crc: bool = True,
    capacity: int = 64,
) -> Scan:
    """Scan with the kernel and the twin; assert they agree; return the kernel's result."""
    arguments = (segment, start_bytes, end_bytes, base_log_offset_bytes, check_crc, capacity)
    kernel_scan = scan(fast, *arguments)
    assert kernel_scan == scan(ref, *arguments)
    return kernel_scan


# --- Building segments --------------------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    data: bytes
    base_log_offset_bytes: int
    record_positions_bytes: list[int]  # where each intact record starts


@st.composite
def segments(draw: st.DrawFn, blank: bool | None = None) -> Segment:
    """Records back to back, with correct PHYSICALOFFSETs; maybe a blank, maybe a prefix."""
    base_log_offset_bytes = draw(st.integers(0, 2**40))
    prefix = draw(st.binary(max_size=4))
    data = bytearray(prefix)
    positions: list[int] = []
    for message in draw(st.lists(messages, max_size=5)):
        positions.append(len(data))
        data += m.encode_record(
            message,
            queue_index=draw(st.integers(0, 2**63 - 1)),
            log_offset_bytes=base_log_offset_bytes + len(data),
            store_timestamp_ms=draw(INT64),
            store_host=m.pack_host("127.0.0.1", 10911),
        )
    if blank is None:
        blank = draw(st.booleans())
    if blank:
        data += m.encode_blank(8 + draw(st.integers(0, 16)))
    return Segment(bytes(data), base_log_offset_bytes, positions)


FIELDS = {
    "TOTALSIZE": (m.TOTALSIZE_POSITION_BYTES, ">i"),
    "MAGICCODE": (m.MAGICCODE_POSITION_BYTES, ">I"),
    "BODYCRC": (m.BODYCRC_POSITION_BYTES, ">I"),
    "PHYSICALOFFSET": (m.PHYSICALOFFSET_POSITION_BYTES, ">q"),
    "SYSFLAG": (m.SYSFLAG_POSITION_BYTES, ">i"),
    "BODYLEN": (m.BODY_LENGTH_POSITION_BYTES, ">i"),
}


@st.composite
def damaged_segments(draw: st.DrawFn) -> Segment:
    """A segment, torn or overwritten or nudged or followed by noise, or pure noise."""
    segment = draw(segments())
    data = bytearray(segment.data)
    damage = draw(
        st.sampled_from(["none", "truncate", "overwrite", "field", "inner", "append", "noise"])
    )
    if damage == "truncate" and data:
        del data[draw(st.integers(0, len(data) - 1)) :]
    elif damage == "overwrite" and data:
        at = draw(st.integers(0, len(data) - 1))
        data[at : at + 8] = draw(st.binary(min_size=1, max_size=8))
    elif damage == "field" and segment.record_positions_bytes:
        position_bytes = draw(st.sampled_from(segment.record_positions_bytes))
        field_position_bytes, fmt = FIELDS[draw(st.sampled_from(sorted(FIELDS)))]
        at = position_bytes + field_position_bytes
        (value,) = struct.unpack_from(fmt, data, at)
        mask = (1 << (8 * struct.calcsize(fmt))) - 1
        nudged = (value + draw(st.integers(-3, 3))) & mask
        data[at : at + struct.calcsize(fmt)] = nudged.to_bytes(struct.calcsize(fmt), "big")
    elif damage == "inner" and segment.record_positions_bytes:
        # Hit the topic length or properties length, or any body byte, of one record.
        position_bytes = draw(st.sampled_from(segment.record_positions_bytes))
        (body_size_bytes,) = struct.unpack_from(">i", data, position_bytes + 84)
        topic_length_at = position_bytes + 88 + body_size_bytes
        target = draw(
            st.sampled_from(
                [topic_length_at, topic_length_at + 1 + data[topic_length_at]]
                + ([position_bytes + 88] if body_size_bytes else [])
            )
        )
        data[target] = draw(st.integers(0, 255))
    elif damage == "append":
        data += draw(st.binary(max_size=24))
    elif damage == "noise":
        data = bytearray(draw(st.binary(max_size=200)))
    return Segment(bytes(data), segment.base_log_offset_bytes, segment.record_positions_bytes)


# --- scan_records: kernel and twin agree --------------------------------------------------------


def test_stop_reasons_are_the_same_in_both_twins() -> None:
    values = [getattr(leaf, name) for name in STOP_REASONS]
    assert values == [getattr(leaf_ref, name) for name in STOP_REASONS]
    assert len(set(values)) == len(values) == leaf.STOP_REASON_COUNT
    assert leaf.RECORD_WHOLE == leaf_ref.RECORD_WHOLE not in values


@settings(deadline=None, max_examples=500)
@given(
    segment=damaged_segments(),
    start_choice=st.integers(0),
    end_cut_bytes=st.one_of(st.just(0), st.integers(0, 12)),
    check_crc=st.booleans(),
    capacity=st.one_of(st.just(64), st.integers(0, 6)),
)
def test_scan_kernel_agrees_with_twin_on_damaged_segments(
    segment: Segment, start_choice: int, end_cut_bytes: int, check_crc: bool, capacity: int
) -> None:
    data = segment.data
    end_bytes = max(0, len(data) - end_cut_bytes)
    # Mostly start on a record, sometimes anywhere.
    starts = [p for p in segment.record_positions_bytes if p <= end_bytes]
    starts += [start_choice % (end_bytes + 1)]
    start_bytes = starts[start_choice % len(starts)]
    scan_both(
        as_array(data), start_bytes, end_bytes, segment.base_log_offset_bytes, check_crc, capacity
    )


# --- scan_records: what it reports --------------------------------------------------------------


def tags_of(record_properties: bytes) -> bytes | None:
    return m.decode_properties(record_properties).get(b"TAGS")


@settings(deadline=None)
@given(segment=segments(blank=False), check_crc=st.booleans())
def test_scan_reports_what_decode_record_reads(segment: Segment, check_crc: bool) -> None:
    positions = segment.record_positions_bytes
    start_bytes = positions[0] if positions else len(segment.data)
    result = scan_both(
        as_array(segment.data),
        start_bytes,
        len(segment.data),
        segment.base_log_offset_bytes,
        check_crc,
    )
    assert result.stop_reason == leaf.STOP_END
    assert result.stop_position_bytes == len(segment.data)
    assert result.record_count == len(positions)
    for index, position_bytes in enumerate(positions):
        record = m.decode_record(segment.data, position_bytes)
        assert result.log_offset_bytes[index] == record.log_offset_bytes
        assert record.log_offset_bytes == segment.base_log_offset_bytes + position_bytes
        assert result.size_bytes[index] == record.size_bytes
        assert result.queue_id[index] == record.queue_id
        assert result.queue_index[index] == record.queue_index
        assert result.tag_hash[index] == m.tag_hash(tags_of(record.properties))
        assert result.store_timestamp_ms[index] == record.store_timestamp_ms


@settings(deadline=None)
@given(segment=segments(blank=False), cut_choice=st.integers(0))
def test_scan_stops_at_a_torn_tail(segment: Segment, cut_choice: int) -> None:
    positions = segment.record_positions_bytes
    if not positions:
        return
    start_bytes = positions[0]
    cut_bytes = start_bytes + cut_choice % (len(segment.data) - start_bytes)
    ends = [p + struct.unpack_from(">i", segment.data, p)[0] for p in positions]
    complete = [end for end in ends if end <= cut_bytes]
    result = scan_both(
        as_array(segment.data[:cut_bytes]), start_bytes, cut_bytes, segment.base_log_offset_bytes
    )
    assert result.record_count == len(complete)
    if cut_bytes in (start_bytes, *complete):
        assert result.stop_reason == leaf.STOP_END
        assert result.stop_position_bytes == cut_bytes
    else:
        # The torn record keeps its magic and TOTALSIZE, or has fewer than 8 bytes left.
        assert result.stop_reason == leaf.STOP_TRUNCATED
        assert result.stop_position_bytes == (complete[-1] if complete else start_bytes)


def encode_segment(
    bodies: list[bytes], base_log_offset_bytes: int = 0, tags: bytes = b"TagA"
) -> bytearray:
    data = bytearray()
    for queue_index, body in enumerate(bodies):
        data += m.encode_record(
            m.MessageToStore(
                topic="TopicTest",
                queue_id=2,
                body=body,
                properties=m.encode_properties({b"TAGS": tags, b"WAIT": b"true"}),
            ),
            queue_index=queue_index,
            log_offset_bytes=base_log_offset_bytes + len(data),
            store_timestamp_ms=1795243948045 + queue_index,
        )
    return data


def test_scan_stops_at_a_blank_and_says_so() -> None:
    data = encode_segment([b"a", b"bb"], base_log_offset_bytes=1 << 30)
    records_end_bytes = len(data)
    data += m.encode_blank(100) + bytes(92)
    result = scan_both(as_array(data), 0, len(data), 1 << 30)
    assert result.record_count == 2
    assert result.stop_reason == leaf.STOP_BLANK
    assert result.stop_position_bytes == records_end_bytes
    assert result.log_offset_bytes == [1 << 30, (1 << 30) + 91 + 1 + 9 + 20]
    assert result.tag_hash == [2598919, 2598919]
    assert result.queue_id == [2, 2]
    assert result.queue_index == [0, 1]
    assert result.store_timestamp_ms == [1795243948045, 1795243948046]


def test_scan_resumes_where_the_out_arrays_filled() -> None:
    data = encode_segment([bytes([index]) * index for index in range(7)])
    first = scan_both(as_array(data), 0, len(data), capacity=4)
    assert first.record_count == 4
    assert first.stop_reason == leaf.STOP_FULL
    second = scan_both(as_array(data), first.stop_position_bytes, len(data), capacity=4)
    assert second.record_count == 3
    assert second.stop_reason == leaf.STOP_END
    assert second.queue_index == [4, 5, 6]
    assert scan_both(as_array(data), 0, len(data), capacity=0).stop_reason == leaf.STOP_FULL


def test_scan_checks_the_body_crc_only_when_asked() -> None:
    data = encode_segment([b"hello-1", b"hello-2"])
    second_body_at = struct.unpack_from(">i", data, 0)[0] + m.BODY_POSITION_BYTES
    data[second_body_at] ^= 0x01
    checked = scan_both(as_array(data), 0, len(data), check_crc=True)
    assert (checked.record_count, checked.stop_reason) == (1, leaf.STOP_CRC_MISMATCH)
    unchecked = scan_both(as_array(data), 0, len(data), check_crc=False)
    assert (unchecked.record_count, unchecked.stop_reason) == (2, leaf.STOP_END)


def test_scan_refuses_a_record_at_the_wrong_log_offset() -> None:
    data = encode_segment([b"a", b"b"], base_log_offset_bytes=1000)
    assert scan_both(as_array(data), 0, len(data), 1000).record_count == 2
    wrong = scan_both(as_array(data), 0, len(data), 0)
    assert (wrong.record_count, wrong.stop_reason) == (0, leaf.STOP_OFFSET_MISMATCH)


@pytest.mark.parametrize(
    ("position_bytes", "replacement", "reason"),
    [
        (m.MAGICCODE_POSITION_BYTES, b"\x00\x00\x00\x00", "STOP_INVALID"),
        (m.TOTALSIZE_POSITION_BYTES, struct.pack(">i", 90), "STOP_INVALID"),
        (m.TOTALSIZE_POSITION_BYTES, struct.pack(">i", -5), "STOP_INVALID"),
        (m.TOTALSIZE_POSITION_BYTES, struct.pack(">i", 10**6), "STOP_TRUNCATED"),
        (m.SYSFLAG_POSITION_BYTES, struct.pack(">i", m.SYSFLAG_BORNHOST_V6), "STOP_INVALID"),
        (m.BODY_LENGTH_POSITION_BYTES, struct.pack(">i", -1), "STOP_INVALID"),
        (m.BODY_LENGTH_POSITION_BYTES, struct.pack(">i", 2), "STOP_INVALID"),
        (m.BODY_POSITION_BYTES + 1, b"\x80", "STOP_INVALID"),
        (m.BODY_POSITION_BYTES + 1, b"\x7f", "STOP_INVALID"),
        (m.BODY_POSITION_BYTES + 11, b"\xff\xff", "STOP_INVALID"),
    ],
)
def test_scan_stops_at_an_inconsistent_record(
    position_bytes: int, replacement: bytes, reason: str
) -> None:
    data = encode_segment([b"a", b"b"])
    second_at = struct.unpack_from(">i", data, 0)[0]
    assert data[second_at + m.BODY_POSITION_BYTES + 1] == len("TopicTest")
    at = second_at + position_bytes
    data[at : at + len(replacement)] = replacement
    result = scan_both(as_array(data), 0, len(data))
    assert result.record_count == 1
    assert result.stop_position_bytes == second_at
    assert result.stop_reason == getattr(leaf, reason)


def test_scan_of_a_short_tail_is_truncated_and_of_zeros_is_invalid() -> None:
    data = encode_segment([b"a"])
    size_bytes = len(data)
    for tail in (b"\x00" * 7, b"\xff"):
        result = scan_both(as_array(data + tail), 0, size_bytes + len(tail))
        assert (result.record_count, result.stop_reason) == (1, leaf.STOP_TRUNCATED)
    zeros = scan_both(as_array(data + bytes(200)), 0, size_bytes + 200)
    assert (zeros.record_count, zeros.stop_reason) == (1, leaf.STOP_INVALID)
    assert zeros.stop_position_bytes == size_bytes


def test_scan_hashes_tags_as_java_decodes_them() -> None:
    for tags in (b"TagB", "中文".encode(), b"\xed\xa0\x80x", b"\xf0\x9f\x98"):
        data = encode_segment([b"x"], tags=tags)
        result = scan_both(as_array(data), 0, len(data))
        assert result.tag_hash == [m.java_string_hash(m.java_utf8_decode(tags))]
    untagged = m.encode_record(m.MessageToStore("T", 0, b"", properties=b"KEYS\x01k\x02"))
    assert scan_both(as_array(untagged), 0, len(untagged)).tag_hash == [0]
