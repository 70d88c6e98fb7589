"""Goal: a read plan follows RocketMQ's getMessage: the bounds table of docs/protocol.md
section 4.3 (status and nextBeginOffset per situation), the per-pull limits (count, bytes, the
first message always taken), the tag-hash filter, deleted records, and runs that merge records
adjacent in one commit-log segment; plan_read and its plain-Python twin agree exactly.

Method: consume-queue segments are built as bytes from entry lists (log offsets adjacent or with
gaps, across commit-log segment boundaries, tags from a small set); hypothesis varies windows,
limits, filters and the commit log's minimum and runs both implementations; targeted tests pin
each table row and each limit with hand-made entries.
"""

from __future__ import annotations

import struct
from types import ModuleType

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from mqbox.message import java_string_hash
from mqbox.store import read_plan as fast
from mqbox.store import read_plan_ref as ref
from mqbox.store.read_plan import (
    NO_TAG_FILTER,
    PULL_NOT_FOUND,
    PULL_OFFSET_MOVED,
    PULL_RETRY_IMMEDIATELY,
    PULL_SUCCESS,
    GetMessageStatus,
    ReadPlan,
    no_queue_plan,
    plan_for_bounds,
    pull_response_code,
    scan_entry_count_max,
    tag_filter,
)

_ENTRY = struct.Struct(">qiq")


def cq_bytes(entries: list[tuple[int, int, int]]) -> NDArray[np.uint8]:
    data = b"".join(_ENTRY.pack(*entry) for entry in entries)
    return np.frombuffer(data, dtype=np.uint8)


def plan(
    implementation: ModuleType,
    cq: NDArray[np.uint8],
    first_entry: int,
    entry_count: int,
    tags: NDArray[np.int64],
    count_max: int,
    size_bytes_max: int,
    segment_size_bytes: int,
    min_offset_bytes: int,
) -> tuple[tuple[int, ...], list[list[int]]]:
    out_runs = np.full((max(count_max, 1), 3), -9, dtype=np.int64)
    result = implementation.plan_read(
        cq,
        first_entry,
        entry_count,
        tags,
        count_max,
        size_bytes_max,
        segment_size_bytes,
        min_offset_bytes,
        out_runs,
    )
    run_count = max(result[0], 0)
    if result[0] >= 0:  # after PLAN_BAD_ENTRY the runs may hold a partial plan
        assert (out_runs[run_count:] == -9).all()
    return tuple(result), out_runs[:run_count].tolist()


TAGS = [0, 11, 22, -5]


@st.composite
def queues(draw: st.DrawFn) -> list[tuple[int, int, int]]:
    """Entries of one queue: increasing log offsets, adjacent or not, and (as in a commit log
    of 1000-byte segments) no record reaching into the last 8 bytes of a segment."""
    entries = []
    position = draw(st.integers(0, 3000))
    for _ in range(draw(st.integers(1, 40))):
        size = draw(st.integers(1, 300))
        if position % 1000 + size + 8 > 1000:
            position += 1000 - position % 1000  # the blank: on to the next segment
        entries.append((position, size, draw(st.sampled_from(TAGS))))
        position += size + draw(st.sampled_from([0, 0, 0, 1, 500]))
    return entries


