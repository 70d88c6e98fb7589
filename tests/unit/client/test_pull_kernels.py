"""decode_pull_records: the numba kernel and its plain-Python twin read pull bodies alike.

Goal: on any body (valid records with IPv4 or IPv6 hosts, torn at any byte, overwritten, with
a header field nudged, a length byte hit, noise appended, or pure noise) the kernel and
pull_kernels_ref return the same count, stop position and reason and the same table, and leave
entries past the count untouched; on valid IPv4 bodies every column equals what
message.decode_record reads, and a torn tail stops as TRUNCATED after the last whole record.

Method: hypothesis builds bodies from message.encode_record (random fields and properties,
TAGS present or not); IPv6 records are made from IPv4 ones by widening both hosts to 16-byte
addresses and setting sysflag 0x10 and 0x20, as a Java broker stores them. Damage follows
tests/unit/store/test_kernels.py. Both implementations decode the same bytes from the same start
with the same capacity (sometimes small, to reach FULL).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from types import ModuleType

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from mqbox import message as m
from mqbox.client import pull_kernels as fast
from mqbox.client import pull_kernels_ref as ref
from tests.support.pull_bodies import Body, bodies, damaged_bodies

SENTINEL = -7
STOP_REASONS = (
    "DECODE_STOP_END",
    "DECODE_STOP_FULL",
    "DECODE_STOP_TRUNCATED",
    "DECODE_STOP_INVALID",
)


def as_array(data: bytes) -> NDArray[np.uint8]:
    return np.frombuffer(data, dtype=np.uint8)


@dataclass(frozen=True)
class Decoded:
    record_count: int
    stop_position_bytes: int
    stop_reason: int
    table: list[list[int]]  # [column][record]


def decode(
    implementation: ModuleType, body: bytes, start_bytes: int, end_bytes: int, capacity: int
) -> Decoded:
    out = np.full((fast.COLUMN_COUNT, capacity), SENTINEL, dtype=np.int64)
    count, stop_position_bytes, stop_reason = implementation.decode_pull_records(
        as_array(body), start_bytes, end_bytes, out
    )
    assert 0 <= count <= capacity
    assert (out[:, count:] == SENTINEL).all()
    return Decoded(count, stop_position_bytes, stop_reason, out[:, :count].tolist())


def decode_both(
    body: bytes, start_bytes: int = 0, end_bytes: int | None = None, capacity: int = 64
) -> Decoded:
    """Decode with the kernel and the twin; assert they agree; return the kernel's result."""
    end = len(body) if end_bytes is None else end_bytes
    kernel_result = decode(fast, body, start_bytes, end, capacity)
    assert kernel_result == decode(ref, body, start_bytes, end, capacity)
    return kernel_result


# --- Agreement ----------------------------------------------------------------------------------


def test_constants_are_the_same_in_both_twins() -> None:
    values = [getattr(fast, name) for name in STOP_REASONS]
    assert values == [getattr(ref, name) for name in STOP_REASONS]
    assert len(set(values)) == len(values)
    assert fast.COLUMN_COUNT == ref.COLUMN_COUNT


@settings(max_examples=500)
@given(
    body=damaged_bodies(),
    start_choice=st.integers(0),
    end_cut_bytes=st.one_of(st.just(0), st.integers(0, 12)),
    capacity=st.one_of(st.just(64), st.integers(0, 4)),
)
def test_kernel_agrees_with_twin_on_damaged_bodies(
    body: Body, start_choice: int, end_cut_bytes: int, capacity: int
) -> None:
    end_bytes = max(0, len(body.data) - end_cut_bytes)
    starts = [position for position in body.record_positions_bytes if position <= end_bytes]
    starts.append(start_choice % (end_bytes + 1))
    decode_both(body.data, starts[start_choice % len(starts)], end_bytes, capacity)


# --- What it reports ----------------------------------------------------------------------------


