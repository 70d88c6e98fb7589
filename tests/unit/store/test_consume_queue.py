"""Goal: a consume queue returns exactly the entries appended, across segment rolls, truncation,
retention and reopening; a torn tail is cut back to a prefix; a table of 10,000 queues stays
within its descriptor and map budget.

Method: tiny segments (4 entries = 80 bytes) in tmp_path. Entries are built from a simple model
(log offsets increasing, sizes > 0), and the queue is compared with the model after each step;
hypothesis drives random sequences of appends, truncations and reopenings. Torn tails are made
by zeroing or scribbling bytes in the segment files, as lost pages would after a crash.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqbox.errors import StoreError
from mqbox.store.consume_queue import (
    ConsumeQueue,
    ConsumeQueueTable,
    CqEntries,
    CqEntry,
    make_entries,
)
from mqbox.store.layout import (
    CQ_ENTRY_SIZE_BYTES,
    StoreGeometry,
    consume_queue_dir,
    segment_name,
)

GEOMETRY = StoreGeometry(cq_segment_entry_count=4)
SEGMENT_SIZE_BYTES = GEOMETRY.cq_segment_size_bytes


def model_entries(first_log_offset_bytes: int, count: int, size_bytes: int = 100) -> CqEntries:
    """`count` contiguous records of `size_bytes` from `first_log_offset_bytes`; tag = index."""
    log_offsets = first_log_offset_bytes + size_bytes * np.arange(count, dtype=np.int64)
    sizes = np.full(count, size_bytes, dtype=np.int64)
    tags = -np.arange(count, dtype=np.int64) - 7  # negative tag hashes must survive
    return make_entries(log_offsets, sizes, tags)


def open_queue(store_root: Path, *, writable: bool = True) -> ConsumeQueue:
    return ConsumeQueue.open(store_root, "TopicTest", 0, GEOMETRY, writable=writable)


def as_tuples(entries: CqEntries) -> list[tuple[int, int, int]]:
    return [(int(e["log_offset_bytes"]), int(e["size_bytes"]), int(e["tag_hash"])) for e in entries]


def test_new_queue_is_empty_and_creates_no_file(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    assert queue.min_queue_index == 0
    assert queue.entry_count == 0
    assert queue.last_entry() is None
    assert queue.log_end_offset_bytes == 0
    assert len(queue.read(0, 10)) == 0
    assert not (tmp_path / "consumequeue").exists()


def test_append_rolls_segments_and_reads_back_across_them(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    entries = model_entries(0, 10)
    assert queue.append(entries[:3]) == 0
    assert queue.append(entries[3:], queue_index_first=3) == 3
    assert queue.entry_count == 10
    directory = consume_queue_dir(tmp_path, "TopicTest", 0)
    assert sorted(path.name for path in directory.iterdir()) == [
        segment_name(0),
        segment_name(SEGMENT_SIZE_BYTES),
        segment_name(2 * SEGMENT_SIZE_BYTES),
    ]
    assert as_tuples(queue.read(0, 100)) == as_tuples(entries)
    assert as_tuples(queue.read(2, 5)) == as_tuples(entries[2:7])
    assert as_tuples(queue.read(9, 5)) == as_tuples(entries[9:])
    assert len(queue.read(10, 5)) == 0
    assert queue.entry(4) == CqEntry(400, 100, -11)
    assert queue.last_entry() == CqEntry(900, 100, -16)
    assert queue.log_end_offset_bytes == 1000


def test_entries_on_disk_are_big_endian_20_byte_records(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    queue.append_entry(0x0102030405, 0x0607, -1)
    queue.flush()
    path = consume_queue_dir(tmp_path, "TopicTest", 0) / segment_name(0)
    raw = path.read_bytes()
    assert len(raw) == SEGMENT_SIZE_BYTES
    assert raw[:CQ_ENTRY_SIZE_BYTES] == (
        (0x0102030405).to_bytes(8, "big") + (0x0607).to_bytes(4, "big") + b"\xff" * 8
    )


def test_append_checks_the_writer_assigned_index(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    queue.append(model_entries(0, 2))
    with pytest.raises(AssertionError):
        queue.append(model_entries(200, 1), queue_index_first=5)


def test_append_refuses_entries_out_of_log_order(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    queue.append(model_entries(1000, 2))
    with pytest.raises(AssertionError):
        queue.append(model_entries(1050, 1))  # overlaps the record ending at 1200


def test_append_refuses_to_overwrite_bytes_past_the_end(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    queue.append(model_entries(0, 1))
    path = consume_queue_dir(tmp_path, "TopicTest", 0) / segment_name(0)
    with path.open("r+b") as stray_writer:  # a second writer, or a count that went backwards
        stray_writer.seek(CQ_ENTRY_SIZE_BYTES)
        stray_writer.write(b"\x01")
    with pytest.raises(AssertionError):
        queue.append(model_entries(100, 1))


@pytest.mark.parametrize("count", [1, 3, 8, 9, 12])  # <= 8: checked in Python, else numpy
@pytest.mark.parametrize("damage", ["zero size", "negative offset", "overlap", "behind"])
def test_append_checks_every_entry_of_small_and_large_batches(
    tmp_path: Path, count: int, damage: str
) -> None:
    queue = open_queue(tmp_path)
    queue.append(model_entries(0, 2))
    log_offsets = 200 + 100 * np.arange(count, dtype=np.int64)
    sizes = np.full(count, 100, dtype=np.int64)
    last = count - 1
    if damage == "zero size":
        sizes[last] = 0
    elif damage == "negative offset":
        log_offsets[last] = -1
    elif damage == "overlap":
        log_offsets[last] -= 1  # overlaps the one before it, or the queue's last record
    else:
        log_offsets[0] = 150  # starts inside the queue's last record
    before = queue.read(0, 100).tobytes()
    with pytest.raises(AssertionError):
        queue.append(make_entries(log_offsets, sizes, np.zeros(count, dtype=np.int64)))
    assert queue.entry_count == 2
    assert queue.read(0, 100).tobytes() == before


@pytest.mark.parametrize("count", [1, 8, 9])
def test_small_and_large_batches_write_the_same_bytes(tmp_path: Path, count: int) -> None:
    one_by_one = ConsumeQueue.open(tmp_path, "TopicOne", 0, GEOMETRY, writable=True)
    batched = open_queue(tmp_path)
    entries = model_entries(0, count * 3)
    for position in range(count * 3):
        one_by_one.append(entries[position : position + 1])
    for start in range(0, count * 3, count):
        batched.append(entries[start : start + count])
    assert one_by_one.read(0, 100).tobytes() == batched.read(0, 100).tobytes()
    assert as_tuples(batched.read(0, 100)) == as_tuples(entries)
    assert batched.log_end_offset_bytes == one_by_one.log_end_offset_bytes == 100 * count * 3


def test_reopen_recovers_length_and_log_end(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    entries = model_entries(5000, 9)
    queue.append(entries)
    queue.flush()
    assert queue.flushed_entry_count == 9
    queue.close()
    reopened = open_queue(tmp_path)
    assert reopened.entry_count == 9
    assert reopened.min_queue_index == 0
    assert reopened.log_end_offset_bytes == 5900
    assert reopened.torn_entry_count_recovered == 0
    assert as_tuples(reopened.read(0, 100)) == as_tuples(entries)
    reopened.append(model_entries(5900, 1))
    assert reopened.entry_count == 10


def test_reopen_with_empty_last_segment(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    queue.append(model_entries(0, 4))
    queue.append(model_entries(400, 1))
    queue.truncate_log_offset(400)  # the second segment stays, emptied
    assert queue.segment_count == 2
    reopened = open_queue(tmp_path)
    assert reopened.entry_count == 4
    reopened.append(model_entries(400, 1))
    assert reopened.entry(4) == CqEntry(400, 100, -7)


def test_recovery_cuts_a_torn_tail_after_a_hole(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    queue.append(model_entries(0, 11))
    queue.close()
    directory = consume_queue_dir(tmp_path, "TopicTest", 0)
    # Entry 6 was on a page that never reached the disk; entries 7..10 did.
    second = directory / segment_name(SEGMENT_SIZE_BYTES)
    raw = bytearray(second.read_bytes())
    raw[2 * CQ_ENTRY_SIZE_BYTES : 3 * CQ_ENTRY_SIZE_BYTES] = bytes(CQ_ENTRY_SIZE_BYTES)
    second.write_bytes(bytes(raw))
    reader = open_queue(tmp_path, writable=False)
    assert reader.entry_count == 6
    assert reader.torn_entry_count_recovered == 4
    reader.close()
    recovered = open_queue(tmp_path)
    assert recovered.entry_count == 6
    assert recovered.torn_entry_count_recovered == 4
    assert recovered.segment_count == 2
    assert not any(second.read_bytes()[2 * CQ_ENTRY_SIZE_BYTES :])
    again = open_queue(tmp_path)
    assert again.torn_entry_count_recovered == 0
    assert again.entry_count == 6


def test_recovery_cuts_a_half_written_entry(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    queue.append(model_entries(0, 3))
    queue.close()
    path = consume_queue_dir(tmp_path, "TopicTest", 0) / segment_name(0)
    raw = bytearray(path.read_bytes())
    raw[3 * CQ_ENTRY_SIZE_BYTES : 3 * CQ_ENTRY_SIZE_BYTES + 8] = (777).to_bytes(8, "big")
    path.write_bytes(bytes(raw))  # log offset written, size still zero
    recovered = open_queue(tmp_path)
    assert recovered.entry_count == 3
    assert recovered.torn_entry_count_recovered == 1


def test_recovery_reports_entries_out_of_order(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    queue.append(model_entries(1000, 3))
    queue.close()
    path = consume_queue_dir(tmp_path, "TopicTest", 0) / segment_name(0)
    raw = bytearray(path.read_bytes())
    raw[2 * CQ_ENTRY_SIZE_BYTES : 2 * CQ_ENTRY_SIZE_BYTES + 8] = (5).to_bytes(8, "big")
    path.write_bytes(bytes(raw))
    with pytest.raises(StoreError, match="out of log order"):
        open_queue(tmp_path)


@pytest.mark.parametrize(
    ("cut_log_offset_bytes", "entry_count_left"),
    [(10_000, 10), (1000, 10), (999, 9), (950, 9), (900, 9), (400, 4), (350, 3), (0, 0)],
)
def test_truncate_by_log_offset(
    tmp_path: Path, cut_log_offset_bytes: int, entry_count_left: int
) -> None:
    queue = open_queue(tmp_path)
    entries = model_entries(0, 10)
    queue.append(entries)
    queue.flush()
    removed_count = queue.truncate_log_offset(cut_log_offset_bytes)
    assert removed_count == 10 - entry_count_left
    assert queue.entry_count == entry_count_left
    assert queue.flushed_entry_count == entry_count_left
    assert queue.log_end_offset_bytes == 100 * entry_count_left
    assert as_tuples(queue.read(0, 100)) == as_tuples(entries[:entry_count_left])
    reopened = open_queue(tmp_path)
    assert reopened.entry_count == entry_count_left
    reopened.append(model_entries(100 * entry_count_left, 1))
    assert reopened.entry_count == entry_count_left + 1


def test_retention_deletes_old_segments_and_moves_min_index(tmp_path: Path) -> None:
    queue = open_queue(tmp_path)
    queue.append(model_entries(0, 10))  # segments hold 0-3, 4-7, 8-9
    assert queue.delete_below_log_offset(300) == 0  # entry 3's record (at 300) survives
    assert queue.min_queue_index == 3
    assert queue.delete_below_log_offset(400) == 1
    assert queue.min_queue_index == 4
    assert queue.segment_count == 2
    assert len(queue.read(3, 10)) == 0
    assert as_tuples(queue.read(4, 1)) == [(400, 100, -11)]
    assert queue.delete_below_log_offset(650) == 0
    assert queue.min_queue_index == 7
    assert queue.delete_below_log_offset(10_000) == 1  # the last segment stays
    assert queue.segment_count == 1
    assert queue.min_queue_index == queue.entry_count == 10
    assert queue.last_entry() is None
    reopened = open_queue(tmp_path)
    assert reopened.entry_count == 10
    assert reopened.min_queue_index == 8
    reopened.correct_min_queue_index(10_000)
    assert reopened.min_queue_index == 10
    reopened.append(model_entries(10_000, 1))
    assert reopened.entry(10) == CqEntry(10_000, 100, -7)


def test_read_only_queue_follows_published_count(tmp_path: Path) -> None:
    writer = open_queue(tmp_path)
    writer.append(model_entries(0, 2))
    reader = open_queue(tmp_path, writable=False)
    assert reader.entry_count == 2
    writer.append(model_entries(200, 5))  # rolls into a segment the reader has not listed
    reader.observe_entry_count(writer.entry_count)
    assert as_tuples(reader.read(0, 100)) == as_tuples(writer.read(0, 100))


@settings(max_examples=40)
@given(
    operations=st.lists(
        st.one_of(
            st.tuples(st.just("append"), st.integers(min_value=1, max_value=9)),
            st.tuples(st.just("truncate"), st.integers(min_value=0, max_value=60)),
            st.tuples(st.just("reopen"), st.just(0)),
        ),
        max_size=12,
    )
)
def test_queue_matches_model_under_random_operations(
    tmp_path_factory: pytest.TempPathFactory, operations: list[tuple[str, int]]
) -> None:
    store_root = tmp_path_factory.mktemp("cq")
    queue = open_queue(store_root)
    model: list[tuple[int, int, int]] = []
    for name, argument in operations:
        if name == "append":
            next_log_offset_bytes = model[-1][0] + model[-1][1] if model else 0
            entries = model_entries(next_log_offset_bytes + 3, argument, size_bytes=7)
            queue.append(entries)
            model.extend(as_tuples(entries))
        elif name == "truncate" and model:
            cut_log_offset_bytes = argument * 7
            queue.truncate_log_offset(cut_log_offset_bytes)
            model = [entry for entry in model if entry[0] + entry[1] <= cut_log_offset_bytes]
        elif name == "reopen":
            queue.flush()
            queue.close()
            queue = open_queue(store_root)
        assert queue.entry_count == len(model)
        assert as_tuples(queue.read(0, 1000)) == model
    queue.close()


# -- the table -----------------------------------------------------------------------------------


def test_table_opens_lazily_and_flushes_only_dirty_queues(tmp_path: Path) -> None:
    table = ConsumeQueueTable(tmp_path, GEOMETRY, writable=True, map_count_max=8)
    assert table.find_queue("TopicA", 0) is None
    table.queue("TopicA", 0).append(model_entries(0, 3))
    table.queue("TopicA", 1).append(model_entries(300, 1))
    table.queue("TopicB", 0)  # opened, never written
    assert table.statistics().queue_dirty_count == 2
    assert table.flush() == 2
    assert table.flush() == 0
    assert table.queue_keys_on_disk() == [("TopicA", 0), ("TopicA", 1)]
    other = ConsumeQueueTable(tmp_path, GEOMETRY, writable=False)
    found = other.find_queue("TopicA", 0)
    assert found is not None
    assert found.entry_count == 3
    assert other.find_queue("../etc", 0) is None


def test_table_truncates_and_deletes_across_queues(tmp_path: Path) -> None:
    table = ConsumeQueueTable(tmp_path, GEOMETRY, writable=True, map_count_max=8)
    table.queue("TopicA", 0).append(model_entries(0, 6, size_bytes=10))  # 0..60
    table.queue("TopicA", 1).append(model_entries(60, 6, size_bytes=10))  # 60..120
    table.flush()
    fresh = ConsumeQueueTable(tmp_path, GEOMETRY, writable=True, map_count_max=8)
    assert fresh.truncate_log_offset(90) == 3
    assert fresh.queue("TopicA", 1).entry_count == 3
    assert fresh.delete_below_log_offset(45) == 1
    assert fresh.queue("TopicA", 0).min_queue_index == 5
    assert fresh.delete_topic("TopicA") == 2
    assert not (tmp_path / "consumequeue" / "TopicA").exists()
    assert fresh.queue_keys_on_disk() == []


def test_table_of_10000_queues_stays_within_map_budget(tmp_path: Path) -> None:
    queue_count = 10_000
    map_count_max = 64
    baseline_fd_count = sum(1 for _ in Path("/proc/self/fd").iterdir())
    table = ConsumeQueueTable(tmp_path, GEOMETRY, writable=True, map_count_max=map_count_max)
    for queue_number in range(queue_count):
        topic = f"Topic{queue_number // 8}"
        queue = table.queue(topic, queue_number % 8)
        queue.append(model_entries(queue_number * 1000, 1 + queue_number % 3))
    statistics = table.statistics()
    assert statistics.queue_open_count == queue_count
    assert statistics.map_open_count <= map_count_max
    fd_count = sum(1 for _ in Path("/proc/self/fd").iterdir())
    assert fd_count <= baseline_fd_count + map_count_max
    assert table.flush() == queue_count
    table.close()
    reopened = ConsumeQueueTable(tmp_path, GEOMETRY, writable=False, map_count_max=map_count_max)
    assert reopened.open_all() == queue_count
    for queue_number in range(0, queue_count, 997):
        queue = reopened.queue(f"Topic{queue_number // 8}", queue_number % 8)
        assert queue.entry_count == 1 + queue_number % 3
        assert queue.entry(0) == CqEntry(queue_number * 1000, 100, -7)
    assert reopened.statistics().map_open_count <= map_count_max