@settings(max_examples=400)
@given(
    entries=queues(),
    first=st.integers(0, 39),
    count=st.integers(0, 40),
    tags=st.sets(st.sampled_from(TAGS), max_size=3),
    count_max=st.integers(1, 8),
    size_bytes_max=st.integers(1, 3000),
    segment_size_bytes=st.sampled_from([1000, 1 << 30]),
    min_offset_bytes=st.integers(0, 4000),
)
def test_plan_read_kernel_agrees_with_its_twin(
    entries: list[tuple[int, int, int]],
    first: int,
    count: int,
    tags: set[int],
    count_max: int,
    size_bytes_max: int,
    segment_size_bytes: int,
    min_offset_bytes: int,
) -> None:
    first = min(first, len(entries))
    count = min(count, len(entries) - first)
    tag_array = np.array(sorted(tags), dtype=np.int64) if tags else NO_TAG_FILTER
    arguments = (
        cq_bytes(entries),
        first,
        count,
        tag_array,
        count_max,
        size_bytes_max,
        segment_size_bytes,
        min_offset_bytes,
    )
    kernel_result = plan(fast, *arguments)
    assert kernel_result == plan(ref, *arguments)
    (run_count, scanned, taken, total, _removed, *_first_run), runs = kernel_result
    assert 0 <= scanned <= count
    assert taken <= count_max
    assert sum(run[2] for run in runs) == total
    assert taken == 0 or run_count >= 1
    for segment_start, file_offset, size in runs:
        assert segment_start % segment_size_bytes == 0
        assert file_offset + size <= segment_size_bytes


def test_plan_read_refuses_an_unwritten_entry() -> None:
    cq = cq_bytes([(0, 100, 0), (100, 0, 0)])
    for implementation in (fast, ref):
        result, _runs = plan(implementation, cq, 0, 2, NO_TAG_FILTER, 8, 10**6, 1 << 30, 0)
        assert result[0] == fast.PLAN_BAD_ENTRY


def test_adjacent_records_merge_into_one_run_within_a_segment() -> None:
    segment_size_bytes = 1000
    entries = [(0, 100, 0), (100, 200, 0), (300, 50, 0), (400, 10, 0), (990, 5, 0), (1000, 7, 0)]
    result, runs = plan(
        fast, cq_bytes(entries), 0, len(entries), NO_TAG_FILTER, 8, 10**6, segment_size_bytes, 0
    )
    assert result[:4] == (4, 6, 6, 372)
    # 0..350 merge; 400 stands alone; 995 ends at the segment end and 1000 starts the next.
    assert runs == [[0, 0, 350], [0, 400, 10], [0, 990, 5], [1000, 0, 7]]
    assert result[5:] == (0, 0, 350)


def test_limits_stop_the_scan_and_the_first_message_is_always_taken() -> None:
    entries = [(index * 100, 100, 0) for index in range(10)]
    cq = cq_bytes(entries)
    result, _runs = plan(fast, cq, 0, 10, NO_TAG_FILTER, 3, 10**6, 1 << 30, 0)
    assert result[1:4] == (3, 3, 300)  # count_max: three taken, the fourth not scanned
    result, _runs = plan(fast, cq, 0, 10, NO_TAG_FILTER, 32, 250, 1 << 30, 0)
    assert result[1:4] == (2, 2, 200)  # bytes: a third would pass 250
    result, _runs = plan(fast, cq, 0, 10, NO_TAG_FILTER, 32, 50, 1 << 30, 0)
    assert result[1:4] == (1, 1, 100)  # the first message goes even when it alone is too big


def test_tag_filter_skips_entries_but_counts_them_as_scanned() -> None:
    entries = [(0, 10, 1), (10, 10, 2), (20, 10, 1), (30, 10, 3)]
    filter_one = np.array([1], dtype=np.int64)
    result, runs = plan(fast, cq_bytes(entries), 0, 4, filter_one, 32, 10**6, 1 << 30, 0)
    assert result[1:4] == (4, 2, 20)
    assert runs == [[0, 0, 10], [0, 20, 10]]
    nothing = np.array([9], dtype=np.int64)
    result, runs = plan(fast, cq_bytes(entries), 0, 4, nothing, 32, 10**6, 1 << 30, 0)
    assert result[:5] == (0, 4, 0, 0, 0)
    assert runs == []