@given(body=bodies(ipv6=False))
def test_columns_are_what_decode_record_reads(body: Body) -> None:
    result = decode_both(body.data)
    assert result.stop_reason == fast.DECODE_STOP_END
    assert result.stop_position_bytes == len(body.data)
    assert result.record_count == len(body.record_positions_bytes)
    column = result.table
    for index, position in enumerate(body.record_positions_bytes):
        record = m.decode_record(body.data, position)
        body_at = position + m.BODY_POSITION_BYTES
        topic_at = body_at + len(record.body) + 1
        properties_at = topic_at + len(record.topic.encode()) + 2
        expected = {
            fast.COLUMN_RECORD_POSITION_BYTES: position,
            fast.COLUMN_RECORD_SIZE_BYTES: record.size_bytes,
            fast.COLUMN_QUEUE_ID: record.queue_id,
            fast.COLUMN_FLAG: record.flag,
            fast.COLUMN_QUEUE_INDEX: record.queue_index,
            fast.COLUMN_LOG_OFFSET_BYTES: record.log_offset_bytes,
            fast.COLUMN_SYSFLAG: record.sysflag,
            fast.COLUMN_BORN_TIMESTAMP_MS: record.born_timestamp_ms,
            fast.COLUMN_STORE_TIMESTAMP_MS: record.store_timestamp_ms,
            fast.COLUMN_STORE_HOST_POSITION_BYTES: position + m.STOREHOST_POSITION_BYTES,
            fast.COLUMN_RECONSUME_TIMES: record.reconsume_times,
            fast.COLUMN_BODY_POSITION_BYTES: body_at,
            fast.COLUMN_BODY_SIZE_BYTES: len(record.body),
            fast.COLUMN_TOPIC_POSITION_BYTES: topic_at,
            fast.COLUMN_TOPIC_SIZE_BYTES: len(record.topic.encode()),
            fast.COLUMN_PROPERTIES_POSITION_BYTES: properties_at,
            fast.COLUMN_PROPERTIES_SIZE_BYTES: len(record.properties),
        }
        for column_number, value in expected.items():
            assert column[column_number][index] == value, column_number
        tags_at, tags_size = (
            column[fast.COLUMN_TAGS_POSITION_BYTES][index],
            column[fast.COLUMN_TAGS_SIZE_BYTES][index],
        )
        tags = m.decode_properties(record.properties).get(b"TAGS")
        if tags is None:
            assert (tags_at, tags_size) == (-1, 0)
        else:
            assert body.data[tags_at : tags_at + tags_size] == tags


@given(body=bodies(ipv6=True))
def test_ipv6_hosts_move_the_later_fields(body: Body) -> None:
    result = decode_both(body.data)
    assert result.stop_reason == fast.DECODE_STOP_END
    assert result.record_count == len(body.record_positions_bytes)
    for index, position in enumerate(body.record_positions_bytes):
        (sysflag,) = struct.unpack_from(">i", body.data, position + 36)
        born_extra = 12 if sysflag & 0x10 else 0
        store_extra = 12 if sysflag & 0x20 else 0
        store_host_at = result.table[fast.COLUMN_STORE_HOST_POSITION_BYTES][index]
        assert store_host_at == position + 64 + born_extra
        port_at = store_host_at + (16 if store_extra else 4)
        assert struct.unpack_from(">i", body.data, port_at)[0] == 10911
        assert (
            result.table[fast.COLUMN_BODY_POSITION_BYTES][index]
            == position + 88 + born_extra + store_extra
        )


@given(body=bodies(), cut_choice=st.integers(0))
def test_a_torn_tail_stops_as_truncated_after_the_last_whole_record(
    body: Body, cut_choice: int
) -> None:
    if not body.data:
        return
    cut_bytes = cut_choice % len(body.data)
    ends = [
        position + struct.unpack_from(">i", body.data, position)[0]
        for position in body.record_positions_bytes
    ]
    complete = [end for end in ends if end <= cut_bytes]
    result = decode_both(body.data[:cut_bytes])
    assert result.record_count == len(complete)
    if cut_bytes in (0, *complete):
        assert result.stop_reason == fast.DECODE_STOP_END
    else:
        assert result.stop_reason == fast.DECODE_STOP_TRUNCATED
        assert result.stop_position_bytes == (complete[-1] if complete else 0)


def test_a_blank_or_a_record_with_a_bad_length_is_invalid() -> None:
    record = bytes(
        m.encode_record(m.MessageToStore("T", 0, b"abc", m.encode_properties({b"TAGS": b"A"})))
    )
    assert decode_both(m.encode_blank(64) + bytes(56)).stop_reason == fast.DECODE_STOP_INVALID
    bad_topic = bytearray(record)
    bad_topic[m.BODY_POSITION_BYTES + 3] = 200  # topic length over 127
    assert decode_both(bytes(bad_topic)).stop_reason == fast.DECODE_STOP_INVALID
    short_v6 = bytearray(record)
    struct.pack_into(">i", short_v6, 36, 0x30)  # claims 24 more host bytes than it has
    assert decode_both(bytes(short_v6)).stop_reason == fast.DECODE_STOP_INVALID
    assert decode_both(record + record, capacity=1).stop_reason == fast.DECODE_STOP_FULL