def test_records_below_the_commit_log_minimum_count_as_removed() -> None:
    entries = [(0, 10, 0), (10, 10, 0), (5000, 10, 0)]
    result, runs = plan(fast, cq_bytes(entries), 0, 3, NO_TAG_FILTER, 32, 10**6, 1 << 30, 4096)
    assert result[:5] == (1, 3, 1, 10, 2)
    assert runs == [[0, 5000, 10]]
    result, runs = plan(fast, cq_bytes(entries), 0, 2, NO_TAG_FILTER, 32, 10**6, 1 << 30, 4096)
    assert result[:5] == (0, 2, 0, 0, 2)


@pytest.mark.parametrize(
    ("queue_index", "min_index", "max_index", "status", "next_index", "code"),
    [
        (0, 0, 0, GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0, PULL_NOT_FOUND),
        (5, 0, 0, GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0, PULL_OFFSET_MOVED),
        (3, 10, 20, GetMessageStatus.OFFSET_TOO_SMALL, 10, PULL_OFFSET_MOVED),
        (20, 10, 20, GetMessageStatus.OFFSET_OVERFLOW_ONE, 20, PULL_NOT_FOUND),
        (25, 0, 20, GetMessageStatus.OFFSET_OVERFLOW_BADLY, 0, PULL_OFFSET_MOVED),
        (25, 10, 20, GetMessageStatus.OFFSET_OVERFLOW_BADLY, 20, PULL_OFFSET_MOVED),
    ],
)
def test_bounds_rows_of_the_pull_table(
    queue_index: int,
    min_index: int,
    max_index: int,
    status: GetMessageStatus,
    next_index: int,
    code: int,
) -> None:
    result = plan_for_bounds(queue_index, min_index, max_index)
    assert result is not None
    assert result.status is status
    assert result.next_queue_index == next_index
    assert result.min_queue_index == min_index
    assert result.max_queue_index == max_index
    assert result.pull_response_code == code
    assert result.runs == ()


def test_an_index_inside_the_queue_needs_a_scan() -> None:
    assert plan_for_bounds(10, 10, 20) is None
    assert plan_for_bounds(19, 10, 20) is None


@pytest.mark.parametrize(
    ("status", "queue_index", "code"),
    [
        (GetMessageStatus.FOUND, 3, PULL_SUCCESS),
        (GetMessageStatus.NO_MATCHED_MESSAGE, 3, PULL_RETRY_IMMEDIATELY),
        (GetMessageStatus.MESSAGE_WAS_REMOVING, 3, PULL_RETRY_IMMEDIATELY),
        (GetMessageStatus.OFFSET_FOUND_NULL, 3, PULL_NOT_FOUND),
        (GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, 0, PULL_NOT_FOUND),
        (GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, 3, PULL_OFFSET_MOVED),
    ],
)
def test_pull_response_codes(status: GetMessageStatus, queue_index: int, code: int) -> None:
    assert pull_response_code(status, queue_index) == code


def test_no_queue_plan_points_at_zero() -> None:
    result = no_queue_plan(7)
    assert result.status is GetMessageStatus.NO_MATCHED_LOGIC_QUEUE
    assert (result.next_queue_index, result.min_queue_index, result.max_queue_index) == (0, 0, 0)
    assert result.pull_response_code == PULL_OFFSET_MOVED


def test_tag_filter_hashes_each_tag_once() -> None:
    assert tag_filter([]).size == 0
    hashes = tag_filter(["TagA", "TagB", "TagA"])
    assert hashes.tolist() == sorted([2598919, 2598920])
    assert hashes.tolist() == sorted({java_string_hash("TagA"), java_string_hash("TagB")})
    assert not hashes.flags.writeable


def test_scan_window_is_800_entries_or_count_max() -> None:
    assert scan_entry_count_max(32) == 800
    assert scan_entry_count_max(1000) == 1000


def test_read_plan_log_offsets() -> None:
    result = ReadPlan(GetMessageStatus.FOUND, 0, 2, 0, 9, 2, 30, ((1000, 5, 10), (2000, 0, 20)))
    assert result.log_offsets_bytes() == [1005, 2000]
